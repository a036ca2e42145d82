"""A run the daemon watched while it was written, and did not follow, is decoded once.

A run is watched without being followed when its eval pushes itself, or with `runs.follow =
false` (the configurations here); a followed run is uploaded as it is written instead
(test_follow.py). The tracker feeds each new line of a waiting run to a `prescan.RunningScan`; once the run is
ready, what the upload's scan step would record (identity, SHA-256 of `[0, upload_end)`, totals,
set-aside lines) is written with its queueing and the upload starts at resolve. These tests hold
the running scan to the real scan step, run on the same final file, column by column, for every
kind of trace and bad line; and show what voids it (a file replaced, truncated or rewritten in
place while watched, a line too long to hash) and what a restart does.
"""

from __future__ import annotations

import base64
import os
import random
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from daemon_support import RUN_FINALIZED, InProcessDaemon, RunDir, daemon_environ
from evalpush.client import PlatformClient, Retrier
from evalpush.config import Config
from evalpush.core.setaside import SetAside
from evalpush.core.states import State, Step
from evalpush.discover import look_at
from evalpush.ledger import Claims, Ledger, RunRecord, default_path
from evalpush.local_platform import LocalPlatform
from evalpush.runs import BOM, LineCounter, load_run
from evalpush.service import FEED_BYTES, Tracker
from evalpush.upload import RunningScan, Uploader
from evalpush.upload.context import Context
from evalpush.upload.reconcile import Reconciler
from evalpush.upload.steps import Steps
from pushing import assert_run_exactly_once
from test_convert import (
    BAD_LINES,
    BAD_ONLY_WHERE_THE_TALLY_DOES_NOT_LOOK,
    node,
    trace,
    tree,
    usage,
)
from test_upload import assert_uploaded_once

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "runs"
ENV_NAME = "prescan-env"
SCAN_COLUMNS = (
    "step",
    "file_device",
    "file_inode",
    "file_size",
    "file_mtime_ns",
    "file_ctime_ns",
    "file_digest",
    "upload_end",
    "totals",
    "samples_seen",
)


# ---------------------------------------------------------------- traces of every kind


def _line(t: dict[str, Any]) -> bytes:
    return orjson.dumps(t)


def linear(n: int) -> bytes:
    nodes = [
        node("be brief", role="system"),
        node(f"question {n}", role="user", parent=0),
        node(f"answer {n}", parent=1, sampled=True, usage=usage(10 + n, 3)),
    ]
    return _line(
        trace(
            id=f"linear-{n}",
            idx=n % 5,
            nodes=nodes,
            rewards={"correct": float(n % 2), "format": 0.5},
            metrics={"turns": 1.0},
        )
    )


def tool_calls(n: int) -> bytes:
    call = {"id": f"call-{n}", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
    nodes = [
        node("use tools", role="system"),
        node("list files", role="user", parent=0),
        {"message": {"role": "assistant", "content": "", "tool_calls": [call]}, "parent": 1},
        node("a.txt", role="tool", parent=2, tool_call_id=f"call-{n}"),
        node("one file", parent=3, sampled=True),
    ]
    errors = [{"type": "TimeoutError", "message": "tool call timed out"}] if n % 3 == 0 else []
    return _line(trace(id=f"tool-{n}", idx=n % 4, nodes=nodes, rewards={"r": n / 7}, errors=errors))


def branching(n: int) -> bytes:
    return _line(trace(id=f"branch-{n}", idx=n % 3, nodes=tree(), rewards={"r": 1 / (n + 1)}))


def multimodal(n: int) -> bytes:
    png = base64.b64encode(bytes(range(64))).decode()
    content = [
        {"type": "text", "text": f"what is in picture {n}?"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}},
    ]
    nodes = [
        {"message": {"role": "user", "content": content}},
        node("a cat", parent=0, sampled=True),
    ]
    return _line(trace(id=f"image-{n}", idx=n, nodes=nodes, metrics={"seen": float(n)}))


