"""The scan: every run directory under the roots with its cheap facts; the truth of discover.

Two ways: `Scanner.scan()` walks everything (one `scandir` per directory, one `lstat` per run's
trace file); `Scanner.rescan()` walks what changed since its last call. It remembers the run
directories it found and, for every other directory, its mtime and subdirectories: a directory
whose mtime has not moved is not listed again (one `lstat` of it; one holding a trace file that
is not a run yet is listed every time: a 0.3/0.4 run becomes one by its first line), and a run
directory the caller does not name `unsettled` (a finalized run: it needs nothing unless it
changed) is not looked at at all: the walk goes through the directories that are not runs, and
looks inside only the runs named (a set difference the caller makes, so a million settled runs
cost no Python call each).
A run directory that is deleted, moved or made moves its parent's mtime; what changes inside one
(a line appended to its trace file, the file replaced, a marker) does not: for those, file
events, and the slow sweep, which lists every remembered directory and looks inside every
remembered run once per `watch.sweep_seconds`, a time-proportional slice at each rescan (so it
never costs a burst). Daemons sharing a tree share the sweep (`share`): each sweeps the
directories whose path under its root hashes to its place among them. Remembered per run: its
path (shared with its parent's list) and a dict slot.
"""

from __future__ import annotations

import math
import os
import stat
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any, Protocol

import msgspec

from evalpush.config import RunsConfig, WatchConfig
from evalpush.log import get_logger
from evalpush.runs import (
    CONFIG_FILE,
    CONFIGS_DIR,
    LEGACY_TRACES_FILE,
    TRACES_FILE,
    FileIdentity,
    resolved_config,
)


class Settled(Protocol):
    """Which run directories need nothing unless they change (the daemon's tracker)."""

    @property
    def settled_changes(self) -> int:
        """A count that moves whenever a run becomes or stops being settled."""
        ...

    def unsettled(self, paths: AbstractSet[str]) -> AbstractSet[str]:
        """Of `paths`, those that are not settled."""
        ...


class SweepShare(msgspec.Struct, frozen=True):
    """A scanner's part of the slow sweep: the `index`th of `parts` (one a daemon sharing the
    tree, in the order of their ids)."""

    index: int
    parts: int


class RunDir(msgspec.Struct, frozen=True, gc=False):
    """A run directory and the cheap facts of its trace file, as one scan saw them."""

    path: str  # the run directory: real, absolute (the ledger's key)
    traces_name: str  # traces.jsonl, or the legacy results.jsonl
    device: int
    inode: int
    size: int
    mtime_ns: int
    marker: bool  # the configured marker file exists (False when none is configured)

    @property
    def directory(self) -> Path:
        return Path(self.path)

    @property
    def traces(self) -> Path:
        return Path(self.path, self.traces_name)

    @property
    def identity(self) -> FileIdentity:
        return FileIdentity(self.device, self.inode, self.size)


class Rescan(msgspec.Struct, frozen=True, gc=False):
    """What one `Scanner.rescan()` found."""

    runs: dict[str, RunDir]  # run directories looked at: new, changed, unsettled, or swept
    gone: list[str]  # run directories it knew that are gone or are not run directories any more
    directories: list[str]  # other directories it found (the ones runs appear in)
    left: list[str]  # other directories it knew that are gone or are run directories now
    complete: bool  # the first rescan is over: `Scanner.knows` every run under the roots
    over: bool  # this rescan is over (else the next call goes on with it)


RACY_NS = 2_000_000_000
"""A directory whose mtime is this recent when it is listed is listed again at the next rescan:
an entry made in the same tick of the filesystem's clock, after the listing, would leave the
mtime as it was."""


