"""The ledger's file: one SQLite database opened safely, brought to this version, and written
one short transaction at a time, each made durable when asked (a group commit).

Statements run through SQLAlchemy (`sql`, over this module's own sqlite3 connection `db`, in
autocommit: each transaction is begun and committed here, `BEGIN IMMEDIATE`). Schema creation
and every migration (`evalpush.ledger.migrating`) run inside one such transaction that reads
the schema version first, so any number of processes may open a new or an old ledger at once.

Durability: a WAL journal. A write is durable (it survives power loss, not just a crashed
process) once the write-ahead log is synced after it: `transaction(durable=True)` syncs it
(`fsync`, the one SQLite's `synchronous=FULL` does) after the commit and outside the lock, so
writes of several runs committed meanwhile share one sync. Which write must be durable is the
protocol's business, said once by `evalpush.ledger.store.Ledger`'s named writes.

The file is created with mode 0600 in a 0700 directory, and a `state.db` that is a symlink or
not a regular file is refused. A reader (`read_only`: `status`, `check`) creates no file and
changes none: see `LedgerFile._read_connection`; what it shows it may read as of one moment
(`LedgerFile.snapshot`: one read transaction). Every SQLite failure (full disk, locked or
corrupt file) surfaces as `LedgerError` naming the file: the upload stops rather than carry on
with progress it cannot record. What a server echoed is stored scrubbed of secrets, and an older ledger's texts are
scrubbed and the file rebuilt when it is upgraded.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import math
import os
import shutil
import sqlite3
import stat
import struct
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import sqlalchemy as sa
from sqlalchemy.dialects import sqlite
from sqlalchemy.pool import StaticPool

from evalpush.core.errors import LedgerError, LedgerRefused
from evalpush.ledger import migrating
from evalpush.ledger.migrating import SCHEMA_VERSION
from evalpush.ledger.records import scrub_stored_texts
from evalpush.log import get_logger, scrub

T = TypeVar("T")

LEDGER_FILE = "state.db"
WAL_RETRY_SECONDS = 0.01
BUSY_SLICE_SECONDS = 0.1
"""With a stop event, SQLite waits this long at a time for another process's lock; between
slices the stop is looked at."""
SHARED_LOCK = (0x40000000 + 2, 510)
"""SQLite's shared lock on a database file (unix VFS: `SHARED_FIRST`, `SHARED_SIZE`). A reader
holding a read lock on it keeps a closing writer from checkpointing and deleting the `-wal`
and `-shm` files (that writer needs the range exclusively), as SQLite's own readers do."""
STOP_BUSY_SECONDS = 1.0
"""Once a stop is requested, this long in all is what the ledger still waits for another
process's lock (one evalpush stopped mid-write by Ctrl-Z holds it until it continues): the
writes a stop makes (interrupted, release) are worth a moment, not the busy timeout twice."""


class Upgrade(msgspec.Struct, frozen=True):
    """A ledger brought from an older schema to this evalpush's, and where the old file went
    (a shared ledger's database has no backup of ours: `pg_dump` is the operator's)."""

    path: Path | str
    from_version: int
    to_version: int
    backup: Path | None

    @property
    def message(self) -> str:
        kept = f"backup: {self.backup}" if self.backup is not None else f"in {self.path}"
        return f"ledger upgraded {self.from_version} -> {self.to_version} ({kept})"

    def log(self) -> None:
        get_logger(stage="ledger").warning(
            self.message,
            ledger=str(self.path),
            backup=None if self.backup is None else str(self.backup),
            from_version=self.from_version,
            to_version=self.to_version,
        )


def engine_over(dialect: str, connection: Callable[[], Any]) -> sa.Engine:
    """SQLAlchemy over a store's one connection (`connection()` returns it as it is now): it
    runs statements on it, never begins or ends a transaction of its own (autocommit: the
    store's `transaction` does), and hands it back as it is. `dialect`: `sqlite://`, or
    `postgresql+psycopg://`."""
    return sa.create_engine(
        dialect,
        creator=connection,
        poolclass=StaticPool,
        isolation_level="AUTOCOMMIT",
        pool_reset_on_return=None,
    )


def default_path(state_dir: Path) -> Path:
    return state_dir / LEDGER_FILE


STATE_DIR_FIX = "give this user the directory, or set state.dir / --state-dir"


