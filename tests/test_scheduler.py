"""The scheduler: one job per run at a time, bounded workers, resubmission, clean stop."""

from __future__ import annotations

import threading
import time

import pytest

from evalpush.app import Scheduler

WAIT_SECONDS = 10.0


class Recorder:
    """A job that records what ran, optionally blocking until released."""

    def __init__(self, *, block: bool = False) -> None:
        self.ran: list[str] = []
        self.lock = threading.Lock()
        self.active: dict[str, int] = {}
        self.max_active_per_key = 0
        self.max_active = 0
        self.release = threading.Event()
        self.started = threading.Semaphore(0)
        if not block:
            self.release.set()

    def __call__(self, key: str) -> None:
        with self.lock:
            self.active[key] = self.active.get(key, 0) + 1
            self.max_active_per_key = max(self.max_active_per_key, self.active[key])
            self.max_active = max(self.max_active, sum(self.active.values()))
        self.started.release()
        assert self.release.wait(WAIT_SECONDS)
        with self.lock:
            self.active[key] -= 1
            self.ran.append(key)


class TestScheduler:
    def test_every_submitted_key_runs_once_and_wait_idle_returns_after_the_last(self) -> None:
        job = Recorder()
        with Scheduler(job, workers=3) as scheduler:
            for key in ("a", "b", "c", "d"):
                assert scheduler.submit(key)
            assert scheduler.wait_idle(WAIT_SECONDS)
        assert sorted(job.ran) == ["a", "b", "c", "d"]

    def test_a_key_submitted_while_queued_is_queued_once(self) -> None:
        job = Recorder(block=True)
        with Scheduler(job, workers=1) as scheduler:
            scheduler.submit("first")
            assert job.started.acquire(timeout=WAIT_SECONDS)
            for _ in range(5):
                scheduler.submit("second")
            assert scheduler.queued == 1
            job.release.set()
            assert scheduler.wait_idle(WAIT_SECONDS)
        assert job.ran == ["first", "second"]

    def test_a_key_submitted_while_its_job_runs_runs_again_after_it_never_beside_it(self) -> None:
        job = Recorder(block=True)
        with Scheduler(job, workers=4) as scheduler:
            scheduler.submit("run")
            assert job.started.acquire(timeout=WAIT_SECONDS)
            scheduler.submit("run")
            scheduler.submit("run")
            assert scheduler.busy == {"run"}
            job.release.set()
            assert scheduler.wait_idle(WAIT_SECONDS)
        assert job.ran == ["run", "run"], "once more after the running job, not twice more"
        assert job.max_active_per_key == 1

    def test_no_more_than_the_worker_count_run_at_once(self) -> None:
        job = Recorder(block=True)
        with Scheduler(job, workers=2) as scheduler:
            for key in "abcdef":
                scheduler.submit(key)
            assert job.started.acquire(timeout=WAIT_SECONDS)
            assert job.started.acquire(timeout=WAIT_SECONDS)
            assert not job.started.acquire(timeout=0.2), "a third job started beside two"
            job.release.set()
            assert scheduler.wait_idle(WAIT_SECONDS)
        assert job.max_active == 2
        assert sorted(job.ran) == list("abcdef")

    def test_a_failing_job_is_reported_and_its_worker_goes_on(self) -> None:
        errors: list[tuple[str, str]] = []
        ran: list[str] = []

        def work(key: str) -> None:
            if key == "bad":
                raise ValueError("broken run")
            ran.append(key)

        with Scheduler(
            work, workers=1, on_error=lambda k, e: errors.append((k, str(e)))
        ) as scheduler:
            for key in ("bad", "good"):
                scheduler.submit(key)
            assert scheduler.wait_idle(WAIT_SECONDS)
        assert errors == [("bad", "broken run")]
        assert ran == ["good"]

    def test_stop_lets_the_running_job_end_drops_the_queue_and_joins_every_worker(self) -> None:
        job = Recorder(block=True)
        scheduler = Scheduler(job, workers=1, name="stop-test").start()
        scheduler.submit("running")
        scheduler.submit("queued")
        assert job.started.acquire(timeout=WAIT_SECONDS)
        threading.Timer(0.1, job.release.set).start()
        started = time.monotonic()
        scheduler.stop()
        assert time.monotonic() - started < WAIT_SECONDS
        assert job.ran == ["running"], "the queued run was dropped, the running one finished"
        assert not [t for t in threading.enumerate() if t.name.startswith("stop-test")]
        assert scheduler.submit("late") is False

    def test_a_scheduler_needs_a_worker(self) -> None:
        with pytest.raises(ValueError):
            Scheduler(lambda key: None, workers=0)
