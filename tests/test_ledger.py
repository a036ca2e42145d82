"""The ledger: a real SQLite file, its durability settings, its schema, and its failures."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
import sqlalchemy as sa

import ledger_v1
from as_nobody import as_nobody
from evalpush import cli
from evalpush.cli import report
from evalpush.core.errors import LedgerError
from evalpush.core.setaside import SetAside
from evalpush.core.states import HistoryOutcome, State, Step
from evalpush.ledger import SCHEMA_VERSION, Ledger, default_path
from evalpush.ledger.tables import path_key, run_key
from evalpush.log import register_secret
from support.old_ledgers import old_file
from support.postgres import PASSWORD as PG_PASSWORD


def a_run(ledger: Ledger, path: str = "/runs/a", run_id: str = "0f1e2d3c-aaaa"):
    return ledger.add(path=path, run_id=run_id, kind="eval", state=State.READY)


class TestFile:
    def test_the_file_is_private_to_its_owner_and_its_directory_too(self, tmp_path: Path):
        Ledger(tmp_path / "state" / "state.db").close()

        assert stat.S_IMODE(os.stat(tmp_path / "state" / "state.db").st_mode) == 0o600
        assert stat.S_IMODE(os.stat(tmp_path / "state").st_mode) == 0o700

    def test_the_journal_is_wal_and_a_write_is_synced_to_disk_before_it_returns(
        self, sqlite_ledger: Ledger, monkeypatch: pytest.MonkeyPatch
    ):
        """SQLite does not sync at each commit (`synchronous=NORMAL`): the ledger syncs the
        write-ahead log itself after the commit (a group commit), before the write returns;
        the claim and its release are not synced (a claim lost to power loss is taken over)."""
        ledger = sqlite_ledger
        db = sqlite3.connect(ledger.path)
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        db.close()
        assert ledger._file.db.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
        synced: list[tuple[str, int]] = []
        real_fsync = os.fsync

        def fsync(fd: int) -> None:
            real_fsync(fd)
            if os.path.isfile(f"/proc/self/fd/{fd}"):
                wal = os.readlink(f"/proc/self/fd/{fd}")
                synced.append((wal, ledger._file.db.total_changes))

        monkeypatch.setattr(os, "fsync", fsync)
        record = a_run(ledger)
        changes = ledger._file.db.total_changes
        ledger.update(record, samples_seen=3)

        log = f"{ledger.path}-wal"
        assert synced and synced[-1] == (log, changes + 1), "the log synced after the write"
        with Ledger(ledger.path) as other:
            assert other.get(record.id).samples_seen == 3

    def test_a_new_file_gets_the_current_schema_version(self, sqlite_ledger: Ledger):
        assert sqlite_ledger._file.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION

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
        record = ledger.set_state(
            a_run(ledger),
            State.FINALIZED,
            evaluation_id="eval-1",
            viewer_url="http://v/eval-1",
            step=Step.DONE,
            acked_offset=99,
            samples_sent=3,
        )
        ledger.add_set_aside(record, [SetAside(2, 10, 5, "bad_line", "invalid JSON")])

        restarted = ledger.restart(record, outcome=HistoryOutcome.SUPERSEDED, state=State.READY)

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
        ledger.add_set_aside(record, [SetAside(2, 10, 5, "bad_line", "invalid JSON")])

        ledger.forget(record)

        assert ledger.get("/runs/a") is None
        assert ledger.set_aside_counts_of([record]) == {}

    def test_file_facts_come_a_page_at_a_time_for_the_runs_in_the_states_asked_with_facts(
        self, ledger: Ledger
    ):
        # What the daemon loads at start: a million runs must not sit in memory as rows at once.
        facts = {}
        for n, state in enumerate(["finalized", "failed", "ready", "finalized", "finalized"]):
            record = ledger.add(path=f"/runs/{n}", run_id=f"run-{n}", kind="eval", state=state)
            if n != 4:  # the last has no facts recorded
                ledger.update(
                    record, file_device=1, file_inode=100 + n, file_size=10 * n, file_mtime_ns=n
                )
                facts[n] = (f"/runs/{n}".encode(), 1, 100 + n, 10 * n, n)

        pages = list(ledger.file_facts({State.FINALIZED, State.FAILED}, size=2))

        assert pages == [[facts[0], facts[1]], [facts[3]]]

    def test_set_aside_records_are_idempotent_by_offset(self, ledger: Ledger):
        record = a_run(ledger)
        item = SetAside(2, 10, 5, "bad_line", "invalid JSON")

        ledger.add_set_aside(record, [item])
        ledger.add_set_aside(record, [item])

        assert ledger.set_aside(record) == [item]


class TestNamedWrites:
    """The protocol's writes by name, each with what it may lose (`.syncs` counts the syncs of
    the write-ahead log, `.writes` the write transactions)."""

    def test_an_intent_is_synced_before_it_returns(self, tmp_path: Path):
        ledger = Ledger(tmp_path / "state.db")
        record = a_run(ledger)
        writes, syncs = ledger.writes, ledger.syncs

        record = ledger.record_intent(record, '{"step": "finalize"}', looked_up=1)

        assert (ledger.writes - writes, ledger.syncs - syncs) == (1, 1)
        with Ledger(ledger.path) as other:  # in the file, not only in this process's view
            assert (other.get(record.id).pending, other.get(record.id).looked_up) == (
                '{"step": "finalize"}',
                1,
            )
        ledger.close()

    def test_progress_waits_for_the_next_write_which_carries_it(self, tmp_path: Path):
        ledger = Ledger(tmp_path / "state.db")
        record = a_run(ledger)
        writes = ledger.writes

        record = ledger.record_progress(record, step=Step.CREATE, env_id="env-1")

        assert ledger.writes == writes and record.step == Step.CREATE
        with Ledger(ledger.path) as other:
            assert other.get(record.id).step == Step.SCAN, "nothing written yet"
        ledger.record_intent(record, '{"step": "create"}')
        with Ledger(ledger.path) as other:
            assert (other.get(record.id).step, other.get(record.id).env_id) == (
                Step.CREATE,
                "env-1",
            )
        ledger.close()

    def test_an_acknowledgement_is_written_now_and_not_synced(self, tmp_path: Path):
        ledger = Ledger(tmp_path / "state.db")
        record = ledger.record_intent(a_run(ledger), '{"step": "push", "start": 0, "end": 9}')
        writes, syncs = ledger.writes, ledger.syncs

        record = ledger.acknowledge(record, acked_offset=9, samples_sent=3)

        assert (ledger.writes - writes, ledger.syncs - syncs) == (1, 0)
        with Ledger(ledger.path) as other:
            assert (other.get(record.id).pending, other.get(record.id).acked_offset) == (None, 9)
        ledger.close()

    def test_the_intent_carrying_the_create_acknowledgement_is_covered_by_the_create_intent(
        self, tmp_path: Path
    ):
        """The first batch's intent carries the create's acknowledgement: the create intent,
        synced before the create was sent, covers it (a power cut leaves that intent, and the
        lookup it is reconciled by lists the samples before any is sent). Every other intent is
        synced, the next batch's included."""
        ledger = Ledger(tmp_path / "state.db")
        record = ledger.record_intent(a_run(ledger), '{"step": "create", "env": "e"}')
        record = ledger.record_progress(record, evaluation_id="ev-1", pending=None, step=Step.PUSH)
        syncs = ledger.syncs

        record = ledger.record_intent(record, '{"step": "push", "start": 0, "end": 9}')
        assert ledger.syncs == syncs, "covered by the create intent"
        with Ledger(ledger.path) as other:  # written, with the acknowledgement it carries
            assert other.get(record.id).evaluation_id == "ev-1"
        record = ledger.acknowledge(record, acked_offset=9)
        ledger.record_intent(record, '{"step": "push", "start": 9, "end": 20}')
        assert ledger.syncs == syncs + 1, "the next intent is synced"
        ledger.close()

    def test_on_the_shared_ledger_the_intent_carrying_the_create_acknowledgement_is_synced(
        self, pg_url: str
    ):
        """A database that crashes and comes back loses a commit it was not made to wait for,
        while the process that made it goes on: there the create intent covers nothing, and the
        evaluation's id (written once) would be lost from a run that goes on to be finalized."""
        with Ledger.shared(pg_url, password=PG_PASSWORD) as ledger:
            record = ledger.record_intent(a_run(ledger), '{"step": "create", "env": "e"}')
            record = ledger.record_progress(
                record, evaluation_id="ev-1", pending=None, step=Step.PUSH
            )
            syncs = ledger.syncs

            record = ledger.record_intent(record, '{"step": "push", "start": 0, "end": 9}')
            assert ledger.syncs == syncs + 1, "waited for: the evaluation's id is in it"
            record = ledger.acknowledge(record, acked_offset=9)
            assert ledger.syncs == syncs + 1, "an acknowledgement still does not wait"

    def test_no_named_write_changes_a_state(self, ledger: Ledger):
        record = a_run(ledger)
        for write in (ledger.update, ledger.acknowledge, ledger.record_progress):
            with pytest.raises(ValueError, match="transitions"):
                write(record, state=State.FINALIZED)
        with pytest.raises(ValueError, match="transitions"):
            ledger.record_intent(record, "{}", state=State.FINALIZED)


