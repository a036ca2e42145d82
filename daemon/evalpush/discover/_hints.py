"""Hints: what a filesystem event says about where to look, and the queue they wait in."""

from __future__ import annotations

import enum
import os
import threading
from typing import TYPE_CHECKING, Protocol

import msgspec

from evalpush.discover._inotify import IN_CREATE, IN_DELETE, IN_ISDIR, IN_MOVED_FROM, IN_MOVED_TO

if TYPE_CHECKING:
    from watchdog.observers.inotify_c import InotifyEvent

_APPEARED = IN_CREATE | IN_MOVED_TO
_LEFT = IN_DELETE | IN_MOVED_FROM


class HintKind(enum.StrEnum):
    RUN = "run"  # something readiness depends on changed in this directory: `Scanner.look` it
    SUBTREE = "subtree"  # a directory appeared here: `Scanner.scan_subtree` it
    ROOT = "root"  # this root appeared, vanished or moved: `Watcher.sync`, then scan it
    RESCAN = "rescan"  # events were lost (a queue overflow, a fall back to polling): rescan now
    WAKE = "wake"  # not about a path: the daemon's loop has something else to do (a signal)


class Hint(msgspec.Struct, frozen=True):
    kind: HintKind
    path: str  # real, absolute, like `RunDir.path`


class HintSink(Protocol):
    def put(self, hint: Hint) -> None: ...


class HintQueue:
    """A thread-safe FIFO of hints that holds each distinct hint once.

    A run being written produces an event per appended line; while its hint waits, more of the
    same add nothing, so the queue's length is bounded by the number of distinct paths.
    """

    def __init__(self) -> None:
        self._pending: dict[Hint, None] = {}  # insertion-ordered: FIFO
        self._ready = threading.Condition()

    def put(self, hint: Hint) -> None:
        with self._ready:
            if hint not in self._pending:
                self._pending[hint] = None
                self._ready.notify()

    def get(self, timeout: float | None = None) -> Hint | None:
        """The oldest hint, waiting up to `timeout` seconds for one (None: none came)."""
        with self._ready:
            if not self._pending and not self._ready.wait_for(lambda: self._pending, timeout):
                return None
            hint = next(iter(self._pending))
            del self._pending[hint]
            return hint

    def __len__(self) -> int:
        with self._ready:
            return len(self._pending)


def hints_for(directory: str, event: InotifyEvent, names: frozenset[str]) -> list[Hint]:
    """The hints one inotify event on the watched `directory` gives: pure, cheap, no I/O (it
    runs in watchdog's inotify thread). A directory's own deletion or move gives none here: the
    watcher handles those (`Watcher`), and its parent's watch names it.

    `names` are the file names readiness depends on (config, trace files, the marker).
    """
    if not event.name:
        return []
    path = os.path.join(directory, os.fsdecode(event.name))
    if event.mask & IN_ISDIR:
        if event.mask & _APPEARED:
            return [Hint(HintKind.SUBTREE, path)]
        if event.mask & _LEFT:
            return [Hint(HintKind.RUN, path)]
        return []
    if os.path.basename(path) in names:
        return [Hint(HintKind.RUN, directory)]
    return []
