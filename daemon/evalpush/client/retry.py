"""The retry policy: capped exponential backoff with full jitter, and one gate for the daemon.

What it promises:
- `Backoff.delay` is pure: `rng() * min(cap, base * 2**attempt)` (full jitter), never below a
  `Retry-After` the platform sent.
- `Retrier.call` retries `Transient` failures forever, but a 2xx answer that cannot be used
  (`unusable`) only `UNUSABLE_ANSWER_ATTEMPTS` times in a row (`UnusableAnswers`, the run
  fails with it); an `Ambiguous` one only when the step is replayable (otherwise the caller must reconcile with a read before sending again); `Refused`
  and anything else are raised at once. A stop request while waiting raises `Interrupted`.
- `Gate` is shared by every upload so the daemon backs off as one: when the platform is
  unreachable or refuses the key, every caller waits while ONE of them probes (with backoff
  between probes) and all resume when a probe answers; a `Retry-After` pauses everyone until
  then. The key is re-read before each probe, and `wake()` (SIGHUP) probes at once.
- Each outage (unreachable, key refused, or a Retry-After pause) is told to `on_outage` as an
  `Outage`: when it starts, after `OUTAGE_FIRST_REPORT_SECONDS` and then at doubling intervals
  up to `OUTAGE_REPORT_CAP_SECONDS` apart while it lasts (how long, attempts, the next probe,
  runs waiting), and when it ends (in all). The daemon logs them; `push` prints them.
- A one-shot gate (`push`) probes once before the first request, and a refused key is final.

Clock, randomness and sleep are parameters so tests never wait for real.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from enum import StrEnum
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import msgspec

from evalpush.core import errors
from evalpush.core.words import format_duration
from evalpush.log import get_logger

if TYPE_CHECKING:  # tenacity is imported at the first retry: most calls never need one
    import tenacity

__all__ = [
    "CALL_BACKOFF",
    "PROBE_BACKOFF",
    "Backoff",
    "Gate",
    "Outage",
    "OutageEvent",
    "Probe",
    "Retrier",
    "log_outage",
]

T = TypeVar("T")

UNUSABLE_ANSWER_ATTEMPTS = 8
"""A call answered this many times in a row with a 2xx that cannot be used (`unusable`) gives
up (`UnusableAnswers`): about a minute of backoff at the call's cadence (0.5 s doubling)."""

_MAX_EXPONENT = 62
"""2**attempt stops growing here; past the cap it changes nothing and a float would overflow."""


class Backoff(msgspec.Struct, frozen=True):
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
UNVERIFIED, REFUSED = "unverified", "refused"
"""A one-shot gate's extra modes: before its first probe, and after the key was refused."""

CREDENTIALS_POLL_SECONDS = 1.0
"""While the key is refused (or missing), how often it is read again: a key that appears (a
file written, a systemd credential) is probed within about this long, without a restart."""

OUTAGE_FIRST_REPORT_SECONDS = 5.0
"""An outage is reported when it starts, then after this long, then at doubling intervals..."""
OUTAGE_REPORT_CAP_SECONDS = 600.0
"""... up to one report every 10 minutes: a long outage stays visible without flooding."""


def _iso(wall_seconds: float) -> str:
    return (
        datetime.fromtimestamp(wall_seconds, UTC)
        .isoformat(timespec="seconds")
        .replace("+00:00", "Z")
    )


class OutageEvent(StrEnum):
    STARTED = "started"
    ONGOING = "ongoing"
    ENDED = "ended"


_WHAT = {
    UNREACHABLE: "platform unreachable",
    AUTH: "API key refused",
    PAUSED: "platform throttling (Retry-After)",
}


