"""The runs stage: what a run directory is, who it is, and what kind of run it is.

A run directory holds `config.toml` and `traces.jsonl` (or the legacy `results.jsonl`), both
regular files. Its run id is the directory's leaf name when that is a UUID (the default
layout); otherwise it is `uuid5(NAMESPACE_URL, "evalpush:<hostname>:<absolute path>")`, which
is stable across restarts and does not collide across hosts (the path taken as the bytes the
kernel knows it by, so a name that is not UTF-8 has an id too).

Eval runs are uploaded; debug runs (config has `script_path` or `command`) never are; replay
runs (config has `num_rescores` and no `model`) only when `runs.upload_replays` is set.
"""

from __future__ import annotations

import enum
import hashlib
import os
import socket
import stat
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalpush.config import read_toml
from evalpush.errors import RunError

CONFIG_FILE = "config.toml"
TRACES_FILE = "traces.jsonl"
LEGACY_TRACES_FILE = "results.jsonl"
DEFAULT_MODEL = "deepseek/deepseek-v4-flash"


class RunKind(enum.StrEnum):
    EVAL = "eval"
    DEBUG = "debug"
    REPLAY = "replay"


@dataclass(frozen=True, slots=True)
class Run:
    """One run directory and the fields of its config.toml the upload needs."""

    path: Path
    run_id: str
    kind: RunKind
    traces_path: Path
    env_name: str
    model: str
    num_rollouts: int
    num_tasks: int | None
    pushed_inline: bool

    @property
    def evaluation_name(self) -> str:
        return f"{self.env_name}--{self.model}--{self.run_id[:8]}"

    @property
    def expected_traces(self) -> int | None:
        """How many trace lines a finished run has, when the config says."""
        return self.num_tasks * self.num_rollouts if self.num_tasks is not None else None


def _regular_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def traces_file(directory: Path) -> Path | None:
    """The run's trace file: `traces.jsonl`, else the legacy `results.jsonl`, else None."""
    for name in (TRACES_FILE, LEGACY_TRACES_FILE):
        if _regular_file(directory / name):
            return directory / name
    return None


def is_run_dir(directory: Path) -> bool:
    return _regular_file(directory / CONFIG_FILE) and traces_file(directory) is not None


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


def derive_run_id(directory: Path) -> str:
    try:
        return str(uuid.UUID(directory.name))
    except ValueError:
        key = b"evalpush:%s:%s" % (socket.gethostname().encode(), os.fsencode(directory.absolute()))
        return str(_uuid5(uuid.NAMESPACE_URL, key))


def _uuid5(namespace: uuid.UUID, name: bytes) -> uuid.UUID:
    """`uuid.uuid5` of a name given as bytes (for a UTF-8 name, the same id as `uuid5(str)`)."""
    digest = hashlib.sha1(namespace.bytes + name, usedforsecurity=False).digest()
    return uuid.UUID(bytes=digest[:16], version=5)


def _kind(config: dict[str, Any]) -> RunKind:
    if "script_path" in config or "command" in config:
        return RunKind.DEBUG
    if "num_rescores" in config and "model" not in config:
        return RunKind.REPLAY
    return RunKind.EVAL


def _int_key(config: dict[str, Any], key: str, default: int | None, path: Path) -> int | None:
    value = config.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise RunError(f"{path}: key {key!r} must be a non-negative integer, got {value!r}")
    return value


def load_run(directory: Path) -> Run:
    """Read a run directory's identity and config; `RunError` names what is wrong."""
    directory = Path(directory)
    config_path = directory / CONFIG_FILE
    traces = traces_file(directory)
    if traces is None:
        raise RunError(f"{directory}: no traces.jsonl (or results.jsonl): not a run directory")
    if not _regular_file(config_path):
        raise RunError(f"{config_path}: no config.toml: not a run directory")
    config = read_toml(config_path, RunError, "config.toml")
    taskset = config.get("taskset")
    taskset_id = taskset.get("id") if isinstance(taskset, dict) else None
    env_name = taskset_id or config.get("id") or ""
    model = config.get("model") or DEFAULT_MODEL
    if not isinstance(env_name, str) or not isinstance(model, str):
        raise RunError(f"{config_path}: 'taskset.id', 'id' and 'model' must be strings")
    return Run(
        path=directory,
        run_id=derive_run_id(directory),
        kind=_kind(config),
        traces_path=traces,
        env_name=env_name,
        model=model,
        num_rollouts=_int_key(config, "num_rollouts", 1, config_path) or 0,
        num_tasks=_int_key(config, "num_tasks", None, config_path),
        pushed_inline=bool(config.get("push", True)),
    )


def require_env_name(run: Run) -> str:
    if not run.env_name:
        raise RunError(
            f"{run.path / CONFIG_FILE}: no environment name ('[taskset] id' and 'id' are both "
            "empty): nothing to upload to"
        )
    return run.env_name
