"""`evalpush run` against a hostile world: what it must survive, as a real subprocess.

kill -9 at random moments, trace files rewritten, renamed or deleted while it watches, a FIFO
named traces.jsonl, a symlink out of the root, a directory name that is not UTF-8, a thousand
runs at once, a ledger broken under it, signals in a storm. Each test asserts the daemon keeps
going (or, where it cannot, exits with a non-zero code instead of hanging) and that every good
run ends exactly once on the platform.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from daemon_support import (
    RUN_FINALIZED,
    Daemon,
    InProcessDaemon,
    NotifySocket,
    RunDir,
    completed,
    daemon_environ,
    evaluations_of,
    slow_run,
    status,
    trace_line,
    upload_under_way,
    wait_until,
)
from evalpush.local_platform import LocalPlatform
from pushing import assert_run_exactly_once

EXIT_SECONDS = 20.0
MANY_RUNS = 1000
MANY_SECONDS = 300.0  # a generous bound: about 30 s on a quiet 2-core box


def _break_ledger(state: Path) -> None:
    """Overwrite the ledger's header and its WAL: every later query fails."""
    with open(state / "state.db", "r+b") as f:
        f.write(b"\0" * 100)
    for name in ("state.db-wal", "state.db-shm"):
        path = state / name
        if path.exists():
            with open(path, "r+b") as f:
                f.write(b"\xff" * 4096)


QUICK_RESCAN_SECONDS = 0.5
"""A rescan this often where a test waits for rescans to see (or not see) a change."""


