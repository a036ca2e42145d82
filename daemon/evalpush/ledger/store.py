"""The ledger: durable per-run progress in one SQLite file, advanced only on acknowledgement.

One row per run, keyed by its run id, with the path it was last seen at (`runs`); the records
set aside from it (`set_aside`); the evaluations it had before its current one (`history`:
superseded, deleted, cancelled); and the evaluations of runs a person forgot (`forgotten`), which
a later upload of the same run must not adopt. The upload stage writes an intent (`pending`)
before every non-replayable request and clears it with the acknowledgement, in one transaction
each, so after `kill -9` at any instant the row says exactly what may have reached the platform.

Several processes share one ledger. A process works on a run only while it holds the run's
claim (columns `claim_*`, see `evalpush.ledger.claims`): `claim` takes it in one `BEGIN IMMEDIATE`
transaction, and every write to a run is fenced: it applies only while the claim is still the
one the writer read (`RunRecord.claim_owner`; none for a run nobody holds), else `ClaimLost`.

Schema creation and every migration run inside one write transaction that reads the schema
version first, so any number of processes may open a new or an old ledger at once.

Durability: a WAL journal. A write is durable (it survives power loss, not just a crashed
process) once the write-ahead log is synced after it. The ledger offers the protocol's writes by
name, and each says what it may lose: `record_intent` (durable before its request is sent; the
ledger itself sees the one intent an earlier synced one covers), `acknowledge` (written now,
not synced: a power cut may take the row back to its intent, reconciled), `record_progress`
(carried by the run's next write: a crash may take the row back to the step before), `update`
(durable). The claim, its release and the lease's renewal are not synced either: their loss to
a power cut costs nothing but a takeover. The log is synced by this process (`fsync`, the one
SQLite's `synchronous=FULL` does) after the commit and outside the lock, so writes of several
runs committed meanwhile share one sync (a group commit): an intent still waits for the disk
before its request is sent, without every other run waiting behind it.
The file is created with mode 0600 in a 0700 directory, and a `state.db`
that is a symlink or not a regular file is refused. Every SQLite failure (full disk, locked or
corrupt file) surfaces as `LedgerError` naming the file: the upload stops rather than carry on
with progress it cannot record.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import sqlite3
import stat
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from evalpush.core import paths
from evalpush.core.errors import Busy, ClaimLost, LedgerError
from evalpush.core.setaside import SetAside
from evalpush.core.states import Outcome, SetAsideKind, State, Step
from evalpush.ledger import schema
from evalpush.ledger.claims import Holder
from evalpush.log import get_logger, scrub

T = TypeVar("T")

LEDGER_FILE = "state.db"
WAL_RETRY_SECONDS = 0.01
BUSY_SLICE_SECONDS = 0.1
"""With a stop event, SQLite waits this long at a time for another process's lock; between
slices the stop is looked at."""
STOP_BUSY_SECONDS = 1.0
"""Once a stop is requested, this long in all is what the ledger still waits for another
process's lock (one evalpush stopped mid-write by Ctrl-Z holds it until it continues): the
writes a stop makes (interrupted, release) are worth a moment, not the busy timeout twice."""
SCHEMA_VERSION = schema.SCHEMA_VERSION


# gc=False, here and on other records made by the thousand: their fields are scalars (or such
# records), so they can never be part of a reference cycle for the collector to find.
class RunRecord(msgspec.Struct, frozen=True, gc=False):
    """One row of `runs`."""

    id: int
    run_id: str
    path: str  # for people: bytes that are not UTF-8 shown as \xNN (see `evalpush.core.paths`)
    path_raw: bytes  # the path's bytes: what finds the directory
    kind: str
    state: str
    reason: str
    step: str
    file_device: int | None
    file_inode: int | None
    file_size: int | None
    file_mtime_ns: int | None
    file_ctime_ns: int | None
    file_digest: bytes | None  # SHA-256 of the trace file's bytes [0, upload_end)
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
    looked_up: int  # 1 once the platform was searched for this run id (or the ledger knew it)
    claim_owner: str | None
    claim_host: str | None
    claim_boot: str | None
    claim_pid: int | None
    claim_start: int | None
    claim_pidns: str | None
    claim_since: float | None
    claim_expires: float | None
    created_at: float
    updated_at: float
    finalized_at: float | None
    settles_at: float | None  # a waiting run: when the settle rule makes it ready
    last_error_at: float | None  # when `last_error` was written

    @property
    def holder(self) -> Holder | None:
        """Who holds the run's claim (alive or not), if anyone."""
        if self.claim_owner is None:
            return None
        return Holder(
            self.claim_owner,
            self.claim_host or "",
            self.claim_boot or "",
            self.claim_pid or 0,
            self.claim_start or 0,
            self.claim_pidns or "",
            self.claim_since or 0.0,
            self.claim_expires or 0.0,
        )

    @property
    def directory(self) -> Path:
        return paths.from_raw(self.path_raw)


