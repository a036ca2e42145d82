"""Claims: exactly once across processes sharing one state directory.

The first classes drive real `evalpush push` processes against a local platform with faults on,
started together, SIGKILLed at random moments and started again; the platform must end with one
evaluation per run, every sample once, finalized once. The last classes check the claim itself
on a real ledger file: who may take it, when a holder counts as gone, fencing, the lease.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from structlog.testing import capture_logs

import ledger_v1
from evalpush.core.errors import Busy, ClaimLost
from evalpush.core.setaside import SetAside
from evalpush.core.states import HistoryOutcome, State, Step
from evalpush.ledger import (
    LINGER_SECONDS,
    SCHEMA_VERSION,
    Claims,
    Ledger,
    Process,
    RunRecord,
    process_start,
    transitions,
)
from evalpush.local_platform import LocalPlatform
from evalpush.upload import CRASH_ENV
from pushing import (
    PUSH_TIMEOUT_SECONDS,
    assert_exactly_once,
    generated_run,
    outputs,
    push_environ,
    start_push,
)
from support.commands import evalpush
from support.platform_view import requests
from support.waiting import wait_until

KILL_ROUNDS = 4
FINAL_ROUNDS = 3
SEED = int(os.environ.get("EVALPUSH_TEST_SEED", "1234"))
POLL_SECONDS = 0.02
HOLD_SECONDS = 8.0  # how long a stalled samples request keeps a push holding its run (long
# enough for two `status` processes to start on a loaded CI box while it holds)
WAIT_BOUND_SECONDS = 20.0


@pytest.fixture(scope="module")
def source_runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Three generated runs (about 400, 250 and 150 KB: dozens of 5-sample batches)."""
    out = tmp_path_factory.mktemp("claim-runs")
    return [
        generated_run(out, size, seed=seed)
        for size, seed in ((400_000, 11), (250_000, 12), (150_000, 13))
    ]


def inject_faults(platform: LocalPlatform) -> None:
    """A few of everything an upload must get through: 503s, resets after the work, a 502 on
    create after the work."""
    platform.inject("status", on="samples", status=503, count=3)
    platform.inject("reset", on="samples", count=2)
    platform.inject("status", on="create", status=502, do_work=True, count=1)


def kill_some_at_random(
    processes: list[subprocess.Popen[bytes]], platform: LocalPlatform, rng: random.Random
) -> int:
    """Once the platform saw a random number of further batches, SIGKILL each process still
    running with a 3 in 4 chance, a random instant apart; the rest run to their end. Returns
    how many were killed."""
    target = requests(platform, "samples") + rng.randint(1, 20)
    deadline = time.monotonic() + PUSH_TIMEOUT_SECONDS
    while (
        any(p.poll() is None for p in processes)
        and requests(platform, "samples") < target
        and time.monotonic() < deadline
    ):
        time.sleep(POLL_SECONDS)
    killed = 0
    for process in processes:
        time.sleep(rng.uniform(0, 0.05))
        if process.poll() is None and rng.random() < 0.75:
            process.kill()
            killed += 1
    for process in processes:
        process.communicate(timeout=PUSH_TIMEOUT_SECONDS)
    return killed


def run_together_until_done(root: Path | list[Path], environ: dict[str, str], count: int) -> None:
    for _ in range(FINAL_ROUNDS):
        processes = [start_push(root, environ) for _ in range(count)]
        outcomes = [(p, *p.communicate(timeout=PUSH_TIMEOUT_SECONDS)) for p in processes]
        if all(p.returncode == 0 for p, _, _ in outcomes):
            return
    report = "\n".join(
        f"exit {p.returncode}\n{out.decode()}{err.decode()}" for p, out, err in outcomes
    )
    pytest.fail(f"pushes did not finish:\n{report}")


