"""Discover's cost on a tree of 10,000 run directories (the target: an idle daemon under 1% of a core).

    .venv/bin/python bench/scan.py [--runs 10000] [--idle-seconds 60] [--skip-idle] [--skip-watch]
        [--tree bench/.cache/idle-scale/1000000/tree]

Builds (once, in bench/.cache/scan/) the default layout `root/<taskset>--<model>--<harness>/<uuid>/`
with `config.toml`, a small `traces.jsonl` and `eval.log` in each run, 100 runs per parent, then
measures, each in this process with the page cache warm (the daemon's steady state):

1. `Scanner.scan()`: wall and CPU seconds of a full walk, best and median of 5; then
   `Scanner.rescan()` with every run finalized and nothing changed (the daemon's rescan after
   its first walk, which lists only directories whose mtime moved), best and median of 5.
2. `Watcher` with inotify: wall and CPU of `start()` (the root's watch), then of the watches
   the daemon sets up after its first walk with every run finalized (`Watches`: the
   directories that hold runs, no run), the inotify watches held (from /proc/self/fdinfo), the
   process's CPU over `--idle-seconds` of idling, then over as long again with one rescan in
   the middle (the daemon's idle: one rescan every 60 s); then `stop()`.
3. Polling: CPU of one poll by watchdog's PollingObserver (a snapshot of every entry and a
   diff; for comparison, evalpush does not use it). A polled root is what the daemon's rescan,
   every `watch.poll_seconds`, sees (item 1 is one poll); its steady-state share of a core is
   that rescan's CPU over the default `watch.poll_seconds`.

CPU is user + system time of this process (`resource.getrusage`), all threads included.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

from watchdog.utils.dirsnapshot import DirectorySnapshot, DirectorySnapshotDiff

from evalpush.config import WatchConfig
from evalpush.discover import (
    HintQueue,
    ObserverKind,
    Scanner,
    Watcher,
    Watches,
    inotify_watches_in_use,
)

CACHE = Path(__file__).resolve().parent / ".cache" / "scan"
RUNS_PER_PARENT = 100
CONFIG = 'model = "org/model"\nnum_tasks = 1\nnum_rollouts = 1\n[taskset]\nid = "gsm8k"\n'
TRACE_LINE = b'{"id": "r0", "task": {"idx": 0}, "nodes": []}\n'


def build_tree(runs: int) -> Path:
    root = CACHE / f"runs-{runs}"
    done = root / ".complete"
    if done.exists():
        return root
    for i in range(runs):
        parent = root / f"task{i // RUNS_PER_PARENT}--org--model--harness"
        run = parent / str(uuid.UUID(int=i))
        run.mkdir(parents=True, exist_ok=True)
        (run / "config.toml").write_text(CONFIG)
        (run / "traces.jsonl").write_bytes(TRACE_LINE)
        (run / "eval.log").write_text("done\n")
    done.write_text("")
    return root


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    wall, cpu = time.perf_counter(), cpu_seconds()
    result = fn()
    return time.perf_counter() - wall, cpu_seconds() - cpu, result


def bench_scan(root: Path, runs: int) -> None:
    scanner = Scanner([root])
    samples = []
    for _ in range(5):
        wall, cpu, found = measure(scanner.scan)
        assert len(found) == runs, f"scan found {len(found)} runs, expected {runs}"
        samples.append((wall, cpu))
    walls, cpus = [w for w, _ in samples], [c for _, c in samples]
    print(
        f"scan of {runs:,} run dirs: wall best {min(walls):.3f} s median {statistics.median(walls):.3f} s; "
        f"CPU best {min(cpus):.3f} s median {statistics.median(cpus):.3f} s"
    )
    settled = set(scanner.rescan().runs)  # the daemon's first walk; then every run is finalized
    samples = []
    for _ in range(5):
        wall, cpu, found = measure(lambda: scanner.rescan(AllSettled(settled)))
        assert not found.gone, f"a rescan found {len(found.gone)} runs gone"
        samples.append((wall, cpu))
    walls, cpus = [w for w, _ in samples], [c for _, c in samples]
    print(
        f"rescan of {runs:,} finalized run dirs, nothing changed: wall best {min(walls):.3f} s "
        f"median {statistics.median(walls):.3f} s; CPU best {min(cpus):.3f} s "
        f"median {statistics.median(cpus):.3f} s"
    )


class AllSettled:
    """The daemon's tracker with every run finalized, as a rescan asks it (`Settled`)."""

    def __init__(self, settled: set[str]) -> None:
        self.settled = settled
        self.settled_changes = 0

    def unsettled(self, paths: AbstractSet[str]) -> AbstractSet[str]:
        return paths - self.settled


