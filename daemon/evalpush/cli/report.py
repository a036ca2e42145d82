"""What people read: the `status` table and JSON rows, and `push`'s progress and result lines.

A run's `holder` is the live process holding its claim (pid, host, since), or none. A run left
`uploading` that no live process holds (its uploader was killed, or stopped on a ledger error)
shows as `ready`, interrupted: the next push resumes it.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import msgspec

from evalpush.client import AUTH, PAUSED, UNREACHABLE, Outage, OutageEvent
from evalpush.core import paths
from evalpush.core.ids import short_id
from evalpush.core.setaside import SetAside
from evalpush.core.states import State
from evalpush.core.words import format_duration
from evalpush.ledger import Holder, Ledger, Process, RunRecord, gatefile, holder_alive
from evalpush.push import PushResult
from evalpush.runs import settles_in, traces_file

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


def run_detail(ledger: Ledger, record: RunRecord, alive: Alive | None = None) -> dict[str, Any]:
    """One run in full: what `status RUN` shows, and each object of `status --json`."""
    alive = alive or _alive_now()
    holder = _holder(record, alive)
    set_aside = ledger.set_aside(record)
    row = _row(record, len(set_aside), holder)
    claim = record.holder
    evaluations = [
        {
            "evaluation_id": earlier.evaluation_id,
            "url": earlier.viewer_url,
            "outcome": earlier.outcome,
            "why": _HISTORY_REASONS.get(earlier.outcome, earlier.outcome),
            "at": earlier.at,
        }
        for earlier in ledger.history(record)
    ]
    if record.evaluation_id is not None:
        evaluations.append(
            {
                "evaluation_id": record.evaluation_id,
                "url": record.viewer_url,
                "outcome": "current",
                "why": "finalized" if record.state == State.FINALIZED else "open",
                "at": record.finalized_at,
            }
        )
    return {
        **row,
        "kind": record.kind,
        "step": record.step,
        "bytes_sent": record.bytes_sent,
        "trace_bytes": record.upload_end,
        "acked_bytes": record.acked_offset,
        "last_error_at": record.last_error_at if record.last_error else None,
        "claim": None
        if claim is None
        else {
            "pid": claim.pid,
            "host": claim.host,
            "since": claim.since,
            "lease_expires": claim.expires,
            "alive": holder is not None,
        },
        "created_at": record.created_at,
        "finalized_at": record.finalized_at,
        "settles_at": record.settles_at,
        "evaluations": evaluations,
        "set_aside_records": [item.as_json() for item in set_aside],
    }


def _when(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(seconds))


def _nbytes(count: int | None) -> str:
    if count is None:
        return "-"
    return f"{count:,} B" if count < 1000 else f"{count:,} B ({count / 1e6:.1f} MB)"


def detail_text(detail: dict[str, Any]) -> str:
    """`status RUN`: one run in full, a labelled line per fact, then its evaluations and its
    set-aside records."""
    lines = [
        ("run", detail["run_id"]),
        ("path", detail["path"]),
        ("kind", detail["kind"]),
        ("state", detail["state"] + (f": {detail['reason']}" if detail["reason"] else "")),
        ("step", detail["step"]),
        (
            "samples",
            f"{detail['samples_sent']:,} sent of {detail['samples_seen']:,} seen, "
            f"{_nbytes(detail['bytes_sent'])} of requests",
        ),
        (
            "trace file",
            f"{_nbytes(detail['acked_bytes'])} acknowledged of {_nbytes(detail['trace_bytes'])}"
            " scanned"
            if detail["trace_bytes"] is not None
            else "not scanned yet",
        ),
        ("attempts", str(detail["attempts"])),
    ]
    if detail["last_error"]:
        lines.append(
            ("last error", f"{detail['last_error']} (at {_when(detail['last_error_at'])})")
        )
    claim = detail["claim"]
    if claim is None:
        lines.append(("claim", "nobody holds it"))
    else:
        who = holder_text(claim) if claim["alive"] else f"pid {claim['pid']} on {claim['host']}"
        lines.append(
            ("claim", who + ("" if claim["alive"] else " (gone: the next push takes it over)"))
        )
    lines += [
        ("created", _when(detail["created_at"])),
        ("updated", _when(detail["updated_at"])),
        ("finalized", _when(detail["finalized_at"])),
    ]
    if detail["settles_at"] is not None and detail["state"] == State.WAITING:
        lines.append(("settles", _when(detail["settles_at"])))
    out = [f"{label + ':':<12}{value}" for label, value in lines]
    out.append(f"evaluations: {len(detail['evaluations']) or 'none yet'}")
    for evaluation in detail["evaluations"]:
        out.append(
            f"  {evaluation['outcome']:<11} {evaluation['url'] or evaluation['evaluation_id']}"
            f"  {evaluation['why']}, {_when(evaluation['at'])}"
        )
    records = detail["set_aside_records"]
    out.append(f"set aside:  {len(records) or 'nothing'}")
    for item in records:
        out.append(
            f"  line {item['line']}, offset {item['offset']}, {item['size']:,} B, "
            f"{item['kind']}: {item['reason']}"
        )
    return paths.printable("\n".join(out))


def daemon_text(view: gatefile.DaemonView | None, now: float | None = None) -> str | None:
    """The running daemon's line for `status`: who it is and what the platform is doing, or
    None when no daemon runs on this state directory."""
    if view is None:
        return None
    now = time.time() if now is None else now
    where = "" if view.host == socket.gethostname() else f" on {view.host}"
    gate = view.gate
    if gate.get("mode") in (UNREACHABLE, AUTH, PAUSED) and gate.get("since") is not None:
        next_at = gate.get("next_probe_at")
        platform = Outage(
            OutageEvent.ONGOING,
            gate["mode"],
            now - float(gate["since"]),
            int(gate.get("attempts") or 0),
            None if next_at is None else max(0.0, float(next_at) - now),
            int(gate.get("runs_waiting") or 0),
            str(gate.get("reason") or ""),
        ).message
    else:
        platform = "platform reachable"
    runs = view.status.split(", platform ")[0]  # the STATUS line's counts; its gate is above
    line = f"daemon:     pid {view.pid}{where}: {platform} ({runs})"
    age = view.age(now)
    if age > gatefile.SILENT_SECONDS:
        line += f"; last heard from {format_duration(age)} ago"
    return line


def holder_text(holder: dict[str, Any] | None) -> str:
    """`pid 123 since 14:02:07` (`on HOST` added for another host), or empty."""
    if holder is None:
        return ""
    where = "" if holder["host"] == socket.gethostname() else f" on {holder['host']}"
    since = time.strftime("%H:%M:%S", time.localtime(holder["since"]))
    return f"pid {holder['pid']}{where} since {since}"


TABLE_COLUMNS = 120
"""The default table fits this many columns: one line per run, its detail cut to fit (the full
reason and path are in `status RUN`)."""


def status_table(
    rows: list[dict[str, Any]], *, ledger: str | Path | None = None, wide: bool = False
) -> str:
    """The runs one a line, fitting TABLE_COLUMNS; `wide` (the demo's): with each viewer URL
    and path, however wide that makes it."""
    if not rows:
        return "no runs in the ledger yet" + (f" ({ledger})" if ledger is not None else "")
    header = ("RUN", "STATE", "SENT/SEEN", "ASIDE", "HOLDER", "EVALUATION", "DETAIL")
    table = [header]
    for row in rows:
        sent = "" if row["samples_sent"] is None else f"{row['samples_sent']}/{row['samples_seen']}"
        detail = row["last_error"] or row["reason"] or ""
        table.append(
            (
                short_id(row["run_id"]),
                row["state"],
                sent,
                str(row["set_aside"] or ""),
                holder_text(row["holder"]),
                (row["url"] or row["evaluation_id"] or "")
                if wide
                else (row["evaluation_id"] or "")[:8],
                " ".join(paths.printable(f"{detail}  {row['path']}" if wide else detail).split()),
            )
        )
    widths = [max(len(r[i]) for r in table) for i in range(len(header) - 1)]
    room = 1 << 30 if wide else max(20, TABLE_COLUMNS - sum(widths) - 2 * len(widths))
    return "\n".join(
        (
            "  ".join(cell.ljust(w) for cell, w in zip(r[:-1], widths, strict=True))
            + "  "
            + _cut(r[-1], room)
        ).rstrip()
        for r in table
    )


def _cut(text: str, room: int) -> str:
    return text if len(text) <= room else text[: room - 1] + "…"


def select_rows(
    rows: list[dict[str, Any]], *, states: list[str] | None, limit: int | None
) -> list[dict[str, Any]]:
    """`status --state S --limit N`: the rows in those states, the N most recently updated (in
    the ledger's order)."""
    if states:
        rows = [row for row in rows if row["state"] in states]
    if limit is not None and len(rows) > limit:
        keep = {
            id(row) for row in sorted(rows, key=lambda r: r["updated_at"], reverse=True)[:limit]
        }
        rows = [row for row in rows if id(row) in keep]
    return rows


def mark_paused(rows: list[dict[str, Any]], view: gatefile.DaemonView | None) -> None:
    """Runs ready or uploading while the running daemon's platform is down say so: they are
    paused by the outage, not stuck."""
    mode = None if view is None else view.gate.get("mode")
    if mode not in (UNREACHABLE, AUTH, PAUSED):
        return
    why = {
        UNREACHABLE: "platform unreachable",
        AUTH: "API key refused",
        PAUSED: "platform asked to wait",
    }[mode]
    for row in rows:
        if row["state"] in (State.READY, State.UPLOADING):
            row["reason"] = f"paused: {why}; resumes by itself when it answers"
            row["paused"] = True


def daemon_json(view: gatefile.DaemonView | None, last: gatefile.LastSeen | None) -> dict:
    """The daemon's view for `status --json`: running (its pid, host, when it last wrote, its
    STATUS line and gate), or not (`last_seen`: the pid, host and time it was last seen, and
    whether it stopped cleanly; null when none ever ran here)."""
    if view is not None:
        return {"running": True, **msgspec.structs.asdict(view)}
    return {"running": False, "last_seen": None if last is None else msgspec.structs.asdict(last)}


def fleet_alive(ledger: Ledger, now: float | None = None) -> Alive:
    """`_alive_now`, less the holders that are daemons `status` shows as not running (stopped,
    or not heard from): a run is not shown held by a daemon shown gone."""
    alive, now = _alive_now(), time.time() if now is None else now
    gone = [d for d in ledger.daemons() if not d.running(now, alive)]
    if not gone:
        return alive
    return lambda holder: alive(holder) and not any(d.holds(holder) for d in gone)


def fleet_rows(ledger: Ledger, now: float | None = None) -> list[dict[str, Any]]:
    """Every daemon the ledger heard from lately (a fleet's hosts): running (its heartbeat not
    three periods late, its process not seen gone), stopped, or not heard from since when; and
    how many runs each holds (the runs whose `holder` it is)."""
    alive = _alive_now()
    now = time.time() if now is None else now
    daemons = [(d, d.running(now, alive)) for d in ledger.daemons()]
    holders = (  # the live claims, read only when some daemon may hold one
        [h for r in ledger.all() if (h := r.holder) is not None and alive(h)]
        if any(running for _, running in daemons)
        else []
    )
    rows = []
    for d, running in daemons:
        state = "running" if running else ("stopped" if d.stopped_at is not None else "silent")
        rows.append(
            {
                "host": d.host,
                "pid": d.pid,
                "version": d.version,
                "observer": d.observer,
                "started_at": d.started_at,
                "seen_at": d.seen_at,
                "running": running,
                "state": state,
                "stopped_at": d.stopped_at,
                "holds": sum(1 for h in holders if d.holds(h)) if running else 0,
            }
        )
    return rows


def fleet_text(rows: list[dict[str, Any]], now: float | None = None) -> str:
    """`daemons:` and a line per daemon: which run, which stopped or went silent, and when."""
    now = time.time() if now is None else now
    running = sum(row["running"] for row in rows)
    lines = [f"daemons:    {running} running, {len(rows) - running} not (shared ledger)"]
    for row in rows:
        who = f"{row['host']} pid {row['pid']} ({row['version']}; {row['observer'] or '-'})"
        ago = format_duration(max(0.0, now - row["seen_at"]))
        if row["running"]:
            held = row.get("holds", 0)
            state = f"running since {_when(row['started_at'])}, heard from {ago} ago" + (
                f", holds {held} run{'' if held == 1 else 's'}" if held else ""
            )
        elif row["stopped_at"] is not None:
            state = f"stopped at {_when(row['stopped_at'])}"
        else:
            state = f"not heard from since {_when(row['seen_at'])} ({ago} ago): gone?"
        lines.append(f"  {paths.printable(who)}: {state}")
    return "\n".join(lines)


def not_running_text(last: gatefile.LastSeen | None) -> str:
    """`daemon: not running (last seen pid N at T)`: a daemon that stopped or vanished is
    not the same as one that never ran."""
    if last is None:
        return "daemon:     not running (none has run on this state directory)"
    where = "" if last.host == socket.gethostname() else f" on {last.host}"
    how = "stopped" if last.stopped else "gone without stopping (killed?)"
    return f"daemon:     not running (last seen pid {last.pid}{where} at {_when(last.at)}; {how})"


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


def push_object(result: PushResult, set_aside: list[SetAside]) -> dict[str, Any]:
    """One run of `push --json` (like `prime eval push -o json`'s results): its path, run id,
    state, evaluation and viewer URL, samples, what was set aside, and the error if any;
    `status` is `success` for a finalized or skipped run with nothing set aside."""
    record = result.record
    error = result.error
    if result.busy is not None:
        error = f"being uploaded by pid {result.busy.pid} on {result.busy.host}"
    return {
        "path": paths.printable(paths.display(result.path)),
        "run_id": None if record is None else record.run_id,
        "state": "busy" if result.busy is not None else (None if record is None else record.state),
        "status": "success" if result.ok else "failed",
        "evaluation_id": None if record is None else record.evaluation_id,
        "url": None if record is None else record.viewer_url,
        "samples_sent": None if record is None else record.samples_sent,
        "samples_seen": None if record is None else record.samples_seen,
        "already_finalized": result.already,
        "uploaded_by": result.uploaded_by,
        "copy_of": result.copy_of,
        "error": None if error is None else paths.printable(error),  # may name a path
        "set_aside": len(set_aside),
        "set_aside_records": [item.as_json() for item in set_aside],
    }


def trace_sizes(found: list[Path]) -> dict[Path, int]:
    """Each run directory's trace file size now (`stat`): the progress bar's total, known before
    the first byte is sent. A file that cannot be looked at counts 0."""
    sizes = {}
    for directory in found:
        traces = traces_file(directory)
        try:
            sizes[directory] = traces.stat().st_size if traces is not None else 0
        except OSError:
            sizes[directory] = 0
    return sizes


class PushProgress:
    """What `push` tells a person while it works, on `err` (stderr): outages as they begin, go
    on and end; and the result of each run on `out` (stdout) as it finishes (unless `quiet`,
    for `--json`). This base class draws no bar: one line per run, for a stream that is not
    a terminal. `LiveProgress` adds the bar."""

    def __init__(self, out: IO[str], err: IO[str], sizes: dict[Path, int], *, quiet: bool = False):
        self._out, self._err = out, err
        self._quiet = quiet
        self._lock = threading.Lock()
        self._sizes = sizes
        self._path_of = {paths.raw(path): path for path in sizes}  # as the ledger records it
        self._bytes: dict[Path, int] = {}
        self._samples: dict[Path, int] = {}
        self._runs_done = 0

    def __enter__(self) -> PushProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    @property
    def console_stream(self) -> IO[str]:
        """Where other lines for stderr (the log) go while the progress shows."""
        return self._err

    def update(self, record: RunRecord) -> None:
        """After each acknowledged batch (upload threads): the run's bytes and samples so far."""
        path = self._path_of.get(record.path_raw)
        if path is None:
            return
        with self._lock:
            self._bytes[path] = min(record.acked_offset, self._sizes[path])
            self._samples[path] = record.samples_sent
        self._draw()

    def done(self, result: PushResult) -> None:
        """A run finished: its line, and its bytes counted in full when it needs nothing more."""
        record = result.record
        with self._lock:
            self._runs_done += 1
            if record is not None and record.state in (State.FINALIZED, State.SKIPPED):
                self._bytes[result.path] = self._sizes.get(result.path, 0)
            elif record is not None and result.busy is None:
                self._bytes[result.path] = min(record.acked_offset, self._sizes.get(result.path, 0))
            if record is not None and result.busy is None:
                self._samples[result.path] = record.samples_sent
        self._draw()
        if not self._quiet:
            self._print(self._out, push_line(result))

    def outage(self, outage: Outage) -> None:
        """The gate's report of an outage: one line on stderr."""
        line = outage.message
        if outage.event == OutageEvent.STARTED and outage.reason:
            line += f" ({outage.reason})"
        elif outage.event == OutageEvent.ENDED:
            line += f" after {format_duration(outage.seconds)} ({outage.attempts} attempts)"
        self._print(self._err, f"evalpush: {line}")

    def _print(self, stream: IO[str], line: str) -> None:
        with self._lock:
            stream.write(line + "\n")
            stream.flush()

    def _draw(self) -> None:
        """Bring the bar up to date (no bar here)."""

    def totals(self) -> tuple[int, int, int, int, int]:
        """(bytes done, bytes in all, samples sent, runs done, runs in all)."""
        with self._lock:
            return (
                sum(self._bytes.values()),
                sum(self._sizes.values()),
                sum(self._samples.values()),
                self._runs_done,
                len(self._sizes),
            )


class LiveProgress(PushProgress):
    """A `rich.progress` bar on a terminal: trace bytes done of the total (every run's trace
    file size, from `stat`, before the first byte is sent) with rate and time left, samples sent
    with their rate, runs done of the total; redrawn ten times a second, and a final frame with
    the final counts when the push ends, however it ends. Result and outage lines print above
    the bar (and stdout's through it, when stdout is the same terminal)."""

    def __init__(self, out: IO[str], err: IO[str], sizes: dict[Path, int], *, quiet: bool = False):
        super().__init__(out, err, sizes, quiet=quiet)
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TaskProgressColumn,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )
        from rich.table import Column

        self._console = Console(file=err, highlight=False)

        def fixed() -> Column:  # a column that never wraps (a narrow terminal cuts it short)
            return Column(no_wrap=True)

        self._bar = Progress(
            BarColumn(bar_width=24),
            TaskProgressColumn(table_column=fixed()),
            DownloadColumn(table_column=fixed()),
            TransferSpeedColumn(table_column=fixed()),
            TextColumn(
                "{task.fields[samples]} samples {task.fields[sample_rate]}/s",
                table_column=fixed(),
            ),
            TextColumn("{task.fields[runs_done]}/{task.fields[runs]} runs", table_column=fixed()),
            TimeRemainingColumn(table_column=fixed()),
            console=self._console,
            redirect_stdout=out.isatty(),
            redirect_stderr=True,
        )
        self._task = self._bar.add_task(
            "push",
            total=sum(sizes.values()),
            samples="0",
            sample_rate="0",
            runs_done=0,
            runs=len(sizes),
        )
        self._started = time.monotonic()

    def __enter__(self) -> LiveProgress:
        self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._draw()  # the final frame: the counts as they ended
        self._bar.stop()

    @property
    def console_stream(self) -> IO[str]:
        return sys.stderr  # rich's stand-in for stderr while the bar shows: lines go above it

    def _print(self, stream: IO[str], line: str) -> None:
        if stream is self._err or stream.isatty():
            self._console.print(line, markup=False, highlight=False, soft_wrap=True)
        else:
            super()._print(stream, line)

    def _draw(self) -> None:
        done, _total, samples, runs_done, _runs = self.totals()
        elapsed = max(time.monotonic() - self._started, 1e-9)
        self._bar.update(
            self._task,
            completed=done,
            samples=f"{samples:,}",
            sample_rate=f"{samples / elapsed:,.0f}",
            runs_done=runs_done,
        )


def push_progress(
    out: IO[str], err: IO[str], found: list[Path], *, quiet: bool = False
) -> PushProgress:
    """A bar on a terminal, lines otherwise."""
    sizes = trace_sizes(found)
    if err.isatty():
        return LiveProgress(out, err, sizes, quiet=quiet)
    return PushProgress(out, err, sizes, quiet=quiet)