class Outage(msgspec.Struct, frozen=True):
    """What the gate says about a time the platform could not be used: when it starts, at
    growing intervals while it lasts, and when it ends."""

    event: OutageEvent
    mode: str  # unreachable, auth (the key refused, or none) or paused (Retry-After)
    seconds: float  # how long it has lasted (ENDED: in all)
    attempts: int  # the failed call that began it, and every probe since
    next_in: float | None  # seconds until the next probe (or the end of a pause)
    waiting: int  # runs whose upload waits at the gate
    reason: str

    @property
    def message(self) -> str:
        """The line a person reads (the log event of the daemon, stderr of `push`)."""
        if self.event == OutageEvent.STARTED:
            return _STARTED[self.mode]
        if self.event == OutageEvent.ENDED:
            return _ENDED[self.mode]
        line = f"{_WHAT[self.mode]} for {format_duration(self.seconds)}"
        if self.mode != PAUSED:
            line += f", {self.attempts} attempts"
        if self.next_in is not None:
            line += f", next in {format_duration(math.ceil(self.next_in))}"
        # "paused", not "waiting": in `status` a waiting run is one not finished yet
        return f"{line}; {self.waiting} upload{'s' if self.waiting != 1 else ''} paused"

    @property
    def level(self) -> str:
        if self.event == OutageEvent.ENDED:
            return "info"
        return "error" if self.mode == AUTH and self.event == OutageEvent.STARTED else "warning"

    def fields(self) -> dict[str, Any]:
        """The structured form, for a log line."""
        fields: dict[str, Any] = {
            "outage": self.mode,
            "seconds": round(self.seconds, 3),
            "attempts": self.attempts,
            "runs_waiting": self.waiting,
        }
        if self.next_in is not None:
            fields["next_in_seconds"] = round(self.next_in, 3)
        if self.reason:
            fields["reason"] = self.reason
        return fields


_STARTED = {
    UNREACHABLE: "platform unreachable: uploads wait while one probe checks it",
    AUTH: (
        "uploads paused: the platform refused the API key (or none is set); fix the key and "
        "send SIGHUP, it is also re-read before every probe"
    ),
    PAUSED: "platform asked to wait (Retry-After): uploads paused",
}
_ENDED = {
    UNREACHABLE: "platform answers again: uploads resume",
    AUTH: "the platform accepts the API key again: uploads resume",
    PAUSED: "platform's Retry-After is over: uploads resume",
}


def log_outage(outage: Outage) -> None:
    """The daemon's way to say it: one structured log line per report."""
    getattr(get_logger(), outage.level)(outage.message, **outage.fields())


