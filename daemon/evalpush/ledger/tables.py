"""The ledger's tables, defined once (SQLAlchemy Core) for both stores: the SQLite file and a
fleet's PostgreSQL database. A new ledger is created from them; an older one is brought to them
by the revisions in `evalpush/ledger/migrations` (`evalpush.ledger.migrating`).

- `runs`: a row per run, found by fixed-size digests (`run_key`: SHA-256 of the run id, unique;
  `path_key`: SHA-256 of `path_raw`), the values themselves kept whole in columns no index
  holds (a PostgreSQL btree refuses an entry over 2,704 bytes: a long run id or path stopped
  every daemon of a fleet). A run id that holds a NUL (which PostgreSQL text cannot) is stored
  as `evalpush-hex:` and its UTF-8 bytes in hex, reversibly (`stored_run_id`); so is one that
  starts with that mark. Its claim is in its `claim_*` columns (`evalpush.ledger.claims`).
- `set_aside`: the records set aside from a run; `history`: the evaluations it had before its
  current one; `forgotten`: evaluations of runs a person forgot, never to be adopted again.
- `daemons`: a row per daemon that used the ledger, with its heartbeat, STATUS line and gate.
"""

from __future__ import annotations

import hashlib

import sqlalchemy as sa

metadata = sa.MetaData()

_TEXT_NUL = "\\x00"


class Text(sa.TypeDecorator[str]):
    """Text as either store holds it: a NUL shown as `\\x00` (PostgreSQL text cannot hold one;
    a message may quote a run id, a platform may answer with one)."""

    impl = sa.Text
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: sa.Dialect) -> str | None:
        return value.replace("\0", _TEXT_NUL) if value is not None and "\0" in value else value


class Flag(sa.TypeDecorator[int]):
    """A yes/no kept as 0 or 1 in an integer column, on both stores (PostgreSQL does not cast
    a boolean to an integer)."""

    impl = sa.Integer
    cache_ok = True

    def process_bind_param(self, value: int | bool | None, dialect: sa.Dialect) -> int | None:
        return None if value is None else int(value)


RowId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
"""A row id: SQLite's rowid (only a column typed exactly INTEGER is one), PostgreSQL's bigint."""
Count = sa.BigInteger
Time = sa.Double  # Unix seconds
Bytes = sa.LargeBinary


def _zero() -> sa.TextClause:
    return sa.text("0")


runs = sa.Table(
    "runs",
    metadata,
    sa.Column("id", RowId, sa.Identity(), primary_key=True),
    sa.Column("run_id", Text, nullable=False),
    sa.Column("path", Text, nullable=False),  # for people: undecodable bytes shown as \xNN
    sa.Column("path_raw", Bytes, nullable=False),  # the path's bytes: what finds the directory
    sa.Column("kind", Text, nullable=False),
    sa.Column("state", Text, nullable=False),
    sa.Column("reason", Text, nullable=False, server_default=""),
    sa.Column("step", Text, nullable=False, server_default="scan"),
    sa.Column("file_device", Count),
    sa.Column("file_inode", Count),
    sa.Column("file_size", Count),
    sa.Column("file_mtime_ns", Count),
    sa.Column("file_ctime_ns", Count),
    sa.Column("file_digest", Bytes),
    sa.Column("upload_end", Count),
    sa.Column("env_id", Text),
    sa.Column("evaluation_id", Text),
    sa.Column("viewer_url", Text),
    sa.Column("pending", Text),
    sa.Column("acked_offset", Count, nullable=False, server_default=_zero()),
    sa.Column("acked_line", Count, nullable=False, server_default=_zero()),
    sa.Column("samples_sent", Count, nullable=False, server_default=_zero()),
    sa.Column("samples_seen", Count, nullable=False, server_default=_zero()),
    sa.Column("bytes_sent", Count, nullable=False, server_default=_zero()),
    sa.Column("totals", Bytes),
    sa.Column("release_hold", Flag, nullable=False, server_default=_zero()),
    sa.Column("attempts", sa.Integer, nullable=False, server_default=_zero()),
    sa.Column("last_error", Text),
    sa.Column("looked_up", Flag, nullable=False, server_default=_zero()),
    sa.Column("claim_owner", Text),
    sa.Column("claim_host", Text),
    sa.Column("claim_boot", Text),
    sa.Column("claim_pid", sa.Integer),
    sa.Column("claim_start", Count),
    sa.Column("claim_pidns", Text),
    sa.Column("claim_since", Time),
    sa.Column("claim_expires", Time),
    sa.Column("created_at", Time, nullable=False),
    sa.Column("updated_at", Time, nullable=False),
    sa.Column("finalized_at", Time),
    sa.Column("settles_at", Time),  # a waiting run: when the settle rule makes it ready
    sa.Column("last_error_at", Time),
    sa.Column("run_key", Bytes, nullable=False),
    sa.Column("path_key", Bytes, nullable=False),
    sa.Column("expected_traces", Count),  # what the run's config.toml expects (NULL: no count)
    # 1 while the run is followed: its evaluation is open and filled as its file is written
    sa.Column("following", Flag, nullable=False, server_default=_zero()),
    sa.Column("followed_at", Time),  # when a followed run's last stretch was acknowledged
)

