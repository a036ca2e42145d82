"""Discover's watcher on real directories: events become hints, roots come and go, limits bite.

Each test drives hints the way the daemon will: a RUN hint is answered with `Scanner.look`, a
SUBTREE hint with `Scanner.scan_subtree`, a ROOT hint with `Watcher.sync()` and a scan of the
roots it newly watches; a polled root gives no hints, so it is rescanned (after a `sync()`)
every `POLL_SECONDS`, as the daemon's loop does. Waits are bounded (`HINT_WAIT_SECONDS`), never
asserted as timings.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from evalpush.config import RunsConfig, WatchConfig
from evalpush.core.errors import ConfigError
from evalpush.discover import (
    Hint,
    HintKind,
    HintQueue,
    ObserverKind,
    RunDir,
    Scanner,
    Watcher,
    Watches,
    inotify_watches_in_use,
)
from inotify_limited import limited_namespaces_available, run_limited
from support.runs import make_run

HINT_WAIT_SECONDS = 10.0
QUIET_SECONDS = 0.3  # how long "no hint came" is watched for
POLL_SECONDS = 0.05

KINDS = [
    pytest.param(ObserverKind.INOTIFY, id="inotify"),
    pytest.param(ObserverKind.POLLING, id="polling"),
]


class Daemonish:
    """A root's watcher, scanner and hint queue, with the daemon's way of answering hints and
    of rescanning a polled root."""

    def __init__(self, root: Path, kind: ObserverKind, *, marker: str = "") -> None:
        self.root = root
        self.hints = HintQueue()
        self.seen: list[Hint] = []
        self.rescans = 0
        self.watcher = Watcher(
            [root], self.hints, kind=kind, poll_seconds=POLL_SECONDS, marker=marker
        )
        self.scanner = Scanner([root], marker=marker)
        self.known: dict[str, RunDir] = {}

    def start(self) -> None:
        self.watcher.start()
        for root in self.watcher.watching:  # the daemon's first scan
            self.known.update(self.scan_and_watch(root))

    def scan_and_watch(self, top: str) -> dict[str, RunDir]:
        """The runs at or under `top`; the directories runs appear in, and the runs (none
        settled here), watched, as the daemon watches them."""
        directories: list[str] = []
        runs = self.scanner.scan_subtree(top, directories)
        self.watcher.watch([*directories, *runs], look_again=True)
        return runs

    def rescan(self) -> None:
        self.watcher.sync()
        self.known = dict(self.scanner.scan())
        self.rescans += 1

    def answer(self, hint: Hint) -> dict[str, RunDir | None]:
        """What the daemon learns from one hint: run dirs seen now (None: no longer a run)."""
        if hint.kind is HintKind.RUN:
            run = self.scanner.look(hint.path)
            if run is not None:
                self.watcher.watch([hint.path], look_again=True)
            return {hint.path: run}
        if hint.kind is HintKind.SUBTREE:
            return dict(self.scan_and_watch(hint.path))
        learned: dict[str, RunDir | None] = {}
        for root in self.watcher.sync():
            learned.update(self.scan_and_watch(root))
        return learned

    def until(self, done: Callable[[dict[str, RunDir]], bool]) -> dict[str, RunDir]:
        """Answer hints (or, for a polled root, rescan every POLL_SECONDS) until `done(runs
        known)` or HINT_WAIT_SECONDS; the runs known then."""
        deadline = time.monotonic() + HINT_WAIT_SECONDS
        next_rescan = time.monotonic() + POLL_SECONDS
        while not done(self.known) and time.monotonic() < deadline:
            if self.watcher.polling and time.monotonic() >= next_rescan:
                self.rescan()
                next_rescan = time.monotonic() + POLL_SECONDS
            hint = self.hints.get(timeout=0.05)
            if hint is None:
                continue
            self.seen.append(hint)
            for path, run in self.answer(hint).items():
                if run is None:
                    self.known.pop(path, None)
                else:
                    self.known[path] = run
        return self.known

    def quiet(self) -> list[Hint]:
        """Every hint that arrives within QUIET_SECONDS."""
        deadline, hints = time.monotonic() + QUIET_SECONDS, []
        while (left := deadline - time.monotonic()) > 0:
            hint = self.hints.get(timeout=left)
            if hint is not None:
                hints.append(hint)
        return hints

    def settle(self) -> None:
        """Drain whatever the setup caused."""
        self.quiet()


@pytest.fixture
def watched(tmp_path: Path) -> Iterator[Callable[..., Daemonish]]:
    started: list[Daemonish] = []

    def start(kind: ObserverKind, root: Path | None = None, **kwargs: object) -> Daemonish:
        d = Daemonish(root or tmp_path / "root", kind, **kwargs)  # type: ignore[arg-type]
        d.start()
        started.append(d)
        return d

    yield start
    for d in started:
        d.watcher.stop()


@pytest.mark.parametrize("kind", KINDS)
class TestHints:
    def test_a_run_created_deep_under_the_root_after_start_is_found_from_hints(
        self, tmp_path, watched, kind
    ):
        (tmp_path / "root").mkdir()
        d = watched(kind)

        run = make_run(tmp_path / "root" / "gsm8k--m--h" / "nested" / "deeper" / "run")
        known = d.until(lambda known: str(run) in known)

        assert list(known) == [str(run)]

    def test_trees_made_in_one_go_are_found_from_hints(self, tmp_path, watched, kind):
        # `mkdir -p` then files at once: inotify sees the top directory before it can watch the
        # ones below; the SUBTREE hint's scan (after the watches exist) covers the gap.
        (tmp_path / "root").mkdir()
        d = watched(kind)

        runs = []
        for i in range(5):
            deep = tmp_path / "root" / f"t{i}" / "a" / "b" / "c"
            os.makedirs(deep)
            runs.append(str(make_run(deep / "run")))
        known = d.until(lambda known: set(runs) <= set(known))

        assert sorted(known) == sorted(runs)
        assert sorted(d.scanner.scan()) == sorted(runs)  # and the rescan, the truth, agrees

    def test_a_run_under_a_name_that_is_not_utf8_is_found_from_hints(self, tmp_path, watched, kind):
        (tmp_path / "root").mkdir()
        d = watched(kind)

        run = make_run(tmp_path / "root" / os.fsdecode(b"caf\xe9--\xff") / "run")
        known = d.until(lambda known: str(run) in known)

        assert list(known) == [str(run)]
        assert os.fsencode(next(iter(known))).endswith(b"/caf\xe9--\xff/run")

    def test_a_line_appended_to_a_trace_file_gives_a_run_hint_for_its_directory(
        self, tmp_path, watched, kind
    ):
        run = make_run(tmp_path / "root" / "run")
        d = watched(kind)
        d.settle()

        with (run / "traces.jsonl").open("ab") as f:
            f.write(b'{"id": "1"}\n')
        known = d.until(lambda known: str(run) in known and known[str(run)].size > 0)

        assert known[str(run)].size == 12
        if kind is ObserverKind.INOTIFY:
            assert Hint(HintKind.RUN, str(run)) in d.seen
        else:  # a polled root gives no hints: the rescan saw it
            assert d.seen == [] and d.rescans >= 1

    def test_the_marker_appearing_gives_a_run_hint(self, tmp_path, watched, kind):
        run = make_run(tmp_path / "root" / "run")
        d = watched(kind, marker=".done")
        d.settle()

        (run / ".done").write_text("")
        known = d.until(lambda known: str(run) in known and known[str(run)].marker)

        assert known[str(run)].marker

    def test_a_run_deleted_is_learned_as_gone(self, tmp_path, watched, kind):
        run = make_run(tmp_path / "root" / "run")
        d = watched(kind)
        d.settle()
        assert str(run) in d.known

        (run / "traces.jsonl").unlink()
        known = d.until(lambda known: str(run) not in known)

        assert str(run) not in known
        if kind is ObserverKind.INOTIFY:
            assert Hint(HintKind.RUN, str(run)) in d.seen
        assert d.scanner.look(str(run)) is None

    def test_a_symlink_out_of_the_root_gives_no_hint_about_what_it_points_to(
        self, tmp_path, watched, kind
    ):
        outside = make_run(tmp_path / "outside" / "run")
        root = tmp_path / "root"
        root.mkdir()
        (root / "link").symlink_to(tmp_path / "outside")
        (root / "run-link").symlink_to(outside)
        d = watched(kind)
        d.settle()

        with (outside / "traces.jsonl").open("ab") as f:
            f.write(b"1\n")
        make_run(tmp_path / "outside" / "new-run")
        hints = d.quiet()

        assert hints == []
        assert d.scanner.look(root / "link" / "run") is None
        assert d.scanner.scan() == {}

    def test_a_changed_eval_log_and_the_daemons_own_reads_give_no_hint(
        self, tmp_path, watched, kind
    ):
        run = make_run(tmp_path / "root" / "run", data=b"1\n2\n")
        d = watched(kind)
        d.settle()

        for _ in range(20):
            (run / "traces.jsonl").read_bytes()
        (run / "eval.log").write_text("working\n")

        assert d.quiet() == []

    def test_a_root_created_after_start_is_waited_for_then_watched(self, tmp_path, watched, kind):
        root = tmp_path / "later" / "outputs"
        d = watched(kind, root)
        assert (d.watcher.watching, d.watcher.waiting_for) == ({}, [str(root)])

        run = make_run(root / "t--m--h" / "run")  # the root and a run in it, in one go
        known = d.until(lambda known: str(run) in known)

        assert list(known) == [str(run)]
        assert d.watcher.watching == {str(root): kind}
        assert d.watcher.waiting_for == []

    def test_a_root_deleted_then_made_again_is_watched_again(self, tmp_path, watched, kind):
        root = tmp_path / "root"
        make_run(root / "first")
        d = watched(kind)

        for path in sorted(root.rglob("*"), reverse=True):
            path.rmdir() if path.is_dir() else path.unlink()
        root.rmdir()
        d.until(lambda _known: d.watcher.waiting_for == [str(root)])
        assert d.watcher.watching == {}

        run = make_run(root / "second")
        known = d.until(lambda known: str(run) in known)

        assert list(known) == [str(run)]
        assert d.watcher.watching == {str(root): kind}


class TestWatches:
    """What is watched besides the roots (`Watches`, the daemon's choice), on real directories."""

    def test_a_finalized_run_holds_no_watch_and_a_04_runs_own_directories_are_let_go(
        self, tmp_path
    ):
        root, group = tmp_path / "root", tmp_path / "root" / "env--m--h"
        group.mkdir(parents=True)
        watcher = Watcher([root], HintQueue(), kind=ObserverKind.INOTIFY)
        scanner = Scanner([root])
        settled: set[str] = set()
        watches = Watches(watcher, scanner, settled.__contains__)
        watcher.start()
        try:
            watches.rescanned(scanner.rescan())  # the first walk
            assert watcher.directories == [str(group)]

            # verifiers 0.4 makes these before its first line: the hint its directory gave is
            # answered before any rescan sees it, so all of it is watched (not a run yet)
            run = group / "run"
            for below in ("configs/resolved", "logs/attempt_1"):
                (run / below).mkdir(parents=True)
            (run / "configs" / "resolved" / "eval.json").write_text("{}")
            watches.subtree(str(run), lambda _runs: None)
            below = [
                run / "configs",
                run / "configs/resolved",
                run / "logs",
                run / "logs/attempt_1",
            ]
            assert sorted(watcher.directories) == sorted(map(str, [group, run, *below]))

            (run / "traces.jsonl").write_bytes(b'{"id": "1"}\n')  # its first line: a run now
            watches.rescanned(scanner.rescan())
            assert sorted(watcher.directories) == [str(group), str(run)]  # being written

            settled.add(str(run))  # finalized
            watches.rescanned(scanner.rescan())
            assert watcher.directories == [str(group)]
        finally:
            watcher.stop()

    def test_a_directory_made_during_a_rescan_after_it_passed_its_parent_stays_watched(
        self, tmp_path
    ):
        # A rescan of a big tree takes several turns (a budget each). A group made after it
        # listed the root is watched on its hint's word but unknown to the scanner until the
        # next rescan: dropping it then would leave its new runs to that rescan, a minute on.
        root = tmp_path / "root"
        for i in range(3):
            (root / f"g{i}").mkdir(parents=True)
        watcher = Watcher([root], HintQueue(), kind=ObserverKind.INOTIFY)
        scanner = Scanner([root])
        watches = Watches(watcher, scanner, lambda _path: False)
        watcher.start()
        try:
            rescan = scanner.rescan(budget=1)  # the root listed; its groups left to the next
            watches.rescanned(rescan)
            group = root / "new--group"
            group.mkdir()
            watches.subtree(str(group), lambda _runs: None)  # the hint its making gave
            while not rescan.over:
                rescan = scanner.rescan(budget=1)
                watches.rescanned(rescan)

            assert str(group) in watcher.directories
            watches.rescanned(scanner.rescan())  # the next rescan finds it: still watched
            assert str(group) in watcher.directories
        finally:
            watcher.stop()

    def test_a_run_made_in_a_group_between_its_listing_and_its_watch_is_looked_for_again(
        self, tmp_path
    ):
        # A turn of the first walk lists thousands of directories before they are watched: a
        # run made in one meanwhile gives no event, and the next rescan is a minute on.
        root = tmp_path / "root"
        busy, idle = root / "busy--m--h", root / "idle--m--h"
        for group in (busy, idle):
            group.mkdir(parents=True)
            os.utime(group, ns=(0, time.time_ns() - 60 * 10**9))  # not listed again as racy
        hints = HintQueue()
        watcher = Watcher([root], hints, kind=ObserverKind.INOTIFY)
        scanner = Scanner([root])
        watches = Watches(watcher, scanner, lambda _path: False)
        watcher.start()
        try:
            rescan = scanner.rescan()  # the groups listed...
            make_run(busy / "run")  # ...a run made in one...
            watches.rescanned(rescan)  # ...and then they are watched
            asked = list(iter(lambda: hints.get(0), None))
        finally:
            watcher.stop()

        assert asked == [Hint(HintKind.SUBTREE, str(busy))]  # not the group left alone

    def test_a_tree_moved_in_is_walked_once_and_a_run_made_in_it_meanwhile_gives_its_event(
        self, tmp_path
    ):
        # Each directory is watched before it is listed: no look again at each afterwards,
        # which walked a tree moved in once more per level above each of its runs.
        root, outside = tmp_path / "root", tmp_path / "outside" / "top"
        root.mkdir()
        group = root / "top" / "a" / "b" / "env--m--h"
        make_run(outside / "a" / "b" / "env--m--h" / "run1")
        hints = HintQueue()
        watcher = Watcher([root], hints, kind=ObserverKind.INOTIFY)
        watches = Watches(watcher, Scanner([root]), lambda _path: False)
        watcher.start()
        try:
            outside.rename(root / "top")
            moved_in = hints.get(HINT_WAIT_SECONDS)
            assert moved_in == Hint(HintKind.SUBTREE, str(root / "top"))

            def seen(_runs: dict[str, RunDir]) -> None:
                make_run(group / "run2")  # made once the walk has passed its group

            watches.subtree(moved_in.path, seen)  # the daemon's answer to its hint
            first = hints.get(HINT_WAIT_SECONDS)
            rest = list(iter(lambda: hints.get(QUIET_SECONDS), None))
        finally:
            watcher.stop()

        assert [first, *rest] == [Hint(HintKind.SUBTREE, str(group / "run2"))]

    def test_a_watched_directory_deleted_and_made_again_is_watched_again(self, tmp_path, watched):
        group = tmp_path / "root" / "env--m--h"
        group.mkdir(parents=True)
        d = watched(ObserverKind.INOTIFY)
        d.settle()
        assert d.watcher.directories == [str(group)]

        group.rmdir()
        group.mkdir()
        again = Hint(HintKind.SUBTREE, str(group))
        d.until(lambda _known: again in d.seen)  # the hint its making gave, answered
        run = make_run(group / "run")  # only a watch on the new directory tells of it
        known = d.until(lambda known: str(run) in known)

        assert list(known) == [str(run)]
        assert str(group) in d.watcher.directories


def test_an_overflow_of_inotifys_queue_is_said_once_and_asks_for_one_rescan(tmp_path, monkeypatch):
    """The kernel drops events past its queue (IN_Q_OVERFLOW); watchdog tells every watch. The
    overflow is put through watchdog's own inotify instance, as its reader hands it on: an
    overflow cannot be had on demand on a shared machine."""
    from watchdog.observers.inotify_c import InotifyConstants, InotifyEvent

    from evalpush.discover import _watch

    made = []

    def keep(new=_watch._new_inotify):
        made.append(new())
        return made[-1]

    monkeypatch.setattr(_watch, "_new_inotify", keep)
    groups = [tmp_path / f"g{i}" for i in range(5)]
    for group in groups:
        group.mkdir()
    hints = HintQueue()
    watcher = Watcher([tmp_path], hints, kind=ObserverKind.INOTIFY)
    watcher.start()
    try:
        watcher.watch([str(g) for g in groups])
        with capture_logs() as logs:
            made[0].handle_event(InotifyEvent(-1, InotifyConstants.IN_Q_OVERFLOW, 0, b""))
    finally:
        watcher.stop()

    overflows = [e for e in logs if "overflowed" in e["event"]]
    assert len(overflows) == 1 and overflows[0]["log_level"] == "warning"
    assert hints.get(0) == Hint(HintKind.RESCAN, "")
    assert hints.get(0) is None


class TestLifecycle:
    @pytest.mark.parametrize("kind", KINDS)
    def test_stop_joins_every_thread_and_releases_every_inotify_watch(self, tmp_path, kind):
        for i in range(20):
            make_run(tmp_path / "root" / f"d{i}" / "run")
        before = set(threading.enumerate())
        watches_before = inotify_watches_in_use()
        watcher = Watcher([tmp_path / "root", tmp_path / "missing"], HintQueue(), kind=kind)

        watcher.start()
        groups = [str(tmp_path / "root" / f"d{i}") for i in range(20)]
        newly = watcher.watch(groups)
        running = set(threading.enumerate()) - before
        watching = inotify_watches_in_use() - watches_before
        watcher.stop()

        # polling starts no thread at all: the daemon's loop rescans
        assert bool(running) == (kind is ObserverKind.INOTIFY)
        assert all(thread.daemon for thread in running)
        assert all(not thread.is_alive() for thread in running)
        assert inotify_watches_in_use() == watches_before
        # inotify: the root, the 20 directories asked for (not the runs below them), and the
        # missing root's parent; a polled root watches nothing
        assert watching == (22 if kind is ObserverKind.INOTIFY else 0)
        assert newly == (groups if kind is ObserverKind.INOTIFY else [])

    def test_a_root_made_while_its_parents_watch_is_being_set_up_is_still_found(self, tmp_path):
        # `mkdir -p` racing a sync: the root appears after the sync saw it missing and before
        # the watch on its parent exists, so no event ever tells of it.
        root = tmp_path / "not" / "yet" / "outputs"
        made: list[Path] = []

        class Racing(Watcher):
            def _add(self, path, role):
                if not made:  # the first watch is the one on the missing root's parent
                    made.append(make_run(root / "t--m--h" / "run"))
                return super()._add(path, role)

        d = Daemonish(root, ObserverKind.INOTIFY)
        d.watcher = Racing([root], d.hints, kind=ObserverKind.INOTIFY)
        d.start()
        try:
            known = d.until(lambda known: str(made[0]) in known and bool(d.watcher.watching))
            watching = d.watcher.watching
        finally:
            d.watcher.stop()

        assert list(known) == [str(made[0])]
        assert watching == {str(root): ObserverKind.INOTIFY}

    def test_nothing_is_watched_and_no_thread_starts_before_start(self, tmp_path):
        before = set(threading.enumerate())

        watcher = Watcher([tmp_path], HintQueue())

        assert set(threading.enumerate()) == before
        assert watcher.watching == {}
        watcher.stop()  # harmless

    def test_a_root_symlink_pointed_elsewhere_moves_the_watch_at_the_next_sync(self, tmp_path):
        (tmp_path / "disk-a").mkdir()
        (tmp_path / "disk-b").mkdir()
        (tmp_path / "outputs").symlink_to(tmp_path / "disk-a")
        watcher = Watcher([tmp_path / "outputs"], HintQueue(), kind=ObserverKind.INOTIFY)
        watcher.start()
        try:
            before = watcher.watching
            (tmp_path / "outputs").unlink()
            (tmp_path / "outputs").symlink_to(tmp_path / "disk-b")
            newly = watcher.sync()
            after = watcher.watching
        finally:
            watcher.stop()

        assert before == {str(tmp_path / "disk-a"): ObserverKind.INOTIFY}
        assert (newly, after) == (
            [str(tmp_path / "disk-b")],
            {str(tmp_path / "disk-b"): ObserverKind.INOTIFY},
        )

    def test_the_watcher_is_built_from_the_watch_and_runs_sections(self, tmp_path):
        watch = WatchConfig(roots=[tmp_path], observer="polling", poll_seconds=7)
        watcher = Watcher.from_config(watch, RunsConfig(marker=".ok"), HintQueue())

        assert (watcher.roots, watcher.kind, watcher.poll_seconds) == (
            [tmp_path],
            ObserverKind.POLLING,
            7,
        )

    def test_a_hint_sink_that_fails_is_logged_and_later_hints_still_arrive(self, tmp_path, watched):
        class FlakySink:
            def __init__(self) -> None:
                self.queue, self.failed = HintQueue(), False

            def put(self, hint: Hint) -> None:
                if not self.failed:
                    self.failed = True
                    raise RuntimeError("sink is full")
                self.queue.put(hint)

        (tmp_path / "root").mkdir()
        sink = FlakySink()
        watcher = Watcher([tmp_path / "root"], sink, kind=ObserverKind.INOTIFY)
        with capture_logs() as logs:
            watcher.start()
            try:
                first = make_run(tmp_path / "root" / "first")
                second = make_run(tmp_path / "root" / "second")
                deadline, paths = time.monotonic() + HINT_WAIT_SECONDS, set()
                while str(second) not in paths and time.monotonic() < deadline:
                    hint = sink.queue.get(timeout=0.05)
                    paths |= {hint.path} if hint else set()
            finally:
                watcher.stop()

        assert str(second) in paths and sink.failed
        assert "could not hand a filesystem event on as a hint" in [e["event"] for e in logs]
        assert first.exists()

    def test_auto_watches_a_root_on_a_network_filesystem_by_polling(self, tmp_path):
        nfs, local = tmp_path / "nfs", tmp_path / "local"
        nfs.mkdir()
        local.mkdir()
        watcher = Watcher(
            [nfs, local], HintQueue(), on_network_filesystem=lambda path: path == str(nfs)
        )
        watcher.start()
        try:
            watching = watcher.watching
        finally:
            watcher.stop()

        assert watching == {str(nfs): ObserverKind.POLLING, str(local): ObserverKind.INOTIFY}


needs_namespaces = pytest.mark.skipif(
    not limited_namespaces_available(),
    reason="unshare --user cannot lower inotify limits on this machine",
)


def make_tree(root: Path, directories: int) -> None:
    for i in range(directories):
        (root / f"d{i}" / "sub").mkdir(parents=True)


@needs_namespaces
class TestInotifyLimits:
    def test_auto_falls_back_to_polling_at_the_watch_limit_and_says_how_to_raise_it(self, tmp_path):
        make_tree(tmp_path / "root", 100)  # 201 directories against a limit of 50 watches

        result = run_limited(tmp_path / "root", kind="auto", max_watches=50)

        assert result["watching"] == {str(tmp_path / "root"): "polling"}
        [warning] = [e for e in result["events"] if e["log_level"] == "warning"]
        assert warning["event"] == "inotify cannot be used; watching by polling instead"
        assert "fs.inotify.max_user_watches = 50" in warning["reason"]
        assert "sysctl -w fs.inotify.max_user_watches=" in warning["reason"]
        assert result["found"] == [str(tmp_path / "root" / "late" / "run")]
        assert result["threads"] == []

    def test_auto_falls_back_to_polling_when_no_inotify_instance_can_be_made(self, tmp_path):
        make_tree(tmp_path / "root", 2)

        result = run_limited(tmp_path / "root", kind="auto", max_instances=0)

        assert result["watching"] == {str(tmp_path / "root"): "polling"}
        [warning] = [e for e in result["events"] if e["log_level"] == "warning"]
        assert "fs.inotify.max_user_instances = 0" in warning["reason"]
        assert result["found"] == [str(tmp_path / "root" / "late" / "run")]

    def test_forced_inotify_that_cannot_start_is_a_config_error_and_leaves_no_thread(
        self, tmp_path
    ):
        make_tree(tmp_path / "root", 2)

        result = run_limited(tmp_path / "root", kind="inotify", max_instances=0)

        assert result["error"].startswith("watch.observer = 'inotify', but inotify cannot be used")
        assert "fs.inotify.max_user_instances = 0" in result["error"]
        assert result["threads"] == []

    def test_forced_inotify_past_its_watch_limit_says_so_once_and_the_rescans_find_the_runs(
        self, tmp_path
    ):
        """The directories to watch outnumber the watches the kernel allows: a forced `inotify`
        keeps what it could watch, says once which limit and how to raise it, and leaves the
        rest to the rescans (`auto` polls instead: the test above)."""
        make_tree(tmp_path / "root", 100)

        result = run_limited(tmp_path / "root", kind="inotify", max_watches=50)

        assert result["error"] is None
        assert result["watching"] == {str(tmp_path / "root"): "inotify"}
        assert result["watched"] == 49  # the root holds the 50th
        [error] = [e for e in result["events"] if e["log_level"] == "error"]
        assert error["event"].startswith("inotify limit reached: some directories are not watched")
        assert "fs.inotify.max_user_watches = 50" in error["reason"]
        assert result["found"] == [str(tmp_path / "root" / "late" / "run")]
        assert result["threads"] == []


PAST_THE_LIMIT = OSError(errno.ENOSPC, "inotify watch limit reached")


class Refusing(Watcher):
    """A watcher whose new watches the kernel refuses: `refusals` maps a path ("*": any) to
    the error `_add` raises for it, as for inotify's watch limit (ENOSPC) or a directory this
    process may not read (EACCES), without a namespace or another user."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.refusals: dict[str, OSError] = {}

    def _add(self, path, role):
        refusal = self.refusals.get(path, self.refusals.get("*"))
        if refusal is not None:
            raise refusal
        return super()._add(path, role)


class TestLimitsOnceRunning:
    def test_forced_inotify_past_its_limit_when_a_root_appears_goes_on_and_scans_that_root(
        self, tmp_path
    ):
        root, later = tmp_path / "root", tmp_path / "later"
        root.mkdir()
        watcher = Refusing([root, later], HintQueue(), kind=ObserverKind.INOTIFY)
        watcher.start()
        try:
            watcher.refusals["*"] = PAST_THE_LIMIT  # the watches went to the directories under root
            later.mkdir()
            with capture_logs() as logs:
                newly = watcher.sync()  # on the hint its making gave, or at a rescan
                again = watcher.sync()
        finally:
            watcher.stop()

        assert newly == [str(later)]  # scanned by the daemon, and by every rescan from now on
        assert again == []  # not tried again at each sync (no hint loop)
        [error] = [e for e in logs if e["log_level"] == "error"]
        assert error["event"].startswith("inotify limit reached: some directories are not watched")

    def test_auto_falling_back_to_polling_once_running_asks_for_a_rescan_now(self, tmp_path):
        # The daemon's next rescan was timed for inotify (a minute on); polling begins now.
        group = tmp_path / "root" / "env--m--h"
        group.mkdir(parents=True)
        hints = HintQueue()
        watcher = Refusing([tmp_path / "root"], hints, kind=ObserverKind.AUTO)
        watcher.start()
        try:
            watcher.refusals["*"] = PAST_THE_LIMIT
            watcher.watch([str(group)])
            watching = watcher.watching
        finally:
            watcher.stop()

        assert watching == {str(tmp_path / "root"): ObserverKind.POLLING}
        assert Hint(HintKind.RESCAN, "") in iter(lambda: hints.get(0), None)


@pytest.mark.parametrize("kind", [ObserverKind.AUTO, ObserverKind.INOTIFY])
def test_a_root_it_may_not_read_leaves_inotify_to_the_others_and_is_watched_once_it_may(
    tmp_path, kind
):
    # Not a reason to poll every root (auto), nor to refuse to run (forced): the scanner says
    # the root cannot be read; each sync tries its watch again (no event tells of a chmod).
    readable, unreadable = tmp_path / "readable", tmp_path / "unreadable"
    readable.mkdir()
    unreadable.mkdir()
    watcher = Refusing([readable, unreadable], HintQueue(), kind=kind)
    watcher.refusals[str(unreadable)] = PermissionError(errno.EACCES, "Permission denied")
    watcher.start()
    try:
        watching = watcher.watching
        assert watcher.sync() == []
        del watcher.refusals[str(unreadable)]  # chmod: it may be read now
        newly = watcher.sync()
    finally:
        watcher.stop()

    assert watching == {str(readable): ObserverKind.INOTIFY, str(unreadable): ObserverKind.INOTIFY}
    assert newly == [str(unreadable)]  # scanned by the daemon now that it is watched


def test_forcing_inotify_where_it_works_watches_with_inotify(tmp_path):
    watcher = Watcher([tmp_path], HintQueue(), kind="inotify")
    watcher.start()
    try:
        assert watcher.watching == {str(tmp_path): ObserverKind.INOTIFY}
    finally:
        watcher.stop()


def test_a_config_error_from_start_is_raised_before_any_thread_is_left(tmp_path, monkeypatch):
    # Where user namespaces are not allowed, the same refusal by a real observer factory.
    def refuse() -> None:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr("evalpush.discover._watch._new_inotify", refuse)
    before = set(threading.enumerate())

    with pytest.raises(ConfigError, match="watch.observer = 'inotify'"):
        Watcher([tmp_path], HintQueue(), kind="inotify").start()

    assert set(threading.enumerate()) == before