class Gate:
    """Whether uploads may talk to the platform now; shared by all of them.

    Modes: `open`; `paused` (a Retry-After; opens by itself at the deadline); `unreachable` and
    `auth` (closed until a probe answers). Callers get a token from `wait_open` and hand it back
    with a failure to `report`, so a failure that began before the gate last opened does not
    close it again. Each outage is told to `on_outage` (default: the log) when it starts, at
    growing intervals while it lasts, and when it ends.

    A `one_shot` gate is for a command a person watches (`push`): it starts `unverified`, so
    the first caller probes once before anything is sent (a wrong key is found before any
    upload starts, and a push with nothing to send sends nothing), and a refused key is final
    (`refused`): every caller gets the `AuthError` instead of waiting for a new key; so is a
    certificate that fails verification (`CertificateError`).
    """

    def __init__(
        self,
        *,
        backoff: Backoff = PROBE_BACKOFF,
        rng: Callable[[], float] = random.random,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        poll_seconds: float = 0.25,
        on_outage: Callable[[Outage], None] = log_outage,
        one_shot: bool = False,
        on_probe: Callable[[], object] | None = None,
    ) -> None:
        """`on_probe` is told of each probe made while the platform could not be used (each
        attempt an outage report counts; the daemon's retries metric)."""
        self._on_probe = on_probe
        self._backoff = backoff
        self._rng = rng
        self._clock = clock
        self._wall_clock = wall_clock
        self._poll_seconds = poll_seconds
        self._on_outage = on_outage
        self._cond = threading.Condition()
        self._wake = threading.Event()
        self._mode = UNVERIFIED if one_shot else OPEN
        self._one_shot = one_shot
        self._refusal: errors.NeedsPerson | None = None
        self._generation = 0
        self._probing = False
        self._closed_at = 0.0
        self._state_wall = 0.0
        self._paused_until = 0.0
        self._attempts = 0
        self._reason = ""
        self._next_report = 0.0
        self._next_probe: float | None = None
        self._waiting = 0

    @property
    def mode(self) -> str:
        """`open`, `paused`, `unreachable` or `auth` (a one-shot gate: also `unverified`,
        `refused`)."""
        return self._mode

    @property
    def state(self) -> str:
        """One line for `status`: e.g. `open`, `unreachable since 2025-01-01T00:00:00Z`."""
        with self._cond:
            if self._mode in (OPEN, UNVERIFIED):
                return OPEN
            if self._mode == PAUSED:
                return f"paused until {_iso(self._state_wall)} (Retry-After)"
            label = "unreachable" if self._mode == UNREACHABLE else "auth refused"
            return f"{label} since {_iso(self._state_wall)}"

    def snapshot(self) -> dict[str, Any]:
        """The gate as `status` shows it (see `evalpush.ledger.gatefile`): its mode, since when (Unix
        time), attempts, when the next probe is due (Unix time), runs waiting, why."""
        with self._cond:
            closed = self._mode in (UNREACHABLE, AUTH, REFUSED, PAUSED)
            now, wall = self._clock(), self._wall_clock()
            next_probe = self._paused_until if self._mode == PAUSED else self._next_probe
            return {
                "mode": OPEN if self._mode == UNVERIFIED else self._mode,
                "since": wall - (now - self._closed_at) if closed else None,
                "attempts": self._attempts if closed else 0,
                "next_probe_at": (
                    wall + max(0.0, next_probe - now) if closed and next_probe else None
                ),
                "runs_waiting": self._waiting,
                "reason": self._reason if closed else "",
            }

    def unreachable_seconds(self) -> float:
        """How long the platform has been unreachable; 0 while it answers (or only refuses the
        key, or asked to wait): what `/healthz` and the metrics read."""
        with self._cond:
            return self._clock() - self._closed_at if self._mode == UNREACHABLE else 0.0

    def wake(self) -> None:
        """Probe now instead of at the end of the current backoff (on SIGHUP)."""
        self._wake.set()

    # -- waiting ----------------------------------------------------------------------------

    def wait_open(self, stop: threading.Event, client: Probe) -> int:
        """Block until the gate is open; return the token to pass to `report`.

        While closed, one waiting caller at a time runs the probes with `client`.
        Raises `Interrupted` when `stop` is set, and a one-shot gate's refusal once refused.
        """
        with self._cond:
            self._waiting += 1
        try:
            while True:
                with self._cond:
                    token = self._wait_or_take_probe(stop)
                if token is not None:
                    return token
                self._run_probes(stop, client)
        finally:
            with self._cond:
                self._waiting -= 1

    def _wait_or_take_probe(self, stop: threading.Event) -> int | None:
        """Under the lock: the token once open, or None when this caller became the prober."""
        while True:
            if stop.is_set():
                raise errors.Interrupted("stop requested while waiting for the platform")
            if self._mode == OPEN:
                return self._generation
            if self._mode == REFUSED:
                assert self._refusal is not None
                raise self._refusal
            if self._mode == PAUSED:
                remaining = self._paused_until - self._clock()
                if remaining <= 0:
                    self._open_locked()
                    return self._generation
                self._report_if_due_locked(next_in=remaining)
                self._cond.wait(min(remaining, self._poll_seconds))
            elif not self._probing:
                self._probing = True
                return None
            else:
                self._cond.wait(self._poll_seconds)

    def _run_probes(self, stop: threading.Event, client: Probe) -> None:
        try:
            attempt = 0
            if self._mode == UNVERIFIED:  # a one-shot gate's first probe: at once
                if self._probed(client):
                    return
            while True:
                key_changed = self._key_changed(client) if self._mode == AUTH else None
                self._sleep(self._backoff.delay(attempt, self._rng), stop, key_changed)
                if self._probed(client):
                    return
                attempt += 1
        finally:
            with self._cond:
                self._probing = False
                self._next_probe = None
                self._cond.notify_all()

    def _probed(self, client: Probe) -> bool:
        """One probe, and the mode it calls for; True once the gate is open (or refused)."""
        mode, reason = self._probe_once(client)
        if self._on_probe is not None and self._mode != UNVERIFIED:
            self._on_probe()
        with self._cond:
            if self._mode != UNVERIFIED:
                self._attempts += 1
            if mode == OPEN:
                self._open_locked()
                return True
            if mode == AUTH and self._one_shot:
                self._refuse_locked(reason)
                return True
            if isinstance(reason, errors.CertificateRefused) and self._one_shot:
                self._refuse_locked(errors.CertificateError(str(reason)))
                return True
            self._close_locked(mode, reason)
        return False

    def _sleep(
        self,
        seconds: float,
        stop: threading.Event,
        key_changed: Callable[[], bool] | None = None,
    ) -> None:
        """Wait `seconds` before the next probe; a wake (SIGHUP), or a new key while the key
        was refused (`key_changed`, looked at every `CREDENTIALS_POLL_SECONDS`), ends it early.
        A report of the outage falls due here too."""
        deadline = self._clock() + seconds
        next_key_look = self._clock() + CREDENTIALS_POLL_SECONDS
        with self._cond:
            self._next_probe = deadline
            self._report_if_due_locked(next_in=seconds)
        while not stop.is_set():
            remaining = deadline - self._clock()
            if remaining <= 0:
                return
            with self._cond:
                self._report_if_due_locked(next_in=remaining)
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

    def _outage(
        self,
        event: OutageEvent,
        mode: str,
        next_in: float | None = None,
        elapsed: float | None = None,
    ) -> None:
        """Tell `on_outage` (under the lock: the reports of one gate come in order)."""
        self._on_outage(
            Outage(
                event,
                mode,
                self._clock() - self._closed_at if elapsed is None else elapsed,
                self._attempts,
                next_in,
                self._waiting,
                self._reason,
            )
        )

    def _report_if_due_locked(self, *, next_in: float) -> None:
        if self._mode not in (UNREACHABLE, AUTH, PAUSED):
            return
        elapsed = self._clock() - self._closed_at
        if elapsed < self._next_report:
            return
        self._outage(OutageEvent.ONGOING, self._mode, next_in, elapsed)
        # The next report is due at twice this one's due time (5 s, 10 s, 20 s, ...), not at
        # twice the time it was made: a report made late (at the next probe) must not push every
        # later one back. Reports missed by a long wait are not made up for.
        due = self._next_report
        while due <= elapsed:
            due = min(due * 2, due + OUTAGE_REPORT_CAP_SECONDS)
        self._next_report = due

    def _begin_outage_locked(self, mode: str, reason: BaseException | None) -> None:
        """The gate closes (or pauses) after being open: an outage starts now."""
        self._closed_at = self._clock()
        self._attempts = 1  # the call that failed
        self._next_report = OUTAGE_FIRST_REPORT_SECONDS
        self._reason = "" if reason is None else str(reason)
        self._wake.clear()
        self._state_wall = self._wall_clock()

    def _close_locked(self, mode: str, reason: BaseException | None) -> None:
        if mode == self._mode:
            return
        if self._mode in (OPEN, PAUSED, UNVERIFIED):
            self._begin_outage_locked(mode, reason)
        else:  # unreachable <-> auth: the same outage, told anew
            self._reason = "" if reason is None else str(reason)
        self._mode = mode
        self._state_wall = self._wall_clock()
        self._outage(OutageEvent.STARTED, mode)
        self._cond.notify_all()

    def _refuse_locked(self, reason: errors.EvalpushError | None) -> None:
        """A one-shot gate: the key is refused (or there is none), or the platform's
        certificate, for good."""
        if isinstance(reason, errors.NeedsPerson):
            self._refusal = reason
        else:
            self._refusal = errors.AuthError(str(reason))
        self._mode = REFUSED
        self._cond.notify_all()

    def _open_locked(self) -> None:
        if self._mode in (UNREACHABLE, AUTH, PAUSED):
            self._outage(OutageEvent.ENDED, self._mode)
        self._mode = OPEN
        self._generation += 1
        self._cond.notify_all()

    def _pause_locked(self, seconds: float, reason: BaseException) -> None:
        if self._mode in (UNREACHABLE, AUTH, REFUSED, UNVERIFIED):
            return
        until = self._clock() + seconds
        if self._mode == PAUSED and until <= self._paused_until:
            return
        if self._mode == OPEN:
            self._begin_outage_locked(PAUSED, reason)
            self._mode = PAUSED
            self._outage(OutageEvent.STARTED, PAUSED, seconds)
        self._mode = PAUSED  # a longer Retry-After while paused extends the pause
        self._paused_until = until
        self._state_wall = self._wall_clock() + seconds