def bad_lines() -> list[bytes]:
    """Good lines with every kind of bad one between them, a blank line and non-finite sums."""
    bad = [raw for _, raw, _ in BAD_LINES] + list(BAD_ONLY_WHERE_THE_TALLY_DOES_NOT_LOOK.values())
    lines: list[bytes] = []
    for n, raw in enumerate(bad):
        lines += [linear(n), raw]
    nan = b'{"id": "nan", "task": {"idx": 1}, "rewards": {"r": NaN}, "metrics": {"m": Infinity}}'
    return [*lines, b"", b"   ", nan, linear(999)]


def producer_fixture() -> list[bytes]:
    """Lines the producer itself wrote (tests/fixtures), every fixture run's in turn."""
    lines: list[bytes] = []
    for path in sorted(FIXTURES.glob("*/*/traces.jsonl")):
        lines += path.read_bytes().splitlines()
    assert len(lines) >= 10
    return lines


CORPORA: dict[str, Callable[[], list[bytes]]] = {
    "linear": lambda: [linear(n) for n in range(30)],
    "tool calls": lambda: [tool_calls(n) for n in range(30)],
    "branching": lambda: [branching(n) for n in range(30)],
    "multimodal": lambda: [multimodal(n) for n in range(30)],
    "bad lines": bad_lines,
    "producer fixtures": producer_fixture,
    "all kinds mixed": lambda: [
        f(n) for n in range(12) for f in (linear, tool_calls, branching, multimodal)
    ],
}


def file_bytes(lines: list[bytes], *, bom: bool = False) -> bytes:
    return (BOM if bom else b"") + b"".join(line + b"\n" for line in lines)


def pieces(data: bytes, seed: int, *, count: int = 40) -> Iterator[bytes]:
    """`data` in `count` pieces cut at random points: lines arrive whole, in parts, or several
    at a time, as a producer's writes do."""
    cuts = sorted(random.Random(seed).sample(range(1, len(data)), min(count, len(data) - 1)))
    for start, end in zip([0, *cuts], [*cuts, len(data)], strict=True):
        yield data[start:end]


def append(path: Path, data: bytes) -> None:
    with path.open("ab") as f:
        f.write(data)


# ---------------------------------------------------------------- the real scan step


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    with Ledger(default_path(tmp_path / "state")) as opened:
        yield opened


@pytest.fixture
def make_context(
    local_platform: LocalPlatform,
    make_platform_client: Callable[..., PlatformClient],
    make_retrier: Callable[[PlatformClient], Retrier],
) -> Callable[..., Context]:
    def make(ledger: Ledger, config: Config) -> Context:
        client = make_platform_client()
        return Context(config, ledger, client, make_retrier(client))

    return make


def config_of(*, hold: bool = False, max_line_bytes: int | None = None) -> Config:
    sections: dict[str, Any] = {"runs": {"settle_seconds": 600, "follow": False}}
    if hold:
        sections["convert"] = {"on_bad_line": "hold"}
    if max_line_bytes is not None:
        sections["read"] = {"max_line_bytes": max_line_bytes}
    return Config.model_validate(sections)


def scan_step(context: Context, run_dir: Path) -> tuple[dict[str, Any], list[SetAside]]:
    """What the upload's scan step records for the run as its file is now: its columns (in a
    ledger of its own) and its set-aside lines."""
    run = load_run(run_dir)
    claims = Claims(context.ledger)
    claimed, _ = claims.take(run_id=run.run_id, path=run.path, kind=run.kind)
    try:
        scanned = Steps(context, Reconciler(context)).scan(claimed, run)
    finally:
        row = context.ledger.get_run(run.run_id)
        assert row is not None
        claims.release(row)
        claims.close()  # its heartbeat thread ends now, not a linger later
    context.client.close()
    return columns_of(scanned), context.ledger.set_aside(row)


def columns_of(row: RunRecord) -> dict[str, Any]:
    return {name: getattr(row, name) for name in SCAN_COLUMNS}


