"""Outages: a time something every upload needs (the platform, the shared ledger) cannot be used,
told by one reporter, on one cadence, in lines of one shape.

What it promises:
- An outage is told when it starts, after `OUTAGE_FIRST_REPORT_SECONDS`, then at doubling
  intervals up to `OUTAGE_REPORT_CAP_SECONDS` apart while it lasts (how long, attempts, the next
  try, uploads paused), and when it ends (`seconds`: how long it lasted in all; `attempts`: the
  failure that began it and every try since).
- One rule of levels for everything: a start is a warning (an error when only a person can end
  it: a key or a login refused), a report while it lasts a warning, the end info.
- `Outage.message` is the line a person reads, `Outage.fields()` its structured form;
  `logged(logger)` makes one log line of each report.

A reporter has no lock of its own: its owner calls it under its lock (the gate's condition, the
ledger's lock), so the reports of one outage come in order.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from enum import StrEnum
from typing import Any

import msgspec

from evalpush.core.words import counted, format_duration

OUTAGE_FIRST_REPORT_SECONDS = 5.0
"""An outage is reported when it starts, then after this long, then at doubling intervals..."""
OUTAGE_REPORT_CAP_SECONDS = 600.0
"""... up to one report every 10 minutes: a long outage stays visible without flooding."""

PLATFORM, LEDGER = "platform", "ledger"  # what is out
UNREACHABLE, AUTH, PAUSED = "unreachable", "auth", "paused"
"""How: no answer; the key or the login refused (or none); asked to wait (Retry-After)."""


class OutageEvent(StrEnum):
    STARTED = "started"
    ONGOING = "ongoing"
    ENDED = "ended"


_LINES: dict[tuple[str, str], tuple[str, str, str]] = {
    (PLATFORM, UNREACHABLE): (
        "platform unreachable: uploads wait while one probe checks it",
        "platform unreachable",
        "platform answers again: uploads resume",
    ),
    (PLATFORM, AUTH): (
        "uploads paused: the platform refused the API key (or none is set); fix the key and "
        "send SIGHUP, it is also re-read before every probe",
        "API key refused",
        "the platform accepts the API key again: uploads resume",
    ),
    (PLATFORM, PAUSED): (
        "platform asked to wait (Retry-After): uploads paused",
        "platform throttling (Retry-After)",
        "platform's Retry-After is over: uploads resume",
    ),
    (LEDGER, UNREACHABLE): (
        "shared ledger unreachable: uploads pause (nothing is sent without its intent written) "
        "until it is back",
        "shared ledger unreachable",
        "shared ledger reachable again: uploads resume",
    ),
    (LEDGER, AUTH): (
        "shared ledger refused the login: uploads pause until it accepts it",
        "shared ledger login refused",
        "shared ledger accepts the login again: uploads resume",
    ),
}
"""Per what is out and how: the line when it starts, what it is while it lasts, when it ends."""


class Outage(msgspec.Struct, frozen=True):
    """One report of an outage."""

    event: OutageEvent
    mode: str  # UNREACHABLE, AUTH or PAUSED
    seconds: float  # how long it has lasted (ENDED: in all)
    attempts: int  # the failure that began it, and every try since
    next_in: float | None  # seconds until the next try (or the end of a pause)
    waiting: int | None  # uploads waiting it out (None: not counted)
    reason: str
    subject: str = PLATFORM

    @property
    def message(self) -> str:
        """The line a person reads (a log event; `push`'s stderr; `status`)."""
        started, what, ended = _LINES[self.subject, self.mode]
        if self.event != OutageEvent.ONGOING:
            return started if self.event == OutageEvent.STARTED else ended
        line = f"{what} for {format_duration(self.seconds)}"
        if self.mode != PAUSED:
            line += f", {self.attempts} attempts"
        if self.next_in is not None:
            line += f", next in {format_duration(math.ceil(self.next_in))}"
        # "paused", not "waiting": in `status` a waiting run is one not finished yet
        uploads = "uploads" if self.waiting is None else counted(self.waiting, "upload")
        return f"{line}; {uploads} paused"

    @property
    def level(self) -> str:
        if self.event == OutageEvent.ENDED:
            return "info"
        return "error" if self.mode == AUTH and self.event == OutageEvent.STARTED else "warning"

    def fields(self) -> dict[str, Any]:
        """The structured form, for a log line."""
        fields = {
            "outage": self.mode,
            "seconds": round(self.seconds, 3),
            "attempts": self.attempts,
            "runs_waiting": self.waiting,
            "next_in_seconds": None if self.next_in is None else round(self.next_in, 3),
            "reason": self.reason or None,
        }
        return {name: value for name, value in fields.items() if value is not None}


def logged(logger: Any) -> Callable[[Outage], None]:
    """A reporter's `tell` that makes each report one line of `logger` (a structlog logger)."""
    return lambda outage: getattr(logger, outage.level)(outage.message, **outage.fields())


class OutageReporter:
    """The outages of one thing (`subject`), told to `tell` as the module docstring says;
    `waiting` counts the uploads that wait them out (None: not counted)."""

    def __init__(
        self,
        subject: str,
        tell: Callable[[Outage], None],
        clock: Callable[[], float] = time.monotonic,
        waiting: Callable[[], int | None] = lambda: None,
    ) -> None:
        self.subject = subject
        self._tell = tell
        self._clock = clock
        self._waiting = waiting
        self.mode: str | None = None  # None: no outage now
        self.since = 0.0  # when the outage began, by `clock`
        self.attempts = 0
        self.reason = ""
        self._next_report = 0.0  # seconds into the outage

    def seconds(self) -> float:
        """How long the outage has lasted; 0 when there is none."""
        return self._clock() - self.since if self.mode is not None else 0.0

    def start(
        self, mode: str, reason: str, *, anew: bool = False, next_in: float | None = None
    ) -> None:
        """An outage starts, or the one going on changes kind (told again, counted on); with
        `anew`, a new outage even if one goes on (a pause turned into no answer at all)."""
        if mode == self.mode and not anew:
            return
        if self.mode is None or anew:
            self.since = self._clock()
            self.attempts = 1  # the failure that began it
            self._next_report = OUTAGE_FIRST_REPORT_SECONDS
        self.mode, self.reason = mode, reason
        self._say(OutageEvent.STARTED, next_in)

    def attempt(self) -> None:
        """One more try during the outage."""
        if self.mode is not None:
            self.attempts += 1

    def report_if_due(self, *, next_in: float | None = None) -> None:
        """While an outage lasts: a report, when one is due."""
        elapsed = self.seconds()
        if self.mode is None or elapsed < self._next_report:
            return
        self._say(OutageEvent.ONGOING, next_in)
        # The next report is due at twice this one's due time (5 s, 10 s, 20 s, ...), not at
        # twice the time it was made: a report made late must not push every later one back.
        # Reports missed by a long wait are not made up for.
        due = self._next_report
        while due <= elapsed:
            due = min(due * 2, due + OUTAGE_REPORT_CAP_SECONDS)
        self._next_report = due

    def end(self) -> None:
        """The outage (if any) is over: told with how long it lasted."""
        if self.mode is not None:
            self._say(OutageEvent.ENDED, None)
            self.mode = None

    def _say(self, event: OutageEvent, next_in: float | None) -> None:
        assert self.mode is not None
        seconds, waiting = self.seconds(), self._waiting()
        self._tell(
            Outage(
                event,
                self.mode,
                seconds,
                self.attempts,
                next_in,
                waiting,
                self.reason,
                self.subject,
            )
        )
