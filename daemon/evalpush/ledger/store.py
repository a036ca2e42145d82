"""The ledger: durable per-run progress, advanced only on acknowledgement.

One row per run, keyed by its run id, with the path it was last seen at (`runs`); the records
set aside from it (`set_aside`); the evaluations it had before its current one (`history`:
superseded, deleted, cancelled); and the evaluations of runs a person forgot (`forgotten`), which
a later upload of the same run must not adopt. The upload stage writes an intent (`pending`)
before every non-replayable request and clears it with the acknowledgement, in one transaction
each, so after `kill -9` at any instant the row says exactly what may have reached the platform.
Where the rows live is the store's business: the SQLite file in the state dir
(`evalpush.ledger.file`: opening, upgrading, transactions, syncs) or a PostgreSQL database a
fleet of daemons shares (`evalpush.ledger.server`); every statement here runs on both.

Several processes share one ledger. A process works on a run only while it holds the run's
claim (columns `claim_*`, see `evalpush.ledger.claims`): `claim` takes it in one `BEGIN IMMEDIATE`
transaction (in PostgreSQL, on the row read `FOR UPDATE SKIP LOCKED`), and every write to a
run is fenced: it applies only while the claim is still the
one the writer read (`RunRecord.claim_owner`; none for a run nobody holds), else `ClaimLost`.

The ledger offers the protocol's writes by name, and each says what it may lose:
`record_intent` (durable before its request is sent; the ledger itself sees the one intent an
earlier synced one covers), `acknowledge` (written now, not synced: a power cut may take the row
back to its intent, reconciled), `record_progress` (carried by the run's next write: a crash may
take the row back to the step before; it belongs to the claim it was made under, and only a
write under that claim carries it, so a write of another thread refused by its fence never takes
it down with it), `update` (durable). The claim, its release and the
lease's renewal are not synced either: their loss to a power cut costs nothing but a takeover.
An intent still waits for the disk before its request is sent, without every other run waiting
behind it (the file's group commit).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import sqlalchemy as sa

from evalpush.core import paths
from evalpush.core.errors import Busy, LedgerError
from evalpush.core.setaside import SetAside
from evalpush.core.states import HistoryOutcome, State, Step
from evalpush.ledger.claims import Holder, held_by, taken_over
from evalpush.ledger.file import LedgerFile, Upgrade, default_path
from evalpush.ledger.migrating import SCHEMA_VERSION
from evalpush.ledger.reads import DeferredKey, LedgerReads, deferred_key
from evalpush.ledger.records import (
    CLAIM_COLUMNS,
    DAEMON_COLUMNS,
    MESSAGE_COLUMNS,
    RUN_COLUMNS,
    SELECT,
    WRITABLE_COLUMNS,
    DaemonRecord,
    GateState,
    HistoryRecord,
    RunRecord,
    daemon_record,
    run_record,
    stored_text,
)
from evalpush.ledger.server import LedgerServer
from evalpush.ledger.tables import (
    daemons,
    forgotten,
    history,
    path_key,
    run_key,
    runs,
    set_aside,
    stored_run_id,
)

_HELD_AS_READ = runs.c.claim_owner.is_not_distinct_from(sa.bindparam("held_by"))
"""A write's fence: the run is still held as the writer read it (by nobody, or by its claim)."""


