"""The ledger's rows as this process reads them: a run (`RunRecord`), an evaluation it had
before (`HistoryRecord`), a daemon's heartbeat (`DaemonRecord`, with its `GateState`), and
which columns each kind of write may touch."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import sqlalchemy as sa

from evalpush.core import paths
from evalpush.core.states import State
from evalpush.ledger.claims import Holder
from evalpush.ledger.tables import ESCAPED_RUN_ID, daemons, loaded_run_id, runs, set_aside
from evalpush.log import scrub


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
    expected_traces: int | None  # what the run's config.toml expects (None: it names no count)
    following: int  # 1 while its open evaluation is filled as the run is written (followed)
    followed_at: float | None  # when its last stretch was acknowledged (a followed run)

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

    def missing_traces(self, set_aside: int) -> int:
        """How many of the traces its config expects a finalized run's evaluation lacks (the
        run is partial when this is over 0): every line seen counts, set aside (`set_aside`) or
        sent; 0 when the config names no count or the run is not finalized."""
        if self.expected_traces is None or self.state != State.FINALIZED:
            return 0
        return max(0, self.expected_traces - self.samples_seen - set_aside)


def run_record(row: Any) -> RunRecord:
    """A `runs` row read with `SELECT` (or `RETURNING` its `RUN_COLUMNS`): its run id as it
    is, not as stored (`tables.stored_run_id`)."""
    if row[1].startswith(ESCAPED_RUN_ID):
        row = (row[0], loaded_run_id(row[1]), *row[2:])
    return RunRecord(*row)


COLUMNS = list(RunRecord.__struct_fields__)
RUN_COLUMNS = [runs.c[name] for name in COLUMNS]
SELECT = sa.select(*RUN_COLUMNS)
MESSAGE_COLUMNS = {"reason", "last_error"}
CLAIM_COLUMNS = {c for c in COLUMNS if c.startswith("claim_")}
WRITABLE_COLUMNS = set(COLUMNS) - CLAIM_COLUMNS - {"id", "run_id", "path_raw", "created_at"}
"""What `set_state` may write: not the run's identity, not its claim (`claim`/`release` do);
`path` writes `path_raw` and `path_key` with it. `update` writes the same, less `state`."""


class HistoryRecord(msgspec.Struct, frozen=True, gc=False):
    evaluation_id: str
    viewer_url: str | None
    outcome: str  # "superseded", "deleted", "closed", "cancelled" or "duplicate"
    at: float


HEARTBEAT_SECONDS = 5.0
"""How often a daemon writes its heartbeat row (with its STATUS line and its gate)."""
LATE_HEARTBEATS = 3
"""A daemon whose heartbeat is this many periods late is not heard from: shown so at once,
not after its lease (which only says when its runs may be taken over)."""


class GateState(msgspec.Struct, frozen=True, gc=False):
    """A daemon's view of the platform, as its heartbeat row carries it for `status` (the
    gate's snapshot): its mode (open, unreachable, auth, paused), since when and the next probe
    (Unix times), probes tried, runs waiting, and why (scrubbed, like every stored message)."""

    mode: str = "open"
    since: float | None = None
    attempts: int = 0
    next_probe_at: float | None = None
    runs_waiting: int = 0
    reason: str = ""


class DaemonRecord(msgspec.Struct, frozen=True, gc=False):
    """One row of `daemons`: a daemon that used the ledger, and its last heartbeat. It is the
    one channel a daemon tells `status` by, on either store: who it is, its STATUS line, its
    gate."""

    id: str
    host: str
    pid: int
    version: str
    observer: str
    started_at: float
    seen_at: float
    lease_seconds: float
    stopped_at: float | None
    status: str
    gate: GateState
    follows: tuple[str, ...] | None = None
    """The roots it follows runs under while they are written: each root's path bytes, in
    hex (a path need not be UTF-8); none for a daemon that follows no run. None: a daemon of an
    evalpush from before schema 13, which does not say (still running over a ledger a newer
    `push` upgraded); it may follow a run under any root."""

    def silent_after(self) -> float:
        """How long after its last heartbeat it counts as not heard from."""
        return min(self.lease_seconds, LATE_HEARTBEATS * HEARTBEAT_SECONDS)

    def running(self, now: float, alive: Callable[[Holder], bool] | None = None) -> bool:
        """Whether it still runs, as far as can be told: not stopped, its heartbeat not
        `LATE_HEARTBEATS` periods late, and (with `alive`, the claims' judge) its process not
        seen gone where this process can see it (the same host and PID namespace)."""
        if self.stopped_at is not None or now - self.seen_at >= self.silent_after():
            return False
        holder = self.as_holder()
        return alive is None or holder is None or alive(holder)

    def follows_run_at(self, path_raw: bytes) -> bool:
        """Whether a run at `path_raw` (its path's bytes) is under a root it follows runs in
        (any, for a daemon that does not say: a `push` that took it for one following nothing
        finalized a run it followed short, which it then superseded with a second evaluation)."""
        if self.follows is None:
            return True
        return any(
            path_raw.startswith(bytes.fromhex(root).rstrip(b"/") + b"/") for root in self.follows
        )

    def process_lives(self, alive: Callable[[Holder], bool]) -> bool:
        """Whether its process still runs, late heartbeat or not (a loop that is stuck says
        nothing new): not stopped, and `alive` (the claims' judge: the process itself where
        this process can see it, else its heartbeat)."""
        holder = self.as_holder()
        return self.stopped_at is None and holder is not None and alive(holder)

    def as_holder(self) -> Holder | None:
        """The daemon as the claims' `Holder` (its id is `host/boot/pidns/pid/start`), for
        `holder_alive`; None for an id of another shape."""
        parts = self.id.split("/")
        if len(parts) != 5 or not parts[3].isdigit() or not parts[4].isdigit():
            return None
        host, boot, pidns, pid, start = parts
        expires = self.seen_at + self.silent_after()
        return Holder("", host, boot, int(pid), int(start), pidns, self.seen_at, expires)

    def holds(self, holder: Holder) -> bool:
        """Whether `holder` (a run's claim) is this daemon's process."""
        mine = self.as_holder()
        if mine is None:
            return (holder.host, holder.pid) == (self.host, self.pid)
        return (mine.host, mine.boot, mine.pidns, mine.pid) == (
            holder.host,
            holder.boot,
            holder.pidns,
            holder.pid,
        )


DAEMON_COLUMNS = [daemons.c[name] for name in DaemonRecord.__struct_fields__]


def daemon_record(row: Any) -> DaemonRecord:
    """A `daemons` row read as `DAEMON_COLUMNS` lists them (its gate and roots stored as
    JSON)."""
    return DaemonRecord(
        *row[:-2],
        msgspec.json.decode(row[-2], type=GateState),
        None if row[-1] is None else msgspec.json.decode(row[-1], type=tuple[str, ...]),
    )


_MESSAGES = (set_aside.c.reason, runs.c.reason, runs.c.last_error)
"""The columns that hold what a server said: where an older evalpush may have stored a key."""


def scrub_stored_texts(query: Callable[[Any], list[Any]], transaction: Callable[[], Any]) -> int:
    """Scrub every text a ledger holds (what servers said: set-aside reasons, a run's reason
    and last error) of the secrets registered now, through its store's `query` and
    `transaction`; how many distinct texts changed. One read when there is nothing to do."""
    texts = sa.union(*(sa.select(c).where(c.is_not(None)) for c in _MESSAGES))
    rows = query(texts)
    changed = {text: stored_text(text) for (text,) in rows if stored_text(text) != text}
    if changed:
        with transaction() as db:
            for text, scrubbed in changed.items():
                # Found by the text as stored: an older file holds a NUL as it was, which the
                # column's own type would write (and so compare) as `\\x00`.
                stored = sa.literal(text, sa.Text())
                for column in _MESSAGES:
                    db.execute(
                        sa.update(column.table).where(column == stored).values({column: scrubbed})
                    )
    return len(changed)


def stored_text(text: str) -> str:
    """Text as it may be stored: secrets scrubbed (errors can quote what a server echoed
    back), lone surrogates (non-UTF-8 file names) escaped, which SQLite cannot encode, and NUL
    shown as `\\x00`, which PostgreSQL text cannot hold (a message may quote a run id)."""
    return paths.printable(scrub(text)).replace("\0", "\\x00")
