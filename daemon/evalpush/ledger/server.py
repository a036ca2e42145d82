"""The shared ledger: the ledger's tables in a PostgreSQL database, for a fleet of daemons on
several hosts sharing one output tree (`[ledger] url`).

`LedgerServer` offers what `evalpush.ledger.file.LedgerFile` offers (`transaction`, `query`, the
lock, the counters, `insert`), so `evalpush.ledger.store.Ledger` runs the same SQLAlchemy
statements on either, each rendered in its database's dialect.

- **One connection**, one lock, one short transaction a call, as with the file; reconnected at
  the next call after it broke.
- **Durability.** PostgreSQL makes a commit durable before it answers (`synchronous_commit`); a
  write the protocol may lose (`durable=False`) is committed with `synchronous_commit` off for
  that transaction alone: what the file's group commit does, the server's own way.
- **Claims.** A claim reads its run's row `FOR UPDATE SKIP LOCKED` (`row_lock`): a row another
  daemon is claiming at this instant is skipped, and the run is theirs (`Busy`), never waited for.
- **The database going away is an outage**: a call that finds the connection broken, or cannot
  connect, raises `LedgerUnavailable` at once (what it was writing may or may not have been
  committed; the upload stops there and resumes from the ledger as after a crash, reconciling
  with the platform). `wait_available` waits it out, probing, for whoever must.
- **Schema** creation and upgrades (`evalpush.ledger.migrating`) run under an advisory lock, in
  a transaction begun once it is held that reads the version first, so any number of hosts may
  start together.
- The password comes from the caller (`[ledger] password_file`, a systemd credential) or libpq
  (`PGPASSWORD`, `~/.pgpass`), never from the URL, which is shown (`where`).
"""

from __future__ import annotations

import contextlib
import threading
import urllib.parse
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from evalpush.core.errors import ConfigError, LedgerError, LedgerRefused, LedgerUnavailable
from evalpush.core.outage import AUTH, LEDGER, UNREACHABLE, OutageReporter, logged
from evalpush.ledger import migrating
from evalpush.ledger.file import Upgrade, engine_over
from evalpush.ledger.migrating import SCHEMA_VERSION
from evalpush.ledger.records import scrub_stored_texts
from evalpush.log import get_logger

if TYPE_CHECKING:
    import psycopg

CONNECT_TIMEOUT_SECONDS = 5
"""How long a connection attempt may take before the database counts as unreachable."""
PROBE_SECONDS = 2.0
"""How often `wait_available` tries to connect again while the database is unreachable."""
ADVISORY_LOCK = 0x6576_616C_7075_7368 & 0x7FFF_FFFF_FFFF_FFFF
"""The advisory lock the schema is created and upgraded under ('evalpush' in ASCII)."""

FIRST_SHARED_VERSION = 6
"""The first schema a shared ledger had: the revisions before it are the file's alone."""

_LEASE_NOW = sa.select(sa.cast(sa.extract("epoch", sa.func.clock_timestamp()), sa.Double))