def new_run(root: Path, *, num_tasks: int | None = None) -> Path:
    run_dir = root / str(uuid.uuid4())
    run_dir.mkdir(parents=True)
    tasks = f"num_tasks = {num_tasks}\n" if num_tasks is not None else ""
    (run_dir / "config.toml").write_text(
        f'model = "org/model"\nnum_rollouts = 1\npush = false\n{tasks}[taskset]\nid = "{ENV_NAME}"\n'
    )
    (run_dir / "traces.jsonl").write_bytes(b"")
    return run_dir


def fed(path: Path, counter: LineCounter, scan: RunningScan) -> dict[str, Any] | None:
    """The running scan's columns for the file as the counter sees it now (None: void)."""
    count = counter.update(scan)
    result = scan.result(count.file)
    if result is None:
        return None
    assert result.found.end == count.offset
    return {**result.columns(), "set_aside": result.found.set_aside}


# ---------------------------------------------------------------- equal to the scan step


class TestEqualToTheScanStep:
    @pytest.mark.parametrize("hold", [False, True], ids=["tally", "checked (hold)"])
    @pytest.mark.parametrize("corpus", sorted(CORPORA))
    def test_lines_fed_as_they_arrive_give_the_scan_steps_columns_bit_for_bit(
        self,
        tmp_path: Path,
        ledger: Ledger,
        make_context: Callable[..., Context],
        corpus: str,
        hold: bool,
    ):
        config = config_of(hold=hold)
        run_dir = new_run(tmp_path / "runs")
        path = run_dir / "traces.jsonl"
        counter = LineCounter(path, max_line_bytes=config.read.max_line_bytes)
        scan = RunningScan(checked=hold, max_line_bytes=config.read.max_line_bytes)
        data = file_bytes(CORPORA[corpus](), bom=corpus == "linear")
        for piece in pieces(data, seed=len(corpus)):
            append(path, piece)
            counter.update(scan)
        append(path, b'{"id": "half-writ')  # a half-written last line is in neither

        running = fed(path, counter, scan)
        columns, set_aside = scan_step(make_context(ledger, config), run_dir)

        assert running is not None
        assert running.pop("set_aside") == set_aside
        assert running == columns
        assert columns["upload_end"] == len(data)

    def test_a_line_over_max_line_bytes_voids_the_running_scan(self, tmp_path: Path):
        path = new_run(tmp_path / "runs") / "traces.jsonl"
        counter, scan = (
            LineCounter(path, max_line_bytes=200),
            RunningScan(checked=False, max_line_bytes=200),
        )
        append(path, file_bytes([linear(1)[:150]]))
        assert fed(path, counter, scan) is not None

        append(path, file_bytes([b"x" * 300, linear(2)[:150]]))

        assert fed(path, counter, scan) is None  # its bytes were skipped: they cannot be hashed


# ---------------------------------------------------------------- what voids it


def truncate_and_write(path: Path, data: bytes) -> None:
    """Rewritten in place: the same inode, truncated, written again (as `cp` or `>` do)."""
    with path.open("r+b") as f:
        f.truncate(0)
        f.write(data)


def replace_by_rename(path: Path, data: bytes) -> None:
    temp = path.with_name("traces.jsonl.tmp")
    temp.write_bytes(data)
    os.replace(temp, path)


def overwrite_head(path: Path, data: bytes) -> None:
    """Other bytes over the first ones: the same inode and size, then the rest appended."""
    with path.open("r+b") as f:
        f.write(data[: path.stat().st_size])
    append(path, data[path.stat().st_size :])


def overwrite_tail(path: Path, data: bytes) -> None:
    """Other bytes over the last ones fed: the same inode, the head untouched."""
    size = path.stat().st_size
    with path.open("r+b") as f:
        f.seek(size - 40)
        f.write(data[size - 40 :])


CHANGES = {
    "truncated, then longer other bytes": truncate_and_write,
    "replaced by a rename": replace_by_rename,
    "other bytes over its head, then appended": overwrite_head,
    "other bytes over its last line, then appended": overwrite_tail,
}


