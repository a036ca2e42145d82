"""The retry policy: capped exponential backoff with full jitter, and one gate for the daemon.

What it promises:
- `Backoff.delay` is pure: `rng() * min(cap, base * 2**attempt)` (full jitter), never below a
  `Retry-After` the platform sent.
- `Retrier.call` retries `Transient` failures forever; an `Ambiguous` one only when the step is
  replayable (otherwise the caller must reconcile with a read before sending again); `Refused`
  and anything else are raised at once. A stop request while waiting raises `Interrupted`.
- `Gate` is shared by every upload so the daemon backs off as one: when the platform is
  unreachable or refuses the key, every caller waits while ONE of them probes (with backoff
  between probes) and all resume when a probe answers; a `Retry-After` pauses everyone until
  then. The key is re-read before each probe, and `wake()` (SIGHUP) probes at once.

Clock, randomness and sleep are parameters so tests never wait for real.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Protocol, TypeVar

import tenacity

from evalpush import errors
from evalpush.log import get_logger

__all__ = ["CALL_BACKOFF", "PROBE_BACKOFF", "Backoff", "Gate", "Probe", "Retrier"]

T = TypeVar("T")

_MAX_EXPONENT = 62
"""2**attempt stops growing here; past the cap it changes nothing and a float would overflow."""


@dataclass(frozen=True)
class Backoff:
    """Capped exponential backoff with full jitter."""

    base_seconds: float = 0.5
    cap_seconds: float = 60.0

    def ceiling(self, attempt: int) -> float:
        """The largest delay after failed attempt number `attempt` (0 for the first failure)."""
        return min(self.cap_seconds, self.base_seconds * 2.0 ** min(attempt, _MAX_EXPONENT))

    def delay(
        self, attempt: int, rng: Callable[[], float], retry_after: float | None = None
    ) -> float:
        """A delay drawn uniformly below the ceiling; `retry_after` is a lower bound."""
        delay = rng() * self.ceiling(attempt)
        return delay if retry_after is None else max(delay, retry_after)


CALL_BACKOFF = Backoff(base_seconds=0.5, cap_seconds=60.0)
PROBE_BACKOFF = Backoff(base_seconds=1.0, cap_seconds=30.0)


class Probe(Protocol):
    """What the gate needs of the platform client."""

    def probe(self) -> None: ...

    def reload_credentials(self) -> bool: ...


OPEN, PAUSED, UNREACHABLE, AUTH = "open", "paused", "unreachable", "auth"

CREDENTIALS_POLL_SECONDS = 1.0
"""While the key is refused (or missing), how often it is read again: a key that appears (a
file written, a systemd credential) is probed within about this long, without a restart."""


def _iso(wall_seconds: float) -> str:
    return (
        datetime.fromtimestamp(wall_seconds, UTC)
        .isoformat(timespec="seconds")
        .replace("+00:00", "Z")
    )


class Gate:
    """Whether uploads may talk to the platform now; shared by all of them.

    Modes: `open`; `paused` (a Retry-After; opens by itself at the deadline); `unreachable` and
    `auth` (closed until a probe answers). Callers get a token from `wait_open` and hand it back
    with a failure to `report`, so a failure that began before the gate last opened does not
    close it again.
    """

    def __init__(
        self,
        *,
        backoff: Backoff = PROBE_BACKOFF,
        rng: Callable[[], float] = random.random,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        poll_seconds: float = 0.25,
    ) -> None:
        self._backoff = backoff
        self._rng = rng
        self._clock = clock
        self._wall_clock = wall_clock
        self._poll_seconds = poll_seconds
        self._cond = threading.Condition()
        self._wake = threading.Event()
        self._mode = OPEN
        self._generation = 0
        self._probing = False
        self._closed_at = 0.0
        self._state_wall = 0.0
        self._paused_until = 0.0

    @property
    def mode(self) -> str:
        """`open`, `paused`, `unreachable` or `auth`."""
        return self._mode

    @property
    def state(self) -> str:
        """One line for `status`: e.g. `open`, `unreachable since 2025-01-01T00:00:00Z`."""
        with self._cond:
            if self._mode == OPEN:
                return OPEN
            if self._mode == PAUSED:
                return f"paused until {_iso(self._state_wall)} (Retry-After)"
            label = "auth refused" if self._mode == AUTH else "unreachable"
            return f"{label} since {_iso(self._state_wall)}"

    def wake(self) -> None:
        """Probe now instead of at the end of the current backoff (on SIGHUP)."""
        self._wake.set()

    # -- waiting ----------------------------------------------------------------------------

    def wait_open(self, stop: threading.Event, client: Probe) -> int:
        """Block until the gate is open; return the token to pass to `report`.

        While closed, one waiting caller at a time runs the probes with `client`.
        Raises `Interrupted` when `stop` is set.
        """
        while True:
            with self._cond:
                token = self._wait_or_take_probe(stop)
            if token is not None:
                return token
            self._run_probes(stop, client)

    def _wait_or_take_probe(self, stop: threading.Event) -> int | None:
        """Under the lock: the token once open, or None when this caller became the prober."""
        while True:
            if stop.is_set():
                raise errors.Interrupted("stop requested while waiting for the platform")
            if self._mode == OPEN:
                return self._generation
            if self._mode == PAUSED:
                remaining = self._paused_until - self._clock()
                if remaining <= 0:
                    self._open_locked()
                    return self._generation
                self._cond.wait(min(remaining, self._poll_seconds))
            elif not self._probing:
                self._probing = True
                return None
            else:
                self._cond.wait(self._poll_seconds)

    def _run_probes(self, stop: threading.Event, client: Probe) -> None:
        try:
            attempt = 0
            while True:
                key_changed = self._key_changed(client) if self._mode == AUTH else None
                self._sleep(self._backoff.delay(attempt, self._rng), stop, key_changed)
                mode, reason = self._probe_once(client)
                with self._cond:
                    if mode == OPEN:
                        self._open_locked()
                        return
                    self._close_locked(mode, reason)
                attempt += 1
        finally:
            with self._cond:
                self._probing = False
                self._cond.notify_all()

    def _sleep(
        self,
        seconds: float,
        stop: threading.Event,
        key_changed: Callable[[], bool] | None = None,
    ) -> None:
        """Wait `seconds` before the next probe; a wake (SIGHUP), or a new key while the key
        was refused (`key_changed`, looked at every `CREDENTIALS_POLL_SECONDS`), ends it early."""
        deadline = self._clock() + seconds
        next_key_look = self._clock() + CREDENTIALS_POLL_SECONDS
        while not stop.is_set():
            remaining = deadline - self._clock()
            if remaining <= 0:
                return
            if self._wake.wait(min(remaining, self._poll_seconds)):
                self._wake.clear()
                return
            if key_changed is not None and self._clock() >= next_key_look:
                if key_changed():
                    return
                next_key_look = self._clock() + CREDENTIALS_POLL_SECONDS
        raise errors.Interrupted("stop requested while waiting for the platform")

    @staticmethod
    def _key_changed(client: Probe) -> Callable[[], bool]:
        """Whether the credentials read now differ from the ones refused (a key file written,
        a variable set by a reload): cheap, local, no request."""

        def changed() -> bool:
            try:
                return client.reload_credentials()
            except errors.EvalpushError:
                return False  # still no usable key

        return changed

    @staticmethod
    def _probe_once(client: Probe) -> tuple[str, errors.EvalpushError | None]:
        """The mode a probe's outcome calls for, and why."""
        try:
            if client.reload_credentials():
                get_logger().info("credentials changed; probing the platform with them")
        except errors.EvalpushError as exc:
            return AUTH, exc  # no usable key or base URL: only a person can fix that
        try:
            client.probe()
        except errors.AuthError as exc:
            return AUTH, exc
        except errors.Transient as exc:
            # No HTTP status means no answer at all; any status means the platform is back.
            return (UNREACHABLE, exc) if exc.status is None else (OPEN, None)
        except errors.Refused:
            return OPEN, None
        return OPEN, None

    # -- reporting ----------------------------------------------------------------------------

    def report(self, exc: BaseException, token: int) -> None:
        """Tell the gate how a call that started with `token` failed."""
        with self._cond:
            current = token == self._generation
            if isinstance(exc, errors.AuthError) and current and self._mode != AUTH:
                self._close_locked(AUTH, exc)
            elif isinstance(exc, errors.Unreachable) and current and self._mode in (OPEN, PAUSED):
                self._close_locked(UNREACHABLE, exc)
            elif isinstance(exc, errors.Transient) and exc.retry_after:
                self._pause_locked(exc.retry_after, exc)

    def _close_locked(self, mode: str, reason: BaseException | None) -> None:
        if mode == self._mode:
            return
        if self._mode in (OPEN, PAUSED):
            self._closed_at = self._clock()
            self._wake.clear()
        self._mode = mode
        self._state_wall = self._wall_clock()
        log = get_logger()
        if mode == AUTH:
            log.error(
                "uploads paused: the platform refused the API key (or none is set); fix the key "
                "and send SIGHUP, it is also re-read before every probe",
                reason=str(reason),
            )
        else:
            log.warning(
                "platform unreachable: uploads wait while one probe checks it", reason=str(reason)
            )
        self._cond.notify_all()

    def _open_locked(self) -> None:
        if self._mode in (UNREACHABLE, AUTH):
            get_logger().info(
                "platform answers again: uploads resume",
                closed_seconds=round(self._clock() - self._closed_at, 3),
            )
        self._mode = OPEN
        self._generation += 1
        self._cond.notify_all()

    def _pause_locked(self, seconds: float, reason: BaseException) -> None:
        if self._mode in (UNREACHABLE, AUTH):
            return
        until = self._clock() + seconds
        if self._mode == PAUSED and until <= self._paused_until:
            return
        if self._mode == OPEN:
            get_logger().warning(
                "platform asked to wait (Retry-After): uploads paused",
                seconds=seconds,
                reason=str(reason),
            )
        self._mode = PAUSED
        self._paused_until = until
        self._state_wall = self._wall_clock() + seconds