class TestFullDisk:
    def test_a_full_disk_is_a_ledger_error_and_the_last_committed_state_stays(
        self, sqlite_ledger: Ledger
    ):
        ledger = sqlite_ledger
        record = ledger.update(a_run(ledger), acked_offset=10)
        page_count = ledger._file.db.execute("PRAGMA page_count").fetchone()[0]
        ledger._file.db.execute(f"PRAGMA max_page_count = {page_count}")
        many = [SetAside(i, i, 1, "bad_line", "x" * 500) for i in range(2000)]

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
                with pytest.raises(LedgerError, match=f"{path}.*locked") as locked:
                    ledger.update(record, acked_offset=5)
                assert "another process held its write lock" in str(locked.value)
            finally:
                other.execute("ROLLBACK")
                other.close()
            assert ledger.update(record, acked_offset=5).acked_offset == 5


class TestStopWhileLocked:
    def test_a_write_waiting_for_another_process_ends_soon_after_a_stop(self, tmp_path: Path):
        path = tmp_path / "state.db"
        stop = threading.Event()
        with Ledger(path, busy_timeout_seconds=60.0, stop=stop) as ledger:
            record = a_run(ledger)
            other = sqlite3.connect(path, isolation_level=None)
            other.execute("BEGIN IMMEDIATE")
            try:
                threading.Timer(0.3, stop.set).start()
                started = time.monotonic()
                with pytest.raises(LedgerError, match="locked"):
                    ledger.update(record, acked_offset=5)
                waited = time.monotonic() - started
            finally:
                other.execute("ROLLBACK")
                other.close()
            assert waited < 30.0, "far less than the minute of busy timeout"
            assert ledger.update(record, acked_offset=7).acked_offset == 7