class TestChangesWhileWatched:
    @pytest.mark.parametrize("change", sorted(CHANGES))
    def test_a_file_changed_under_the_running_scan_is_scanned_afresh_and_equals_the_scan_step(
        self, tmp_path: Path, ledger: Ledger, make_context: Callable[..., Context], change: str
    ):
        config = config_of()
        run_dir = new_run(tmp_path / "runs")
        path = run_dir / "traces.jsonl"
        counter = LineCounter(path)
        scan = RunningScan(checked=False, max_line_bytes=config.read.max_line_bytes)
        before = [linear(n) for n in range(20)]
        append(path, file_bytes(before))
        counter.update(scan)
        after = [tool_calls(n) for n in range(25)]  # other traces, more bytes than before
        assert len(file_bytes(after)) > len(file_bytes(before))

        CHANGES[change](path, file_bytes(after))
        running = fed(path, counter, scan)
        columns, set_aside = scan_step(make_context(ledger, config), run_dir)

        assert running is not None
        assert running.pop("set_aside") == set_aside
        assert running == columns
        if change != "other bytes over its last line, then appended":  # that one is a mix
            assert orjson.loads(columns["totals"])["traces"] == 25

    def test_a_truncation_seen_as_a_shorter_file_restarts_the_running_scan(
        self, tmp_path: Path, ledger: Ledger, make_context: Callable[..., Context]
    ):
        run_dir = new_run(tmp_path / "runs")
        path = run_dir / "traces.jsonl"
        counter, scan = LineCounter(path), RunningScan(checked=False, max_line_bytes=1 << 20)
        append(path, file_bytes([linear(n) for n in range(10)]))
        counter.update(scan)
        truncate_and_write(path, file_bytes([branching(1)]))
        counter.update(scan)  # seen shorter
        append(path, file_bytes([branching(2), branching(3)]))

        running = fed(path, counter, scan)
        columns, _ = scan_step(make_context(ledger, config_of()), run_dir)

        assert running is not None
        running.pop("set_aside")
        assert running == columns
        assert orjson.loads(columns["totals"])["traces"] == 3


# ---------------------------------------------------------------- the tracker and the upload


class Watching:
    """A `Tracker` on a real ledger, looking at one run directory after each write (as the
    daemon's loop does on each inotify hint); `submitted` is what it handed to the scheduler."""

    def __init__(self, ledger: Ledger, config: Config, run_dir: Path) -> None:
        self.submitted: list[str] = []
        self.now = time.time()
        self.settle_seconds = config.runs.settle_seconds
        self.tracker = Tracker(ledger, config, self.submitted.append, clock=lambda: self.now)
        self.tracker.load()
        self.run_dir = run_dir

    def look(self) -> None:
        self.tracker.look(str(self.run_dir), look_at(str(self.run_dir), ""))

    def settle(self) -> None:
        """Let the run's settle time pass, then look again."""
        self.now = time.time() + self.settle_seconds + 1
        self.look()

    def write(self, data: bytes, *, seed: int = 0, count: int = 30) -> None:
        for piece in pieces(data, seed, count=count):
            append(self.run_dir / "traces.jsonl", piece)
            self.look()


