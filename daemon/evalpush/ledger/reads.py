"""The ledger's reads: runs found by id, path or state, and what a run set aside and had
before, each as this process knows it (with the writes it has deferred).

A ledger may hold a million runs: what reads them all does so a page at a time (`pages`,
`pages_in_state`, `pages_with_history`: one query a page, each found through an index, so each
page costs the same however far in it is), and what a page's runs set aside and had before is
read in one query a page (`set_aside_of`, `history_of`), never one a run. `status`'s default view
reads only what its sections show, through the indexes of schema 10 (`newest`, `short`,
`set_aside_runs`, `by_ids`)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from evalpush.core import paths
from evalpush.core.setaside import SetAside
from evalpush.core.states import SetAsideKind, State
from evalpush.ledger import schema
from evalpush.ledger.records import SELECT, HistoryRecord, RunRecord, run_record

PAGE_RUNS = 1000
"""Runs a page of `LedgerReads.pages` holds (unless told otherwise): big enough that a query a
page costs little, small enough that a page's rows cost little memory."""


class LedgerReads:
    """What `Ledger` reads (it owns the file and the deferred writes these reads overlay)."""

    _query: Callable[..., list[tuple[Any, ...]]]
    _lock: threading.RLock
    _deferred: dict[int, dict[str, Any]]

    def _records(self, where: str, args: tuple[Any, ...] = ()) -> list[RunRecord]:
        """Rows as this process knows them: with their deferred writes."""
        records = [run_record(row) for row in self._query(f"{SELECT} {where}", args)]
        if not self._deferred:
            return records
        with self._lock:
            deferred = self._deferred
            return [
                msgspec.structs.replace(r, **deferred[r.id]) if r.id in deferred else r
                for r in records
            ]

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
        found = self._records("WHERE run_key = ?", (schema.run_key(run_id),))
        return found[0] if found else None

    def run_id_at(self, path: Path) -> str | None:
        """The run id of the run last seen at `path`, if the ledger knows one (the run id of a
        directory whose name is not a UUID: `runs.derive_run_id`)."""
        raw = paths.raw(path)
        found = self._query(
            "SELECT run_id FROM runs WHERE path_key = ? AND path_raw = ? "
            "ORDER BY updated_at DESC LIMIT 1",
            (schema.path_key(raw), raw),
        )
        return schema.loaded_run_id(found[0][0]) if found else None

    def match(self, key: str) -> list[RunRecord]:
        """The runs `key` names: the one at that path, the one with that run id, else every run
        whose id starts with `key` (literally: no wildcards). An empty key names none."""
        if not key:
            return []
        raw = paths.raw(key)
        found = self._records("WHERE path_key = ? AND path_raw = ?", (schema.path_key(raw), raw))
        if found or paths.printable(key) != key:
            return found  # a key with bytes that are not UTF-8 can only be a path
        found = self._records("WHERE run_key = ?", (schema.run_key(key),))
        # A prefix of the run id as stored: as it is, or in hex (`schema.stored_run_id`).
        hexed = schema.ESCAPED_RUN_ID + key.encode("utf-8", "surrogatepass").hex()
        return found or self._records(
            "WHERE substr(run_id, 1, CAST(? AS INTEGER)) = ? "
            "OR substr(run_id, 1, CAST(? AS INTEGER)) = ? ORDER BY run_id",
            (len(key), key, len(hexed), hexed),
        )

    def all(self) -> list[RunRecord]:
        return self._records("ORDER BY id")

    def pages(self, size: int | None = None) -> Iterator[list[RunRecord]]:
        """Every run in ledger order (by row id), `size` at a time: one query a page, after
        the last row id of the page before (a run added meanwhile comes at the end)."""
        after, size = 0, size or PAGE_RUNS
        while page := self._records("WHERE id > ? ORDER BY id LIMIT ?", (after, size)):
            yield page
            after = page[-1].id

    def pages_in_state(self, state: str, size: int | None = None) -> Iterator[list[RunRecord]]:
        """The runs in `state`, oldest update first, `size` at a time: one query a page, found
        through `runs_state_updated` after the (updated_at, id) the page before ended at."""
        size = size or PAGE_RUNS
        page = self._records(
            "WHERE state = ? ORDER BY updated_at, id LIMIT ?",
            (state, size),
        )
        while page:
            yield page
            last = page[-1]
            page = self._records(
                "WHERE state = ? AND updated_at >= ? AND (updated_at > ? OR id > ?) "
                "ORDER BY updated_at, id LIMIT ?",
                (state, last.updated_at, last.updated_at, last.id, size),
            )

    def pages_with_history(self, size: int | None = None) -> Iterator[list[RunRecord]]:
        """The runs that had an earlier evaluation, in ledger order, `size` at a time."""
        after, size = 0, size or PAGE_RUNS
        while page := self._records(
            "WHERE id IN (SELECT run FROM history WHERE run > ?) ORDER BY id LIMIT ?",
            (after, size),
        ):
            yield page
            after = page[-1].id

    def by_ids(self, ids: Iterable[int]) -> list[RunRecord]:
        """The runs with these row ids, in ledger order."""
        ids = sorted(set(ids))
        found: list[RunRecord] = []
        for start in range(0, len(ids), PAGE_RUNS):
            chunk = ids[start : start + PAGE_RUNS]
            found += self._records(f"WHERE id IN ({', '.join('?' * len(chunk))})", tuple(chunk))
        return sorted(found, key=lambda r: r.id)

    def newest(self, state: str, limit: int, *, clean: bool = False) -> list[tuple[int, float]]:
        """(row id, updated_at) of the `limit` runs in `state` updated last, newest first
        (through `runs_state_updated`, reading no more of it than it returns). `clean`: only
        the runs with nothing set aside and, finalized, not short of their expected traces."""
        also = ""
        if clean:
            also = " AND NOT EXISTS (SELECT 1 FROM set_aside WHERE run = runs.id)"
            if state == State.FINALIZED:
                also += " AND COALESCE(expected_traces, 0) <= samples_seen"
        return self._query(  # type: ignore[return-value]
            f"SELECT id, updated_at FROM runs WHERE state = ?{also} "
            "ORDER BY updated_at DESC LIMIT ?",
            (state, limit),
        )

    def short(self, state: str) -> list[tuple[int, float]]:
        """(row id, updated_at) of the runs in `state` that saw fewer lines than their config
        expects (`schema.SHORT`, through its partial index `runs_short`)."""
        return self._query(  # type: ignore[return-value]
            f"SELECT id, updated_at FROM runs WHERE state = ? AND {schema.SHORT}", (state,)
        )

    def set_aside_runs(self, *states: str) -> list[tuple[int, float]]:
        """(row id, updated_at) of the runs in `states` that have records set aside: read from
        `set_aside`'s side (the runs are looked up by row id, their state picked here, so that
        no index of every run in a state is read)."""
        rows = self._query(
            "SELECT id, updated_at, state FROM runs "
            "WHERE id IN (SELECT DISTINCT run FROM set_aside)"
        )
        return [(row_id, at) for row_id, at, state in rows if state in states]

    def in_state(self, *states: State) -> list[RunRecord]:
        marks = ", ".join("?" * len(states))
        return self._records(f"WHERE state IN ({marks}) ORDER BY id", tuple(states))

    def claimed(self) -> list[RunRecord]:
        """The runs someone holds the claim of (alive or not), through `runs_claim_owner`."""
        return self._records("WHERE claim_owner IS NOT NULL ORDER BY id")

    def state_counts(self) -> dict[str, int]:
        """How many runs are in each state."""
        return dict(self._query("SELECT state, COUNT(*) FROM runs GROUP BY state"))

    def file_facts(self) -> list[tuple[bytes, str, int | None, int | None, int | None, int | None]]:
        """(path_raw, state, device, inode, size, mtime_ns) of every run's trace file as last
        scanned: what the daemon compares a rescan with, without a row object per run."""
        return self._query(  # type: ignore[return-value]
            "SELECT path_raw, state, file_device, file_inode, file_size, file_mtime_ns FROM runs"
        )

    def set_aside(self, record: RunRecord) -> list[SetAside]:
        rows = self._query(
            'SELECT line, "offset", size, kind, reason FROM set_aside WHERE run = ? ORDER BY "offset"',
            (record.id,),
        )
        return [
            SetAside(line, offset, size, SetAsideKind(kind), reason)
            for line, offset, size, kind, reason in rows
        ]

    def set_aside_count(self, record: RunRecord) -> int:
        return self._query("SELECT COUNT(*) FROM set_aside WHERE run = ?", (record.id,))[0][0]

    def set_aside_of(self, records: list[RunRecord]) -> dict[int, list[SetAside]]:
        """What each of `records` (a page) set aside, in one query: by run."""
        found: dict[int, list[SetAside]] = {}
        marks, ids = _ids(records)
        for run, line, offset, size, kind, reason in self._query(
            'SELECT run, line, "offset", size, kind, reason FROM set_aside '
            f'WHERE run IN ({marks}) ORDER BY run, "offset"',
            ids,
        ):
            found.setdefault(run, []).append(
                SetAside(line, offset, size, SetAsideKind(kind), reason)
            )
        return found

    def set_aside_counts_of(self, records: list[RunRecord]) -> dict[int, int]:
        """How many records each of `records` (a page) set aside: by run."""
        marks, ids = _ids(records)
        return dict(
            self._query(
                f"SELECT run, COUNT(*) FROM set_aside WHERE run IN ({marks}) GROUP BY run", ids
            )
        )

    def history_of(self, records: list[RunRecord]) -> dict[int, list[HistoryRecord]]:
        """Each of `records`' (a page) earlier evaluations, in one query."""
        found: dict[int, list[HistoryRecord]] = {}
        marks, ids = _ids(records)
        for run, *row in self._query(
            "SELECT run, evaluation_id, viewer_url, outcome, at FROM history "
            f"WHERE run IN ({marks}) ORDER BY run, at",
            ids,
        ):
            found.setdefault(run, []).append(HistoryRecord(*row))
        return found

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
            "UNION SELECT evaluation_id FROM forgotten WHERE run_key = ?",
            (record.id, schema.run_key(record.run_id)),
        )
        return {evaluation_id for (evaluation_id,) in rows}


def _ids(records: list[RunRecord]) -> tuple[str, tuple[int, ...]]:
    """`IN (?, ...)` and the row ids of `records` (a page): what its other reads look up."""
    return ", ".join("?" * len(records)) or "NULL", tuple(r.id for r in records)
