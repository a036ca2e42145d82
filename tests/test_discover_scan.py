"""Discover's scan (the truth), its look at one hinted place, and the pure parts of hints."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Set as AbstractSet
from pathlib import Path

import pytest
from structlog.testing import capture_logs
from watchdog.observers.inotify_c import InotifyConstants as IN
from watchdog.observers.inotify_c import InotifyEvent

from as_nobody import without_read_access
from evalpush.discover import (
    Hint,
    HintKind,
    HintQueue,
    Scanner,
    SweepShare,
    filesystem_type,
    hints_for,
    printable,
    walk,
)
from evalpush.runs import find_run_dirs, is_run_dir
from support.runs import make_run

RUN_UUID = "6f1c9a52-0d3e-4b7a-9c1e-2f8d4a6b3c10"


def paths(found: dict[str, object]) -> list[str]:
    return sorted(found)


class TestScan:
    def test_runs_are_found_at_any_depth_with_their_trace_files_facts(self, tmp_path):
        shallow = make_run(tmp_path / RUN_UUID, data=b"1\n")
        deep = make_run(tmp_path / "a" / "b" / "c" / "run", data=b"1\n2\n")
        (tmp_path / "a" / "not-a-run").mkdir()

        found = Scanner([tmp_path]).scan()

        assert paths(found) == sorted([str(deep), str(shallow)])
        run = found[str(deep)]
        st = os.lstat(deep / "traces.jsonl")
        assert (run.traces_name, run.device, run.inode, run.size, run.mtime_ns) == (
            "traces.jsonl",
            st.st_dev,
            st.st_ino,
            4,
            st.st_mtime_ns,
        )
        assert run.traces == deep / "traces.jsonl" and run.directory == deep

    def test_the_legacy_results_file_counts_and_traces_jsonl_wins_when_both_exist(self, tmp_path):
        legacy = make_run(tmp_path / "legacy", traces="results.jsonl")
        both = make_run(make_run(tmp_path / "both", traces="results.jsonl"))

        found = Scanner([tmp_path]).scan()

        assert found[str(legacy)].traces_name == "results.jsonl"
        assert found[str(both)].traces_name == "traces.jsonl"

    @pytest.mark.parametrize(
        "spoil",
        [
            lambda d: (d / "config.toml").unlink(),
            lambda d: (d / "traces.jsonl").unlink(),
            lambda d: _swap_for_symlink(d / "config.toml"),
            lambda d: _swap_for_symlink(d / "traces.jsonl"),
            lambda d: ((d / "traces.jsonl").unlink(), (d / "traces.jsonl").mkdir()),
            lambda d: ((d / "traces.jsonl").unlink(), os.mkfifo(d / "traces.jsonl")),
            lambda d: ((d / "config.toml").unlink(), (d / "config.toml").mkdir()),
            lambda d: None,
        ],
        ids=[
            "no config",
            "no traces",
            "config is a symlink",
            "traces is a symlink",
            "traces is a directory",
            "traces is a fifo",
            "config is a directory",
            "a proper run",
        ],
    )
    def test_a_run_directory_is_what_the_runs_stage_says_it_is(self, tmp_path, spoil):
        run = make_run(tmp_path / "root" / "run")
        spoil(run)

        found = Scanner([tmp_path / "root"]).scan()

        assert (str(run) in found) == is_run_dir(run)
        assert paths(found) == [str(p) for p in find_run_dirs(tmp_path / "root")]

    def test_a_run_directory_is_not_descended_into(self, tmp_path):
        outer = make_run(tmp_path / "outer")
        make_run(outer / "inner")

        assert paths(Scanner([tmp_path]).scan()) == [str(outer)]

    def test_a_root_that_is_itself_a_run_is_the_one_run(self, tmp_path):
        root = make_run(tmp_path / RUN_UUID)

        assert paths(Scanner([root]).scan()) == [str(root)]

    def test_symlinks_to_directories_are_never_followed_in_or_out_of_the_root(self, tmp_path):
        root = tmp_path / "root"
        inside = make_run(root / "inside")
        outside = make_run(tmp_path / "outside" / "run")
        (root / "to-outside").symlink_to(tmp_path / "outside")
        (root / "to-outside-run").symlink_to(outside)
        (root / "to-inside-run").symlink_to(inside)
        (root / "loop").symlink_to(root)

        assert paths(Scanner([root]).scan()) == [str(inside)]

    def test_a_root_given_through_a_symlink_reports_real_paths_as_push_does(self, tmp_path):
        real = tmp_path / "disk" / "outputs"
        run = make_run(real / "t--m--h" / RUN_UUID)
        (tmp_path / "outputs").symlink_to(real)

        found = Scanner([tmp_path / "outputs"]).scan()

        assert paths(found) == [str(run)]
        assert paths(found) == [str(p) for p in find_run_dirs((tmp_path / "outputs").resolve())]

    def test_names_that_are_not_utf8_are_scanned_and_keep_their_bytes(self, tmp_path):
        odd = os.fsdecode(b"caf\xe9--\xff\xfe")
        run = make_run(tmp_path / odd / "run\udcff")

        found = Scanner([tmp_path]).scan()

        assert paths(found) == [str(run)]
        assert os.fsencode(next(iter(found))).endswith(b"/caf\xe9--\xff\xfe/run\xff")
        assert printable(next(iter(found))).endswith("/caf\\xe9--\\xff\\xfe/run\\xff")

    def test_names_with_newlines_spaces_and_dashes_are_just_names(self, tmp_path):
        run = make_run(tmp_path / "-rf --all" / "line\nbreak" / " spaced run ")

        assert paths(Scanner([tmp_path]).scan()) == [str(run)]

    def test_the_marker_counts_only_when_configured_and_a_regular_file(self, tmp_path):
        marked = make_run(tmp_path / "marked")
        (marked / ".done").write_text("")
        linked = make_run(tmp_path / "linked")
        (linked / ".done").symlink_to(marked / ".done")
        plain = make_run(tmp_path / "plain")

        with_marker = Scanner([tmp_path], marker=".done").scan()
        without = Scanner([tmp_path]).scan()

        assert [with_marker[str(d)].marker for d in (marked, linked, plain)] == [True, False, False]
        assert not any(run.marker for run in without.values())

    def test_many_roots_are_scanned_and_a_run_under_two_roots_is_reported_once(self, tmp_path):
        one = make_run(tmp_path / "a" / "run")
        two = make_run(tmp_path / "b" / "run")

        found = Scanner([tmp_path / "a", tmp_path / "b", tmp_path]).scan()

        assert paths(found) == sorted([str(one), str(two)])


def _swap_for_symlink(path: Path) -> None:
    target = path.with_name(path.name + ".real")
    path.rename(target)
    path.symlink_to(target)


class TestRoots:
    def test_a_missing_root_is_waited_for_said_once_and_picked_up_when_it_appears(self, tmp_path):
        root = tmp_path / "later" / "outputs"
        scanner = Scanner([root])

        with capture_logs() as logs:
            first, second = scanner.scan(), scanner.scan()
            missing = scanner.missing_roots
            run = make_run(root / "run")
            third, fourth = scanner.scan(), scanner.scan()

        assert (first, second, missing) == ({}, {}, [root])
        assert paths(third) == paths(fourth) == [str(run)]
        assert scanner.missing_roots == []
        assert [(e["event"], e["root"]) for e in logs] == [
            ("watch root does not exist yet; waiting for it", str(root)),
            ("watch root appeared", str(root)),
        ]

    def test_a_root_that_is_a_file_is_waited_for_like_a_missing_one(self, tmp_path):
        (tmp_path / "outputs").write_text("not a directory")

        with capture_logs() as logs:
            found = Scanner([tmp_path / "outputs"]).scan()

        assert found == {}
        assert [e["event"] for e in logs] == ["watch root is not a directory; waiting for one"]


def test_a_root_the_daemon_may_not_enter_is_said_to_be_so_not_missing(open_dir):
    locked = open_dir / "home"
    make_run(locked / "alice" / "outputs" / "run")

    def scan() -> list[str]:
        with capture_logs() as logs:
            Scanner([locked / "alice" / "outputs"]).scan()
        return [e["event"] for e in logs]

    events = without_read_access(locked, scan)

    assert events == ["watch root cannot be reached (permission denied); waiting for access"]


def test_an_unreadable_directory_is_reported_once_and_the_rest_is_scanned(open_dir):
    readable = make_run(open_dir / "readable")
    for part in (open_dir / "readable", readable):
        part.chmod(0o755)
    (readable / "config.toml").chmod(0o644)
    locked = open_dir / "locked"
    make_run(locked / "hidden-run")

    def scan_twice() -> tuple[list[str], list[str]]:
        scanner = Scanner([open_dir])
        with capture_logs() as logs:
            found = paths(scanner.scan())
            scanner.scan()
        return found, [f"{e['event']}: {e.get('directory')}" for e in logs]

    found, events = without_read_access(locked, scan_twice)

    assert found == [str(readable)]
    assert events == [
        f"cannot read a directory under a watch root; runs in it are not seen: {locked}"
    ]


class TestLook:
    def test_look_gives_a_run_directorys_facts_now(self, tmp_path):
        run = make_run(tmp_path / "run", data=b"1\n")
        scanner = Scanner([tmp_path])

        before = scanner.look(run)
        with (run / "traces.jsonl").open("ab") as f:
            f.write(b"2\n")
        after = scanner.look(str(run))

        assert before is not None and after is not None
        assert (before.size, after.size, before.inode) == (2, 4, after.inode)

    @pytest.mark.parametrize(
        "where",
        [
            lambda tmp: tmp / "root" / "not-a-run",
            lambda tmp: tmp / "root" / "gone",
            lambda tmp: tmp / "elsewhere" / "run",
            lambda tmp: tmp / "root" / "link" / "run",
            lambda tmp: tmp / "root" / "inside" / ".." / ".." / "elsewhere" / "run",
        ],
        ids=["not a run", "gone", "outside every root", "through a symlink", "dot-dot out"],
    )
    def test_look_and_scan_subtree_answer_nothing_outside_a_root_or_for_a_non_run(
        self, tmp_path, where
    ):
        root = tmp_path / "root"
        (root / "not-a-run").mkdir(parents=True)
        make_run(root / "inside" / "run")
        make_run(tmp_path / "elsewhere" / "run")
        (root / "link").symlink_to(tmp_path / "elsewhere")
        scanner = Scanner([root])

        assert scanner.look(where(tmp_path)) is None
        assert scanner.scan_subtree(where(tmp_path)) == {}

    def test_scan_subtree_finds_the_runs_of_a_new_directory_tree(self, tmp_path):
        runs = [make_run(tmp_path / "new" / "x" / f"run{i}") for i in range(3)]
        make_run(tmp_path / "other" / "run")

        found = Scanner([tmp_path]).scan_subtree(tmp_path / "new")

        assert paths(found) == sorted(str(r) for r in runs)

    def test_walking_a_directory_that_is_gone_yields_nothing(self, tmp_path):
        errors: list[str] = []

        found = list(walk(str(tmp_path / "gone"), on_error=lambda d, e: errors.append(d)))

        assert (found, errors) == ([], [])


class Clock:
    """The scanner's clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def backdate(root: Path) -> None:
    """Every directory at and under `root` an hour old: older than a listing trusts."""
    old = (os.stat(root).st_mtime_ns - 3600 * 10**9,) * 2
    for directory, _subdirs, _files in os.walk(root):
        os.utime(directory, ns=old)


