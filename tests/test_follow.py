"""Following runs while they are written (`runs.follow`), through a real daemon, the local
platform over loopback and run directories written as an eval writes them: the evaluation is made
(RUNNING) once the run has a good line, filled in stretches as lines arrive, and finalized once
the run is finished, with every line once; `status` shows the run `following`; a run whose eval
pushes itself is not followed; `runs.follow = false` uploads only finished runs."""

from __future__ import annotations

import time
from pathlib import Path

from daemon_support import (
    InProcessDaemon,
    RunDir,
    daemon_environ,
    evaluations_of,
    status,
    wait_until,
)
from evalpush.local_platform import LocalPlatform
from support.platform_view import requests

EXPECTED = 20  # num_tasks 10 x 2 rollouts


def followed_environ(platform: LocalPlatform, tmp_path: Path, tree: Path, **extra: str) -> dict:
    """A daemon that follows with a one-second batch period; a run is finished by its count."""
    settings = {
        "EVALPUSH_RUNS__FOLLOW_BATCH_SECONDS": "1",
        "EVALPUSH_RUNS__SETTLE_SECONDS": "30",
        "EVALPUSH_UPLOAD__MAX_BATCH_SAMPLES": "1000",
        **extra,
    }
    return daemon_environ(platform, tmp_path, [tree], **settings)


def only_evaluation(platform: LocalPlatform, run_id: str) -> dict:
    (evaluation,) = evaluations_of(platform, run_id).values()
    return evaluation


def test_a_run_is_on_the_platform_while_it_is_written_and_finalized_once_with_every_line(
    local_platform: LocalPlatform, tmp_path: Path
) -> None:
    tree = tmp_path / "outputs"
    environ = followed_environ(local_platform, tmp_path, tree)
    run = RunDir(tree / "gsm8k--org--model").config(num_tasks=EXPECTED // 2)
    lines = run.lines(EXPECTED)
    with InProcessDaemon(environ) as daemon:
        daemon.started()
        run.write(lines[:5])
        wait_until(
            lambda: evaluations_of(local_platform, run.run_id)
            and only_evaluation(local_platform, run.run_id)["sample_count"] == 5,
            "the first lines on the platform while the run is written",
        )
        running = only_evaluation(local_platform, run.run_id)
        followed = status(environ)[run.run_id]

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
    (key,) = evaluations_of(local_platform, run.run_id)
    final = only_evaluation(local_platform, run.run_id)
    assert final["status"] == "COMPLETED"
    assert (final["sample_count"], final["distinct_sample_ids"]) == (EXPECTED, EXPECTED)
    assert final["finalize_count"] == 1 and requests(local_platform, "create") == 1
    row = status(environ)[run.run_id]
    assert (row["state"], row["samples_sent"], row["evaluation_id"]) == ("finalized", EXPECTED, key)


def test_a_run_whose_eval_pushes_itself_is_not_followed(
    local_platform: LocalPlatform, tmp_path: Path
) -> None:
    tree = tmp_path / "outputs"
    environ = followed_environ(local_platform, tmp_path, tree)
    pushed = RunDir(tree / "gsm8k--org--model").config(num_tasks=EXPECTED // 2, extra="")
    config = pushed.path / "config.toml"
    config.write_text(config.read_text().replace("push = false", "push = true"))
    with InProcessDaemon(environ) as daemon:
        daemon.started()
        pushed.write(pushed.lines(5))
        time.sleep(3.0)  # three batch periods: a followed run would have its evaluation
        before_finished = evaluations_of(local_platform, pushed.run_id)
        pushed.write(pushed.lines(EXPECTED - 5, start=5))
        daemon.wait_for("run finalized", run=pushed.run_id)
        assert daemon.stop() == 0

    assert before_finished == {}
    assert only_evaluation(local_platform, pushed.run_id)["sample_count"] == EXPECTED


def test_follow_off_uploads_a_run_only_once_it_is_finished(
    local_platform: LocalPlatform, tmp_path: Path
) -> None:
    tree = tmp_path / "outputs"
    environ = followed_environ(local_platform, tmp_path, tree, EVALPUSH_RUNS__FOLLOW="false")
    run = RunDir(tree / "gsm8k--org--model").config(num_tasks=EXPECTED // 2)
    with InProcessDaemon(environ) as daemon:
        daemon.started()
        run.write(run.lines(5))
        time.sleep(3.0)
        before_finished = evaluations_of(local_platform, run.run_id)
        waiting = status(environ)[run.run_id]["state"]
        run.write(run.lines(EXPECTED - 5, start=5))
        daemon.wait_for("run finalized", run=run.run_id)
        assert daemon.stop() == 0

    assert before_finished == {} and waiting == "waiting"
    assert only_evaluation(local_platform, run.run_id)["sample_count"] == EXPECTED