def _should_retry(exc: BaseException, *, replayable: bool, wait_on_auth: bool) -> bool:
    if isinstance(exc, errors.Ambiguous):
        return replayable
    if isinstance(exc, errors.AuthError):
        return wait_on_auth
    return isinstance(exc, errors.Transient)


class _FullJitter(tenacity.wait.wait_base):
    """tenacity wait: full-jitter backoff, except where the gate does the waiting."""

    def __init__(self, backoff: Backoff, rng: Callable[[], float]) -> None:
        self._backoff = backoff
        self._rng = rng

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        if isinstance(exc, (errors.Unreachable, errors.AuthError)):
            return 0.0  # the gate holds everyone until one probe succeeds
        retry_after = exc.retry_after if isinstance(exc, errors.Transient) else None
        return self._backoff.delay(retry_state.attempt_number - 1, self._rng, retry_after)


class Retrier:
    """Runs single-attempt platform calls under the retry policy and the shared gate."""

    def __init__(
        self,
        client: Probe,
        gate: Gate,
        stop: threading.Event,
        *,
        backoff: Backoff = CALL_BACKOFF,
        rng: Callable[[], float] = random.random,
        sleep: Callable[[float], object] | None = None,
        wait_on_auth: bool = True,
    ) -> None:
        """`wait_on_auth=False` raises `AuthError` instead of waiting for a new key: for a
        one-shot command a person is watching, where waiting would look like a hang."""
        self._wait_on_auth = wait_on_auth
        self._client = client
        self._gate = gate
        self._stop = stop
        self._backoff = backoff
        self._rng = rng
        self._sleep = stop.wait if sleep is None else sleep

    def call(
        self, fn: Callable[[], T], *, replayable: bool, what: str, run: str | None = None
    ) -> T:
        """`fn()` (one attempt, raising classified errors), retried as the module docstring says."""
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(
                partial(_should_retry, replayable=replayable, wait_on_auth=self._wait_on_auth)
            ),
            wait=_FullJitter(self._backoff, self._rng),
            sleep=partial(self._pause, what=what),
            before_sleep=partial(self._log_retry, what=what, run=run),
            reraise=True,
        )
        return retrying(self._attempt, fn)

    def _attempt(self, fn: Callable[[], T]) -> T:
        token = self._gate.wait_open(self._stop, self._client)
        try:
            return fn()
        except errors.EvalpushError as exc:
            if self._wait_on_auth or not isinstance(exc, errors.AuthError):
                self._gate.report(exc, token)
            raise

    def _pause(self, seconds: float, *, what: str) -> None:
        if seconds > 0:
            self._sleep(seconds)
        if self._stop.is_set():
            raise errors.Interrupted(f"stop requested while waiting to retry {what}")

    @staticmethod
    def _log_retry(retry_state: tenacity.RetryCallState, *, what: str, run: str | None) -> None:
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