class TestPushesTogether:
    @pytest.mark.parametrize("count", [2, 3])
    def test_pushes_of_the_same_runs_killed_at_random_and_restarted_upload_each_run_once(
        self, count: int, source_runs: list[Path], platform: LocalPlatform, tmp_path: Path
    ) -> None:
        root = outputs(tmp_path, source_runs)
        environ = push_environ(platform, tmp_path, EVALPUSH_UPLOAD__MAX_BATCH_SAMPLES="5")
        rng = random.Random(SEED + count)
        killed = 0
        for _ in range(KILL_ROUNDS):
            inject_faults(platform)
            processes = [start_push(root, environ) for _ in range(count)]
            killed += kill_some_at_random(processes, platform, rng)
        inject_faults(platform)
        run_together_until_done(root, environ, count)

        assert killed > 0, "some pushes were killed mid-way"
        assert_exactly_once(platform, root)

    def test_pushes_over_overlapping_trees_share_the_runs_they_both_hold(
        self, source_runs: list[Path], platform: LocalPlatform, tmp_path: Path
    ) -> None:
        first = outputs(tmp_path, source_runs[:1], group="only-first")
        outputs(tmp_path, source_runs[1:], group="both")
        outputs(tmp_path, [generated_run(tmp_path / "more", 100_000, seed=14)], group="only-second")
        environ = push_environ(platform, tmp_path, EVALPUSH_UPLOAD__MAX_BATCH_SAMPLES="5")
        inject_faults(platform)

        one = start_push([first / "only-first", first / "both"], environ)
        two = start_push([first / "both", first / "only-second"], environ)
        out_one, _ = one.communicate(timeout=PUSH_TIMEOUT_SECONDS)
        out_two, _ = two.communicate(timeout=PUSH_TIMEOUT_SECONDS)

        assert (one.returncode, two.returncode) == (0, 0), out_one + out_two
        assert_exactly_once(platform, first)
        # Shared, not repeated: the runs in both trees were each created and finalized once,
        # and each is reported by the push that did not upload it as the other's work.
        summary = platform.summary()
        assert summary["requests"]["create"] == 4  # the 502 after the work: found, not resent
        for run in source_runs[1:]:
            lines = [
                line
                for line in (out_one + out_two).decode().splitlines()
                if f"both/{run.name}" in line
            ]
            assert len(lines) == 2 and all(line.startswith("finalized") for line in lines)
            assert any(
                "already finalized, nothing sent" in line or "uploaded by pid" in line
                for line in lines
            ), lines


OPEN_AT = """
import sys, time
from pathlib import Path
from evalpush.ledger import Ledger
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))
for state in sorted(Path(sys.argv[1]).iterdir()):
    Ledger(state / "state.db").close()
"""
OPENERS = 8
LEDGERS = 30  # each opener opens these in the same order: 30 races of 8 per test
OPENERS_START_SECONDS = 1.5  # time for every opener to start and import before they all open


class TestOpeningTogether:
    @pytest.mark.parametrize("kind", ["fresh", "schema-1"])
    def test_processes_opening_ledgers_together_all_succeed(self, kind: str, tmp_path: Path):
        states = [tmp_path / "ledgers" / f"{n:02d}" for n in range(LEDGERS)]
        for state in states:
            state.mkdir(parents=True)
            if kind == "schema-1":
                ledger_v1.build(state, tmp_path / "runs")
        start_at = time.time() + OPENERS_START_SECONDS
        openers = [
            subprocess.Popen(
                [sys.executable, "-c", OPEN_AT, str(tmp_path / "ledgers"), str(start_at)],
                stderr=subprocess.PIPE,
            )
            for _ in range(OPENERS)
        ]
        failures = [
            err.decode()
            for opener in openers
            for _, err in [opener.communicate(timeout=PUSH_TIMEOUT_SECONDS)]
            if opener.returncode != 0
        ]

        assert not failures, "\n".join(failures)
        for state in states:
            with Ledger(state / "state.db") as ledger:
                assert (
                    ledger._file.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
                )
                assert len(ledger.all()) == (ledger_v1.RUNS if kind == "schema-1" else 0)


def read_rows(state: Path) -> list[RunRecord]:
    with Ledger.for_reading(state / "state.db") as ledger:
        return ledger.all()


def wait_for_holder(state: Path, pid: int) -> RunRecord:
    """The run `pid` holds, once it holds one (bounded)."""
    deadline = time.monotonic() + WAIT_BOUND_SECONDS
    while time.monotonic() < deadline:
        if (state / "state.db").exists():
            held = [r for r in read_rows(state) if r.claim_pid == pid]
            if held:
                return held[0]
        time.sleep(POLL_SECONDS)
    pytest.fail(f"pid {pid} never held a run")


