"""Upload threads taking turns (`evalpush.turns`): the turn passes at a wait, and a thread that
keeps it through a wait nobody marked cannot stop the others."""

from __future__ import annotations

import os
import threading

import pytest

from evalpush import turns
from evalpush.local_platform import LocalPlatform
from evalpush.platform import PlatformClient
from evalpush.retry import Gate, Retrier
from evalpush.scheduler import Scheduler

WAIT = 10.0  # only a failing test waits this long


def in_thread(target) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


@pytest.mark.usefixtures("turns_taken")
def test_a_thread_waiting_hands_its_turn_to_another():
    waiting, other_ran, release = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, bool] = {}

    def first() -> None:
        with turns.taking_turns():
            seen["first before"] = turns.holds_turn()
            with turns.waiting():
                waiting.set()
                release.wait(WAIT)
            seen["first after"] = turns.holds_turn()

    def second() -> None:
        with turns.taking_turns():
            seen["second"] = turns.holds_turn()
            other_ran.set()

    a = in_thread(first)
    assert waiting.wait(WAIT)
    b = in_thread(second)
    assert other_ran.wait(WAIT)
    release.set()
    a.join(WAIT)
    b.join(WAIT)
    assert seen == {"first before": True, "second": True, "first after": True}


@pytest.mark.usefixtures("turns_taken")
def test_a_turn_kept_through_an_unmarked_wait_only_delays_the_others():
    holding, release, done = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, bool] = {}

    def keeper() -> None:
        with turns.taking_turns():
            holding.set()
            release.wait(WAIT)  # a wait that does not hand the turn over

    def other() -> None:
        with turns.taking_turns():
            seen["other holds"] = turns.holds_turn()
            with turns.waiting():  # nothing to give; asks again after
                pass
            seen["other holds after its wait"] = turns.holds_turn()
        done.set()

    a = in_thread(keeper)
    assert holding.wait(WAIT)
    b = in_thread(other)
    try:
        assert done.wait(WAIT), "a thread keeping the turn stopped another"
    finally:
        release.set()
        a.join(WAIT)
        b.join(WAIT)
    assert seen == {"other holds": False, "other holds after its wait": False}
    with turns.taking_turns():  # the keeper gave it back on leaving
        assert turns.holds_turn()


def test_outside_turns_a_wait_changes_nothing():
    with turns.waiting():
        assert not turns.holds_turn()
    assert not turns.holds_turn()


@pytest.mark.usefixtures("turns_taken")
def test_a_wait_within_a_wait_keeps_the_turn_whole():
    """Nested waits hand the turn over once and take it back once: it is never left taken by
    a thread that believes it does not hold it (which would make every other thread wait out
    its patience at every take, for good)."""
    with turns.taking_turns():
        with turns.waiting():
            with turns.waiting():
                assert not turns.holds_turn()
            assert not turns.holds_turn()
        assert turns.holds_turn()
        with turns.taking_turns():  # a job within a job: the same turn
            assert turns.holds_turn()
        assert turns.holds_turn()
    taken: list[bool] = []

    def another_job() -> None:
        with turns.taking_turns():
            taken.append(turns.holds_turn())

    in_thread(another_job).join(WAIT)
    assert taken == [True], "the turn was left taken"


@pytest.mark.usefixtures("turns_taken")
def test_a_job_backing_off_before_its_next_attempt_hands_its_turn_over(
    platform: LocalPlatform,
    platform_client: PlatformClient,
    fast_gate: Gate,
    stop_event: threading.Event,
):
    """A retry's backoff (up to a minute) is a wait that lasts. Kept through it, the turn made
    every other upload thread wait out its patience at each of its own waits meanwhile: a big
    run beside runs backing off from 503s was uploaded at half its speed."""
    backing_off, other_ran = threading.Event(), threading.Event()
    held: dict[str, bool] = {}
    failures: list[BaseException] = []

    def backoff(seconds: float) -> None:  # the retrier's sleep: until the other job has run
        held["backing off, in its backoff"] = turns.holds_turn()
        backing_off.set()
        assert other_ran.wait(WAIT)

    retrier = Retrier(platform_client, fast_gate, stop_event, rng=lambda: 1.0, sleep=backoff)
    platform.inject("status", status=503, on="resolve")

    def job(key: str) -> None:
        if key == "backing off":
            held[key] = turns.holds_turn()
            retrier.call(
                lambda: platform_client.resolve_environment("gsm8k"),
                replayable=True,
                what="resolve",
            )
        else:
            held[key] = turns.holds_turn()
            other_ran.set()

    with Scheduler(job, workers=2, on_error=lambda _key, exc: failures.append(exc)) as scheduler:
        scheduler.submit("backing off")
        assert backing_off.wait(WAIT)
        scheduler.submit("other")
        assert scheduler.wait_idle(WAIT)
    assert failures == []
    assert held == {"backing off": True, "backing off, in its backoff": False, "other": True}


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity here")
def test_a_thread_confined_to_one_cpu_takes_no_turns():
    """Threads that cannot run at once have nothing to gain from turns: a job on a thread
    confined to one CPU (as `taskset -c 3 evalpush push` confines all) runs without one."""
    seen: list[bool] = []

    def confined_job() -> None:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # this thread's own mask
        with turns.taking_turns():
            seen.append(turns.holds_turn())
            with turns.waiting():
                pass
            seen.append(turns.holds_turn())

    in_thread(confined_job).join(WAIT)
    assert seen == [False, False]


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs a thread that may run on two CPUs",
)
def test_a_thread_free_to_move_between_cpus_takes_turns():
    seen: list[bool] = []

    def job() -> None:
        with turns.taking_turns():
            seen.append(turns.holds_turn())

    in_thread(job).join(WAIT)
    assert seen == [True]
