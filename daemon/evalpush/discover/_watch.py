"""The watcher: inotify watches (watchdog's) on the directories worth watching, each event
turned into hints, nothing more."""

from __future__ import annotations

import enum
import errno
import os
import stat
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evalpush.config import RunsConfig, WatchConfig
from evalpush.core.errors import ConfigError
from evalpush.discover import _inotify
from evalpush.discover._hints import Hint, HintKind, HintSink, hints_for
from evalpush.discover._inotify import (
    IN_CREATE,
    IN_DELETE_SELF,
    IN_ISDIR,
    IN_MOVE_SELF,
    IN_MOVED_TO,
    WATCH_MASK,
    describe_inotify_error,
)
from evalpush.discover._scan import inside, printable, resolve
from evalpush.log import get_logger
from evalpush.runs import CONFIG_FILE, LEGACY_TRACES_FILE, TRACES_FILE

if TYPE_CHECKING:
    from watchdog.observers.inotify_c import InotifyEvent, InotifyFD


LOST_SAID_EVERY_SECONDS = 1.0
"""An overflow of inotify's queue is said (and a rescan asked for) at most this often."""

_LIMIT_ERRORS = (errno.ENOSPC, errno.EMFILE)  # inotify's watch or instance limit reached


class ObserverKind(enum.StrEnum):
    AUTO = "auto"
    INOTIFY = "inotify"
    POLLING = "polling"


class _Role(enum.Enum):
    ROOT = "root"  # a watched root: its entries, and itself deleted or moved (ROOT)
    DIRECTORY = "directory"  # a directory under a root the caller asked for: its entries
    PARENT = "parent"  # the nearest existing parent of a missing root: ROOT when it may appear


class _Watch:
    """One inotify watch on one directory, and what its events mean (watchdog's
    `WatchCallback`): called in watchdog's inotify thread, it only hands hints on."""

    __slots__ = ("alive", "path", "role", "wd", "_watcher")

    def __init__(self, watcher: Watcher, path: str, role: _Role) -> None:
        self._watcher = watcher
        self.path = path
        self.role = role
        self.wd = -1
        self.alive = True  # False once the directory is gone or moved: the watch is dropped

    def on_event(self, event: InotifyEvent) -> None:
        self._watcher._deliver(self, event)

    def on_watch_deleted(self, wd: int) -> None:
        self.alive = False

    def on_queue_overflow(self) -> None:
        pass  # on_events_lost says it, once every watch heard of it

    def on_events_lost(self) -> None:
        self._watcher._lost()