class TestBesideARunningPush:
    @pytest.fixture
    def holding(self, source_runs, platform, tmp_path):
        """A push holding its one run while a stalled samples request keeps it busy."""
        root = outputs(tmp_path, source_runs[2:])
        environ = push_environ(platform, tmp_path)
        platform.inject("stall", on="samples", seconds=HOLD_SECONDS)
        process = start_push(root, environ)
        wait_for_holder(tmp_path / "state", process.pid)
        wait_until(lambda: requests(platform, "samples"), "the stalled samples request")
        held = wait_for_holder(tmp_path / "state", process.pid)  # the row as it uploads
        yield root, environ, process, held
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=PUSH_TIMEOUT_SECONDS)

    def test_push_no_wait_reports_the_holder_and_exits_1_touching_nothing(self, holding, platform):
        root, environ, holder, held = holding

        done = evalpush(environ, "push", "--no-wait", str(root))

        assert done.returncode == 1
        assert f"being uploaded by pid {holder.pid}" in done.stdout
        out, _ = holder.communicate(timeout=PUSH_TIMEOUT_SECONDS)
        assert holder.returncode == 0, out
        assert_exactly_once(platform, root)

    def test_push_waits_for_the_holder_and_reports_the_outcome_it_reached(self, holding, platform):
        root, environ, holder, held = holding

        done = evalpush(environ, "push", str(root))

        assert holder.wait(timeout=PUSH_TIMEOUT_SECONDS) == 0
        assert done.returncode == 0, done.stdout + done.stderr
        assert "finalized" in done.stdout
        assert f"uploaded by pid {holder.pid}" in done.stdout
        assert_exactly_once(platform, root)
        assert platform.summary()["requests"]["create"] == 1

    def test_status_shows_who_holds_the_run_and_since_when(self, holding):
        _root, environ, holder, held = holding

        rows = json.loads(evalpush(environ, "status", "--json").stdout)
        table = evalpush(environ, "status").stdout

        (row,) = rows
        assert row["holder"]["pid"] == holder.pid
        assert row["holder"]["host"] == os.uname().nodename
        assert abs(row["holder"]["since"] - held.claim_since) < 1e-6
        assert row["state"] == State.UPLOADING
        assert "HOLDER" in table and f"pid {holder.pid} since " in table


LATE_SECONDS = 2.0
"""How late the late batch lands: after the reconciling read of a push that would not wait for
it, while the run is still open (the next batch's answer trickles in for seconds)."""
LATE_WRITES = {"EVALPUSH_PLATFORM__LATE_WRITE_SECONDS": "3"}


def land_first_batch_late(
    platform: LocalPlatform, late: float = LATE_SECONDS, byte_seconds: float = 0.15
) -> None:
    """The first batch lands `late` seconds after it came in, unanswered; the answer to the
    next batch comes a byte every `byte_seconds`, so the evaluation is still open when the late
    one lands."""
    platform.inject("late", on="samples", seconds=late)
    platform.inject("trickle", on="samples", seconds=byte_seconds)


