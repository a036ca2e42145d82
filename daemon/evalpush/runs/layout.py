"""Run directories on disk: the files that make one, finding them under a root, and why a
directory is not one, in words for people.

A run directory holds `config.toml` and `traces.jsonl` (or the legacy `results.jsonl`), both
regular files; or, from verifiers 0.3, `configs/resolved/<command>.json` and a `traces.jsonl`
holding a line. Symlinks are never followed, to a file or a directory.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path

from evalpush.runs.read import what_is_at

CONFIG_FILE = "config.toml"
TRACES_FILE = "traces.jsonl"
LEGACY_TRACES_FILE = "results.jsonl"
CONFIGS_DIR = "configs"
RESOLVED_DIR = "resolved"
RESOLVED_CONFIGS = ("eval.json", "debug.json", "replay.json")
"""verifiers 0.3/0.4 write the resolved config to `configs/resolved/<command>.json`: its name
says the kind of run (`RunKind`)."""


def regular_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def traces_file(directory: Path) -> Path | None:
    """The run's trace file: `traces.jsonl`, else the legacy `results.jsonl`, else None."""
    for name in (TRACES_FILE, LEGACY_TRACES_FILE):
        if regular_file(directory / name):
            return directory / name
    return None


def resolved_config(directory: Path) -> Path | None:
    """`configs/resolved/{eval,debug,replay}.json` (verifiers 0.3/0.4), the first there is."""
    resolved = directory / CONFIGS_DIR / RESOLVED_DIR
    for name in RESOLVED_CONFIGS:
        if regular_file(resolved / name):
            return resolved / name
    return None


def config_file(directory: Path) -> Path | None:
    """The run's config: `config.toml` (0.1, 0.2), else its resolved JSON (0.3, 0.4)."""
    if regular_file(directory / CONFIG_FILE):
        return directory / CONFIG_FILE
    return resolved_config(directory)


def _has_a_line(path: Path) -> bool:
    try:
        return os.lstat(path).st_size > 0
    except OSError:
        return False


def is_run_dir(directory: Path) -> bool:
    """config.toml + a trace file; or a resolved JSON config + a `traces.jsonl` that holds
    something (0.3/0.4 take their run id from the lines: a run with none has no id yet)."""
    traces = traces_file(directory)
    if traces is None:
        return False
    if regular_file(directory / CONFIG_FILE):
        return True
    return (
        traces.name == TRACES_FILE
        and resolved_config(directory) is not None
        and _has_a_line(traces)
    )


def why_not_a_run(directory: Path) -> str | None:
    """Why `directory` is not a run directory, for people (None when it is one)."""
    try:
        directory.stat()
        os.listdir(directory)
    except PermissionError:
        return f"{directory} cannot be read (permission denied)"
    except NotADirectoryError:
        return f"{directory} is not a directory"
    except OSError as exc:
        return f"{directory}: {exc.strerror}"
    if is_run_dir(directory):
        return None
    config, traces = config_file(directory), traces_file(directory)
    if traces is None and (odd := _not_regular(directory / TRACES_FILE)) is not None:
        return odd
    if config is not None and traces is not None:
        return (
            f"{directory} holds {config.relative_to(directory)} and an empty {traces.name}: it "
            "is a run directory once its first line is written (the line says the run's id)"
        )
    if traces is not None:
        return (
            f"{directory} holds {traces.name} but no {CONFIG_FILE} (nor "
            f"{CONFIGS_DIR}/{RESOLVED_DIR}/eval.json), so it is not a run directory yet: it is "
            "one once its config is written"
        )
    if config is not None:
        return f"{directory} holds {config.relative_to(directory)} but no {TRACES_FILE} yet"
    return f"{directory} holds neither {CONFIG_FILE} nor {TRACES_FILE}: not a run directory"


def _not_regular(path: Path) -> str | None:
    """What `path` is when it is there but not a regular file, for people (else None)."""
    kind = what_is_at(path)
    if kind in (None, "nothing"):
        return None
    if kind == "a symlink":
        return (
            f"{path} is a symlink (to {os.readlink(path)}), not a regular file: a run's files "
            "are read only where they are, never through a symlink"
        )
    return f"{path} is {kind}, not a regular file: a run's trace file is a regular file"


def why_no_run(roots: Sequence[Path], *, most: int = 5) -> str:
    """Why no run directory is found at or under `roots`, for people: what looks like part of
    a run there (a trace file or a config, a symlinked directory, which are not followed) and
    why it is not taken; or that nothing of a run is there. At most `most` reasons."""
    reasons: list[str] = []
    for root in roots:
        if not root.is_dir() or root.is_symlink():
            reasons.append(why_not_a_run(root) or f"{root}: not a directory")
            continue
        for parent, dirs, files in os.walk(root, followlinks=False):
            dirs.sort()
            here = Path(parent)
            names = {*dirs, *files}
            if names & {TRACES_FILE, LEGACY_TRACES_FILE, CONFIG_FILE, CONFIGS_DIR}:
                why = why_not_a_run(here)
                if why is not None:
                    reasons.append(why)
            for name in dirs:
                if (here / name).is_symlink():
                    reasons.append(f"{here / name} is a symlink to a directory: not followed")
            if len(reasons) >= most:
                break
    if not reasons:
        return "nothing there holds a trace file or a run's config"
    return "; ".join(reasons[:most]) + ("; ..." if len(reasons) > most else "")


def find_run_dirs(root: Path) -> Iterator[Path]:
    """Every run directory at or under `root`, without following symlinks, in sorted order."""
    if is_run_dir(root):
        yield root
        return
    for parent, dirs, _files in os.walk(root, followlinks=False):
        dirs.sort()
        here = Path(parent)
        for name in list(dirs):
            # os.walk lists a symlink to a directory among `dirs`: never follow it out of the root
            if not (here / name).is_symlink() and is_run_dir(here / name):
                dirs.remove(name)  # a run directory does not nest runs
                yield here / name
