"""What every part of an upload works with: the configuration, the ledger, the platform client
and the retry policy, shared by all the runs this process uploads."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from evalpush.client import Environments, EvaluationIndex, PlatformClient, Retrier, request_deadline
from evalpush.config import Config
from evalpush.core.errors import LedgerUnavailable
from evalpush.ledger import Ledger, RunRecord
from evalpush.upload.follow import Follows

T = TypeVar("T")

Progress = Callable[[RunRecord], None]
"""Called after each acknowledged batch with the run's row (push's progress bar)."""


def no_progress(_record: RunRecord) -> None:
    pass


LeaseLeft = Callable[[str | None], float | None]
"""How long this process is sure to hold the claim of the owner given (None: not its claim)."""

MIN_WRITE_SECONDS = 1.0
"""A write is not sent with less time than this left before its lease's margin."""


class Context:
    """The shared parts, and the lookups built on them: environments by name and evaluations
    by run id, each asked of the platform once per process."""

    def __init__(
        self,
        config: Config,
        ledger: Ledger,
        client: PlatformClient,
        retrier: Retrier,
        progress: Progress = no_progress,
        clock: Callable[[], float] = time.time,
        lease_left: LeaseLeft = lambda _owner: None,
    ) -> None:
        self.config = config
        self.ledger = ledger
        self.client = client
        self.retrier = retrier
        self.progress = progress
        self.clock = clock
        self._lease_left = lease_left
        self.environments = Environments(client, self._replayable_call)
        self.evaluations = EvaluationIndex(client, self._replayable_call)
        self.follows = Follows()  # what this process keeps of the runs it follows

    def replayable(self, fn: Callable[[], T], *, what: str, run: str) -> T:
        """`fn()` under the retry policy, as a call that may be sent again."""
        return self.retrier.call(fn, replayable=True, what=what, run=run)

    @property
    def late_write_seconds(self) -> float:
        """How long after its sender gave a write up (its deadline, a timeout, the process
        killed) the platform may still act on it; at most a quarter of the lease, which it must
        fit in."""
        return min(self.config.platform.late_write_seconds, self.config.ledger.lease_seconds / 4)

    def once(self, fn: Callable[[], T], *, what: str, record: RunRecord) -> T:
        """`fn()` under the retry policy, as a call that must not be sent twice (an ambiguous
        failure is raised for the caller to reconcile). Each attempt ends `late_write_seconds`
        before the run's claim could lapse, so that no request of a holder can still land
        once another process may take the run over; with less than `MIN_WRITE_SECONDS` of it
        left (the ledger could not renew the lease), nothing is sent."""

        def within_lease() -> T:
            left = self._lease_left(record.claim_owner)
            if left is None:
                return fn()
            window = left - self.late_write_seconds
            if window < MIN_WRITE_SECONDS:
                raise LedgerUnavailable(
                    f"{what}: not sent: the run's claim may lapse in {max(left, 0):.0f}s and the "
                    "ledger has not renewed it"
                )
            with request_deadline(window):
                return fn()

        return self.retrier.call(within_lease, replayable=False, what=what, run=record.run_id)

    def wait_for_late_writes(self, *, what: str) -> None:
        """Before a read that settles whether a write took effect: give a write that may still
        be on its way (cut off by this process, or left by a process that died) the time it
        may take to land (`late_write_seconds`); a stop ends the wait (`Interrupted`)."""
        self.retrier.wait(self.late_write_seconds, what=what)

    def _replayable_call(self, fn: Callable[[], Any], what: str, run_id: str) -> Any:
        return self.replayable(fn, what=what, run=run_id)
