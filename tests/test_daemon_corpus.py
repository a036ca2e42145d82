"""The bad-input corpus through `evalpush run`: each item of the README's bad-input list and of issue
8's file items, written into the watched tree while one real daemon works beside good runs.

One daemon takes every case at once (a module-scoped world: the daemon, a local platform and a
tree): a good run is written, then every bad run, and once the daemon has dealt with those, a
good run after them. Each case then asserts that the daemon is still running and uploaded the
good run written after the bad ones, that the good runs are finalized exactly once, that the bad
run's `evalpush status RUN` (table and `--json`) says what is wrong naming the file, the line or
the key, and, where the input can be fixed, that fixing it (and `evalpush retry` where the run
failed or was held) completes it exactly once. A second world runs with
`convert.on_bad_line = "hold"`: there every bad line holds its run, is fixed in the file, and
`retry` completes the run with every line.

When the tests run as root the daemon runs without CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH
(`setpriv`), so file permissions bind it as they bind the dedicated user systemd runs it as
(as root without `setpriv`, the three permission cases are skipped).

Where each case of the corpus is covered:

| case | where |
| --- | --- |
| bad JSON, not UTF-8, a JSON array or string line, missing `id`, missing `task.idx`, a parent cycle, a parent out of range, nesting too deep, a line over `read.max_line_bytes` | here: `TestBadLines` (set aside) and `TestBadLinesHeld` (held, fixed, retried) |
| NaN, a BOM, CRLF line ends, a repeated id | here: `TestOddButValidLines` |
| an empty `traces.jsonl`, no environment name, a missing `config.toml`, unreadable permissions (trace file, `config.toml`, run directory), a `config.toml` that changes after the run was finalized | here: `TestRunLevel` |
| a run directory deleted mid-upload | here: `TestDeletedMidUpload` (and tests/test_upload.py for the uploader alone) |
| an unparsable `config.toml` (fails once settled, retry completes it), one still being written (half, empty) when the run is found | tests/test_daemon_hostile.py `TestConfigWrittenLate` |
| a file rewritten in place (while waiting, mid-upload, after finalize by `--resume`) | tests/test_daemon_hostile.py `TestFilesChanging` |
| a run directory renamed (waiting, mid-upload), moved in, deleted while waiting, the root deleted | tests/test_daemon_hostile.py `TestFilesChanging` |
| a symlink out of the root (run directory and trace file) | tests/test_daemon_hostile.py `TestOddFiles`; never read: tests/test_security.py |
| a FIFO named `traces.jsonl` | tests/test_daemon_hostile.py `TestOddFiles` |
| a directory name that is not UTF-8 | tests/test_daemon_hostile.py `TestOddFiles` |
| a ledger broken under the daemon / on a full disk | tests/test_daemon_hostile.py `TestLedgerBroken`; tests/test_cli_push.py `TestAfterALedgerError` |
| a config file with unknown keys or wrong types | tests/test_config.py `TestErrors`; on SIGHUP: tests/test_daemon.py `TestSignals` |
| a missing or invalid API key | tests/test_daemon.py `TestCredentials`; tests/test_hostile_push.py `TestTheKeyNeverLeaves` |
| an `http://` base URL to a non-loopback host | tests/test_security.py |
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

from daemon_support import (
    RESCAN_SECONDS,
    RUN_FINALIZED,
    Daemon,
    RunDir,
    completed,
    daemon_environ,
    evaluations_of,
    slow_run,
    status,
    trace_line,
    upload_under_way,
    wait_until,
)
from evalpush.ledger import Ledger, default_path
from evalpush.local_platform import LocalPlatform
from pushing import assert_run_exactly_once, expected
from support import commands

MAX_LINE_BYTES = 4096
"""`read.max_line_bytes` in these worlds: small, so a line over it is cheap to write."""
BAD_LINE_NUMBER = 2
GROUP = "gsm8k--org--model--default"
BATCH_WAIT_SECONDS = 90.0
"""How long a whole corpus may take to reach its states: generous, CI is a loaded 2-core box."""
NO_DAC_OVERRIDE = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]


def _trace(**fields: Any) -> bytes:
    return orjson.dumps({"id": "t-bad", "task": {"idx": 9}, **fields})


def _node(parent: int | None) -> dict[str, Any]:
    return {"parent": parent, "message": {"role": "user", "content": "2+2?"}}


LINE_CASES: dict[str, tuple[bytes, str]] = {
    # case: (the bad line, what its reason must say)
    "bad JSON": (b'{"id": "broken", "task": ', "invalid JSON"),
    "not UTF-8": (b'{"id": "t\xff", "task": {"idx": 9}}', "not UTF-8"),
    "a JSON array": (b"[1, 2, 3]", "array, not a JSON object"),
    "a JSON string": (b'"a trace"', "string, not a JSON object"),
    "no id": (orjson.dumps({"task": {"idx": 9}, "nodes": []}), "missing 'id'"),
    "no task.idx": (orjson.dumps({"id": "t-bad", "task": {}, "nodes": []}), "missing 'task.idx'"),
    "a parent cycle": (_trace(nodes=[_node(1), _node(0)]), "cycle"),
    "a parent out of range": (_trace(nodes=[_node(7)]), "out of range"),
    "nesting too deep": (
        b'{"id": "t-bad", "task": {"idx": 9}, "info": ' + b"[" * 1500 + b"]" * 1500 + b"}",
        "nested too deeply",
    ),
    "a line over read.max_line_bytes": (
        _trace(nodes=[], info={"pad": "x" * MAX_LINE_BYTES}),
        f"longer than read.max_line_bytes ({MAX_LINE_BYTES} bytes)",
    ),
}


TALLY_BLIND = frozenset({"a parent cycle", "a parent out of range"})
"""Bad lines the create's cheap first pass cannot see (it decodes no graph): by design
(docs/ARCHITECTURE.md, upload step 4) the create's metadata counted them, the finalize's metrics
do not, and the daemon says so in one warning."""
TALLIED = ("num_examples", "avg_reward", "avg_metrics", "avg_error")
TALLY_WARNING = (
    "lines the first pass counted were refused by conversion: the finalize metrics leave them "
    "out; the create's metadata counted them"
)


def _with_bad_line(run: RunDir, bad: bytes) -> list[bytes]:
    good = run.lines(3)
    return [good[0], bad, *good[1:]]


def _fixed(run: RunDir) -> bytes:
    """The run's trace file with its bad line replaced by a good trace."""
    good = run.lines(3)
    return b"".join(line + b"\n" for line in [good[0], trace_line(9, 1), *good[1:]])