class TestMovedAside:
    @pytest.mark.parametrize("how", ["moved", "replaced"])
    def test_a_ledger_moved_aside_or_replaced_under_a_process_takes_no_more_of_its_writes(
        self, tmp_path: Path, how: str
    ):
        path = tmp_path / "state" / "state.db"
        with Ledger(path) as ledger:
            record = ledger.update(a_run(ledger), acked_offset=10)
            os.rename(tmp_path / "state", tmp_path / "aside")
            if how == "replaced":
                Ledger(path).close()

            with pytest.raises(LedgerError, match="no longer the ledger this process opened"):
                ledger.update(record, acked_offset=20)

        with Ledger(tmp_path / "aside" / "state.db") as aside:
            assert aside.get(record.id).acked_offset == 10


def test_a_secret_quoted_in_an_error_never_reaches_the_ledger(ledger: Ledger):
    secret = "sk-test-secret-0123456789abcdef"
    register_secret(secret)

    ledger.update(a_run(ledger), last_error=f"HTTP 400: bad key {secret}", reason=secret)

    (stored,) = ledger._query(
        sa.text("SELECT last_error, reason FROM runs")
    )  # as the store holds it
    assert secret not in repr(stored)
    assert stored[0] == "HTTP 400: bad key [redacted]"


# ---------------------------------------------------------------- schema 1 -> 2


def v1_rows(path: Path) -> dict[int, dict]:
    db = sqlite3.connect(path)
    db.row_factory = sqlite3.Row
    rows = {row["id"]: dict(row) for row in db.execute("SELECT * FROM runs")}
    db.close()
    return rows


