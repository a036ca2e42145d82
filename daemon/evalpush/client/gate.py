"""The gate: one for every upload of a process, so that it backs off from the platform as one.

When the platform is unreachable or refuses the key, every caller waits while ONE of them probes
(a tenacity loop, backing off between probes) and all resume when a probe answers; a
`Retry-After` pauses everyone until then. The key is re-read before each probe (and every
`CREDENTIALS_POLL_SECONDS` while it is refused), and `wake()` (SIGHUP) probes at once. Each
outage is told through `evalpush.core.outage`: the daemon logs it, `push` prints it. The clock
and the wait between probes are parameters, so tests never wait long.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

import tenacity

from evalpush.core import errors
from evalpush.core.outage import AUTH, PAUSED, PLATFORM, UNREACHABLE, Outage, OutageReporter, logged
from evalpush.log import get_logger

OPEN = "open"
UNVERIFIED, REFUSED = "unverified", "refused"
"""A one-shot gate's extra modes: before its first probe, and after the key was refused."""

PROBE_WAIT = tenacity.wait_random_exponential(multiplier=1.0, max=30.0)
"""Between probes: full jitter below 1 s doubling, at most 30 s."""

CREDENTIALS_POLL_SECONDS = 1.0
"""While the key is refused (or missing), how often it is read again: a key that appears (a
file written, a systemd credential) is probed within about this long, without a restart."""


class Probe(Protocol):
    """What the gate needs of the platform client."""

    def probe(self) -> None: ...

    def reload_credentials(self) -> bool: ...


def _iso(wall_seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(round(wall_seconds)))