def _should_retry(exc: BaseException, *, replayable: bool, wait_on_auth: bool) -> bool:
    if isinstance(exc, errors.Ambiguous):
        return replayable
    if isinstance(exc, errors.AuthError):
        return wait_on_auth
    return isinstance(exc, errors.Transient)


class _FullJitter:
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
        on_retry: Callable[[], object] | None = None,
    ) -> None:
        """`wait_on_auth=False` raises `AuthError` instead of waiting for a new key: for a
        one-shot command a person is watching, where waiting would look like a hang.
        `on_retry` is told of each attempt made again after a failure (the daemon's metrics)."""
        self._wait_on_auth = wait_on_auth
        self._on_retry = on_retry
        self._client = client
        self._gate = gate
        self._stop = stop
        self._backoff = backoff
        self._rng = rng
        self._sleep = stop.wait if sleep is None else sleep

    def call(
        self, fn: Callable[[], T], *, replayable: bool, what: str, run: str | None = None
    ) -> T:
        """`fn()` (one attempt, raising classified errors), retried as the module docstring says.

        The first attempt is made before tenacity is set up, or even imported (most calls
        need no second, and a push's first request goes out sooner); a failure worth retrying
        is handed to tenacity as its first attempt's outcome, so the waits, logs and attempt
        numbers are tenacity's as ever."""
        try:
            return self._attempt(fn)
        except Exception as exc:  # noqa: BLE001 - classified below, raised unless retried
            if not _should_retry(exc, replayable=replayable, wait_on_auth=self._wait_on_auth):
                raise
            first_failure: list[Exception] = [exc]
            unusable = [1 if getattr(exc, "unusable", False) else 0]  # in a row

        import tenacity

        def attempt() -> T:
            if first_failure:
                raise first_failure.pop()
            try:
                return self._attempt(fn)
            except errors.Transient as exc:
                unusable[0] = unusable[0] + 1 if exc.unusable else 0
                if unusable[0] >= UNUSABLE_ANSWER_ATTEMPTS:
                    raise errors.UnusableAnswers(
                        f"{exc} (the same kind of answer {unusable[0]} times in a row)",
                        status=exc.status,
                    ) from exc
                raise

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(
                partial(_should_retry, replayable=replayable, wait_on_auth=self._wait_on_auth)
            ),
            wait=_FullJitter(self._backoff, self._rng),
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

    def wait(self, seconds: float, *, what: str) -> None:
        """Wait `seconds` (a stop: `Interrupted`, naming `what` waited for)."""
        self._pause(seconds, what=what)

    def pause_after(self, failures: int, *, what: str) -> None:
        """Wait as a call waits after `failures + 1` failed attempts (a stop: `Interrupted`)."""
        self._pause(self._backoff.delay(failures, self._rng), what=what)

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
