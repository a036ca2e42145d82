"""The ledger's tables, version by version, and how a file is brought to the current version.

The version is SQLite's `user_version`. `migrate` runs every step a file lacks inside ONE write
transaction (`BEGIN IMMEDIATE`) that reads the version first, so any number of processes may
open a new or an old ledger at once: each sees the file wholly before a migration or wholly
after it, never half-built (creating a new file is migrating from version 0).

- Version 1: runs keyed by path.
- Version 2: runs keyed by run id, with the path they were last seen at (as text for people and
  as the raw bytes), the trace file's fingerprint (mtime, ctime, SHA-256 of the bytes scanned),
  whether the platform was searched for the run id, and the run's claim; `forgotten`
  evaluations. A run that schema 1 saw at two paths had two rows: the one updated last is kept,
  and the other's evaluation goes to its history as `duplicate`.
- Version 3: `settles_at`, when a waiting run becomes ready by the settle rule if its file does
  not grow again (the daemon writes it; `status` counts down to it); an index on `state`.
- Version 4: `last_error_at`, when `last_error` was written (`status RUN` shows it).
- Version 5: no table changes; a run's `totals` may hold its rollout counts deflated
  (`dense_deflated`, `convert.totals.RolloutCounter`, when they are over 256 bytes raw), which
  an evalpush of version 4 would fail on mid-upload: the version makes it refuse the file at
  once instead, naming it. Counts saved raw (an older evalpush's, or a few) still read.
- Version 6: `daemons`, a row per daemon that used the ledger with its heartbeat (`status`
  shows which are running, and when the others were last seen: a fleet's hosts).
- Version 7: a run id and a path of any characters and any length. Runs are found by fixed-size
  digests (`run_key`: SHA-256 of the run id, unique; `path_key`: SHA-256 of `path_raw`), the
  values themselves kept whole in columns no index holds (a PostgreSQL btree refuses an entry
  over 2,704 bytes: a long run id or path stopped every daemon of a fleet). A run id that holds
  a NUL (which PostgreSQL text cannot) is stored as `evalpush-hex:` and its UTF-8 bytes in hex,
  reversibly (`stored_run_id`); so is one that starts with that mark. `forgotten` is keyed by
  `run_key` too.
- Version 8: `expected_traces`, the traces a run's config.toml expects (`num_tasks *
  rollouts`; NULL when it names no count), written when its upload starts or it is held:
  `status` shows a partial run's sent of expected, and what is missing.
- Version 9: a daemon's STATUS line and its gate (`records.GateState`, as JSON) in its
  `daemons` row, where `status` reads them on either store.
- Version 10: the indexes `status` reads a ledger of a million runs through without reading
  every row: runs by state in the order they were updated (`runs_state_updated`, which takes
  the place of `runs_state`), and the runs short of their expected traces (`runs_short`, a
  partial index: the finalized ones are partial); and, in the file, the runs someone holds (`runs_claim_owner`,
  which PostgreSQL had from the start), which the lease's renewal and `status` look up.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Callable
from pathlib import Path

from evalpush.core.errors import LedgerError

_V1 = [
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
    )""",
    "CREATE INDEX runs_run_id ON runs (run_id)",
    """
    CREATE TABLE set_aside (
        run INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        line INTEGER NOT NULL,
        offset INTEGER NOT NULL,
        size INTEGER NOT NULL,
        kind TEXT NOT NULL,
        reason TEXT NOT NULL,
        PRIMARY KEY (run, offset)
    )""",
    """
    CREATE TABLE history (
        run INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        evaluation_id TEXT NOT NULL,
        viewer_url TEXT,
        outcome TEXT NOT NULL,
        at REAL NOT NULL,
        PRIMARY KEY (run, evaluation_id)
    )""",
]

_V1_COLUMNS = (
    "id, run_id, path, kind, state, reason, step, file_device, file_inode, file_size, "
    "upload_end, env_id, evaluation_id, viewer_url, pending, acked_offset, acked_line, "
    "samples_sent, samples_seen, bytes_sent, totals, release_hold, attempts, last_error, "
    "created_at, updated_at, finalized_at"
)