class TestSchemaUpgrade:
    def test_the_upgrade_leaves_no_copy_of_a_key_a_schema_1_evalpush_stored_even_deleted(
        self, tmp_path: Path
    ):
        """Schema 1 stored what servers echoed as it was; a row it deleted (a run started over)
        stays in the free space of its page, with no live text left to scrub."""
        key = "sk-upgrade-4Rt7Yu1Io9Pa3Sd6Fg2Hj8"
        path = ledger_v1.build(tmp_path / "state", tmp_path / "runs")
        db = sqlite3.connect(path, isolation_level=None)
        db.execute("PRAGMA secure_delete = OFF")  # as most SQLite builds delete (Debian's zero)
        echoed = f"HTTP 422: you sent {key} " * 20
        db.executemany(
            "INSERT INTO set_aside (run, line, offset, size, kind, reason) VALUES (1, ?, ?, 1, "
            "'rejected', ?)",
            [(i, 1000 + i, echoed if i == 5 else "not json") for i in range(10)],
        )
        db.execute("DELETE FROM set_aside WHERE offset = 1005")  # in free space from now on
        db.close()
        parts = {key[i : i + 8].encode() for i in range(len(key) - 7)}
        stored = b"".join(p.read_bytes() for p in path.parent.iterdir())
        assert [part for part in parts if part in stored], "deleted rows left it in the file"
        register_secret(key)

        with Ledger(path) as ledger:
            assert len(ledger.all()) == ledger_v1.RUNS

        leaking = [p.name for p in path.parent.iterdir() if any(x in p.read_bytes() for x in parts)]
        assert leaking == []

    def test_the_upgrade_scrubs_a_key_from_a_text_an_older_evalpush_stored_with_a_nul(
        self, tmp_path: Path
    ):
        """The file held a NUL as it was: the scrub finds that text by its stored value, not by
        the value the store would write now (NUL shown as `\\x00`)."""
        key = "sk-nul-4Rt7Yu1Io9Pa3Sd6Fg2Hj8"
        path = default_path(tmp_path / "state")
        db = old_file(path, 10)
        db.execute(
            "INSERT INTO runs (id, run_id, path, path_raw, kind, state, reason, created_at, "
            "updated_at, run_key, path_key) VALUES (1, 'r', '/r', X'2f72', 'eval', 'held', ?, 0, "
            "0, ?, ?)",
            (f"refused \0{key}", run_key("r"), path_key(b"/r")),
        )
        db.execute(
            "INSERT INTO set_aside VALUES (1, 1, 10, 1, 'rejected', ?)", (f"HTTP 422 \0{key}",)
        )
        db.close()
        register_secret(key)

        with Ledger(path) as ledger:
            (record,) = ledger.all()
            reasons = (record.reason, ledger.set_aside(record)[0].reason)
            scrubbed_again = ledger.scrub_secrets()

        assert reasons == ("refused \\x00[redacted]", "HTTP 422 \\x00[redacted]")
        assert scrubbed_again == 0
        stored = b"".join(p.read_bytes() for p in path.parent.glob("state.db*"))
        assert key.encode() not in stored

    def test_a_schema_1_ledger_is_upgraded_in_place_keeping_every_run(self, tmp_path: Path):
        root = tmp_path / "runs"
        path = ledger_v1.build(tmp_path / "state", root)
        before = v1_rows(path)
        assert len(before) == ledger_v1.ROWS

        with Ledger(path) as ledger:
            version = ledger._file.db.execute("PRAGMA user_version").fetchone()[0]
            records = {record.run_id: record for record in ledger.all()}
            histories = {r.run_id: ledger.history(r) for r in records.values()}
            set_aside = {r.run_id: ledger.set_aside(r) for r in records.values()}

        assert version == SCHEMA_VERSION
        assert len(records) == ledger_v1.RUNS
        for record in records.values():
            old = before[record.id]
            same = {name: old[name] for name in old}
            assert {name: getattr(record, name) for name in old} == same
            assert (record.path_raw, record.looked_up, record.holder) == (
                record.path.encode(),
                1,
                None,
            )
            assert (record.file_mtime_ns, record.file_digest) == (None, None)
        ids = ledger_v1.RUN_IDS
        assert [h.outcome for h in histories[ids["superseded"]]] == ["superseded"]
        assert [s.kind for s in set_aside[ids["finalized"]]] == ["bad_line"]
        assert [s.kind for s in set_aside[ids["held"]]] == ["bad_line"]
        moved = records[ids["moved"]]
        [older] = [
            r for r in before.values() if r["run_id"] == ids["moved"] and r["id"] != moved.id
        ]
        assert "old-place" in older["path"] and "old-place" not in moved.path
        assert [(h.evaluation_id, h.outcome) for h in histories[ids["moved"]]] == [
            (older["evaluation_id"], "duplicate")
        ]
        interrupted = records[ids["interrupted"]]
        assert (interrupted.state, interrupted.step) == (State.UPLOADING, Step.PUSH)
        assert interrupted.acked_offset > 0 and interrupted.evaluation_id is not None

    def test_opening_an_upgraded_ledger_again_changes_nothing(self, tmp_path: Path):
        path = ledger_v1.build(tmp_path / "state", tmp_path / "runs")
        with Ledger(path) as ledger:
            first = ledger.all()
        with Ledger(path) as ledger:
            assert ledger.all() == first