@dataclass
class World:
    """One daemon on one tree, and the runs written into it by case."""

    platform: LocalPlatform
    environ: dict[str, str]
    daemon: Daemon
    tree: Path
    permissions_bind: bool
    runs: dict[str, RunDir] = field(default_factory=dict)
    good_before: RunDir | None = None
    good_after: RunDir | None = None
    held: dict[str, tuple[dict[str, Any], str, dict[str, Any]]] = field(default_factory=dict)
    """By case: what `status RUN --json` and `status RUN` said while the run was held, and its
    evaluations on the platform then."""

    def run(self, case: str) -> RunDir:
        return self.runs[case]

    def add(self, case: str, **config: Any) -> RunDir:
        run = RunDir(self.tree / GROUP)
        if config.get("write_config", True):
            run.config(**{k: v for k, v in config.items() if k != "write_config"})
        else:
            run.path.mkdir(parents=True)
        self.runs[case] = run
        return run

    def detail(self, run: RunDir) -> dict[str, Any]:
        """`evalpush status RUN --json`."""
        done = self.evalpush("status", run.run_id, "--json")
        assert done.returncode == 0, done.stderr
        return orjson.loads(done.stdout)

    def shown(self, run: RunDir) -> tuple[dict[str, Any], str]:
        """What `status RUN --json` and `status RUN` show of the run."""
        return self.detail(run), self.text(run)

    def text(self, run: RunDir) -> str:
        """`evalpush status RUN`, the table people read."""
        done = self.evalpush("status", run.run_id)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def states(self) -> dict[str, str]:
        """Each run's state in the ledger, read in this process (polled: no subprocess)."""
        path = default_path(Path(self.environ["EVALPUSH_STATE_DIR"]))
        if not path.exists():
            return {}
        with Ledger.for_reading(path) as ledger:
            return {record.run_id: record.state for record in ledger.all()}

    def state(self, run: RunDir) -> str | None:
        return self.states().get(run.run_id)

    def reach_all(self, wanted: dict[str, str]) -> None:
        """Wait until each case's run is in the state `wanted` names for it."""
        ids = {self.runs[case].run_id: state for case, state in wanted.items()}
        wait_until(
            lambda: all(self.states().get(i) == state for i, state in ids.items()),
            f"each run to reach its state: {wanted}",
            timeout=BATCH_WAIT_SECONDS,
        )

    def reach(self, run: RunDir, state: str) -> dict[str, Any]:
        """Wait until the run is in `state`; its `status RUN --json` then."""
        wait_until(lambda: self.state(run) == state, f"run {run.run_id} to be {state}")
        return self.detail(run)

    def retry(self, run: RunDir) -> None:
        done = self.evalpush("retry", run.run_id)
        assert done.returncode == 0, done.stdout + done.stderr

    def evalpush(self, *args: str) -> subprocess.CompletedProcess[str]:
        return commands.evalpush(self.environ, *args)

    def needs_permissions(self) -> None:
        if not self.permissions_bind:
            pytest.skip("as root without setpriv, file permissions do not bind the daemon")

    def assert_still_working(self) -> None:
        """The daemon is alive and uploaded the good runs written before and after the bad ones,
        each exactly once; it printed no traceback."""
        assert self.daemon.process.poll() is None, self.daemon.text()
        assert self.good_before is not None and self.good_after is not None
        for good in (self.good_before, self.good_after):
            assert_run_exactly_once(self.platform, good.path, max_line_bytes=MAX_LINE_BYTES)
        assert "Traceback" not in self.daemon.text()