def refuse_uncreatable(path: Path) -> None:
    """A missing ledger file `path` that could not be created here (its directory's nearest
    existing ancestor is not a directory, or this user may not write in it): a LedgerError,
    the refusal of a command opening it to write (and `check`'s ledger row, which only reads)."""
    if os.path.lexists(path):
        return
    parent = path.parent
    while not os.path.lexists(parent) and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        reason = f"{parent} is not a directory"
    elif not os.access(parent, os.W_OK | os.X_OK):
        reason = f"{parent} is not writable by this user"
    else:
        return
    raise LedgerError(
        f"{path}: cannot open the ledger: it cannot be created ({reason}); {STATE_DIR_FIX}"
    )


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


class LedgerFile:
    """The ledger's SQLite file. Thread-safe: one connection, one lock, one short transaction a
    call; `transaction(durable=...)` is the one way to write, `query` the one way to read."""

    insert = staticmethod(sqlite.insert)
    """An INSERT with SQLite's `ON CONFLICT` (the same words as PostgreSQL's, another class)."""

    @staticmethod
    def lease_now(db: Any) -> float | None:
        """The clock leases are judged by: None, this host's own (one host shares the file)."""
        return None

    def __init__(
        self,
        path: Path,
        *,
        busy_timeout_seconds: float,
        read_only: bool,
        stop: threading.Event | None,
    ):
        self.path = path
        self.where = str(path)
        self.read_only = read_only
        self.file_version = SCHEMA_VERSION
        self.upgrade: Upgrade | None = None
        self._busy_timeout_seconds = busy_timeout_seconds
        self._stop = stop
        self._stopped_at: float | None = None  # when a wait first saw the stop (monotonic)
        self.lock = threading.RLock()
        self._file: tuple[int, int] | None = None  # (device, inode) of the file opened
        self._upgraded_from: int | None = None
        self._sync_lock = threading.Lock()
        self._committed = 0  # write transactions committed by this process
        self._synced = 0  # of those, how many the last sync of the log covered
        self._log_fd: int | None = None  # the write-ahead log, opened at the first sync
        self._shared_fd: int | None = None  # a reader's, holding SQLite's shared lock
        self._immutable = False  # a reader's connection ignores locks: checked at each read
        self._in_snapshot = False  # inside `snapshot`: one read transaction
        self._snapshot_of: tuple[int, int] | None = None  # the immutable file as it began
        self.writes = 0  # write transactions committed (what bench/many_runs.py counts)
        self.syncs = 0  # syncs of the write-ahead log
        self._engine = engine_over("sqlite://", lambda: self.db)
        self.sql: sa.Connection | None = None
        self._open(path)
        if stop is not None:
            self.db.execute(f"PRAGMA busy_timeout = {int(BUSY_SLICE_SECONDS * 1000)}")
        if self._upgraded_from:
            # An older evalpush stored what servers echoed as it was, and what it deleted stays
            # in free space: its texts are scrubbed (of the secrets known so far: `push` scrubs
            # again once it has the key) and the file rebuilt from its live rows.
            self.scrub_secrets(rewrite=True)

    def _connect(self, path: Path, *, query: str = "") -> sqlite3.Connection:
        """A connection to `path`; with `query`, through a SQLite URI with those parameters."""
        target: str | Path = (
            f"file:{urllib.parse.quote(os.fsencode(path))}?{query}" if query else path
        )
        return sqlite3.connect(
            target,
            uri=bool(query),
            check_same_thread=False,
            isolation_level=None,
            timeout=self._busy_timeout_seconds,
        )

    def _bind(self, db: sqlite3.Connection) -> None:
        """Run statements on `db` from now on (the connection before it, if any, closed)."""
        if self.sql is not None:
            self.sql.close()
            self._engine.dispose()  # closes the connection before
        self.db = db
        self.sql = self._engine.connect()

    def _open(self, path: Path) -> None:
        try:
            self._check_file(path)
            self._bind(self._read_connection() if self.read_only else self._connect(path))
        except (OSError, sqlite3.Error) as exc:
            self._unshare()
            raise LedgerError(f"{path}: cannot open the ledger: {exc}") from None
        try:
            if self.read_only:
                while True:
                    self.file_version = self._version()
                    if self.file_version != SCHEMA_VERSION:
                        self._read_upgraded_copy()
                    if not self._writer_came():
                        break
                    self._bind(self._read_connection())  # read again, through the writer's log
                if self.file_version != SCHEMA_VERSION:
                    self._immutable = False  # a copy in memory: nobody else writes it
            else:
                self._write_ahead_log(self.db)
                # No sync by SQLite at each commit: `_sync` does it after the commit, outside
                # the lock, for every write that must be durable (see the module's docstring).
                # A checkpoint still syncs the log before and the database after.
                self.db.execute("PRAGMA synchronous=NORMAL")
                self._upgraded_from = self._migrate(before=self._back_up)
                self._committed = int(self.db.total_changes > 0)  # synced with the next write
            # After migrating: a table rebuilt must not cascade to its references.
            self.db.execute("PRAGMA foreign_keys=ON")
        except (sqlite3.Error, sa.exc.DBAPIError) as exc:
            self._close_connection()
            self._unshare()
            raise LedgerError(self._unusable(_sqlite_error(exc))) from None
        except LedgerError:
            self._close_connection()
            self._unshare()
            raise

    def _version(self) -> int:
        """The file's schema version (`LedgerError`, naming the file, if a newer evalpush
        wrote it)."""
        try:
            return migrating.version(self.sql)
        except LedgerError as exc:
            raise LedgerError(f"{self.path}: {exc}") from None

    def _migrate(self, before: Callable[[int], None] | None = None) -> int | None:
        """Bring the file to `SCHEMA_VERSION` in one write transaction that reads the version
        first; the version it was at (0: a new file), None if it was current. Foreign keys are
        off (a table rebuilt must not cascade to its references). `before(version)` is called
        inside that transaction before any change to a file that has a version (the backup: no
        other process can write the file between it and the upgrade)."""
        if self._version() == SCHEMA_VERSION:  # versions only rise: no lock needed to see this
            return None
        self.db.execute("BEGIN IMMEDIATE")
        try:
            found = self._version()
            if found == SCHEMA_VERSION:  # another process migrated it meanwhile
                self.db.execute("COMMIT")
                return None
            if found and before is not None:
                before(found)
            migrating.upgrade(self.sql, found)
            if self.db.execute("PRAGMA foreign_key_check").fetchall():
                raise sqlite3.IntegrityError("the migration left rows without their run")
            self.db.execute("COMMIT")
            return found
        except BaseException:
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            raise

    def _close_connection(self) -> None:
        if self.sql is not None:
            self.sql.close()
            self.sql = None
        self._engine.dispose()

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
                if not _busy(exc) or time.monotonic() > deadline:
                    raise
            if time.monotonic() > deadline:
                raise sqlite3.OperationalError("cannot switch to WAL: database is locked")
            time.sleep(WAL_RETRY_SECONDS)

    def _read_connection(self) -> sqlite3.Connection:
        """A reader's connection, which creates no file beside the ledger and changes none
        (a `mode=ro` open of a WAL database creates its `-wal` and `-shm` files when it may:
        as root, on a service's state dir). `_check_file` took SQLite's shared lock on the file
        first, so a writer closing meanwhile leaves its `-wal` and `-shm` where they are.

        - No `-wal`: no process has the ledger open and every commit is in the file itself,
          read as immutable (without locks or the `-shm`). A writer that opens it from then on
          creates a `-wal` that stays while this reader lives: every read looks for it after
          (`_writer_came`) and, once it is there, is read again through it, so a checkpoint
          moving that writer's commits into the file while it was read never shows.
        - `-wal` and `-shm`: a writer has it open (or died): read-only through them, the
          `-shm` never written (`readonly_shm`; without a live writer SQLite indexes the
          `-wal` in memory).
        - A `-wal` without its `-shm` (a writer died and the `-shm` was removed): the two
          copied to a private directory and read there, so the log's commits are read."""
        wal, shm = (os.path.lexists(f"{self.path}-{end}") for end in ("wal", "shm"))
        self._immutable = not wal
        if not wal:
            return self._connect(self.path, query="immutable=1")
        if shm:
            return self._connect(self.path, query="mode=ro&readonly_shm=1")
        return self._private_copy()

    def _writer_came(self) -> bool:
        """Whether a writer opened the ledger since this reader read it as immutable."""
        return self._immutable and os.path.lexists(f"{self.path}-wal")

    def _private_copy(self) -> sqlite3.Connection:
        """The ledger and its `-wal` copied to a private directory, SQLite's recovery of the
        log done there, and the result copied into memory."""
        copy = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        with tempfile.TemporaryDirectory(prefix="evalpush-ledger-") as private:
            aside = Path(private) / LEDGER_FILE
            for end in ("", "-wal"):
                shutil.copyfile(f"{self.path}{end}", f"{aside}{end}", follow_symlinks=False)
            source = sqlite3.connect(aside, isolation_level=None)
            try:
                source.backup(copy)
            finally:
                source.close()
        return copy

    def _share(self, fd: int) -> None:
        """SQLite's shared lock on the file, held by this reader's own open file description
        (an OFD lock: SQLite closing its descriptors does not release it), waited for while a
        closing writer holds the range for its checkpoint."""
        operation = getattr(fcntl, "F_OFD_SETLK", None)
        if operation is None:  # not Linux: read without it
            return
        start, length = SHARED_LOCK
        lock = struct.pack("hhqqi4x", fcntl.F_RDLCK, os.SEEK_SET, start, length, 0)
        deadline = time.monotonic() + self._busy_timeout_seconds
        while True:
            try:
                fcntl.fcntl(fd, operation, lock)
                return
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() > deadline:
                    raise
            time.sleep(WAL_RETRY_SECONDS)

    def _unshare(self) -> None:
        if self._shared_fd is not None:
            os.close(self._shared_fd)
            self._shared_fd = None

    def _check_file(self, path: Path) -> None:
        """Refuse a ledger that is a symlink or not a regular file (without creating a symlink's
        target); create a missing one, private, unless opening read-only."""
        if not self.read_only:
            refuse_uncreatable(path)
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
            if self.read_only:
                self._share(fd)
                self._shared_fd, fd = fd, -1
        finally:
            if fd >= 0:
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

    def _read_upgraded_copy(self) -> None:
        """The read-only file copied into memory and the copy upgraded: what a reader of an
        older ledger reads from then on, without a byte of the file changing."""
        copy = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        self.db.backup(copy)
        self._bind(copy)
        self._migrate()

    def _back_up(self, version: int) -> None:
        """Inside the upgrade's write transaction (which has written nothing yet):
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
        self.upgrade = Upgrade(self.path, version, SCHEMA_VERSION, backup)

    def close(self) -> None:
        """Close the file; whatever this process committed is durable first."""
        with self.lock:
            if not self.read_only and self._committed > self._synced:
                with contextlib.suppress(OSError):  # the next writer recovers what is lost
                    self._sync(self._committed)
            self._close_connection()
            self._unshare()
            if self._log_fd is not None:
                os.close(self._log_fd)
                self._log_fd = None

    @contextlib.contextmanager
    def transaction(self, *, durable: bool = True) -> Iterator[sa.Connection]:
        """One write transaction (`BEGIN IMMEDIATE`). `durable`: before this returns, the log is
        synced (`_sync`) after the commit, outside the lock."""
        if self.read_only:
            raise LedgerError(f"{self.path}: opened read-only")
        with self.lock:
            try:
                self._while_busy(lambda: self.db.execute("BEGIN IMMEDIATE"))
                try:
                    self._check_still_the_file()
                    yield self.sql
                except BaseException:
                    # SQLite may have rolled back already (SQLITE_FULL does): a second ROLLBACK
                    # would fail and hide the real error.
                    if self.db.in_transaction:
                        self.db.execute("ROLLBACK")
                    raise
                self.db.execute("COMMIT")
            except (sqlite3.Error, sa.exc.DBAPIError, OverflowError) as exc:
                with contextlib.suppress(sqlite3.Error):
                    self.db.execute("ROLLBACK")
                error = _sqlite_error(exc)
                if _past_limits(error):  # a value past SQLite's limits: one run's
                    raise LedgerRefused(f"{self.path}: the ledger cannot hold: {error}") from None
                raise LedgerError(
                    f"{self.path}: cannot write the ledger: {error}" + self._why_busy(error)
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
            except (sqlite3.OperationalError, sa.exc.OperationalError) as exc:
                if not _busy(_sqlite_error(exc)):
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
        if not _busy(exc):
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

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[None]:
        """Every `query` made inside reads the ledger as of one moment: one read transaction
        (`BEGIN`, deferred: its first read takes the snapshot; in WAL mode a writer is not
        blocked by it, nor it by a writer). The lock is held throughout: another thread's reads
        and writes wait for its end. A reader of the file as immutable (no process had it open)
        keeps reading the file as it was, a writer coming meanwhile or not (its commits go to
        its log); only a checkpoint changing the file under it ends the read with a
        `LedgerError` (`_check_unchanged`)."""
        with self.lock:
            try:
                self.db.execute("BEGIN")
            except sqlite3.Error as exc:
                raise LedgerError(f"{self.path}: cannot read the ledger: {exc}") from None
            self._snapshot_of = self._stat() if self._immutable else None
            self._in_snapshot = True
            try:
                yield
            finally:
                self._in_snapshot = False
                if self.db.in_transaction:  # an error may have ended it already
                    with contextlib.suppress(sqlite3.Error):
                        self.db.execute("ROLLBACK")  # it wrote nothing: nothing to commit

    def _stat(self) -> tuple[int, int] | None:
        """(size, mtime_ns) of the file now: what a checkpoint into it changes."""
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_size, st.st_mtime_ns)

    def _check_unchanged(self) -> None:
        """Inside a snapshot read as immutable: the file must be as it was when it began (a
        writer's checkpoint moves its commits into the file, which this reader, taking no
        locks, may have read halfway)."""
        if self._snapshot_of is not None and self._stat() != self._snapshot_of:
            raise LedgerError(
                f"{self.path}: cannot read the ledger: a process that opened it meanwhile "
                "rewrote the file under this read (a checkpoint); read it again"
            )

    def query(self, statement: sa.Executable, params: dict[str, Any] | None = None) -> list[Any]:
        """The rows `statement` reads (outside any write transaction; inside `snapshot`, as of
        its moment)."""
        with self.lock:
            try:
                rows = self._while_busy(lambda: self.sql.execute(statement, params).all())
                if self._in_snapshot:
                    self._check_unchanged()
                elif self._writer_came():  # read again through the writer's log
                    self._bind(self._read_connection())
                    rows = self._while_busy(lambda: self.sql.execute(statement, params).all())
                return rows
            except (sqlite3.Error, sa.exc.DBAPIError, OverflowError) as exc:
                error = _sqlite_error(exc)
                if _past_limits(error):
                    raise LedgerRefused(f"{self.path}: the ledger cannot hold: {error}") from None
                raise LedgerError(f"{self.path}: cannot read the ledger: {error}") from None

    def scrub_secrets(self, *, rewrite: bool = False) -> int:
        """Scrub every text the ledger holds of the secrets registered now (`log.scrub`): an
        older evalpush stored what a server echoed as it was (a 422 quoting the key, one
        set-aside reason per refused sample). When anything was scrubbed (or with `rewrite`) the
        file is rebuilt (`VACUUM`) and the write-ahead log emptied: no stale copy is left in the
        free space of a page.
        One read of the distinct texts when there is nothing to do; returns how many changed."""
        changed = scrub_stored_texts(self.query, self.transaction)
        if changed or rewrite:
            self._rewrite_file()
        return changed

    def _rewrite_file(self) -> None:
        """Rebuild the file from its live rows (`VACUUM`) and empty the write-ahead log: what a
        row held before it was rewritten can linger in free space of any page, or in the log."""
        with self.lock:
            try:
                self._while_busy(lambda: self.db.execute("VACUUM"))
                self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error as exc:
                raise LedgerError(f"{self.path}: cannot rewrite the ledger: {exc}") from None


def _sqlite_error(exc: BaseException) -> BaseException:
    """What SQLite (or Python's module) said: SQLAlchemy wraps it, its own words aside."""
    return exc.orig if isinstance(exc, sa.exc.DBAPIError) and exc.orig is not None else exc


def _past_limits(exc: BaseException) -> bool:
    """Whether SQLite refused a value past its limits (a text or blob too big: `DataError`),
    or Python's module did (an integer past 64 bits, which SQLite's integer cannot hold, as
    PostgreSQL's bigint cannot: a config expecting that many traces)."""
    return isinstance(exc, sqlite3.DataError | OverflowError)


def _busy(exc: BaseException) -> bool:
    """Whether SQLite said another connection holds the lock. (An error Python's module raises
    itself, such as a TEXT value that is not UTF-8, carries no SQLite error code.)"""
    return getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_BUSY
