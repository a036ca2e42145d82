"""What `push` shows: its progress while it runs (a bar on a terminal, lines elsewhere) and one
line, or one JSON object, per run directory for what became of it."""

from __future__ import annotations

import socket
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from evalpush.app import Attempt, Outcome
from evalpush.core import paths
from evalpush.core.outage import Outage, OutageEvent
from evalpush.core.setaside import SetAside
from evalpush.core.states import State
from evalpush.core.words import format_duration
from evalpush.ledger import RunRecord
from evalpush.runs import traces_file


def push_line(result: Attempt) -> str:
    """One line per run directory: what `push` did with it."""
    return paths.printable(_push_line(result))


def _push_line(result: Attempt) -> str:
    record = result.record
    path = paths.display(result.path)
    if result.busy is not None:
        return f"busy       {path}: being uploaded by pid {result.busy.pid}" + (
            "" if result.busy.host == socket.gethostname() else f" on {result.busy.host}"
        )
    if record is None:
        return f"failed     {path}: {result.error}"
    where = f"{record.samples_sent}/{record.samples_seen} samples"
    if result.outcome == Outcome.PARTIAL:
        where = (
            f"{record.samples_sent}/{record.expected_traces} samples "
            f"(PARTIAL: {result.missing} expected traces missing)"
        )
    if result.set_aside:
        where += f", {result.set_aside} set aside (see `evalpush status`)"
    if result.uploaded_by is not None:
        where += f", uploaded by pid {result.uploaded_by}"
    if result.copy_of is not None:
        where += f"; a copy of the run at {result.copy_of}, not uploaded on its own"
    if record.state == State.FINALIZED and result.error:
        return f"failed     {path}: {result.error}; the run stays finalized -> {record.viewer_url}"
    if result.outcome == Outcome.PARTIAL:
        return f"partial    {path}: {where} -> {record.viewer_url}"
    if record.state == State.FINALIZED:
        done = "already finalized, nothing sent" if result.outcome == Outcome.ALREADY else where
        if result.outcome == Outcome.ALREADY and result.copy_of is not None:
            done += f" (a copy of the run at {result.copy_of})"
        return f"finalized  {path}: {done} -> {record.viewer_url}"
    if record.state == State.SKIPPED:
        return f"skipped    {path}: {record.reason}"
    if result.outcome == Outcome.FOLLOWING:
        return (
            f"following  {path}: a daemon uploads it while it is written ({record.samples_sent} "
            f"samples so far) and finalizes it once it is finished -> {record.viewer_url}"
        )
    return f"{record.state:<10} {path}: {result.error or record.reason} ({where})"


def push_object(result: Attempt, set_aside: list[SetAside]) -> dict[str, Any]:
    """One run of `push --json` (like `prime eval push -o json`'s results): its path, run id,
    state, evaluation and viewer URL, samples (and the traces expected, and missing), what was
    set aside, and the error if any; `status` is `success` for a finalized or skipped run with
    nothing set aside, `partial` for one finalized short of its expected traces, `following`
    for one a daemon uploads while it is written."""
    record = result.record
    error = result.error
    if result.busy is not None:
        error = f"being uploaded by pid {result.busy.pid} on {result.busy.host}"
    status = "success" if result.ok else "failed"
    if result.outcome in (Outcome.PARTIAL, Outcome.FOLLOWING):
        status = str(result.outcome)
    return {
        "path": paths.printable(paths.display(result.path)),
        "run_id": None if record is None else record.run_id,
        "state": "busy" if result.busy is not None else (None if record is None else record.state),
        "status": status,
        "outcome": result.outcome,
        "evaluation_id": None if record is None else record.evaluation_id,
        "url": None if record is None else record.viewer_url,
        "samples_sent": None if record is None else record.samples_sent,
        "samples_seen": None if record is None else record.samples_seen,
        "expected_traces": None if record is None else record.expected_traces,
        "missing_traces": result.missing,
        "already_finalized": result.outcome == Outcome.ALREADY,
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

    def done(self, result: Attempt) -> None:
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