SHORT = runs.c.expected_traces > runs.c.samples_seen
"""The runs that saw fewer lines than their config expects: a finalized one is partial unless
records set aside make up the difference (`RunRecord.missing_traces`). `runs_short` indexes
exactly these rows; a query finds them through it by this same condition and a state."""

sa.Index("runs_run_key", runs.c.run_key, unique=True)
sa.Index("runs_path_key", runs.c.path_key)
# `status` reads a million runs through these without reading every row: by state in the order
# they were updated (the daemon's queue too), and the short ones (a partial index).
sa.Index("runs_state_updated", runs.c.state, runs.c.updated_at)
sa.Index("runs_short", runs.c.state, runs.c.updated_at, sqlite_where=SHORT, postgresql_where=SHORT)
# The runs someone holds: what the lease's renewal and `status` look up.
_HELD = runs.c.claim_owner.is_not(None)
sa.Index("runs_claim_owner", runs.c.claim_owner, sqlite_where=_HELD, postgresql_where=_HELD)


def _run() -> sa.ForeignKey:
    """A run's row: its records go with it."""
    return sa.ForeignKey("runs.id", ondelete="CASCADE")


set_aside = sa.Table(
    "set_aside",
    metadata,
    sa.Column("run", RowId, _run(), primary_key=True),
    sa.Column("line", Count, nullable=False),
    sa.Column("offset", Count, primary_key=True),
    sa.Column("size", Count, nullable=False),
    sa.Column("kind", Text, nullable=False),
    sa.Column("reason", Text, nullable=False),
)

history = sa.Table(
    "history",
    metadata,
    sa.Column("run", RowId, _run(), primary_key=True),
    sa.Column("evaluation_id", Text, primary_key=True),
    sa.Column("viewer_url", Text),
    sa.Column("outcome", Text, nullable=False),
    sa.Column("at", Time, nullable=False),
)

forgotten = sa.Table(
    "forgotten",
    metadata,
    sa.Column("run_key", Bytes, primary_key=True),
    sa.Column("run_id", Text, nullable=False),
    sa.Column("evaluation_id", Text, primary_key=True),
    sa.Column("at", Time, nullable=False),
)

daemons = sa.Table(
    "daemons",
    metadata,
    sa.Column("id", Text, primary_key=True),
    sa.Column("host", Text, nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("version", Text, nullable=False),
    sa.Column("observer", Text, nullable=False, server_default=""),
    sa.Column("started_at", Time, nullable=False),
    sa.Column("seen_at", Time, nullable=False),
    sa.Column("lease_seconds", Time, nullable=False),
    sa.Column("stopped_at", Time),
    sa.Column("status", Text, nullable=False, server_default=""),
    sa.Column("gate", Text, nullable=False, server_default="{}"),  # `records.GateState` as JSON
    # The roots it follows runs under: a JSON list of each root's path bytes in hex; NULL in the
    # row of a daemon of an older evalpush, which does not say (`DaemonRecord.follows`).
    sa.Column("follows", Text),
)
# Every heartbeat drops the rows of daemons gone for a week; `status` lists the last heard first.
sa.Index("daemons_seen_at", daemons.c.seen_at)

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
