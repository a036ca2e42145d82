"""`check`'s `watch` row: whether the daemon can watch each of `watch.roots`, and how.

For each root: absolute (the daemon refuses a relative one), present, readable and searchable
by this user, the filesystem it is on and the watcher the daemon would use there (inotify, or
polling on a network filesystem or when `watch.observer` says so), and how many inotify watches
this user has left (the daemon holds one for each root, each directory under it that
holds no run, and each run not finished yet; `fs.inotify.max_user_watches` caps them per user). Reads only /proc and the roots' own metadata.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from evalpush.config import WatchConfig
from evalpush.core.errors import ConfigError
from evalpush.discover._inotify import (
    NETWORK_FILESYSTEMS,
    filesystem_type,
    inotify_watches_in_use,
)

MAX_USER_WATCHES = Path("/proc/sys/fs/inotify/max_user_watches")


class RootVerdict(msgspec.Struct, frozen=True):
    root: str
    ok: bool
    detail: str
    fix: str = ""
    relative: bool = False


def _mountinfo() -> str:
    try:
        return Path("/proc/self/mountinfo").read_text()
    except OSError:
        return ""


def watches_left() -> tuple[int, int] | None:
    """(left, limit) of this user's inotify watches; None where /proc does not say."""
    try:
        limit = int(MAX_USER_WATCHES.read_text())
    except (OSError, ValueError):
        return None
    uid, used = os.getuid(), 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
        except OSError:
            continue
        used += inotify_watches_in_use(pid)
    return max(0, limit - used), limit


def judge_root(root: Path, observer: str, mountinfo: str) -> RootVerdict:
    shown = str(root)
    if not root.is_absolute():
        return RootVerdict(
            shown,
            False,
            f"{shown}: relative (the daemon refuses it: under systemd it would be "
            f"{Path('/') / root})",
            "give an absolute path in watch.roots",
            relative=True,
        )
    if not root.exists():
        return RootVerdict(
            shown,
            False,
            f"{shown}: does not exist (the daemon waits for it, uploading nothing from it)",
            "create it, or correct watch.roots",
        )
    if not root.is_dir():
        return RootVerdict(shown, False, f"{shown}: not a directory", "correct watch.roots")
    if not os.access(root, os.R_OK | os.X_OK):
        return RootVerdict(
            shown,
            False,
            f"{shown}: not readable by this user",
            "give the daemon's user read and search access to it",
        )
    real = os.path.realpath(root)
    fstype = filesystem_type(real, mountinfo) or "unknown filesystem"
    if observer == "auto":
        kind = "polling" if fstype in NETWORK_FILESYSTEMS else "inotify"
    else:
        kind = observer
    return RootVerdict(shown, True, f"{shown}: absolute, exists, readable, {fstype}, {kind}")


def refuse_relative_roots(watch: WatchConfig) -> None:
    """The daemon's refusal of relative roots (and `check`'s watch row): a ConfigError."""
    relative = [str(root) for root in watch.roots if not root.is_absolute()]
    if relative:
        raise ConfigError(
            f"watch.roots: {', '.join(repr(r) for r in relative)} is relative: the daemon "
            "resolves it against its working directory (/ under systemd, so './outputs' "
            "would be '/outputs'); give absolute paths"
        )


def watch_verdicts(watch: WatchConfig) -> tuple[list[RootVerdict], str]:
    """Each root judged, and the line about inotify watches left."""
    mountinfo = _mountinfo()
    verdicts = [judge_root(root, watch.observer, mountinfo) for root in watch.roots]
    left = watches_left()
    watches = (
        "inotify watches left: unknown"
        if left is None
        else f"inotify watches left {left[0]:,} of {left[1]:,}"
    )
    return verdicts, watches


__all__ = [
    "RootVerdict",
    "judge_root",
    "refuse_relative_roots",
    "watch_verdicts",
    "watches_left",
]