def _daemon_prefix() -> list[str] | None:
    """As root, no capability to read past file permissions (see the module docstring); None
    when file permissions cannot bind the daemon here (root without setpriv)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        return None
    return NO_DAC_OVERRIDE


def _open_world(tmp: Path, platform: LocalPlatform, **settings: str) -> tuple[World, Daemon]:
    tree = tmp / "outputs"
    tree.mkdir()
    environ = daemon_environ(
        platform, tmp, [tree], EVALPUSH_READ__MAX_LINE_BYTES=str(MAX_LINE_BYTES), **settings
    )
    prefix = _daemon_prefix()
    daemon = Daemon(environ, prefix=prefix or [])
    world = World(platform, environ, daemon, tree, permissions_bind=prefix is not None)
    daemon.started()
    world.good_before = RunDir(tree / GROUP).config(num_tasks=2)
    world.good_before.write(world.good_before.lines(4))
    return world, daemon


def _good_after(world: World) -> None:
    """A good run written once the daemon has dealt with the bad ones: it is uploaded too."""
    world.good_after = RunDir(world.tree / GROUP).config(num_tasks=2)
    world.good_after.write(world.good_after.lines(4))
    world.daemon.wait_for(RUN_FINALIZED, run=world.good_after.run_id)


def _create_unreadable(path: Path, data: bytes) -> None:
    """`path` written with `data` but made mode 0 from the start (no moment a reader could
    open it)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


VALID_CASES = ("NaN", "a BOM", "CRLF line ends", "a repeated id")
SETTLED_STATES = {
    "an empty traces.jsonl": "failed",
    "every line set aside": "failed",
    "no environment name": "failed",
    "config.toml changed after finalize": "finalized",
}


def _write_corpus(world: World) -> None:
    for case, (bad, _) in LINE_CASES.items():
        run = world.add(case)
        run.write(_with_bad_line(run, bad))

    nan = world.add("NaN")
    nan.write([*nan.lines(2), trace_line(2, 1).replace(b'"correct":0.0', b'"correct":NaN')])
    bom = world.add("a BOM")
    first, *rest = bom.lines(3)
    bom.write([b"\xef\xbb\xbf" + first, *rest])
    crlf = world.add("CRLF line ends")
    crlf.write([line + b"\r" for line in crlf.lines(3)])
    repeated = world.add("a repeated id")
    lines = repeated.lines(2)
    repeated.write([*lines, lines[0]])

    world.add("an empty traces.jsonl").touch_traces()
    world.add("every line set aside", num_tasks=1).write([b"{oops", b'{"id": "x", "task": {}}'])
    no_env = world.add("no environment name", env="")
    no_env.write(no_env.lines(2))
    no_config = world.add("no config.toml", write_config=False)
    no_config.write(no_config.lines(2))
    unreadable = world.add("an unreadable traces.jsonl", num_tasks=1)
    _create_unreadable(unreadable.traces, b"".join(line + b"\n" for line in unreadable.lines(2)))
    locked = world.add("an unreadable config.toml", num_tasks=1)
    (locked.path / "config.toml").chmod(0)
    locked.write(locked.lines(2))
    staging = RunDir(world.tree.parent / "staging").config(num_tasks=1)
    staging.write(staging.lines(2))
    staging.path.chmod(0)
    closed = RunDir(world.tree / GROUP, run_id=staging.run_id)
    staging.path.rename(closed.path)  # in whole: the daemon never saw it readable
    world.runs["an unreadable run directory"] = closed
    changed = world.add("config.toml changed after finalize", num_tasks=1)
    changed.write(changed.lines(2))

    settled = {**{case: "finalized" for case in [*LINE_CASES, *VALID_CASES]}, **SETTLED_STATES}
    if world.permissions_bind:
        settled["an unreadable config.toml"] = "failed"
    world.reach_all(settled)
    _good_after(world)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """The whole corpus under one daemon (convert.on_bad_line = "skip", the default)."""
    with LocalPlatform() as platform:
        world, daemon = _open_world(tmp_path_factory.mktemp("corpus"), platform)
        with daemon:
            _write_corpus(world)
            yield world
            assert daemon.stop() == 0


