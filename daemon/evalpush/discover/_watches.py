"""Which directories the watcher watches: where new runs appear, and the runs still changing."""

from __future__ import annotations

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
    Each directory newly watched on a hint's word is looked at once more (a SUBTREE hint): what
    was made in it between the look that found it and its watch gave no event.
    """

    def __init__(self, watcher: Watcher, scanner: Scanner, settled: Callable[[str], bool]) -> None:
        self._watcher = watcher
        self._scanner = scanner
        self._settled = settled

    def subtree(self, top: str, seen: Callable[[dict[str, RunDir]], None]) -> None:
        """A directory that appeared (or a root): its runs to `seen`, then what in it is worth
        watching, watched."""
        directories: list[str] = []
        runs = self._scanner.scan_subtree(top, directories)
        seen(runs)
        self._watcher.watch(directories, look_again=True)
        self.runs(runs)

    def runs(self, paths: Iterable[str]) -> None:
        """Watch the run directories among `paths` that are not settled."""
        self._watcher.watch([path for path in paths if not self._settled(path)], look_again=True)

    def rescanned(self, rescan: Rescan) -> None:
        """After (a part of) a rescan: what it found watched, what is gone and the runs settled
        since let go. Once a rescan is over the scanner knows every directory, so a watch a hint
        set up on one it does not know (inside a run directory: a 0.4 run's `configs/`, made
        before its first line) is let go too."""
        watcher, scanner = self._watcher, self._scanner

        def stale(path: str) -> bool:
            if self._settled(path):
                return True
            return rescan.over and not (scanner.knows(path) or scanner.knows_directory(path))

        watcher.unwatch([*rescan.left, *rescan.gone])
        watcher.watch(rescan.directories)
        self.runs(rescan.runs)
        watcher.unwatch([path for path in watcher.directories if stale(path)])