class Settling:
    """What the daemon's tracker tells a rescan: these run directories are settled."""

    def __init__(self, paths: set[str] | None = None, *, everything: bool = False) -> None:
        self.paths = set(paths or ())
        self.everything = everything
        self.settled_changes = 0
        self.asked = 0

    def settle(self, path: str) -> None:
        self.paths.add(path)
        self.settled_changes += 1

    def unsettled(self, paths: AbstractSet[str]) -> AbstractSet[str]:
        self.asked += 1
        return set() if self.everything else paths - self.paths


quiet_all = Settling(everything=True)
"""Every run settled: none needs a look at each rescan."""


class TestRescan:
    def test_the_first_rescan_finds_every_run_and_a_rescan_with_nothing_changed_finds_none(
        self, tmp_path
    ):
        runs = [make_run(tmp_path / f"env{i % 2}--m--h" / f"run{i}") for i in range(4)]
        scanner = Scanner([tmp_path])

        first = scanner.rescan(quiet_all)
        backdate(tmp_path)
        second = scanner.rescan(quiet_all)

        assert first.complete and paths(first.runs) == sorted(str(r) for r in runs)
        assert first.runs == Scanner([tmp_path]).scan()
        assert (second.complete, second.runs, second.gone) == (False, {}, [])

    def test_the_settled_runs_are_asked_for_again_only_when_they_or_the_runs_found_changed(
        self, tmp_path
    ):
        # A set difference over a million runs is a fifth of a second: an idle daemon's rescans
        # must not pay it when nothing changed.
        first = make_run(tmp_path / "env--m--h" / "first", data=b"1\n")
        scanner = Scanner([tmp_path])
        settling = Settling()
        scanner.rescan(settling)  # the first walk
        settling.settle(str(first))
        assert list(scanner.rescan(settling).runs) == []  # asked: settled now
        asked = settling.asked

        scanner.rescan(settling)
        assert settling.asked == asked  # nothing changed: not asked

        second = make_run(tmp_path / "env--m--h" / "second", data=b"1\n")
        assert list(scanner.rescan(settling).runs) == [str(second)]  # found: new
        assert list(scanner.rescan(settling).runs) == [str(second)]  # asked again: unsettled
        assert settling.asked == asked + 1
        settling.settle(str(second))
        assert list(scanner.rescan(settling).runs) == []
        assert settling.asked == asked + 2

    def test_a_run_that_is_not_quiet_is_looked_at_every_rescan_with_its_facts_now(self, tmp_path):
        settled = make_run(tmp_path / "env--m--h" / "settled", data=b"1\n")
        waiting = make_run(tmp_path / "env--m--h" / "waiting", data=b"1\n")
        scanner = Scanner([tmp_path])
        scanner.rescan()
        backdate(tmp_path)

        with (waiting / "traces.jsonl").open("ab") as f:
            f.write(b"2\n")
        again = scanner.rescan(Settling({str(settled)}))

        assert list(again.runs) == [str(waiting)]
        assert again.runs[str(waiting)].size == 4

    def test_new_and_vanished_runs_are_found_where_a_directorys_mtime_moved(self, tmp_path):
        parent = tmp_path / "env--m--h"
        old = make_run(parent / "old")
        deep = make_run(tmp_path / "a" / "b" / "deep")
        scanner = Scanner([tmp_path])
        scanner.rescan(quiet_all)
        backdate(tmp_path)

        new = make_run(parent / "new")
        shutil.rmtree(old)
        shutil.rmtree(tmp_path / "a" / "b")
        changed = scanner.rescan(quiet_all)

        assert paths(changed.runs) == [str(new)]
        assert sorted(changed.gone) == sorted([str(old), str(deep)])

    def test_a_directory_whose_mtime_did_not_move_is_not_listed_again(self, tmp_path):
        parent = tmp_path / "env--m--h"
        make_run(parent / "old")
        backdate(tmp_path)
        scanner = Scanner([tmp_path])
        scanner.rescan(quiet_all)
        remembered = os.stat(parent).st_mtime_ns

        hidden = make_run(parent / "hidden")  # made, then the parent's mtime put back
        os.utime(parent, ns=(remembered, remembered))
        unseen = scanner.rescan(quiet_all)

        assert (unseen.runs, unseen.gone) == ({}, [])
        assert str(hidden) in scanner.scan()  # a full walk sees it

    def test_the_sweep_looks_at_every_directory_once_within_its_period_a_slice_per_rescan(
        self, tmp_path
    ):
        runs = [make_run(tmp_path / f"env{i % 5}--m--h" / f"run{i:02}") for i in range(50)]
        clock = Clock()
        backdate(tmp_path)
        scanner = Scanner([tmp_path], sweep_seconds=100, clock=clock)
        scanner.rescan(quiet_all)
        parent = tmp_path / "env3--m--h"
        remembered = os.stat(parent).st_mtime_ns
        hidden = make_run(parent / "hidden")  # a change no mtime shows
        os.utime(parent, ns=(remembered, remembered))
        late = runs[17] / "traces.jsonl"
        with late.open("ab") as f:
            f.write(b"late\n")

        slices = []
        for _ in range(11):  # the sweep begins at the first, then one every 10 s
            slices.append(paths(scanner.rescan(quiet_all).runs))
            clock.now += 10
        swept = [path for found in slices for path in found]

        assert slices[0] == []  # the rescan that begins the sweep sweeps nothing yet
        assert all(0 < len(found) <= 7 for found in slices[1:])  # no burst
        assert sorted(swept) == sorted(str(r) for r in [*runs, hidden])  # each once
        assert Scanner([tmp_path]).scan()[str(runs[17])].size == late.stat().st_size

    def test_scanners_sharing_the_sweep_each_sweep_their_own_part_and_together_all_of_it(
        self, tmp_path
    ):
        runs = [make_run(tmp_path / f"env{i % 5}--m--h" / f"run{i:02}") for i in range(60)]
        clock = Clock()
        backdate(tmp_path)
        scanners = [  # two daemons over one tree
            Scanner([tmp_path], sweep_seconds=100, clock=clock, share=lambda i=i: SweepShare(i, 2))
            for i in range(2)
        ]
        for scanner in scanners:
            scanner.rescan(quiet_all)

        swept: list[list[str]] = [[], []]
        for _ in range(11):  # one sweep period, a rescan every 10 s
            for i, scanner in enumerate(scanners):
                found = scanner.rescan(quiet_all).runs
                swept[i] += [
                    os.path.relpath(path, scanner._reals[scanner.roots[0]]) for path in found
                ]
            clock.now += 10

        expected = sorted(str(r.relative_to(tmp_path)) for r in runs)
        assert swept[0] and swept[1], "each host sweeps a part"
        assert set(swept[0]).isdisjoint(swept[1]), "no run is swept by both"
        assert sorted(swept[0] + swept[1]) == expected, "together: every run, once"

    def test_a_rescan_with_a_budget_goes_on_where_it_stopped_and_is_complete_once_over(
        self, tmp_path
    ):
        runs = [make_run(tmp_path / f"env{i % 3}--m--h" / f"run{i}") for i in range(9)]
        scanner = Scanner([tmp_path])

        parts = [scanner.rescan(quiet_all, budget=2)]
        while not parts[-1].over:
            parts.append(scanner.rescan(quiet_all, budget=2))
        found = [path for part in parts for path in part.runs]

        assert len(parts) == 7  # 13 directories (the root, 3 parents, 9 runs), 2 a call
        assert sorted(found) == sorted(str(r) for r in runs)  # each once
        assert [part.complete for part in parts] == [False] * 6 + [True]
        assert all(scanner.knows(str(r)) for r in runs)

    def test_runs_handed_back_are_looked_at_again_by_the_next_rescan(self, tmp_path):
        run = make_run(tmp_path / "env--m--h" / "run")
        scanner = Scanner([tmp_path])
        first = scanner.rescan(quiet_all)

        scanner.again(first.runs)

        assert list(scanner.rescan(quiet_all).runs) == [str(run)]
        assert scanner.rescan(quiet_all).runs == {}

    def test_a_root_that_vanishes_takes_its_runs_with_it(self, tmp_path):
        root = tmp_path / "outputs"
        runs = [make_run(root / "env--m--h" / f"run{i}") for i in range(2)]
        scanner = Scanner([root])
        scanner.rescan(quiet_all)

        shutil.rmtree(root)
        with capture_logs():
            after = scanner.rescan(quiet_all)

        assert (after.runs, sorted(after.gone)) == ({}, sorted(str(r) for r in runs))
        assert scanner.remembered == 0

    def test_a_root_symlink_pointed_elsewhere_forgets_the_runs_of_its_old_target(self, tmp_path):
        old, new = tmp_path / "old", tmp_path / "new"
        for target in (old, new):
            make_run(target / "env" / "run")
        root = tmp_path / "root"
        root.symlink_to(old)
        scanner = Scanner([root])
        assert scanner.rescan().complete

        root.unlink()
        root.symlink_to(new)
        rescan = scanner.rescan()

        assert str(new / "env" / "run") in rescan.runs
        assert rescan.gone == [str(old / "env" / "run")]
        assert not scanner.knows(str(old / "env" / "run"))

    @pytest.mark.parametrize("missing", ["its first line", "its resolved config"])
    def test_a_0_4_directory_listed_before_it_was_a_run_is_found_once_it_becomes_one(
        self, missing, tmp_path
    ):
        # Its first line, or configs/resolved/eval.json written a level down, moves no mtime of
        # the run directory: remembered as a plain directory, it would never be listed again.
        run = tmp_path / "root" / "env" / "run"
        (run / "configs" / "resolved").mkdir(parents=True)
        if missing == "its first line":
            (run / "configs" / "resolved" / "eval.json").write_text("{}")
            (run / "traces.jsonl").write_bytes(b"")
        else:
            (run / "traces.jsonl").write_bytes(b"{}\n")
        long_ago = time.time() - 100  # listed long after it was made: out of the racy window
        for directory in (run / "configs" / "resolved", run / "configs", run, *run.parents[:2]):
            os.utime(directory, (long_ago, long_ago))
        scanner = Scanner([tmp_path / "root"])
        assert scanner.rescan().runs == {}

        if missing == "its first line":
            with (run / "traces.jsonl").open("ab") as out:
                out.write(b"{}\n")
        else:
            (run / "configs" / "resolved" / "eval.json").write_text("{}")

        assert str(run) in scanner.rescan().runs