class TestTheTrackerAndTheUpload:
    @pytest.mark.parametrize("feed_bytes", [1, FEED_BYTES], ids=["fed each look", "fed at ready"])
    def test_a_run_written_while_watched_is_queued_at_resolve_with_the_scan_steps_columns(
        self,
        tmp_path: Path,
        ledger: Ledger,
        local_platform: LocalPlatform,
        make_context: Callable[..., Context],
        monkeypatch: pytest.MonkeyPatch,
        feed_bytes: int,
    ):
        monkeypatch.setattr("evalpush.service.feeder.FEED_BYTES", feed_bytes)
        config = config_of()
        # Lines the first pass and conversion both refuse: the create's metadata is then exact.
        refused = [b'{"id": "a", oops}', b"", orjson.dumps({"id": "no-task"})]
        lines = CORPORA["all kinds mixed"]() + refused + [linear(100)]
        run_dir = new_run(tmp_path / "runs", num_tasks=len(lines))
        watching = Watching(ledger, config, run_dir)
        watching.look()  # found waiting, with no lines yet

        watching.write(file_bytes(lines))

        assert watching.submitted == [str(run_dir)]  # ready by the expected count
        run = load_run(run_dir)
        row = ledger.get_run(run.run_id)
        assert row is not None
        assert (row.state, row.step) == (State.READY, Step.RESOLVE)
        with Ledger(default_path(tmp_path / "other-state")) as other:
            columns, set_aside = scan_step(make_context(other, config), run_dir)
        assert columns_of(row) == columns
        assert ledger.set_aside(row) == set_aside

        # The upload starts at resolve: the scan step's pass is never taken.
        def no_first_pass(*args: object, **kwargs: object) -> None:
            raise AssertionError("the upload scanned a run its tracker had scanned")

        monkeypatch.setattr("evalpush.upload.steps.tally", no_first_pass)
        monkeypatch.setattr("evalpush.upload.steps.scan", no_first_pass)
        context = make_context(ledger, config)
        claims = Claims(ledger)
        record = Uploader(context, claims).upload(run)
        claims.close()
        context.client.close()

        assert_uploaded_once(local_platform, run_dir, record)

    def test_a_run_found_finished_at_its_first_look_is_left_to_the_upload_to_scan(
        self, tmp_path: Path, ledger: Ledger
    ):
        lines = [linear(n) for n in range(6)]
        run_dir = new_run(tmp_path / "runs", num_tasks=6)
        append(run_dir / "traces.jsonl", file_bytes(lines))
        watching = Watching(ledger, config_of(), run_dir)

        watching.look()

        row = ledger.get_run(load_run(run_dir).run_id)
        assert watching.submitted == [str(run_dir)]
        assert row is not None and (row.state, row.step) == (State.READY, Step.SCAN)
        assert row.upload_end is None

    def test_after_a_restart_the_run_is_fed_again_from_its_start_and_equals_the_scan_step(
        self,
        tmp_path: Path,
        ledger: Ledger,
        make_context: Callable[..., Context],
        monkeypatch: pytest.MonkeyPatch,
    ):
        monkeypatch.setattr("evalpush.service.feeder.FEED_BYTES", 1)  # fed at each look
        config = config_of()
        lines = [tool_calls(n) for n in range(40)]
        data = file_bytes(lines)
        run_dir = new_run(tmp_path / "runs", num_tasks=len(lines))
        first = Watching(ledger, config, run_dir)
        first.look()
        first.write(data[: len(data) // 2], seed=1)  # fed half, then the daemon stops

        second = Watching(ledger, config, run_dir)  # a new process: nothing kept but the ledger
        second.write(data[len(data) // 2 :], seed=2)

        assert first.submitted == [] and second.submitted == [str(run_dir)]
        row = ledger.get_run(load_run(run_dir).run_id)
        assert row is not None and row.step == Step.RESOLVE
        with Ledger(default_path(tmp_path / "other-state")) as other:
            columns, _ = scan_step(make_context(other, config), run_dir)
        assert columns_of(row) == columns

    @pytest.mark.parametrize("feed_bytes", [1, FEED_BYTES], ids=["fed each look", "fed at ready"])
    @pytest.mark.parametrize("change", sorted(CHANGES))
    def test_a_file_changed_while_watched_is_queued_with_the_scan_of_the_file_as_it_is(
        self,
        tmp_path: Path,
        ledger: Ledger,
        make_context: Callable[..., Context],
        monkeypatch: pytest.MonkeyPatch,
        change: str,
        feed_bytes: int,
    ):
        monkeypatch.setattr("evalpush.service.feeder.FEED_BYTES", feed_bytes)
        config = config_of()
        run_dir = new_run(tmp_path / "runs", num_tasks=25)
        watching = Watching(ledger, config, run_dir)
        watching.look()
        watching.write(file_bytes([linear(n) for n in range(20)]))
        assert watching.submitted == []

        CHANGES[change](run_dir / "traces.jsonl", file_bytes([multimodal(n) for n in range(25)]))
        watching.look()
        # Changed in place under the counter, a file may count past its expected lines: it is
        # then not finished by its count, but once it settles.
        watching.settle()

        assert watching.submitted == [str(run_dir)]
        row = ledger.get_run(load_run(run_dir).run_id)
        assert row is not None and row.step == Step.RESOLVE
        with Ledger(default_path(tmp_path / "other-state")) as other:
            columns, _ = scan_step(make_context(other, config), run_dir)
        assert columns_of(row) == columns

    def test_a_run_the_running_scan_cannot_stand_for_is_left_to_the_upload_to_scan(
        self, tmp_path: Path, ledger: Ledger
    ):
        config = config_of(max_line_bytes=1000)
        run_dir = new_run(tmp_path / "runs", num_tasks=3)
        watching = Watching(ledger, config, run_dir)
        watching.look()

        watching.write(file_bytes([linear(1), b'{"id": "long", "x": "' + b"y" * 2000 + b'"}']))
        watching.write(file_bytes([linear(2)]), count=1)

        row = ledger.get_run(load_run(run_dir).run_id)
        assert watching.submitted == [str(run_dir)]
        assert row is not None and (row.state, row.step) == (State.READY, Step.SCAN)

    def test_bad_lines_to_hold_are_left_to_the_upload_which_holds_the_run(
        self, tmp_path: Path, ledger: Ledger
    ):
        run_dir = new_run(tmp_path / "runs", num_tasks=3)
        watching = Watching(ledger, config_of(hold=True), run_dir)
        watching.look()

        watching.write(file_bytes([linear(1), b"{oops", linear(2), linear(3)]))

        row = ledger.get_run(load_run(run_dir).run_id)
        assert row is not None and (row.state, row.step) == (State.READY, Step.SCAN)
        assert ledger.set_aside(row) == []


# ---------------------------------------------------------------- the daemon, whole


class TestSettledAfterTheUpload:
    @pytest.mark.parametrize("appended", [False, True], ids=["unchanged", "appended meanwhile"])
    def test_a_run_is_settled_after_its_upload_only_if_its_file_is_as_the_upload_recorded(
        self,
        tmp_path: Path,
        ledger: Ledger,
        make_context: Callable[..., Context],
        appended: bool,
    ):
        # A rescan does not look at a settled run, and a file event that came while the run was
        # in flight was dropped: a run changed during its upload must not be settled.
        run_dir = new_run(tmp_path / "runs", num_tasks=3)
        append(run_dir / "traces.jsonl", file_bytes([linear(n) for n in range(3)]))
        watching = Watching(ledger, config_of(), run_dir)
        watching.look()
        context = make_context(ledger, config_of())
        claims = Claims(ledger)
        record = Uploader(context, claims).upload(load_run(run_dir))
        claims.close()
        context.client.close()
        if appended:
            append(run_dir / "traces.jsonl", file_bytes([linear(3)]))

        watching.tracker.finished(str(run_dir), record)
        watching.look()

        assert record.state == State.FINALIZED
        assert watching.tracker.settled(str(run_dir)) is not appended
        assert watching.tracker.waiting == int(appended)  # waits to upload again


class TestTheDaemon:
    def test_a_run_written_line_by_line_while_the_daemon_watches_is_scanned_as_it_arrives_and_uploaded_once(
        self, local_platform: LocalPlatform, tmp_path: Path
    ):
        tree = tmp_path / "outputs"
        tree.mkdir()
        environ = daemon_environ(
            local_platform,
            tmp_path,
            [tree],
            EVALPUSH_RUNS__SETTLE_SECONDS="600",
            EVALPUSH_RUNS__FOLLOW="false",
            EVALPUSH_LOG__LEVEL="debug",
        )
        run = RunDir(tree / "env--model--harness").config(num_tasks=10)
        with InProcessDaemon(environ) as daemon:
            daemon.started()
            run.touch_traces()
            daemon.wait_for("run found: waiting until it is finished", run=run.run_id)
            run.write(run.lines(20), pause=0.02)
            scanned = daemon.wait_for(
                "run scanned while it was written: its upload starts at resolve", run=run.run_id
            )
            daemon.wait_for(RUN_FINALIZED, run=run.run_id)
            assert daemon.stop() == 0
        assert scanned["traces"] == 20
        assert_run_exactly_once(local_platform, run.path)