class TestRequestsOutlivingTheirSender:
    """A write can land after its sender gave it up: the platform held it between a proxy and
    the backend, or its process was killed or cut off after sending it. Whoever reconciles
    waits `platform.late_write_seconds` first, and a holder's writes end that long before its
    lease could lapse."""

    def test_a_batch_landing_after_its_killed_sender_is_not_sent_again_by_the_next_push(
        self, source_runs, platform, tmp_path
    ):
        root = outputs(tmp_path, source_runs[:1])
        environ = push_environ(platform, tmp_path, **LATE_WRITES)
        land_first_batch_late(platform)
        killed = start_push(root, environ)
        wait_until(lambda: platform.summary()["requests"]["samples"] >= 1, "the first batch")
        killed.kill()
        killed.communicate(timeout=PUSH_TIMEOUT_SECONDS)

        again = evalpush(environ, "push", str(root))

        assert again.returncode == 0, again.stdout + again.stderr
        assert_exactly_once(platform, root)

    def test_a_batch_landing_after_the_client_gave_up_on_it_is_not_sent_again(
        self, source_runs, platform, tmp_path
    ):
        root = outputs(tmp_path, source_runs[:1])
        environ = push_environ(
            platform,
            tmp_path,
            EVALPUSH_PLATFORM__READ_TIMEOUT_SECONDS="0.4",
            EVALPUSH_PLATFORM__LATE_WRITE_SECONDS="2",
        )
        land_first_batch_late(platform, late=1.2, byte_seconds=0.1)  # no process to start

        done = evalpush(environ, "push", str(root))

        assert done.returncode == 0, done.stdout + done.stderr
        assert_exactly_once(platform, root)

    def test_a_holders_write_is_cut_off_before_its_lease_could_lapse(
        self, source_runs, platform, tmp_path
    ):
        """A samples request the platform never answers, with a read timeout and a request
        deadline far past the lease: the push cuts it off within the lease, reconciles, and
        finishes (before, it waited the whole stall, past the time a lease-holder on another
        host would have lost the run)."""
        root = outputs(tmp_path, source_runs[2:])
        environ = push_environ(
            platform,
            tmp_path,
            EVALPUSH_LEDGER__LEASE_SECONDS="6",
            EVALPUSH_PLATFORM__LATE_WRITE_SECONDS="1",
            EVALPUSH_PLATFORM__READ_TIMEOUT_SECONDS="300",
            EVALPUSH_LOG__LEVEL="info",
        )
        platform.inject("stall", on="samples", seconds=120)  # the work done, no answer for 2 min

        done = evalpush(environ, "push", "--timeout", "60", str(root))

        assert done.returncode == 0, done.stdout + done.stderr
        assert_exactly_once(platform, root)


class TestKilledHolder:
    def test_a_claim_left_by_a_killed_push_is_taken_over_and_reconciled(
        self, source_runs, platform, tmp_path
    ):
        root = outputs(tmp_path, source_runs[:1])
        environ = push_environ(platform, tmp_path)
        killed = start_push(root, {**environ, CRASH_ENV: "batch-sent:2"})
        killed.communicate(timeout=PUSH_TIMEOUT_SECONDS)
        assert killed.returncode == -signal.SIGKILL
        (left,) = read_rows(tmp_path / "state")
        assert (left.claim_pid, left.state) == (killed.pid, State.UPLOADING)
        assert left.pending is not None, "the batch it sent is not acknowledged"
        (row,) = json.loads(evalpush(environ, "status", "--json").stdout)
        assert (row["state"], row["holder"]) == (State.READY, None)
        assert "interrupted" in row["reason"]

        again = start_push(root, environ)
        out, err = again.communicate(timeout=PUSH_TIMEOUT_SECONDS)

        assert again.returncode == 0, out + err
        assert b"took over the claim of a process that is gone" in err
        assert str(killed.pid).encode() in err
        assert_exactly_once(platform, root)
        (after,) = read_rows(tmp_path / "state")
        assert after.holder is None


# ---------------------------------------------------------------- the claim on a real ledger


RUN_ID = "7a0c4b1e-2d3f-4a5b-8c6d-9e0f1a2b3c4d"
SHORT_LEASE_SECONDS = 0.5


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def take(claims: Claims, run_id: str = RUN_ID) -> tuple[RunRecord, object]:
    return claims.take(run_id=run_id, path=Path("/runs") / run_id, kind="eval")


def taken_by(ledger: Ledger, process: Process, clock: Clock | None = None, **options) -> RunRecord:
    """The run claimed as `process` would claim it; then nothing renews it (a process that
    stopped, or one on a host whose heartbeat this test does not run)."""
    claims = Claims(ledger, process=process, clock=clock or Clock(), **options)
    record, _ = take(claims)
    claims.close()
    return record


def another_host() -> Process:
    return Process("another-host", "another-boot", 4242, 99)


def on_this_host(pid: int, start: int, boot: str | None = None) -> Process:
    here = Process.current()
    return Process(here.host, here.boot if boot is None else boot, pid, start, here.pidns)