@pytest.fixture(scope="module")
def held_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """Every bad line under one daemon with convert.on_bad_line = "hold": each run is held, what
    `status` said of it kept in `world.held`; then every file is fixed and every run retried at
    once (one wait for them all, not one per case)."""
    with LocalPlatform() as platform:
        world, daemon = _open_world(
            tmp_path_factory.mktemp("corpus-held"),
            platform,
            EVALPUSH_CONVERT__ON_BAD_LINE="hold",
        )
        with daemon:
            for case, (bad, _) in LINE_CASES.items():
                run = world.add(case)
                run.write(_with_bad_line(run, bad))
            world.reach_all({case: "held" for case in LINE_CASES})
            world.held = {
                case: (
                    *world.shown(world.run(case)),
                    evaluations_of(platform, world.run(case).run_id),
                )
                for case in LINE_CASES
            }
            for case in LINE_CASES:
                world.run(case).traces.write_bytes(_fixed(world.run(case)))
                world.retry(world.run(case))
            world.reach_all({case: "finalized" for case in LINE_CASES})
            _good_after(world)
            yield world
            assert daemon.stop() == 0


CASE_IDS = list(LINE_CASES)


class TestBadLines:
    @pytest.mark.parametrize("case", CASE_IDS)
    def test_a_bad_line_is_set_aside_naming_its_line_and_why_and_the_rest_uploads_once(
        self, world: World, case: str
    ) -> None:
        run, why = world.run(case), LINE_CASES[case][1]
        detail = world.detail(run)
        assert (detail["state"], detail["samples_sent"], detail["set_aside"]) == ("finalized", 3, 1)
        (aside,) = detail["set_aside_records"]
        assert (aside["line"], aside["kind"]) == (BAD_LINE_NUMBER, "bad_line")
        assert why in aside["reason"]
        text = world.text(run)
        assert f"line {BAD_LINE_NUMBER}," in text and why in text
        if case in TALLY_BLIND:
            _assert_once_but_the_create_counted_the_bad_line(world, run)
        else:
            assert_once(world, run)
        world.assert_still_working()


def assert_once(world: World, run: RunDir) -> None:
    assert_run_exactly_once(world.platform, run.path, max_line_bytes=MAX_LINE_BYTES)


def _assert_once_but_the_create_counted_the_bad_line(world: World, run: RunDir) -> None:
    """`assert_run_exactly_once`, but with the create's metadata counting the line the full
    check refused (see TALLY_BLIND): the finalize's metrics are exact, and a warning said so."""
    ids, summary = expected(run.path, max_line_bytes=MAX_LINE_BYTES)
    ((evaluation_id, evaluation),) = evaluations_of(world.platform, run.run_id).items()
    assert (evaluation["status"], evaluation["finalize_count"]) == ("COMPLETED", 1)
    assert evaluation["duplicates"] == 0
    assert sorted(s["sample_id"] for s in world.platform.samples(evaluation_id)) == sorted(ids)
    assert evaluation["metrics"] == summary["metrics"]
    assert evaluation["metadata"]["num_examples"] == summary["metadata"]["num_examples"] + 1
    untallied = {k: v for k, v in evaluation["metadata"].items() if k not in {*TALLIED, "evalpush"}}
    assert untallied == {k: v for k, v in summary["metadata"].items() if k not in TALLIED}
    assert world.daemon.find(TALLY_WARNING, run=run.run_id, counted=4, converted=3)