# Schema 1 keyed runs by path, so a run seen at two paths has two rows (and two evaluations).
# Version 2 keeps one row per run id, the one updated last; the others' evaluations become its
# history (`duplicate`) and their set-aside records go.
_V2 = [
    """
    CREATE TABLE runs_v2 (
        id INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL UNIQUE,
        path TEXT NOT NULL,
        path_raw BLOB NOT NULL,
        kind TEXT NOT NULL,
        state TEXT NOT NULL,
        reason TEXT NOT NULL DEFAULT '',
        step TEXT NOT NULL DEFAULT 'scan',
        file_device INTEGER,
        file_inode INTEGER,
        file_size INTEGER,
        file_mtime_ns INTEGER,
        file_ctime_ns INTEGER,
        file_digest BLOB,
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
        looked_up INTEGER NOT NULL DEFAULT 0,
        claim_owner TEXT,
        claim_host TEXT,
        claim_boot TEXT,
        claim_pid INTEGER,
        claim_start INTEGER,
        claim_pidns TEXT,
        claim_since REAL,
        claim_expires REAL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        finalized_at REAL
    )""",
    f"""
    INSERT INTO runs_v2 ({_V1_COLUMNS}, path_raw, looked_up)
    SELECT {_V1_COLUMNS}, CAST(path AS BLOB), 1 FROM runs AS r
    WHERE NOT EXISTS (
        SELECT 1 FROM runs AS later WHERE later.run_id = r.run_id
        AND (later.updated_at > r.updated_at OR (later.updated_at = r.updated_at AND later.id > r.id))
    )""",
    """
    INSERT OR IGNORE INTO history (run, evaluation_id, viewer_url, outcome, at)
    SELECT kept.id, h.evaluation_id, h.viewer_url, h.outcome, h.at
    FROM history AS h JOIN runs AS dup ON dup.id = h.run JOIN runs_v2 AS kept USING (run_id)
    WHERE dup.id != kept.id""",
    """
    INSERT OR IGNORE INTO history (run, evaluation_id, viewer_url, outcome, at)
    SELECT kept.id, dup.evaluation_id, dup.viewer_url, 'duplicate', dup.updated_at
    FROM runs AS dup JOIN runs_v2 AS kept USING (run_id)
    WHERE dup.id != kept.id AND dup.evaluation_id IS NOT NULL""",
    "DELETE FROM history WHERE run NOT IN (SELECT id FROM runs_v2)",
    "DELETE FROM set_aside WHERE run NOT IN (SELECT id FROM runs_v2)",
    "DROP TABLE runs",
    "ALTER TABLE runs_v2 RENAME TO runs",
    "CREATE INDEX runs_path_raw ON runs (path_raw)",
    """
    CREATE TABLE forgotten (
        run_id TEXT NOT NULL,
        evaluation_id TEXT NOT NULL,
        at REAL NOT NULL,
        PRIMARY KEY (run_id, evaluation_id)
    )""",
]

_V3 = [
    "ALTER TABLE runs ADD COLUMN settles_at REAL",
    # The daemon asks every few seconds which runs are queued, and counts runs by state.
    "CREATE INDEX runs_state ON runs (state)",
]

_V4 = ["ALTER TABLE runs ADD COLUMN last_error_at REAL"]

_V5: list[str] = []

DAEMONS_TABLE = """
    CREATE TABLE daemons (
        id text PRIMARY KEY,
        host text NOT NULL,
        pid integer NOT NULL,
        version text NOT NULL,
        observer text NOT NULL DEFAULT '',
        started_at double precision NOT NULL,
        seen_at double precision NOT NULL,
        lease_seconds double precision NOT NULL,
        stopped_at double precision
    )"""
"""Written in the SQL both the file and a shared ledger's PostgreSQL take."""

_V6 = [DAEMONS_TABLE]

ESCAPED_RUN_ID = "evalpush-hex:"
"""What starts a run id stored in hex (`stored_run_id`)."""


