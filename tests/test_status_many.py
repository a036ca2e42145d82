"""`status` for an operator with many runs, through the real CLI and a real daemon: whether a
daemon runs (and which one ran last), its view inside `status --json` (read from its heartbeat
row in the ledger), `--state` and `--limit`, a table that fits 120 columns, runs paused by an
outage or a refused key, and `retry --all-failed`."""

from __future__ import annotations

import json
import re
from pathlib import Path

from daemon_support import Daemon, RunDir, daemon_environ, wait_until
from evalpush.ledger import Ledger, default_path
from evalpush.local_platform import LocalPlatform
from support.commands import evalpush
from support.runs import config_toml, write_run

OUTAGE_SECONDS = 10
DEEP = "a-very-long-directory-name-that-an-eval-harness-might-well-choose" * 2


def test_status_says_the_daemon_runs_then_that_it_stopped_or_vanished_with_its_pid(
    local_platform: LocalPlatform, tmp_path: Path
) -> None:
    tree = tmp_path / "outputs"
    environ = daemon_environ(local_platform, tmp_path, [tree])
    evalpush(environ, "push", str(write_run(tmp_path / "pushed")))  # a ledger, no daemon yet
    never = evalpush(environ, "status")

    with Daemon(environ) as daemon:
        daemon.started()
        running = wait_until(
            lambda: (
                (
                    d := json.loads(evalpush(environ, "status", "--daemon", "--json").stdout)[
                        "daemon"
                    ]
                )["running"]
                and d
            ),
            "status --json to show the running daemon",
        )
        assert daemon.stop() == 0
    stopped = evalpush(environ, "status").stdout
    stopped_json = json.loads(evalpush(environ, "status", "--daemon", "--json").stdout)["daemon"]

    with Daemon(environ) as killed:
        killed.started()
        wait_until(
            lambda: json.loads(evalpush(environ, "status", "--daemon", "--json").stdout)["daemon"][
                "running"
            ],
            "the second daemon to write its view",
        )
        killed.kill()
    vanished = evalpush(environ, "status").stdout

    assert "daemon:     not running (none has run on this state directory)" in never.stdout
    assert running["pid"] == daemon.pid and running["gate"]["mode"] == "open"
    assert re.search(
        rf"^daemon:     not running \(last seen pid {daemon.pid} at .*; stopped\)$", stopped, re.M
    )
    assert stopped_json["running"] is False and stopped_json["last_seen"]["pid"] == daemon.pid
    assert stopped_json["last_seen"]["stopped"] is True
    assert re.search(
        rf"^daemon:     not running \(last seen pid {killed.pid} at .*; gone without stopping",
        vanished,
        re.M,
    ), vanished


def test_state_and_limit_filter_and_the_table_fits_120_columns_with_long_paths(
    local_platform: LocalPlatform, tmp_path: Path
) -> None:
    outputs = tmp_path / "outputs" / DEEP
    for n in range(6):
        write_run(outputs, run_id=f"{n}{n}{n}{n}{n}{n}{n}{n}-1111-4111-8111-111111111111")
    broken = write_run(outputs, run_id="99999999-9999-4999-8999-999999999999")
    (broken / "config.toml").write_text('model = "org/model"\n')  # no environment name
    environ = daemon_environ(local_platform, tmp_path, [tmp_path / "outputs"])
    evalpush(environ, "push", str(tmp_path / "outputs"))

    table = evalpush(environ, "status").stdout
    failed = evalpush(environ, "status", "--state", "failed").stdout
    limited = json.loads(evalpush(environ, "status", "--limit", "2", "--json").stdout)
    both = evalpush(environ, "status", "--state", "failed", "--state", "finalized", "--json")

    assert max(len(line) for line in table.splitlines() if not line.startswith("ledger:")) <= 120
    assert len([line for line in table.splitlines() if " finalized " in line]) == 6
    assert [line.split()[:2] for line in failed.splitlines()[3:-1]] == [["99999999", "failed"]]
    assert len(limited) == 2
    assert len(json.loads(both.stdout)) == 7
    full = evalpush(environ, "status", "99999999").stdout
    assert str(broken) in full, "the full path is in status RUN"


