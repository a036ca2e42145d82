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

from evalpush.core.states import State
from evalpush.core.words import counted
from evalpush.ledger import schema
from evalpush.ledger.claims import Process, held_by, holder_alive
from evalpush.ledger.records import CLAIM_COLUMNS, COLUMNS, RunRecord
from evalpush.ledger.store import Ledger

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
    forgotten = source._query("SELECT run_key, run_id, evaluation_id, at FROM forgotten")
    added = replaced = kept = 0
    with target._transaction() as db:
        for record in records:
            row = db.execute(
                "SELECT id, state, evaluation_id, claim_owner FROM runs WHERE run_key = ? "
                "FOR UPDATE",
                (schema.run_key(record.run_id),),
            ).fetchone()
            if row is None:
                added += 1
            elif row[1] == State.FINALIZED or record.state != State.FINALIZED or row[3]:
                kept += 1  # a shared row someone holds is theirs to finish
                continue
            else:
                replaced += 1
                _drop_shared(db, record, row[0], row[2], now)
            _insert(db, source, record)
        for run_key, run_id, evaluation_id, at in forgotten:
            db.execute(
                "INSERT INTO forgotten (run_key, run_id, evaluation_id, at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT DO NOTHING",
                (run_key, run_id, evaluation_id, at),
            )
    return Moved(added, replaced, kept, len(forgotten))


def _drop_shared(
    db: Any, record: RunRecord, row_id: int, evaluation_id: str | None, now: float
) -> None:
    """The shared row gives way to this host's finalized record; its evaluation (if another)
    and its history are kept under the run id as forgotten, never to be adopted."""
    key, stored = schema.run_key(record.run_id), schema.stored_run_id(record.run_id)
    db.execute(
        "INSERT INTO forgotten (run_key, run_id, evaluation_id, at) "
        "SELECT ?, ?, evaluation_id, ? FROM history WHERE run = ? ON CONFLICT DO NOTHING",
        (key, stored, now, row_id),
    )
    if evaluation_id is not None and evaluation_id != record.evaluation_id:
        db.execute(
            "INSERT INTO forgotten (run_key, run_id, evaluation_id, at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT DO NOTHING",
            (key, stored, evaluation_id, now),
        )
    db.execute("DELETE FROM runs WHERE id = ?", (row_id,))


def _insert(db: Any, source: Ledger, record: RunRecord) -> None:
    values = msgspec.structs.asdict(record)
    values["run_id"] = schema.stored_run_id(record.run_id)
    values["run_key"] = schema.run_key(record.run_id)
    values["path_key"] = schema.path_key(record.path_raw)
    columns = [*_MOVED, "run_key", "path_key"]
    marks = ", ".join("?" * len(columns))
    (row_id,) = db.execute(
        f"INSERT INTO runs ({', '.join(columns)}) VALUES ({marks}) RETURNING id",
        tuple(values[c] for c in columns),
    ).fetchone()
    db.executemany(
        'INSERT INTO set_aside (run, line, "offset", size, kind, reason) VALUES (?, ?, ?, ?, ?, ?)',
        [(row_id, s.line, s.offset, s.size, s.kind, s.reason) for s in source.set_aside(record)],
    )
    db.executemany(
        "INSERT INTO history (run, evaluation_id, viewer_url, outcome, at) VALUES (?, ?, ?, ?, ?)",
        [(row_id, h.evaluation_id, h.viewer_url, h.outcome, h.at) for h in source.history(record)],
    )


__all__ = ["Moved", "move"]