def run_key(run_id: str) -> bytes:
    """What finds a run by its run id: the SHA-256 of its UTF-8 bytes (32 bytes whatever its
    length)."""
    return hashlib.sha256(run_id.encode("utf-8", "surrogatepass")).digest()


def path_key(path_raw: bytes) -> bytes:
    """What finds runs by the path they were last seen at: the SHA-256 of its bytes."""
    return hashlib.sha256(path_raw).digest()


def stored_run_id(run_id: str) -> str:
    """The run id as the `run_id` columns hold it, on both stores: as it is, unless it holds a
    NUL (PostgreSQL text cannot) or starts with `ESCAPED_RUN_ID`: then that mark and its UTF-8
    bytes in hex (`loaded_run_id` reverses it)."""
    if "\0" in run_id or run_id.startswith(ESCAPED_RUN_ID):
        return ESCAPED_RUN_ID + run_id.encode("utf-8", "surrogatepass").hex()
    return run_id


def loaded_run_id(stored: str) -> str:
    """The run id `stored_run_id` stored as `stored`."""
    if stored.startswith(ESCAPED_RUN_ID):
        hexed = stored[len(ESCAPED_RUN_ID) :]
        return bytes.fromhex(hexed).decode("utf-8", "surrogatepass")
    return stored


_RUNS_V7_COLUMNS = (
    "id, run_id, path, path_raw, kind, state, reason, step, file_device, file_inode, file_size, "
    "file_mtime_ns, file_ctime_ns, file_digest, upload_end, env_id, evaluation_id, viewer_url, "
    "pending, acked_offset, acked_line, samples_sent, samples_seen, bytes_sent, totals, "
    "release_hold, attempts, last_error, looked_up, claim_owner, claim_host, claim_boot, "
    "claim_pid, claim_start, claim_pidns, claim_since, claim_expires, created_at, updated_at, "
    "finalized_at, settles_at, last_error_at"
)

# The unique index on run_id and the index on path_raw go (SQLite keeps a constraint in its
# table's definition: the table is rebuilt, as version 2 did); digests take their place.
_V7 = [
    """
    CREATE TABLE runs_v7 (
        id INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL,
        path TEXT NOT NULL,
        path_raw BLOB NOT NULL,
        kind TEXT NOT NULL,
        state TEXT NOT NULL,
        reason TEXT NOT NULL DEFAULT '',
        step TEXT NOT NULL DEFAULT 'scan',
        file_device INTEGER,
        file_inode INTEGER,
        file_size INTEGER,
        file_mtime_ns INTEGER,
        file_ctime_ns INTEGER,
        file_digest BLOB,
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
        looked_up INTEGER NOT NULL DEFAULT 0,
        claim_owner TEXT,
        claim_host TEXT,
        claim_boot TEXT,
        claim_pid INTEGER,
        claim_start INTEGER,
        claim_pidns TEXT,
        claim_since REAL,
        claim_expires REAL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        finalized_at REAL,
        settles_at REAL,
        last_error_at REAL,
        run_key BLOB NOT NULL UNIQUE,
        path_key BLOB NOT NULL
    )""",
    f"""
    INSERT INTO runs_v7 ({_RUNS_V7_COLUMNS}, run_key, path_key)
    SELECT {_RUNS_V7_COLUMNS.replace("id, run_id,", "id, evalpush_stored_run_id(run_id),", 1)},
        evalpush_run_key(run_id), evalpush_path_key(path_raw)
    FROM runs""",
    "DROP TABLE runs",
    "ALTER TABLE runs_v7 RENAME TO runs",
    "CREATE INDEX runs_path_key ON runs (path_key)",
    "CREATE INDEX runs_state ON runs (state)",
    """
    CREATE TABLE forgotten_v7 (
        run_key BLOB NOT NULL,
        run_id TEXT NOT NULL,
        evaluation_id TEXT NOT NULL,
        at REAL NOT NULL,
        PRIMARY KEY (run_key, evaluation_id)
    )""",
    """
    INSERT INTO forgotten_v7 (run_key, run_id, evaluation_id, at)
    SELECT evalpush_run_key(run_id), evalpush_stored_run_id(run_id), evaluation_id, at
    FROM forgotten""",
    "DROP TABLE forgotten",
    "ALTER TABLE forgotten_v7 RENAME TO forgotten",
]

