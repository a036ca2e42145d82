"""Run a function as a user who may not read (or write) a file, even when the tests run as root."""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

NOBODY = 65534


def as_nobody(fn: Callable[[], Any]) -> Any:
    """`fn()` (its result must pickle) as user `nobody` when running as root, else as is.

    Root reads and writes any file, so as root `fn` runs in a forked child that became `nobody`
    (the interpreter under /root cannot be started by nobody, hence a fork, not a subprocess).
    """
    if os.geteuid() != 0:
        return fn()
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to nobody, report, leave without running pytest's exit
        os.close(rfd)
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            result = fn()
        except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
            result = ("child failed", repr(exc))
        os.write(wfd, pickle.dumps(result))
        os._exit(0)
    os.close(wfd)
    with os.fdopen(rfd, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    return pickle.loads(data)


def without_read_access(locked: Path, fn: Callable[[], Any]) -> Any:
    """`fn()` (its result must pickle) while `locked` has mode 0, as a user it binds."""
    locked.chmod(0)
    try:
        return as_nobody(fn)
    finally:
        locked.chmod(0o600)
