"""Which directories the watcher watches: where new runs appear, and the runs still changing."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

from evalpush.discover._scan import Rescan, RunDir, Scanner
from evalpush.discover._watch import Watcher


class Watches:
    """The daemon's choice of watches, kept in line with what the scan finds.

    Watched: the roots (the watcher's own), every directory the scan found that holds no run
    (an env/model directory: where new runs appear), and every run directory that is not
    `settled` (being written, waiting, uploading). A settled run (finalized and unchanged, or in
    another final state) holds no watch: the rescan's slow sweep looks inside it instead, so a
    tree of a million finished runs costs a watch per directory that holds runs, not per run.
    What was made in a directory between the look that found it and its watch gives no event:
    a subtree a hint points to is watched a directory at a time before each is listed; a run a
    hint's look found is looked at once more once watched (a SUBTREE hint); a directory a
    rescan found, only if its mtime moved since the rescan listed it (a turn of the first walk
    lists thousands before they are watched).
    """

    def __init__(self, watcher: Watcher, scanner: Scanner, settled: Callable[[str], bool]) -> None:
        self._watcher = watcher
        self._scanner = scanner
        self._settled = settled
        # Watched on a hint's word since the last rescan was over: the rescan under way may
        # have passed their parent before they were made, so the next one judges them.
        self._on_hints: set[str] = set()

    def subtree(self, top: str, seen: Callable[[dict[str, RunDir]], None]) -> None:
        """A directory that appeared (or a root): its runs to `seen`, and what in it is worth
        watching, watched. Each directory is watched before it is listed, so what is made in it
        meanwhile is listed or gives an event (a look again at each, once watched, would walk
        a tree moved in once more per level above each run); then let go unless it holds no
        run, or is a run not settled."""
        watched: list[str] = []
        directories: list[str] = []
        runs = self._scanner.scan_subtree(
            top, directories, lambda path: watched.extend(self._watcher.watch([path]))
        )
        seen(runs)
        keep = {*directories, *(path for path in runs if not self._settled(path))}
        self._watcher.unwatch([path for path in watched if path not in keep])
        self._on_hints.update(path for path in watched if path in keep)

    def runs(self, paths: Iterable[str]) -> None:
        """Watch the run directories among `paths` that are not settled (a hint's)."""
        self._on_hints.update(self._watch_unsettled(paths))

    def rescanned(self, rescan: Rescan) -> None:
        """After (a part of) a rescan: what it found watched, what is gone let go, and once the
        rescan is over the runs settled since let go too. Once a rescan is over the scanner knows every directory that was there
        when it began, so a watch a hint set up on one it does not know (inside a run directory:
        a 0.4 run's `configs/`, made before its first line) is let go too. One a hint set up
        since the last rescan was over may be on a directory the rescan passed by before it was
        made (a group made after the root was listed): let go now only if it lies inside a run
        the scanner knows, else judged by the next rescan."""
        watcher, scanner = self._watcher, self._scanner

        def stale(path: str) -> bool:
            if self._settled(path):
                return True
            if scanner.knows(path) or scanner.knows_directory(path):
                return False
            return path not in self._on_hints or self._inside_a_run(path)

        watcher.unwatch([*rescan.left, *rescan.gone])
        # Listed before they were watched (a turn of the first walk can take a while): what was
        # made in one in between gave no event, but moved its mtime.
        newly = watcher.watch(rescan.directories)
        watcher.look_again([path for path in newly if scanner.moved_since_listed(path)])
        self._watch_unsettled(rescan.runs)
        if rescan.over:
            # Once a pass, not at each of its parts: the first walk over a million runs has
            # five hundred, and a run settled meanwhile may keep its watch until the walk ends.
            watcher.unwatch([path for path in watcher.directories if stale(path)])
            self._on_hints.clear()

    def _inside_a_run(self, path: str) -> bool:
        """Whether a directory above `path` is a run directory the scanner knows."""
        parent = os.path.dirname(path)
        while parent != path:
            if self._scanner.knows(parent):
                return True
            path, parent = parent, os.path.dirname(parent)
        return False

    def _watch_unsettled(self, paths: Iterable[str]) -> list[str]:
        """Watch the run directories among `paths` that are not settled; the ones newly watched."""
        return self._watcher.watch([p for p in paths if not self._settled(p)], look_again=True)
