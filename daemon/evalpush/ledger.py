"""The ledger: durable per-run progress in one SQLite file, advanced only on acknowledgement.

One row per run directory (`runs`), the records set aside from it (`set_aside`), and the
evaluations it had before its current one (`history`: superseded, deleted, cancelled). The
upload stage writes an intent (`pending`) before every non-replayable request and clears it
with the acknowledgement, in one transaction each, so after `kill -9` at any instant the row
says exactly what may have reached the platform.

Durability: WAL journal with `synchronous=FULL` (a committed step survives power loss, not just
a crashed process); the file is created with mode 0600 in a 0700 directory. Every SQLite failure
(full disk, locked or corrupt file) surfaces as `LedgerError` naming the file: the upload stops
rather than carry on with progress it cannot record.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from evalpush.errors import LedgerError
from evalpush.log import scrub

LEDGER_FILE = "state.db"
SCHEMA_VERSION = 1


class State:
    """Run states, as `status` shows them."""

    WAITING = "waiting"
    READY = "ready"
    UPLOADING = "uploading"
    FINALIZED = "finalized"
    FAILED = "failed"
    HELD = "held"
    SKIPPED = "skipped"
    SUPERSEDED = "superseded"


class Step:
    """Where an upload is: the next thing to do."""

    SCAN = "scan"
    RESOLVE = "resolve"
    CREATE = "create"
    PUSH = "push"
    FINALIZE = "finalize"
    DONE = "done"


_MIGRATIONS: list[str] = [
    # version 1
    """
    CREATE TABLE runs (
        id INTEGER PRIMARY KEY,
        path TEXT NOT NULL UNIQUE,
        run_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        state TEXT NOT NULL,
        reason TEXT NOT NULL DEFAULT '',
        step TEXT NOT NULL DEFAULT 'scan',
        file_device INTEGER,
        file_inode INTEGER,
        file_size INTEGER,
        upload_end INTEGER,
        env_id TEXT,
        evaluation_id TEXT,
        viewer_url TEXT,
        pending TEXT,
        acked_offset INTEGER NOT NULL DEFAULT 0,
        acked_line INTEGER NOT NULL DEFAULT 0,
        samples_sent INTEGER NOT NULL DEFAULT 0,
        samples_seen INTEGER NOT NULL DEFAULT 0,
        bytes_sent INTEGER NOT NULL DEFAULT 0,
        totals BLOB,
        release_hold INTEGER NOT NULL DEFAULT 0,
        attempts INTEGER NOT NULL DEFAULT 0,
        last_error TEXT,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        finalized_at REAL
    );
    CREATE INDEX runs_run_id ON runs (run_id);
    CREATE TABLE set_aside (
        run INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        line INTEGER NOT NULL,
        offset INTEGER NOT NULL,
        size INTEGER NOT NULL,
        kind TEXT NOT NULL,
        reason TEXT NOT NULL,
        PRIMARY KEY (run, offset)
    );
    CREATE TABLE history (
        run INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        evaluation_id TEXT NOT NULL,
        viewer_url TEXT,
        outcome TEXT NOT NULL,
        at REAL NOT NULL,
        PRIMARY KEY (run, evaluation_id)
    );
    """,
]


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One row of `runs`."""

    id: int
    path: str
    run_id: str
    kind: str
    state: str
    reason: str
    step: str
    file_device: int | None
    file_inode: int | None
    file_size: int | None
    upload_end: int | None
    env_id: str | None
    evaluation_id: str | None
    viewer_url: str | None
    pending: str | None
    acked_offset: int
    acked_line: int
    samples_sent: int
    samples_seen: int
    bytes_sent: int
    totals: bytes | None
    release_hold: int
    attempts: int
    last_error: str | None
    created_at: float
    updated_at: float
    finalized_at: float | None


_COLUMNS = [f.name for f in fields(RunRecord)]
_MESSAGE_COLUMNS = {"reason", "last_error"}


