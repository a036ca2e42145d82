"""What people read: the `status` table and JSON rows, and `push`'s progress and result lines.

A run's `holder` is the live process holding its claim (pid, host, since), or none. A run left
`uploading` that no live process holds (its uploader was killed, or stopped on a ledger error)
shows as `ready`, interrupted: the next push resumes it.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from typing import IO, Any

from evalpush import paths
from evalpush.claims import Holder, Process, holder_alive
from evalpush.ledger import Ledger, RunRecord, State
from evalpush.push import PushResult
from evalpush.runs import settles_in

MIB = 1024 * 1024

Alive = Callable[[Holder], bool]


def _alive_now() -> Alive:
    """Whether a holder is alive, as this process can tell now."""
    here, now = Process.current(), time.time()
    return lambda holder: holder_alive(holder, here, now)


def _holder(record: RunRecord, alive: Alive) -> dict[str, Any] | None:
    holder = record.holder
    if holder is None or not alive(holder):
        return None
    return {"pid": holder.pid, "host": holder.host, "since": holder.since}


def _row(record: RunRecord, set_aside: int, holder: dict[str, Any] | None) -> dict[str, Any]:
    state, reason = record.state, record.reason
    if state == State.UPLOADING and holder is None:
        state = State.READY
        reason = f"interrupted at step {record.step} (no process is uploading it); push resumes it"
    elif state == State.UPLOADING and not reason:
        reason = f"at step {record.step}"
    elif state == State.WAITING and record.settles_at is not None:
        reason = ", ".join(filter(None, (reason, settles_in(record.settles_at, time.time()))))
    return {
        "run_id": record.run_id,
        "path": record.path,
        "state": state,
        "reason": reason,
        "samples_sent": record.samples_sent,
        "samples_seen": record.samples_seen,
        "set_aside": set_aside,
        "evaluation_id": record.evaluation_id,
        "url": record.viewer_url,
        "last_error": record.last_error,
        "attempts": record.attempts,
        "updated_at": record.updated_at,
        "holder": holder,
    }


_HISTORY_REASONS = {
    "superseded": "superseded: the run changed after this evaluation was finalized",
    "cancelled": "closed out: the trace file was replaced or deleted mid-upload",
    "deleted": "deleted on the platform mid-upload; uploaded again",
    "closed": "closed on the platform mid-upload; uploaded again",
    "duplicate": "a second evaluation of this run (an older evalpush saw it at another path)",
}


def status_rows(ledger: Ledger, alive: Alive | None = None) -> list[dict[str, Any]]:
    """One row per run, then one per earlier evaluation of a run (state `superseded`)."""
    alive = alive or _alive_now()
    counts = ledger.set_aside_counts()
    rows = []
    for record in ledger.all():
        holder = _holder(record, alive)
        rows.append(_row(record, counts.get(record.id, 0), holder))
        for earlier in ledger.history(record):
            rows.append(
                {
                    **_row(record, 0, None),
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


def holder_text(holder: dict[str, Any] | None) -> str:
    """`pid 123 since 14:02:07` (`on HOST` added for another host), or empty."""
    if holder is None:
        return ""
    where = "" if holder["host"] == socket.gethostname() else f" on {holder['host']}"
    since = time.strftime("%H:%M:%S", time.localtime(holder["since"]))
    return f"pid {holder['pid']}{where} since {since}"


def status_table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no runs in the ledger yet"
    header = ("RUN", "STATE", "SENT/SEEN", "ASIDE", "HOLDER", "EVALUATION", "DETAIL")
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
                holder_text(row["holder"]),
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
    """One line per run directory: what `push` did with it."""
    return paths.printable(_push_line(result))


def _push_line(result: PushResult) -> str:
    record = result.record
    path = paths.display(result.path)
    if result.busy is not None:
        return f"busy       {path}: being uploaded by pid {result.busy.pid}" + (
            "" if result.busy.host == socket.gethostname() else f" on {result.busy.host}"
        )
    if record is None:
        return f"failed     {path}: {result.error}"
    where = f"{record.samples_sent}/{record.samples_seen} samples"
    if result.set_aside:
        where += f", {result.set_aside} set aside (see `evalpush status`)"
    if result.uploaded_by is not None:
        where += f", uploaded by pid {result.uploaded_by}"
    if result.copy_of is not None:
        where += f"; a copy of the run at {result.copy_of}, not uploaded on its own"
    if record.state == State.FINALIZED and result.error:
        return f"failed     {path}: {result.error}; the run stays finalized -> {record.viewer_url}"
    if record.state == State.FINALIZED:
        done = "already finalized, nothing sent" if result.already else where
        if result.already and result.copy_of is not None:
            done += f" (a copy of the run at {result.copy_of})"
        return f"finalized  {path}: {done} -> {record.viewer_url}"
    if record.state == State.SKIPPED:
        return f"skipped    {path}: {record.reason}"
    return f"{record.state:<10} {path}: {result.error or record.reason} ({where})"


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