def event_names(hints: list[Hint]) -> list[tuple[str, str]]:
    return [(hint.kind.value, hint.path) for hint in hints]


NAMES = frozenset({"config.toml", "traces.jsonl", "results.jsonl", ".done"})


def event(mask: int, name: bytes) -> InotifyEvent:
    """What inotify reports on a watched directory: its wd, what happened, and to which entry."""
    return InotifyEvent(1, mask, 0, name)


class TestHintsFor:
    @pytest.mark.parametrize(
        "inotify_event, expected",
        [
            (event(IN.IN_MODIFY, b"traces.jsonl"), [("run", "/r/run")]),
            (event(IN.IN_CREATE, b"config.toml"), [("run", "/r/run")]),
            (event(IN.IN_CLOSE_WRITE, b"results.jsonl"), [("run", "/r/run")]),
            (event(IN.IN_DELETE, b"traces.jsonl"), [("run", "/r/run")]),
            (event(IN.IN_CREATE, b".done"), [("run", "/r/run")]),
            (event(IN.IN_MOVED_TO, b"traces.jsonl"), [("run", "/r/run")]),
            (event(IN.IN_MOVED_FROM, b"traces.jsonl"), [("run", "/r/run")]),
            (event(IN.IN_MOVED_FROM, b"traces.jsonl.tmp"), []),
            (event(IN.IN_CREATE | IN.IN_ISDIR, b"new"), [("subtree", "/r/run/new")]),
            (event(IN.IN_MOVED_TO | IN.IN_ISDIR, b"new"), [("subtree", "/r/run/new")]),
            (event(IN.IN_DELETE | IN.IN_ISDIR, b"old"), [("run", "/r/run/old")]),
            (event(IN.IN_MOVED_FROM | IN.IN_ISDIR, b"old"), [("run", "/r/run/old")]),
            (event(IN.IN_MODIFY, b"eval.log"), []),
            (event(IN.IN_CREATE, b"notes.txt"), []),
            (event(IN.IN_ATTRIB | IN.IN_ISDIR, b"sub"), []),
            (event(IN.IN_IGNORED, b""), []),
        ],
        ids=lambda value: repr(value.name) if isinstance(value, InotifyEvent) else "",
    )
    def test_an_event_becomes_the_hints_that_say_where_to_look(self, inotify_event, expected):
        assert event_names(hints_for("/r/run", inotify_event, NAMES)) == expected

    def test_the_marker_is_watched_only_when_configured(self):
        names = frozenset({"config.toml", "traces.jsonl", "results.jsonl"})

        assert hints_for("/r/run", event(IN.IN_CREATE, b".done"), names) == []

    def test_a_name_that_is_not_utf8_arrives_as_the_same_surrogate_escaped_str(self):
        [hint] = hints_for("/r", event(IN.IN_CREATE | IN.IN_ISDIR, b"\xff"), NAMES)

        assert os.fsencode(hint.path) == b"/r/\xff"