def printable(path: str | Path) -> str:
    """A path for a log line or a status table, whatever bytes its name holds."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


class _Listing:
    """What one `scandir` of a directory says about it as a run directory."""

    __slots__ = ("config", "configs", "traces", "legacy", "marker", "subdirs")

    def __init__(self, directory: str, marker: str) -> None:
        self.config = self.configs = self.marker = False
        self.traces: os.DirEntry[str] | None = None
        self.legacy: os.DirEntry[str] | None = None
        self.subdirs: list[str] = []
        with os.scandir(directory) as entries:
            for entry in entries:
                # d_type from the listing: no stat, and a symlink is neither a file nor a dir.
                if entry.is_file(follow_symlinks=False):
                    name = entry.name
                    if name == CONFIG_FILE:
                        self.config = True
                    elif name == TRACES_FILE:
                        self.traces = entry
                    elif name == LEGACY_TRACES_FILE:
                        self.legacy = entry
                    elif name == marker:
                        self.marker = True
                elif entry.is_dir(follow_symlinks=False):
                    self.configs = self.configs or entry.name == CONFIGS_DIR
                    self.subdirs.append(entry.path)

    @property
    def has_traces(self) -> bool:
        """Whether the directory holds a trace file (a run, or one that may become a run)."""
        return self.traces is not None or self.legacy is not None

    def run(self, directory: str) -> RunDir | None:
        """The run directory this listing shows; None when it is not one: config.toml and a
        trace file, or (verifiers 0.3/0.4) `configs/resolved/<command>.json` and a
        `traces.jsonl` holding something (its lines carry the run's id)."""
        traces = self.traces or self.legacy
        if traces is None:
            return None
        resolved = not self.config
        if resolved and (
            not self.configs or self.traces is None or resolved_config(Path(directory)) is None
        ):
            return None
        traces = self.traces if resolved else traces
        st = traces.stat(follow_symlinks=False)  # the one syscall a run costs beyond scandir
        if not stat.S_ISREG(st.st_mode):  # replaced since the directory was listed
            return None
        if resolved and st.st_size == 0:
            return None
        return RunDir(
            directory, traces.name, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, self.marker
        )


RACY = -1
"""The mtime remembered for a directory to be listed again at the next rescan."""

_Remembered = tuple[int, tuple[str, ...], "tuple[str, ...] | None"]
"""What `rescan()` remembers of a directory that is not a run: its mtime (or RACY), its
subdirectories, and those of them that are not runs (worked out at the first rescan that finds
it unchanged; None until then, and again once one of them becomes or stops being a run)."""


def _root_problem(real: str) -> str | None:
    """Why a root cannot be scanned now (a log line), or None when it can."""
    try:
        st = os.stat(real)
    except (FileNotFoundError, NotADirectoryError):
        return "watch root does not exist yet; waiting for it"
    except PermissionError:
        return "watch root cannot be reached (permission denied); waiting for access"
    except OSError as exc:
        return f"watch root cannot be reached ({exc.strerror or exc}); waiting for it"
    if not stat.S_ISDIR(st.st_mode):
        return "watch root is not a directory; waiting for one"
    return None


def look_at(directory: str, marker: str = "") -> RunDir | None:
    """`directory` as a run directory now (no containment check); None if it is not one or gone."""
    try:
        return _Listing(directory, marker).run(directory)
    except OSError:
        return None


def walk(
    top: str,
    marker: str = "",
    on_error: Callable[[str, OSError], None] | None = None,
    directories: list[str] | None = None,
    before_listing: Callable[[str], None] | None = None,
) -> Iterator[RunDir]:
    """Every run directory at or under `top`: never through a symlink, never inside a run.

    A directory that vanishes while it is walked is skipped; any other error reading one goes to
    `on_error` (a directory that cannot be read hides whatever runs are in it). `directories`
    gets every other directory listed on the way; `before_listing` is called with each
    directory before it is listed (to watch it: then nothing made in it escapes both).
    """
    stack = [top]
    while stack:
        directory = stack.pop()
        if before_listing is not None:
            before_listing(directory)
        try:
            listing = _Listing(directory, marker)
            run = listing.run(directory)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as exc:
            if on_error is not None:
                on_error(directory, exc)
            continue
        if run is not None:
            yield run
        else:
            if directories is not None:
                directories.append(directory)
            stack.extend(listing.subdirs)


def resolve(root: str | Path) -> str:
    return os.path.realpath(root)


def inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


class Scanner:
    """The full scan of the roots (the truth), and the look at one place a hint points to.

    Paths are `str` under each root's real path (symlinks in the root's own path resolved), as
    `evalpush push` names runs, so both name a run the same way. No I/O until called.
    """

    def __init__(
        self,
        roots: Sequence[Path],
        *,
        marker: str = "",
        sweep_seconds: float = WatchConfig().sweep_seconds,
        share: Callable[[], SweepShare] | None = None,
        log: Any = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`share()`: this scanner's part of the sweep, asked as each sweep begins (None: the
        whole sweep is its own)."""
        self.roots = list(roots)
        self.marker = marker
        self.sweep_seconds = sweep_seconds
        self._share = share
        self._part = SweepShare(0, 1)  # this sweep's
        self._log = log if log is not None else get_logger(stage="discover")
        self._clock = clock
        self._missing: set[Path] = set()  # roots known not to exist (reported once)
        self._unreadable: set[str] = set()  # directories that could not be read (reported once)
        # What `rescan()` remembers: the run directories (a dict: insertion-ordered, the
        # sweep's order), and each other directory's mtime (RACY: list it again) and
        # subdirectories; the run directories the sweep wants looked at.
        self._reals: dict[Path, str] = {}  # each root's real path at the last rescan
        self._runs: dict[str, None] = {}
        self._runs_changes = 0  # moves whenever a run directory is found or forgotten
        self._asked: tuple[int, int] | None = None  # (settled's count, ours) when last asked
        self._unsettled_runs: set[str] = set()  # its answer then
        self._dirs: dict[str, _Remembered] = {}
        self._due: set[str] = set()
        self._looking: set[str] = set()  # the run directories this rescan looks inside
        self._found: list[str] = []  # other directories found and left by this rescan call
        self._left: list[str] = []
        self._rescanned = False  # a rescan was over: the first walk is done
        self._walking = False  # a rescan is under way: `_stack` holds what is left of it
        self._stack: list[str] = []
        self._sweep: list[str] = []  # this sweep's directories, in order
        self._swept = 0  # how many of them were swept so far
        self._swept_at = 0.0  # when the last slice was swept (the clock's time)
        self._sweep_ends = 0.0  # when this sweep must be over
        self._carried = 0.0  # the fraction of a directory the last slice left to the next

    @classmethod
    def from_config(
        cls, watch: WatchConfig, runs: RunsConfig, share: Callable[[], SweepShare] | None = None
    ) -> Scanner:
        return cls(watch.roots, marker=runs.marker, sweep_seconds=watch.sweep_seconds, share=share)

    @property
    def missing_roots(self) -> list[Path]:
        """The roots that did not exist at the last scan (for `status`)."""
        return [root for root in self.roots if root in self._missing]

    def scan(self) -> dict[str, RunDir]:
        """Every run directory under every root that exists now, by path."""
        found: dict[str, RunDir] = {}
        for root in self.roots:
            real = resolve(root)
            if not self._root_present(root, real):
                continue
            for run in walk(real, self.marker, self._unreadable_dir):
                found[run.path] = run
        self._forget_readable()
        return found

    def rescan(self, settled: Settled | None = None, *, budget: int | None = None) -> Rescan:
        """The run directories that changed since the last rescan (all of them the first time).

        `settled`: which run directories need nothing unless they changed (a finalized run):
        those are not looked at (the sweep aside), and cost nothing each, not a call, not a
        lookup; the others are looked at every rescan (None: every run is). It is asked again
        only when its `settled_changes` or the runs this scanner knows changed since it was
        last asked (a set difference over a million runs is a fifth of a second).
        `budget`: at most this many directories are looked at in this call; a rescan not
        `over` goes on where it stopped at the next."""
        runs: dict[str, RunDir] = {}
        gone: list[str] = []
        if not self._walking:
            if self._rescanned:
                self._sweep_slice()
            present = []
            for root in self.roots:
                real = resolve(root)
                before = self._reals.get(root)
                if before is not None and before != real:  # a symlink in its path re-pointed
                    self._forget(before, gone)
                self._reals[root] = real
                if self._root_present(root, real):
                    present.append(real)
                else:
                    self._forget(real, gone)
            self._looking = self._unsettled(settled) | self._due
            self._stack.extend(self._looking)
            self._stack.extend(reversed(present))  # popped in the order given, before the runs
            self._walking = True
        self._walk_changed(runs, gone, budget)
        over = not self._stack
        complete = over and not self._rescanned
        if over:
            self._walking = False
            self._rescanned = True
            self._forget_readable()
            if complete:  # the sweep begins at the next rescan, over all the first one found
                self._sweep, self._swept = [], 0
        found, self._found = self._found, []
        left, self._left = self._left, []
        return Rescan(
            runs, [path for path in gone if path not in runs], found, left, complete, over
        )

    def _unsettled(self, settled: Settled | None) -> set[str]:
        """The runs it knows that `settled` says are not: asked again only when either changed."""
        if settled is None:
            return set(self._runs)
        asked = (settled.settled_changes, self._runs_changes)
        if asked != self._asked:
            self._asked = asked
            self._unsettled_runs = set(settled.unsettled(self._runs.keys()))
        return set(self._unsettled_runs)

    def again(self, paths: Iterable[str]) -> None:
        """Look inside these run directories at the next rescan, settled or not (what a rescan
        found that the caller could not act on)."""
        self._due.update(path for path in paths if path in self._runs)

    def again_under(self, top: str) -> None:
        """Look inside every run directory at or under `top` at the next rescan (a look a file
        event asked for that could not be made); one pass over the runs it remembers."""
        below = top.rstrip(os.sep) + os.sep
        self._due.update(path for path in self._runs if path == top or path.startswith(below))

    def knows(self, path: str) -> bool:
        """Whether `rescan()` has found a run directory at `path` (and not found it gone)."""
        return path in self._runs

    def knows_directory(self, path: str) -> bool:
        """Whether `rescan()` has found a directory that is not a run at `path` (one runs may
        appear in; not one inside a run directory, which it never walks into)."""
        return path in self._dirs

    def moved_since_listed(self, directory: str) -> bool:
        """Whether `directory` (not a run) may have changed since `rescan()` last listed it: its
        mtime moved, or was too close to the listing to tell. False if it is not remembered or
        is gone (its parent's mtime says so)."""
        remembered = self._dirs.get(directory)
        if remembered is None:
            return False
        try:
            mtime = os.lstat(directory).st_mtime_ns
        except OSError:
            return False
        return remembered[0] != mtime  # RACY is no mtime

    @property
    def remembered(self) -> int:
        """How many directories `rescan()` remembers (run directories and the others)."""
        return len(self._runs) + len(self._dirs)

    def _walk_changed(self, runs: dict[str, RunDir], gone: list[str], budget: int | None) -> None:
        """`walk`, but through what it remembers: a directory is listed only when its mtime
        moved, and the walk goes on only into the directories below it that are not runs; a run
        directory is looked at only when it is one this rescan looks inside (unsettled, or due)
        or new (a settled run is not even stat'ed: what changes in it moves its trace file's
        facts, not its directory's mtime). Stops once `budget` directories were looked at, the
        rest left on the stack."""
        fresh_before = time.time_ns() - RACY_NS
        stack = self._stack
        left = budget if budget is not None else -1
        while stack and left != 0:
            directory = stack.pop()
            known_run = directory in self._runs
            if directory in self._looking:
                self._looking.discard(directory)
                if not known_run:
                    continue  # forgotten since this rescan began (its root moved away)
            elif known_run:
                continue  # a settled run that is also a root
            self._due.discard(directory)
            left -= 1
            try:
                st = os.lstat(directory)
            except OSError as exc:
                self._unlistable(directory, exc, gone)
                continue
            if not stat.S_ISDIR(st.st_mode):  # replaced by a file or a symlink
                self._forget(directory, gone)
                continue
            mtime = st.st_mtime_ns
            remembered = self._dirs.get(directory)
            if remembered is not None and remembered[0] == mtime:
                plain = remembered[2]
                if plain is None:
                    plain = tuple(d for d in remembered[1] if d not in self._runs)
                    self._dirs[directory] = (mtime, remembered[1], plain)
                stack.extend(plain)
                continue
            try:
                listing = _Listing(directory, self.marker)
                run = listing.run(directory)
            except OSError as exc:
                self._unlistable(directory, exc, gone)
                continue
            if run is not None:
                if remembered is not None:  # a plain directory became a run: not walked into
                    self._forget(directory, gone)
                if not known_run:
                    self._runs[directory] = None
                    self._runs_changes += 1
                    if remembered is not None:  # else its parent was listed just now
                        self._reclassified(directory)
                    self._sweep_from_now(directory)
                runs[directory] = run
                continue
            if known_run:
                del self._runs[directory]
                self._runs_changes += 1
                self._reclassified(directory)
                gone.append(directory)
            subdirs = tuple(listing.subdirs)
            if remembered is not None:
                for vanished in set(remembered[1]).difference(subdirs):
                    self._forget(vanished, gone)
            else:
                self._sweep_from_now(directory)
                self._found.append(directory)
            # One holding a trace file may become a run with no move of its own mtime (0.3/0.4:
            # its first line, or configs/resolved/*.json written a level down): listed each time.
            settled = mtime < fresh_before and not listing.has_traces
            self._dirs[directory] = (mtime if settled else RACY, subdirs, None)
            # The runs below it it knows are looked at when they need it (`_looking`).
            stack.extend(d for d in subdirs if d not in self._runs)

    def _unlistable(self, directory: str, exc: OSError, gone: list[str]) -> None:
        """`directory` could not be looked at: what it held is not seen (said once unless it
        vanished)."""
        if not isinstance(exc, (FileNotFoundError, NotADirectoryError)):
            self._unreadable_dir(directory, exc)
        self._forget(directory, gone)

    def _forget(self, top: str, gone: list[str]) -> None:
        """Drop what `rescan()` remembers at and under `top`; its run directories are gone."""
        stack = [top]
        while stack:
            directory = stack.pop()
            if directory in self._runs:
                del self._runs[directory]
                self._runs_changes += 1
                self._due.discard(directory)
                gone.append(directory)
            remembered = self._dirs.pop(directory, None)
            if remembered is not None:
                self._left.append(directory)
                stack.extend(remembered[1])
        self._reclassified(top)

    def _reclassified(self, directory: str) -> None:
        """`directory` became or stopped being a run, or was forgotten: its parent's list of
        the directories below it that are not runs is worked out again."""
        parent = os.path.dirname(directory)
        remembered = self._dirs.get(parent)
        if remembered is not None and remembered[2] is not None:
            self._dirs[parent] = (remembered[0], remembered[1], None)

    def _sweep_slice(self) -> None:
        """Make the sweep's next slice of directories look changed, so this rescan lists them
        (and looks inside its runs): a share of what is left of this sweep in proportion to the
        time since the last slice, so the whole sweep is over within `sweep_seconds` and never
        costs a burst (a fraction of a directory is carried over to the next rescan)."""
        now = self._clock()
        if self._swept >= len(self._sweep):  # a new sweep over what is remembered now
            self._part = self._share() if self._share is not None else SweepShare(0, 1)
            everything = [*self._runs, *self._dirs]
            self._sweep = (
                everything if self._part.parts <= 1 else [d for d in everything if self._in_part(d)]
            )
            self._swept, self._swept_at, self._carried = 0, now, 0.0
            self._sweep_ends = now + self.sweep_seconds
            self._log.info(
                "slow sweep begins",
                part=self._part.index + 1,
                parts=self._part.parts,
                directories=len(self._sweep),
                remembered=self.remembered,
                seconds=self.sweep_seconds,
            )
            return
        left = len(self._sweep) - self._swept
        share = min(1.0, (now - self._swept_at) / max(self._sweep_ends - self._swept_at, 1e-9))
        due = left * share + self._carried
        count = min(left, math.floor(due))
        self._carried = due - count
        for directory in self._sweep[self._swept : self._swept + count]:
            if directory in self._runs:
                self._due.add(directory)
            elif directory in self._dirs:
                self._dirs[directory] = (RACY, self._dirs[directory][1], None)
        self._swept += count
        self._swept_at = now

    def _sweep_from_now(self, directory: str) -> None:
        """A directory found by a walk is swept from this sweep on (if it is in this part)."""
        if self._in_part(directory):
            self._sweep.append(directory)

    def _in_part(self, directory: str) -> bool:
        """Whether `directory` is in this scanner's part of the sweep: its path under its root
        (the same on every host, whatever each mounts the tree at) hashed to this part."""
        index, parts = self._part.index, self._part.parts
        if parts <= 1:
            return True
        under = directory
        for real in self._reals.values():
            if directory == real or directory.startswith(real.rstrip(os.sep) + os.sep):
                under = directory[len(real) :]
                break
        return zlib.crc32(os.fsencode(under)) % parts == index

    def scan_subtree(
        self,
        directory: str | Path,
        directories: list[str] | None = None,
        before_listing: Callable[[str], None] | None = None,
    ) -> dict[str, RunDir]:
        """Every run directory at or under `directory`, if it lies inside a root; `directories`
        gets every other directory listed on the way (the ones to watch for new runs), and
        `before_listing` each directory before it is listed (`walk`)."""
        path = self._contained(directory)
        if path is None:
            return {}
        found = walk(path, self.marker, self._unreadable_dir, directories, before_listing)
        return {run.path: run for run in found}

    def look(self, directory: str | Path) -> RunDir | None:
        """`directory` as a run directory now; None when it is not one, is gone, or is outside."""
        path = self._contained(directory)
        return None if path is None else look_at(path, self.marker)

    def _contained(self, directory: str | Path) -> str | None:
        """`directory` as an absolute path inside a root with no symlink on the way, else None."""
        # A hint's path came from an event; by now a directory on the way may be a symlink.
        path = os.path.abspath(directory)
        if os.path.realpath(path) != path:
            return None
        return path if any(inside(path, resolve(root)) for root in self.roots) else None

    def _root_present(self, root: Path, real: str) -> bool:
        problem = _root_problem(real)
        if problem is None:
            if root in self._missing:
                self._missing.discard(root)
                self._log.info("watch root appeared", root=printable(root))
            return True
        if root not in self._missing:
            self._missing.add(root)
            self._log.warning(problem, root=printable(root))
        return False

    def _unreadable_dir(self, directory: str, exc: OSError) -> None:
        if directory not in self._unreadable:
            self._unreadable.add(directory)
            self._log.warning(
                "cannot read a directory under a watch root; runs in it are not seen",
                directory=printable(directory),
                error=exc.strerror or str(exc),
            )

    def _forget_readable(self) -> None:
        # A directory readable again is reported again if it is ever unreadable later.
        if self._unreadable:
            self._unreadable = {
                d
                for d in self._unreadable
                if os.path.isdir(d) and not os.access(d, os.R_OK | os.X_OK)
            }
