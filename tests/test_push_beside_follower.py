"""Attacks on `push` beside a daemon that follows a run while it is written: whatever the push
meets, one run ends as exactly one COMPLETED evaluation with every line once."""

from __future__ import annotations

import contextlib
import hashlib
import json
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from daemon_support import (
    WAIT_SECONDS,
    Daemon,
    InProcessDaemon,
    NotifySocket,
    RunDir,
    evaluations_of,
    status,
    wait_until,
)
from evalpush.local_platform import LocalPlatform
from evalpush.upload import CRASH_ENV
from support.commands import evalpush
from support.platform_view import requests
from test_follow import (
    EXPECTED,
    first_lines_followed,
    first_lines_followed_then_stopped,
    followed_run,
)


def row_value(environ: dict, run: RunDir, column: str) -> Any:
    """One column of the run's ledger row, as the file holds it now."""
    with contextlib.closing(
        sqlite3.connect(Path(environ["EVALPUSH_STATE_DIR"]) / "state.db")
    ) as db:
        (value,) = db.execute(
            f"SELECT {column} FROM runs WHERE run_id = ?", (run.run_id,)
        ).fetchone()
    return value


def past_the_last_stretch(environ: dict, run: RunDir, seconds: float = 1.5) -> None:
    """Wait until the run's last stretch is `seconds` old, past the test daemons' one-second
    batch period: the eval's next line is slow to come (or the daemon is not running). A
    stretch's end is written after the platform holds its lines (the row waits again, with
    when): read before it, `followed_at` is an earlier stretch's, or none."""
    wait_until(
        lambda: (
            row_value(environ, run, "state") == "waiting"
            and row_value(environ, run, "followed_at") is not None
        ),
        "the stretch's end in the ledger",
    )
    acknowledged = row_value(environ, run, "followed_at")
    wait_until(lambda: time.time() - acknowledged > seconds, f"the last stretch {seconds:g} s old")


def outcome(pushed: subprocess.CompletedProcess[str]) -> tuple[int, str]:
    """A `push --json` of one run: its exit code and the run's status."""
    assert pushed.stdout, f"push exited {pushed.returncode} printing nothing: {pushed.stderr}"
    (result,) = json.loads(pushed.stdout)["results"]
    return pushed.returncode, result["status"]


def one_completed_with_every_line(platform: LocalPlatform, run: RunDir) -> None:
    """The promise: one evaluation, COMPLETED once, with every line once."""
    evaluations = list(evaluations_of(platform, run.run_id).values())
    assert [e["status"] for e in evaluations] == ["COMPLETED"], evaluations
    (final,) = evaluations
    assert (final["sample_count"], final["distinct_sample_ids"]) == (EXPECTED, EXPECTED)
    assert (final["duplicates"], final["finalize_count"]) == (0, 1)
    assert requests(platform, "create") == 1


def finished_on_platform(platform: LocalPlatform, run: RunDir) -> None:
    wait_until(
        lambda: any(
            e["status"] == "COMPLETED" and e["sample_count"] == EXPECTED
            for e in evaluations_of(platform, run.run_id).values()
        ),
        "the run finished on the platform",
    )


def test_a_push_beside_a_live_daemon_following_a_slow_eval_leaves_the_run_to_the_daemon(
    local_platform: LocalPlatform, tmp_path: Path
) -> None:
    """A stretch is sent only once lines came: an eval whose next line takes longer than a
    batch period (a slow rollout) leaves its last stretch older than that while the daemon
    follows it on. The push still leaves the run to the daemon (finalized short by the push, it
    was superseded by the daemon's upload of the finished run: two COMPLETED), and `retry`,
    which takes only failed or held runs, leaves it too."""
    environ, run = followed_run(local_platform, tmp_path, EVALPUSH_RUNS__FOLLOW_BATCH_SECONDS="1")
    lines = run.lines(EXPECTED)
    with InProcessDaemon(environ) as daemon:
        daemon.started()
        run.write(lines[:5])
        first_lines_followed(local_platform, run, 5)
        past_the_last_stretch(environ, run)
        pushed = evalpush(environ, "push", str(run.path))
        retried = evalpush(environ, "retry", run.run_id)
        shown = status(environ)[run.run_id]
        run.write(lines[5:])
        finished_on_platform(local_platform, run)
        assert daemon.stop() == 0

    assert pushed.returncode == 1 and pushed.stdout.startswith("following  "), pushed.stdout
    assert retried.returncode == 1 and "only failed or held runs" in retried.stderr
    assert (shown["state"], shown["samples_sent"]) == ("following", 5)
    one_completed_with_every_line(local_platform, run)