class Ledger(LedgerReads):
    """The state database: runs, their claims, and the protocol's writes by name. Thread-safe."""

    def __init__(
        self,
        path: Path | None = None,
        *,
        clock: Any = time.time,
        busy_timeout_seconds: float = 10.0,
        read_only: bool = False,
        stop: threading.Event | None = None,
        store: LedgerServer | None = None,
    ):
        """`busy_timeout_seconds`: how long a write waits for another process holding the file
        (a second `evalpush` on the same state dir) before it is a `LedgerError`; once `stop`
        is set, at most `file.STOP_BUSY_SECONDS` more in all. `read_only` opens an existing
        ledger for reading only, which a user without write access may do, and never writes it:
        a ledger from an older evalpush is copied into memory (SQLite's online backup) and the
        copy upgraded and read (`file_version` says which version the file is at). A ledger
        opened to write is upgraded in place, after a backup of the old file beside it
        (`state.db.bak-vN`); `upgrade` then says so, for the caller to tell (the daemon logs
        it, a command prints it). `store`: a shared ledger's database instead of the file
        (`Ledger.shared`)."""
        if store is None:
            assert path is not None
            self._file: LedgerFile | LedgerServer = LedgerFile(
                path, busy_timeout_seconds=busy_timeout_seconds, read_only=read_only, stop=stop
            )
        else:
            self._file = store
        self.where = self._file.where
        """The ledger as people are shown it: the file's path, or the shared ledger's URL."""
        self.path = path
        """The ledger's file; None for a shared ledger (`where` names either)."""
        self.read_only = read_only
        self._clock = clock
        self._lock = self._file.lock
        self._transaction = self._file.transaction
        self._query = self._file.query
        self._insert_into = self._file.insert
        # A new run's row, built once for this store's dialect (its parameters name its columns).
        self._new_run = self._insert_into(runs).returning(runs.c.id)
        self._new_run_unless_known = self._new_run.on_conflict_do_nothing(
            index_elements=[runs.c.run_key]
        )
        # (row id, claim owner) -> changes for the next write under that claim: only a write
        # under the claim that deferred them carries them (one of another thread of this
        # process, refused by its fence, must not take them down with it).
        self._deferred: dict[DeferredKey, dict[str, Any]] = {}

    @classmethod
    def shared(
        cls,
        url: str,
        *,
        password: str | None = None,
        clock: Any = time.time,
        read_only: bool = False,
        busy_timeout_seconds: float = 10.0,
    ) -> Ledger:
        """The ledger a fleet shares, in the PostgreSQL database at `url` (created there, under
        an advisory lock, by the first to open it)."""
        store = LedgerServer(
            url,
            password=password,
            read_only=read_only,
            busy_timeout_seconds=busy_timeout_seconds,
        )
        return cls(clock=clock, read_only=read_only, store=store)

    @property
    def server(self) -> LedgerServer | None:
        """The shared ledger's database; None for the file."""
        return self._file if isinstance(self._file, LedgerServer) else None

    @classmethod
    def for_reading(cls, path: Path) -> Ledger:
        """Open to read (`status`): read-only, and a ledger from an older evalpush is read
        through an upgraded copy in memory, the file left as it is."""
        return cls(path, read_only=True)

    @property
    def file_version(self) -> int:
        """The schema version of the file as found (an older one is read through a copy)."""
        return self._file.file_version

    @property
    def upgrade(self) -> Upgrade | None:
        """The upgrade opening the file made, if it made one."""
        return self._file.upgrade

    @property
    def writes(self) -> int:
        """Write transactions this process committed (what bench/many_runs.py counts)."""
        return self._file.writes

    @property
    def syncs(self) -> int:
        """Syncs of the write-ahead log this process made."""
        return self._file.syncs

    def scrub_secrets(self, *, rewrite: bool = False) -> int:
        """Scrub every text the ledger holds of the secrets registered now (`LedgerFile.scrub_secrets`)."""
        return self._file.scrub_secrets(rewrite=rewrite)

    def close(self) -> None:
        """Close the file; whatever this process committed is durable first."""
        self._file.close()

    def snapshot(self) -> contextlib.AbstractContextManager[None]:
        """Read the ledger as of one moment: every read made inside (a listing's pages, its
        counts) sees the same ledger, whatever another process writes meanwhile. One read
        transaction of the store's (`LedgerFile.snapshot`, `LedgerServer.snapshot`), this
        ledger's other threads waiting for its end: for a command that only reads (`status`),
        never for the daemon's own reads."""
        return self._file.snapshot()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add(
        self, *, path: Path | str, run_id: str, kind: str, state: str, reason: str = ""
    ) -> RunRecord:
        """A new run nobody holds (`claim` adds one held by its caller)."""
        now = self._clock()
        with self._transaction() as db:
            row_id = self._insert(db, path=path, run_id=run_id, kind=kind, state=state, now=now)
            if reason:
                db.execute(
                    sa.update(runs).where(runs.c.id == row_id).values(reason=stored_text(reason))
                )
        record = self.get(row_id)
        assert record is not None
        return record

    def _insert(
        self,
        db: Any,
        *,
        path: Path | str,
        run_id: str,
        kind: str,
        state: str,
        now: float,
        unless_known: bool = False,
    ) -> int | None:
        """Inside a write: a new run's row; its id. `unless_known`: None, not an error, when the
        ledger knows the run id (another process added it meanwhile)."""
        raw = paths.raw(path)
        return db.execute(
            self._new_run_unless_known if unless_known else self._new_run,
            {
                "run_id": stored_run_id(run_id),
                "run_key": run_key(run_id),
                "path": paths.display(path),
                "path_raw": raw,
                "path_key": path_key(raw),
                "kind": kind,
                "state": state,
                "created_at": now,
                "updated_at": now,
            },
        ).scalar()

    # ------------------------------------------------------------ claims

    def claim(
        self,
        *,
        run_id: str,
        path: Path | str,
        kind: str,
        owner: str,
        process: Any,
        lease_seconds: float,
        alive: Callable[[Holder, float], bool],
    ) -> tuple[RunRecord, Holder | None]:
        """Take the run's claim for `owner` (of `process`, a `claims.Process`), adding the run if
        the ledger does not know it; returns the run and the dead holder it was taken over from.

        One transaction: read the claim, judge its holder with `alive`, write ours. `Busy` if a
        live process holds it. In the file the transaction holds the write lock (`BEGIN
        IMMEDIATE`); in PostgreSQL the row is read `FOR UPDATE SKIP LOCKED`: a row another
        daemon is claiming at this instant is not there for this one, and a run it is adding
        is known once its insert commits; either way the run is theirs (`Busy`).

        Leases are judged and written by one clock, the ledger's (`lease_now`): PostgreSQL's for
        a shared ledger, so that a host whose clock runs ahead takes no live host's runs.
        """
        now = self._clock()
        # Not synced: a claim lost to power loss was never held (nothing is sent before the
        # run's first intent, whose sync makes the claim durable too).
        with self._transaction(durable=False) as db:
            lease_now = self._lease_now(db)
            row = db.execute(_CLAIMED, {"run_key": run_key(run_id)}).first()
            if row is None:
                row_id = self._insert(
                    db,
                    path=path,
                    run_id=run_id,
                    kind=kind,
                    state=State.READY,
                    now=now,
                    unless_known=True,
                )
                if row_id is None:
                    raise Busy(
                        f"run {run_id} is being claimed by another process",
                        pid=0,
                        host="",
                        since=now,
                    )
                previous = None
            else:
                record = run_record(row)
                row_id, previous = record.id, record.holder
                if previous is not None and alive(previous, lease_now):
                    raise held_by(
                        previous, f"run {run_id} is being uploaded by {previous.describe(process)}"
                    )
            row = db.execute(
                _CLAIM,
                {
                    "row_id": row_id,
                    "claim_owner": owner,
                    "claim_host": process.host,
                    "claim_boot": process.boot,
                    "claim_pid": process.pid,
                    "claim_start": process.start,
                    "claim_pidns": process.pidns,
                    "claim_since": now,
                    "claim_expires": lease_now + lease_seconds,
                },
            ).one()
            claimed = run_record(row)
            for key in [key for key in self._deferred if key[0] == row_id]:
                del self._deferred[key]  # a write left over from a claim given up
        return claimed, previous

    def release(self, record: RunRecord) -> RunRecord:
        """Give up the claim `record` holds, with the run's deferred write; returns the run as
        nobody's. Releasing a claim that is no longer held (taken over) changes nothing; with a
        deferred write pending, `ClaimLost` says that write was not made.
        Not synced before it returns (a claim lost to power loss is taken over; a deferred
        acknowledgement lost to it leaves its intent, reconciled): the next durable write, or
        `close`, syncs it."""
        cleared = dict.fromkeys(sorted(CLAIM_COLUMNS))
        with self._transaction(durable=False) as db:
            deferred = self._take_deferred(record)
            if deferred:
                self._update_row(db, record, deferred)
            db.execute(_RELEASE, {"row_id": record.id, "owner": record.claim_owner})
        return msgspec.structs.replace(record, **cleared)

    def renew(self, owners: list[str], lease_seconds: float) -> set[str]:
        """Push the leases of `owners`' claims to `lease_seconds` past the ledger's clock;
        returns those still held."""
        with self._transaction(durable=False) as db:  # a lease lost to power loss: a reboot
            expires = self._lease_now(db) + lease_seconds
            rows = db.execute(_RENEW, {"owners": owners, "expires": expires})
            return {owner for (owner,) in rows}

    def _lease_now(self, db: Any) -> float:
        """Inside a transaction: the time by the clock leases are judged by (the database's on
        PostgreSQL, this host's for the file)."""
        now = self._file.lease_now(db)
        return self._clock() if now is None else now

    def _fence(self, db: Any, record: RunRecord) -> None:
        """Inside a write: the run must still be held as `record` says, else nothing is written.
        The run's deferred write goes first, under the same fence."""
        deferred = self._take_deferred(record)
        if deferred:
            self._update_row(db, record, deferred)
            return
        row = db.execute(_HOLDER, {"row_id": record.id}).first()
        if row is None:
            raise LedgerError(f"{self.path}: run {record.run_id} vanished from the ledger")
        if row[0] != record.claim_owner:
            raise taken_over(record.run_id)

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
        file at once.) A run of one batch so waits for the disk twice, not three times. On the
        shared ledger it waits (`_write`): a database that crashes loses the write while this
        process goes on."""
        with self._lock:
            covered = "evaluation_id" in self._deferred.get(deferred_key(record), {})
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
        """The deferred write of the run under `record`'s claim, taken (inside the write that
        carries it, under the lock)."""
        return self._deferred.pop(deferred_key(record), None) or {}

    def _update_row(self, db: Any, record: RunRecord, changes: dict[str, Any]) -> None:
        """Inside a write: `changes` to the run's row, fenced by `record`'s claim (a new path
        with its digest, `path_key`)."""
        if "path_raw" in changes:
            changes = {**changes, "path_key": path_key(changes["path_raw"])}
        result = db.execute(
            _UPDATE_RUN, {**changes, "row_id": record.id, "held_by": record.claim_owner}
        )
        if result.rowcount == 0:
            self._fence(db, record)

    def _write(
        self, record: RunRecord, changes: dict[str, Any], *, defer: bool, durable: bool
    ) -> RunRecord:
        unknown = changes.keys() - WRITABLE_COLUMNS
        if unknown:
            raise ValueError(f"unknown ledger columns: {sorted(unknown)}")
        if "path" in changes:  # a moved run: both forms of its new path
            changes["path_raw"] = paths.raw(changes["path"])
            changes["path"] = paths.display(changes["path"])
        for name in MESSAGE_COLUMNS & changes.keys():
            if changes[name] is not None:
                changes[name] = stored_text(changes[name])
        changes["updated_at"] = self._clock()
        if "last_error" in changes:
            changes["last_error_at"] = changes["updated_at"] if changes["last_error"] else None
        if defer:
            with self._lock:
                self._deferred.setdefault(deferred_key(record), {}).update(changes)
            return msgspec.structs.replace(record, **changes)
        with self._lock:
            carries = bool(self._deferred.get(deferred_key(record)))
        # On the shared ledger the database can crash and come back while this process lives
        # on: a commit it did not wait for is lost then, yet this process goes on as if it were
        # written (no crash of its own sends the run back to its row). A deferred change is
        # written once (the evaluation's id, the scan's results), so there the write carrying it
        # waits for it to be on disk. (On the file, only a power cut loses such a commit, and it
        # ends this process too.)
        durable = durable or (carries and self.server is not None)
        with self._transaction(durable=durable) as db:
            self._update_row(db, record, {**self._take_deferred(record), **changes})
        return msgspec.structs.replace(record, **changes)

    def forget(self, record: RunRecord) -> None:
        """Drop the run; its evaluations are remembered as forgotten, so that a later upload of
        the same run creates a new evaluation instead of adopting one of them."""
        now = self._clock()
        with self._transaction() as db:
            self._fence(db, record)
            key, stored = run_key(record.run_id), stored_run_id(record.run_id)
            evaluations = sa.union(
                sa.select(runs.c.evaluation_id).where(
                    runs.c.id == record.id, runs.c.evaluation_id.is_not(None)
                ),
                sa.select(history.c.evaluation_id).where(history.c.run == record.id),
            )
            for (evaluation_id,) in db.execute(evaluations).all():
                self._remember_forgotten(db, key, stored, evaluation_id, now)
            db.execute(sa.delete(runs).where(runs.c.id == record.id))

    def _remember_forgotten(
        self, db: Any, key: bytes, stored: str, evaluation_id: str, now: float
    ) -> None:
        """Inside a write: an evaluation of the run id `key` never to be adopted again."""
        db.execute(
            self._insert_into(forgotten)
            .values(run_key=key, run_id=stored, evaluation_id=evaluation_id, at=now)
            .on_conflict_do_nothing()
        )

    def rename(self, record: RunRecord, run_id: str) -> RunRecord | None:
        """The run id its trace lines carry, for a run first recorded under a stand-in (a
        directory whose name is not a UUID, found before its first line named the run: see
        `runs.derive_run_id`). Only a waiting run nobody holds is renamed; if the ledger knows a
        run by that id already, the stand-in row is dropped and None returned (the other row is
        the run)."""
        stand_in = (
            runs.c.id == record.id,
            runs.c.claim_owner.is_(None),
            runs.c.state == State.WAITING,
        )
        with self._transaction() as db:
            key = run_key(run_id)
            if db.execute(sa.select(runs.c.id).where(runs.c.run_key == key)).first():
                db.execute(sa.delete(runs).where(*stand_in))
                return None
            result = db.execute(
                sa.update(runs)
                .where(*stand_in, runs.c.evaluation_id.is_(None))
                .values(run_id=stored_run_id(run_id), run_key=key, updated_at=self._clock())
            )
        return self.get(record.id) if result.rowcount else None

    def restart(
        self,
        record: RunRecord,
        *,
        outcome: HistoryOutcome,
        state: State,
        same_file: bool = False,
        following: bool = False,
    ) -> RunRecord:
        """Start the run's upload over: its current evaluation (if any) goes to `history` with
        `outcome`, its progress and set-aside records are cleared, in one transaction. A hold
        release (`evalpush retry`) is kept only for the `same_file`: it was for the bad lines a
        person saw. `following`: the run is still followed (a stretch starts it over)."""
        now = self._clock()
        with self._transaction() as db:
            self._fence(db, record)
            if record.evaluation_id is not None:
                self._add_history(db, record, record.evaluation_id, record.viewer_url, outcome)
            db.execute(sa.delete(set_aside).where(set_aside.c.run == record.id))
            row = db.execute(
                sa.update(runs)
                .where(runs.c.id == record.id)
                .values(
                    **(_STARTED_OVER | {"following": int(following)}),
                    state=state,
                    step=Step.SCAN,
                    release_hold=record.release_hold if same_file else 0,
                    updated_at=now,
                )
                .returning(*RUN_COLUMNS)
            ).one()
        return run_record(row)

    def _add_history(
        self,
        db: Any,
        record: RunRecord,
        evaluation_id: str,
        viewer_url: str | None,
        outcome: HistoryOutcome,
    ) -> None:
        """Inside a write: an evaluation the run had (or that is not its own), with `outcome`."""
        statement = self._insert_into(history).values(
            run=record.id,
            evaluation_id=evaluation_id,
            viewer_url=viewer_url,
            outcome=outcome,
            at=self._clock(),
        )
        excluded = statement.excluded
        db.execute(
            statement.on_conflict_do_update(
                index_elements=[history.c.run, history.c.evaluation_id],
                set_={
                    "viewer_url": excluded.viewer_url,
                    "outcome": excluded.outcome,
                    "at": excluded.at,
                },
            )
        )

    def note_foreign(self, record: RunRecord, evaluation_id: str, viewer_url: str | None) -> None:
        """An evaluation the run's lines name that is not the run's own: kept in its history
        (`not the run's`), so that `status RUN` shows it and no upload of the run adopts it."""
        with self._transaction() as db:
            self._fence(db, record)
            self._add_history(db, record, evaluation_id, viewer_url, HistoryOutcome.NOT_THE_RUNS)

    # ------------------------------------------------------------ set-aside records and history

    def add_set_aside(self, record: RunRecord, items: list[SetAside]) -> None:
        if not items:
            return
        statement = self._insert_into(set_aside)
        excluded = statement.excluded
        statement = statement.on_conflict_do_update(
            index_elements=[set_aside.c.run, set_aside.c["offset"]],
            set_={c: excluded[c] for c in ("line", "size", "kind", "reason")},
        )
        with self._transaction() as db:
            self._fence(db, record)
            db.execute(
                statement,
                [
                    {**msgspec.structs.asdict(i), "run": record.id, "reason": stored_text(i.reason)}
                    for i in items
                ],
            )

    # ------------------------------------------------------------ daemons

    def daemon_seen(
        self,
        daemon_id: str,
        *,
        host: str,
        pid: int,
        version: str,
        observer: str,
        started_at: float,
        lease_seconds: float,
        status: str = "",
        gate: GateState = GateState(),  # noqa: B008 - frozen: one shared default is safe
        follows: Sequence[bytes] = (),
    ) -> None:
        """A daemon's heartbeat: its row written with its STATUS line, its gate and the roots
        it follows runs under (`follows`, each path's bytes), at its start and every few
        seconds while it runs; not synced (a heartbeat lost to a power cut is the next one's to
        write). Rows of daemons not heard from for `DAEMONS_KEPT_SECONDS` go."""
        now = self._clock()
        gate_json = msgspec.json.encode(
            msgspec.structs.replace(gate, reason=stored_text(gate.reason))
        )
        statement = self._insert_into(daemons).values(
            id=daemon_id,
            host=host,
            pid=pid,
            version=version,
            observer=observer,
            started_at=started_at,
            seen_at=now,
            lease_seconds=lease_seconds,
            stopped_at=None,
            status=stored_text(status),
            gate=gate_json.decode(),
            follows=msgspec.json.encode([root.hex() for root in follows]).decode(),
        )
        excluded = statement.excluded
        statement = statement.on_conflict_do_update(
            index_elements=[daemons.c.id],
            set_={
                **{
                    c: excluded[c]
                    for c in ("seen_at", "observer", "lease_seconds", "status", "gate", "follows")
                },
                "stopped_at": None,
            },
        )
        with self._transaction(durable=False) as db:
            db.execute(statement)
            db.execute(sa.delete(daemons).where(daemons.c.seen_at < now - DAEMONS_KEPT_SECONDS))

    def daemon_stopped(self, daemon_id: str) -> None:
        """The daemon stopped as asked (one killed leaves its row to age past its lease)."""
        now = self._clock()
        with self._transaction() as db:
            db.execute(
                sa.update(daemons)
                .where(daemons.c.id == daemon_id)
                .values(stopped_at=now, seen_at=now)
            )

    def daemons(self) -> list[DaemonRecord]:
        """Every daemon the ledger heard from lately, the last heard from first."""
        rows = self._query(
            sa.select(*DAEMON_COLUMNS).order_by(daemons.c.seen_at.desc(), daemons.c.id)
        )
        return [daemon_record(row) for row in rows]


# The claims' statements, built once: a claim, its renewal and its release are what every run
# costs, on every store.
_CLAIMED = (
    # FOR UPDATE SKIP LOCKED: on PostgreSQL a row another daemon is claiming at this instant is
    # skipped (the run is theirs); SQLite's compiler leaves it out (the transaction holds the
    # file's write lock).
    SELECT.where(runs.c.run_key == sa.bindparam("run_key")).with_for_update(skip_locked=True)
)
_HOLDER = sa.select(runs.c.claim_owner).where(runs.c.id == sa.bindparam("row_id"))
_UPDATE_RUN = sa.update(runs).where(runs.c.id == sa.bindparam("row_id"), _HELD_AS_READ)
"""A run's write, fenced; its parameters name the columns it sets (and `row_id`, `held_by`)."""
_CLAIM = sa.update(runs).where(runs.c.id == sa.bindparam("row_id")).returning(*RUN_COLUMNS)
"""Its parameters name the claim's columns: SQLAlchemy sets what they name."""
_RELEASE = (
    sa.update(runs)
    .where(runs.c.id == sa.bindparam("row_id"), runs.c.claim_owner == sa.bindparam("owner"))
    .values(dict.fromkeys(sorted(CLAIM_COLUMNS)))
)
_RENEW = (
    sa.update(runs)
    .where(runs.c.claim_owner.in_(sa.bindparam("owners", expanding=True)))
    .values(claim_expires=sa.bindparam("expires"))
    .returning(runs.c.claim_owner)
)
_STARTED_OVER = {
    **dict.fromkeys(
        (
            "file_device",
            "file_inode",
            "file_size",
            "file_mtime_ns",
            "file_ctime_ns",
            "file_digest",
            "upload_end",
            "evaluation_id",
            "viewer_url",
            "pending",
            "totals",
            "finalized_at",
        )
    ),
    **dict.fromkeys(
        ("acked_offset", "acked_line", "samples_sent", "samples_seen", "bytes_sent"), 0
    ),
    "reason": "",
    "following": 0,
    "followed_at": None,
}
"""A run's progress as a restart leaves it."""

DAEMONS_KEPT_SECONDS = 7 * 24 * 3600.0
"""A daemon not heard from for this long (a host gone from the fleet) leaves `status`."""

__all__ = ["SCHEMA_VERSION", "HistoryRecord", "Ledger", "RunRecord", "default_path"]