@dataclass(frozen=True, slots=True)
class SetAsideRecord:
    line: int
    offset: int
    size: int
    kind: str  # "bad_line" (the converter refused it) or "rejected" (the platform did)
    reason: str


@dataclass(frozen=True, slots=True)
class HistoryRecord:
    evaluation_id: str
    viewer_url: str | None
    outcome: str  # "superseded", "deleted" or "cancelled"
    at: float


def default_path(state_dir: Path) -> Path:
    return state_dir / LEDGER_FILE


class Ledger:
    """The state database. Thread-safe: one connection, one lock, one short transaction a call."""

    def __init__(self, path: Path, *, clock: Any = time.time, busy_timeout_seconds: float = 10.0):
        """`busy_timeout_seconds`: how long a write waits for another process holding the file
        (a second `evalpush` on the same state dir) before it is a `LedgerError`."""
        self.path = path
        self._clock = clock
        self._busy_timeout_seconds = busy_timeout_seconds
        self._lock = threading.RLock()
        self._db = self._open(path)

    # ------------------------------------------------------------ opening

    def _open(self, path: Path) -> sqlite3.Connection:
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            os.close(fd)
            db = sqlite3.connect(
                path,
                check_same_thread=False,
                isolation_level=None,
                timeout=self._busy_timeout_seconds,
            )
        except OSError as exc:
            raise LedgerError(f"{path}: cannot open the ledger: {exc}") from None
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.execute("PRAGMA foreign_keys=ON")
            self._migrate(db)
        except sqlite3.Error as exc:
            db.close()
            raise LedgerError(
                f"{path}: the ledger is unusable ({exc}); move it aside to start over"
            ) from None
        return db

    def _migrate(self, db: sqlite3.Connection) -> None:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version > len(_MIGRATIONS):
            raise sqlite3.DatabaseError(
                f"schema version {version} is newer than this evalpush knows ({len(_MIGRATIONS)})"
            )
        for number, script in enumerate(_MIGRATIONS[version:], start=version + 1):
            db.executescript(f"BEGIN IMMEDIATE; {script}; PRAGMA user_version={number}; COMMIT;")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield self._db
                except BaseException:
                    # SQLite may have rolled back already (SQLITE_FULL does): a second ROLLBACK
                    # would fail and hide the real error.
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                with contextlib.suppress(sqlite3.Error):
                    self._db.execute("ROLLBACK")
                raise LedgerError(f"{self.path}: cannot write the ledger: {exc}") from None

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            try:
                return self._db.execute(sql, args).fetchall()
            except sqlite3.Error as exc:
                raise LedgerError(f"{self.path}: cannot read the ledger: {exc}") from None

    # ------------------------------------------------------------ runs

    def get(self, run_key: int | str) -> RunRecord | None:
        """A run by row id, path, or run id (full or a unique prefix)."""
        cols = ", ".join(_COLUMNS)
        if isinstance(run_key, int):
            rows = self._query(f"SELECT {cols} FROM runs WHERE id = ?", (run_key,))
        else:
            rows = self._query(f"SELECT {cols} FROM runs WHERE path = ?", (run_key,))
            if not rows:
                rows = self._query(
                    f"SELECT {cols} FROM runs WHERE run_id = ? OR run_id LIKE ? ORDER BY id",
                    (run_key, run_key.replace("%", "") + "%"),
                )
                exact = [r for r in rows if r[2] == run_key]
                rows = exact or (rows if len(rows) == 1 else [])
        return RunRecord(*rows[0]) if rows else None

    def all(self) -> list[RunRecord]:
        cols = ", ".join(_COLUMNS)
        return [RunRecord(*row) for row in self._query(f"SELECT {cols} FROM runs ORDER BY id")]

    def add(self, *, path: str, run_id: str, kind: str, state: str, reason: str = "") -> RunRecord:
        now = self._clock()
        with self._transaction() as db:
            db.execute(
                "INSERT INTO runs (path, run_id, kind, state, reason, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (path, run_id, kind, state, reason, now, now),
            )
        record = self.get(path)
        assert record is not None
        return record

    def update(self, record: RunRecord, **changes: Any) -> RunRecord:
        """Write `changes` to the run's row in one transaction; returns the new row."""
        unknown = set(changes) - set(_COLUMNS)
        if unknown:
            raise ValueError(f"unknown ledger columns: {sorted(unknown)}")
        for name in _MESSAGE_COLUMNS & changes.keys():
            if changes[name] is not None:  # errors can quote what a server echoed back
                changes[name] = scrub(changes[name])
        changes["updated_at"] = self._clock()
        assignments = ", ".join(f"{name} = ?" for name in changes)
        with self._transaction() as db:
            db.execute(
                f"UPDATE runs SET {assignments} WHERE id = ?", (*changes.values(), record.id)
            )
        updated = self.get(record.id)
        if updated is None:
            raise LedgerError(f"{self.path}: run {record.run_id} vanished from the ledger")
        return updated

    def forget(self, record: RunRecord) -> None:
        with self._transaction() as db:
            db.execute("DELETE FROM runs WHERE id = ?", (record.id,))

    # ------------------------------------------------------------ set-aside records and history

    def add_set_aside(self, record: RunRecord, items: list[SetAsideRecord]) -> None:
        if not items:
            return
        with self._transaction() as db:
            db.executemany(
                "INSERT OR REPLACE INTO set_aside (run, line, offset, size, kind, reason) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                [(record.id, i.line, i.offset, i.size, i.kind, scrub(i.reason)) for i in items],
            )

    def set_aside(self, record: RunRecord) -> list[SetAsideRecord]:
        rows = self._query(
            "SELECT line, offset, size, kind, reason FROM set_aside WHERE run = ? ORDER BY offset",
            (record.id,),
        )
        return [SetAsideRecord(*row) for row in rows]

    def set_aside_counts(self) -> dict[int, int]:
        return dict(self._query("SELECT run, COUNT(*) FROM set_aside GROUP BY run"))

    def history(self, record: RunRecord) -> list[HistoryRecord]:
        rows = self._query(
            "SELECT evaluation_id, viewer_url, outcome, at FROM history WHERE run = ? ORDER BY at",
            (record.id,),
        )
        return [HistoryRecord(*row) for row in rows]

    def restart(
        self, record: RunRecord, *, outcome: str, state: str = State.READY, same_file: bool = False
    ) -> RunRecord:
        """Start the run's upload over: its current evaluation (if any) goes to `history` with
        `outcome`, its progress and set-aside records are cleared, in one transaction. A hold
        release (`evalpush retry`) is kept only for the `same_file`: it was for the bad lines a
        person saw."""
        now = self._clock()
        with self._transaction() as db:
            if record.evaluation_id is not None:
                db.execute(
                    "INSERT OR REPLACE INTO history (run, evaluation_id, viewer_url, outcome, at) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (record.id, record.evaluation_id, record.viewer_url, outcome, now),
                )
            db.execute("DELETE FROM set_aside WHERE run = ?", (record.id,))
            db.execute(
                "UPDATE runs SET state = ?, reason = '', step = ?, file_device = NULL, "
                "file_inode = NULL, file_size = NULL, upload_end = NULL, evaluation_id = NULL, "
                "viewer_url = NULL, pending = NULL, acked_offset = 0, acked_line = 0, "
                "samples_sent = 0, samples_seen = 0, bytes_sent = 0, totals = NULL, "
                "finalized_at = NULL, release_hold = ?, updated_at = ? "
                "WHERE id = ?",
                (state, Step.SCAN, record.release_hold if same_file else 0, now, record.id),
            )
        restarted = self.get(record.id)
        assert restarted is not None
        return restarted
