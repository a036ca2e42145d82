"""Hints: what a filesystem event says about where to look, and the queue they wait in."""

from __future__ import annotations

import enum
import os
import threading
from typing import Protocol

import msgspec
from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
)

# The events that can change what discover or readiness sees (the watcher asks watchdog for
# these only). Not opens, or closes without a write: the daemon's own reads of traces.jsonl
# would come back as events. Not attribute changes.
FILE_EVENTS = (
    FileCreatedEvent,
    FileModifiedEvent,
    FileClosedEvent,
    FileDeletedEvent,
    FileMovedEvent,
)
DIRECTORY_EVENTS = (DirCreatedEvent, DirDeletedEvent, DirMovedEvent)
EVENTS = [*FILE_EVENTS, *DIRECTORY_EVENTS]


class HintKind(enum.StrEnum):
    RUN = "run"  # something readiness depends on changed in this directory: `Scanner.look` it
    SUBTREE = "subtree"  # a directory appeared here: `Scanner.scan_subtree` it
    ROOT = "root"  # this root appeared, vanished or moved: `Watcher.sync`, then scan it
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


def hints_for(event: FileSystemEvent, names: frozenset[str]) -> list[Hint]:
    """The hints one watchdog event gives: pure, cheap, no I/O (it runs in watchdog's thread).

    `names` are the file names readiness depends on (config, trace files, the marker).
    """
    src = os.fsdecode(event.src_path)
    dest = os.fsdecode(event.dest_path) if event.dest_path else ""
    if event.is_directory:
        if isinstance(event, DirCreatedEvent):
            return [Hint(HintKind.SUBTREE, src)]
        if isinstance(event, DirDeletedEvent):
            return [Hint(HintKind.RUN, src)]
        if isinstance(event, DirMovedEvent):
            hints = [Hint(HintKind.RUN, src)]
            return hints + [Hint(HintKind.SUBTREE, dest)] if dest else hints
        return []
    if not isinstance(event, FILE_EVENTS):
        return []
    return [
        Hint(HintKind.RUN, os.path.dirname(path))
        for path in (src, dest)
        if path and os.path.basename(path) in names
    ]
