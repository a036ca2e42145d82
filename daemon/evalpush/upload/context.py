"""What every part of an upload works with: the configuration, the ledger, the platform client
and the retry policy, shared by all the runs this process uploads."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from evalpush.client import Environments, EvaluationIndex, PlatformClient, Retrier
from evalpush.config import Config
from evalpush.ledger import Ledger, RunRecord

T = TypeVar("T")

Progress = Callable[[RunRecord], None]
"""Called after each acknowledged batch with the run's row (push's progress bar)."""


def no_progress(_record: RunRecord) -> None:
    pass


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
    ) -> None:
        self.config = config
        self.ledger = ledger
        self.client = client
        self.retrier = retrier
        self.progress = progress
        self.clock = clock
        self.environments = Environments(client, self._replayable_call)
        self.evaluations = EvaluationIndex(client, self._replayable_call)

    def replayable(self, fn: Callable[[], T], *, what: str, run: str) -> T:
        """`fn()` under the retry policy, as a call that may be sent again."""
        return self.retrier.call(fn, replayable=True, what=what, run=run)

    def once(self, fn: Callable[[], T], *, what: str, run: str) -> T:
        """`fn()` under the retry policy, as a call that must not be sent twice (an ambiguous
        failure is raised for the caller to reconcile)."""
        return self.retrier.call(fn, replayable=False, what=what, run=run)

    def _replayable_call(self, fn: Callable[[], Any], what: str, run_id: str) -> Any:
        return self.replayable(fn, what=what, run=run_id)