class TestTakingAClaim:
    def test_a_run_held_by_a_live_process_is_busy_for_every_other(self, ledger):
        mine = Claims(ledger)
        record, gone = take(mine)
        try:
            with pytest.raises(Busy, match=f"pid {os.getpid()}") as busy:
                taken_by(ledger, another_host())
            assert busy.value.pid == os.getpid() and gone is None
        finally:
            mine.release(record)

    def test_a_claim_whose_lease_ran_out_on_another_host_is_taken_over(self, ledger):
        # Leases are judged by the ledger's clock (the database's, on PostgreSQL): real time
        # passes here, not a clock of the test's.
        theirs = taken_by(ledger, another_host(), lease_seconds=SHORT_LEASE_SECONDS)
        with pytest.raises(Busy):
            take(Claims(ledger))

        time.sleep(SHORT_LEASE_SECONDS + 0.1)
        mine = Claims(ledger)
        record, gone = take(mine)

        assert gone is not None and gone.owner == theirs.claim_owner
        assert record.claim_pid == os.getpid()
        mine.release(record)

    def test_a_claim_of_a_process_that_ended_on_this_host_is_taken_over(self, ledger):
        sleeper = subprocess.Popen(["sleep", "30"])
        start = process_start(sleeper.pid)
        assert start is not None
        taken_by(ledger, on_this_host(sleeper.pid, start))
        with pytest.raises(Busy):
            take(Claims(ledger))
        sleeper.kill()
        sleeper.wait()

        mine = Claims(ledger)
        record, gone = take(mine)

        assert gone is not None and gone.pid == sleeper.pid
        mine.release(record)

    def test_a_killed_owner_not_yet_reaped_counts_as_gone(self, ledger):
        sleeper = subprocess.Popen(["sleep", "30"])
        start = process_start(sleeper.pid)
        assert start is not None
        taken_by(ledger, on_this_host(sleeper.pid, start))
        sleeper.kill()
        deadline = time.monotonic() + 5
        while process_start(sleeper.pid) is not None and time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)  # a zombie until waited for

        mine = Claims(ledger)
        try:
            record, gone = take(mine)
            assert gone is not None and gone.pid == sleeper.pid
            mine.release(record)
        finally:
            sleeper.wait()

    def test_a_live_owner_in_another_pid_namespace_is_judged_by_its_lease(self, ledger):
        here = Process.current()
        # A process in a container on this host: its pid (here: one that runs nothing) means
        # nothing to this process, so only its lease can say it is gone.
        contained = Process(here.host, here.boot, 999_999_999, 1, "pid:[1]")
        taken_by(ledger, contained, lease_seconds=SHORT_LEASE_SECONDS)
        with pytest.raises(Busy):
            take(Claims(ledger))

        time.sleep(SHORT_LEASE_SECONDS + 0.1)
        mine = Claims(ledger)
        record, gone = take(mine)

        assert gone is not None and gone.pidns == "pid:[1]"
        mine.release(record)

    def test_a_host_whose_clock_runs_ahead_does_not_take_a_live_lease(self, ledger):
        """Leases are judged by one clock, the ledger's: a claimer five minutes ahead of it
        does not see another host's fresh lease as run out."""
        taken_by(ledger, another_host(), lease_seconds=60.0)
        ahead = Clock()
        ahead.now += 300.0

        with pytest.raises(Busy):
            take(Claims(ledger, clock=ahead))

    def test_a_lease_written_by_a_host_whose_clock_runs_behind_runs_out_on_time(self, ledger):
        behind = Clock()
        behind.now -= 300.0
        taken_by(ledger, another_host(), behind, lease_seconds=SHORT_LEASE_SECONDS)
        with pytest.raises(Busy):
            take(Claims(ledger))

        time.sleep(SHORT_LEASE_SECONDS + 0.1)
        record, gone = take(mine := Claims(ledger))

        assert gone is not None
        mine.release(record)

    @pytest.mark.parametrize("what", ["recycled pid", "reboot"])
    def test_an_owner_whose_pid_now_names_another_process_is_gone(self, ledger, what):
        here = Process.current()
        if what == "recycled pid":  # this very pid, but a process started at another time
            taken_by(ledger, on_this_host(here.pid, here.start + 1))
        else:  # same pid and start time, before the last boot
            taken_by(ledger, on_this_host(here.pid, here.start, boot="an-earlier-boot"))

        mine = Claims(ledger)
        record, gone = take(mine)

        assert gone is not None
        mine.release(record)

    def test_a_released_claim_leaves_the_run_to_whoever_comes_next(self, ledger):
        mine = Claims(ledger)
        record, _ = take(mine)

        nobodys = mine.release(record)
        theirs = taken_by(ledger, another_host())

        assert nobodys.holder is None
        assert (theirs.claim_host, ledger.get_run(RUN_ID).claim_pid) == ("another-host", 4242)


