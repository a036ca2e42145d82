"""Crash tests: `evalpush push` as a real subprocess, killed with SIGKILL (or stopped with
SIGTERM) at every step boundary and at random instants, then run again until it is done.

Whatever the kill point, the local platform ends up holding exactly one finalized evaluation per
run, every sample exactly once, and the metrics the producer's own push would send.
"""

from __future__ import annotations

import importlib.util
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from evalpush.config import Config
from evalpush.convert import scan, summary
from evalpush.local_platform import LocalPlatform
from evalpush.read import read_lines
from evalpush.runs import load_run
from evalpush.upload import CRASH_ENV

ROOT = Path(__file__).resolve().parents[1]
PUSH_TIMEOUT_SECONDS = 60
MAX_ATTEMPTS = 40


def _gen_traces():
    spec = importlib.util.spec_from_file_location("gen_traces", ROOT / "bench" / "gen_traces.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def source_runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two generated runs (about 600 KB and 250 KB: dozens of 20-sample batches)."""
    gen = _gen_traces()
    out = tmp_path_factory.mktemp("source-runs")
    return [gen.generate(out, 600_000, seed=1), gen.generate(out, 250_000, seed=2)]


@pytest.fixture(scope="module")
def big_source_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of about 3 MB (some 800 traces): seconds of upload in 5-sample batches."""
    return _gen_traces().generate(tmp_path_factory.mktemp("big-run"), 3_000_000, seed=3)


def _outputs(tmp_path: Path, sources: list[Path]) -> Path:
    root = tmp_path / "outputs"
    for run in sources:
        target = root / "env--model--harness" / run.name
        target.mkdir(parents=True)
        for name in ("config.toml", "traces.jsonl"):
            (target / name).write_bytes((run / name).read_bytes())
    return root


@pytest.fixture
def runs(source_runs: list[Path], tmp_path: Path) -> Path:
    return _outputs(tmp_path, source_runs)


@pytest.fixture
def platform() -> LocalPlatform:
    with LocalPlatform() as local:
        yield local


def _environ(platform: LocalPlatform, tmp_path: Path, **extra: str) -> dict[str, str]:
    environ = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PRIME_", "EVALPUSH_"))
    }
    environ.update(
        PRIME_API_KEY=platform.api_key,
        PRIME_API_BASE_URL=platform.base_url,
        HOME=str(tmp_path / "home"),
        EVALPUSH_STATE_DIR=str(tmp_path / "state"),
        EVALPUSH_UPLOAD__MAX_BATCH_SAMPLES="20",
        EVALPUSH_PLATFORM__READ_TIMEOUT_SECONDS="5",
        EVALPUSH_LOG__LEVEL="warning",
    )
    environ.update(extra)
    return environ


def _push(root: Path, environ: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "evalpush", "push", str(root)],
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _push_until_done(root: Path, environ: dict[str, str]) -> None:
    for _ in range(3):
        process = _push(root, environ)
        out, err = process.communicate(timeout=PUSH_TIMEOUT_SECONDS)
        if process.returncode == 0:
            return
    pytest.fail(f"push did not finish: exit {process.returncode}\n{out.decode()}\n{err.decode()}")


def _expected(run_dir: Path) -> tuple[list[str], dict]:
    """The sample ids in file order and the create summary the producer's push would send."""
    run = load_run(run_dir)
    limit = Config().read.max_line_bytes
    found = scan(read_lines(run.traces_path, max_line_bytes=limit), max_line_bytes=limit)
    ids = [
        orjson.loads(line.data)["id"]
        for line in read_lines(run.traces_path, max_line_bytes=limit)
        if line.data
    ]
    return ids, summary(run, found.totals)


def assert_exactly_once(platform: LocalPlatform, root: Path) -> None:
    state = platform.summary()
    run_dirs = sorted(p for p in root.glob("*/*") if p.is_dir())
    assert len(state["evaluations"]) == len(run_dirs)
    for run_dir in run_dirs:
        ids, expected = _expected(run_dir)
        assert state["runs"][expected["run_id"]] == 1, "one evaluation per run"
        evaluation_id, evaluation = next(
            (k, e)
            for k, e in state["evaluations"].items()
            if e["metadata"]["run_id"] == expected["run_id"]
        )
        assert evaluation["status"] == "COMPLETED"
        assert evaluation["finalize_count"] == 1
        assert evaluation["duplicates"] == 0
        assert evaluation["sample_count"] == len(ids)
        stored = [s["sample_id"] for s in platform.samples(evaluation_id)]
        assert sorted(stored) == sorted(ids), "every sample exactly once"
        assert evaluation["metadata"] == expected["metadata"]
        assert evaluation["metrics"] == expected["metrics"]
        assert evaluation["name"] == expected["name"]


CRASH_POINTS = [
    "create-sent",  # the evaluation exists, the ledger does not know its id
    "batch-intent:1",  # intent recorded, nothing sent
    "batch-sent:1",  # the first batch is stored, not acknowledged in the ledger
    "batch-sent:7",  # mid-run
    "batch-acked:3",  # acknowledged, next batch not started
    "finalize-sent",  # finalized on the platform, not in the ledger
]


class TestKilledAtEveryStepBoundary:
    @pytest.mark.parametrize("point", CRASH_POINTS)
    def test_a_push_killed_at_a_step_boundary_resumes_exactly_once(
        self, point: str, runs: Path, platform: LocalPlatform, tmp_path: Path
    ) -> None:
        crashing = _push(runs, _environ(platform, tmp_path, **{CRASH_ENV: point}))
        crashing.communicate(timeout=PUSH_TIMEOUT_SECONDS)
        assert crashing.returncode == -signal.SIGKILL, "the hook killed the push at the point"
        _push_until_done(runs, _environ(platform, tmp_path))
        assert_exactly_once(platform, runs)

    def test_a_push_that_dies_at_every_point_in_turn_still_ends_exactly_once(
        self, runs: Path, platform: LocalPlatform, tmp_path: Path
    ) -> None:
        for point in CRASH_POINTS:
            process = _push(runs, _environ(platform, tmp_path, **{CRASH_ENV: point}))
            process.communicate(timeout=PUSH_TIMEOUT_SECONDS)
        _push_until_done(runs, _environ(platform, tmp_path))
        assert_exactly_once(platform, runs)


class TestKilledAtRandomInstants:
    def test_a_push_killed_at_random_instants_until_done_sends_each_sample_once(
        self,
        big_source_run: Path,
        source_runs: list[Path],
        platform: LocalPlatform,
        tmp_path: Path,
    ) -> None:
        runs = _outputs(tmp_path, [big_source_run, *source_runs])
        rng = random.Random(int(os.environ.get("EVALPUSH_TEST_SEED", "1234")))
        # Five samples a batch: hundreds of batches. Each push is killed once the platform has
        # seen a random number of further batch requests, plus a random fraction of a batch.
        environ = _environ(platform, tmp_path, EVALPUSH_UPLOAD__MAX_BATCH_SAMPLES="5")
        kills = 0
        for _ in range(MAX_ATTEMPTS):
            target = platform.summary()["requests"]["samples"] + rng.randint(1, 60)
            process = _push(runs, environ)
            while process.poll() is None and platform.summary()["requests"]["samples"] < target:
                time.sleep(0.005)
            time.sleep(rng.uniform(0, 0.01))
            if process.poll() is None:
                process.kill()
                process.wait()
                kills += 1
                continue
            if process.returncode == 0:
                break
        else:
            pytest.fail(f"push never finished in {MAX_ATTEMPTS} attempts")
        assert kills > 0, "at least one push was killed mid-way"
        assert_exactly_once(platform, runs)


def _with_lines_only_conversion_refuses(run_dir: Path) -> list[str]:
    """Put lines the cheap first pass counts but conversion refuses (a parent out of range, bad
    UTF-8 in a message) among the first batch's lines; returns the ids of the good lines."""
    traces = run_dir / "traces.jsonl"
    lines = traces.read_bytes().splitlines(keepends=True)
    good_ids = [orjson.loads(line)["id"] for line in lines]
    graph = orjson.loads(lines[0])
    graph["id"], graph["nodes"][-1]["parent"] = "broken-graph", 10_000
    text = orjson.loads(lines[1])
    text["id"] = "bad-text"
    text = orjson.dumps(text).replace(b'"content":"', b'"content":"\xff', 1) + b"\n"
    lines[3:3] = [orjson.dumps(graph) + b"\n", text]
    traces.write_bytes(b"".join(lines))
    return good_ids


class TestKilledWithLinesOnlyConversionRefuses:
    @pytest.mark.parametrize("point", ["batch-acked:2", "finalize-sent"])
    def test_a_push_killed_after_such_lines_finalizes_once_without_them(
        self, point: str, source_runs: list[Path], platform: LocalPlatform, tmp_path: Path
    ) -> None:
        runs = _outputs(tmp_path, source_runs[1:])
        [run_dir] = runs.glob("*/*")
        good_ids = _with_lines_only_conversion_refuses(run_dir)
        crashing = _push(runs, _environ(platform, tmp_path, **{CRASH_ENV: point}))
        crashing.communicate(timeout=PUSH_TIMEOUT_SECONDS)
        assert crashing.returncode == -signal.SIGKILL

        again = _push(runs, _environ(platform, tmp_path))
        out, err = again.communicate(timeout=PUSH_TIMEOUT_SECONDS)

        assert again.returncode == 1, err.decode()  # done, with lines set aside
        assert b"finalized" in out and b"2 set aside" in out, out.decode()
        run = load_run(run_dir)
        limit = Config().read.max_line_bytes
        checked = scan(read_lines(run.traces_path, max_line_bytes=limit), max_line_bytes=limit)
        assert checked.totals.traces == len(good_ids) > 40
        [(evaluation_id, evaluation)] = platform.summary()["evaluations"].items()
        assert evaluation["status"] == "COMPLETED" and evaluation["finalize_count"] == 1
        assert evaluation["duplicates"] == 0
        stored = [s["sample_id"] for s in platform.samples(evaluation_id)]
        assert sorted(stored) == sorted(good_ids)
        assert evaluation["metrics"] == summary(run, checked.totals)["metrics"]


class TestStoppedWithSigterm:
    def test_sigterm_stops_the_push_cleanly_and_the_next_push_finishes(
        self, runs: Path, platform: LocalPlatform, tmp_path: Path
    ) -> None:
        # A platform outage keeps the push retrying, so the signal lands mid-upload.
        platform.inject("status", on="samples", status=503, count=10_000)
        environ = _environ(platform, tmp_path)
        process = _push(runs, environ)
        deadline = time.monotonic() + PUSH_TIMEOUT_SECONDS
        while platform.summary()["requests"]["samples"] < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=PUSH_TIMEOUT_SECONDS)
        assert process.returncode == 1
        assert b"interrupted" in out
        platform.clear_faults()
        _push_until_done(runs, environ)
        assert_exactly_once(platform, runs)
