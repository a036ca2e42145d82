"""The ledger's reads: runs found by id, path or state, and what a run set aside and had
before, each as this process knows it (with the writes it has deferred).

A ledger may hold a million runs: what reads them all does so a page at a time (`pages`,
`pages_in_state`, `pages_with_history`: one query a page, each found through an index, so each
page costs the same however far in it is), and what a page's runs set aside and had before is
read in one query a page (`set_aside_of`, `history_of`), never one a run. Each query reads the
ledger as it is then: a listing that must be of one moment is read inside `Ledger.snapshot`
(`status`'s is). `status`'s default view reads only what its sections show, through the indexes
of schema 10 (`newest`, `short`, `set_aside_runs`, `by_ids`)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import sqlalchemy as sa

from evalpush.core import paths
from evalpush.core.setaside import SetAside
from evalpush.core.states import SetAsideKind, State
from evalpush.ledger.records import SELECT, HistoryRecord, RunRecord, run_record
from evalpush.ledger.tables import (
    ESCAPED_RUN_ID,
    SHORT,
    forgotten,
    history,
    loaded_run_id,
    path_key,
    run_key,
    runs,
    set_aside,
)

PAGE_RUNS = 1000
"""Runs a page of `LedgerReads.pages` holds (unless told otherwise): big enough that a query a
page costs little, small enough that a page's rows cost little memory."""
PAGE_FACTS = 20_000
"""Runs a page of `LedgerReads.file_facts` holds: five columns a run, no row object."""

_SET_ASIDE = (
    set_aside.c.line,
    set_aside.c["offset"],
    set_aside.c.size,
    set_aside.c.kind,
    set_aside.c.reason,
)
_HISTORY = (history.c.evaluation_id, history.c.viewer_url, history.c.outcome, history.c.at)
_AT_PATH = (runs.c.path_key == sa.bindparam("path_key")) & (
    runs.c.path_raw == sa.bindparam("path_raw")
)
# What every run's upload reads, built once (SQLAlchemy then finds each compiled at once).
_BY_ID = SELECT.where(runs.c.id == sa.bindparam("id"))
_BY_RUN_KEY = SELECT.where(runs.c.run_key == sa.bindparam("run_key"))
_RUN_ID_AT = sa.select(runs.c.run_id).where(_AT_PATH).order_by(runs.c.updated_at.desc()).limit(1)
_OF_RUN = sa.bindparam("run")
_SET_ASIDE_OF_RUN = (
    sa.select(*_SET_ASIDE).where(set_aside.c.run == _OF_RUN).order_by(set_aside.c["offset"])
)
_SET_ASIDE_COUNT = sa.select(sa.func.count()).where(set_aside.c.run == _OF_RUN)
_HISTORY_OF_RUN = sa.select(*_HISTORY).where(history.c.run == _OF_RUN).order_by(history.c.at)
_EARLIER_EVALUATIONS = sa.union(
    sa.select(history.c.evaluation_id).where(history.c.run == _OF_RUN),
    sa.select(forgotten.c.evaluation_id).where(forgotten.c.run_key == sa.bindparam("run_key")),
)


DeferredKey = tuple[int, str | None]


def deferred_key(record: RunRecord) -> DeferredKey:
    """Which deferred write is a row's: the one made under the claim it is held by (its row id
    and claim owner; None for a write to a run nobody holds)."""
    return record.id, record.claim_owner


def _at_path(path: Path | str) -> dict[str, bytes]:
    raw = paths.raw(path)
    return {"path_key": path_key(raw), "path_raw": raw}


