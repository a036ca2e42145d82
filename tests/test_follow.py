"""Following runs while they are written (`runs.follow`), through a real daemon, the local
platform over loopback and run directories written as an eval writes them: the evaluation is made
(RUNNING) once the run has a good line, filled in stretches as lines arrive, and finalized once
the run is finished, with every line once; `status` shows the run `following`; a run whose eval
pushes itself is not followed; `runs.follow = false` uploads only finished runs."""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import sqlite3
import time
from pathlib import Path

import httpx
import pytest

from daemon_support import (
    WAIT_SECONDS,
    Daemon,
    InProcessDaemon,
    RunDir,
    daemon_environ,
    evaluations_of,
    status,
    wait_until,
)
from evalpush.local_platform import LocalPlatform
from evalpush.runs import load_run
from evalpush.upload import CRASH_ENV
from support.commands import evalpush
from support.platform_view import requests
from support.postgres import PASSWORD

EXPECTED = 20  # num_tasks 10 x 2 rollouts


def followed_environ(platform: LocalPlatform, tmp_path: Path, tree: Path, **extra: str) -> dict:
    """A daemon that follows with a one-second batch period; a run is finished by its count.
    What it reconciles it reads half a second after the write it settles (loopback: no write
    lands later)."""
    settings = {
        "EVALPUSH_RUNS__FOLLOW_BATCH_SECONDS": "1",
        "EVALPUSH_PLATFORM__LATE_WRITE_SECONDS": "0.5",
        "EVALPUSH_RUNS__SETTLE_SECONDS": "30",
        "EVALPUSH_UPLOAD__MAX_BATCH_SAMPLES": "1000",
        **extra,
    }
    return daemon_environ(platform, tmp_path, [tree], **settings)