# ---------------------------------------------------------------- what state.db may be


def another_apps_database(path: Path) -> Path:
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE their_data (x)")
    db.execute("INSERT INTO their_data VALUES (42)")
    db.commit()
    db.close()
    return path


def tables(path: Path) -> list[str]:
    db = sqlite3.connect(path)
    names = [name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    db.close()
    return names


class TestWhatTheLedgerFileMayBe:
    def test_a_state_db_that_is_a_symlink_is_refused_and_its_target_left_alone(self, tmp_path):
        target = another_apps_database(tmp_path / "their.db")
        (tmp_path / "state").mkdir()
        link = tmp_path / "state" / "state.db"
        link.symlink_to(target)

        with pytest.raises(LedgerError, match="not a regular file"):
            Ledger(link)
        with pytest.raises(LedgerError, match="not a regular file"):
            Ledger(link, read_only=True)

        assert tables(target) == ["their_data"]

    def test_a_dangling_symlink_is_refused_without_creating_its_target(self, tmp_path):
        (tmp_path / "state").mkdir()
        link = tmp_path / "state" / "state.db"
        link.symlink_to(tmp_path / "nowhere.db")

        with pytest.raises(LedgerError, match="not a regular file"):
            Ledger(link)

        assert not (tmp_path / "nowhere.db").exists()

    @pytest.mark.parametrize("kind", ["directory", "fifo"])
    def test_a_state_db_that_is_not_a_regular_file_is_refused(self, tmp_path, kind):
        path = tmp_path / "state.db"
        if kind == "directory":
            path.mkdir()
        else:
            os.mkfifo(path)

        with pytest.raises(LedgerError, match="not a regular file"):
            Ledger(path)

    def test_status_refuses_a_symlinked_ledger_and_leaves_its_target_alone(self, tmp_path):
        target = another_apps_database(tmp_path / "their.db")
        state = tmp_path / "state"
        state.mkdir()
        (state / "state.db").symlink_to(target)

        done = subprocess.run(
            [sys.executable, "-m", "evalpush", "--state-dir", str(state), "status"],
            capture_output=True,
            text=True,
            timeout=60,
        )

        assert done.returncode == 1
        assert "not a regular file" in done.stderr
        assert tables(target) == ["their_data"]

    def test_an_unusable_ledger_names_the_lighter_fixes_before_what_moving_it_aside_costs(
        self, tmp_path
    ):
        path = tmp_path / "state.db"
        path.write_bytes(b"this is not a database" * 100)

        with pytest.raises(LedgerError) as failure:
            Ledger(path)

        message = str(failure.value)
        lighter, aside = message.index("lighter fixes first"), message.index("last resort")
        assert lighter < aside
        assert ".recover" in message
        assert "uploaded again, a second evaluation" in message[aside:]


# What `status` imports when it runs, imported before the fork: a child that became `nobody`
# may not read this interpreter's library to import it then.
PRELOADED_FOR_STATUS = (msgspec.json, report.status_rows)


def status_as_reader(state: Path) -> tuple[int, str, str]:
    """`evalpush status --json` in a process that may read the ledger but not write it."""

    def status() -> tuple[int, str, str]:
        out, err = io.TextIOWrapper(io.BytesIO()), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(["--state-dir", str(state), "status", "--json"])
        out.flush()
        return code, out.buffer.getvalue().decode(), err.getvalue()

    return as_nobody(status)


class TestReadOnly:
    @pytest.fixture
    def readable_only(self, open_dir: Path) -> Iterator[Path]:
        """A ledger with one run that others may read but not write (nor its directory)."""
        state = open_dir / "state"
        with Ledger(state / "state.db") as ledger:
            a_run(ledger, run_id="0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9")
        (state / "state.db").chmod(0o644)
        state.chmod(0o755 if os.geteuid() == 0 else 0o555)
        yield state
        state.chmod(0o700)

    def test_status_reads_a_ledger_it_may_not_write(self, readable_only: Path):
        code, out, err = status_as_reader(readable_only)

        assert (code, err) == (0, "")
        assert [row["run_id"] for row in json.loads(out)] == [
            "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9"
        ]

    def test_status_reads_a_ledger_it_may_not_write_while_a_writer_has_it_open(
        self, readable_only: Path
    ):
        with Ledger(readable_only / "state.db") as writer:
            a_run(writer, path="/runs/b", run_id="9a9a9a9a-0000-4000-8000-000000000000")
            for journal in readable_only.glob("state.db-*"):
                journal.chmod(0o644)

            code, out, err = status_as_reader(readable_only)

        assert (code, err) == (0, "")
        assert len(json.loads(out)) == 2, "the reader sees what the writer committed"


# ---------------------------------------------------------------- naming a run


class TestMatching:
    def test_an_empty_key_names_no_run_even_when_there_is_only_one(self, ledger: Ledger):
        a_run(ledger)

        assert ledger.match("") == []
        assert ledger.get("") is None

    @pytest.mark.parametrize("key", ["c_9", "c%", "C09"])
    def test_a_prefix_is_matched_literally(self, ledger: Ledger, key: str):
        a_run(ledger, run_id="c0912345-aaaa-4bbb-8ccc-000000000000")

        assert ledger.match(key) == []

    def test_an_ambiguous_prefix_matches_every_candidate(self, ledger: Ledger):
        one = a_run(ledger, path="/runs/a", run_id="abc-1")
        two = a_run(ledger, path="/runs/b", run_id="abc-2")

        assert ledger.match("abc") == [one, two]

    def test_a_prefix_holding_a_nul_finds_the_run_id_it_begins_on_either_store(
        self, ledger: Ledger
    ):
        record = a_run(ledger, path="/runs/a", run_id="abc\0def")
        a_run(ledger, path="/runs/b", run_id="abc-2")

        assert ledger.match("abc\0") == [record]
        assert ledger.match("\0") == []

    def test_a_key_that_is_not_utf8_matches_the_run_at_that_path_and_nothing_else(
        self, ledger: Ledger
    ):
        odd = os.fsdecode(b"/runs/odd-\xff-run")
        record = a_run(ledger, path=odd, run_id="abc-1")

        assert ledger.match(odd) == [record]
        assert ledger.match(os.fsdecode(b"/runs/other-\xfe")) == []
        assert ledger.match(os.fsdecode(b"abc\xff")) == [], "not a prefix of a run id"


class TestDaemonRows:
    def test_a_daemons_row_says_which_roots_it_follows_runs_under_as_bytes(self, ledger: Ledger):
        """What `push` reads to leave a followed run to a running daemon: the roots each daemon
        follows runs under, kept as bytes (a path need not be UTF-8), matched by whole names."""
        root = b"/data/runs-\xff"
        now = time.time()
        for daemon_id, follows in (("h/b/1/1/1", [root]), ("h/b/1/2/2", [])):
            ledger.daemon_seen(
                daemon_id, host="h", pid=1, version="0.4.0", observer="inotify",
                started_at=now, lease_seconds=60, follows=follows,
            )  # fmt: skip

        by_id = {daemon.id: daemon for daemon in ledger.daemons()}
        follower, other = by_id["h/b/1/1/1"], by_id["h/b/1/2/2"]
        assert follower.follows_run_at(root + b"/gsm8k--m/0f1e2d3c")
        assert not follower.follows_run_at(root + b"2/gsm8k--m/0f1e2d3c"), "a sibling's name"
        assert not follower.follows_run_at(b"/elsewhere/gsm8k--m/0f1e2d3c")
        assert not other.follows_run_at(root + b"/gsm8k--m/0f1e2d3c"), "it follows no run"
