"""The retry policy: each platform call in one `tenacity.Retrying`, behind the shared gate.

What it promises:
- `Retrier.call` makes every attempt of a call, the first included, in one `tenacity.Retrying`.
  `Transient` failures are retried forever, after tenacity's full-jitter backoff
  (`wait_random_exponential`) but never sooner than a `Retry-After` the platform sent; a 2xx
  answer that cannot be used (`unusable`) only `UNUSABLE_ANSWER_ATTEMPTS` times in a row
  (`UnusableAnswers`, the run fails with it); an `Ambiguous` one only when the step is replayable
  (otherwise the caller must reconcile with a read before sending again); `Refused` and anything
  else are raised at once.
- An unreachable platform and a refused key are waited out at the gate (`evalpush.client.gate`:
  one probe for every upload), not in the call's backoff.
- A stop request while waiting raises `Interrupted`.

The wait and the sleep are parameters, so tests never wait for real.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from typing import TypeVar

import tenacity

from evalpush.client.gate import Gate, Probe
from evalpush.core import errors
from evalpush.log import get_logger

__all__ = ["CALL_WAIT", "UNUSABLE_ANSWER_ATTEMPTS", "Retrier"]

T = TypeVar("T")

UNUSABLE_ANSWER_ATTEMPTS = 8
"""A call answered this many times in a row with a 2xx that cannot be used (`unusable`) gives
up (`UnusableAnswers`): about a minute of backoff at the call's cadence (0.5 s doubling)."""

CALL_WAIT = tenacity.wait_random_exponential(multiplier=0.5, max=60.0)
"""After a failed attempt: full jitter below 0.5 s doubling, at most a minute."""

Wait = Callable[[tenacity.RetryCallState], float]


def _should_retry(exc: BaseException, *, replayable: bool, wait_on_auth: bool) -> bool:
    if isinstance(exc, errors.Ambiguous):
        return replayable
    if isinstance(exc, errors.AuthError):
        return wait_on_auth
    return isinstance(exc, errors.Transient)


class Retrier:
    """Runs single-attempt platform calls under the retry policy and the shared gate."""

    def __init__(
        self,
        client: Probe,
        gate: Gate,
        stop: threading.Event,
        *,
        wait: Wait = CALL_WAIT,
        sleep: Callable[[float], object] | None = None,
        wait_on_auth: bool = True,
        on_retry: Callable[[], object] | None = None,
    ) -> None:
        """`wait_on_auth=False` raises `AuthError` instead of waiting for a new key: for a
        one-shot command a person is watching, where waiting would look like a hang.
        `on_retry` is told of each attempt made again after a failure (the daemon's metrics)."""
        self._client = client
        self._gate = gate
        self._stop = stop
        self._wait = wait
        self._sleep = stop.wait if sleep is None else sleep
        self._wait_on_auth = wait_on_auth
        self._on_retry = on_retry

    def call(
        self, fn: Callable[[], T], *, replayable: bool, what: str, run: str | None = None
    ) -> T:
        """`fn()` (one attempt, raising classified errors), retried as the module docstring says."""
        unusable = 0  # 2xx answers that could not be used, in a row

        def attempt() -> T:
            nonlocal unusable
            try:
                return self._attempt(fn)
            except errors.Transient as exc:
                unusable = unusable + 1 if exc.unusable else 0
                if unusable >= UNUSABLE_ANSWER_ATTEMPTS:
                    raise errors.UnusableAnswers(
                        f"{exc} (the same kind of answer {unusable} times in a row)",
                        status=exc.status,
                    ) from exc
                raise

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(
                partial(_should_retry, replayable=replayable, wait_on_auth=self._wait_on_auth)
            ),
            wait=self._after_failure,
            sleep=partial(self._pause, what=what),
            before_sleep=partial(self._before_retry, what=what, run=run),
            reraise=True,
        )
        return retrying(attempt)

    def _attempt(self, fn: Callable[[], T]) -> T:
        token = self._gate.wait_open(self._stop, self._client)
        try:
            return fn()
        except errors.EvalpushError as exc:
            if self._wait_on_auth or not isinstance(exc, errors.AuthError):
                self._gate.report(exc, token)
            raise

    def _after_failure(self, retry_state: tenacity.RetryCallState) -> float:
        """The call's wait, at least a `Retry-After`; none where the gate does the waiting."""
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        if isinstance(exc, (errors.Unreachable, errors.AuthError)):
            return 0.0  # the gate holds everyone until one probe succeeds
        retry_after = exc.retry_after if isinstance(exc, errors.Transient) else None
        return max(self._wait(retry_state), retry_after or 0.0)

    def wait(self, seconds: float, *, what: str) -> None:
        """Wait `seconds` (a stop: `Interrupted`, naming `what` waited for)."""
        self._pause(seconds, what=what)

    def pause_after(self, failures: int, *, what: str) -> None:
        """Wait as a call waits after `failures + 1` failed attempts (a stop: `Interrupted`)."""
        retry_state = tenacity.RetryCallState(tenacity.Retrying(), None, (), {})
        retry_state.attempt_number = failures + 1
        self._pause(self._wait(retry_state), what=what)

    def _pause(self, seconds: float, *, what: str) -> None:
        if seconds > 0:
            self._sleep(seconds)
        if self._stop.is_set():
            raise errors.Interrupted(f"stop requested while waiting to retry {what}")

    def _before_retry(
        self, retry_state: tenacity.RetryCallState, *, what: str, run: str | None
    ) -> None:
        if self._on_retry is not None:
            self._on_retry()
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        log = get_logger(run=run) if run else get_logger()
        log.warning(
            "platform call failed; retrying",
            what=what,
            attempt=retry_state.attempt_number,
            wait_seconds=round(
                retry_state.next_action.sleep if retry_state.next_action else 0.0, 3
            ),
            error_class=type(exc).__name__,
            error=str(exc),
        )