class TestFencing:
    def test_every_write_of_a_holder_whose_claim_was_taken_over_is_refused(self, ledger):
        theirs = taken_by(ledger, another_host(), lease_seconds=SHORT_LEASE_SECONDS)
        time.sleep(SHORT_LEASE_SECONDS + 0.1)
        mine = Claims(ledger)
        record, _ = take(mine)
        before = ledger.get_run(RUN_ID)

        with pytest.raises(ClaimLost):
            ledger.set_state(theirs, State.FINALIZED, acked_offset=99)
        with pytest.raises(ClaimLost):
            ledger.add_set_aside(theirs, [SetAside(1, 0, 5, "bad_line", "x")])
        with pytest.raises(ClaimLost):
            ledger.restart(theirs, outcome=HistoryOutcome.SUPERSEDED, state=State.READY)
        with pytest.raises(ClaimLost):
            ledger.forget(theirs)
        with pytest.raises(ClaimLost):
            ledger.record_intent(theirs, '{"step": "finalize"}')
        with pytest.raises(ClaimLost):
            ledger.acknowledge(theirs, acked_offset=99)
        ledger.record_progress(theirs, samples_sent=99)  # held in memory: the next write carries it
        with pytest.raises(ClaimLost):
            ledger.update(theirs, reason="x")

        assert ledger.get_run(RUN_ID) == before
        assert ledger.set_aside(before) == []
        assert ledger.update(record, acked_offset=7).acked_offset == 7
        mine.release(record)

    def test_a_write_to_a_run_nobody_held_is_refused_once_someone_claims_it(self, ledger):
        unheld = ledger.add(path="/runs/x", run_id=RUN_ID, kind="eval", state=State.FAILED)
        mine = Claims(ledger)
        record, _ = take(mine)

        with pytest.raises(ClaimLost):
            ledger.set_state(unheld, State.READY)

        mine.release(record)
        assert ledger.get_run(RUN_ID).state == State.FAILED

    def test_a_write_refused_by_its_fence_leaves_the_holders_deferred_write_to_the_holder(
        self, ledger
    ):
        """A thread that read the run while nobody held it writes after a claim of its own
        process took it (the daemon's tracker writing a followed run's progress as a stretch
        begins): the write is refused, and what the holder deferred (its scan's fingerprint,
        which goes with its create intent) is still written by the holder's next write."""
        unheld = ledger.add(path="/runs/x", run_id=RUN_ID, kind="eval", state=State.WAITING)
        mine = Claims(ledger)
        record, _ = take(mine)
        record = ledger.record_progress(record, upload_end=9, env_id="env-1", step=Step.CREATE)

        with pytest.raises(ClaimLost):
            transitions.wait(ledger, unheld, "still waiting", settles_at=None)

        record = ledger.record_intent(record, '{"step": "create", "env": "env-1"}')
        mine.release(record)
        stored = ledger.get_run(RUN_ID)
        assert (stored.upload_end, stored.env_id, stored.step) == (9, "env-1", Step.CREATE)