def followed_run(
    platform: LocalPlatform, tmp_path: Path, *, traces: int = EXPECTED, **extra: str
) -> tuple[dict, RunDir]:
    """The environment of a daemon following a new tree (`followed_environ`), and a run
    directory in it expecting `traces` lines."""
    tree = tmp_path / "outputs"
    environ = followed_environ(platform, tmp_path, tree, **extra)
    return environ, RunDir(tree / "gsm8k--org--model").config(num_tasks=traces // 2)


def only_evaluation(platform: LocalPlatform, run_id: str) -> dict:
    (evaluation,) = evaluations_of(platform, run_id).values()
    return evaluation


def first_lines_followed(platform: LocalPlatform, run: RunDir, count: int) -> None:
    """Wait until the run's one evaluation holds its first `count` lines."""
    wait_until(
        lambda: (
            evaluations_of(platform, run.run_id)
            and only_evaluation(platform, run.run_id)["sample_count"] == count
        ),
        "the first lines on the platform",
    )


def first_lines_followed_then_stopped(
    platform: LocalPlatform,
    environ: dict,
    run: RunDir,
    lines: list[bytes],
    kind: type[InProcessDaemon] | type[Daemon] = InProcessDaemon,
) -> None:
    """A daemon (in this process, or `kind`) follows the run's first five lines onto the
    platform, then stops as asked."""
    with kind(environ) as daemon:
        daemon.started()
        run.write(lines[:5])
        first_lines_followed(platform, run, 5)
        assert daemon.stop() == 0


def test_a_run_is_on_the_platform_while_it_is_written_and_finalized_once_with_every_line(
    local_platform: LocalPlatform, tmp_path: Path
) -> None:
    environ, run = followed_run(local_platform, tmp_path)
    lines = run.lines(EXPECTED)
    with InProcessDaemon(environ) as daemon:
        daemon.started()
        run.write(lines[:5])
        first_lines_followed(local_platform, run, 5)
        running = only_evaluation(local_platform, run.run_id)
        followed = status(environ)[run.run_id]
        listed = evalpush(environ, "status", "--json", "--state", "following")

        run.write(lines[5:12])
        wait_until(
            lambda: only_evaluation(local_platform, run.run_id)["sample_count"] == 12,
            "the next lines on the platform",
        )
        still_running = only_evaluation(local_platform, run.run_id)["status"]

        run.write(lines[12:])  # the last expected line: the run is finished
        daemon.wait_for("run finalized", run=run.run_id)
        assert daemon.stop() == 0

    assert running["status"] == "RUNNING" and still_running == "RUNNING"
    assert followed["state"] == "following" and followed["samples_sent"] == 5
    assert "last batch" in followed["reason"]
    assert [row["run_id"] for row in json.loads(listed.stdout)] == [run.run_id]
    (key,) = evaluations_of(local_platform, run.run_id)
    final = only_evaluation(local_platform, run.run_id)
    assert final["status"] == "COMPLETED"
    assert (final["sample_count"], final["distinct_sample_ids"]) == (EXPECTED, EXPECTED)
    assert final["finalize_count"] == 1 and requests(local_platform, "create") == 1
    provenance = final["metadata"]["evalpush"]  # created with the first 5 lines' counts
    assert (provenance["seen_traces"], provenance["complete"]) == (EXPECTED, True)
    assert running["metadata"]["evalpush"]["seen_traces"] == 5
    row = status(environ)[run.run_id]
    assert (row["state"], row["samples_sent"], row["evaluation_id"]) == ("finalized", EXPECTED, key)


@pytest.mark.parametrize(
    ("why", "push", "settings"),
    [
        ("its eval pushes itself", True, {}),
        ("runs.follow = false", False, {"EVALPUSH_RUNS__FOLLOW": "false"}),
        # `hold` sends nothing of a run before every line was checked
        ("bad lines held for a person", False, {"EVALPUSH_CONVERT__ON_BAD_LINE": "hold"}),
    ],
)
def test_a_run_not_followed_is_uploaded_only_once_it_is_finished(
    local_platform: LocalPlatform, tmp_path: Path, why: str, push: bool, settings: dict
) -> None:
    environ, run = followed_run(local_platform, tmp_path, **settings)
    config = run.path / "config.toml"
    config.write_text(config.read_text().replace("push = false", f"push = {str(push).lower()}"))
    with InProcessDaemon(environ) as daemon:
        daemon.started()
        run.write(run.lines(5))
        time.sleep(2.0)  # two batch periods: a followed run would have its evaluation
        before_finished = evaluations_of(local_platform, run.run_id)
        shown = status(environ)[run.run_id]["state"]
        run.write(run.lines(EXPECTED - 5, start=5))
        daemon.wait_for("run finalized", run=run.run_id)
        assert daemon.stop() == 0

    assert (before_finished, shown) == ({}, "waiting"), why
    assert only_evaluation(local_platform, run.run_id)["sample_count"] == EXPECTED


# ---------------------------------------------------------------- killed while following

KILLED_AT = [  # a later stretch's batch (its intent and acknowledgement are the protocol's own)
    "create-sent",
    "batch-sent:2",
    "followed:1",
    "finalize-sent",
]


@pytest.mark.parametrize("point", KILLED_AT)
def test_a_daemon_killed_at_each_step_of_a_followed_run_ends_it_exactly_once(
    local_platform: LocalPlatform, tmp_path: Path, point: str
) -> None:
    """`evalpush run` SIGKILLs itself at `point` (the n-th time it passes it) while the eval
    writes the run in bursts; a new daemon takes the run over from the ledger. The platform ends
    with one evaluation, every line once, finalized once."""
    environ, run = followed_run(local_platform, tmp_path)
    lines = run.lines(EXPECTED)
    written = 0
    with Daemon({**environ, CRASH_ENV: point}) as crashing:
        crashing.started()
        while crashing.process.poll() is None and written < EXPECTED:
            run.write(lines[written : written + 7])  # a stretch each, the third finishes it
            written = min(EXPECTED, written + 7)
            deadline = time.monotonic() + 1.5  # a batch period and a half: a stretch went
            while crashing.process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
        crashing.process.wait(WAIT_SECONDS)
        assert crashing.process.returncode == -signal.SIGKILL, crashing.text()
    with Daemon(environ) as daemon:
        daemon.started()
        run.write(lines[written:])
        daemon.wait_for("run finalized", run=run.run_id)
        assert daemon.stop() == 0

    final = only_evaluation(local_platform, run.run_id)
    assert final["status"] == "COMPLETED"
    assert (final["sample_count"], final["distinct_sample_ids"]) == (EXPECTED, EXPECTED)
    assert final["finalize_count"] == 1 and requests(local_platform, "create") == 1


# ---------------------------------------------------------------- what a followed file may do


def samples_of(platform: LocalPlatform, run_id: str) -> int:
    found = evaluations_of(platform, run_id)
    return sum(e["sample_count"] for e in found.values() if e["status"] == "RUNNING")


def test_a_half_written_last_line_is_not_sent_until_its_newline_arrives(
    local_platform: LocalPlatform, tmp_path: Path
) -> None:
    environ, run = followed_run(local_platform, tmp_path)
    lines = run.lines(EXPECTED)
    with InProcessDaemon(environ) as daemon:
        daemon.started()
        run.write(lines[:3])
        with open(run.traces, "ab") as f:
            f.write(lines[3][:20])  # the eval is writing its fourth line
        wait_until(lambda: samples_of(local_platform, run.run_id) == 3, "three lines sent")
        time.sleep(2.5)  # more than two batch periods
        while_half = samples_of(local_platform, run.run_id)
        with open(run.traces, "ab") as f:
            f.write(lines[3][20:] + b"\n")
        wait_until(lambda: samples_of(local_platform, run.run_id) == 4, "the fourth line sent")
        run.write(lines[4:])
        daemon.wait_for("run finalized", run=run.run_id)
        assert daemon.stop() == 0

    assert while_half == 3
    final = only_evaluation(local_platform, run.run_id)
    assert (final["sample_count"], final["distinct_sample_ids"]) == (EXPECTED, EXPECTED)


def test_a_bad_line_mid_run_is_set_aside_and_the_rest_followed(
    local_platform: LocalPlatform, tmp_path: Path
) -> None:
    environ, run = followed_run(local_platform, tmp_path)
    lines = run.lines(EXPECTED - 1)
    with InProcessDaemon(environ) as daemon:
        daemon.started()
        run.write(lines[:4])
        wait_until(lambda: samples_of(local_platform, run.run_id) == 4, "four lines sent")
        run.write([b'{"id": "broken", "task": '])
        run.write(lines[4:])
        daemon.wait_for("run finalized", run=run.run_id)
        assert daemon.stop() == 0
        row = status(environ)[run.run_id]

    final = only_evaluation(local_platform, run.run_id)
    assert (final["status"], final["sample_count"]) == ("COMPLETED", EXPECTED - 1)
    assert (row["set_aside"], row["missing_traces"]) == (1, 0)


@pytest.mark.parametrize("how", ["rewritten in place", "replaced by a new file"])
def test_a_file_rewritten_while_followed_closes_its_evaluation_and_a_new_one_is_followed(
    local_platform: LocalPlatform, tmp_path: Path, how: str
) -> None:
    """The eval started over into the same directory: what the platform has of the old file is
    closed out (cancelled), and the new file goes to a new evaluation."""
    environ, run = followed_run(local_platform, tmp_path)
    old = run.lines(6)
    new = [line.replace(b'"id":"', b'"id":"again-') for line in run.lines(EXPECTED)]
    assert all(a != b for a, b in zip(old, new, strict=False))
    with InProcessDaemon(environ) as daemon:
        daemon.started()
        run.write(old)
        wait_until(lambda: samples_of(local_platform, run.run_id) == 6, "the old lines sent")
        if how == "rewritten in place":
            with open(run.traces, "r+b") as f:
                f.write(b"\n".join(new[:6]) + b"\n")
        else:
            replacement = run.traces.with_name("traces.jsonl.tmp")
            replacement.write_bytes(b"\n".join(new[:6]) + b"\n")
            replacement.replace(run.traces)
        run.write(new[6:])
        daemon.wait_for("run finalized", run=run.run_id)
        assert daemon.stop() == 0

    by_status = {e["status"]: e for e in evaluations_of(local_platform, run.run_id).values()}
    assert set(by_status) == {"CANCELLED", "COMPLETED"}, by_status
    completed = by_status["COMPLETED"]
    assert (completed["sample_count"], completed["distinct_sample_ids"]) == (EXPECTED, EXPECTED)


def test_a_daemon_killed_in_the_stretch_that_started_over_after_a_rewrite_keeps_following(
    local_platform: LocalPlatform, tmp_path: Path
) -> None:
    """The file replaced mid-run starts the run over inside a stretch; the daemon is killed as
    that stretch creates the new evaluation. The row must still read as followed: taken for a
    finished run's upload, its range fixed at six lines, it was finalized short, and then
    superseded once the eval wrote the rest (two COMPLETED evaluations)."""
    environ, run = followed_run(local_platform, tmp_path)
    old = run.lines(6)
    new = [line.replace(b'"id":"', b'"id":"again-') for line in run.lines(EXPECTED)]
    with Daemon({**environ, CRASH_ENV: "create-sent:2"}) as crashing:
        crashing.started()
        run.write(old)
        wait_until(lambda: samples_of(local_platform, run.run_id) == 6, "the old lines sent")
        replacement = run.traces.with_name("traces.jsonl.tmp")
        replacement.write_bytes(b"\n".join(new[:6]) + b"\n")
        replacement.replace(run.traces)
        crashing.process.wait(WAIT_SECONDS)
        assert crashing.process.returncode == -signal.SIGKILL, crashing.text()
    with Daemon(environ) as daemon:
        daemon.started()
        time.sleep(3.0)  # past a ledger poll: a row taken for finished would be finalized now
        run.write(new[6:])
        daemon.wait_for("run finalized", run=run.run_id)
        assert daemon.stop() == 0

    shapes = sorted(
        (e["status"], e["sample_count"], e["finalize_count"])
        for e in evaluations_of(local_platform, run.run_id).values()
    )
    assert shapes == [("CANCELLED", 6, 0), ("COMPLETED", EXPECTED, 1)], shapes


def test_a_followed_row_without_its_fingerprint_starts_over_instead_of_failing_in_a_loop(
    local_platform: LocalPlatform, tmp_path: Path
) -> None:
    """A followed run's row found at its push step with its evaluation and acknowledgements but
    no fingerprint (what a deferred ledger write dropped by another thread's refused write
    left, before deferred writes were tied to their claim; a ledger an earlier build wrote may
    hold one): nothing says which bytes were sent, so its evaluation is closed out and the run
    starts over. Each of its uploads failed on an assertion, and the daemons tried it again
    every few seconds."""
    environ, run = followed_run(local_platform, tmp_path)
    lines = run.lines(EXPECTED)
    first_lines_followed_then_stopped(local_platform, environ, run, lines, kind=Daemon)
    lost = ("file_device", "file_inode", "file_size", "file_mtime_ns", "file_ctime_ns")
    with contextlib.closing(
        sqlite3.connect(Path(environ["EVALPUSH_STATE_DIR"]) / "state.db")
    ) as db:
        changed = db.execute(
            "UPDATE runs SET upload_end = NULL, file_digest = NULL, totals = NULL, "
            + ", ".join(f"{column} = NULL" for column in lost)
            + " WHERE run_id = ? AND step = 'push' AND following = 1",
            (run.run_id,),
        ).rowcount
        db.commit()
    assert changed == 1
    with Daemon(environ) as daemon:
        daemon.started()
        run.write(lines[5:])
        daemon.wait_for("run finalized", run=run.run_id)
        assert daemon.stop() == 0
        said = daemon.text()

    assert "upload failed unexpectedly" not in said
    assert "no fingerprint of the run's file" in said
    shapes = sorted(
        (e["status"], e["sample_count"], e["finalize_count"])
        for e in evaluations_of(local_platform, run.run_id).values()
    )
    assert shapes == [("CANCELLED", 5, 0), ("COMPLETED", EXPECTED, 1)], shapes


def test_a_followed_run_short_of_its_expected_traces_is_held_with_its_evaluation_open(
    local_platform: LocalPlatform, tmp_path: Path
) -> None:
    tree = tmp_path / "outputs"
    environ = followed_environ(
        local_platform,
        tmp_path,
        tree,
        EVALPUSH_RUNS__SETTLE_SECONDS="5",
        EVALPUSH_RUNS__ON_INCOMPLETE="hold",
    )
    run = RunDir(tree / "gsm8k--org--model").config(num_tasks=EXPECTED // 2)
    with InProcessDaemon(environ) as daemon:
        daemon.started()
        run.write(run.lines(7))  # the eval died after seven
        wait_until(lambda: samples_of(local_platform, run.run_id) == 7, "seven lines sent")
        wait_until(lambda: status(environ)[run.run_id]["state"] == "held", "the run held")
        assert daemon.stop() == 0
        row = status(environ)[run.run_id]

    evaluation = only_evaluation(local_platform, run.run_id)
    assert (evaluation["status"], evaluation["sample_count"]) == ("RUNNING", 7)
    assert "7 of 20 expected traces" in row["reason"]


def test_an_outage_while_followed_loses_nothing_and_sends_nothing_twice(
    local_platform: LocalPlatform, tmp_path: Path
) -> None:
    """The platform refuses connections for a while, then a samples answer is lost (the batch
    stored, the connection reset): the eval keeps writing; the file is the queue, and what the
    platform missed goes once it answers, each line once."""
    environ, run = followed_run(local_platform, tmp_path)
    lines = run.lines(EXPECTED)
    with InProcessDaemon(environ) as daemon:
        daemon.started()
        run.write(lines[:4])
        wait_until(lambda: samples_of(local_platform, run.run_id) == 4, "four lines sent")
        local_platform.inject("reset", on="samples", count=1)
        local_platform.inject("refuse", seconds=4.0)
        run.write(lines[4:10], pause=0.3)
        time.sleep(1.0)
        during = samples_of(local_platform, run.run_id)
        run.write(lines[10:], pause=0.1)
        daemon.wait_for("run finalized", run=run.run_id)
        assert daemon.stop() == 0

    assert during == 4, "nothing reached the platform while it refused connections"
    final = only_evaluation(local_platform, run.run_id)
    assert final["status"] == "COMPLETED" and final["duplicates"] == 0
    assert (final["sample_count"], final["distinct_sample_ids"]) == (EXPECTED, EXPECTED)
    assert final["finalize_count"] == 1


def test_two_daemons_sharing_a_ledger_follow_a_run_once_and_one_goes_on_when_the_other_dies(
    pg_url: str, local_platform: LocalPlatform, tmp_path: Path
) -> None:
    """Both daemons see the run; one follows it at a time. One is SIGKILLed mid-run (whichever
    it is); the run still ends in one evaluation, every line once, finalized once."""
    tree = tmp_path / "outputs"
    password = tmp_path / "ledger-password"
    password.write_text(PASSWORD)
    environs = [
        followed_environ(
            local_platform,
            tmp_path,
            tree,
            EVALPUSH_STATE_DIR=str(tmp_path / f"state-{name}"),
            EVALPUSH_LEDGER__URL=pg_url,
            EVALPUSH_LEDGER__PASSWORD_FILE=str(password),
        )
        for name in ("a", "b")
    ]
    run = RunDir(tree / "gsm8k--org--model").config(num_tasks=EXPECTED // 2)
    lines = run.lines(EXPECTED)
    with Daemon(environs[0]) as a, Daemon(environs[1]) as b:
        a.started()
        b.started()
        run.write(lines[:8], pause=0.1)
        wait_until(lambda: samples_of(local_platform, run.run_id) == 8, "eight lines sent")
        a.kill()
        for first in range(8, EXPECTED, 4):
            run.write(lines[first : first + 4])
            time.sleep(0.7)
        b.wait_for("run finalized", run=run.run_id)
        assert b.stop() == 0

    final = only_evaluation(local_platform, run.run_id)
    assert final["status"] == "COMPLETED" and final["duplicates"] == 0
    assert (final["sample_count"], final["distinct_sample_ids"]) == (EXPECTED, EXPECTED)
    assert final["finalize_count"] == 1 and requests(local_platform, "create") == 1


def test_a_daemon_stopped_while_following_goes_on_where_it_was_after_a_restart(
    local_platform: LocalPlatform, tmp_path: Path
) -> None:
    environ, run = followed_run(local_platform, tmp_path)
    lines = run.lines(EXPECTED)
    with Daemon(environ) as first:
        first.started()
        run.write(lines[:6], pause=0.1)
        wait_until(lambda: samples_of(local_platform, run.run_id) == 6, "six lines sent")
        run.write(lines[6:9])
        assert first.stop() == 0  # SIGTERM, with lines not sent yet
    stopped = status(environ)[run.run_id]
    run.write(lines[9:14])  # the eval goes on while no daemon runs
    with Daemon(environ) as second:
        second.started()
        wait_until(lambda: samples_of(local_platform, run.run_id) == 14, "what was written sent")
        run.write(lines[14:])
        second.wait_for("run finalized", run=run.run_id)
        assert second.stop() == 0

    assert stopped["state"] == "following"
    final = only_evaluation(local_platform, run.run_id)
    assert (final["sample_count"], final["distinct_sample_ids"]) == (EXPECTED, EXPECTED)
    assert final["finalize_count"] == 1 and requests(local_platform, "create") == 1


@pytest.mark.parametrize(
    ("case", "pushes_itself"),
    [
        ("0.2.1/runs/traces_v2", False),  # written with `push = false`
        ("0.3.1/runs/episodes_v3", True),  # pushed at its end
        ("0.4.0/runs/episodes_v4_online", True),  # streamed by prime-runs while it ran
        ("0.4.0/runs/episodes_v4_offline", False),  # ran offline: a `disabled-` run id
    ],
)
def test_which_producers_runs_push_themselves_and_are_not_followed(
    case: str, pushes_itself: bool
) -> None:
    """Read from the runs each producer wrote (tests/fixtures/producers)."""
    (directory,) = (Path(__file__).parent / "fixtures" / "producers" / case).iterdir()
    assert load_run(directory).pushes_itself is pushes_itself


def test_a_followed_run_whose_directory_is_deleted_is_no_longer_followed_and_said_so(
    local_platform: LocalPlatform, tmp_path: Path
) -> None:
    environ, run = followed_run(local_platform, tmp_path)
    with InProcessDaemon(environ) as daemon:
        daemon.started()
        run.write(run.lines(5))
        wait_until(lambda: samples_of(local_platform, run.run_id) == 5, "five lines sent")
        shutil.rmtree(run.path)
        gone = daemon.wait_for(
            "followed run gone from its directory: no longer followed; its evaluation stays "
            "open with the samples sent so far",
            run=run.run_id,
        )
        assert daemon.stop() == 0

    assert gone["level"] == "warning"
    evaluation = only_evaluation(local_platform, run.run_id)
    assert (evaluation["status"], evaluation["sample_count"]) == ("RUNNING", 5)


def test_a_followed_file_rewritten_between_its_windows_is_not_finalized_with_the_old_bytes(
    local_platform: LocalPlatform, tmp_path: Path
) -> None:
    """A file longer than its two 4 KiB windows, one line between them rewritten in place (the
    same length, another id) while one process follows it: the windows cannot see it, so the
    run's end hashes the file again; the evaluation of the old bytes is closed out and the
    file's every line goes to a new one."""
    count = 100  # about 24 KiB
    environ, run = followed_run(local_platform, tmp_path, traces=count)
    lines = run.lines(count)
    with InProcessDaemon(environ) as daemon:
        daemon.started()
        run.write(lines[:60])
        wait_until(lambda: samples_of(local_platform, run.run_id) == 60, "60 lines sent")
        old = lines[30]
        new = old.replace(b'"id":"trace-30"', b'"id":"trace-X0"')
        assert new != old and len(new) == len(old)
        with open(run.traces, "r+b") as f:
            f.seek(run.traces.read_bytes().index(old))
            f.write(new)
        run.write(lines[60:])
        daemon.wait_for("run finalized", run=run.run_id)
        assert daemon.stop() == 0

    by_status = {e["status"]: k for k, e in evaluations_of(local_platform, run.run_id).items()}
    assert set(by_status) == {"CANCELLED", "COMPLETED"}, by_status
    final = evaluations_of(local_platform, run.run_id)[by_status["COMPLETED"]]
    assert (final["sample_count"], final["distinct_sample_ids"]) == (count, count)
    url = f"{local_platform.base_url}/_control/evaluations/{by_status['COMPLETED']}/samples"
    key = local_platform.api_key
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    ids = {sample["sample_id"] for sample in httpx.get(url, headers=headers).json()["samples"]}
    assert "trace-X0" in ids and "trace-30" not in ids


def test_a_followed_run_whose_directory_is_moved_mid_run_is_followed_on_from_its_new_path(
    local_platform: LocalPlatform, tmp_path: Path
) -> None:
    """The run's directory moved while the eval writes it (the eval keeps its file open, so
    its lines go on into the moved file): it is not a finished run, so it is followed on from
    its new path into the same evaluation, finalized once with every line; never finalized
    short and then superseded by a second evaluation."""
    environ, run = followed_run(local_platform, tmp_path)
    lines = run.lines(EXPECTED)
    with InProcessDaemon(environ) as daemon:
        daemon.started()
        run.write(lines[:5])
        wait_until(lambda: samples_of(local_platform, run.run_id) == 5, "five lines sent")
        with open(run.traces, "ab") as producer:  # the eval's open file
            target = run.path.parent.parent / "elsewhere" / run.run_id
            target.parent.mkdir()
            run.path.rename(target)
            time.sleep(1.5)  # the move seen (inotify), before the eval writes on
            for line in lines[5:]:
                producer.write(line + b"\n")
                producer.flush()
                time.sleep(0.1)
        daemon.wait_for("run finalized", run=run.run_id)
        time.sleep(1.0)  # a second upload would have started by now
        assert daemon.stop() == 0
        row = status(environ)[run.run_id]
        moved = daemon.find("followed run moved: followed on from its new path", run=run.run_id)

    final = only_evaluation(local_platform, run.run_id)
    assert final["status"] == "COMPLETED" and final["duplicates"] == 0
    assert (final["sample_count"], final["distinct_sample_ids"]) == (EXPECTED, EXPECTED)
    assert final["finalize_count"] == 1 and requests(local_platform, "create") == 1
    assert (row["state"], row["path"]) == ("finalized", str(target)) and moved


def test_a_followed_file_replaced_by_a_shorter_one_is_followed_before_it_outgrows_the_old(
    local_platform: LocalPlatform, tmp_path: Path
) -> None:
    """A resumed eval's new file, shorter than what the platform holds of the old one: its
    lines are followed (the old evaluation closed out, a new one filled) within batch periods,
    not only once the new file outgrows the old one's acknowledged end."""
    environ, run = followed_run(local_platform, tmp_path)
    old = run.lines(8)
    new = [line.replace(b'"id":"', b'"id":"again-') for line in run.lines(EXPECTED)]
    with InProcessDaemon(environ) as daemon:
        daemon.started()
        run.write(old)
        wait_until(lambda: samples_of(local_platform, run.run_id) == 8, "the old lines sent")
        replacement = run.traces.with_name("traces.jsonl.tmp")
        replacement.write_bytes(b"\n".join(new[:3]) + b"\n")
        replacement.replace(run.traces)
        wait_until(
            lambda: samples_of(local_platform, run.run_id) == 3, "the new file's lines", timeout=10
        )
        run.write(new[3:])
        daemon.wait_for("run finalized", run=run.run_id)
        assert daemon.stop() == 0

    by_status = {e["status"]: e for e in evaluations_of(local_platform, run.run_id).values()}
    assert set(by_status) == {"CANCELLED", "COMPLETED"}, by_status
    completed = by_status["COMPLETED"]
    assert (completed["sample_count"], completed["distinct_sample_ids"]) == (EXPECTED, EXPECTED)


def test_a_push_of_a_run_a_daemon_follows_leaves_it_to_the_daemon(
    local_platform: LocalPlatform, tmp_path: Path
) -> None:
    """A person's `push` of a run a live daemon follows would finalize it short, and the daemon
    would then supersede that with a second evaluation: it is left to the daemon instead (its
    last batch less than a batch period old), said, and the daemon finalizes it once."""
    # A batch as soon as a kilobyte waits, and a period long enough for the push to meet it.
    environ, run = followed_run(
        local_platform,
        tmp_path,
        EVALPUSH_RUNS__FOLLOW_BATCH_SECONDS="20",
        EVALPUSH_UPLOAD__MAX_BATCH_BYTES="1024",
    )
    lines = run.lines(EXPECTED)
    with InProcessDaemon(environ) as daemon:
        daemon.started()
        run.write(lines[:5])
        first_lines_followed(local_platform, run, 5)
        pushed = evalpush(environ, "push", str(run.path))
        as_json = evalpush(environ, "push", "--json", str(run.path))
        during = only_evaluation(local_platform, run.run_id)

        run.write(lines[5:])
        daemon.wait_for("run finalized", run=run.run_id)
        assert daemon.stop() == 0

    assert pushed.returncode == 1, pushed.stdout + pushed.stderr
    assert pushed.stdout.startswith("following  "), pushed.stdout
    assert "a daemon uploads it while it is written (5 samples so far)" in pushed.stdout
    (result,) = json.loads(as_json.stdout)["results"]
    assert (result["status"], result["state"], result["samples_sent"]) == (
        "following",
        "waiting",
        5,
    )
    assert (during["status"], during["finalize_count"]) == ("RUNNING", 0)
    final = only_evaluation(local_platform, run.run_id)  # the one evaluation
    assert (final["status"], final["sample_count"], final["finalize_count"]) == (
        "COMPLETED",
        EXPECTED,
        1,
    )
    assert requests(local_platform, "create") == 1
