"""The scheduler: a queue of runs to work on and the worker threads that work on them.

Both `push` (a finite list of runs) and the daemon (runs found as they become ready) submit run
keys here. What it promises:
- at most one job per key is in flight at a time, in this process (other processes are kept
  off a run by its claim in the ledger);
- a key submitted while it is queued is not queued twice; a key submitted while its job runs
  is run once more after that job ends (the run changed while it was being uploaded);
- at most `workers` jobs run at once, in submission order;
- `stop` takes no new work, lets each running job end (jobs watch the application's own stop
  event to cut their waits short), drops what is still queued, and joins every thread.
A job's exception is handed to `on_error` and does not stop its worker.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from evalpush.log import get_logger

K = TypeVar("K", bound=Hashable)

__all__ = ["Scheduler"]


def _log_error(key: object, exc: BaseException) -> None:
    get_logger().exception("job failed", run=str(key), error=str(exc), exc_info=exc)


class Scheduler(Generic[K]):
    """Runs `work(key)` for submitted keys on `workers` threads."""

    def __init__(
        self,
        work: Callable[[K], object],
        *,
        workers: int,
        name: str = "upload",
        on_error: Callable[[K, BaseException], object] = _log_error,
    ) -> None:
        if workers < 1:
            raise ValueError("a scheduler needs at least one worker")
        self._work = work
        self._on_error = on_error
        self._workers = workers
        self._name = name
        self._cond = threading.Condition()
        self._queue: collections.deque[K] = collections.deque()
        self._queued: set[K] = set()
        self._running: set[K] = set()
        self._again: set[K] = set()
        self._stopping = False
        self._threads: list[threading.Thread] = []

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> Scheduler[K]:
        with self._cond:
            if self._threads:
                raise RuntimeError("the scheduler is already started")
            self._threads = [
                threading.Thread(target=self._serve, name=f"{self._name}-{i}")
                for i in range(self._workers)
            ]
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        """Take no more work, drop what is queued, wait for the running jobs to end."""
        with self._cond:
            self._stopping = True
            self._queue.clear()
            self._queued.clear()
            self._again.clear()
            self._cond.notify_all()
        for thread in self._threads:
            thread.join()

    def __enter__(self) -> Scheduler[K]:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- work -------------------------------------------------------------------------------

    def submit(self, key: K) -> bool:
        """Queue `key` (see the module docstring); False once stopping."""
        with self._cond:
            if self._stopping:
                return False
            if key in self._running:
                self._again.add(key)
            elif key not in self._queued:
                self._queued.add(key)
                self._queue.append(key)
                self._cond.notify()
            return True

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until nothing is queued or running; False if `timeout` passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: not (self._queue or self._running), timeout)

    @property
    def busy(self) -> frozenset[K]:
        """The keys whose jobs are running now."""
        with self._cond:
            return frozenset(self._running)

    @property
    def queued(self) -> int:
        with self._cond:
            return len(self._queue)

    def _serve(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._stopping)
                if self._stopping:
                    return
                key = self._queue.popleft()
                self._queued.discard(key)
                self._running.add(key)
            try:
                self._work(key)
            except BaseException as exc:  # noqa: BLE001 - one job's failure is not the worker's
                self._on_error(key, exc)
            finally:
                with self._cond:
                    self._running.discard(key)
                    if key in self._again and not self._stopping:
                        self._again.discard(key)
                        self._queued.add(key)
                        self._queue.append(key)
                    self._cond.notify_all()