def test_retry_all_failed_queues_every_failed_run_and_nothing_else(
    local_platform: LocalPlatform, tmp_path: Path
) -> None:
    outputs = tmp_path / "outputs"
    good = write_run(outputs, run_id="11111111-1111-4111-8111-111111111111")
    bad = [
        write_run(outputs, run_id=f"{n}{n}{n}{n}{n}{n}{n}{n}-2222-4222-8222-222222222222")
        for n in range(2, 5)
    ]
    for run in bad:
        (run / "config.toml").write_text('model = "org/model"\n')
    environ = daemon_environ(local_platform, tmp_path, [outputs])
    evalpush(environ, "push", str(outputs))
    for run in bad:
        (run / "config.toml").write_text(config_toml(num_tasks=2))

    done = evalpush(environ, "retry", "--all-failed")
    neither = evalpush(environ, "retry")

    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "3 failed runs queued"
    assert str(good) not in done.stdout
    states = {
        row["run_id"][:8]: row["state"]
        for row in json.loads(evalpush(environ, "status", "--json").stdout)
    }
    assert states == {
        "11111111": "finalized",
        "22222222": "ready",
        "33333333": "ready",
        "44444444": "ready",
    }
    assert neither.returncode == 2 and "RUN or --all-failed" in neither.stderr


def test_runs_paused_by_an_outage_say_so(local_platform: LocalPlatform, tmp_path: Path) -> None:
    tree = tmp_path / "outputs"
    environ = daemon_environ(local_platform, tmp_path, [tree])
    local_platform.inject("refuse", seconds=OUTAGE_SECONDS)
    with Daemon(environ) as daemon:
        daemon.started()
        run = RunDir(tree).config(num_tasks=1)
        run.write(run.lines(2))
        daemon.wait_for("platform unreachable: uploads wait while one probe checks it")
        row = wait_until(
            lambda: (
                (
                    r := {
                        x["run_id"]: x
                        for x in json.loads(evalpush(environ, "status", "--json").stdout)
                    }.get(run.run_id)
                )
                and r.get("paused")
                and r
            ),
            "status to show the run paused",
        )
        text = evalpush(environ, "status").stdout
        daemon.wait_for("run finalized", run=run.run_id, timeout=OUTAGE_SECONDS + 60)
        assert daemon.stop() == 0

    assert row["state"] in ("ready", "uploading")
    assert row["reason"] == "paused: platform unreachable; resumes by itself when it answers"
    assert "paused: platform unreachable" in text
    assert "upload paused" in text or "uploads paused" in text


def test_a_refused_key_reaches_status_through_the_daemons_row_in_the_ledger_file(
    local_platform: LocalPlatform, tmp_path: Path
) -> None:
    """The daemon's gate (the key refused) is in its row of the ledger's `daemons`, which is
    what `status` shows: the state dir holds the ledger and nothing else."""
    tree, state = tmp_path / "outputs", tmp_path / "state"
    environ = daemon_environ(local_platform, tmp_path, [tree], PRIME_API_KEY="not-its-key")
    with Daemon(environ) as daemon:
        daemon.started()
        run = RunDir(tree).config(num_tasks=1)
        run.write(run.lines(2))
        text = wait_until(
            lambda: (lambda t: t if "API key refused for" in t else None)(
                evalpush(environ, "status").stdout
            ),
            "status to show the key refused",
        )
        document = json.loads(evalpush(environ, "status", "--daemon", "--json").stdout)
        with Ledger.for_reading(default_path(state)) as ledger:
            (row,) = ledger.daemons()
        assert daemon.stop() == 0

    assert re.search(
        rf"^daemon:     pid {daemon.pid}: API key refused for \d+s, \d+ att", text, re.M
    )
    assert "paused: API key refused; resumes" in text  # the run, in the table
    assert (row.pid, row.gate.mode, row.gate.runs_waiting) == (daemon.pid, "auth", 1)
    assert "platform auth refused since" in row.status  # its STATUS line, as systemd has it
    assert document["daemon"]["running"] and document["daemon"]["gate"]["mode"] == "auth"
    assert {p.name for p in state.iterdir()} <= {"state.db", "state.db-wal", "state.db-shm"}