def test_a_push_that_waited_for_a_stretch_in_flight_leaves_the_run_to_the_daemon(
    local_platform: LocalPlatform, tmp_path: Path
) -> None:
    """The push meets the daemon's claim (a stretch's batch held up by the platform): `--no-wait`
    says busy, a waiting push takes the run once the stretch is acknowledged and leaves it to
    the daemon."""
    environ, run = followed_run(local_platform, tmp_path)
    lines = run.lines(EXPECTED)
    with InProcessDaemon(environ) as daemon:
        daemon.started()
        run.write(lines[:5])
        first_lines_followed(local_platform, run, 5)
        local_platform.inject("stall", on="samples", count=1, seconds=6.0)
        run.write(lines[5:10])
        # The stall taken is the next stretch's batch, held up with its claim (the claim seen
        # alone may be the first stretch's, released as the push starts).
        wait_until(
            lambda: not local_platform.pending_faults() and row_value(environ, run, "claim_owner"),
            "a stretch in flight",
        )
        no_wait = evalpush(environ, "push", "--no-wait", "--json", str(run.path))
        waited = evalpush(environ, "push", "--json", str(run.path))
        run.write(lines[10:])
        finished_on_platform(local_platform, run)
        assert daemon.stop() == 0

    (busy,) = json.loads(no_wait.stdout)["results"]
    assert (no_wait.returncode, busy["status"]) == (1, "failed"), no_wait.stdout
    assert "being uploaded by pid" in busy["error"]
    (left,) = json.loads(waited.stdout)["results"]
    assert (waited.returncode, left["status"], left["samples_sent"]) == (1, "following", 10)
    one_completed_with_every_line(local_platform, run)


@pytest.mark.parametrize("partial", ["upload", "hold"])
def test_two_pushes_at_once_with_either_partial_policy_leave_a_followed_run_to_the_daemon(
    local_platform: LocalPlatform, tmp_path: Path, partial: str
) -> None:
    environ, run = followed_run(local_platform, tmp_path)
    lines = run.lines(EXPECTED)
    with InProcessDaemon(environ) as daemon:
        daemon.started()
        run.write(lines[:5])
        first_lines_followed(local_platform, run, 5)
        command = [sys.executable, "-m", "evalpush", "push", "--json", "--partial", partial]
        pushes = [
            subprocess.Popen(
                [*command, str(run.path)], env=environ, stdout=subprocess.PIPE, text=True
            )
            for _ in range(2)
        ]
        outputs = [push.communicate(timeout=60)[0] for push in pushes]
        shown = status(environ)[run.run_id]
        run.write(lines[5:])
        finished_on_platform(local_platform, run)
        assert daemon.stop() == 0

    for push, output in zip(pushes, outputs, strict=True):
        (result,) = json.loads(output)["results"]
        assert (push.returncode, result["status"]) == (1, "following"), output
    assert shown["state"] == "following"
    one_completed_with_every_line(local_platform, run)


def test_a_push_as_the_eval_finishes_ends_the_run_once(
    local_platform: LocalPlatform, tmp_path: Path
) -> None:
    """The last expected line lands just before the push: whether the push leaves the run to
    the daemon or finalizes it itself, the platform ends with one evaluation."""
    environ, run = followed_run(local_platform, tmp_path)
    lines = run.lines(EXPECTED)
    with InProcessDaemon(environ) as daemon:
        daemon.started()
        run.write(lines[:5])
        first_lines_followed(local_platform, run, 5)
        run.write(lines[5:])
        pushed = evalpush(environ, "push", "--json", str(run.path))
        finished_on_platform(local_platform, run)
        assert daemon.stop() == 0

    (result,) = json.loads(pushed.stdout)["results"]
    assert result["status"] in ("following", "success"), pushed.stdout
    one_completed_with_every_line(local_platform, run)
    assert status(environ)[run.run_id]["state"] == "finalized"