def idle(seconds: float, mid: Callable[[], Any] | None = None) -> float:
    """Process CPU seconds over `seconds` of sleeping, calling `mid` once halfway."""
    start = cpu_seconds()
    time.sleep(seconds / 2)
    if mid is not None:
        mid()
    time.sleep(seconds / 2)
    return cpu_seconds() - start


def bench_inotify(root: Path, runs: int, idle_seconds: float) -> None:
    threads = threading.active_count()
    watcher = Watcher([root], HintQueue(), kind=ObserverKind.INOTIFY)
    scanner = Scanner([root])
    first = scanner.rescan()  # the daemon's first walk; then every run is finalized
    settled = set(first.runs)
    watches = Watches(watcher, scanner, settled.__contains__)
    wall, cpu, _ = measure(watcher.start)
    try:
        print(
            f"inotify watcher start on {runs:,} run dirs (the root): wall {wall:.3f} s, "
            f"CPU {cpu:.3f} s; {threading.active_count() - threads} threads"
        )
        wall, cpu, _ = measure(lambda: watches.rescanned(first))
        print(
            f"watches after the first walk, every run finalized: wall {wall:.3f} s, "
            f"CPU {cpu:.3f} s; {inotify_watches_in_use():,} inotify watches "
            "(the root and the directories that hold runs)"
        )
        if idle_seconds:
            alone = idle(idle_seconds)
            print(
                f"idle inotify watcher alone over {idle_seconds:.0f} s: "
                f"CPU {alone:.3f} s = {100 * alone / idle_seconds:.2f}% of a core"
            )
            used = idle(
                idle_seconds,
                lambda: watches.rescanned(scanner.rescan(AllSettled(settled))),
            )
            print(
                f"idle with inotify over {idle_seconds:.0f} s, one rescan included: "
                f"CPU {used:.3f} s = {100 * used / idle_seconds:.2f}% of a core"
            )
    finally:
        watcher.stop()


def bench_polling(root: Path, runs: int) -> None:
    first = DirectorySnapshot(str(root), stat=os.lstat)
    wall, cpu, _ = measure(
        lambda: DirectorySnapshotDiff(first, DirectorySnapshot(str(root), stat=os.lstat))
    )
    print(
        f"watchdog's PollingObserver, one poll of {runs:,} run dirs ({len(first.paths):,} "
        f"entries: snapshot + diff): wall {wall:.3f} s, CPU {cpu:.3f} s"
    )
    scanner = Scanner([root])
    cpu = min(measure(scanner.scan)[1] for _ in range(3))
    poll_seconds = WatchConfig().poll_seconds
    print(
        f"evalpush polling: a rescan every {poll_seconds:.0f} s, CPU best {cpu:.3f} s a rescan = "
        f"{100 * cpu / poll_seconds:.2f}% of a core in steady state"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--skip-idle", action="store_true", help="no idle measurements")
    parser.add_argument(
        "--skip-watch", action="store_true", help="no watcher or polling (a tree over the limit)"
    )
    parser.add_argument(
        "--tree",
        type=Path,
        help="measure this tree of --runs runs instead of building one (bench/idle_scale.py's)",
    )
    args = parser.parse_args()
    idle_seconds = 0.0 if args.skip_idle else args.idle_seconds
    wall, _cpu, root = measure(lambda: args.tree or build_tree(args.runs))
    print(f"tree: {root} ({wall:.1f} s to make or find)")
    bench_scan(root, args.runs)
    if not args.skip_watch:
        bench_inotify(root, args.runs, idle_seconds)
        bench_polling(root, args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
