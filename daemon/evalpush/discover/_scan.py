"""The scan: every run directory under the roots with its cheap facts; the truth of discover."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

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
    top: str, marker: str = "", on_error: Callable[[str, OSError], None] | None = None
) -> Iterator[RunDir]:
    """Every run directory at or under `top`: never through a symlink, never inside a run.

    A directory that vanishes while it is walked is skipped; any other error reading one goes to
    `on_error` (a directory that cannot be read hides whatever runs are in it).
    """
    stack = [top]
    while stack:
        directory = stack.pop()
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

    def __init__(self, roots: Sequence[Path], *, marker: str = "", log: Any = None) -> None:
        self.roots = list(roots)
        self.marker = marker
        self._log = log if log is not None else get_logger(stage="discover")
        self._missing: set[Path] = set()  # roots known not to exist (reported once)
        self._unreadable: set[str] = set()  # directories that could not be read (reported once)

    @classmethod
    def from_config(cls, watch: WatchConfig, runs: RunsConfig) -> Scanner:
        return cls(watch.roots, marker=runs.marker)

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

    def scan_subtree(self, directory: str | Path) -> dict[str, RunDir]:
        """Every run directory at or under `directory`, if it lies inside a root."""
        path = self._contained(directory)
        if path is None:
            return {}
        return {run.path: run for run in walk(path, self.marker, self._unreadable_dir)}

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
