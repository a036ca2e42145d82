"""Runs by state for the daemon's STATUS line and its metrics, at a cost that does not grow with
the runs it has finished.

Counting a state costs a read of every row in it (an index range, on both stores): the states a
run passes through (waiting, ready, uploading) or stops in for a person (failed, held) hold a
few rows, and are counted at every heartbeat; the states runs end in by the million (finalized,
skipped) are counted again only after this daemon ended an upload (`changed()`), and every
`MANY_SECONDS` (five minutes) for what other processes did, so a daemon at rest on a million
finished runs does not read a million index entries every five seconds. Between two counts of
those, the last is shown.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from evalpush.core.states import State
from evalpush.ledger import Ledger

MANY_STATES = frozenset({State.FINALIZED, State.SKIPPED})
FEW_STATES = frozenset({State.WAITING, State.READY, State.UPLOADING, State.FAILED, State.HELD})
MANY_SECONDS = 300.0


class RunCounts:
    """`now()`: how many runs are in each state, the few counted now, the many as last counted
    (again when `changed()` was called since, or `MANY_SECONDS` passed). Threads: `changed()`
    from upload workers, `now()` from the daemon's loop."""

    def __init__(self, ledger: Ledger, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._ledger = ledger
        self._clock = clock
        self._many: dict[str, int] = {}
        self._many_at: float | None = None  # when the many were last counted
        self._changed = False  # this daemon ended an upload since

    def changed(self) -> None:
        """This daemon ended an upload: a run may have come into or left a state of the many."""
        self._changed = True

    def now(self) -> dict[str, int]:
        """Runs by state (a state with none is left out); `LedgerError` when it cannot say."""
        counts = self._ledger.state_counts(FEW_STATES)
        at = self._clock()
        if self._changed or self._many_at is None or at - self._many_at >= MANY_SECONDS:
            self._changed = False
            self._many = self._ledger.state_counts(MANY_STATES)
            self._many_at = at
        return {**counts, **self._many}
