"""Crash tests: `evalpush push` as a real subprocess, killed with SIGKILL (or stopped with
SIGTERM) at every step boundary and at random instants, then run again until it is done; and
power lost at every step boundary (killed, and the ledger put back as its last sync left it).

Whatever the kill point, the local platform ends up holding exactly one finalized evaluation per
run, every sample exactly once, and the metrics the producer's own push would send.
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import orjson
import pytest

from evalpush.config import Config
from evalpush.convert import scan, summary
from evalpush.local_platform import LocalPlatform
from evalpush.runs import load_run, read_lines
from evalpush.upload import CRASH_ENV
from pushing import (
    PUSH_TIMEOUT_SECONDS,
    assert_exactly_once,
    generated_run,
    outputs,
    push_environ,
    push_until_done,
    start_push,
)
from support.producer import generated_run_of

MAX_ATTEMPTS = 40


@pytest.fixture(scope="module")
def source_runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two generated runs (about 600 KB and 250 KB: dozens of 20-sample batches)."""
    out = tmp_path_factory.mktemp("source-runs")
    return [generated_run(out, 600_000, seed=1), generated_run(out, 250_000, seed=2)]


@pytest.fixture(scope="module")
def big_source_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of about 3 MB (some 800 traces): seconds of upload in 5-sample batches."""
    return generated_run(tmp_path_factory.mktemp("big-run"), 3_000_000, seed=3)


@pytest.fixture
def runs(source_runs: list[Path], tmp_path: Path) -> Path:
    return outputs(tmp_path, source_runs)


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
        crashing = start_push(runs, push_environ(platform, tmp_path, **{CRASH_ENV: point}))
        crashing.communicate(timeout=PUSH_TIMEOUT_SECONDS)
        assert crashing.returncode == -signal.SIGKILL, "the hook killed the push at the point"
        push_until_done(runs, push_environ(platform, tmp_path))
        assert_exactly_once(platform, runs)

    def test_a_push_that_dies_at_every_point_in_turn_still_ends_exactly_once(
        self, runs: Path, platform: LocalPlatform, tmp_path: Path
    ) -> None:
        for point in CRASH_POINTS:
            process = start_push(runs, push_environ(platform, tmp_path, **{CRASH_ENV: point}))
            process.communicate(timeout=PUSH_TIMEOUT_SECONDS)
        push_until_done(runs, push_environ(platform, tmp_path))
        assert_exactly_once(platform, runs)


@pytest.fixture(scope="module")
def producer_runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """A verifiers 0.2 run and a 0.4 run (its own layout, an offline run id): generated rollouts
    of about 400 KB each as those versions write them."""
    out = tmp_path_factory.mktemp("producer-runs")
    return [generated_run_of(p, out, 400_000, seed=4) for p in ("0.2", "0.4")]


class TestLaterProducersKilledAtEveryStepBoundary:
    @pytest.mark.parametrize("point", CRASH_POINTS)
    def test_a_0_2_and_a_0_4_run_killed_at_a_step_boundary_end_exactly_once(
        self, point: str, producer_runs: list[Path], platform: LocalPlatform, tmp_path: Path
    ) -> None:
        runs = outputs(tmp_path, producer_runs)
        crashing = start_push(runs, push_environ(platform, tmp_path, **{CRASH_ENV: point}))
        crashing.communicate(timeout=PUSH_TIMEOUT_SECONDS)
        assert crashing.returncode == -signal.SIGKILL, "the hook killed the push at the point"
        push_until_done(runs, push_environ(platform, tmp_path))
        assert_exactly_once(platform, runs)
        kinds = {e["metadata"]["run_id"][:9] for e in platform.summary()["evaluations"].values()}
        assert "disabled-" in kinds, "the 0.4 run is among them, under its own run id"


POWER_LOSS_HOOK = """
import os, shutil

_fsync, _snapshots = os.fsync, os.environ["POWER_LOSS_SNAPSHOTS"]


