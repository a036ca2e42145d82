"""Run a function as a user who may not read (or write) a file, even when the tests run as root."""

from __future__ import annotations

import importlib
import os
import pickle
import pkgutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

NOBODY = 65534


def as_nobody(fn: Callable[[], Any]) -> Any:
    """`fn()` (its result must pickle) as user `nobody` when running as root, else as is.

    Root reads and writes any file, so as root `fn` runs in a forked child that became `nobody`
    (the interpreter under /root cannot be started by nobody, hence a fork, not a subprocess).
    Nobody may not read the checkout either (a clone under a 0700 directory), so every evalpush
    module, and the libraries they import lazily, are imported before the fork.
    """
    if os.geteuid() != 0:
        return fn()
    _import_everything()
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


def _import_everything() -> None:
    """Import every evalpush module and the libraries evalpush imports only when first used."""
    import evalpush

    for module in pkgutil.walk_packages(evalpush.__path__, "evalpush."):
        if not module.name.endswith(".__main__"):  # a command: importing it runs it
            importlib.import_module(module.name)
    for name in LAZY_LIBRARIES:
        importlib.import_module(name)
    from evalpush.config import Config

    Config.model_validate({})  # the pydantic models are generated (pydantic's imports) at first use


LAZY_LIBRARIES = (
    "alembic.command",
    "alembic.config",
    "msgspec",
    "orjson",
    "rich.console",
    "rich.progress",
    "structlog",
    "structlog.dev",
    "structlog.processors",
)
"""Libraries (and submodules) evalpush imports inside functions, at first use."""


def without_read_access(locked: Path, fn: Callable[[], Any]) -> Any:
    """`fn()` (its result must pickle) while `locked` has mode 0, as a user it binds."""
    locked.chmod(0)
    try:
        return as_nobody(fn)
    finally:
        locked.chmod(0o600)
