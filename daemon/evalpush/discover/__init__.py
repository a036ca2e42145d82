"""The discover stage: which run directories exist under the watched roots, and hints of change.

Two parts. Neither reads a trace line; both only tell the caller where to look.

`Scanner` is the truth. `scan()` walks every root and returns each run directory (`config.toml`
plus `traces.jsonl`, or the legacy `results.jsonl`, both regular files) with its cheap facts
(`RunDir`): the trace file's device, inode, size and mtime, and whether the marker file exists.
It does one `scandir` per directory and one `lstat` per run, never follows a symlink, never
descends into a run directory, and opens no file (10,000 runs: about 0.15 s of CPU,
`bench/scan.py`). The daemon calls `rescan()` every `watch.rescan_seconds`: the same walk the
first time, then only what changed (`Rescan`: the runs it looked at, the runs gone): a directory
whose mtime has not moved is not listed again, and a run directory the caller's `Settled` holds
settled (a finalized run) is not looked at, nor paid for; a slow sweep looks at every directory
fully once per `watch.sweep_seconds`, a slice at each rescan (`bench/scan.py`). A root that does
not exist yet is reported once and picked up when it appears. `look()` and `scan_subtree()`
answer a hint by looking at one directory or one subtree, after checking that the path lies
inside a root with no symlink on the way.

`Watcher` gives hints for low latency. It holds inotify watches (watchdog's `InotifyFD`), one
per directory and for its entries only: on the roots, and on the directories its caller names
(`watch()`). `Watches` is the daemon's choice of them, kept in line with each rescan: the
directories that hold no run (where new runs appear) and the runs not settled; `scan_subtree()`
and `Rescan` say which directories are not runs. It turns
each event into a `Hint` put into a `HintSink` (a `HintQueue` holds each distinct hint once):
`RUN` (a file a run's readiness depends on changed in this directory: look at it), `SUBTREE` (a
directory appeared: scan it), `ROOT` (a root appeared, vanished or moved: call `sync()`, then
scan what it returns), `RESCAN` (inotify's queue overflowed: events were lost). Nothing else
happens in watchdog's threads. Hints can be lost (inotify drops events on overflow and misses
files created in a new directory before its watch exists: a directory is watched before it is
listed, or looked at once more), and a settled run's directory has no watch, which is why the
rescan (with its sweep) is the truth.

`watch.observer`: `inotify` forces inotify through watchdog (`ConfigError` from `start()` if
inotify cannot be used; a root it may not read is watched once it may; the watch limit reached
later, under a root or by a root that appears, is logged once as an error, and the rescans find
what the missing watches would have shown); `polling` gives no hints: the daemon rescans
every `watch.poll_seconds` instead of every `watch.rescan_seconds` (changes made on another
host of an NFS or CIFS share never reach this host's inotify; watchdog's PollingObserver would
stat every file, about 4.5 times the CPU of the scan's walk);
`auto` uses inotify except for roots on a network filesystem,
and falls back to polling, saying so once with the limit and how to raise it, when inotify is
unavailable or its watch limit is reached (and asks for a rescan at once: a `RESCAN` hint).

Paths are `str`: absolute, under each root's real path (symlinks in a root's own path
resolved), as `evalpush push` names runs, so both name a run the same way (and 10,000 `Path`
objects would double a rescan's cost). Names that are not UTF-8 arrive surrogate-escaped and
are never encoded strictly; `printable()` makes them safe to log.

Threads: `start()`, `sync()`, `watch()`, `unwatch()` and `stop()` are called from one thread,
the caller's. The watcher's threads (watchdog's inotify reader and its dispatcher, two
whatever the number of watches) are daemon threads; `stop()` stops and joins them.
"""

from evalpush.discover._hints import Hint, HintKind, HintQueue, HintSink, hints_for
from evalpush.discover._inotify import (
    filesystem_type,
    inotify_watches_in_use,
    on_network_filesystem,
)
from evalpush.discover._scan import (
    Rescan,
    RunDir,
    Scanner,
    Settled,
    SweepShare,
    look_at,
    printable,
    walk,
)
from evalpush.discover._watch import ObserverKind, Watcher
from evalpush.discover._watches import Watches
from evalpush.discover.check import refuse_relative_roots, watch_verdicts

__all__ = [
    "Hint",
    "HintKind",
    "HintQueue",
    "HintSink",
    "ObserverKind",
    "Rescan",
    "RunDir",
    "Scanner",
    "Settled",
    "SweepShare",
    "Watcher",
    "Watches",
    "filesystem_type",
    "hints_for",
    "inotify_watches_in_use",
    "look_at",
    "on_network_filesystem",
    "printable",
    "walk",
    "refuse_relative_roots",
    "watch_verdicts",
]