class TestBadLinesHeld:
    @pytest.mark.parametrize("case", CASE_IDS)
    def test_a_bad_line_holds_the_run_saying_why_and_once_fixed_retry_uploads_every_line_once(
        self, held_world: World, case: str
    ) -> None:
        world = held_world
        run, why = world.run(case), LINE_CASES[case][1]
        held, text, evaluations = world.held[case]
        assert held["state"] == "held"
        assert evaluations == {}, "nothing was sent while it was held"
        assert "1 bad line set aside: fix them" in held["reason"], held["reason"]
        (aside,) = held["set_aside_records"]
        assert (aside["line"], aside["kind"]) == (BAD_LINE_NUMBER, "bad_line")
        assert why in aside["reason"]
        assert f"line {BAD_LINE_NUMBER}," in text and why in text, text

        detail = world.detail(run)  # fixed in the file and retried (the fixture did both)
        assert (detail["state"], detail["samples_sent"], detail["set_aside"]) == ("finalized", 4, 0)
        assert_once(world, run)
        world.assert_still_working()


class TestOddButValidLines:
    """Lines that are not what a strict reader expects but are traces: each is uploaded."""

    def test_nan_is_sent_as_null_and_the_run_uploads_whole(self, world: World) -> None:
        run = world.run("NaN")
        detail = world.detail(run)
        assert (detail["state"], detail["samples_sent"], detail["set_aside"]) == ("finalized", 3, 0)
        assert_once(world, run)
        done = completed(world.platform, run.run_id)
        assert done is not None
        (sample,) = [s for s in world.platform.samples(done["id"]) if s["sample_id"] == "trace-2"]
        assert sample["correct"] is None
        world.assert_still_working()

    @pytest.mark.parametrize("case", ["a BOM", "CRLF line ends"])
    def test_a_bom_or_crlf_line_ends_change_nothing(self, world: World, case: str) -> None:
        run = world.run(case)
        detail = world.detail(run)
        assert (detail["state"], detail["samples_sent"], detail["set_aside"]) == ("finalized", 3, 0)
        assert_once(world, run)
        done = completed(world.platform, run.run_id)
        assert done is not None
        stored = sorted(s["sample_id"] for s in world.platform.samples(done["id"]))
        assert stored == ["trace-0", "trace-1", "trace-2"]
        world.assert_still_working()

    def test_a_repeated_id_sends_each_line_once(self, world: World) -> None:
        """By design (docs/ARCHITECTURE.md, upload step 4): ids are unique per rollout by
        contract, and a file that repeats one still has each of its lines sent once."""
        run = world.run("a repeated id")
        detail = world.detail(run)
        assert (detail["state"], detail["samples_sent"], detail["set_aside"]) == ("finalized", 3, 0)
        (evaluation,) = evaluations_of(world.platform, run.run_id).values()
        assert evaluation["status"] == "COMPLETED" and evaluation["finalize_count"] == 1
        assert (evaluation["sample_count"], evaluation["duplicates"]) == (3, 1)
        world.assert_still_working()