class TestLease:
    def test_the_heartbeat_renews_the_lease_while_the_claim_is_held_and_stops_after(self, ledger):
        # A lease of 2 s watched for 3 s: unrenewed it would lapse in the middle, and a renewal
        # (every half second) may stall for 1.5 s on a loaded machine before the test is wrong.
        mine = Claims(ledger, lease_seconds=2.0)
        record, _ = take(mine)
        try:
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline:
                ((expires,),) = ledger._query(sa.text("SELECT claim_expires FROM runs"))
                assert expires > time.time(), "the lease lapsed while held"
                time.sleep(0.05)
        finally:
            mine.release(record)

        beats = [t for t in threading.enumerate() if t.name == "claim-heartbeat"]
        for beat in beats:
            beat.join(LINGER_SECONDS + 2.0)
        assert not any(beat.is_alive() for beat in beats)

    def test_a_claim_released_while_its_lease_is_renewed_is_not_said_taken_over(self, ledger):
        """The heartbeat renews the claims it held when the renewal began: one released in
        between is no longer in the ledger, given back rather than taken over, and the warning
        that another process took it would send a person looking for one that does not exist."""
        mine = Claims(ledger, lease_seconds=0.2)
        record, _ = take(mine)
        renew, renewed = ledger.renew, threading.Event()

        def released_meanwhile(owners: list[str], expires: float) -> set[str]:
            if not renewed.is_set():
                mine.release(record)  # the upload gives its run back as the renewal starts
            try:
                return renew(owners, expires)
            finally:
                renewed.set()

        mine._heartbeat._renew = released_meanwhile
        beat = mine._heartbeat._thread
        assert beat is not None
        with capture_logs() as logs:
            assert renewed.wait(5.0), "no renewal"
            mine.close()
            beat.join(5.0)  # the renewal said what it found before the thread ended
        assert not beat.is_alive()

        assert ledger.get_run(RUN_ID).claim_owner is None
        assert [e["event"] for e in logs if e["log_level"] == "warning"] == []

    def test_a_renewal_while_a_claim_is_released_does_not_say_it_taken_over(self, ledger):
        """A renewal that runs once the release is written but before `release` returns finds
        the claim gone from the ledger: the heartbeat must have stopped renewing it first."""
        mine = Claims(ledger, lease_seconds=0.2)
        record, _ = take(mine)
        release, renew = ledger.release, ledger.renew
        released, renewed_after = threading.Event(), threading.Event()

        def renewing(owners: list[str], expires: float) -> set[str]:
            after = released.is_set()
            try:
                return renew(owners, expires)
            finally:
                if after:
                    renewed_after.set()

        def slow_release(held: RunRecord) -> RunRecord:
            given_back = release(held)
            released.set()
            renewed_after.wait(1.0)  # a renewal comes before this returns
            return given_back

        mine._heartbeat._renew = renewing
        ledger.release = slow_release
        beat = mine._heartbeat._thread
        assert beat is not None
        with capture_logs() as logs:
            mine.release(record)
            mine.close()
            beat.join(5.0)
        assert not beat.is_alive()

        assert [e["event"] for e in logs if e["log_level"] == "warning"] == []

    def test_taking_and_releasing_claims_does_not_wake_the_heartbeat(self, ledger):
        """A run's claim is taken and released around every upload: the heartbeat's thread is
        not woken for either (it renews on its own schedule, and a new claim's lease is new).
        Counted by the kernel: the thread's voluntary context switches."""
        mine = Claims(ledger)
        record, _ = take(mine, run_id=f"{RUN_ID[:-3]}000")
        beat = mine._heartbeat._thread
        assert beat is not None and beat.native_id is not None
        mine.release(record)

        def switches() -> int:
            status = Path(f"/proc/self/task/{beat.native_id}/status").read_text()
            return int(status.split("voluntary_ctxt_switches:")[1].split()[0])

        before, started = switches(), time.monotonic()
        for n in range(1, 201):
            record, _ = take(mine, run_id=f"{RUN_ID[:-3]}{n:03d}")
            mine.release(record)
        took = time.monotonic() - started
        woken = switches() - before
        mine.close()
        beat.join(LINGER_SECONDS)
        # Once a tick (a second at most) it looks at the claims held, and may wait there for
        # Python's lock a few times; for the 200 claims, never (it was woken twice for each).
        ticks = 1 + int(took / LINGER_SECONDS)
        assert woken <= 5 * ticks, f"woken {woken} times in {took:.2f} s"

    def test_runs_claimed_one_after_another_share_one_heartbeat_thread(self, ledger):
        mine = Claims(ledger)
        started = []
        for n in range(3):
            record, _ = take(mine, run_id=f"{RUN_ID[:-1]}{n}")
            started += [t for t in threading.enumerate() if t.name == "claim-heartbeat"]
            mine.release(record)
            time.sleep(LINGER_SECONDS / 5)  # the next run's upload starts a little later

        assert len(started) == 3 and len(set(started)) == 1, "a heartbeat thread per claim"
        mine.close()
        started[0].join(LINGER_SECONDS / 2)  # close ends the lingering thread at once
        assert not started[0].is_alive()