_V8 = ["ALTER TABLE runs ADD COLUMN expected_traces INTEGER"]

DAEMON_STATE = [
    "ALTER TABLE daemons ADD COLUMN status text NOT NULL DEFAULT ''",
    "ALTER TABLE daemons ADD COLUMN gate text NOT NULL DEFAULT '{}'",
]
"""Version 9, in the SQL both the file and a shared ledger's PostgreSQL take."""

SHORT = "expected_traces > samples_seen"
"""The runs that saw fewer lines than their config expects: a finalized one is partial unless
records set aside make up the difference (`RunRecord.missing_traces`). `runs_short` indexes
exactly these rows (by state, then when they were updated); a query finds them through it by
this same condition (and a state: SQLite then prefers it to `runs_state_updated`)."""

STATUS_INDEXES = [
    "CREATE INDEX runs_state_updated ON runs (state, updated_at)",
    f"CREATE INDEX runs_short ON runs (state, updated_at) WHERE {SHORT}",
]
"""Version 10, in the SQL both the file and a shared ledger's PostgreSQL take (each drops
`runs_state` first: the first index serves every query it served)."""

_V10 = [
    "DROP INDEX runs_state",
    *STATUS_INDEXES,
    "CREATE INDEX runs_claim_owner ON runs (claim_owner) WHERE claim_owner IS NOT NULL",
]

_MIGRATIONS: list[list[str]] = [
    _V1,
    _V2,
    _V3,
    _V4,
    _V5,
    _V6,
    _V7,
    _V8,
    DAEMON_STATE,
    _V10,
]
SCHEMA_VERSION = len(_MIGRATIONS)


def version(db: sqlite3.Connection, path: Path) -> int:
    """The file's schema version; `LedgerError` if a newer evalpush wrote it."""
    found = db.execute("PRAGMA user_version").fetchone()[0]
    if found > SCHEMA_VERSION:
        raise LedgerError(
            f"{path}: schema version {found} is newer than this evalpush knows "
            f"({SCHEMA_VERSION}): upgrade evalpush, or use the one that wrote it"
        )
    return found


def migrate(
    db: sqlite3.Connection,
    path: Path,
    before: Callable[[sqlite3.Connection, int], None] | None = None,
) -> int | None:
    """Bring the file to `SCHEMA_VERSION` in one write transaction that reads the version first;
    the version it was at (0: a new file), None if it was current. Foreign keys must be off on
    `db` (a table rebuilt must not cascade to its references). `before(db, version)` is called
    inside that transaction before any change to a file that has a version (the backup: no
    other process can write the file between it and the upgrade)."""
    if version(db, path) == SCHEMA_VERSION:  # versions only rise: no lock needed to see this
        return None
    db.execute("BEGIN IMMEDIATE")
    try:
        found = version(db, path)
        if found == SCHEMA_VERSION:  # another process migrated it meanwhile
            db.execute("COMMIT")
            return None
        if found and before is not None:
            before(db, found)
        _functions(db)
        for statements in _MIGRATIONS[found:]:
            for statement in statements:
                db.execute(statement)
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        if db.execute("PRAGMA foreign_key_check").fetchall():
            raise sqlite3.IntegrityError("the migration left rows without their run")
        db.execute("COMMIT")
        return found
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise


def _functions(db: sqlite3.Connection) -> None:
    """What the migrations call that SQLite lacks: the digests and the run id's stored form."""
    db.create_function("evalpush_run_key", 1, run_key, deterministic=True)
    db.create_function("evalpush_path_key", 1, path_key, deterministic=True)
    db.create_function("evalpush_stored_run_id", 1, stored_run_id, deterministic=True)