class Watcher:
    """Hints from inotify over the roots and the directories worth watching under them (see
    the package docstring).

    Roots are watched at their real paths (symlinks in a root's own path resolved), and hints
    carry real paths, as `Scanner` reports them. Each watch is one inotify watch on one
    directory, for its entries only (never what is below them): `start()` watches every root
    that exists and waits for every root that does not (a watch on its nearest existing
    parent); `watch()` adds the directories the caller wants watched besides (the directories
    new runs appear in and the runs still being written: not the million finished runs, which
    the rescan's sweep looks at instead), `unwatch()` drops them. A root to be polled gives no
    hints: `polling` says so, and the daemon rescans every `poll_seconds`. `sync()` (call it
    on a ROOT hint and at every rescan) watches roots that appeared (and roots inotify could
    not watch before: unreadable, or past its limit), re-watches a root that was replaced,
    waits again for one that vanished, drops the watches of directories that are gone, and
    returns the roots it began to watch: scan those, since what was created in them before
    their watch gave no event. `stop()` joins every thread. No I/O and no thread before
    `start()`.

    inotify is watchdog's (`InotifyFD`: one inotify instance, its reader and dispatcher
    threads, a callback per watch). Its observers are not used: they watch a whole tree or
    start a thread per watched directory, and neither fits a tree of a million finished runs.
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
        self._inotify: InotifyFD | None = None
        self._roots: dict[str, tuple[tuple[int, int], ObserverKind, _Watch | None]] = {}
        # (real root -> (device, inode) when its watch began, how it is watched, its watch)
        self._directories: dict[str, _Watch] = {}  # watched besides the roots
        self._parents: dict[str, _Watch] = {}  # on missing roots' nearest existing parents
        # Read by the inotify thread: immutable, swapped whole.
        self._missing_roots: tuple[str, ...] = ()
        self._inotify_failed = False  # auto fell back to polling; not tried again
        self._limit_reported = False
        self._lost_at = -LOST_SAID_EVERY_SECONDS  # when an overflow was last said (inotify thread)
        self._started = False  # start() is over: forced inotify past its limit no longer refuses

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
        self._started = True

    def sync(self) -> list[str]:
        """Bring the watches in line with the roots as they are now; the roots newly watched."""
        fell_back = self._inotify_failed
        newly = self._sync_once()
        if self._inotify_failed and not fell_back:  # inotify failed during this sync
            newly = [*newly, *(p for p in self._sync_once() if p not in newly)]
        return newly

    def stop(self) -> None:
        """Stop inotify and join its threads."""
        self._stop_inotify()
        self._roots.clear()
        self._directories.clear()
        self._parents.clear()
        self._missing_roots = ()

    def __enter__(self) -> Watcher:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def watch(self, directories: Iterable[str], *, look_again: bool = False) -> list[str]:
        """Watch each of `directories` (real paths) for its entries, those under a root inotify
        watches; the ones newly watched. `look_again`: a hint to look at each one newly
        watched (a SUBTREE hint), for what was made in it between the look that found it and
        its watch. A directory that cannot be watched (gone, unreadable) is left to the
        rescans; so is every one past inotify's watch limit (`auto` then polls instead)."""
        newly: list[str] = []
        on_inotify = [
            real for real, (_, kind, _) in self._roots.items() if kind is ObserverKind.INOTIFY
        ]
        if not on_inotify:
            return newly
        for directory in directories:
            if directory in self._roots:
                continue
            current = self._directories.get(directory)
            if current is not None:
                if current.alive:
                    continue
                self.unwatch([directory])  # gone or moved away: what is there now is watched
            if not any(inside(directory, real) for real in on_inotify):
                continue
            try:
                watch = self._add(directory, _Role.DIRECTORY)
            except OSError as exc:
                if exc.errno in _LIMIT_ERRORS:
                    self._watch_limit(exc)
                    break
                continue  # gone again since it was looked at, or unreadable: the rescan sees it
            self._directories[directory] = watch
            newly.append(directory)
        if look_again:
            self.look_again(newly)
        return newly

    def look_again(self, directories: Iterable[str]) -> None:
        """A hint to look at each of `directories` once more (a SUBTREE hint): what was made in
        it after the look that found it and before its watch gave no event."""
        for directory in directories:
            self._hints.put(Hint(HintKind.SUBTREE, directory))

    def unwatch(self, directories: Iterable[str]) -> None:
        """Stop watching these directories (not the roots)."""
        for directory in directories:
            watch = self._directories.pop(directory, None)
            if watch is not None:
                self._remove(watch)

    @property
    def directories(self) -> list[str]:
        """The directories watched besides the roots."""
        return list(self._directories)

    @property
    def watching(self) -> dict[str, ObserverKind]:
        """Each watched root (real path) and how it is watched, for the log and `status`."""
        return {real: kind for real, (_, kind, _) in self._roots.items()}

    @property
    def polling(self) -> bool:
        """Whether a root is (or, once it exists, will be) watched by polling: by the daemon's
        rescan every `poll_seconds`, since no event comes from it."""
        return any(kind is ObserverKind.POLLING for _, kind, _ in self._roots.values()) or any(
            self._kind_for(real) is ObserverKind.POLLING for real in self._missing_roots
        )

    @property
    def waiting_for(self) -> list[str]:
        """The roots (real paths) that do not exist yet."""
        return list(self._missing_roots)

    # -- watches ------------------------------------------------------------------------------

    def _sync_once(self) -> list[str]:
        reals = list(dict.fromkeys(resolve(root) for root in self.roots))
        for real in [r for r in self._roots if r not in reals]:  # a root symlink moved
            self._unwatch_root(real)
        newly, missing = [], []
        for real in reals:
            identity = _directory_identity(real)
            current = self._roots.get(real)
            if current is not None:
                watch = current[2]
                if identity != current[0] or (watch is not None and not watch.alive):
                    self._unwatch_root(real)
                    current = None
                elif watch is None and current[1] is ObserverKind.INOTIFY:
                    if self._watch_again(real, current[0]):
                        newly.append(real)
            if current is None and identity is not None and self._watch_root(real, identity):
                newly.append(real)
            elif real not in self._roots:
                missing.append(real)
        self._missing_roots = tuple(missing)
        self._await_missing()
        # A directory deleted or moved away: watched again if one is at its path now (made
        # again, or moved back), and looked at again.
        self.watch(
            [d for d, watch in self._directories.items() if not watch.alive], look_again=True
        )
        return newly

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
            watch = self._add_or_fall_back(real, _Role.ROOT)
            if watch is None and (self._inotify_failed or _directory_identity(real) != identity):
                return False  # gone again, or `auto` polls from now on (the caller syncs again)
            # None still: it cannot be read, or forced inotify is past its limit: the rescans
            # cover it, and each sync tries again (no event says when that changes)
        self._roots[real] = (identity, kind, watch)
        self._log.info("watching root", root=printable(real), observer=str(kind))
        return True

    def _watch_again(self, real: str, identity: tuple[int, int]) -> bool:
        """A root inotify could not watch when it was found, tried again: whether it is now."""
        watch = self._add_or_fall_back(real, _Role.ROOT)
        if watch is None:
            return False
        self._roots[real] = (identity, ObserverKind.INOTIFY, watch)
        self._log.info("watching root", root=printable(real), observer=str(ObserverKind.INOTIFY))
        return True

    def _add_or_fall_back(self, path: str, role: _Role) -> _Watch | None:
        """A new watch; None when `path` vanished first or cannot be read, inotify just failed
        (`auto`), or forced inotify is past its limit after start (a root appearing later must
        not stop the daemon)."""
        try:
            return self._add(path, role)
        except (FileNotFoundError, NotADirectoryError):
            return None  # gone again since it was looked at
        except PermissionError:
            return None  # not this process's to read: inotify still works for every other
        except OSError as exc:
            if self._started and self.kind is ObserverKind.INOTIFY and exc.errno in _LIMIT_ERRORS:
                self._watch_limit(exc)
            else:
                self._inotify_unavailable(exc)
            return None

    def _add(self, path: str, role: _Role) -> _Watch:
        """One inotify watch on `path` (OSError from the kernel when it cannot be had)."""
        if self._inotify is None:
            self._inotify = _new_inotify()
        watch = _Watch(self, path, role)
        wd = self._inotify.add_callback(os.fsencode(path), WATCH_MASK, watch, id(watch))
        watch.wd = wd
        if wd == -1:  # watchdog leaves a refusal for permission unraised
            self._inotify.remove_callbacks([(wd, id(watch))])
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
        return watch

    def _remove(self, watch: _Watch) -> None:
        watch.alive = False
        if self._inotify is not None:
            self._inotify.remove_callbacks([(watch.wd, id(watch))])

    def _unwatch_root(self, real: str) -> None:
        _, _, watch = self._roots.pop(real)
        if watch is not None:
            self._remove(watch)
        self.unwatch([d for d in self._directories if inside(d, real)])
        self._log.info("stopped watching root (gone, replaced or moved)", root=printable(real))

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
        for parent in [p for p in self._parents if p not in wanted or not self._parents[p].alive]:
            self._remove(self._parents.pop(parent))
        for parent in wanted - self._parents.keys():
            assert parent is not None
            watch = self._add_or_fall_back(parent, _Role.PARENT)
            if watch is not None:  # else the next sync or rescan finds the root
                self._parents[parent] = watch
        # A directory on a root's way made while its parent's watch was being set up (`mkdir
        # -p` racing this sync) gave no event: look again, and hint so a sync moves on.
        for real, parent in planned.items():
            if _directory_identity(real) is not None or _nearest_existing_parent(real) != parent:
                self._hints.put(Hint(HintKind.ROOT, real))

    def _stop_inotify(self) -> None:
        inotify, self._inotify = self._inotify, None
        if inotify is not None:
            inotify.stop()  # removes every watch and wakes its reader
            if inotify.is_alive():
                inotify.join()

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
        self._roots = {r: w for r, w in self._roots.items() if w[1] is ObserverKind.POLLING}
        self._directories.clear()
        self._parents.clear()
        # No event comes from now on: the caller's next rescan, timed when inotify was counted
        # on, is the first poll, and must come now.
        self._hints.put(Hint(HintKind.RESCAN, ""))

    def _watch_limit(self, exc: OSError) -> None:
        """A directory under a root could not be watched for inotify's limits: `auto` polls
        from now on; forced `inotify` says so once and leaves the rest to the rescans."""
        if self.kind is ObserverKind.AUTO:
            self._inotify_unavailable(exc)
            self._sync_once()  # the roots, polled now: the daemon's rescans cover them
            return
        if not self._limit_reported:
            self._limit_reported = True
            self._log.error(
                "inotify limit reached: some directories are not watched; every rescan still "
                "finds their runs",
                reason=describe_inotify_error(exc),
            )

    # -- watchdog's inotify thread ------------------------------------------------------------

    def _deliver(self, watch: _Watch, event: InotifyEvent) -> None:
        # Runs in watchdog's inotify thread: only turn the event into hints and hand them on.
        try:
            if not watch.alive:
                return
            if event.mask & (IN_DELETE_SELF | IN_MOVE_SELF):
                # Gone or moved away (its events would name the old path): dropped at the next
                # sync; the parent's watch names it, and a root is synced now.
                watch.alive = False
                if watch.role is _Role.ROOT:
                    self._hints.put(Hint(HintKind.ROOT, watch.path))
                return
            if watch.role is _Role.PARENT:
                # A root appears when it, or a directory on its way, is made or moved into place.
                if event.mask & IN_ISDIR and event.mask & (IN_CREATE | IN_MOVED_TO):
                    path = os.path.join(watch.path, os.fsdecode(event.name))
                    for real in self._missing_roots:
                        if inside(real, path):
                            self._hints.put(Hint(HintKind.ROOT, real))
                return
            for hint in hints_for(watch.path, event, self._names):
                self._hints.put(hint)
        except Exception:
            self._log.exception(
                "could not hand a filesystem event on as a hint", fs_event=repr(event)
            )

    def _lost(self) -> None:
        # watchdog tells every watch of one overflow, one after another: said once.
        now = time.monotonic()
        if now - self._lost_at >= LOST_SAID_EVERY_SECONDS:
            self._lost_at = now
            self._log.warning("inotify's event queue overflowed: events were lost; rescanning")
            self._hints.put(Hint(HintKind.RESCAN, ""))


def _new_inotify() -> InotifyFD:
    """watchdog's inotify instance of our own (not its shared one), reading in its thread."""
    try:
        from watchdog.observers.inotify_c import InotifyFD
    except Exception as exc:  # not Linux, or a libc without inotify
        raise OSError(errno.ENOSYS, f"inotify is not available here ({exc})") from None
    inotify = InotifyFD()
    inotify.name = "evalpush-watch-inotify"
    inotify.start()
    return inotify


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