class Gate:
    """Whether uploads may talk to the platform now.

    Modes: `open`; `paused` (a Retry-After; opens by itself at the deadline); `unreachable` and
    `auth` (closed until a probe answers). Callers get a token from `wait_open` and hand it back
    with a failure to `report`, so a failure that began before the gate last opened does not
    close it again.

    A `one_shot` gate is for a command a person watches (`push`): it starts `unverified`, so
    the first caller probes once before anything is sent (a wrong key is found before any
    upload starts, and a push with nothing to send sends nothing), and a refused key is final
    (`refused`): every caller gets the `AuthError` instead of waiting for a new key; so is a
    certificate that fails verification (`CertificateError`).
    """

    def __init__(
        self,
        *,
        wait: Callable[[tenacity.RetryCallState], float] = PROBE_WAIT,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        poll_seconds: float = 0.25,
        on_outage: Callable[[Outage], None] | None = None,
        one_shot: bool = False,
        on_probe: Callable[[], object] | None = None,
    ) -> None:
        """`on_outage` (default: the log) hears of each outage; `on_probe` of each probe made
        while the platform could not be used (the daemon's retries metric)."""
        self._wait = wait
        self._clock = clock
        self._wall_clock = wall_clock
        self._poll_seconds = poll_seconds
        self._on_probe = on_probe
        tell = on_outage or logged(get_logger())
        self._outage = OutageReporter(PLATFORM, tell, clock, lambda: self._waiting)
        self._cond = threading.Condition()
        self._wake = threading.Event()
        self._mode = UNVERIFIED if one_shot else OPEN
        self._one_shot = one_shot
        self._refusal: errors.NeedsPerson | None = None
        self._generation = 0
        self._probing = False
        self._paused_until = 0.0
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
                return f"paused until {_iso(self._wall(self._paused_until))} (Retry-After)"
            label = "unreachable" if self._mode == UNREACHABLE else "auth refused"
            return f"{label} since {_iso(self._wall(self._outage.since))}"

    def snapshot(self) -> dict[str, Any]:
        """The gate as `status` shows it (in the daemon's heartbeat row, `records.GateState`): its mode, since when (Unix
        time), attempts, when the next probe is due (Unix time), runs waiting, why."""
        with self._cond:
            closed = self._mode not in (OPEN, UNVERIFIED)
            next_probe = self._paused_until if self._mode == PAUSED else self._next_probe
            return {
                "mode": OPEN if self._mode == UNVERIFIED else self._mode,
                "since": self._wall(self._outage.since) if closed else None,
                "attempts": self._outage.attempts if closed else 0,
                "next_probe_at": (
                    self._wall(max(next_probe, self._clock())) if closed and next_probe else None
                ),
                "runs_waiting": self._waiting,
                "reason": self._outage.reason if closed else "",
            }

    def unreachable_seconds(self) -> float:
        """How long the platform has been unreachable; 0 while it answers (or only refuses the
        key, or asked to wait): what `/healthz` and the metrics read."""
        with self._cond:
            return self._outage.seconds() if self._mode == UNREACHABLE else 0.0

    def wake(self) -> None:
        """Probe now instead of at the end of the current backoff (on SIGHUP)."""
        self._wake.set()

    def _wall(self, monotonic: float) -> float:
        """A time of the gate's clock as Unix time."""
        return self._wall_clock() - (self._clock() - monotonic)

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
                self._outage.report_if_due(next_in=remaining)
                self._cond.wait(min(remaining, self._poll_seconds))
            elif not self._probing:
                self._probing = True
                return None
            else:
                self._cond.wait(self._poll_seconds)

    def _run_probes(self, stop: threading.Event, client: Probe) -> None:
        """Probe until the gate opens (or is refused for good), under tenacity. The call that
        closed the gate was the outage's first attempt, so the first probe comes after a wait;
        a one-shot gate's first probe (nothing sent yet) is its first attempt."""
        closed_by_a_call = self._mode != UNVERIFIED

        def attempt() -> bool:
            nonlocal closed_by_a_call
            if closed_by_a_call:
                closed_by_a_call = False
                return False
            return self._probed(client)

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_result(lambda opened: not opened),
            wait=self._wait,
            sleep=partial(self._sleep, stop, client),
            reraise=True,
        )
        try:
            retrying(attempt)
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
            self._outage.attempt()
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

    def _sleep(self, stop: threading.Event, client: Probe, seconds: float) -> None:
        """tenacity's sleep before a probe. A wake (SIGHUP), or a new key while the key was
        refused (looked at every `CREDENTIALS_POLL_SECONDS`), ends it early; a stop raises
        `Interrupted`. A report of the outage falls due here too."""
        deadline = self._clock() + seconds
        next_key_look = self._clock() + CREDENTIALS_POLL_SECONDS
        with self._cond:
            self._next_probe = deadline
            self._outage.report_if_due(next_in=seconds)
        while not stop.is_set():
            remaining = deadline - self._clock()
            if remaining <= 0:
                return
            with self._cond:
                self._outage.report_if_due(next_in=remaining)
            if self._wake.wait(min(remaining, self._poll_seconds)):
                self._wake.clear()
                return
            if self._mode == AUTH and self._clock() >= next_key_look:
                # Credentials read again (a key file written, a variable set by a reload):
                # cheap, local, no request; one that cannot be read is still no usable key.
                with contextlib.suppress(errors.EvalpushError):
                    if client.reload_credentials():
                        return
                next_key_look = self._clock() + CREDENTIALS_POLL_SECONDS
        raise errors.Interrupted("stop requested while waiting for the platform")

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
            if exc.status is None:
                return UNREACHABLE, exc
        except errors.Refused:
            pass
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
        if self._mode in (OPEN, PAUSED, UNVERIFIED):
            self._wake.clear()  # a wake from before this outage does not cut its first wait
        said = "" if reason is None else str(reason)
        self._outage.start(mode, said, anew=self._mode == PAUSED)
        self._mode = mode
        self._cond.notify_all()

    def _refuse_locked(self, reason: errors.EvalpushError | None) -> None:
        """A one-shot gate: the key is refused (or there is none), or the platform's
        certificate, for good."""
        needs_person = isinstance(reason, errors.NeedsPerson)
        self._refusal = reason if needs_person else errors.AuthError(str(reason))
        self._mode = REFUSED
        self._cond.notify_all()

    def _open_locked(self) -> None:
        self._outage.end()
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
            self._wake.clear()
            self._outage.start(PAUSED, str(reason), next_in=seconds)
        self._mode = PAUSED  # a longer Retry-After while paused extends the pause
        self._paused_until = until