def test_a_followed_run_the_daemon_held_short_is_held_for_push_and_released_by_retry(
    local_platform: LocalPlatform, tmp_path: Path
) -> None:
    """The eval died short: the daemon holds its followed run (`on_incomplete = "hold"`), its
    evaluation left open. `push` does not take it for a followed run (it says held); `retry`
    releases it and the daemon finalizes the one evaluation it opened, with what was sent."""
    environ, run = followed_run(
        local_platform,
        tmp_path,
        EVALPUSH_RUNS__ON_INCOMPLETE="hold",
        EVALPUSH_RUNS__SETTLE_SECONDS="2",
    )
    with InProcessDaemon(environ) as daemon:
        daemon.started()
        run.write(run.lines(5))
        first_lines_followed(local_platform, run, 5)
        wait_until(lambda: row_value(environ, run, "state") == "held", "the run held")
        pushed = evalpush(environ, "push", "--json", str(run.path))
        retried = evalpush(environ, "retry", run.run_id)
        daemon.wait_for("run finalized", run=run.run_id)
        assert daemon.stop() == 0

    (result,) = json.loads(pushed.stdout)["results"]
    assert (pushed.returncode, result["status"], result["state"]) == (1, "failed", "held")
    assert retried.returncode == 0, retried.stderr
    (final,) = evaluations_of(local_platform, run.run_id).values()
    assert (final["status"], final["sample_count"], final["finalize_count"]) == ("COMPLETED", 5, 1)
    assert status(environ)[run.run_id]["state"] == "finalized"


def test_a_followed_run_moved_out_of_the_watched_tree_is_pushed_from_its_new_place(
    local_platform: LocalPlatform, tmp_path: Path
) -> None:
    """Moved out of the daemon's tree while it waits between stretches, the run is followed no
    more. Within a batch period of its last stretch a push cannot tell that from a move the
    daemon follows on (in its tree) and leaves it; once a batch period passed, a push from its
    new place uploads it into the one evaluation the daemon opened."""
    environ, run = followed_run(local_platform, tmp_path, EVALPUSH_RUNS__FOLLOW_BATCH_SECONDS="5")
    lines = run.lines(EXPECTED)
    with InProcessDaemon(environ) as daemon:
        daemon.started()
        run.write(lines[:5])
        first_lines_followed(local_platform, run, 5)
        moved = tmp_path / "elsewhere" / run.path.name
        moved.parent.mkdir()
        run.path.rename(moved)
        daemon.wait_for(
            "followed run gone from its directory: no longer followed; its evaluation stays "
            "open with the samples sent so far"
        )
        run.path, run.traces = moved, moved / "traces.jsonl"
        run.write(lines[5:])
        at_once = evalpush(environ, "push", "--json", str(moved))
        past_the_last_stretch(environ, run, seconds=5)
        later = evalpush(environ, "push", "--json", str(moved))
        assert daemon.stop() == 0

    (left,) = json.loads(at_once.stdout)["results"]
    assert (at_once.returncode, left["status"]) == (1, "following"), at_once.stdout
    assert outcome(later) == (0, "success"), later.stdout
    one_completed_with_every_line(local_platform, run)


