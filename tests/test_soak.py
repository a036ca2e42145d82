"""The chaos soak, small (bench/soak.py at full size), and the parts it relies on.

- The writers record exactly what they wrote: the accounting's truth is theirs, not evalpush's.
- The accounting finds every kind of violation it claims to (a second evaluation, one left
  open, a duplicated or lost sample, a finalize sent twice, metrics that differ, an evaluation
  of a run that cannot upload, one of no run at all), so a clean soak means something; and
  evalpush's own view (`evalpush status`) is held against the platform's (a run left
  unfinished, or naming another evaluation, is found).
- A short soak: runs written line by line while the platform injects faults and outages and the
  uploader is SIGKILLed at random, ends with every run exactly once on the platform.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from evalpush.config import load_config
from evalpush.local_platform import LocalPlatform

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

from soakkit.accounting import Accounting, RunAccount, account, convert  # noqa: E402 - bench/ first
from soakkit.chaos import ChaosParams  # noqa: E402
from soakkit.ledgerview import compare  # noqa: E402
from soakkit.plan import BadLine, Flaw, Readiness, RunPlan, plan_one  # noqa: E402
from soakkit.platform import clean_environ  # noqa: E402
from soakkit.run import SoakParams, run_soak  # noqa: E402
from soakkit.table import table  # noqa: E402
from soakkit.uploaders import EvalpushWorld, Mode  # noqa: E402
from soakkit.writers import MARKER, Writer, read_manifests  # noqa: E402

PUSH_TIMEOUT_SECONDS = 120


def _plan(
    index: int,
    readiness: Readiness = Readiness.COUNT,
    flaw: Flaw = Flaw.NONE,
    *,
    lines: int = 40,
    rewritten: bool = False,
) -> RunPlan:
    return plan_one(random.Random(index), index, lines, readiness, flaw, rewritten)


def _write(tree: Path, manifest: Path, plans: list[RunPlan]) -> dict[str, dict]:
    Writer(tree, manifest, seed=7, pause_seconds=0.0).run(plans)
    return read_manifests([manifest])


class TestWriters:
    def test_the_manifest_records_the_good_ids_and_hash_of_each_final_file(
        self, tmp_path: Path
    ) -> None:
        plans = [
            _plan(1, Readiness.MARKER, Flaw.BAD_LINES, lines=60, rewritten=True),
            _plan(2, Readiness.SETTLE),
        ]
        plans[0] = RunPlan.from_json(
            {**plans[0].to_json(), "bad_lines": {str(i): k.value for i, k in enumerate(BadLine)}}
        )
        manifest = _write(tmp_path / "tree", tmp_path / "manifest.jsonl", plans)
        assert set(manifest) == {p.run_id for p in plans}
        for plan in plans:
            entry = manifest[plan.run_id]
            run_dir = tmp_path / "tree" / plan.relpath
            raw = (run_dir / "traces.jsonl").read_bytes()
            lines = raw.split(b"\n")
            assert lines[-1] == b"", "the file ends with a complete line"
            good = []
            for line in lines[:-1]:
                try:
                    trace = json.loads(line)
                except ValueError:  # not JSON, or not UTF-8
                    continue
                if isinstance(trace, dict) and "idx" in trace["task"]:
                    good.append(trace["id"])
            assert entry["good_ids"] == good
            assert entry["lines"] == len(lines) - 1 == plan.lines
            assert entry["bad_lines"] == len(plan.bad_lines)
            assert entry["bytes"] == len(raw)
            assert (run_dir / MARKER).exists() == (plan.readiness == Readiness.MARKER)
        assert manifest[plans[0].run_id]["rewritten"]

    def test_a_run_that_cannot_upload_gets_the_config_it_was_planned_with(
        self, tmp_path: Path
    ) -> None:
        plans = [_plan(3, flaw=Flaw.NO_ENV), _plan(4, flaw=Flaw.BAD_CONFIG)]
        _write(tmp_path / "tree", tmp_path / "manifest.jsonl", plans)
        for plan in plans:
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "evalpush",
                    "convert",
                    str(tmp_path / "tree" / plan.relpath),
                ],
                capture_output=True,
                env=clean_environ(),
                check=False,
            )
            if plan.flaw == Flaw.NO_ENV:
                assert done.returncode == 1
                assert b"no environment name" in done.stderr
            else:
                assert done.returncode == 2
                assert b"config.toml" in done.stderr


def _push(platform: LocalPlatform, tmp_path: Path, dirs: list[Path]) -> None:
    environ = clean_environ(
        PRIME_API_KEY=platform.api_key,
        PRIME_API_BASE_URL=platform.base_url,
        HOME=str(tmp_path / "home"),
        EVALPUSH_STATE_DIR=str(tmp_path / "state"),
        EVALPUSH_UPLOAD__MAX_BATCH_SAMPLES="10",
    )
    subprocess.run(
        [sys.executable, "-m", "evalpush", "push", *map(str, dirs)],
        env=environ,
        capture_output=True,
        timeout=PUSH_TIMEOUT_SECONDS,
        check=False,
    )


class _HandUpload:
    """The platform API driven by hand, to put on it what evalpush never should."""

    def __init__(self, platform: LocalPlatform) -> None:
        self.client = httpx.Client(
            base_url=f"{platform.base_url}/api/v1",
            headers={"Authorization": f"Bearer {platform.api_key}"},
        )

    def evaluation(self, run_id: str, environment: str = "soak-env-alpha") -> str:
        env_id = self.client.post("/environmentshub/resolve", json={"name": environment})
        body = {
            "name": f"by hand {run_id}",
            "environments": [{"id": env_id.json()["data"]["id"]}],
            "metadata": {"run_id": run_id},
            "metrics": {"avg_reward": -1.0},
        }
        return self.client.post("/evaluations/", json=body).json()["evaluation_id"]

    def samples(self, evaluation_id: str, samples: list[dict]) -> None:
        sent = self.client.post(f"/evaluations/{evaluation_id}/samples", json={"samples": samples})
        sent.raise_for_status()

    def finalize(self, evaluation_id: str) -> None:
        self.client.post(f"/evaluations/{evaluation_id}/finalize", json={"metrics": {}})


class TestAccounting:
    def test_a_clean_upload_accounts_with_no_problem(self, tmp_path: Path) -> None:
        plans = [_plan(10), _plan(11, flaw=Flaw.BAD_LINES), _plan(12, flaw=Flaw.NO_ENV)]
        tree = tmp_path / "tree"
        manifest = _write(tree, tmp_path / "manifest.jsonl", plans)
        with LocalPlatform() as platform:
            _push(platform, tmp_path, [tree / p.relpath for p in plans])
            accounting = account(platform, plans, manifest, tree)
        assert accounting.problems == []
        assert [r.shape for r in accounting.runs] == ["1 COMPLETED", "1 COMPLETED", "none"]
        assert all(r.metrics_equal and r.samples_equal for r in accounting.runs[:2])
        assert accounting.total("samples_written") == 3 * 40 - len(plans[1].bad_lines)

    def test_every_kind_of_violation_is_found(self, tmp_path: Path) -> None:
        second, left_open, by_hand, lost, cannot = plans = [
            _plan(20),
            _plan(21),
            _plan(22),
            _plan(23),
            _plan(24, flaw=Flaw.BAD_CONFIG),
        ]
        tree = tmp_path / "tree"
        manifest = _write(tree, tmp_path / "manifest.jsonl", plans)
        with LocalPlatform() as platform:
            _push(platform, tmp_path, [tree / p.relpath for p in (second, left_open, lost)])
            hand = _HandUpload(platform)
            hand.finalize(hand.evaluation(second.run_id))  # a second COMPLETED evaluation
            hand.evaluation(left_open.run_id)  # an evaluation left RUNNING beside the good one
            samples = list(convert(tree / by_hand.relpath).samples.values())
            evaluation = hand.evaluation(by_hand.run_id)
            hand.samples(evaluation, samples)
            hand.samples(evaluation, samples[:3])  # three sent twice
            hand.finalize(evaluation)
            hand.finalize(evaluation)  # refused (409), but a second finalize request
            hand.evaluation(cannot.run_id)  # a run whose config.toml is not TOML
            stray = hand.evaluation("no-such-run")
            hand.client.close()
            # The writer "wrote" one more id than the file has: that one is lost.
            manifest[lost.run_id]["good_ids"].append("written-but-never-stored")
            accounting = account(platform, plans, manifest, tree)
        runs = {r.plan.run_id: r for r in accounting.runs}
        assert "2 COMPLETED evaluations, not 1" in " ".join(runs[second.run_id].problems)
        assert runs[second.run_id].duplicated == 0, "the hand-made one holds no sample"
        assert "neither COMPLETED nor CANCELLED" in " ".join(runs[left_open.run_id].problems)
        assert runs[by_hand.run_id].duplicated == 3
        assert runs[by_hand.run_id].finalize_calls == [2]
        assert runs[by_hand.run_id].metrics_equal is False
        assert runs[lost.run_id].lost == 1
        assert "cannot upload has evaluations" in " ".join(runs[cannot.run_id].problems)
        assert accounting.strays == [stray]


class TestLedgerView:
    def test_a_ledger_that_disagrees_with_the_platform_is_found(self) -> None:
        pushed, unfinished, other, cannot = plans = [
            _plan(30),
            _plan(31),
            _plan(32),
            _plan(33, flaw=Flaw.NO_ENV),
        ]
        summary = {
            "evaluations": {
                f"eval-{p.index}": {"status": "COMPLETED", "metadata": {"run_id": p.run_id}}
                for p in plans[:3]
            }
        }
        rows = [
            {"run_id": pushed.run_id, "state": "finalized", "evaluation_id": "eval-30"},
            {"run_id": pushed.run_id, "state": "superseded", "evaluation_id": "eval-old"},
            {"run_id": unfinished.run_id, "state": "uploading", "evaluation_id": "eval-31"},
            {"run_id": other.run_id, "state": "finalized", "evaluation_id": "eval-30"},
            {"run_id": cannot.run_id, "state": "ready", "evaluation_id": None},
        ]
        view = compare(rows, Accounting([RunAccount(p) for p in plans], []), summary)
        assert view.states == {"finalized": 2, "uploading": 1, "ready": 1}
        found = " | ".join(view.problems)
        assert pushed.run_id not in found, "the superseded row is an earlier evaluation"
        assert f"run {unfinished.run_id}: the ledger says uploading, not finalized" in found
        assert f"run {other.run_id}: the ledger names evaluation eval-30" in found
        assert f"run {cannot.run_id} (no_env): the ledger says ready" in found
        assert len(view.problems) == 3


class TestDaemonConfig:
    def test_the_daemons_config_and_environment_are_ones_evalpush_accepts(
        self, tmp_path: Path
    ) -> None:
        workdir = tmp_path / "it's a ü dir"
        workdir.mkdir()
        world = EvalpushWorld(workdir, "http://127.0.0.1:1", "key", settle_seconds=6.0)
        config = load_config(world.daemon_config(), environ=world.environ())
        assert config.watch.roots == [workdir / "tree"]
        assert config.runs.settle_seconds == 6.0
        assert config.runs.marker == MARKER
        assert config.state_dir == workdir / "state"
        assert config.upload.max_batch_samples == world.batch_samples


SOAK_CASES = [
    pytest.param(Mode.PUSH_ONLY, 3, id="push-only-with-overlapping-pushes"),
    pytest.param(Mode.DAEMON, 3, id="daemon"),
]


class TestShortSoak:
    @pytest.mark.parametrize(("mode", "overlaps"), SOAK_CASES)
    def test_runs_written_under_faults_outages_and_kills_end_exactly_once_on_the_platform(
        self, mode: Mode, overlaps: int, tmp_path: Path
    ) -> None:
        params = SoakParams(
            workdir=tmp_path / "soak",
            mode=mode,
            runs=10,
            samples=1200,
            writers=2,
            kills=4,
            kill_after_seconds=(0.3, 2.0),
            overlaps=overlaps,
            overlap_interval_seconds=3.0,
            chaos=ChaosParams(
                fault_share=0.15,
                outage_interval_seconds=10.0,
                outage_seconds=(1.0, 3.0),
                first_outage_seconds=3.0,
                late_seconds=0.3,
            ),
            late_write_seconds=0.6,
            max_seconds=120.0,
            drain_seconds=120.0,
            seed=int(os.environ.get("EVALPUSH_TEST_SEED", "11")),
        )
        report = run_soak(params)
        assert report.violations == [], table(report)
        assert not report.chaos_timed_out, table(report)
        assert report.kills >= 1, "the uploader was killed at least once mid-way"
        assert report.outages >= 1, "the platform was down for a while"
        assert sum(report.faults.values()) >= 3, "faults were injected"
        assert report.overlaps >= min(overlaps, 1), "pushes overlapped the uploader"
        flaws = {r.plan.flaw for r in report.accounting.runs}
        assert flaws == set(Flaw), "every kind of run was written"
