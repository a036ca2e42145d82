"""When a run is finished (docs/ARCHITECTURE.md, "Readiness"): the expected count of lines, the
marker file, or no growth for `runs.settle_seconds`.

Everything it looks at is cheap to observe (`RunFacts`, kept current by `LineCounter`) and one
pure function decides (`readiness`), so the daemon can re-decide on every event and every
rescan, and `status` can say why a run still waits.
"""

from __future__ import annotations

import enum
import math

import msgspec

from evalpush.config import RunsConfig
from evalpush.core.words import format_duration


class ReadyRule(enum.StrEnum):
    """Which rule found a run finished (the first that holds, in docs/ARCHITECTURE.md's order ("Readiness"))."""

    EXPECTED_COUNT = "expected count"
    MARKER = "marker"
    SETTLED = "settled"


class ReadinessRules(msgspec.Struct, frozen=True):
    """The configured rules: `runs.settle_seconds` and `runs.marker` ("" turns the marker off)."""

    settle_seconds: float
    marker: str = ""

    @classmethod
    def from_config(cls, runs: RunsConfig) -> ReadinessRules:
        return cls(settle_seconds=runs.settle_seconds, marker=runs.marker)


class RunFacts(msgspec.Struct, frozen=True, gc=False):
    """What readiness looks at; every field is cheap to observe (see `LineCounter`).

    Times are wall-clock epoch seconds (`time.time()`), the clock file mtimes are in.
    """

    lines: int  # complete (`\n`-terminated) trace lines
    expected: int | None  # `Run.expected_traces`: None when config.toml has no num_tasks
    marker_present: bool  # the marker file exists in the run directory
    mtime: float  # the trace file's modification time
    grown_at: float | None  # when the daemon last saw the file grow, or first looked at it
    again_after: float | None = None  # a finalized run that changed: no new upload before this

    @property
    def last_growth(self) -> float:
        # The later of the two: mtime alone would trust another host's clock (NFS: a file
        # server behind this host's clock makes a file being written look settled), so the
        # settle time counts at least from the daemon's own first look at the file.
        return self.mtime if self.grown_at is None else max(self.mtime, self.grown_at)


class Readiness(msgspec.Struct, frozen=True, gc=False):
    """A run's readiness: `ready` with the `rule` that fired, or waiting; `reason` is for people."""

    ready: bool
    rule: ReadyRule | None
    reason: str
    settles_at: float  # when the settle rule fires if the file does not grow again
    progress: str = ""  # a waiting run's reason without the countdown (what the ledger keeps)


MARKER_SETTLE_SECONDS = 10.0
"""A run past its expected count with its marker present is finished once its file has not grown
for this long (or `runs.settle_seconds`, if shorter): a marker left in place while lines keep
coming must not finish it at every line."""


def readiness(facts: RunFacts, now: float, rules: ReadinessRules) -> Readiness:
    """Is the run finished? The first rule that holds, in order: expected count, marker, settle.

    A run whose file holds more lines than expected is still being written (or was resumed): the
    expected count no longer says it is finished, so it waits for its file to settle, or for its
    marker and a short quiet (`MARKER_SETTLE_SECONDS`). A finalized run that changed
    (`again_after`) is not finished before that time, whatever the rules say: it is uploaded
    again at most once per settle period while it keeps changing.

    Pure: the same facts and `now` give the same answer, so a caller can ask as often as it likes
    and wake itself at `settles_at` instead of polling.
    """
    settles_at = facts.last_growth + rules.settle_seconds
    count = (
        f"{facts.lines} traces"
        if facts.expected is None
        else f"{facts.lines}/{facts.expected} traces"
    )
    past = facts.expected is not None and facts.lines > facts.expected
    marker = bool(rules.marker) and facts.marker_present
    quiet_at = facts.last_growth + min(MARKER_SETTLE_SECONDS, rules.settle_seconds)
    decided: tuple[ReadyRule, str] | None = None
    if facts.expected is not None and facts.lines == facts.expected:
        decided = ReadyRule.EXPECTED_COUNT, f"{count}: the expected count"
    elif marker and (not past or now >= quiet_at):
        quiet = f", no growth for {format_duration(now - facts.last_growth)}" if past else ""
        decided = ReadyRule.MARKER, f"marker {rules.marker} present ({count}{quiet})"
    elif now >= settles_at:
        quiet = format_duration(now - facts.last_growth)
        decided = ReadyRule.SETTLED, f"no growth for {quiet} ({count})"
    again_after = facts.again_after
    if decided is not None and (again_after is None or now >= again_after):
        return Readiness(True, decided[0], decided[1], settles_at)
    waiting = [count]
    if past:
        waiting.append("past the expected count: waits for the file to settle")
    if rules.marker and not facts.marker_present:
        waiting.append(f"no marker {rules.marker} yet")
    wake = min(settles_at, quiet_at) if marker and past else settles_at
    if decided is not None and again_after is not None:
        wake = again_after
        waiting.append("changed after it was finalized, again")
        reason = f"{', '.join(waiting)}; uploads again in {format_duration(math.ceil(wake - now))}"
        return Readiness(False, None, reason, wake, ", ".join(waiting))
    progress = ", ".join(waiting)
    reason = f"{progress}, {settles_in(wake, now)}"
    return Readiness(False, None, reason, wake, progress)


def settles_in(settles_at: float, now: float) -> str:
    """The settle rule's countdown, for people: `settles in 4m12s` (`settles now` once due)."""
    if settles_at <= now:
        return "settles now"
    return f"settles in {format_duration(math.ceil(settles_at - now))}"