class TestRunLevel:
    def test_the_daemon_took_the_whole_corpus_and_still_uploads_good_runs(
        self, world: World
    ) -> None:
        world.assert_still_working()

    def test_an_empty_trace_file_fails_saying_so_and_once_written_retry_uploads_it_once(
        self, world: World
    ) -> None:
        run = world.run("an empty traces.jsonl")
        detail = world.detail(run)
        assert detail["state"] == "failed"
        assert str(run.traces) in detail["last_error"] and "no traces" in detail["last_error"]
        assert "no traces" in world.text(run)

        run.write(run.lines(2))
        world.retry(run)
        world.reach(run, "finalized")

        assert_once(world, run)
        world.assert_still_working()

    def test_a_run_whose_every_line_is_set_aside_fails_with_its_reason_and_no_evaluation(
        self, world: World
    ) -> None:
        run = world.run("every line set aside")
        detail = world.detail(run)
        assert detail["state"] == "failed"
        assert "2 lines, every one set aside (line 1: invalid JSON" in detail["last_error"]
        assert "every one set aside" in world.text(run)
        assert evaluations_of(world.platform, run.run_id) == {}
        world.assert_still_working()

    def test_no_environment_name_fails_naming_the_key_and_once_set_retry_uploads_it_once(
        self, world: World
    ) -> None:
        run = world.run("no environment name")
        detail = world.detail(run)
        assert detail["state"] == "failed"
        error = detail["last_error"]
        assert str(run.path / "config.toml") in error and "[taskset] id" in error, error
        assert "[taskset] id" in world.text(run)

        run.config()
        world.retry(run)
        world.reach(run, "finalized")

        assert_once(world, run)
        world.assert_still_working()

    def test_a_run_without_config_toml_is_not_a_run_says_why_and_uploads_once_it_has_one(
        self, world: World
    ) -> None:
        run = world.run("no config.toml")
        assert run.run_id not in status(world.environ)
        assert evaluations_of(world.platform, run.run_id) == {}
        asked = world.evalpush("status", str(run.path))
        assert asked.returncode == 2
        assert "config.toml" in asked.stderr, asked.stderr

        run.config(num_tasks=1)
        world.reach(run, "finalized")

        assert_once(world, run)
        world.assert_still_working()

    def test_an_unreadable_trace_file_waits_naming_it_and_uploads_once_readable(
        self, world: World
    ) -> None:
        world.needs_permissions()
        run = world.run("an unreadable traces.jsonl")
        detail = world.reach(run, "waiting")
        assert str(run.traces) in detail["reason"], detail["reason"]
        assert "permission denied" in detail["reason"]
        assert "permission denied" in world.text(run)
        assert evaluations_of(world.platform, run.run_id) == {}

        run.traces.chmod(0o644)
        world.reach(run, "finalized")

        assert_once(world, run)
        world.assert_still_working()

    def test_an_unreadable_config_toml_fails_naming_it_and_once_readable_retry_uploads_it_once(
        self, world: World
    ) -> None:
        world.needs_permissions()
        run = world.run("an unreadable config.toml")
        detail = world.detail(run)
        assert detail["state"] == "failed"
        error = detail["last_error"]
        assert str(run.path / "config.toml") in error and "permission denied" in error, error

        (run.path / "config.toml").chmod(0o644)
        world.retry(run)
        world.reach(run, "finalized")

        assert_once(world, run)
        world.assert_still_working()

    def test_an_unreadable_run_directory_is_named_in_a_warning_and_uploads_once_readable(
        self, world: World
    ) -> None:
        world.needs_permissions()
        run = world.run("an unreadable run directory")
        warned = world.daemon.find(
            "cannot read a directory under a watch root; runs in it are not seen",
            directory=str(run.path),
        )
        assert warned and warned[0]["level"] == "warning"
        assert evaluations_of(world.platform, run.run_id) == {}

        run.path.chmod(0o755)
        world.reach(run, "finalized")

        assert_once(world, run)
        world.assert_still_working()

    def test_a_config_toml_changed_after_finalize_sends_nothing_again(self, world: World) -> None:
        """The run is its trace file: a config.toml edited afterwards changes no evaluation."""
        run = world.run("config.toml changed after finalize")
        before = evaluations_of(world.platform, run.run_id)
        assert len(before) == 1

        run.config(num_tasks=5, env="another-env")
        time.sleep(2 * RESCAN_SECONDS)  # two rescans see the new config.toml

        assert evaluations_of(world.platform, run.run_id) == before
        assert world.state(run) == "finalized"
        world.assert_still_working()


class TestDeletedMidUpload:
    def test_a_run_directory_deleted_mid_upload_fails_saying_so_and_others_go_on(
        self, local_platform: LocalPlatform, tmp_path: Path
    ) -> None:
        tree = tmp_path / "outputs"
        environ = daemon_environ(
            local_platform, tmp_path, [tree], EVALPUSH_UPLOAD__MAX_BATCH_SAMPLES="1"
        )
        doomed = slow_run(local_platform, tree / GROUP)  # kept mid-upload
        with Daemon(environ) as daemon:
            upload_under_way(local_platform)
            shutil.rmtree(doomed.path)
            failed = wait_until(
                lambda: (
                    (row := status(environ).get(doomed.run_id)) and row["state"] == "failed" and row
                ),
                "the run to fail",
            )
            good = RunDir(tree / GROUP).config(num_tasks=2)
            good.write(good.lines(4))
            daemon.wait_for(RUN_FINALIZED, run=good.run_id)
            assert daemon.stop() == 0
        assert "deleted" in failed["last_error"] and str(doomed.path) in failed["last_error"]
        (evaluation,) = evaluations_of(local_platform, doomed.run_id).values()
        assert evaluation["status"] == "CANCELLED"
        assert_run_exactly_once(local_platform, good.path)
