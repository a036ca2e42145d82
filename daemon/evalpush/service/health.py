"""The daemon's health: the verdicts of `/livez` and `/readyz`, from the probes the daemon keeps.

`/livez` answers 200 `ok` while the daemon's loop turns (it turns at least every few seconds);
503 once it has not for `LIVE_AFTER_SECONDS`: a wedged daemon, which a restart fixes. A platform
outage never makes it fail. `/healthz` is the same check (the name earlier versions documented
as the liveness check). `/readyz` answers 200 `ok` unless the platform has been unreachable (or
has refused the key) longer than `[metrics] unhealthy_after_seconds`, or the ledger cannot be
written; then 503 with one reason a line: uploads cannot happen now, and a restart would not
help. Probes are read on the server's request threads, so each must be quick and safe to call
from any thread (a `stat`, or a value the daemon's loop keeps), never a SQLite query on a
connection another thread owns.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from evalpush.core.words import format_duration

LIVE_AFTER_SECONDS = 60.0
"""`/livez` fails once the daemon's loop has not turned for this long (it turns every few
seconds; a scan of a huge tree may hold one turn for a while)."""


class Probes(msgspec.Struct, frozen=True):
    """What metrics and health read at scrape time (see the module docstring: any thread)."""

    unreachable_seconds: Callable[[], float]
    """How long the platform has been unreachable; 0 while it answers."""
    ledger_problem: Callable[[], str | None]
    """Why the ledger cannot be used (e.g. the last write failed), or None when it can."""
    ledger_bytes: Callable[[], int]
    key_refused: Callable[[], bool] = lambda: False
    """Whether the platform refuses the API key (or there is none) now."""
    loop_idle_seconds: Callable[[], float] = lambda: 0.0
    """How long since the daemon's loop last turned."""


class Health(msgspec.Struct, frozen=True):
    """The verdicts of `/livez` and `/readyz`: each a list of reasons, empty when all is well."""

    probes: Probes
    unhealthy_after_seconds: float
    live_after_seconds: float = LIVE_AFTER_SECONDS

    def liveness(self) -> list[str]:
        """Why the daemon is wedged (its loop has stopped turning), or nothing."""
        idle = self.probes.loop_idle_seconds()
        if idle > self.live_after_seconds:
            return [f"the daemon's loop has not turned for {format_duration(idle)}"]
        return []

    def readiness(self) -> list[str]:
        """Why uploads cannot happen now: the platform, the ledger."""
        problems = []
        unreachable = self.probes.unreachable_seconds()
        if unreachable > self.unhealthy_after_seconds:
            problems.append(
                f"platform unreachable for {format_duration(unreachable)}"
                f" (over metrics.unhealthy_after_seconds = {self.unhealthy_after_seconds:g})"
            )
        if self.probes.key_refused():
            problems.append("the platform refuses the API key (or none is set)")
        ledger = self.probes.ledger_problem()
        if ledger is not None:
            problems.append(f"ledger: {ledger}")
        return problems
