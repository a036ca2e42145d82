"""What the daemon's chaos soak (bench/soak.py --mode daemon) turned up, each as a small test.

Each test runs the daemon in this process on a temporary tree against the local platform
(`daemon_support.InProcessDaemon`), with `evalpush push` beside it as a process, as the soak's
overlapping pushes are, and asserts on the platform's stored state and on the ledger as `status` shows it.
"""

from __future__ import annotations

import time
from pathlib import Path

from daemon_support import InProcessDaemon, RunDir, daemon_environ, status, wait_until
from evalpush.cli.parser import EXIT_UPLOADED_PARTIAL
from evalpush.ledger import Ledger, default_path, transitions
from evalpush.local_platform import LocalPlatform
from pushing import assert_run_exactly_once, start_push

SETTLE_SECONDS = "6"  # long enough for a push to finish the run while the daemon waits on it
PUSH_TIMEOUT_SECONDS = 60
LEDGER_POLL_SECONDS = 0.2  # how often the daemon takes up the ledger's queued runs
LEDGER_POLLS = 3


FINALIZED_BY_ANOTHER = "run already finalized: nothing sent"
MOVED_ON = "run moved on by another process while it waited: looked at afresh"


class TestPushBesideAWaitingRun:
    def test_a_run_pushed_while_the_daemon_waits_for_it_to_settle_stays_finalized_once_it_settles(
        self, local_platform: LocalPlatform, tmp_path: Path
    ) -> None:
        tree = tmp_path / "outputs"
        environ = daemon_environ(
            local_platform,
            tmp_path,
            [tree],
            EVALPUSH_RUNS__SETTLE_SECONDS=SETTLE_SECONDS,
            EVALPUSH_WATCH__LEDGER_POLL_SECONDS=str(LEDGER_POLL_SECONDS),
        )
        run = RunDir(tree / "env--model--harness").config(num_tasks=10)  # expects 20 traces
        with InProcessDaemon(environ) as daemon:
            daemon.started()
            run.write(run.lines(6))  # never the expected count, no marker: it settles
            daemon.wait_for("run found: waiting until it is finished", run=run.run_id)
            push = start_push(run.path, environ)  # the run is finished as far as push knows
            out, err = push.communicate(timeout=PUSH_TIMEOUT_SECONDS)
            # uploaded as it is (runs.on_incomplete = "upload"), 6 of its 20 expected traces
            assert push.returncode == EXIT_UPLOADED_PARTIAL, (out, err)

            # The daemon's turn: it reads the push's finalized row while the run waits (its
            # next progress write), or the run settles first and its upload finds it finalized.
            wait_until(
                lambda: (
                    daemon.find(MOVED_ON, run=run.run_id)
                    or daemon.find("upload ended", run=run.run_id)
                    or daemon.find("run finalized", run=run.run_id)
                    or daemon.find(FINALIZED_BY_ANOTHER, run=run.run_id)
                ),
                "the daemon to take the push's finalized run as it is",
            )
            time.sleep(LEDGER_POLL_SECONDS * LEDGER_POLLS)  # would it take the run up again?
            row = status(environ)[run.run_id]
            started = daemon.find("upload started", run=run.run_id)
            assert daemon.stop() == 0

        assert row["state"] == "finalized", row
        assert len(started) <= 1, f"the daemon started {len(started)} uploads of a finalized run"
        assert_run_exactly_once(local_platform, run.path)


class TestAFinishedUploadIsFinished:
    def test_a_finalized_row_queued_again_by_a_racing_write_is_finalized_by_the_next_upload(
        self, local_platform: LocalPlatform, tmp_path: Path
    ) -> None:
        """The tracker reads a run's row, then writes it (its progress, or `ready`) under no
        claim; a push that finalizes the run between the read and the write is overwritten.
        However the row came to be queued again, an upload done to its last step is finalized:
        the uploader does not leave it `uploading` for the daemon to take up again and again."""
        tree = tmp_path / "outputs"
        environ = daemon_environ(
            local_platform,
            tmp_path,
            [tree],
            EVALPUSH_WATCH__LEDGER_POLL_SECONDS=str(LEDGER_POLL_SECONDS),
        )
        run = RunDir(tree / "env--model--harness").config(num_tasks=2)
        run.write(run.lines(4))
        push = start_push(run.path, environ)
        out, err = push.communicate(timeout=PUSH_TIMEOUT_SECONDS)
        assert push.returncode == 0, (out, err)
        with Ledger(default_path(tmp_path / "state")) as ledger:
            record = ledger.get_run(run.run_id)
            assert record is not None and record.state == "finalized"
            transitions.queue(ledger, record, "ready: the racing write")

        with InProcessDaemon(environ) as daemon:
            daemon.wait_for("upload started", run=run.run_id)
            time.sleep(LEDGER_POLL_SECONDS * LEDGER_POLLS)  # would it take the run up again?
            row = status(environ)[run.run_id]
            started = daemon.find("upload started", run=run.run_id)
            assert daemon.stop() == 0

        assert row["state"] == "finalized", row
        assert len(started) == 1, f"the daemon started {len(started)} uploads of a finalized run"
        assert_run_exactly_once(local_platform, run.path)
