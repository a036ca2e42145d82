"""`evalpush run` against a hostile world: what it must survive, as a real subprocess.

kill -9 at random moments, trace files rewritten, renamed or deleted while it watches, a FIFO
named traces.jsonl, a symlink out of the root, a directory name that is not UTF-8, a thousand
runs at once, a ledger broken under it, signals in a storm. Each test asserts the daemon keeps
going (or, where it cannot, exits with a non-zero code instead of hanging) and that every good
run ends exactly once on the platform.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from daemon_support import (
    RUN_FINALIZED,
    Daemon,
    RunDir,
    daemon_environ,
    wait_until,
)
from evalpush.local_platform import LocalPlatform
from pushing import assert_run_exactly_once

EXIT_SECONDS = 20.0


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "outputs"
    root.mkdir()
    return root


def _break_ledger(state: Path) -> None:
    """Overwrite the ledger's header and its WAL: every later query fails."""
    with open(state / "state.db", "r+b") as f:
        f.write(b"\0" * 100)
    for name in ("state.db-wal", "state.db-shm"):
        path = state / name
        if path.exists():
            with open(path, "r+b") as f:
                f.write(b"\xff" * 4096)


class TestLedgerBroken:
    @pytest.mark.parametrize("reloaded", [False, True], ids=["as started", "after a reload"])
    def test_a_ledger_broken_under_the_daemon_makes_it_exit_non_zero_not_hang(
        self, reloaded: bool, local_platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        environ = daemon_environ(local_platform, tmp_path, [tree])
        first = RunDir(tree / "env--model--harness").config(num_tasks=1)
        with Daemon(environ) as daemon:
            daemon.started()
            first.write(first.lines(2))
            daemon.wait_for(RUN_FINALIZED, run=first.run_id)
            if reloaded:
                daemon.signal(signal.SIGHUP)
                daemon.wait_for("reload: rebuilding from the configuration")
                wait_until(lambda: len(daemon.find("watching root")) == 2, "the rebuilt watcher")
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