def test_a_push_beside_a_restarted_daemon_leaves_the_run_its_killed_follower_left(
    local_platform: LocalPlatform, tmp_path: Path
) -> None:
    """The follower is SIGKILLed between stretches (its row waits; mid-stretch, a batch sent and
    not acknowledged, fails the same way), and a new daemon runs before the eval's next lines,
    which are slow to come. A push then leaves the run to that daemon, which ends it with every
    line once."""
    environ, run = followed_run(local_platform, tmp_path)
    lines = run.lines(EXPECTED)
    with Daemon({**environ, CRASH_ENV: "followed:1"}) as crashing:
        crashing.started()
        run.write(lines[:5])
        first_lines_followed(local_platform, run, 5)
        run.write(lines[5:10])
        crashing.process.wait(WAIT_SECONDS)
        assert crashing.process.returncode == -signal.SIGKILL, crashing.text()
    left_as = row_value(environ, run, "state")
    # Its next stretch not due before the push: a batch period of its own.
    with InProcessDaemon({**environ, "EVALPUSH_RUNS__FOLLOW_BATCH_SECONDS": "20"}) as daemon:
        daemon.started()
        past_the_last_stretch(environ, run)
        pushed = evalpush(environ, "push", "--json", str(run.path))
        run.write(lines[10:])
        finished_on_platform(local_platform, run)
        assert daemon.stop() == 0

    assert left_as == "waiting"
    assert outcome(pushed) == (1, "following"), pushed.stdout
    one_completed_with_every_line(local_platform, run)


def test_a_push_whose_batch_period_is_shorter_than_the_daemons_leaves_the_run_to_it(
    local_platform: LocalPlatform, tmp_path: Path
) -> None:
    """The push reads its own configuration: with a batch period shorter than the daemon's,
    the daemon's last stretch looks old to it while the daemon follows the run on."""
    environ, run = followed_run(
        local_platform,
        tmp_path,
        EVALPUSH_RUNS__FOLLOW_BATCH_SECONDS="60",
        EVALPUSH_UPLOAD__MAX_BATCH_BYTES="1024",  # the daemon's stretches go by size
    )
    lines = run.lines(EXPECTED)
    with InProcessDaemon(environ) as daemon:
        daemon.started()
        run.write(lines[:5])
        first_lines_followed(local_platform, run, 5)
        past_the_last_stretch(environ, run)
        pushed = evalpush(environ, "push", str(run.path), EVALPUSH_RUNS__FOLLOW_BATCH_SECONDS="1")
        run.write(lines[5:])
        finished_on_platform(local_platform, run)
        assert daemon.stop() == 0

    assert pushed.returncode == 1 and pushed.stdout.startswith("following  "), pushed.stdout
    one_completed_with_every_line(local_platform, run)


def test_a_followed_run_no_running_daemon_watches_any_more_is_pushed(
    local_platform: LocalPlatform, tmp_path: Path
) -> None:
    """Its follower stopped, and the daemon now running on the ledger watches other roots: the
    finished run is nobody's to follow, and a push uploads it, into its one evaluation."""
    environ, run = followed_run(local_platform, tmp_path)
    lines = run.lines(EXPECTED)
    first_lines_followed_then_stopped(local_platform, environ, run, lines)
    run.write(lines[5:])
    other = tmp_path / "other"
    other.mkdir()
    elsewhere = {**environ, "EVALPUSH_WATCH__ROOTS": json.dumps([str(other)])}
    with Daemon(elsewhere) as daemon:  # another process: a daemon row of its own
        daemon.started()
        past_the_last_stretch(environ, run)
        pushed = evalpush(environ, "push", "--json", str(run.path))
        assert daemon.stop() == 0

    assert outcome(pushed) == (0, "success"), pushed.stdout
    one_completed_with_every_line(local_platform, run)


def test_a_push_as_soon_as_a_restarted_daemon_says_it_is_ready_leaves_the_run_to_it(
    local_platform: LocalPlatform, tmp_path: Path
) -> None:
    """`systemctl restart evalpush && evalpush push DIR`: systemd's restart returns at the new
    daemon's READY=1, before its first turn. The push then must already see a running daemon
    following the run's root (the daemon is stopped right at READY=1 to hold that moment): a
    push that finalized the unfinished run was superseded by the daemon's upload of the
    finished run, two COMPLETED."""
    environ, run = followed_run(local_platform, tmp_path)
    lines = run.lines(EXPECTED)
    first_lines_followed_then_stopped(local_platform, environ, run, lines)
    past_the_last_stretch(environ, run)
    with (
        NotifySocket() as notify,
        Daemon({**environ, "NOTIFY_SOCKET": notify.address}) as restarted,
    ):
        notify.wait_for("READY=1")
        restarted.process.send_signal(signal.SIGSTOP)
        # Stopped while its first turn held the ledger's write lock, the daemon must go on
        # for the push's claim to be taken (within the push's 10 s wait for the lock).
        resume = threading.Timer(2.0, restarted.process.send_signal, (signal.SIGCONT,))
        resume.start()
        try:
            pushed = evalpush(environ, "push", "--json", str(run.path))
        finally:
            resume.cancel()
            restarted.process.send_signal(signal.SIGCONT)
        run.write(lines[5:])
        finished_on_platform(local_platform, run)
        assert restarted.stop() == 0

    assert outcome(pushed) == (1, "following"), pushed.stdout
    one_completed_with_every_line(local_platform, run)


