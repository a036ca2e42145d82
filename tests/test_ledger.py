"""The ledger: a real SQLite file, its durability settings, its schema, and its failures."""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from evalpush.errors import LedgerError
from evalpush.ledger import SCHEMA_VERSION, Ledger, SetAsideRecord, State, Step
from evalpush.log import register_secret


@pytest.fixture
def ledger(tmp_path: Path):
    with Ledger(tmp_path / "state" / "state.db") as opened:
        yield opened


def a_run(ledger: Ledger, path: str = "/runs/a", run_id: str = "0f1e2d3c-aaaa"):
    return ledger.add(path=path, run_id=run_id, kind="eval", state=State.READY)


class TestFile:
    def test_the_file_is_private_to_its_owner_and_its_directory_too(self, tmp_path: Path):
        Ledger(tmp_path / "state" / "state.db").close()

        assert stat.S_IMODE(os.stat(tmp_path / "state" / "state.db").st_mode) == 0o600
        assert stat.S_IMODE(os.stat(tmp_path / "state").st_mode) == 0o700

    def test_the_journal_is_wal_and_commits_are_synchronous(self, ledger: Ledger):
        db = sqlite3.connect(ledger.path)
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        db.close()
        assert ledger._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL

    def test_a_new_file_gets_the_current_schema_version(self, ledger: Ledger):
        assert ledger._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION

    def test_a_file_from_a_newer_evalpush_is_refused_not_rewritten(self, tmp_path: Path):
        path = tmp_path / "state.db"
        db = sqlite3.connect(path)
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
        db.close()

        with pytest.raises(LedgerError, match="newer than this evalpush"):
            Ledger(path)

    def test_a_corrupt_file_is_a_clear_error_naming_it(self, tmp_path: Path):
        path = tmp_path / "state.db"
        path.write_bytes(b"this is not a database" * 100)

        with pytest.raises(LedgerError, match=str(path)):
            Ledger(path)
        assert path.read_bytes() == b"this is not a database" * 100, "nothing was overwritten"

    def test_a_state_dir_that_cannot_be_created_is_a_clear_error(self, tmp_path: Path):
        blocker = tmp_path / "file"
        blocker.write_text("")

        with pytest.raises(LedgerError, match="cannot open the ledger"):
            Ledger(blocker / "state" / "state.db")

    def test_status_on_a_corrupt_ledger_exits_1_naming_the_file(self, tmp_path: Path):
        state = tmp_path / "state"
        state.mkdir()
        (state / "state.db").write_bytes(b"garbage" * 1000)

        done = subprocess.run(
            [sys.executable, "-m", "evalpush", "--state-dir", str(state), "status"],
            capture_output=True,
            text=True,
            timeout=60,
        )

        assert done.returncode == 1
        assert str(state / "state.db") in done.stderr


class TestRuns:
    def test_a_run_is_found_by_path_run_id_and_unique_prefix(self, ledger: Ledger):
        record = a_run(ledger, run_id="0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9")
        a_run(ledger, path="/runs/b", run_id="9a9a9a9a-0000-4000-8000-000000000000")

        assert ledger.get("/runs/a") == record
        assert ledger.get("0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9") == record
        assert ledger.get("0f1e") == record
        assert ledger.get("zzz") is None

    def test_an_ambiguous_prefix_finds_nothing(self, ledger: Ledger):
        a_run(ledger, path="/runs/a", run_id="abc-1")
        a_run(ledger, path="/runs/b", run_id="abc-2")

        assert ledger.get("abc") is None

    def test_an_update_writes_only_the_given_columns_and_survives_reopening(self, tmp_path: Path):
        path = tmp_path / "state.db"
        with Ledger(path) as ledger:
            record = a_run(ledger)
            ledger.update(record, acked_offset=1234, samples_sent=7)
        with Ledger(path) as reopened:
            again = reopened.get("/runs/a")
        assert (again.acked_offset, again.samples_sent, again.state) == (1234, 7, State.READY)

    def test_an_unknown_column_is_a_programming_error(self, ledger: Ledger):
        with pytest.raises(ValueError, match="unknown ledger columns"):
            ledger.update(a_run(ledger), no_such_column=1)

    def test_restart_moves_the_evaluation_to_history_and_clears_progress(self, ledger: Ledger):
        record = ledger.update(
            a_run(ledger),
            evaluation_id="eval-1",
            viewer_url="http://v/eval-1",
            state=State.FINALIZED,
            step=Step.DONE,
            acked_offset=99,
            samples_sent=3,
        )
        ledger.add_set_aside(record, [SetAsideRecord(2, 10, 5, "bad_line", "invalid JSON")])

        restarted = ledger.restart(record, outcome="superseded")

        assert (restarted.state, restarted.step, restarted.evaluation_id) == ("ready", "scan", None)
        assert (restarted.acked_offset, restarted.samples_sent) == (0, 0)
        assert ledger.set_aside(restarted) == []
        (earlier,) = ledger.history(restarted)
        assert (earlier.evaluation_id, earlier.viewer_url, earlier.outcome) == (
            "eval-1",
            "http://v/eval-1",
            "superseded",
        )

    def test_forget_drops_the_run_with_its_records(self, ledger: Ledger):
        record = a_run(ledger)
        ledger.add_set_aside(record, [SetAsideRecord(2, 10, 5, "bad_line", "invalid JSON")])

        ledger.forget(record)

        assert ledger.get("/runs/a") is None
        assert ledger.set_aside_counts() == {}

    def test_set_aside_records_are_idempotent_by_offset(self, ledger: Ledger):
        record = a_run(ledger)
        item = SetAsideRecord(2, 10, 5, "bad_line", "invalid JSON")

        ledger.add_set_aside(record, [item])
        ledger.add_set_aside(record, [item])

        assert ledger.set_aside(record) == [item]


class TestFullDisk:
    def test_a_full_disk_is_a_ledger_error_and_the_last_committed_state_stays(self, ledger: Ledger):
        record = ledger.update(a_run(ledger), acked_offset=10)
        page_count = ledger._db.execute("PRAGMA page_count").fetchone()[0]
        ledger._db.execute(f"PRAGMA max_page_count = {page_count}")
        many = [SetAsideRecord(i, i, 1, "bad_line", "x" * 500) for i in range(2000)]

        with pytest.raises(LedgerError, match="full"):
            ledger.add_set_aside(record, many)

        assert ledger.get(record.id).acked_offset == 10
        assert ledger.set_aside(record) == []


class TestLocked:
    def test_a_ledger_locked_by_another_process_is_a_clear_error_not_a_hang(self, tmp_path: Path):
        path = tmp_path / "state.db"
        with Ledger(path, busy_timeout_seconds=0.2) as ledger:
            record = a_run(ledger)
            other = sqlite3.connect(path, isolation_level=None)
            other.execute("BEGIN EXCLUSIVE")
            try:
                with pytest.raises(LedgerError, match=f"{path}.*locked"):
                    ledger.update(record, acked_offset=5)
            finally:
                other.execute("ROLLBACK")
                other.close()
            assert ledger.update(record, acked_offset=5).acked_offset == 5


def test_a_secret_quoted_in_an_error_never_reaches_the_ledger(ledger: Ledger):
    secret = "sk-test-secret-0123456789abcdef"
    register_secret(secret)

    ledger.update(a_run(ledger), last_error=f"HTTP 400: bad key {secret}", reason=secret)

    stored = sqlite3.connect(ledger.path).execute("SELECT last_error, reason FROM runs").fetchone()
    assert secret not in repr(stored)
    assert stored[0] == "HTTP 400: bad key [redacted]"