def display_url(url: str) -> str:
    """The URL as shown: no password (the configuration refuses one; libpq's query options may
    still hold one) and no query."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = (f"{parts.username}@" if parts.username else "") + host
    if parts.port:
        netloc += f":{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


class LedgerServer:
    """The ledger in a PostgreSQL database. Thread-safe: one connection, one lock, one short
    transaction a call (as `LedgerFile`)."""

    path = None  # no file: what `status` and the metrics look at on disk is not there
    insert = staticmethod(postgresql.insert)
    """An INSERT with PostgreSQL's `ON CONFLICT` (the same words as SQLite's, another class)."""

    @staticmethod
    def lease_now(db: sa.Connection) -> float | None:
        """The clock leases are judged by: the database's, one for every host of the fleet (a
        host whose clock runs ahead must not take a live host's runs)."""
        return float(db.execute(_LEASE_NOW).scalar_one())

    def __init__(
        self,
        url: str,
        *,
        password: str | None = None,
        read_only: bool = False,
        busy_timeout_seconds: float = 10.0,
    ):
        self.url = url
        self.where = display_url(url)
        self.read_only = read_only
        self.file_version = SCHEMA_VERSION
        self.upgrade: Upgrade | None = None  # set when opening it upgraded an older version
        self.lock = threading.RLock()
        self.writes = 0
        self.syncs = 0  # commits the server made durable before answering
        self._password = password
        self._busy_timeout_seconds = busy_timeout_seconds
        self._connection: psycopg.Connection[Any] | None = None
        self.sql: sa.Connection | None = None
        self._snapshot: psycopg.Connection[Any] | None = None  # the connection `snapshot` reads
        self._outage = OutageReporter(LEDGER, logged(get_logger(stage="ledger", ledger=self.where)))
        try:
            import psycopg  # noqa: F401 - an extra: said here, before anything else is tried
        except ImportError:
            raise ConfigError(
                "ledger.url: a shared ledger needs PostgreSQL's driver, which this install "
                "lacks: pip install 'evalpush[postgres]'"
            ) from None
        self._engine = engine_over("postgresql+psycopg://", lambda: self._connection)
        with self.lock:
            self._connect()
            self._prepare()

    # ------------------------------------------------------------ the connection

    def _connect(self) -> sa.Connection:
        """The open connection, or a new one; `LedgerUnavailable` if none can be had."""
        import psycopg

        connection = self._connection
        if self.sql is not None and connection is not None:
            # Closed too: SQLAlchemy closes a connection it found lost (its invalidation).
            if not (connection.broken or connection.closed):
                return self.sql
        self._drop()
        lock_ms = int(self._busy_timeout_seconds * 1000)
        try:
            connection = psycopg.connect(
                self.url,
                password=self._password,
                autocommit=True,
                connect_timeout=CONNECT_TIMEOUT_SECONDS,
                application_name="evalpush",
                # A server that stops answering (a host gone, a network cut) is noticed in tens
                # of seconds, not the kernel's two hours.
                keepalives=1,
                keepalives_idle=10,
                keepalives_interval=5,
                keepalives_count=3,
                tcp_user_timeout=30000,
                options=f"-c lock_timeout={lock_ms}"
                + (" -c default_transaction_read_only=on" if self.read_only else ""),
            )
        except psycopg.OperationalError as exc:
            raise self._unavailable(exc) from None
        except psycopg.Error as exc:
            raise LedgerError(f"{self.where}: cannot open the ledger: {_said(exc)}") from None
        self._connection = connection
        try:
            self.sql = self._engine.connect()
        except sa.exc.DBAPIError as exc:
            raise self._unavailable(exc) from None
        self._outage.end()
        return self.sql

    def _drop(self) -> None:
        if self.sql is not None:
            with contextlib.suppress(Exception):  # a broken connection may fail to close
                self.sql.close()
            self.sql = None
        if self._connection is not None:
            with contextlib.suppress(Exception):
                self._engine.dispose()  # closes the connection
                self._connection.close()
            self._connection = None

    def _unavailable(self, exc: BaseException) -> LedgerUnavailable:
        """The database cannot be reached: an outage (`evalpush.core.outage`); the callers pause."""
        self._drop()
        if not self.read_only:  # a reader just fails, saying why
            self._outage.attempt()
            self._outage.start(AUTH if _login_refused(exc) else UNREACHABLE, _said(exc))
        if _login_refused(exc):
            return LedgerUnavailable(
                f"{self.where}: the database refused the login: {_said(exc)}; {PASSWORD_HINT}"
            )
        return LedgerUnavailable(f"{self.where}: the shared ledger cannot be reached: {_said(exc)}")

    @property
    def down_seconds(self) -> float | None:
        """How long the database has been unreachable; None while it is reachable."""
        return None if self._outage.mode is None else self._outage.seconds()

    def report_if_due(self) -> None:
        """While the database is unreachable, say so again when a report is due."""
        with self.lock:
            self._outage.report_if_due()

    def wait_available(self, stop: threading.Event) -> bool:
        """Wait until the database answers again (trying every `PROBE_SECONDS`) or `stop` is
        set; whether it answers."""
        while not stop.is_set():
            with self.lock:
                try:
                    self._connect().exec_driver_sql("SELECT 1")
                    return True
                except LedgerUnavailable:
                    pass
                except Exception as exc:  # noqa: BLE001 - the connection broke while probing
                    self._unavailable(exc)
            self.report_if_due()
            stop.wait(PROBE_SECONDS)
        return False

    def _prepare(self) -> None:
        """Create the tables, or upgrade them, under the advisory lock."""
        sql = self.sql
        assert sql is not None
        try:
            found = self._version(sql)
            if found == SCHEMA_VERSION:
                return
            if self.read_only:
                raise LedgerError(
                    f"{self.where}: no evalpush ledger in this database yet (the first daemon "
                    "or push with this url creates it)"
                    if found == 0
                    else f"{self.where}: schema {found}, not this evalpush's "
                    f"{SCHEMA_VERSION}: `evalpush migrate` upgrades it"
                )
            # The lock is the session's, taken before the transaction begins: a transaction
            # that began first would look at the tables as they were before it was granted.
            sql.execute(sa.select(sa.func.pg_advisory_lock(ADVISORY_LOCK)))
            try:
                with self._began(sql):
                    found = self._version(sql)  # another host may have upgraded it meanwhile
                    if found != SCHEMA_VERSION:
                        migrating.upgrade(sql, found)
                        if found:
                            self.upgrade = Upgrade(self.where, found, SCHEMA_VERSION, None)
            finally:
                if self._connection is not None and not self._connection.broken:
                    sql.execute(sa.select(sa.func.pg_advisory_unlock(ADVISORY_LOCK)))
        except LedgerError:
            raise
        except Exception as exc:
            raise self._failure("open", exc) from None

    def _version(self, sql: sa.Connection) -> int:
        try:
            found = migrating.version(sql)
        except LedgerError as exc:
            raise LedgerError(f"{self.where}: {exc}; upgrade evalpush on this host") from None
        if 0 < found < FIRST_SHARED_VERSION:
            raise LedgerError(
                f"{self.where}: schema {found}: this evalpush cannot upgrade it "
                f"to {SCHEMA_VERSION} (a shared ledger began at {FIRST_SHARED_VERSION})"
            )
        return found

    def _failure(self, doing: str, exc: BaseException) -> LedgerError:
        """A failed call as the ledger's error: the connection gone is an outage."""
        import psycopg

        if isinstance(exc, sa.exc.DBAPIError) and exc.orig is not None:
            exc = exc.orig  # what the driver said, SQLAlchemy's words aside
        connection = self._connection
        if (
            connection is None
            or connection.broken
            or connection.closed
            or (isinstance(exc, psycopg.OperationalError) and _connection_lost(exc))
        ):
            return self._unavailable(exc)
        if (
            isinstance(exc, psycopg.DataError)
            or (getattr(exc, "sqlstate", None) or "")[:2] in _REFUSED
        ):
            return LedgerRefused(f"{self.where}: the shared ledger cannot hold: {_said(exc)}")
        return LedgerError(f"{self.where}: cannot {doing} the ledger: {_said(exc)}")

    # ------------------------------------------------------------ the face LedgerFile shares

    def close(self) -> None:
        with self.lock:
            self._drop()

    @contextlib.contextmanager
    def transaction(self, *, durable: bool = True) -> Iterator[sa.Connection]:
        """One write transaction; `durable`: committed with `synchronous_commit` on."""
        if self.read_only:
            raise LedgerError(f"{self.where}: opened read-only")
        with self.lock:
            sql = self._connect()
            try:
                # One round trip opens it, with the commit's durability.
                with self._began(sql, _BEGIN if durable else _BEGIN_UNSYNCED):
                    yield sql
            except LedgerError:
                raise
            except Exception as exc:
                if _is_database_error(exc):
                    raise self._failure("write", exc) from None
                raise
            self.writes += 1
            self.syncs += durable

    @contextlib.contextmanager
    def _began(self, sql: sa.Connection, begin: str = "BEGIN") -> Iterator[None]:
        """A transaction on `sql`, committed at the end, rolled back on an error (unless the
        connection broke: then the server rolled it back)."""
        sql.exec_driver_sql(begin)
        try:
            yield
        except BaseException:
            if self._connection is not None and not self._connection.broken:
                sql.exec_driver_sql("ROLLBACK")
            raise
        sql.exec_driver_sql("COMMIT")

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[None]:
        """Every `query` made inside reads the ledger as of one moment: one `REPEATABLE READ
        READ ONLY` transaction (its first read takes the snapshot; writers are not blocked by
        it). The lock is held throughout. A connection that breaks meanwhile is not replaced
        inside it (a new one would read another moment): each read after is a `LedgerError`."""
        with self.lock:
            sql = self._connect()
            try:
                sql.exec_driver_sql(_BEGIN_SNAPSHOT)
            except Exception as exc:
                if _is_database_error(exc):
                    raise self._failure("read", exc) from None
                raise
            self._snapshot = self._connection
            try:
                yield
            finally:
                self._snapshot = None
                if self._connection is not None and not self._connection.broken:
                    with contextlib.suppress(Exception):  # it wrote nothing: nothing to lose
                        sql.exec_driver_sql("ROLLBACK")

    def query(self, statement: sa.Executable, params: dict[str, Any] | None = None) -> list[Any]:
        """The rows `statement` reads (outside any write transaction; inside `snapshot`, as of
        its moment)."""
        with self.lock:
            if self._snapshot is not None and self._snapshot is not self._connection:
                raise LedgerUnavailable(
                    f"{self.where}: the shared ledger's connection was lost in the middle of "
                    "this read"
                )
            sql = self._connect()
            try:
                return sql.execute(statement, params).all()
            except Exception as exc:
                if _is_database_error(exc):
                    raise self._failure("read", exc) from None
                raise

    def scrub_secrets(self, *, rewrite: bool = False) -> int:
        """Scrub every text the ledger holds of the secrets registered now; how many changed.
        (The rows' older versions are the server's to reclaim: `rewrite` has no file to
        rebuild here.)"""
        if self.read_only:
            return 0
        return scrub_stored_texts(self.query, self.transaction)