class LedgerReads:
    """What `Ledger` reads (it owns the store and the deferred writes these reads overlay)."""

    _query: Callable[..., list[Any]]
    _lock: threading.RLock
    _deferred: dict[DeferredKey, dict[str, Any]]

    def _records(
        self, statement: sa.Select[Any], params: dict[str, Any] | None = None
    ) -> list[RunRecord]:
        """Rows as this process knows them: with the writes deferred under the claims they
        are held by."""
        records = [run_record(row) for row in self._query(statement, params)]
        if not self._deferred:
            return records
        with self._lock:
            deferred = self._deferred
            return [
                msgspec.structs.replace(r, **deferred[key])
                if (key := deferred_key(r)) in deferred
                else r
                for r in records
            ]

    def get(self, key: int | str) -> RunRecord | None:
        """A run by row id, path, or run id (full or a unique prefix); None if none or several."""
        found = self.match(key) if isinstance(key, str) else self._records(_BY_ID, {"id": key})
        return found[0] if len(found) == 1 else None

    def get_run(self, run_id: str) -> RunRecord | None:
        """The run with this exact run id."""
        found = self._records(_BY_RUN_KEY, {"run_key": run_key(run_id)})
        return found[0] if found else None

    def run_id_at(self, path: Path) -> str | None:
        """The run id of the run last seen at `path`, if the ledger knows one (the run id of a
        directory whose name is not a UUID: `runs.derive_run_id`)."""
        found = self._query(_RUN_ID_AT, _at_path(path))
        return loaded_run_id(found[0][0]) if found else None

    def match(self, key: str) -> list[RunRecord]:
        """The runs `key` names: the one at that path, the one with that run id, else every run
        whose id starts with `key` (literally: no wildcards). An empty key names none."""
        if not key:
            return []
        found = self._records(SELECT.where(_AT_PATH), _at_path(key))
        if found or paths.printable(key) != key:
            return found  # a key with bytes that are not UTF-8 can only be a path
        found = self._records(_BY_RUN_KEY, {"run_key": run_key(key)})
        # A prefix of the run id as stored: as it is, or in hex (`tables.stored_run_id`); a
        # key holding a NUL, in hex only (no run id is stored with one, nor can PostgreSQL
        # compare text with one).
        hexed = ESCAPED_RUN_ID + key.encode("utf-8", "surrogatepass").hex()
        prefixes = (hexed,) if "\0" in key else (key, hexed)
        return found or self._records(
            SELECT.where(sa.or_(*(_starts(runs.c.run_id, prefix) for prefix in prefixes))).order_by(
                runs.c.run_id
            )
        )

    def all(self) -> list[RunRecord]:
        return self._records(SELECT.order_by(runs.c.id))

    def pages(self, size: int | None = None) -> Iterator[list[RunRecord]]:
        """Every run in ledger order (by row id), `size` at a time: one query a page, after
        the last row id of the page before (a run added meanwhile comes at the end)."""
        after, size = 0, size or PAGE_RUNS
        while page := self._records(
            SELECT.where(runs.c.id > after).order_by(runs.c.id).limit(size)
        ):
            yield page
            after = page[-1].id

    def pages_in_state(self, state: str, size: int | None = None) -> Iterator[list[RunRecord]]:
        """The runs in `state`, oldest update first, `size` at a time: one query a page, found
        through `runs_state_updated` after the (updated_at, id) the page before ended at."""
        size = size or PAGE_RUNS
        in_state = SELECT.where(runs.c.state == state).order_by(runs.c.updated_at, runs.c.id)
        page = self._records(in_state.limit(size))
        while page:
            yield page
            last = page[-1]
            page = self._records(
                in_state.where(
                    runs.c.updated_at >= last.updated_at,
                    (runs.c.updated_at > last.updated_at) | (runs.c.id > last.id),
                ).limit(size)
            )

    def pages_with_history(self, size: int | None = None) -> Iterator[list[RunRecord]]:
        """The runs that had an earlier evaluation, in ledger order, `size` at a time."""
        after, size = 0, size or PAGE_RUNS
        while page := self._records(
            SELECT.where(runs.c.id.in_(sa.select(history.c.run).where(history.c.run > after)))
            .order_by(runs.c.id)
            .limit(size)
        ):
            yield page
            after = page[-1].id

    def by_ids(self, ids: Iterable[int]) -> list[RunRecord]:
        """The runs with these row ids, in ledger order."""
        ids = sorted(set(ids))
        found: list[RunRecord] = []
        for start in range(0, len(ids), PAGE_RUNS):
            found += self._records(SELECT.where(runs.c.id.in_(ids[start : start + PAGE_RUNS])))
        return sorted(found, key=lambda r: r.id)

    def newest(self, state: str, limit: int, *, clean: bool = False) -> list[tuple[int, float]]:
        """(row id, updated_at) of the `limit` runs in `state` updated last, newest first
        (through `runs_state_updated`, reading no more of it than it returns). `clean`: only
        the runs with nothing set aside and, finalized, not short of their expected traces."""
        statement = sa.select(runs.c.id, runs.c.updated_at).where(runs.c.state == state)
        if clean:
            statement = statement.where(~sa.exists().where(set_aside.c.run == runs.c.id))
            if state == State.FINALIZED:
                statement = statement.where(
                    sa.func.coalesce(runs.c.expected_traces, 0) <= runs.c.samples_seen
                )
        return self._query(statement.order_by(runs.c.updated_at.desc()).limit(limit))

    def short(self, state: str) -> list[tuple[int, float]]:
        """(row id, updated_at) of the runs in `state` that saw fewer lines than their config
        expects (`tables.SHORT`, through its partial index `runs_short`)."""
        return self._query(
            sa.select(runs.c.id, runs.c.updated_at).where(runs.c.state == state, SHORT)
        )

    def set_aside_runs(self, *states: str) -> list[tuple[int, float]]:
        """(row id, updated_at) of the runs in `states` that have records set aside: read from
        `set_aside`'s side (the runs are looked up by row id, their state picked here, so that
        no index of every run in a state is read)."""
        rows = self._query(
            sa.select(runs.c.id, runs.c.updated_at, runs.c.state).where(
                runs.c.id.in_(sa.select(set_aside.c.run).distinct())
            )
        )
        return [(row_id, at) for row_id, at, state in rows if state in states]

    def in_state(self, *states: State) -> list[RunRecord]:
        return self._records(SELECT.where(runs.c.state.in_(states)).order_by(runs.c.id))

    def claimed(self) -> list[RunRecord]:
        """The runs someone holds the claim of (alive or not), through `runs_claim_owner`."""
        return self._records(SELECT.where(runs.c.claim_owner.is_not(None)).order_by(runs.c.id))

    def state_counts(self, states: Iterable[str] | None = None) -> dict[str, int]:
        """How many runs are in each state (of `states`, through the state index, when given:
        a state with none is left out)."""
        counted = sa.select(runs.c.state, sa.func.count()).group_by(runs.c.state)
        if states is not None:
            counted = counted.where(runs.c.state.in_(sorted(states)))
        return dict(self._query(counted))

    def file_facts(
        self, states: Iterable[str], size: int = PAGE_FACTS
    ) -> Iterator[list[tuple[bytes, int, int, int, int]]]:
        """(path_raw, device, inode, size, mtime_ns) of the trace file, as last scanned, of
        every run in `states` that has them: what the daemon compares a rescan with, with no
        row object per run, those of `size` rows a page (one query a page, after the last row
        id of the page before), so a million runs never sit in memory as rows at once. The pages go by
        row id alone (the primary key's order, no sort): the state is tested here, since a
        state filter would have the database read every row of the state for each page."""
        c = runs.c
        facts = (
            sa.select(
                c.id, c.state, c.path_raw, c.file_device, c.file_inode, c.file_size, c.file_mtime_ns
            )
            .order_by(c.id)
            .limit(size)
        )
        wanted = frozenset(states)
        after = 0
        while page := self._query(facts.where(c.id > after)):
            after = page[-1][0]
            chosen = [
                (raw, device, inode, file_size, mtime_ns)
                for _, state, raw, device, inode, file_size, mtime_ns in page
                if state in wanted and None not in (device, inode, file_size, mtime_ns)
            ]
            if chosen:
                yield chosen

    def set_aside(self, record: RunRecord) -> list[SetAside]:
        rows = self._query(_SET_ASIDE_OF_RUN, {"run": record.id})
        return [
            SetAside(line, offset, size, SetAsideKind(kind), reason)
            for line, offset, size, kind, reason in rows
        ]

    def set_aside_count(self, record: RunRecord) -> int:
        return self._query(_SET_ASIDE_COUNT, {"run": record.id})[0][0]

    def set_aside_of(self, records: list[RunRecord]) -> dict[int, list[SetAside]]:
        """What each of `records` (a page) set aside, in one query: by run."""
        found: dict[int, list[SetAside]] = {}
        for run, line, offset, size, kind, reason in self._query(
            sa.select(set_aside.c.run, *_SET_ASIDE)
            .where(set_aside.c.run.in_(_ids(records)))
            .order_by(set_aside.c.run, set_aside.c["offset"])
        ):
            found.setdefault(run, []).append(
                SetAside(line, offset, size, SetAsideKind(kind), reason)
            )
        return found

    def set_aside_counts_of(self, records: list[RunRecord]) -> dict[int, int]:
        """How many records each of `records` (a page) set aside: by run."""
        return dict(
            self._query(
                sa.select(set_aside.c.run, sa.func.count())
                .where(set_aside.c.run.in_(_ids(records)))
                .group_by(set_aside.c.run)
            )
        )

    def history_of(self, records: list[RunRecord]) -> dict[int, list[HistoryRecord]]:
        """Each of `records`' (a page) earlier evaluations, in one query."""
        found: dict[int, list[HistoryRecord]] = {}
        for run, *row in self._query(
            sa.select(history.c.run, *_HISTORY)
            .where(history.c.run.in_(_ids(records)))
            .order_by(history.c.run, history.c.at)
        ):
            found.setdefault(run, []).append(HistoryRecord(*row))
        return found

    def history(self, record: RunRecord) -> list[HistoryRecord]:
        rows = self._query(_HISTORY_OF_RUN, {"run": record.id})
        return [HistoryRecord(*row) for row in rows]

    def earlier_evaluations(self, record: RunRecord) -> set[str]:
        """Evaluations of this run id that must not be adopted: its history, and those of an
        earlier ledger row of the same run that a person forgot."""
        rows = self._query(
            _EARLIER_EVALUATIONS, {"run": record.id, "run_key": run_key(record.run_id)}
        )
        return {evaluation_id for (evaluation_id,) in rows}


def _starts(column: sa.ColumnElement[str], prefix: str) -> sa.ColumnElement[bool]:
    """`column` starts with `prefix`, literally (LIKE would read `%` and `_` as wildcards)."""
    return sa.func.substr(column, 1, sa.cast(len(prefix), sa.Integer)) == prefix


def _ids(records: list[RunRecord]) -> list[int]:
    """The row ids of `records` (a page): what its other reads look up."""
    return [r.id for r in records]
