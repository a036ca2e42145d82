"""The retry policy, the shared gate and the outage reporter, with injected clocks, waits and sleep."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import tenacity
from structlog.testing import capture_logs

from evalpush.client import Gate, Retrier
from evalpush.client.gate import PROBE_WAIT
from evalpush.client.retry import CALL_WAIT
from evalpush.core import errors
from evalpush.core.outage import (
    LEDGER,
    OUTAGE_FIRST_REPORT_SECONDS,
    PLATFORM,
    UNREACHABLE,
    Outage,
    OutageEvent,
    OutageReporter,
)

BACKOFF = tenacity.wait_exponential(multiplier=0.5, max=8.0)
"""The ceiling of the call's full jitter, without the jitter: waits a test can predict."""
TINY = tenacity.wait_random_exponential(multiplier=0.001, max=0.005)


class FakeClock:
    """A monotonic clock that moves only when the fake sleep says so."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


class FakePlatform:
    """Stands in for PlatformClient where the gate is concerned: probe and reload_credentials."""

    def __init__(
        self, *, probe_failures: int = 0, failure: errors.EvalpushError | None = None
    ) -> None:
        self.probe_failures = probe_failures
        self.failure = failure or errors.Unreachable("probe: ConnectError")
        self.probes = 0
        self.reloads = 0
        self.active = 0
        self.most_active = 0
        self.up = threading.Event()
        self._lock = threading.Lock()

    def reload_credentials(self) -> bool:
        self.reloads += 1
        return False

    def probe(self) -> None:
        with self._lock:
            self.active += 1
            self.most_active = max(self.most_active, self.active)
            self.probes += 1
            failing = self.probes <= self.probe_failures
        time.sleep(0.005)  # long enough for a second prober, if there were one, to overlap
        with self._lock:
            self.active -= 1
        if failing:
            raise self.failure
        self.up.set()


def failing(
    times: int, error: Callable[[], BaseException], result: Any = "done"
) -> Callable[[], Any]:
    """A call that raises `error()` `times` times, then returns `result`; `.calls` counts."""

    def call() -> Any:
        call.calls += 1  # type: ignore[attr-defined]
        if call.calls <= times:  # type: ignore[attr-defined]
            raise error()
        return result

    call.calls = 0  # type: ignore[attr-defined]
    return call


def make_retrier(
    clock: FakeClock,
    *,
    wait: Callable[[tenacity.RetryCallState], float] = BACKOFF,
    stop: threading.Event | None = None,
    gate: Gate | None = None,
    sleep: Callable[[float], object] | None = None,
) -> Retrier:
    gate = gate or Gate(wait=TINY, clock=clock, poll_seconds=0.01)
    return Retrier(
        FakePlatform(), gate, stop or threading.Event(), wait=wait, sleep=sleep or clock.sleep
    )


def ceiling_after(wait: tenacity.wait.wait_base, attempt_number: int) -> float:
    """The largest wait `wait` draws after attempt `attempt_number` failed."""
    retry_state = tenacity.RetryCallState(tenacity.Retrying(), None, (), {})
    retry_state.attempt_number = attempt_number
    return tenacity.wait_exponential.__call__(wait, retry_state)


class TestWaits:
    def test_calls_wait_full_jitter_from_half_a_second_doubling_up_to_a_minute(self) -> None:
        assert isinstance(CALL_WAIT, tenacity.wait_random_exponential)
        assert [ceiling_after(CALL_WAIT, n) for n in (1, 2, 3, 8, 100_000)] == [
            0.5,
            1.0,
            2.0,
            60.0,
            60.0,
        ]

    def test_probes_wait_full_jitter_from_a_second_doubling_up_to_half_a_minute(self) -> None:
        assert isinstance(PROBE_WAIT, tenacity.wait_random_exponential)
        assert [ceiling_after(PROBE_WAIT, n) for n in (1, 2, 5, 6, 100_000)] == [
            1.0,
            2.0,
            16.0,
            30.0,
            30.0,
        ]


class TestRetrier:
    def test_transient_failures_are_retried_on_the_backoff_schedule(self) -> None:
        clock = FakeClock()
        call = failing(6, lambda: errors.Transient("HTTP 500", status=500))
        assert make_retrier(clock).call(call, replayable=False, what="create evaluation") == "done"
        assert clock.slept == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0]
        assert call.calls == 7

    def test_the_waits_come_from_the_injected_tenacity_wait(self) -> None:
        clock = FakeClock()
        draws = tenacity.wait_chain(*map(tenacity.wait_fixed, [0.25, 0.1, 1.8]))
        make_retrier(clock, wait=draws).call(
            failing(3, lambda: errors.Transient("HTTP 503")), replayable=True, what="read"
        )
        assert clock.slept == pytest.approx([0.25, 0.1, 1.8])

    def test_retry_after_is_honoured_even_when_jitter_draws_less(self) -> None:
        clock = FakeClock()
        call = failing(1, lambda: errors.Transient("HTTP 429", retry_after=7.0, status=429))
        make_retrier(clock, wait=tenacity.wait_none()).call(
            call, replayable=False, what="push samples"
        )
        assert clock.slept == [7.0]

    def test_retry_after_pauses_the_shared_gate_until_its_deadline(self) -> None:
        clock = FakeClock()
        gate = Gate(wait=TINY, clock=clock, poll_seconds=0.01)
        modes: list[str] = []

        def sleep(seconds: float) -> None:
            modes.append(gate.mode)
            clock.sleep(seconds)

        make_retrier(clock, wait=tenacity.wait_none(), gate=gate, sleep=sleep).call(
            failing(1, lambda: errors.Transient("HTTP 503", retry_after=5.0, status=503)),
            replayable=True,
            what="read",
        )
        assert modes == ["paused"]
        assert gate.mode == "open"

    def test_an_ambiguous_failure_of_a_non_replayable_step_is_raised_at_once(self) -> None:
        clock = FakeClock()
        call = failing(5, lambda: errors.Ambiguous("create evaluation: ReadTimeout"))
        with pytest.raises(errors.Ambiguous):
            make_retrier(clock).call(call, replayable=False, what="create evaluation")
        assert call.calls == 1 and clock.slept == []

    def test_an_ambiguous_failure_of_a_replayable_step_is_retried(self) -> None:
        clock = FakeClock()
        call = failing(2, lambda: errors.Ambiguous("read: HTTP 502", status=502))
        assert make_retrier(clock).call(call, replayable=True, what="read") == "done"
        assert call.calls == 3

    @pytest.mark.parametrize(
        "error",
        [
            errors.Refused("HTTP 400"),
            errors.BatchRefused("HTTP 413"),
            errors.Gone("HTTP 404"),
            errors.Conflict("HTTP 409"),
            errors.LedgerError("disk full"),
            ValueError("a bug"),
        ],
    )
    def test_refusals_and_non_platform_errors_are_raised_at_once(
        self, error: BaseException
    ) -> None:
        clock = FakeClock()
        call = failing(1, lambda: error)
        with pytest.raises(type(error)):
            make_retrier(clock).call(call, replayable=True, what="push samples")
        assert call.calls == 1

    def test_a_stop_during_backoff_raises_interrupted(self) -> None:
        clock = FakeClock()
        stop = threading.Event()
        retrier = make_retrier(clock, stop=stop, sleep=lambda seconds: stop.set())
        call = failing(10, lambda: errors.Transient("HTTP 500"))
        with pytest.raises(errors.Interrupted):
            retrier.call(call, replayable=True, what="read")
        assert call.calls == 1

    def test_a_stop_before_the_call_sends_nothing(self) -> None:
        stop = threading.Event()
        stop.set()
        call = failing(0, lambda: errors.Transient("unused"))
        with pytest.raises(errors.Interrupted):
            make_retrier(FakeClock(), stop=stop).call(call, replayable=True, what="read")
        assert call.calls == 0

    def test_each_retry_is_logged_naming_the_run_and_the_step(self) -> None:
        clock = FakeClock()
        with capture_logs() as logs:
            make_retrier(clock).call(
                failing(2, lambda: errors.Transient("HTTP 503", status=503)),
                replayable=True,
                what="list samples of e1",
                run="run-7",
            )
        retries = [e for e in logs if e["event"] == "platform call failed; retrying"]
        assert [(e["run"], e["what"], e["attempt"]) for e in retries] == [
            ("run-7", "list samples of e1", 1),
            ("run-7", "list samples of e1", 2),
        ]
        assert retries[0]["error_class"] == "Transient" and retries[0]["wait_seconds"] == 0.5


def run_in_threads(count: int, target: Callable[[], Any]) -> tuple[list[Any], list[BaseException]]:
    results: list[Any] = []
    failures: list[BaseException] = []

    def run() -> None:
        try:
            results.append(target())
        except BaseException as exc:  # noqa: BLE001 - the test asserts on it
            failures.append(exc)

    threads = [threading.Thread(target=run, name=f"caller-{i}") for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    return results, failures


class TestGate:
    def test_while_unreachable_one_probe_runs_at_a_time_and_every_caller_resumes(self) -> None:
        platform = FakePlatform(probe_failures=3)
        stop = threading.Event()
        gate = Gate(wait=TINY, poll_seconds=0.01)
        retrier = Retrier(platform, gate, stop, wait=TINY)

        def upload() -> str:
            if not platform.up.is_set():
                raise errors.Unreachable("create evaluation: ConnectError")
            return "sent"

        results, failures = run_in_threads(
            6, lambda: retrier.call(upload, replayable=False, what="create")
        )
        assert failures == [] and results == ["sent"] * 6
        assert platform.most_active == 1
        assert platform.probes == 4  # three refused, one answered, none after it opened
        assert gate.mode == "open"

    def test_the_outage_is_logged_once_when_it_starts_and_once_when_it_ends(self) -> None:
        platform = FakePlatform(probe_failures=2)
        gate = Gate(wait=TINY, poll_seconds=0.01)
        retrier = Retrier(platform, gate, threading.Event(), wait=TINY)

        def upload() -> None:
            if not platform.up.is_set():
                raise errors.Unreachable("ConnectError")

        with capture_logs() as logs:
            run_in_threads(4, lambda: retrier.call(upload, replayable=True, what="read"))
        events = [e["event"] for e in logs if not e["event"].startswith("platform call failed")]
        assert events == [
            "platform unreachable: uploads wait while one probe checks it",
            "platform answers again: uploads resume",
        ]

    def test_an_auth_refusal_pauses_uploads_until_a_reloaded_key_works(self) -> None:
        class KeyRotation(FakePlatform):
            """The key is wrong until the operator fixes it, noticed on the third reload."""

            def __init__(self) -> None:
                super().__init__()
                self.key = "old"
                self.states: list[str] = []

            def reload_credentials(self) -> bool:
                self.reloads += 1
                if self.reloads == 3:
                    self.key = "new"
                    return True
                return False

            def probe(self) -> None:
                self.probes += 1
                self.states.append(gate.state)
                if self.key != "new":
                    raise errors.AuthError("probe the platform: HTTP 401")

        platform = KeyRotation()
        gate = Gate(wait=TINY, poll_seconds=0.01, wall_clock=lambda: 1748779200.0)
        retrier = Retrier(platform, gate, threading.Event(), wait=TINY)

        def create() -> str:
            if platform.key != "new":
                raise errors.AuthError("create evaluation: HTTP 401")
            return "created"

        with capture_logs() as logs:
            results, failures = run_in_threads(
                3, lambda: retrier.call(create, replayable=False, what="create")
            )
        assert failures == [] and results == ["created"] * 3
        assert platform.probes == 3 and platform.reloads == 3
        assert set(platform.states) == {"auth refused since 2025-06-01T12:00:00Z"}
        paused = [
            e
            for e in logs
            if e["event"].startswith("uploads paused: the platform refused the API key")
        ]
        assert len(paused) == 1 and paused[0]["log_level"] == "error"

    def test_a_credentials_file_that_cannot_be_read_keeps_the_gate_in_auth_mode(self) -> None:
        class NoKey(FakePlatform):
            def reload_credentials(self) -> bool:
                self.reloads += 1
                if self.reloads < 3:
                    raise errors.AuthError("platform.api_key_file: /run/key is empty")
                return True

        platform = NoKey()
        gate = Gate(wait=TINY, poll_seconds=0.01)
        token = gate.wait_open(threading.Event(), platform)
        gate.report(errors.AuthError("HTTP 401"), token)
        assert gate.mode == "auth"
        gate.wait_open(threading.Event(), platform)
        assert platform.reloads == 3 and platform.probes == 1

    def test_retry_after_pauses_every_caller_without_probing(self) -> None:
        platform = FakePlatform()
        gate = Gate(wait=TINY, poll_seconds=0.01)
        token = gate.wait_open(threading.Event(), platform)
        gate.report(errors.Transient("HTTP 429", retry_after=0.2, status=429), token)
        assert gate.state.startswith("paused until ")
        started = time.monotonic()
        results, _ = run_in_threads(3, lambda: gate.wait_open(threading.Event(), platform))
        assert time.monotonic() - started >= 0.19
        assert len(results) == 3 and platform.probes == 0

    def test_wake_probes_at_once_instead_of_waiting_out_the_backoff(self) -> None:
        platform = FakePlatform()
        gate = Gate(wait=tenacity.wait_fixed(300.0), poll_seconds=0.01)
        gate.report(errors.Unreachable("ConnectError"), gate.wait_open(threading.Event(), platform))
        waiter = threading.Thread(target=gate.wait_open, args=(threading.Event(), platform))
        waiter.start()
        time.sleep(0.05)
        assert platform.probes == 0
        gate.wake()
        waiter.join(2)
        assert not waiter.is_alive() and platform.probes == 1 and gate.mode == "open"

    def test_a_stop_while_waiting_on_a_closed_gate_interrupts_prober_and_waiters(self) -> None:
        platform = FakePlatform(probe_failures=10**9)
        stop = threading.Event()
        gate = Gate(wait=TINY, poll_seconds=0.01)
        gate.report(errors.Unreachable("ConnectError"), gate.wait_open(stop, platform))
        threading.Timer(0.1, stop.set).start()
        results, failures = run_in_threads(3, lambda: gate.wait_open(stop, platform))
        assert results == [] and len(failures) == 3
        assert all(isinstance(f, errors.Interrupted) for f in failures)

    def test_a_failure_that_began_before_the_gate_reopened_does_not_close_it_again(self) -> None:
        platform = FakePlatform()
        gate = Gate(wait=TINY, poll_seconds=0.01)
        stale = gate.wait_open(threading.Event(), platform)
        gate.report(errors.Unreachable("ConnectError"), stale)
        gate.wait_open(threading.Event(), platform)  # probes, opens
        gate.report(errors.Unreachable("ConnectError"), stale)
        assert gate.mode == "open"

    def test_the_state_line_says_what_holds_uploads_and_since_when(self) -> None:
        gate = Gate(wait=TINY, wall_clock=lambda: 1748779200.0)
        assert gate.state == "open"
        gate.report(errors.Unreachable("ConnectError"), 0)
        assert gate.state == "unreachable since 2025-06-01T12:00:00Z"
        gate.report(errors.AuthError("HTTP 403"), 0)
        assert gate.state == "auth refused since 2025-06-01T12:00:00Z"


class TickingClock:
    """A monotonic clock that moves a millisecond each time it is read, and `advance`s."""

    def __init__(self) -> None:
        self.now = 1000.0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            self.now += 0.001
            return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds


class TestOutageReports:
    def test_an_outage_is_told_when_it_starts_at_doubling_intervals_and_when_it_ends(self) -> None:
        clock = TickingClock()

        class SlowProbes(FakePlatform):
            def probe(self) -> None:
                # No second of the outage passes before every caller reached the gate: on a
                # loaded box a caller's thread may start late, and the first report (at 5 s of
                # this clock) came with fewer than three waiting.
                deadline = time.monotonic() + 10
                while gate.snapshot()["runs_waiting"] < 3 and time.monotonic() < deadline:
                    time.sleep(0.001)
                clock.advance(1.0)  # each probe stands for a second of the outage
                super().probe()

        platform = SlowProbes(probe_failures=45)
        told: list[Outage] = []
        gate = Gate(wait=TINY, clock=clock, poll_seconds=0.001, on_outage=told.append)
        retrier = Retrier(platform, gate, threading.Event(), wait=TINY)

        def upload() -> None:
            if not platform.up.is_set():
                raise errors.Unreachable("ConnectError")

        results, failures = run_in_threads(
            3, lambda: retrier.call(upload, replayable=True, what="r")
        )

        assert failures == [] and len(results) == 3
        events = [o.event for o in told]
        assert events[0] == OutageEvent.STARTED and events[-1] == OutageEvent.ENDED
        ongoing = [o for o in told if o.event == OutageEvent.ONGOING]
        assert len(ongoing) == 4, [o.seconds for o in ongoing]  # at 5 s, 10 s, 20 s and 40 s
        for k, report in enumerate(ongoing):  # each at or after its due time, before the next
            due = OUTAGE_FIRST_REPORT_SECONDS * 2**k
            assert due <= report.seconds < 2 * due, (k, report.seconds)
        assert {o.waiting for o in ongoing} == {3}, "every caller waits at the gate"
        assert re.fullmatch(
            r"platform unreachable for \d+s, \d+ attempts, next in 1s; 3 uploads paused",
            ongoing[0].message,
        ), ongoing[0].message
        ended = told[-1]
        assert ended.attempts == platform.probes + 1, "the failed call, then every probe"
        assert ended.seconds >= 45 and ended.message == "platform answers again: uploads resume"

    def test_a_long_outage_is_told_at_least_every_ten_minutes(self) -> None:
        clock = TickingClock()
        told: list[Outage] = []
        outage = OutageReporter(PLATFORM, told.append, clock)
        outage.start(UNREACHABLE, "ConnectError")
        for _ in range(200):  # an outage of 200 minutes, seen at each minute
            clock.advance(60.0)
            outage.report_if_due(next_in=30.0)

        at = [round(o.seconds / 60) for o in told if o.event == OutageEvent.ONGOING]
        gaps = [b - a for a, b in zip(at, at[1:], strict=False)]
        assert gaps == sorted(gaps) and gaps[-1] == 10, at  # growing, then every 10 minutes
        assert at[0] == 1 and len(at) >= 200 // 10, at

    @pytest.mark.parametrize("subject", [PLATFORM, LEDGER])
    def test_the_platform_and_the_shared_ledger_are_told_alike(self, subject: str) -> None:
        """The same cadence, the same fields and the same levels: a start and its reports are
        warnings, the end is info, saying how long it lasted and how many attempts."""
        clock = TickingClock()
        told: list[Outage] = []
        outage = OutageReporter(subject, told.append, clock)
        outage.start(UNREACHABLE, "connection refused")
        for _ in range(3):
            clock.advance(3.0)
            outage.attempt()
            outage.report_if_due()
        outage.end()

        assert [(o.event, o.level) for o in told] == [
            (OutageEvent.STARTED, "warning"),
            (OutageEvent.ONGOING, "warning"),
            (OutageEvent.ENDED, "info"),
        ]
        assert [set(o.fields()) for o in told] == [{"outage", "seconds", "attempts", "reason"}] * 3
        assert told[-1].attempts == 4 and 9 <= told[-1].seconds < 10
        assert re.fullmatch(r"\S.* unreachable for 6s, 3 attempts; uploads paused", told[1].message)

    def test_a_pause_asked_by_retry_after_is_told_and_so_is_its_end(self) -> None:
        told: list[Outage] = []
        gate = Gate(wait=TINY, poll_seconds=0.01, on_outage=told.append)
        token = gate.wait_open(threading.Event(), FakePlatform())
        gate.report(errors.Transient("HTTP 429", retry_after=0.1, status=429), token)
        gate.wait_open(threading.Event(), FakePlatform())

        assert [(o.event, o.mode) for o in told] == [
            (OutageEvent.STARTED, "paused"),
            (OutageEvent.ENDED, "paused"),
        ]
        assert told[0].next_in == 0.1

    def test_the_snapshot_says_how_long_how_often_and_when_next(self) -> None:
        clock = TickingClock()
        gate = Gate(wait=TINY, clock=clock, wall_clock=lambda: 1748779200.0)
        assert gate.snapshot()["mode"] == "open" and gate.unreachable_seconds() == 0
        gate.report(errors.Unreachable("ConnectError: refused"), 0)
        clock.advance(30.0)

        snapshot = gate.snapshot()

        assert snapshot["mode"] == "unreachable"
        assert 1748779200.0 - 31 < snapshot["since"] < 1748779200.0 - 29
        assert (snapshot["attempts"], snapshot["reason"]) == (1, "ConnectError: refused")
        assert 29 < gate.unreachable_seconds() < 31


class TestOneShotGate:
    def test_the_first_caller_probes_once_before_anything_is_sent(self) -> None:
        platform = FakePlatform()
        gate = Gate(wait=TINY, poll_seconds=0.01, one_shot=True)

        results, failures = run_in_threads(3, lambda: gate.wait_open(threading.Event(), platform))

        assert failures == [] and len(results) == 3
        assert platform.probes == 1 and gate.mode == "open"

    def test_a_refused_key_is_raised_to_every_caller_and_never_waited_out(self) -> None:
        platform = FakePlatform(probe_failures=1, failure=errors.AuthError("probe: HTTP 401"))
        gate = Gate(wait=TINY, poll_seconds=0.01, one_shot=True)

        results, failures = run_in_threads(3, lambda: gate.wait_open(threading.Event(), platform))

        assert results == [] and len(failures) == 3
        assert all(isinstance(f, errors.AuthError) and "401" in str(f) for f in failures)
        assert platform.probes == 1 and gate.mode == "refused"

    def test_an_unreachable_platform_at_the_first_probe_is_waited_out_as_an_outage(self) -> None:
        platform = FakePlatform(probe_failures=2)
        told: list[Outage] = []
        gate = Gate(wait=TINY, poll_seconds=0.01, one_shot=True, on_outage=told.append)

        gate.wait_open(threading.Event(), platform)

        assert platform.probes == 3 and gate.mode == "open"
        assert [o.event for o in told] == [OutageEvent.STARTED, OutageEvent.ENDED]
        assert told[-1].attempts == 3