class TestHintQueue:
    def test_hints_come_out_in_order_and_one_already_waiting_is_not_queued_again(self):
        queue = HintQueue()
        a, b = Hint(HintKind.RUN, "/r/a"), Hint(HintKind.SUBTREE, "/r/b")
        for hint in (a, b, a, a, b):
            queue.put(hint)

        assert (len(queue), queue.get(0), queue.get(0), queue.get(0)) == (2, a, b, None)

    def test_a_hint_taken_out_can_be_queued_again(self):
        queue = HintQueue()
        hint = Hint(HintKind.RUN, "/r/a")
        queue.put(hint)
        queue.get(0)
        queue.put(hint)

        assert queue.get(0) == hint

    def test_get_waits_for_a_hint_from_another_thread(self):
        queue = HintQueue()
        hint = Hint(HintKind.RUN, "/r/a")
        timer = threading.Timer(0.05, queue.put, args=(hint,))
        timer.start()
        try:
            assert queue.get(timeout=5) == hint
        finally:
            timer.join()

    def test_many_producers_lose_no_distinct_hint(self):
        queue = HintQueue()
        per_thread = 500

        def produce(i: int) -> None:
            for n in range(per_thread):
                queue.put(Hint(HintKind.RUN, f"/r/{n % 50}"))  # shared paths
                queue.put(Hint(HintKind.RUN, f"/t{i}/{n}"))  # this thread's own

        threads = [threading.Thread(target=produce, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        drained = set()
        while (hint := queue.get(0)) is not None:
            drained.add(hint.path)

        assert len(drained) == 50 + 4 * per_thread


MOUNTINFO = """\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
40 22 0:35 / /data rw,relatime shared:20 - ext4 /dev/vdb rw
41 40 0:36 / /data/shared rw,relatime shared:21 - nfs4 server:/export rw,vers=4.2
42 40 0:37 / /data/with\\040space rw,relatime shared:22 - cifs //host/share rw
43 22 0:38 / /data/shared/local rw shared:23 - tmpfs tmpfs rw
"""


@pytest.mark.parametrize(
    "path, fstype",
    [
        ("/home/alice/outputs", "ext4"),
        ("/data/outputs", "ext4"),
        ("/data/shared", "nfs4"),
        ("/data/shared/outputs/run", "nfs4"),
        ("/data/sharedness", "ext4"),
        ("/data/with space/outputs", "cifs"),
        ("/data/shared/local/x", "tmpfs"),
    ],
)
def test_the_filesystem_of_a_path_is_its_longest_mount_point(path, fstype):
    assert filesystem_type(path, MOUNTINFO) == fstype
