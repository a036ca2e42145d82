"""The watcher: watchdog observers over the roots, each event turned into hints, nothing more."""

from __future__ import annotations

import enum
import errno
import os
import stat
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
from watchdog.events import (
    DirCreatedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers.api import BaseObserver, ObservedWatch

from evalpush.config import RunsConfig, WatchConfig
from evalpush.core.errors import ConfigError
from evalpush.discover import _inotify
from evalpush.discover._hints import EVENTS, Hint, HintKind, HintSink, hints_for
from evalpush.discover._inotify import describe_inotify_error, probe_inotify
from evalpush.discover._scan import inside, printable, resolve
from evalpush.log import get_logger
from evalpush.runs import CONFIG_FILE, LEGACY_TRACES_FILE, TRACES_FILE


class ObserverKind(enum.StrEnum):
    AUTO = "auto"
    INOTIFY = "inotify"
    POLLING = "polling"


class _RunEvents(FileSystemEventHandler):
    """Events under a watched root: hints for runs, and ROOT when the root itself is deleted."""

    def __init__(self, watcher: Watcher) -> None:
        self._watcher = watcher

    def dispatch(self, event: FileSystemEvent) -> None:
        self._watcher._deliver(event, parent_watch=False)


class _RootEvents(FileSystemEventHandler):
    """Events in the nearest existing parent of a missing root: ROOT when it may have appeared."""

    def __init__(self, watcher: Watcher) -> None:
        self._watcher = watcher

    def dispatch(self, event: FileSystemEvent) -> None:
        self._watcher._deliver(event, parent_watch=True)


class _Watched(msgspec.Struct, frozen=True):
    identity: tuple[int, int]  # (device, inode) of the root directory when its watch began
    kind: ObserverKind  # INOTIFY or POLLING
    watch: ObservedWatch | None  # inotify's; None for a polled root


class Watcher:
    """Hints from inotify (watchdog) over the roots (see the package docstring).

    Roots are watched at their real paths (symlinks in a root's own path resolved), and hints
    carry real paths, as `Scanner` reports them. `start()` watches every root that exists and
    waits for every root that does not (inotify on its nearest existing parent). A root to be
    polled gives no hints: `polling` says so, and the daemon rescans every `poll_seconds`.
    `sync()` (call it on a ROOT hint and at every rescan) watches roots that appeared,
    re-watches a root that was replaced, waits again for one that vanished, probes the inotify
    limit, and returns the roots it began to watch: scan those, since what was created in them
    before their watch gave no event. `stop()` joins every thread. No I/O and no thread before
    `start()`.
    """

    def __init__(
        self,
        roots: Sequence[Path],
        hints: HintSink,
        *,
        kind: ObserverKind | str = ObserverKind.AUTO,
        poll_seconds: float = WatchConfig().poll_seconds,
        marker: str = "",
        log: Any = None,
        on_network_filesystem: Callable[[str], bool] | None = None,
    ) -> None:
        self.roots = list(roots)
        self.kind = ObserverKind(kind)
        self.poll_seconds = poll_seconds
        self._hints = hints
        self._names = frozenset({CONFIG_FILE, TRACES_FILE, LEGACY_TRACES_FILE, marker} - {""})
        self._log = log if log is not None else get_logger(stage="discover")
        self._on_network_fs = on_network_filesystem or _inotify.on_network_filesystem
        self._inotify: BaseObserver | None = None
        self._watched: dict[str, _Watched] = {}  # real root path -> its watch
        self._parents: dict[str, ObservedWatch] = {}  # inotify watches on missing roots' parents
        # Read by watchdog's threads: immutable, swapped whole.
        self._watched_roots: frozenset[str] = frozenset()
        self._missing_roots: tuple[str, ...] = ()
        self._inotify_failed = False  # auto fell back to polling; not tried again
        self._limit_reported = False

    @classmethod
    def from_config(cls, watch: WatchConfig, runs: RunsConfig, hints: HintSink) -> Watcher:
        return cls(
            watch.roots,
            hints,
            kind=watch.observer,
            poll_seconds=watch.poll_seconds,
            marker=runs.marker,
        )

    # -- the caller's thread ------------------------------------------------------------------

    def start(self) -> None:
        try:
            self.sync()
        except BaseException:
            self.stop()
            raise

    def sync(self) -> list[str]:
        """Bring the watches in line with the roots as they are now; the roots newly watched."""
        fell_back = self._inotify_failed
        newly = self._sync_once()
        if self._inotify_failed and not fell_back:  # inotify failed during this sync
            newly = [*newly, *(p for p in self._sync_once() if p not in newly)]
        return newly

    def stop(self) -> None:
        """Stop inotify's observer and join all its threads."""
        self._stop_inotify()
        self._watched.clear()
        self._parents.clear()
        self._missing_roots = ()
        self._published()

    def __enter__(self) -> Watcher:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    @property
    def watching(self) -> dict[str, ObserverKind]:
        """Each watched root (real path) and how it is watched, for the log and `status`."""
        return {real: watched.kind for real, watched in self._watched.items()}

    @property
    def polling(self) -> bool:
        """Whether a root is (or, once it exists, will be) watched by polling: by the daemon's
        rescan every `poll_seconds`, since no event comes from it."""
        return any(w.kind is ObserverKind.POLLING for w in self._watched.values()) or any(
            self._kind_for(real) is ObserverKind.POLLING for real in self._missing_roots
        )

    @property
    def waiting_for(self) -> list[str]:
        """The roots (real paths) that do not exist yet."""
        return list(self._missing_roots)

    # -- watches ------------------------------------------------------------------------------

    def _sync_once(self) -> list[str]:
        reals = list(dict.fromkeys(resolve(root) for root in self.roots))
        for real in [r for r in self._watched if r not in reals]:  # a root symlink moved
            self._unwatch(real)
        newly, missing = [], []
        for real in reals:
            identity = _directory_identity(real)
            current = self._watched.get(real)
            if current is not None and (identity != current.identity or not self._alive(current)):
                self._unwatch(real)
                current = None
            if current is None and identity is not None and self._watch_root(real, identity):
                newly.append(real)
            elif real not in self._watched:
                missing.append(real)
        self._missing_roots = tuple(missing)
        self._await_missing()
        self._published()
        self._check_inotify_limit()
        return newly

    def _published(self) -> None:
        self._watched_roots = frozenset(self._watched)

    def _kind_for(self, real: str) -> ObserverKind:
        if self.kind is not ObserverKind.AUTO:
            return self.kind
        if self._inotify_failed or self._on_network_fs(real):
            return ObserverKind.POLLING
        return ObserverKind.INOTIFY

    def _watch_root(self, real: str, identity: tuple[int, int]) -> bool:
        kind = self._kind_for(real)
        watch = None
        if kind is not ObserverKind.POLLING:
            watch = self._schedule(_RunEvents(self), real, recursive=True)
            if watch is None:
                return False
        self._watched[real] = _Watched(identity, kind, watch)
        self._log.info("watching root", root=printable(real), observer=str(kind))
        return True

    def _schedule(
        self, handler: FileSystemEventHandler, path: str, *, recursive: bool
    ) -> ObservedWatch | None:
        """A new inotify watch; None when `path` vanished first or inotify just failed (auto)."""
        try:
            if self._inotify is None:
                self._inotify = _new_inotify_observer()
                self._inotify.start()
            return self._inotify.schedule(handler, path, recursive=recursive, event_filter=EVENTS)
        except (FileNotFoundError, NotADirectoryError):
            return None  # gone again since it was looked at
        except OSError as exc:
            self._inotify_unavailable(exc)
            return None

    def _unwatch(self, real: str) -> None:
        watched = self._watched.pop(real)
        if watched.watch is not None:
            self._unschedule(watched.watch)
        self._log.info("stopped watching root (gone, replaced or moved)", root=printable(real))

    def _unschedule(self, watch: ObservedWatch) -> None:
        observer = self._inotify
        if observer is not None and any(emitter.watch == watch for emitter in observer.emitters):
            observer.unschedule(watch)

    def _alive(self, watched: _Watched) -> bool:
        # An inotify emitter stops by itself when its root is deleted (DELETE_SELF); a polled
        # root that vanished is found by the identity check.
        if watched.watch is None:
            return True
        observer = self._inotify
        return observer is not None and any(
            emitter.watch == watched.watch and emitter.is_alive() for emitter in observer.emitters
        )

    def _await_missing(self) -> None:
        """Watch for each missing root to appear: inotify on its nearest existing parent (a
        polled one is found by the next rescan's `sync()`)."""
        polled = {r for r in self._missing_roots if self._kind_for(r) is ObserverKind.POLLING}
        planned = {
            real: _nearest_existing_parent(real)
            for real in self._missing_roots
            if real not in polled
        }
        wanted = set(planned.values()) - {None}
        for parent in [p for p in self._parents if p not in wanted]:
            self._unschedule(self._parents.pop(parent))
        for parent in wanted - self._parents.keys():
            assert parent is not None
            watch = self._schedule(_RootEvents(self), parent, recursive=False)
            if watch is not None:  # else the next sync or rescan finds the root
                self._parents[parent] = watch
        # A directory on a root's way made while its parent's watch was being set up (`mkdir
        # -p` racing this sync) gave no event: look again, and hint so a sync moves on.
        for real, parent in planned.items():
            if _directory_identity(real) is not None or _nearest_existing_parent(real) != parent:
                self._hints.put(Hint(HintKind.ROOT, real))

    def _stop_inotify(self) -> None:
        observer, self._inotify = self._inotify, None
        if observer is not None:
            observer.stop()  # unschedules: stops and joins the emitters and inotify's reader
            if observer.is_alive():
                observer.join()

    # -- inotify limits -----------------------------------------------------------------------

    def _inotify_unavailable(self, exc: OSError) -> None:
        reason = describe_inotify_error(exc)
        if self.kind is ObserverKind.INOTIFY:
            raise ConfigError(f"watch.observer = 'inotify', but inotify cannot be used: {reason}")
        self._inotify_failed = True
        self._log.warning(
            "inotify cannot be used; watching by polling instead",
            reason=reason,
            poll_seconds=self.poll_seconds,
        )
        self._stop_inotify()
        self._watched = {r: w for r, w in self._watched.items() if w.watch is None}
        self._parents.clear()

    def _check_inotify_limit(self) -> None:
        # watchdog refuses a tree it cannot watch whole at start, but a directory made later
        # whose watch the kernel refuses is only a line in its own logger: when one more watch
        # fails now, some directory may already have gone unwatched.
        on_inotify = [r for r, w in self._watched.items() if w.kind is ObserverKind.INOTIFY]
        if not on_inotify or self._limit_reported:
            return
        error = probe_inotify(on_inotify[0])
        if error is None or error.errno not in (errno.ENOSPC, errno.EMFILE):
            return
        if self.kind is ObserverKind.AUTO:
            self._inotify_unavailable(error)
            return
        self._limit_reported = True
        self._log.error(
            "inotify limit reached: some directories may not be watched; every rescan still finds their runs",
            reason=describe_inotify_error(error),
        )

    # -- watchdog's threads -------------------------------------------------------------------

    def _deliver(self, event: FileSystemEvent, *, parent_watch: bool) -> None:
        # Runs in a watchdog dispatcher thread: only turn the event into hints and hand them on.
        try:
            hints = self._root_hints(event, parent_watch)
            if not parent_watch:
                hints += hints_for(event, self._names)
            for hint in hints:
                self._hints.put(hint)
        except Exception:
            self._log.exception(
                "could not hand a filesystem event on as a hint", fs_event=repr(event)
            )

    def _root_hints(self, event: FileSystemEvent, parent_watch: bool) -> list[Hint]:
        if not event.is_directory:
            return []
        touched = [os.fsdecode(p) for p in (event.src_path, event.dest_path) if p]
        if parent_watch:
            # A root appears when it, or a directory on its way, is created or moved into place.
            return [
                Hint(HintKind.ROOT, real)
                for real in self._missing_roots
                if any(inside(real, path) for path in touched)
            ]
        if isinstance(event, DirCreatedEvent):
            return []
        return [Hint(HintKind.ROOT, path) for path in touched if path in self._watched_roots]


def _new_inotify_observer() -> BaseObserver:
    try:
        from watchdog.observers.inotify import InotifyObserver
    except Exception as exc:  # not Linux, or a libc without inotify
        raise OSError(errno.ENOSYS, f"inotify is not available here ({exc})") from None
    observer = InotifyObserver()
    observer.name = "evalpush-watch-inotify"
    return observer


def _directory_identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None


def _nearest_existing_parent(path: str) -> str | None:
    parent = os.path.dirname(path)
    while not os.path.isdir(parent):
        if os.path.dirname(parent) == parent:
            return None
        parent = os.path.dirname(parent)
    return parent