def fsync(fd):
    synced = os.fstat(fd).st_size  # frames other threads commit meanwhile are not made durable
    _fsync(fd)
    log = os.readlink(f"/proc/self/fd/{fd}")
    if log.endswith("state.db-wal"):  # what power loss from now on would leave (the ledger syncs
        # one at a time: its sync lock is held here): the log as far as it went when the sync began
        taken = os.path.join(_snapshots, str(len(os.listdir(_snapshots))))
        os.mkdir(taken + ".part")
        shutil.copyfile(log[: -len("-wal")], os.path.join(taken + ".part", "state.db"))
        with open(log, "rb") as source:
            frames = source.read(synced)
        with open(os.path.join(taken + ".part", "state.db-wal"), "wb") as copy:
            copy.write(frames)
        os.rename(taken + ".part", taken)


os.fsync = fsync
"""


def lose_power(state: Path, snapshots: Path) -> None:
    """Put the ledger back as the last sync of its log left it: what survives power loss."""
    taken = sorted((p for p in snapshots.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    for name in ("state.db", "state.db-wal", "state.db-shm"):
        (state / name).unlink(missing_ok=True)
    if taken:
        for name in ("state.db", "state.db-wal"):
            (state / name).write_bytes((taken[-1] / name).read_bytes())


class TestPowerLossAtEveryStepBoundary:
    @pytest.mark.parametrize("point", CRASH_POINTS)
    def test_the_ledger_as_last_synced_resumes_exactly_once(
        self, point: str, runs: Path, platform: LocalPlatform, tmp_path: Path
    ) -> None:
        """Power lost at each step boundary: the push dies there and the ledger is put back as
        of its last sync (a write not synced is lost; one synced is not). The first batch after
        a create goes out before its intent is synced, covered by the create intent: this is
        where that is put to the test."""
        hook, snapshots = tmp_path / "hook", tmp_path / "snapshots"
        hook.mkdir()
        snapshots.mkdir()
        (hook / "sitecustomize.py").write_text(POWER_LOSS_HOOK)
        environ = push_environ(platform, tmp_path)
        crashing = start_push(
            runs,
            {
                **environ,
                CRASH_ENV: point,
                "PYTHONPATH": str(hook),
                "POWER_LOSS_SNAPSHOTS": str(snapshots),
            },
        )
        crashing.communicate(timeout=PUSH_TIMEOUT_SECONDS)
        assert crashing.returncode == -signal.SIGKILL, "the hook killed the push at the point"
        assert any(snapshots.iterdir()), "the hook saw the ledger synced"
        lose_power(tmp_path / "state", snapshots)
        push_until_done(runs, environ)
        assert_exactly_once(platform, runs)


class TestKilledAtRandomInstants:
    def test_a_push_killed_at_random_instants_until_done_sends_each_sample_once(
        self,
        big_source_run: Path,
        source_runs: list[Path],
        platform: LocalPlatform,
        tmp_path: Path,
    ) -> None:
        runs = outputs(tmp_path, [big_source_run, *source_runs])
        rng = random.Random(int(os.environ.get("EVALPUSH_TEST_SEED", "1234")))
        # Five samples a batch: hundreds of batches. Each push is killed once the platform has
        # seen a random number of further batch requests, plus a random fraction of a batch.
        environ = push_environ(platform, tmp_path, EVALPUSH_UPLOAD__MAX_BATCH_SAMPLES="5")
        kills = 0
        for _ in range(MAX_ATTEMPTS):
            target = platform.summary()["requests"]["samples"] + rng.randint(1, 60)
            process = start_push(runs, environ)
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
        runs = outputs(tmp_path, source_runs[1:])
        [run_dir] = runs.glob("*/*")
        good_ids = _with_lines_only_conversion_refuses(run_dir)
        crashing = start_push(runs, push_environ(platform, tmp_path, **{CRASH_ENV: point}))
        crashing.communicate(timeout=PUSH_TIMEOUT_SECONDS)
        assert crashing.returncode == -signal.SIGKILL

        again = start_push(runs, push_environ(platform, tmp_path))
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
        environ = push_environ(platform, tmp_path)
        process = start_push(runs, environ)
        deadline = time.monotonic() + PUSH_TIMEOUT_SECONDS
        while platform.summary()["requests"]["samples"] < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=PUSH_TIMEOUT_SECONDS)
        assert process.returncode == 128 + signal.SIGTERM
        assert b"interrupted" in out
        platform.clear_faults()
        push_until_done(runs, environ)
        assert_exactly_once(platform, runs)
