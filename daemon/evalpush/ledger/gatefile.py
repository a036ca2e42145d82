"""The running daemon's view of the platform, in a small file beside the ledger, for `status`.

The daemon (`evalpush run`) writes `daemon.json` in its state directory every few seconds from
its loop, and marks it stopped (`stopped_at`) when it stops: who it is (host, boot id, pid, start time: the claims'
`Process`), when it wrote the file, its STATUS line, and its gate (`retry.Gate.snapshot`: open,
unreachable, auth refused or paused, since when, attempts, the next probe, runs waiting).
`status` reads it and shows the gate while that daemon is alive (`claims.holder_alive`, the
same test a run's claim gets); a file whose writer is gone (or stopped) is the daemon last seen
(`last_seen`: `daemon: not running (last seen pid N at T)`), and one not rewritten for
`SILENT_SECONDS` is shown with its age, since a daemon whose loop is stuck says nothing new.

Why a file and not the ledger: the gate changes while uploads wait, and writing it to the ledger
would take the ledger's write lock from the one loop that must never wait on it; a file
replaced whole (written beside it, then renamed over it) is never read half-written. Its mode is
0644: nothing in it is secret (the reason is scrubbed like every message), and a monitoring
user who may read the ledger may read this too.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import msgspec

from evalpush.core.secrets import scrub
from evalpush.core.smallfile import read_small_file
from evalpush.ledger.claims import Holder, Process, holder_alive

FILE_NAME = "daemon.json"
SILENT_SECONDS = 30.0
"""A daemon rewrites the file every few seconds: one older than this is shown with its age."""
MAX_FILE_BYTES = 64 * 1024
"""A bigger file is not the daemon's: it is not read."""


def path_in(state_dir: Path) -> Path:
    return state_dir / FILE_NAME


def write(state_dir: Path, gate: dict[str, Any], status: str, *, now: float | None = None) -> None:
    """Replace the file with this daemon's gate and STATUS line (the daemon's loop)."""
    here = Process.current()
    document = {
        "host": here.host,
        "boot": here.boot,
        "pid": here.pid,
        "start": here.start,
        "pidns": here.pidns,
        "written_at": time.time() if now is None else now,
        "status": status,
        "gate": {**gate, "reason": scrub(str(gate.get("reason") or ""))},
    }
    target = path_in(state_dir)
    partial = target.with_name(f".{FILE_NAME}.{here.pid}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        json.dump(document, f)
    os.replace(partial, target)


def stopped(state_dir: Path, *, now: float | None = None) -> None:
    """The daemon stops: its file says when (only if the file is this process's), so `status`
    tells a daemon that stopped from one that never ran."""
    target = path_in(state_dir)
    found = _load(target)
    if found is None or found.get("pid") != os.getpid():
        return
    found["stopped_at"] = time.time() if now is None else now
    partial = target.with_name(f".{FILE_NAME}.{os.getpid()}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        json.dump(found, f)
    os.replace(partial, target)


class LastSeen(msgspec.Struct, frozen=True):
    """A daemon that no longer runs: its pid, host, and when it was last heard from (its stop,
    or its last write if it was killed)."""

    pid: int
    host: str
    at: float
    stopped: bool  # it stopped cleanly (SIGTERM); False: it vanished (killed, crashed)


def last_seen(state_dir: Path, *, now: float | None = None) -> LastSeen | None:
    """The daemon that last ran on this state directory, when none runs now; None when one
    runs, or none ever wrote the file."""
    if read(state_dir, now=now) is not None:
        return None
    found = _load(path_in(state_dir))
    if found is None:
        return None
    try:
        stopped_at = found.get("stopped_at")
        at = float(stopped_at if stopped_at is not None else found["written_at"])
        return LastSeen(int(found["pid"]), str(found["host"]), at, stopped_at is not None)
    except (KeyError, TypeError, ValueError):
        return None


class DaemonView(msgspec.Struct, frozen=True):
    """What the daemon last wrote, for `status`."""

    pid: int
    host: str
    written_at: float
    status: str
    gate: dict[str, Any]

    def age(self, now: float) -> float:
        return max(0.0, now - self.written_at)


def read(state_dir: Path, *, now: float | None = None) -> DaemonView | None:
    """The view of the daemon that runs on this state directory, or None when none runs (no
    file, its writer is gone, or the file is not one a daemon wrote)."""
    now = time.time() if now is None else now
    found = _load(path_in(state_dir))
    if found is None:
        return None
    try:
        holder = Holder(
            owner="",
            host=str(found["host"]),
            boot=str(found["boot"]),
            pid=int(found["pid"]),
            start=int(found["start"]),
            pidns=str(found["pidns"]),
            since=float(found["written_at"]),
            expires=float(found["written_at"]) + SILENT_SECONDS,
        )
        gate = dict(found["gate"])
        status = str(found["status"])
    except (KeyError, TypeError, ValueError):
        return None
    if found.get("stopped_at") is not None:
        return None
    if not holder_alive(holder, Process.current(), now):
        return None
    return DaemonView(holder.pid, holder.host, holder.since, status, gate)


def _load(path: Path) -> dict[str, Any] | None:
    try:
        data, _ = read_small_file(path, MAX_FILE_BYTES)  # a FIFO there never blocks `status`
    except OSError:
        return None
    try:
        found = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    return found if isinstance(found, dict) else None
