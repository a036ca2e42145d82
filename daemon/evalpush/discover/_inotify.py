"""inotify's event bits, its limits, and which filesystems it cannot see into (what `auto`
decides by)."""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Sequence

from evalpush.discover._scan import inside

INOTIFY_WATCH_LIMIT_FILES = (
    "/proc/sys/fs/inotify/max_user_watches",
    "/proc/sys/user/max_inotify_watches",
)
INOTIFY_INSTANCE_LIMIT_FILES = (
    "/proc/sys/fs/inotify/max_user_instances",
    "/proc/sys/user/max_inotify_instances",
)
# Filesystems whose changes made on other hosts never reach this host's inotify.
NETWORK_FILESYSTEMS = frozenset(
    {"nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "ceph", "fuse.sshfs", "fuse.glusterfs", "lustre"}
)


# inotify(7)'s event bits (as the kernel defines them; watchdog's constants are the same, but
# importing them loads inotify through ctypes, which fails where there is none).
IN_MODIFY = 0x00000002
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_ISDIR = 0x40000000

WATCH_MASK = (
    IN_CREATE
    | IN_MODIFY
    | IN_CLOSE_WRITE
    | IN_DELETE
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_DELETE_SELF
    | IN_MOVE_SELF
    | IN_DONT_FOLLOW
    | IN_ONLYDIR
)
"""What the watcher asks inotify for on each directory it watches: an entry created, written,
deleted or moved in or out, and the directory itself deleted or moved away; never through a
symlink, and only onto a directory. Not opens, or closes without a write (the daemon's own
reads of traces.jsonl would come back as events), nor attribute changes."""


def _read_limit(paths: Sequence[str]) -> int | None:
    # The lowest applies: the host's sysctl, or the user namespace's own when one is set lower.
    values = []
    for path in paths:
        try:
            with open(path) as f:
                values.append(int(f.read().strip()))
        except (OSError, ValueError):
            continue
    return min(values) if values else None


def describe_inotify_error(exc: OSError) -> str:
    if exc.errno in (errno.ENOSPC, errno.EMFILE):
        what, sysctl, suggested, files = (
            ("watch", "fs.inotify.max_user_watches", 524288, INOTIFY_WATCH_LIMIT_FILES)
            if exc.errno == errno.ENOSPC
            else ("instance", "fs.inotify.max_user_instances", 1024, INOTIFY_INSTANCE_LIMIT_FILES)
        )
        limit = _read_limit(files)
        return (
            f"the inotify {what} limit is reached ({sysctl} = "
            f"{limit if limit is not None else 'unknown'}); raise it with "
            f"`sysctl -w {sysctl}={suggested}` (and a file in /etc/sysctl.d/ to keep it), "
            "then reload or restart evalpush"
        )
    return exc.strerror or str(exc)


def filesystem_type(path: str, mountinfo: str) -> str | None:
    """The type of the filesystem `path` (a real path) is on, from /proc/self/mountinfo's text."""
    best, best_type = "", None
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5 or not right:
            continue
        mount_point = _unescape_mount(fields[4])
        if inside(path, mount_point) and len(mount_point) >= len(best):
            best, best_type = mount_point, right.split()[0]
    return best_type


def _unescape_mount(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo (octal).
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def on_network_filesystem(path: str) -> bool:
    try:
        with open("/proc/self/mountinfo") as f:
            mountinfo = f.read()
    except OSError:
        return False
    return filesystem_type(path, mountinfo) in NETWORK_FILESYSTEMS


def inotify_watches_in_use(pid: int | str = "self") -> int:
    """How many inotify watches the process holds (all its inotify instances), from /proc."""
    total = 0
    fd_dir = f"/proc/{pid}/fdinfo"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return 0
    for name in names:
        try:
            with open(os.path.join(fd_dir, name)) as f:
                total += sum(1 for line in f if line.startswith("inotify wd:"))
        except OSError:
            continue
    return total