def test_a_push_right_after_a_reload_to_follow_no_more_is_not_left_to_the_daemon(
    local_platform: LocalPlatform, tmp_path: Path
) -> None:
    """SIGHUP with `runs.follow = false`: from its READY=1 the daemon's row says it follows no
    root (it said so only at its next heartbeat: a push meanwhile was left to a daemon that no
    longer follows the run, `following` and exit 1). The push uploads the run as it is, into
    the evaluation the daemon opened."""
    config = tmp_path / "evalpush.toml"
    config.write_text("[runs]\nfollow = true\n")
    environ, run = followed_run(local_platform, tmp_path)
    with (
        NotifySocket() as notify,
        Daemon({**environ, "NOTIFY_SOCKET": notify.address}, "--config", str(config)) as daemon,
    ):
        notify.wait_for("READY=1")
        run.write(run.lines(5))
        first_lines_followed(local_platform, run, 5)
        past_the_last_stretch(environ, run)
        config.write_text("[runs]\nfollow = false\n")
        daemon.signal(signal.SIGHUP)
        notify.wait_for("RELOADING=1")
        notify.wait_for("READY=1")
        pushed = evalpush(environ, "push", "--json", str(run.path))
        assert daemon.stop() == 0

    assert outcome(pushed) == (4, "partial"), pushed.stdout
    (final,) = evaluations_of(local_platform, run.run_id).values()
    assert (final["status"], final["sample_count"], final["finalize_count"]) == ("COMPLETED", 5, 1)


def test_a_push_on_a_fleet_host_that_mounts_the_tree_elsewhere_leaves_the_run_to_its_daemon(
    local_platform: LocalPlatform, tmp_path: Path
) -> None:
    """A fleet mounts the shared tree wherever suits each host: the run's row names it where the
    host whose daemon last wrote it sees it (`/mnt/evals/...`), and this host's daemon follows
    it here. A push on this host, the eval slow to write its next line, must leave the run to
    that daemon, not take the row's other path for the run moved out of the tree (it finalized
    the unfinished run short: two COMPLETED once the run was uploaded finished)."""
    environ, run = followed_run(local_platform, tmp_path)
    lines = run.lines(EXPECTED)
    with InProcessDaemon(environ) as daemon:
        daemon.started()
        run.write(lines[:5])
        first_lines_followed(local_platform, run, 5)
        elsewhere = b"/mnt/evals/outputs/" + bytes(run.path.relative_to(tmp_path / "outputs"))
        with contextlib.closing(
            sqlite3.connect(Path(environ["EVALPUSH_STATE_DIR"]) / "state.db")
        ) as db:  # as another host's daemon writes the row, the tree mounted there
            db.execute(
                "UPDATE runs SET path = ?, path_raw = ?, path_key = ? WHERE run_id = ?",
                (elsewhere.decode(), elsewhere, hashlib.sha256(elsewhere).digest(), run.run_id),
            )
            db.commit()
        past_the_last_stretch(environ, run)
        pushed = evalpush(environ, "push", "--json", str(run.path))
        run.write(lines[5:])
        finished_on_platform(local_platform, run)
        assert daemon.stop() == 0

    assert outcome(pushed) == (1, "following"), pushed.stdout
    one_completed_with_every_line(local_platform, run)
