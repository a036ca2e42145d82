"""`read_small_file`: a small file a person names (a secret, a config), read so that nothing put
in its place can hang or exhaust the reader.

Opened non-blocking (a FIFO opens at once instead of waiting for a writer), then it must be a
regular file (a FIFO, a device such as `/dev/zero`, a socket or a directory is refused) and is
read up to a cap (a larger file is refused, never read whole). A symlink is followed, as any
reader of the path would (a Kubernetes secret volume is links), and what it leads to is judged.
Every refusal is an `OSError` whose `strerror` says what was wrong, so a caller's message for
"cannot read" says it too.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

SECRET_FILE_BYTES = 64 * 1024
"""The cap on a secret file (an API key, a password): far above any real one."""


class NotRegularFile(OSError):
    """The path names a FIFO, a device, a socket or a directory."""


class FileTooLarge(OSError):
    """The file holds more bytes than its reader accepts."""


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "not a regular file"


def read_small_file(path: Path | str, limit: int | None) -> tuple[bytes, os.stat_result]:
    """The bytes of the regular file `path` (at most `limit`; None: no cap) and its stat,
    taken from the file read. `NotRegularFile`, `FileTooLarge` or the `OSError` of the open."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = _kind(info.st_mode)
            raise NotRegularFile(
                errno.EINVAL, f"not a regular file ({kind}); give a regular file", str(path)
            )
        if limit is not None and info.st_size > limit:
            raise FileTooLarge(errno.EFBIG, _too_large(limit), str(path))
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, 65536 if limit is None else min(65536, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if limit is not None and total > limit:
                raise FileTooLarge(errno.EFBIG, _too_large(limit), str(path))
        return b"".join(chunks), info
    finally:
        os.close(fd)


def _too_large(limit: int) -> str:
    return f"larger than {limit // 1024} KiB, which no such file is"


__all__ = ["SECRET_FILE_BYTES", "FileTooLarge", "NotRegularFile", "read_small_file"]
