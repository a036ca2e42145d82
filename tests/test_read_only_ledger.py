"""`status` and `check` are pure reads of the ledger file: run as root on a service's state
dir (its files owned by the service's user), they create no file beside the ledger and change
no owner or mode, whether or not a daemon has the ledger open, and they read what that daemon
committed.

Each test runs `python -m evalpush ...` as a process, against a local platform on loopback.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from daemon_support import Daemon, daemon_environ
from evalpush.core.states import State
from evalpush.ledger import Ledger
from support.commands import as_process as _run
from support.environ import cli_environ
from support.runs import OTHER_RUN_ID, RUN_ID, write_run

SERVICE_UID = 65534
"""The service's user in these tests (`nobody`): not the one running `status`."""

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to own files as another")


def _files(state: Path) -> dict[str, tuple[int, int, int]]:
    """The state dir's ledger files: name -> (owner, group, mode)."""
    return {
        entry.name: (entry.stat().st_uid, entry.stat().st_gid, entry.stat().st_mode)
        for entry in os.scandir(state)
        if entry.name.startswith("state.db")
    }


def _give_to_service(state: Path) -> None:
    for path in [state, *state.iterdir()]:
        os.chown(path, SERVICE_UID, SERVICE_UID)


@pytest.fixture
def service_state(platform, tmp_path) -> Path:
    """A state dir holding a ledger with one finalized run, owned by the service's user, with
    no process having the ledger open (a stopped service)."""
    environ = cli_environ(platform, tmp_path)
    write_run(tmp_path / "outputs")
    assert _run(environ, "push", str(tmp_path / "outputs")).returncode == 0
    state = tmp_path / "state"
    _give_to_service(state)
    assert set(_files(state)) == {"state.db"}
    return state


@as_root
@pytest.mark.parametrize("command", [("status",), ("status", "--json"), ("check",)])
def test_a_read_only_command_on_a_stopped_services_ledger_creates_no_file_and_changes_no_owner(
    platform, tmp_path, service_state, command
):
    before = _files(service_state)

    done = _run(cli_environ(platform, tmp_path), *command)

    assert _files(service_state) == before
    assert done.returncode in (0, 1), done.stderr  # check: the ledger is not root's to write
    if command == ("status", "--json"):
        assert [(r["run_id"], r["state"]) for r in json.loads(done.stdout)] == [
            (RUN_ID, "finalized")
        ]
    elif command == ("status",):
        row = next(line for line in done.stdout.splitlines() if RUN_ID[:8] in line)
        assert "finalized" in row, done.stdout


@as_root
def test_status_while_a_daemon_writes_the_ledger_reads_its_commits_and_creates_nothing(
    platform, tmp_path, service_state
):
    tree = tmp_path / "watched"
    write_run(tree, run_id=OTHER_RUN_ID)
    environ = daemon_environ(platform, tmp_path, [tree])
    with Daemon(environ) as daemon:
        daemon.started()
        daemon.wait_for("run finalized", run=OTHER_RUN_ID)
        before = _files(service_state)
        assert {"state.db-wal", "state.db-shm"} <= set(before)  # the daemon's, open

        done = _run(environ, "status")

        assert _files(service_state) == before
        assert done.returncode == 0, done.stderr
        rows = [line for line in done.stdout.splitlines() if "finalized" in line]
        assert any(OTHER_RUN_ID[:8] in row for row in rows), done.stdout  # in the WAL only
        assert any(RUN_ID[:8] in row for row in rows), done.stdout
        assert daemon.stop() == 0


def test_a_reader_opened_before_any_writer_reads_what_a_writer_opening_later_commits(tmp_path):
    path = tmp_path / "state" / "state.db"
    with Ledger(path) as first:
        first.add(path="/runs/a", run_id=RUN_ID, kind="eval", state=State.READY)
    assert not path.with_name("state.db-wal").exists()  # nobody has it open
    with Ledger(path, read_only=True) as reader:
        assert [r.run_id for r in reader.all()] == [RUN_ID]
        with Ledger(path) as writer:  # its commits stay in its log while it is open
            writer.add(path="/runs/b", run_id=OTHER_RUN_ID, kind="eval", state=State.READY)

            assert sorted(r.run_id for r in reader.all()) == sorted([RUN_ID, OTHER_RUN_ID])
        assert path.with_name("state.db-wal").exists()  # the reader's lock kept it: no checkpoint
        assert sorted(r.run_id for r in reader.all()) == sorted([RUN_ID, OTHER_RUN_ID])


@as_root
def test_status_of_a_ledger_left_with_its_log_but_no_index_reads_the_log_and_creates_nothing(
    platform, tmp_path, service_state
):
    """What a writer killed with its `-shm` gone (power loss on a tmpfs index, a cleanup) leaves:
    `state.db` and `state.db-wal`, the last commits only in the log."""
    left = tmp_path / "left"
    left.mkdir()
    path = service_state / "state.db"
    with Ledger(path) as writer:
        writer.add(path="/runs/b", run_id=OTHER_RUN_ID, kind="eval", state=State.READY)
        for name in ("state.db", "state.db-wal"):
            (left / name).write_bytes((service_state / name).read_bytes())
    _give_to_service(left)
    before = _files(left)

    done = _run(cli_environ(platform, tmp_path), "status", "--json", "--state-dir", str(left))

    assert _files(left) == before
    assert done.returncode == 0, done.stderr
    states = {row["run_id"]: row["state"] for row in json.loads(done.stdout)}
    assert states == {RUN_ID: "finalized", OTHER_RUN_ID: "ready"}
