"""`evalpush migrate --to URL`: a host's SQLite ledger moved into a fleet's shared ledger.

Everything the file knows goes over in one transaction of the shared ledger: each run's row
(without its claim), its set-aside records and its history, and the forgotten evaluations. A
run both ledgers know keeps the finalized record: the shared one's if it is finalized, else
this host's if it is (the shared row's evaluation, a different one, goes to the run's history
as `duplicate`, so it is never adopted); otherwise the shared row is kept, being the one the
fleet works on. So nothing finalized is uploaded again. The file is left as it was.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
import sqlalchemy as sa

from evalpush.core.states import State
from evalpush.core.words import counted
from evalpush.ledger.claims import Process, held_by, holder_alive
from evalpush.ledger.records import CLAIM_COLUMNS, COLUMNS, RunRecord
from evalpush.ledger.store import Ledger
from evalpush.ledger.tables import (
    forgotten,
    history,
    path_key,
    run_key,
    runs,
    set_aside,
    stored_run_id,
)

_MOVED = [c for c in COLUMNS if c != "id" and c not in CLAIM_COLUMNS]


class Moved(msgspec.Struct, frozen=True):
    """What a move did, run by run."""

    added: int  # runs the shared ledger did not know
    replaced: int  # runs finalized here and not there: this host's record taken
    kept: int  # runs the shared ledger knew and keeps (finalized there, or neither finalized)
    forgotten: int  # forgotten evaluations carried over

    @property
    def message(self) -> str:
        return (
            f"{counted(self.added, 'run')} added, {self.replaced} replaced by this host's "
            f"finalized record, {self.kept} kept as the shared ledger had them, "
            f"{counted(self.forgotten, 'forgotten evaluation')} carried over"
        )


def move(source: Ledger, target: Ledger) -> Moved:
    """Move everything `source` knows into `target` (see the module's docstring). `Busy` if
    a process on this host still holds a run of `source` (stop the daemon first)."""
    if target.server is None:
        raise ValueError("a ledger moves into a shared ledger only")
    here, now = Process.current(), time.time()
    records = source.all()
    for record in records:
        holder = record.holder
        if holder is not None and holder_alive(holder, here, now):
            raise held_by(
                holder,
                f"run {record.run_id} is being uploaded by pid {holder.pid}: stop the daemon "
                "(and any push) on this host before moving its ledger",
            )
    carried = source._query(sa.select(forgotten))
    added = replaced = kept = 0
    shared_row = sa.select(runs.c.id, runs.c.state, runs.c.evaluation_id, runs.c.claim_owner)
    with target._transaction() as db:
        for record in records:
            row = db.execute(
                shared_row.where(runs.c.run_key == run_key(record.run_id)).with_for_update()
            ).first()
            if row is None:
                added += 1
            elif row.state == State.FINALIZED or record.state != State.FINALIZED or row.claim_owner:
                kept += 1  # a shared row someone holds is theirs to finish
                continue
            else:
                replaced += 1
                _drop_shared(db, target, record, row.id, row.evaluation_id, now)
            _insert(db, source, record)
        for row in carried:
            target._remember_forgotten(db, row.run_key, row.run_id, row.evaluation_id, row.at)
    return Moved(added, replaced, kept, len(carried))


def _drop_shared(
    db: Any, target: Ledger, record: RunRecord, row_id: int, evaluation_id: str | None, now: float
) -> None:
    """The shared row gives way to this host's finalized record; its evaluation (if another)
    and its history are kept under the run id as forgotten, never to be adopted."""
    key, stored = run_key(record.run_id), stored_run_id(record.run_id)
    earlier = db.execute(sa.select(history.c.evaluation_id).where(history.c.run == row_id))
    for (earlier_id,) in earlier.all():
        target._remember_forgotten(db, key, stored, earlier_id, now)
    if evaluation_id is not None and evaluation_id != record.evaluation_id:
        target._remember_forgotten(db, key, stored, evaluation_id, now)
    db.execute(sa.delete(runs).where(runs.c.id == row_id))


def _insert(db: Any, source: Ledger, record: RunRecord) -> None:
    values = {c: getattr(record, c) for c in _MOVED}
    values["run_id"] = stored_run_id(record.run_id)
    values["run_key"] = run_key(record.run_id)
    values["path_key"] = path_key(record.path_raw)
    row_id = db.execute(sa.insert(runs).values(values).returning(runs.c.id)).scalar_one()
    # A run's set-aside records and history, their fields the tables' columns.
    for table, rows in ((set_aside, source.set_aside(record)), (history, source.history(record))):
        if rows:
            db.execute(
                sa.insert(table), [{**msgspec.structs.asdict(row), "run": row_id} for row in rows]
            )


__all__ = ["Moved", "move"]