_BEGIN = "BEGIN"
_BEGIN_UNSYNCED = "BEGIN; SET LOCAL synchronous_commit TO off"
_BEGIN_SNAPSHOT = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"


def _is_database_error(exc: BaseException) -> bool:
    import psycopg

    return isinstance(exc, psycopg.Error | sa.exc.DBAPIError)


_REFUSED = ("22", "54")
"""SQLSTATE classes of a value the database refused (a data exception: NUL in text, a byte
sequence not valid in its encoding, a value out of range; a program limit: an index entry
past its size): one run's, not the ledger's."""

_LOST = ("57P01", "57P02", "57P03", "08000", "08003", "08006", "08001", "08004")
"""SQLSTATEs of a connection ended or refused: an administrator's shutdown, a crash shutdown,
a server starting up or going down, and the connection exceptions."""


def _connection_lost(exc: BaseException) -> bool:
    sqlstate = getattr(exc, "sqlstate", None)
    return sqlstate is None or sqlstate in _LOST


LOGIN_REFUSED = ("password authentication failed", "no password supplied", "authentication failed")
"""What libpq says when the server refused the login (SQLSTATE 28P01/28000 when it has one)."""
PASSWORD_HINT = (
    "give the password in [ledger] password_file, the systemd credential ledger-password, or "
    "libpq's PGPASSWORD / ~/.pgpass"
)


def _login_refused(exc: BaseException) -> bool:
    """Whether the server answered, and refused the login (a wrong or missing password)."""
    if getattr(exc, "sqlstate", None) in ("28P01", "28000"):
        return True
    said = str(exc).lower()
    return any(words in said for words in LOGIN_REFUSED)


def _said(exc: BaseException) -> str:
    """What the driver said, on one line (libpq's messages span several)."""
    return " ".join(str(exc).split()) or type(exc).__name__
