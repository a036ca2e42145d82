"""`push` and the daemon come to the same outcome for the same run: each test runs one case
through both entry points (`evalpush push` and `evalpush run`, real subprocesses, the local
platform over loopback) and checks what the ledger, the platform and `status` show afterwards:
a partial run, a run held by `runs.on_incomplete = "hold"`, and a directory holding another
run's id."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from daemon_support import Daemon, RunDir, daemon_environ, evaluations_of, status, wait_until
from evalpush.local_platform import LocalPlatform
from support.commands import evalpush

EXPECTED = 8  # num_tasks 4 x 2 rollouts
WRITTEN = 5  # the eval crashed after these

ENTRY_POINTS = ["push", "daemon"]


def short_run(tree: Path, *, run_id: str | None = None) -> RunDir:
    run = RunDir(tree, run_id=run_id).config(num_tasks=EXPECTED // 2)
    run.write(run.lines(WRITTEN))
    return run


def through(entry: str, environ: dict[str, str], run: RunDir, until: Any) -> None:
    """Take `run` through `entry`: `push RUN` (its exit code checked against what the case
    expects), or a daemon watching the tree until `until(daemon)` has seen the outcome."""
    if entry == "push":
        done = evalpush(environ, "push", str(run.path))
        assert done.returncode == until.push_exit, (done.stdout, done.stderr)
        until.pushed(done)
    else:
        with Daemon(environ) as daemon:
            daemon.started()
            until(daemon)
            assert daemon.stop() == 0
            assert not daemon.find("upload failed unexpectedly"), daemon.text()


class Partial:
    push_exit = 4

    def __init__(self, run: RunDir) -> None:
        self.run = run

    def __call__(self, daemon: Daemon) -> None:
        daemon.wait_for("run finalized", run=self.run.run_id)

    def pushed(self, done: Any) -> None:
        missing = EXPECTED - WRITTEN
        assert f"{WRITTEN}/{EXPECTED} samples (PARTIAL: {missing} expected traces missing)" in (
            done.stdout
        )


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_a_run_short_of_its_expected_traces_is_uploaded_and_shown_partial_by_both(
    entry: str, local_platform: LocalPlatform, tmp_path: Path
) -> None:
    tree = tmp_path / "outputs"
    environ = daemon_environ(local_platform, tmp_path, [tree])
    run = short_run(tree)

    through(entry, environ, run, Partial(run))

    row = status(environ)[run.run_id]
    (evaluation,) = evaluations_of(local_platform, run.run_id).values()
    table = evalpush(environ, "status").stdout
    detail = evalpush(environ, "status", run.run_id[:8]).stdout
    assert (row["state"], row["samples_sent"]) == ("finalized", WRITTEN)
    assert (row["expected_traces"], row["missing_traces"]) == (EXPECTED, EXPECTED - WRITTEN)
    assert evaluation["status"] == "COMPLETED" and evaluation["sample_count"] == WRITTEN
    assert evaluation["metadata"]["evalpush"]["complete"] is False
    assert f"{WRITTEN}/{EXPECTED} partial" in table
    assert f"PARTIAL: {EXPECTED - WRITTEN} of {EXPECTED} expected traces missing" in table
    assert f"expected:   {EXPECTED} traces" in detail
    assert f"PARTIAL:    {EXPECTED - WRITTEN} of {EXPECTED} expected traces missing" in detail


class Held:
    push_exit = 1

    def __init__(self, run: RunDir, environ: dict[str, str]) -> None:
        self.run, self.environ = run, environ

    def __call__(self, daemon: Daemon) -> None:
        daemon.wait_for("run finished short of its expected traces: held for a person")
        wait_until(lambda: status(self.environ)[self.run.run_id]["state"] == "held", "the run held")

    def pushed(self, done: Any) -> None:
        assert done.stdout.startswith("held"), done.stdout


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_on_incomplete_hold_holds_a_short_run_in_both(
    entry: str, local_platform: LocalPlatform, tmp_path: Path
) -> None:
    tree = tmp_path / "outputs"
    environ = daemon_environ(local_platform, tmp_path, [tree], EVALPUSH_RUNS__ON_INCOMPLETE="hold")
    run = short_run(tree)

    through(entry, environ, run, Held(run, environ))

    row = status(environ)[run.run_id]
    assert row["state"] == "held" and row["expected_traces"] == EXPECTED
    assert row["reason"].startswith(f"incomplete: {WRITTEN} of {EXPECTED} expected traces; ")
    assert f"`evalpush retry {run.run_id[:8]}` uploads it as it is" in row["reason"]
    assert evaluations_of(local_platform, run.run_id) == {}
    assert "held" in evalpush(environ, "status").stdout


class Clash:
    push_exit = 1

    def __init__(self, original: RunDir, other: RunDir) -> None:
        self.original, self.other = original, other

    def __call__(self, daemon: Daemon) -> None:
        said = daemon.wait_for("run cannot be uploaded", run=self.other.run_id)
        assert self.message(said["error"])
        # A run found after the clash is uploaded; the clash is not tried (or said) again.
        later = RunDir(self.other.path.parent.parent / "later").config(num_tasks=1)
        later.write(later.lines(2))
        daemon.wait_for("run finalized", run=later.run_id)
        assert len(daemon.find("run cannot be uploaded", run=self.other.run_id)) == 1

    def pushed(self, done: Any) -> None:
        assert done.stdout.startswith("failed"), done.stdout
        assert self.message(done.stdout)

    def message(self, text: str) -> bool:
        return (
            f"{self.other.path}: holds run id {self.other.run_id}, as does the run at "
            f"{self.original.path}, but not the same traces"
            in text
            and "give one of the two directories another name" in text
        )


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_a_directory_holding_another_runs_id_is_one_clear_error_in_both(
    entry: str, local_platform: LocalPlatform, tmp_path: Path
) -> None:
    tree = tmp_path / "outputs"
    environ = daemon_environ(local_platform, tmp_path, [tree])
    original = RunDir(tree / "first").config(num_tasks=2)
    original.write(original.lines(4))
    assert evalpush(environ, "push", str(original.path)).returncode == 0
    other = RunDir(tree / "second", run_id=original.run_id).config(num_tasks=2)
    other.write(original.lines(4, start=10))

    through(entry, environ, other, Clash(original, other))

    rows = status(environ)
    (evaluation,) = evaluations_of(local_platform, original.run_id).values()
    assert rows[original.run_id]["state"] == "finalized"
    assert rows[original.run_id]["path"] == str(original.path), "the run it names is left alone"
    assert evaluation["sample_count"] == 4
