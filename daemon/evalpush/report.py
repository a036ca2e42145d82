"""What people read: the `status` table and JSON rows, and `push`'s progress and result lines."""

from __future__ import annotations

import threading
import time
from typing import IO, Any

from evalpush.ledger import Ledger, RunRecord, State
from evalpush.service import PushResult

MIB = 1024 * 1024


def _row(record: RunRecord, set_aside: int) -> dict[str, Any]:
    reason = record.reason
    if record.state == State.UPLOADING and not reason:
        reason = f"at step {record.step}"
    return {
        "run_id": record.run_id,
        "path": record.path,
        "state": record.state,
        "reason": reason,
        "samples_sent": record.samples_sent,
        "samples_seen": record.samples_seen,
        "set_aside": set_aside,
        "evaluation_id": record.evaluation_id,
        "url": record.viewer_url,
        "last_error": record.last_error,
        "attempts": record.attempts,
        "updated_at": record.updated_at,
    }


_HISTORY_REASONS = {
    "superseded": "superseded: the run changed after this evaluation was finalized",
    "cancelled": "closed out: the trace file was replaced or deleted mid-upload",
    "deleted": "deleted on the platform mid-upload; uploaded again",
    "closed": "closed on the platform mid-upload; uploaded again",
}


def status_rows(ledger: Ledger) -> list[dict[str, Any]]:
    """One row per run, then one per earlier evaluation of a run (state `superseded`)."""
    counts = ledger.set_aside_counts()
    rows = []
    for record in ledger.all():
        rows.append(_row(record, counts.get(record.id, 0)))
        for earlier in ledger.history(record):
            rows.append(
                {
                    **_row(record, 0),
                    "state": State.SUPERSEDED,
                    "reason": _HISTORY_REASONS.get(earlier.outcome, earlier.outcome),
                    "samples_sent": None,
                    "samples_seen": None,
                    "evaluation_id": earlier.evaluation_id,
                    "url": earlier.viewer_url,
                    "last_error": None,
                    "updated_at": earlier.at,
                }
            )
    return rows


def status_table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no runs in the ledger yet"
    header = ("RUN", "STATE", "SENT/SEEN", "ASIDE", "EVALUATION", "DETAIL")
    table = [header]
    for row in rows:
        sent = "" if row["samples_sent"] is None else f"{row['samples_sent']}/{row['samples_seen']}"
        detail = row["last_error"] or row["reason"] or ""
        table.append(
            (
                row["run_id"][:8],
                row["state"],
                sent,
                str(row["set_aside"] or ""),
                row["url"] or row["evaluation_id"] or "",
                f"{detail}  {row['path']}".strip(),
            )
        )
    widths = [max(len(r[i]) for r in table) for i in range(len(header) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1]
        for r in table
    )


def push_line(result: PushResult) -> str:
    record = result.record
    if record is None:
        return f"failed     {result.path}: {result.error}"
    where = f"{record.samples_sent}/{record.samples_seen} samples"
    if result.set_aside:
        where += f", {result.set_aside} set aside (see `evalpush status`)"
    if record.state == State.FINALIZED:
        done = "already finalized, nothing sent" if result.already else where
        return f"finalized  {result.path}: {done} -> {record.viewer_url}"
    if record.state == State.SKIPPED:
        return f"skipped    {result.path}: {record.reason}"
    return f"{record.state:<10} {result.path}: {result.error or record.reason} ({where})"


class PushProgress:
    """A one-line progress bar on a TTY (samples and MB across runs); silent otherwise."""

    def __init__(self, stream: IO[str], *, interval_seconds: float = 0.2):
        self._stream = stream
        self._enabled = stream.isatty()
        self._interval = interval_seconds
        self._lock = threading.Lock()
        self._runs: dict[int, RunRecord] = {}
        self._last = 0.0

    def update(self, record: RunRecord) -> None:
        if not self._enabled:
            return
        with self._lock:
            self._runs[record.id] = record
            now = time.monotonic()
            if now - self._last < self._interval:
                return
            self._last = now
            sent = sum(r.samples_sent for r in self._runs.values())
            seen = sum(r.samples_seen for r in self._runs.values())
            mb = sum(r.bytes_sent for r in self._runs.values()) / MIB
            width = 30
            filled = int(width * sent / seen) if seen else 0
            bar = "#" * filled + "-" * (width - filled)
            self._stream.write(f"\r[{bar}] {sent}/{seen} samples  {mb:.1f} MB  ")
            self._stream.flush()

    def finish(self) -> None:
        if self._enabled and self._runs:
            self._stream.write("\n")
            self._stream.flush()
