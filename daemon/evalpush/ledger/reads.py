"""The ledger's reads: runs found by id, path or state, and what a run set aside and had
before, each as this process knows it (with the writes it has deferred)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from evalpush.core import paths
from evalpush.core.setaside import SetAside
from evalpush.core.states import SetAsideKind, State
from evalpush.ledger import schema
from evalpush.ledger.records import SELECT, HistoryRecord, RunRecord, run_record


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
            "UNION SELECT evaluation_id FROM forgotten WHERE run_key = ?",
            (record.id, schema.run_key(record.run_id)),
        )
        return {evaluation_id for (evaluation_id,) in rows}