class TestLedgerBroken:
    @pytest.mark.parametrize("reloaded", [False, True], ids=["as started", "after a reload"])
    def test_a_ledger_broken_under_the_daemon_makes_it_exit_non_zero_not_hang(
        self, reloaded: bool, local_platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        environ = daemon_environ(local_platform, tmp_path, [tree])
        first = RunDir(tree / "env--model--harness").config(num_tasks=1)
        with (
            NotifySocket() as notify,
            Daemon({**environ, "NOTIFY_SOCKET": notify.address}) as daemon,
        ):
            daemon.started()
            first.write(first.lines(2))
            daemon.wait_for(RUN_FINALIZED, run=first.run_id)
            if reloaded:
                daemon.signal(signal.SIGHUP)
                notify.wait_for("RELOADING=1")
                # Ready again: the rebuilt daemon's first ledger write (its heartbeat row) is
                # done. Damage that lands while a write is under way can be written over by it
                # (one in five runs under load went on with no error): it must land between.
                notify.wait_for("READY=1")
            _break_ledger(tmp_path / "state")
            second = RunDir(tree / "env--model--harness").config(num_tasks=1)
            second.write(second.lines(2))
            try:
                code = daemon.process.wait(EXIT_SECONDS)
            except subprocess.TimeoutExpired:
                code = None
        assert code == 1, f"the daemon hung ({code}):\n{daemon.text()}"
        assert "state.db" in daemon.text()


class TestSignalStorm:
    def test_a_storm_of_sighups_leaves_a_daemon_that_uploads_and_stops_cleanly(
        self, local_platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        environ = daemon_environ(
            local_platform, tmp_path, [tree], EVALPUSH_UPLOAD__MAX_BATCH_SAMPLES="1"
        )
        runs = [RunDir(tree / "env--model--harness").config(num_tasks=10) for _ in range(3)]
        with Daemon(environ) as daemon:
            daemon.started()
            for run in runs:
                run.write(run.lines(20))
            for _ in range(200):
                daemon.signal(signal.SIGHUP)
                time.sleep(0.005)
            for run in runs:
                daemon.wait_for(RUN_FINALIZED, run=run.run_id)
            assert daemon.stop() == 0
        for run in runs:
            assert_run_exactly_once(local_platform, run.path)


class TestKilled:
    def test_kill_9_at_random_moments_then_a_last_start_leaves_every_run_exactly_once(
        self, local_platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        environ = daemon_environ(
            local_platform, tmp_path, [tree], EVALPUSH_UPLOAD__MAX_BATCH_SAMPLES="2"
        )
        rng = random.Random(int(os.environ.get("EVALPUSH_TEST_SEED", "5")))
        runs = [RunDir(tree / "env--model--harness").config(num_tasks=15) for _ in range(4)]
        for round_, run in enumerate(runs):
            with Daemon(environ) as daemon:
                run.write(run.lines(30), pause=0.01)
                time.sleep(rng.uniform(0.2, 1.5))  # a random moment: the kill is the point
                daemon.kill()
            assert daemon.process.returncode == -signal.SIGKILL, round_
        with Daemon(environ) as last:
            last.started()  # its SIGTERM handler is in place before stop() sends SIGTERM

            def all_finalized() -> bool:  # one `status`: its rows judged together
                rows = status(environ)
                return set(rows) == {run.run_id for run in runs} and all(
                    row["state"] == "finalized" and row["holder"] is None for row in rows.values()
                )

            wait_until(
                all_finalized,
                "every run finalized in the ledger (by the last daemon or one killed before)",
            )
            assert last.stop() == 0
        for run in runs:
            assert_run_exactly_once(local_platform, run.path)


class TestTwoDaemons:
    def test_two_daemons_on_one_tree_and_one_state_dir_upload_each_run_once(
        self, local_platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        environ = daemon_environ(
            local_platform, tmp_path, [tree], EVALPUSH_UPLOAD__MAX_BATCH_SAMPLES="2"
        )
        runs = [RunDir(tree / "env--model--harness").config(num_tasks=5) for _ in range(8)]
        with Daemon(environ) as one, Daemon(environ) as two:
            one.started()
            two.started()
            for run in runs:
                run.write(run.lines(10), pause=0.01)
            wait_until(
                lambda: (
                    all(completed(local_platform, run.run_id) for run in runs)
                    and all(row["state"] == "finalized" for row in status(environ).values())
                ),
                "every run finalized",
            )
            assert one.stop() == 0
            assert two.stop() == 0
        for run in runs:
            assert_run_exactly_once(local_platform, run.path)
        assert not [line for line in one.raw + two.raw if b"Traceback" in line]


class TestFilesChanging:
    def test_a_trace_file_rewritten_while_the_run_waits_is_counted_afresh(
        self, local_platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        environ = daemon_environ(
            local_platform,
            tmp_path,
            [tree],
            EVALPUSH_RUNS__SETTLE_SECONDS="600",
            EVALPUSH_WATCH__RESCAN_SECONDS=str(QUICK_RESCAN_SECONDS),
        )
        run = RunDir(tree / "env--model--harness").config(num_tasks=3)
        with InProcessDaemon(environ) as daemon:
            daemon.started()
            run.write(run.lines(5))
            daemon.wait_for("run found: waiting until it is finished", run=run.run_id)
            with open(run.traces, "r+b") as f:  # rewritten in place, shorter: other traces
                f.truncate(0)
                f.write(b"".join(line + b"\n" for line in run.lines(2, start=100)))
            time.sleep(2 * QUICK_RESCAN_SECONDS)  # two rescans: 2 lines of 6 is not finished
            assert evaluations_of(local_platform, run.run_id) == {}
            run.write(run.lines(4, start=102))
            daemon.wait_for(RUN_FINALIZED, run=run.run_id)
            assert daemon.stop() == 0
        assert_run_exactly_once(local_platform, run.path)
        ids = sorted(
            s["sample_id"]
            for s in local_platform.samples(completed(local_platform, run.run_id)["id"])
        )
        assert ids == sorted(f"trace-{i}" for i in range(100, 106))

    def test_a_finalized_run_replaced_by_a_resume_goes_again_as_a_new_evaluation(
        self, local_platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        environ = daemon_environ(local_platform, tmp_path, [tree])
        run = RunDir(tree / "env--model--harness").config(num_tasks=2)
        with InProcessDaemon(environ) as daemon:
            daemon.started()
            run.write(run.lines(4))
            first = daemon.wait_for(RUN_FINALIZED, run=run.run_id)["evaluation"]
            replacement = run.path / "traces.jsonl.tmp"
            replacement.write_bytes(b"".join(line + b"\n" for line in run.lines(4, start=50)))
            replacement.rename(run.traces)  # as --resume does: another inode, other bytes
            second = daemon.wait_for(RUN_FINALIZED, run=run.run_id, count=2)["evaluation"]
            assert daemon.stop() == 0
        evaluations = evaluations_of(local_platform, run.run_id)
        assert set(evaluations) == {first, second}
        assert all(e["finalize_count"] == 1 for e in evaluations.values())
        assert sorted(s["sample_id"] for s in local_platform.samples(second)) == [
            f"trace-{i}" for i in range(50, 54)
        ]
        assert status(environ)[run.run_id]["evaluation_id"] == second

    def test_a_trace_file_replaced_mid_upload_cancels_the_open_evaluation_and_uploads_anew(
        self, local_platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        environ = daemon_environ(
            local_platform, tmp_path, [tree], EVALPUSH_UPLOAD__MAX_BATCH_SAMPLES="1"
        )
        run = slow_run(local_platform, tree / "env--model--harness")  # kept mid-upload
        with InProcessDaemon(environ) as daemon:
            upload_under_way(local_platform)
            replacement = run.path / "traces.jsonl.tmp"
            replacement.write_bytes(b"".join(line + b"\n" for line in run.lines(40, start=500)))
            replacement.rename(run.traces)
            wait_until(lambda: completed(local_platform, run.run_id), "a completed evaluation")
            wait_until(
                lambda: status(environ)[run.run_id]["state"] == "finalized", "the ledger to agree"
            )
            assert daemon.stop() == 0
        evaluations = evaluations_of(local_platform, run.run_id)
        assert sorted(e["status"] for e in evaluations.values()) == ["CANCELLED", "COMPLETED"]
        done = completed(local_platform, run.run_id)
        assert done is not None and done["finalize_count"] == 1 and done["duplicates"] == 0
        assert sorted(s["sample_id"] for s in local_platform.samples(done["id"])) == sorted(
            f"trace-{i}" for i in range(500, 540)
        )

    def test_a_run_directory_renamed_while_it_waits_is_uploaded_once_from_its_new_path(
        self, local_platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        environ = daemon_environ(
            local_platform, tmp_path, [tree], EVALPUSH_RUNS__SETTLE_SECONDS="600"
        )
        run = RunDir(tree / "env--model--harness").config(num_tasks=3)
        with InProcessDaemon(environ) as daemon:
            daemon.started()
            run.write(run.lines(3))
            daemon.wait_for("run found: waiting until it is finished", run=run.run_id)
            moved = RunDir(tree / "elsewhere" / "deeper", run_id=run.run_id)
            moved.path.parent.mkdir(parents=True)
            run.path.rename(moved.path)
            moved.write(moved.lines(3, start=3))
            daemon.wait_for(RUN_FINALIZED, run=run.run_id)
            assert daemon.stop() == 0
        assert_run_exactly_once(local_platform, moved.path)
        assert status(environ)[run.run_id]["path"] == str(moved.path)

    def test_a_run_directory_renamed_mid_upload_is_finalized_once_from_its_new_path(
        self, local_platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        environ = daemon_environ(
            local_platform, tmp_path, [tree], EVALPUSH_UPLOAD__MAX_BATCH_SAMPLES="1"
        )
        run = slow_run(local_platform, tree / "env--model--harness")  # kept mid-upload
        with InProcessDaemon(environ) as daemon:
            upload_under_way(local_platform)
            moved = RunDir(tree / "renamed", run_id=run.run_id)
            moved.path.parent.mkdir()
            run.path.rename(moved.path)
            # The upload goes on from the open file; the next rescan records the new path.
            wait_until(
                lambda: (
                    (row := status(environ)[run.run_id])["state"] == "failed"
                    or (row["state"] == "finalized" and row["path"] == str(moved.path))
                ),
                "the upload to end and the new path to be recorded",
            )
            assert daemon.stop() == 0
        row = status(environ)[run.run_id]
        assert (row["state"], row["last_error"]) == ("finalized", None)
        assert row["path"] == str(moved.path)
        assert_run_exactly_once(local_platform, moved.path)

    def test_a_run_directory_moved_into_the_root_finished_is_found_and_uploaded(
        self, local_platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        environ = daemon_environ(
            local_platform, tmp_path, [tree], EVALPUSH_WATCH__RESCAN_SECONDS="600"
        )
        outside = RunDir(tmp_path / "staging").config(num_tasks=2)
        outside.write(outside.lines(4))
        with InProcessDaemon(environ) as daemon:
            daemon.started()
            (tree / "env--model--harness").mkdir()
            inside = RunDir(tree / "env--model--harness", run_id=outside.run_id)
            outside.path.rename(inside.path)
            daemon.wait_for(RUN_FINALIZED, run=inside.run_id)
            assert daemon.stop() == 0
        assert_run_exactly_once(local_platform, inside.path)

    def test_a_run_directory_deleted_while_it_waits_is_not_uploaded_and_others_go_on(
        self, local_platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        environ = daemon_environ(
            local_platform, tmp_path, [tree], EVALPUSH_RUNS__SETTLE_SECONDS="3"
        )
        doomed = RunDir(tree / "env--model--harness").config(num_tasks=3)
        good = RunDir(tree / "env--model--harness").config(num_tasks=2)
        with InProcessDaemon(environ) as daemon:
            daemon.started()
            doomed.write(doomed.lines(3))
            daemon.wait_for("run found: waiting until it is finished", run=doomed.run_id)
            shutil.rmtree(doomed.path)
            good.write(good.lines(4))
            daemon.wait_for(RUN_FINALIZED, run=good.run_id)
            time.sleep(2 * 3.0)  # past the doomed run's settle time
            assert daemon.stop() == 0
        assert evaluations_of(local_platform, doomed.run_id) == {}
        assert_run_exactly_once(local_platform, good.path)

    def test_the_root_deleted_and_made_again_is_watched_again(
        self, local_platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        environ = daemon_environ(
            local_platform, tmp_path, [tree], EVALPUSH_WATCH__RESCAN_SECONDS="600"
        )
        with InProcessDaemon(environ) as daemon:
            daemon.started()
            shutil.rmtree(tree)
            wait_until(
                lambda: daemon.find("stopped watching root (gone, replaced or moved)"),
                "the root to go",
            )
            run = RunDir(tree / "env--model--harness").config(num_tasks=2)  # mkdir -p
            run.write(run.lines(4), pause=0.05)
            daemon.wait_for(RUN_FINALIZED, run=run.run_id)
            assert daemon.stop() == 0
        assert_run_exactly_once(local_platform, run.path)


class TestConfigWrittenLate:
    def test_a_config_toml_still_being_written_when_the_run_is_found_is_read_again(
        self, local_platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        environ = daemon_environ(
            local_platform,
            tmp_path,
            [tree],
            EVALPUSH_RUNS__SETTLE_SECONDS="600",
            EVALPUSH_WATCH__RESCAN_SECONDS=str(QUICK_RESCAN_SECONDS),
        )
        run = RunDir(tree / "env--model--harness")
        run.path.mkdir(parents=True)
        whole = run.config(num_tasks=3).path.joinpath("config.toml").read_text()
        config = run.path / "config.toml"
        config.write_text(whole[:25])  # cut mid-key: not TOML yet
        with InProcessDaemon(environ) as daemon:
            daemon.started()
            run.write(run.lines(2))
            time.sleep(2 * QUICK_RESCAN_SECONDS)  # two rescans see the half-written config.toml
            with open(config, "a") as f:
                f.write(whole[25:])
            run.write(run.lines(4, start=2))
            daemon.wait_for(RUN_FINALIZED, run=run.run_id)
            assert daemon.stop() == 0
        assert_run_exactly_once(local_platform, run.path)

    def test_a_config_toml_found_empty_is_read_again_for_the_expected_count(
        self, local_platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        environ = daemon_environ(
            local_platform, tmp_path, [tree], EVALPUSH_RUNS__SETTLE_SECONDS="600"
        )
        run = RunDir(tree / "env--model--harness")
        run.path.mkdir(parents=True)
        (run.path / "config.toml").touch()  # created, not written yet
        with InProcessDaemon(environ) as daemon:
            daemon.started()
            run.write(run.lines(2))
            daemon.wait_for("run found: waiting until it is finished", run=run.run_id)
            run.config(num_tasks=3)
            run.write(run.lines(4, start=2))
            daemon.wait_for(RUN_FINALIZED, run=run.run_id)
            assert daemon.stop() == 0
        assert_run_exactly_once(local_platform, run.path)

    def test_a_config_toml_that_stays_bad_fails_the_run_after_settling_and_retry_completes_it(
        self, local_platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        environ = daemon_environ(
            local_platform, tmp_path, [tree], EVALPUSH_RUNS__SETTLE_SECONDS="6"
        )
        run = RunDir(tree / "env--model--harness")
        run.path.mkdir(parents=True)
        (run.path / "config.toml").write_text('model = "org/model"\nnum_tasks = = 2\n')
        good = RunDir(tree / "env--model--harness").config(num_tasks=1)
        with InProcessDaemon(environ) as daemon:
            daemon.started()
            run.write(run.lines(4))
            good.write(good.lines(2))
            waiting = wait_until(
                lambda: (
                    (row := status(environ).get(run.run_id, {})).get("state") == "waiting" and row
                ),
                "the run to wait, saying why",
            )
            failed = wait_until(
                lambda: (
                    (row := status(environ).get(run.run_id, {})).get("state") == "failed" and row
                ),
                "the run to fail once settled",
            )
            run.config(num_tasks=2)
            retried = subprocess.run(
                [sys.executable, "-m", "evalpush", "retry", run.run_id],
                env=environ,
                capture_output=True,
                timeout=60,
                check=False,
            )
            assert retried.returncode == 0, retried.stderr
            daemon.wait_for(RUN_FINALIZED, run=run.run_id)
            assert daemon.stop() == 0
        assert "config.toml" in waiting["reason"] and "TOML" in waiting["reason"]
        assert "config.toml" in failed["last_error"]
        assert_run_exactly_once(local_platform, run.path)
        assert_run_exactly_once(local_platform, good.path)


class TestOddFiles:
    def test_a_fifo_named_traces_jsonl_is_not_a_run_and_does_not_block_the_daemon(
        self, local_platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        environ = daemon_environ(local_platform, tmp_path, [tree])
        fifo = RunDir(tree / "env--model--harness").config(num_tasks=1)
        good = RunDir(tree / "env--model--harness").config(num_tasks=2)
        with InProcessDaemon(environ) as daemon:
            daemon.started()
            os.mkfifo(fifo.traces)
            good.write(good.lines(4))
            daemon.wait_for(RUN_FINALIZED, run=good.run_id)
            assert daemon.stop() == 0
        assert evaluations_of(local_platform, fifo.run_id) == {}
        assert fifo.run_id not in status(environ)
        assert_run_exactly_once(local_platform, good.path)

    def test_symlinks_out_of_the_root_are_never_followed(
        self, local_platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        environ = daemon_environ(
            local_platform,
            tmp_path,
            [tree],
            EVALPUSH_WATCH__RESCAN_SECONDS=str(QUICK_RESCAN_SECONDS),
        )
        secret = RunDir(tmp_path / "private").config(num_tasks=2)
        secret.write(secret.lines(4))
        linked_file = RunDir(tree / "env--model--harness").config(num_tasks=2)
        good = RunDir(tree / "env--model--harness").config(num_tasks=2)
        with InProcessDaemon(environ) as daemon:
            daemon.started()
            (tree / "env--model--harness" / "linked-run").symlink_to(secret.path)
            linked_file.traces.symlink_to(secret.traces)
            good.write(good.lines(4))
            daemon.wait_for(RUN_FINALIZED, run=good.run_id)
            time.sleep(2 * QUICK_RESCAN_SECONDS)  # two rescans
            assert daemon.stop() == 0
        assert set(local_platform.summary()["runs"]) == {good.run_id}
        assert_run_exactly_once(local_platform, good.path)

    def test_a_run_whose_directory_names_are_not_utf8_is_uploaded_and_logged_escaped(
        self, local_platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        environ = daemon_environ(local_platform, tmp_path, [tree])
        group = tree / os.fsdecode(b"caf\xe9--model")
        run = RunDir(group, run_id=os.fsdecode(b"run-\xff\xfe"))
        with InProcessDaemon(environ) as daemon:
            daemon.started()
            run.config(num_tasks=2)
            run.write(run.lines(4))
            (summary,) = wait_until(
                lambda: list(local_platform.summary()["evaluations"].values()), "the upload"
            )
            wait_until(
                lambda: (
                    status(environ).get(summary["metadata"]["run_id"], {}).get("state")
                    == "finalized"
                ),
                "the run finalized in the ledger",
            )
            assert daemon.stop() == 0
        assert_run_exactly_once(local_platform, run.path)
        unparsed = [line for line in daemon.raw if not _strict_json(line)]
        assert unparsed == [], "every line is JSON a strict parser reads (no lone surrogates)"
        shown = "caf\\xe9--model/run-\\xff\\xfe"
        finalized = daemon.find(RUN_FINALIZED, run=summary["metadata"]["run_id"])
        assert finalized and finalized[0]["path"].endswith(shown)


def _strict_json(line: bytes) -> bool:
    try:
        orjson.loads(line)
    except orjson.JSONDecodeError:
        return False
    return True


class TestMany:
    def test_a_thousand_runs_appearing_at_once_are_each_finalized_once(
        self, local_platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        environ = daemon_environ(local_platform, tmp_path, [tree])
        with InProcessDaemon(environ) as daemon:
            daemon.started()
            runs = []
            for i in range(MANY_RUNS):
                run = RunDir(tree / f"group-{i % 10}").config(num_tasks=1, num_rollouts=1)
                run.write([trace_line(i, 0)])
                runs.append(run)
            wait_until(
                lambda: len(daemon.find(RUN_FINALIZED)) >= MANY_RUNS,
                f"{MANY_RUNS} runs finalized",
                timeout=MANY_SECONDS,
            )
            assert daemon.stop() == 0
        state = local_platform.summary()
        assert len(state["evaluations"]) == MANY_RUNS
        assert set(state["runs"]) == {run.run_id for run in runs}
        assert set(state["runs"].values()) == {1}
        assert all(
            e["status"] == "COMPLETED" and e["finalize_count"] == 1 and e["sample_count"] == 1
            for e in state["evaluations"].values()
        )


@pytest.mark.parametrize("marker", [False, True], ids=["no-marker", "marker-left-in-place"])
def test_a_file_growing_past_its_expected_count_is_uploaded_again_once_it_settles_not_per_line(
    local_platform: LocalPlatform, tmp_path: Path, marker: bool
) -> None:
    """A run finished by its expected count, then appended to line after line (an eval resumed
    into it, or one that writes more than it said): the appends make one new evaluation once
    the file settles, not one per line; a marker left in place changes nothing."""
    tree = tmp_path / "outputs"
    extra = {"EVALPUSH_RUNS__SETTLE_SECONDS": "4", "EVALPUSH_RUNS__MARKER": ".done"}
    environ = daemon_environ(local_platform, tmp_path, [tree], **extra)
    run = RunDir(tree / "gsm8k--org--model").config(num_tasks=2)  # 4 expected
    run.write(run.lines(4))
    if marker:
        (run.path / ".done").touch()
    with InProcessDaemon(environ) as daemon:
        daemon.started()
        daemon.wait_for(RUN_FINALIZED, run=run.run_id)
        appended = 30
        run.write(run.lines(appended, start=4), pause=0.2)  # six seconds of growth
        row = status(environ)[run.run_id]
        daemon.wait_for(RUN_FINALIZED, run=run.run_id, count=2)
        time.sleep(1.0)  # room for a third, wrongly, before the count below
        assert daemon.stop() == 0

    assert row["state"] == "finalized"
    assert "past the expected count" in row["reason"], row
    evaluations = evaluations_of(local_platform, run.run_id)
    assert len(evaluations) == 2, sorted(e["sample_count"] for e in evaluations.values())
    assert sorted(e["sample_count"] for e in evaluations.values()) == [4, 4 + appended]