_COLUMNS = list(RunRecord.__struct_fields__)
_SELECT = f"SELECT {', '.join(_COLUMNS)} FROM runs"
_MESSAGE_COLUMNS = {"reason", "last_error"}
_CLAIM_COLUMNS = {c for c in _COLUMNS if c.startswith("claim_")}
_WRITABLE_COLUMNS = set(_COLUMNS) - _CLAIM_COLUMNS - {"id", "run_id", "path_raw", "created_at"}
"""What `set_state` may write: not the run's identity, not its claim (`claim`/`release` do);
`path` writes `path_raw` with it. `update` writes the same, less `state`."""


class HistoryRecord(msgspec.Struct, frozen=True, gc=False):
    evaluation_id: str
    viewer_url: str | None
    outcome: str  # "superseded", "deleted", "closed", "cancelled" or "duplicate"
    at: float


class Upgrade(msgspec.Struct, frozen=True):
    """A ledger brought from an older schema to this evalpush's, and where the old file went."""

    path: Path
    from_version: int
    to_version: int
    backup: Path

    @property
    def message(self) -> str:
        return f"ledger upgraded {self.from_version} -> {self.to_version} (backup: {self.backup})"

    def log(self) -> None:
        get_logger(stage="ledger").warning(
            self.message,
            ledger=str(self.path),
            backup=str(self.backup),
            from_version=self.from_version,
            to_version=self.to_version,
        )


def default_path(state_dir: Path) -> Path:
    return state_dir / LEDGER_FILE


def _stored_text(text: str) -> str:
    """Text as it may be stored: secrets scrubbed (errors can quote what a server echoed
    back) and lone surrogates (non-UTF-8 file names) escaped, which SQLite cannot encode."""
    return paths.printable(scrub(text))


UNUSABLE_ADVICE = (
    "try the lighter fixes first: free disk space; fix the file's owner and mode; stop another "
    "evalpush holding it; for a damaged file, `sqlite3 {path} .recover | sqlite3 {path}.new` and "
    "put state.db.new in its place. Moving the ledger aside is the last resort and costs this: "
    "every run starts over as unknown (looked up on the platform by its run id and adopted "
    "when found, but held and failed decisions, set-aside records and the history are lost), "
    "and any run the platform cannot find by run id is uploaded again, a second evaluation"
)


_TEXTS = (("set_aside", "reason"), ("runs", "reason"), ("runs", "last_error"))
"""The columns that hold what a server said: where an older evalpush may have stored a key."""


def _scrub_copy(db: sqlite3.Connection) -> None:
    """A copy of the ledger at any schema (a backup): its texts scrubbed (`log.scrub`) and the
    file rebuilt, so no stale copy of a key lingers in the free space of a page."""
    db.create_function("scrub", 1, scrub, deterministic=True)
    tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    for table, column in _TEXTS:
        if table in tables:
            db.execute(
                f"UPDATE {table} SET {column} = scrub({column}) "  # noqa: S608 - names are ours
                f"WHERE {column} IS NOT NULL AND {column} != scrub({column})"
            )
    db.execute("VACUUM")


