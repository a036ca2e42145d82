"""Feeding a waiting run's lines to a running scan, so that its upload need not scan again.

From a waiting run's second look on, the tracker gives it a `Feeder`: a `LineCounter` of its own
reads the trace file's new complete lines from byte 0 and hands them to an `upload.RunningScan`
(decoded once, as the upload's scan step would), `FEED_BYTES` at a time and once more when the
run is ready. When the run is queued, `prescan` gives the scan step's results for the file as
the feeder last saw it, or None when the upload must scan it itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from evalpush.config import Config
from evalpush.core.states import State, Step
from evalpush.ledger import RunRecord
from evalpush.runs import LineCount, LineCounter, Run
from evalpush.upload import Prescan, RunningScan

FEED_BYTES = 4 << 20
"""A waiting run's new lines go to its running scan once this many bytes wait to be fed (and
when it is ready): decoded in runs of thousands of lines, not a few at each look, which costs
less CPU per line; the catch-up at readiness is at most this much."""


class Feeder:
    """One waiting run's running scan and the counter that feeds it. It owns what was fed (the
    scan, and the file as the counter last saw it); the tracker's own counter decides readiness.
    Loop thread only, like the tracker's looks."""

    def __init__(
        self, traces: Path, config: Config, *, clock: Callable[[], float] = time.time
    ) -> None:
        self._traces = traces
        self._config = config
        self._clock = clock
        self._start()

    def _start(self) -> None:
        """From byte 0 with nothing fed: a new feeder, or one whose file went away."""
        self._scan = RunningScan(
            checked=self._config.convert.on_bad_line == "hold",
            max_line_bytes=self._config.read.max_line_bytes,
        )
        self._counter = LineCounter(
            self._traces, clock=self._clock, max_line_bytes=self._config.read.max_line_bytes
        )
        self._fed: LineCount | None = None  # the trace file as the feeder last saw it

    def feed(self, count: LineCount, *, ready: bool) -> None:
        """Feed the run's new lines (the tracker's `count` says how far the file goes) once
        FEED_BYTES of them wait, or now that it is ready (its own counter: a replacement, a
        shrink or a rewrite in place restarts it, see `LineCounter`)."""
        fed_to = self._fed.offset if self._fed is not None else 0
        if not ready and count.offset - fed_to < FEED_BYTES and not count.replaced:
            return
        try:
            self._fed = self._counter.update(self._scan)
        except OSError:  # gone since the count: the next look decides; nothing fed stands
            self._start()

    def prescan(self, run: Run, record: RunRecord) -> Prescan | None:
        """The scan step's results for the run, from its running scan; None when the upload
        must scan: nothing was fed, the running scan cannot stand for the file
        (`RunningScan.result`), the row is not a waiting one at its scan, or the scan step
        would stop there (no environment name, no line to send, bad lines to hold)."""
        if self._fed is None or not run.env_name:
            return None
        if record.state != State.WAITING or record.step != Step.SCAN or record.upload_end:
            return None
        scanned = self._scan.result(self._fed.file)
        if scanned is None or scanned.found.end != self._fed.offset:
            return None
        found = scanned.found
        if not found.totals.traces:
            return None
        hold = self._config.convert.on_bad_line == "hold"
        if found.set_aside and hold and not record.release_hold:
            return None
        return scanned


__all__ = ["FEED_BYTES", "Feeder"]