class Ledger:
    """The state database. Thread-safe: one connection, one lock, one short transaction a call."""

    def __init__(
        self,
        path: Path,
        *,
        clock: Any = time.time,
        busy_timeout_seconds: float = 10.0,
        read_only: bool = False,
        stop: threading.Event | None = None,
    ):
        """`busy_timeout_seconds`: how long a write waits for another process holding the file
        (a second `evalpush` on the same state dir) before it is a `LedgerError`; once `stop`
        is set, at most `STOP_BUSY_SECONDS` more in all. `read_only` opens an existing ledger
        for reading only, which a user without write access may do, and never writes it: a
        ledger from an older evalpush is copied into memory (SQLite's online backup) and the
        copy upgraded and read (`file_version` says which version the file is at). A ledger
        opened to write is upgraded in place, after a backup of the old file beside it
        (`state.db.bak-vN`); `upgrade` then says so, for the caller to tell (the daemon logs
        it, a command prints it)."""
        self.path = path
        self.read_only = read_only
        self.file_version = schema.SCHEMA_VERSION
        self.upgrade: Upgrade | None = None
        self._clock = clock
        self._busy_timeout_seconds = busy_timeout_seconds
        self._stop = stop
        self._stopped_at: float | None = None  # when a wait first saw the stop (monotonic)
        self._lock = threading.RLock()
        self._file: tuple[int, int] | None = None  # (device, inode) of the file opened
        self._upgraded_from: int | None = None
        self._deferred: dict[int, dict[str, Any]] = {}  # row id -> changes for its next write
        self._sync_lock = threading.Lock()
        self._committed = 0  # write transactions committed by this process
        self._synced = 0  # of those, how many the last sync of the log covered
        self._log_fd: int | None = None  # the write-ahead log, opened at the first sync
        self.writes = 0  # write transactions committed (what bench/many_runs.py counts)
        self.syncs = 0  # syncs of the write-ahead log
        self._db = self._open(path)
        if stop is not None:
            self._db.execute(f"PRAGMA busy_timeout = {int(BUSY_SLICE_SECONDS * 1000)}")
        if self._upgraded_from:
            # An older evalpush stored what servers echoed as it was, and what it deleted stays
            # in free space: its texts are scrubbed (of the secrets known so far: `push` scrubs
            # again once it has the key) and the file rebuilt from its live rows.
            self.scrub_secrets(rewrite=True)

    # ------------------------------------------------------------ opening

    @classmethod
    def for_reading(cls, path: Path) -> Ledger:
        """Open to read (`status`): read-only, and a ledger from an older evalpush is read
        through an upgraded copy in memory, the file left as it is."""
        return cls(path, read_only=True)

    def _connect(self, path: Path, *, immutable: bool = False) -> sqlite3.Connection:
        if self.read_only:
            mode = "immutable=1" if immutable else "mode=ro"
            target: str | Path = f"file:{urllib.parse.quote(os.fsencode(path))}?{mode}"
        else:
            target = path
        return sqlite3.connect(
            target,
            uri=self.read_only,
            check_same_thread=False,
            isolation_level=None,
            timeout=self._busy_timeout_seconds,
        )

    def _open(self, path: Path) -> sqlite3.Connection:
        try:
            self._check_file(path)
            db = self._connect(path)
        except (OSError, sqlite3.Error) as exc:
            raise LedgerError(f"{path}: cannot open the ledger: {exc}") from None
        try:
            if self.read_only:
                db = self._readable(db, path)
                self.file_version = schema.version(db, self.path)
                if self.file_version != schema.SCHEMA_VERSION:
                    db = self._upgraded_copy(db)
            else:
                self._write_ahead_log(db)
                # No sync by SQLite at each commit: `_sync` does it after the commit, outside
                # the lock, for every write that must be durable (see the module's docstring).
                # A checkpoint still syncs the log before and the database after.
                db.execute("PRAGMA synchronous=NORMAL")
                self._upgraded_from = schema.migrate(db, self.path, before=self._back_up)
                self._committed = int(db.total_changes > 0)  # synced with the next write
            db.execute(
                "PRAGMA foreign_keys=ON"
            )  # after migrating: a table rebuild must not cascade
        except sqlite3.Error as exc:
            db.close()
            raise LedgerError(self._unusable(exc)) from None
        except LedgerError:
            db.close()
            raise
        return db

    def _write_ahead_log(self, db: sqlite3.Connection) -> None:
        """Switch the file to WAL. Processes opening a new file together race to write its first
        page: SQLite answers a loser at once with SQLITE_BUSY (deadlock avoidance: its busy
        timeout does not apply) or leaves the mode as it was, so the switch is tried again
        until it is done or the busy timeout is spent."""
        deadline = time.monotonic() + self._busy_timeout_seconds
        while True:
            try:
                if db.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal":
                    return
            except sqlite3.OperationalError as exc:
                if exc.sqlite_errorcode != sqlite3.SQLITE_BUSY or time.monotonic() > deadline:
                    raise
            if time.monotonic() > deadline:
                raise sqlite3.OperationalError("cannot switch to WAL: database is locked")
            time.sleep(WAL_RETRY_SECONDS)

    def _readable(self, db: sqlite3.Connection, path: Path) -> sqlite3.Connection:
        """A read-only connection that can read. A WAL ledger no process has open has no `-shm`
        index file, and one who may not create it (no write access to the directory) cannot
        read it that way; with no `-wal` file either, every committed write is in the file
        itself, so it is read as immutable (a writer starting that very instant could make the
        read fail, never show a wrong row)."""
        try:
            db.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return db
        except sqlite3.OperationalError:
            if os.path.lexists(f"{path}-wal"):
                raise
            db.close()
            return self._connect(path, immutable=True)

    def _check_file(self, path: Path) -> None:
        """Refuse a ledger that is a symlink or not a regular file (without creating a symlink's
        target); create a missing one, private, unless opening read-only."""
        if not self.read_only:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        flags = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        flags |= os.O_RDONLY if self.read_only else os.O_RDWR | os.O_CREAT
        try:
            fd = os.open(path, flags, 0o600)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                raise LedgerError(self._not_a_file(path)) from None
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise LedgerError(self._not_a_file(path))
            self._file = (st.st_dev, st.st_ino)
        finally:
            os.close(fd)

    def _check_still_the_file(self) -> None:
        """Inside a write: `path` must still name the file this connection has open. A ledger
        moved aside (or replaced) under a running process is another process's business from
        then on: this one writes nothing more to the file it holds, which nobody reads."""
        try:
            st = os.stat(self.path)
            now: tuple[int, int] | None = (st.st_dev, st.st_ino)
        except OSError:
            now = None
        if now != self._file:
            raise LedgerError(
                f"{self.path} is no longer the ledger this process opened (moved aside or "
                "replaced while it ran): this process stops here and writes nothing more; the "
                "runs it was uploading are resumed by whoever uses the ledger at that path, "
                "reconciling with the platform"
            )

    @staticmethod
    def _not_a_file(path: Path) -> str:
        return (
            f"{path}: not a regular file (a symlink, directory or device): refusing to use it as "
            "the ledger; point --state-dir at a directory of its own"
        )

    def _unusable(self, exc: sqlite3.Error) -> str:
        return f"{self.path}: the ledger is unusable ({exc}); " + UNUSABLE_ADVICE.format(
            path=self.path
        )

    def _upgraded_copy(self, db: sqlite3.Connection) -> sqlite3.Connection:
        """The read-only file copied into memory and the copy upgraded: what a reader of an
        older ledger reads, without a byte of the file changing."""
        copy = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        try:
            db.backup(copy)
            schema.migrate(copy, self.path)
        except BaseException:
            copy.close()
            raise
        finally:
            db.close()
        return copy

    def _back_up(self, db: sqlite3.Connection, version: int) -> None:
        """Inside the upgrade's write transaction (held by `db`, which has written nothing yet):
        the file as it is, read by a second connection (in WAL mode a reader is not blocked by
        the writer, and sees the last commit) and copied with SQLite's online backup to
        `state.db.bak-vN` (mode 0600, written aside and renamed into place), its texts scrubbed
        of the secrets known now and rebuilt, as the upgraded file is."""
        backup = self.path.with_name(f"{self.path.name}.bak-v{version}")
        partial = backup.with_name(backup.name + ".partial")
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
        os.close(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
        source = sqlite3.connect(self.path, isolation_level=None)
        target = sqlite3.connect(partial, isolation_level=None)
        try:
            source.backup(target)
            target.execute("PRAGMA journal_mode=DELETE")  # one self-contained file
            _scrub_copy(target)
        finally:
            target.close()
            source.close()
        with open(partial, "rb") as f:
            os.fsync(f.fileno())
        os.replace(partial, backup)
        self.upgrade = Upgrade(self.path, version, schema.SCHEMA_VERSION, backup)

    def close(self) -> None:
        """Close the file; whatever this process committed is durable first."""
        with self._lock:
            if not self.read_only and self._committed > self._synced:
                with contextlib.suppress(OSError):  # the next writer recovers what is lost
                    self._sync(self._committed)
            self._db.close()
            if self._log_fd is not None:
                os.close(self._log_fd)
                self._log_fd = None

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _transaction(self, *, durable: bool = True) -> Iterator[sqlite3.Connection]:
        """One write transaction (`BEGIN IMMEDIATE`). `durable`: before this returns, the log is
        synced (`_sync`) after the commit, outside the lock."""
        if self.read_only:
            raise LedgerError(f"{self.path}: opened read-only")
        with self._lock:
            try:
                self._while_busy(lambda: self._db.execute("BEGIN IMMEDIATE"))
                try:
                    self._check_still_the_file()
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
                raise LedgerError(
                    f"{self.path}: cannot write the ledger: {exc}" + self._why_busy(exc)
                ) from None
            self.writes += 1
            self._committed = committed = self._committed + 1
        if durable:
            try:
                self._sync(committed)
            except OSError as exc:
                raise LedgerError(f"{self.path}: cannot sync the ledger: {exc}") from None

    def _sync(self, committed: int) -> None:
        """Make this process's first `committed` write transactions durable: one `fsync` of the
        write-ahead log (what `synchronous=FULL` does at each commit), shared by every
        transaction committed before it starts. The log holds commits in order, each frame
        checksummed on the one before, so a commit never outlives an earlier one in a crash;
        and a checkpoint (which moves frames into the database and may start the log over)
        syncs the log before and the database after, so a commit it moved is durable too."""
        with self._sync_lock:
            if self._synced >= committed:
                return  # a sync that started after this commit covered it
            covered = self._committed
            os.fsync(self._log())
            self._synced = max(self._synced, covered)
            self.syncs += 1

    def _log(self) -> int:
        """The write-ahead log's descriptor (it exists after the first commit, and lives while
        this connection does: SQLite removes it only when the last connection closes). The
        first time, its directory is synced too, as SQLite does for a log it created."""
        if self._log_fd is None:
            self._log_fd = os.open(f"{self.path}-wal", os.O_RDONLY | os.O_CLOEXEC)
            directory = os.open(self.path.parent, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        return self._log_fd

    def _while_busy(self, statement: Callable[[], T]) -> T:
        """`statement()`, tried again while another process holds the lock it needs: until the
        busy timeout is spent, or `STOP_BUSY_SECONDS` after a stop was first seen. (SQLite's own
        wait, one slice each try with a stop event, else the whole busy timeout, sees no stop.)"""
        deadline = time.monotonic() + self._busy_timeout_seconds
        while True:
            try:
                return statement()
            except sqlite3.OperationalError as exc:
                if exc.sqlite_errorcode != sqlite3.SQLITE_BUSY:
                    raise
                now = time.monotonic()
                if now >= min(deadline, self._stop_deadline(now)):
                    raise

    def _stop_deadline(self, now: float) -> float:
        if self._stop is None or not self._stop.is_set():
            return math.inf
        if self._stopped_at is None:
            self._stopped_at = now
        return self._stopped_at + STOP_BUSY_SECONDS

    def _why_busy(self, exc: sqlite3.Error) -> str:
        if getattr(exc, "sqlite_errorcode", None) != sqlite3.SQLITE_BUSY:
            return ""
        waited = (
            f"for over {self._busy_timeout_seconds:g} s"
            if self._stopped_at is None
            else "and a stop was requested, which does not wait for it"
        )
        return (
            f" (another process held its write lock {waited}: an evalpush stopped mid-write, "
            "by Ctrl-Z or SIGSTOP, holds it until it continues)"
        )

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            try:
                return self._while_busy(lambda: self._db.execute(sql, args).fetchall())
            except sqlite3.Error as exc:
                raise LedgerError(f"{self.path}: cannot read the ledger: {exc}") from None

    def _records(self, where: str, args: tuple[Any, ...] = ()) -> list[RunRecord]:
        """Rows as this process knows them: with their deferred writes."""
        records = [RunRecord(*row) for row in self._query(f"{_SELECT} {where}", args)]
        if not self._deferred:
            return records
        with self._lock:
            deferred = self._deferred
            return [
                msgspec.structs.replace(r, **deferred[r.id]) if r.id in deferred else r
                for r in records
            ]

    # ------------------------------------------------------------ finding runs

    def get(self, run_key: int | str) -> RunRecord | None:
        """A run by row id, path, or run id (full or a unique prefix); None if none or several."""
        found = (
            self.match(run_key)
            if isinstance(run_key, str)
            else self._records("WHERE id = ?", (run_key,))
        )
        return found[0] if len(found) == 1 else None

    def get_run(self, run_id: str) -> RunRecord | None:
        """The run with this exact run id."""
        found = self._records("WHERE run_id = ?", (run_id,))
        return found[0] if found else None

    def run_id_at(self, path: Path) -> str | None:
        """The run id of the run last seen at `path`, if the ledger knows one (the run id of a
        directory whose name is not a UUID: `runs.derive_run_id`)."""
        found = self._query(
            "SELECT run_id FROM runs WHERE path_raw = ? ORDER BY updated_at DESC LIMIT 1",
            (paths.raw(path),),
        )
        return found[0][0] if found else None

    def match(self, key: str) -> list[RunRecord]:
        """The runs `key` names: the one at that path, the one with that run id, else every run
        whose id starts with `key` (literally: no wildcards). An empty key names none."""
        if not key:
            return []
        found = self._records("WHERE path_raw = ?", (paths.raw(key),))
        if found or paths.printable(key) != key:
            return found  # a key with bytes that are not UTF-8 can only be a path
        found = self._records("WHERE run_id = ?", (key,))
        return found or self._records(
            "WHERE substr(run_id, 1, ?) = ? ORDER BY run_id", (len(key), key)
        )

    def all(self) -> list[RunRecord]:
        return self._records("ORDER BY id")

    def in_state(self, *states: State) -> list[RunRecord]:
        marks = ", ".join("?" * len(states))
        return self._records(f"WHERE state IN ({marks}) ORDER BY id", tuple(states))

    def state_counts(self) -> dict[str, int]:
        """How many runs are in each state."""
        return dict(self._query("SELECT state, COUNT(*) FROM runs GROUP BY state"))

    def file_facts(self) -> list[tuple[bytes, str, int | None, int | None, int | None, int | None]]:
        """(path_raw, state, device, inode, size, mtime_ns) of every run's trace file as last
        scanned: what the daemon compares a rescan with, without a row object per run."""
        return self._query(  # type: ignore[return-value]
            "SELECT path_raw, state, file_device, file_inode, file_size, file_mtime_ns FROM runs"
        )

    def add(
        self, *, path: Path | str, run_id: str, kind: str, state: str, reason: str = ""
    ) -> RunRecord:
        """A new run nobody holds (`claim` adds one held by its caller)."""
        now = self._clock()
        with self._transaction() as db:
            row_id = self._insert(db, path=path, run_id=run_id, kind=kind, state=state, now=now)
            if reason:
                db.execute(
                    "UPDATE runs SET reason = ? WHERE id = ?", (_stored_text(reason), row_id)
                )
        record = self.get(row_id)
        assert record is not None
        return record

    @staticmethod
    def _insert(
        db: sqlite3.Connection, *, path: Path | str, run_id: str, kind: str, state: str, now: float
    ) -> int:
        cursor = db.execute(
            "INSERT INTO runs (run_id, path, path_raw, kind, state, created_at, updated_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (run_id, paths.display(path), paths.raw(path), kind, state, now, now),
        )
        assert cursor.lastrowid is not None
        return cursor.lastrowid

    # ------------------------------------------------------------ claims

    def claim(
        self,
        *,
        run_id: str,
        path: Path | str,
        kind: str,
        owner: str,
        process: Any,
        expires: float,
        alive: Callable[[Holder], bool],
    ) -> tuple[RunRecord, Holder | None]:
        """Take the run's claim for `owner` (of `process`, a `claims.Process`), adding the run if
        the ledger does not know it; returns the run and the dead holder it was taken over from.

        One `BEGIN IMMEDIATE` transaction: read the claim, judge its holder with `alive`, write
        ours. `Busy` if a live process holds it. (In PostgreSQL: `SELECT ... FOR UPDATE SKIP
        LOCKED` on the row, then the same judgement.)
        """
        now = self._clock()
        # Not synced: a claim lost to power loss was never held (nothing is sent before the
        # run's first intent, whose sync makes the claim durable too).
        with self._transaction(durable=False) as db:
            row = db.execute(f"{_SELECT} WHERE run_id = ?", (run_id,)).fetchone()
            if row is None:
                row_id = self._insert(
                    db, path=path, run_id=run_id, kind=kind, state=State.READY, now=now
                )
                previous = None
            else:
                record = RunRecord(*row)
                row_id, previous = record.id, record.holder
                if previous is not None and alive(previous):
                    raise Busy(
                        f"run {run_id} is being uploaded by {previous.describe(process)}",
                        pid=previous.pid,
                        host=previous.host,
                        since=previous.since,
                    )
            db.execute(
                "UPDATE runs SET claim_owner = ?, claim_host = ?, claim_boot = ?, claim_pid = ?, "
                "claim_start = ?, claim_pidns = ?, claim_since = ?, claim_expires = ? WHERE id = ?",
                (
                    owner,
                    process.host,
                    process.boot,
                    process.pid,
                    process.start,
                    process.pidns,
                    now,
                    expires,
                    row_id,
                ),
            )
            claimed = RunRecord(*db.execute(f"{_SELECT} WHERE id = ?", (row_id,)).fetchone())
            self._deferred.pop(row_id, None)  # a write left over from a claim given up
        return claimed, previous

    def release(self, record: RunRecord) -> RunRecord:
        """Give up the claim `record` holds, with the run's deferred write; returns the run as
        nobody's. Releasing a claim that is no longer held (taken over) changes nothing.
        Not synced before it returns (a claim lost to power loss is taken over; a deferred
        acknowledgement lost to it leaves its intent, reconciled): the next durable write, or
        `close`, syncs it."""
        cleared = dict.fromkeys(sorted(_CLAIM_COLUMNS))
        with self._transaction(durable=False) as db:
            deferred = self._take_deferred(record)
            if deferred:
                self._update_row(db, record, deferred)
            db.execute(
                f"UPDATE runs SET {', '.join(f'{c} = NULL' for c in cleared)} "
                "WHERE id = ? AND claim_owner = ?",
                (record.id, record.claim_owner),
            )
        return msgspec.structs.replace(record, **cleared)

    def renew(self, owners: list[str], expires: float) -> set[str]:
        """Push the leases of `owners`' claims to `expires`; returns those still held."""
        marks = ", ".join("?" * len(owners))
        with self._transaction(durable=False) as db:  # a lease lost to power loss: a reboot
            db.execute(
                f"UPDATE runs SET claim_expires = ? WHERE claim_owner IN ({marks})",
                (expires, *owners),
            )
            rows = db.execute(
                f"SELECT claim_owner FROM runs WHERE claim_owner IN ({marks})", owners
            ).fetchall()
        return {owner for (owner,) in rows}

    def _fence(self, db: sqlite3.Connection, record: RunRecord) -> None:
        """Inside a write: the run must still be held as `record` says, else nothing is written.
        The run's deferred write goes first, under the same fence."""
        deferred = self._take_deferred(record)
        if deferred:
            self._update_row(db, record, deferred)
            return
        row = db.execute("SELECT claim_owner FROM runs WHERE id = ?", (record.id,)).fetchone()
        if row is None:
            raise LedgerError(f"{self.path}: run {record.run_id} vanished from the ledger")
        if row[0] != record.claim_owner:
            raise ClaimLost(
                f"run {record.run_id}: its claim was taken over by another process; "
                "this upload stops and leaves the run to it"
            )

    # ------------------------------------------------------------ writing runs

    # The protocol's writes, by name: no caller picks a write mode. What each may lose, and why
    # that is safe, is said once, here.

    def update(self, record: RunRecord, **changes: Any) -> RunRecord:
        """Write `changes` to the run's row now, durable before this returns (carrying the run's
        deferred write), fenced by `record`'s claim; returns the new row. A run's `state` is
        written only by `evalpush.ledger.transitions`."""
        return self._write(record, self._no_state(changes), defer=False, durable=True)

    def record_intent(self, record: RunRecord, pending: str, **changes: Any) -> RunRecord:
        """An intent: `pending` says what is about to be sent (`upload.steps.intent`), written
        with `changes` and the run's deferred write in one fenced transaction, and on disk before
        this returns, so before its request is sent: after a crash or a power cut the row says
        what may have reached the platform, and a read settles it.

        One intent needs no sync of its own, and this method, not its caller, sees which: the
        one whose transaction carries the create's acknowledgement (the first batch's, made
        while `evaluation_id` is still deferred, `record_progress`). Then the run's last durable
        write is its create intent, synced before the create was sent; lost to a power cut, this
        write leaves that create intent, which is reconciled by a fresh lookup that adopts the
        evaluation the create made and lists its samples before any is sent: it covers this
        intent's request too. (A crash, not a power cut, keeps the write: every commit is in the
        file at once.) A run of one batch so waits for the disk twice, not three times."""
        with self._lock:
            covered = "evaluation_id" in self._deferred.get(record.id, {})
        changes = {**self._no_state(changes), "pending": pending}
        return self._write(record, changes, defer=False, durable=not covered)

    def acknowledge(self, record: RunRecord, **progress: Any) -> RunRecord:
        """The platform acknowledged the pending intent: `pending` cleared and `progress`
        (offsets, counts) written now, in one fenced transaction, not synced before this returns:
        a crash keeps it; a power cut may take the row back to its intent, which a read of the
        platform settles as after any crash. The next durable write syncs it."""
        changes = {**self._no_state(progress), "pending": None}
        return self._write(record, changes, defer=False, durable=False)

    def record_progress(self, record: RunRecord, **changes: Any) -> RunRecord:
        """`changes` go with the run's next write (its next intent, or its release), in that
        write's transaction; meanwhile this process reads the row with them. For what the
        protocol may lose to a crash before that write: the step a run reached, what its scan
        found, an acknowledgement whose next write follows with no request between. Losing
        them sends the run back to the intent or step before them, reconciled as after any
        crash: nothing is sent on their strength alone."""
        return self._write(record, self._no_state(changes), defer=True, durable=False)

    def set_state(self, record: RunRecord, state: State, **changes: Any) -> RunRecord:
        """`update` with a new `state`: for `evalpush.ledger.transitions` alone."""
        return self._write(record, {**changes, "state": State(state)}, defer=False, durable=True)

    def record_state(self, record: RunRecord, state: State, **changes: Any) -> RunRecord:
        """`record_progress` with a new `state` (the upload began; the platform confirmed the
        finalize, written with the release): for `evalpush.ledger.transitions` alone."""
        return self._write(record, {**changes, "state": State(state)}, defer=True, durable=False)

    @staticmethod
    def _no_state(changes: dict[str, Any]) -> dict[str, Any]:
        if "state" in changes:
            raise ValueError("a run's state changes only through evalpush.ledger.transitions")
        return changes

    def _take_deferred(self, record: RunRecord) -> dict[str, Any]:
        """The run's deferred write, taken (inside the write that carries it, under the lock)."""
        return self._deferred.pop(record.id, None) or {}

    def _update_row(
        self, db: sqlite3.Connection, record: RunRecord, changes: dict[str, Any]
    ) -> None:
        """Inside a write: `changes` to the run's row, fenced by `record`'s claim."""
        assignments = ", ".join(f"{name} = ?" for name in changes)
        cursor = db.execute(
            f"UPDATE runs SET {assignments} WHERE id = ? AND claim_owner IS ?",
            (*changes.values(), record.id, record.claim_owner),
        )
        if cursor.rowcount == 0:
            self._fence(db, record)

    def _write(
        self, record: RunRecord, changes: dict[str, Any], *, defer: bool, durable: bool
    ) -> RunRecord:
        unknown = changes.keys() - _WRITABLE_COLUMNS
        if unknown:
            raise ValueError(f"unknown ledger columns: {sorted(unknown)}")
        if "path" in changes:  # a moved run: both forms of its new path
            changes["path_raw"] = paths.raw(changes["path"])
            changes["path"] = paths.display(changes["path"])
        for name in _MESSAGE_COLUMNS & changes.keys():
            if changes[name] is not None:
                changes[name] = _stored_text(changes[name])
        changes["updated_at"] = self._clock()
        if "last_error" in changes:
            changes["last_error_at"] = changes["updated_at"] if changes["last_error"] else None
        if defer:
            with self._lock:
                self._deferred.setdefault(record.id, {}).update(changes)
            return msgspec.structs.replace(record, **changes)
        with self._transaction(durable=durable) as db:
            self._update_row(db, record, {**self._take_deferred(record), **changes})
        return msgspec.structs.replace(record, **changes)

    def forget(self, record: RunRecord) -> None:
        """Drop the run; its evaluations are remembered as forgotten, so that a later upload of
        the same run creates a new evaluation instead of adopting one of them."""
        now = self._clock()
        with self._transaction() as db:
            self._fence(db, record)
            db.execute(
                "INSERT OR IGNORE INTO forgotten (run_id, evaluation_id, at) "
                "SELECT run_id, evaluation_id, ? FROM runs "
                "WHERE id = ? AND evaluation_id IS NOT NULL "
                "UNION SELECT ?, evaluation_id, ? FROM history WHERE run = ?",
                (now, record.id, record.run_id, now, record.id),
            )
            db.execute("DELETE FROM runs WHERE id = ?", (record.id,))

    def rename(self, record: RunRecord, run_id: str) -> RunRecord | None:
        """The run id its trace lines carry, for a run first recorded under a stand-in (a
        directory whose name is not a UUID, found before its first line named the run: see
        `runs.derive_run_id`). Only a waiting run nobody holds is renamed; if the ledger knows a
        run by that id already, the stand-in row is dropped and None returned (the other row is
        the run)."""
        with self._transaction() as db:
            taken = db.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            if taken:
                db.execute(
                    "DELETE FROM runs WHERE id = ? AND claim_owner IS NULL AND state = ?",
                    (record.id, State.WAITING),
                )
                return None
            cursor = db.execute(
                "UPDATE runs SET run_id = ?, updated_at = ? "
                "WHERE id = ? AND claim_owner IS NULL AND state = ? AND evaluation_id IS NULL",
                (run_id, self._clock(), record.id, State.WAITING),
            )
        return self.get(record.id) if cursor.rowcount else None

    def restart(
        self, record: RunRecord, *, outcome: Outcome, state: State, same_file: bool = False
    ) -> RunRecord:
        """Start the run's upload over: its current evaluation (if any) goes to `history` with
        `outcome`, its progress and set-aside records are cleared, in one transaction. A hold
        release (`evalpush retry`) is kept only for the `same_file`: it was for the bad lines a
        person saw."""
        now = self._clock()
        with self._transaction() as db:
            self._fence(db, record)
            if record.evaluation_id is not None:
                db.execute(
                    "INSERT OR REPLACE INTO history (run, evaluation_id, viewer_url, outcome, at) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (record.id, record.evaluation_id, record.viewer_url, outcome, now),
                )
            db.execute("DELETE FROM set_aside WHERE run = ?", (record.id,))
            db.execute(
                "UPDATE runs SET state = ?, reason = '', step = ?, file_device = NULL, "
                "file_inode = NULL, file_size = NULL, file_mtime_ns = NULL, "
                "file_ctime_ns = NULL, file_digest = NULL, upload_end = NULL, "
                "evaluation_id = NULL, viewer_url = NULL, pending = NULL, acked_offset = 0, "
                "acked_line = 0, samples_sent = 0, samples_seen = 0, bytes_sent = 0, "
                "totals = NULL, finalized_at = NULL, release_hold = ?, updated_at = ? "
                "WHERE id = ?",
                (state, Step.SCAN, record.release_hold if same_file else 0, now, record.id),
            )
            row = db.execute(f"{_SELECT} WHERE id = ?", (record.id,)).fetchone()
        return RunRecord(*row)

    # ------------------------------------------------------------ secrets at rest

    def scrub_secrets(self, *, rewrite: bool = False) -> int:
        """Scrub every text the ledger holds of the secrets registered now (`log.scrub`): an
        older evalpush stored what a server echoed as it was (a 422 quoting the key, one
        set-aside reason per refused sample). When anything was scrubbed (or with `rewrite`) the
        file is rebuilt (`VACUUM`) and the write-ahead log emptied: no stale copy is left in the
        free space of a page.
        One read of the distinct texts when there is nothing to do; returns how many changed."""
        rows = self._query(
            "SELECT reason FROM set_aside UNION SELECT reason FROM runs "
            "UNION SELECT last_error FROM runs WHERE last_error IS NOT NULL"
        )
        changed = {text: _stored_text(text) for (text,) in rows if _stored_text(text) != text}
        if changed:
            with self._transaction() as db:
                for text, scrubbed in changed.items():
                    db.execute("UPDATE set_aside SET reason = ? WHERE reason = ?", (scrubbed, text))
                    db.execute("UPDATE runs SET reason = ? WHERE reason = ?", (scrubbed, text))
                    db.execute(
                        "UPDATE runs SET last_error = ? WHERE last_error = ?", (scrubbed, text)
                    )
        if changed or rewrite:
            self._rewrite_file()
        return len(changed)

    def _rewrite_file(self) -> None:
        """Rebuild the file from its live rows (`VACUUM`) and empty the write-ahead log: what a
        row held before it was rewritten can linger in free space of any page, or in the log."""
        with self._lock:
            try:
                self._while_busy(lambda: self._db.execute("VACUUM"))
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error as exc:
                raise LedgerError(f"{self.path}: cannot rewrite the ledger: {exc}") from None

    # ------------------------------------------------------------ set-aside records and history

    def add_set_aside(self, record: RunRecord, items: list[SetAside]) -> None:
        if not items:
            return
        with self._transaction() as db:
            self._fence(db, record)
            db.executemany(
                "INSERT OR REPLACE INTO set_aside (run, line, offset, size, kind, reason) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                [
                    (record.id, i.line, i.offset, i.size, i.kind, _stored_text(i.reason))
                    for i in items
                ],
            )

    def set_aside(self, record: RunRecord) -> list[SetAside]:
        rows = self._query(
            "SELECT line, offset, size, kind, reason FROM set_aside WHERE run = ? ORDER BY offset",
            (record.id,),
        )
        return [
            SetAside(line, offset, size, SetAsideKind(kind), reason)
            for line, offset, size, kind, reason in rows
        ]

    def set_aside_count(self, record: RunRecord) -> int:
        return self._query("SELECT COUNT(*) FROM set_aside WHERE run = ?", (record.id,))[0][0]

    def set_aside_counts(self) -> dict[int, int]:
        return dict(self._query("SELECT run, COUNT(*) FROM set_aside GROUP BY run"))

    def history(self, record: RunRecord) -> list[HistoryRecord]:
        rows = self._query(
            "SELECT evaluation_id, viewer_url, outcome, at FROM history WHERE run = ? ORDER BY at",
            (record.id,),
        )
        return [HistoryRecord(*row) for row in rows]

    def earlier_evaluations(self, record: RunRecord) -> set[str]:
        """Evaluations of this run id that must not be adopted: its history, and those of an
        earlier ledger row of the same run that a person forgot."""
        rows = self._query(
            "SELECT evaluation_id FROM history WHERE run = ? "
            "UNION SELECT evaluation_id FROM forgotten WHERE run_id = ?",
            (record.id, record.run_id),
        )
        return {evaluation_id for (evaluation_id,) in rows}
