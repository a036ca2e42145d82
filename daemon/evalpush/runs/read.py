"""The read stage: tail a JSONL file by byte offset, one `\\n`-terminated line at a time.

Promises:
- only `\\n`-terminated lines are yielded; a half-written last line is left for a later read;
- each line comes with its byte range and its 1-based line number, so a reader can resume
  exactly at a saved offset;
- memory stays bounded by `max_line_bytes` plus one read chunk, whatever the file's size: a
  line longer than `max_line_bytes` is skipped over without being held, and yielded with
  `data=None` so the caller can set it aside;
- symlinks are never followed, and only regular files are read;
- a UTF-8 byte-order mark opening the file is skipped: line 1 starts after it (its byte range
  still counts it, so offsets are file offsets);
- a file's fingerprint (`Fingerprint`: its identity when scanned and a SHA-256 of the bytes of
  its complete lines) tells whether the bytes already scanned are still there (`verify`):
  a file rewritten in place is a replaced file, a file moved or touched is the same one.
"""

from __future__ import annotations

import enum
import hashlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import msgspec

CHUNK_BYTES = 1 << 20
BOM = b"\xef\xbb\xbf"


class FileIdentity(msgspec.Struct, frozen=True, gc=False):
    """Which file a path names (device, inode), how big it was and when it was last written
    (mtime) or changed in any way (ctime), when looked at."""

    device: int
    inode: int
    size: int
    mtime_ns: int = 0
    ctime_ns: int = 0


class Fingerprint(msgspec.Struct, frozen=True, gc=False):
    """What is kept of a trace file's bytes `[0, end)`: the file's identity when they were read,
    and their SHA-256 (None for a ledger row from before fingerprints: identity only)."""

    identity: FileIdentity
    end: int
    digest: bytes | None


class Change(enum.Enum):
    SAME = "same"
    GROWN = "grown"
    REPLACED = "replaced"  # another file, or the bytes read before are no longer there
    GONE = "gone"


class Line(NamedTuple):
    data: bytes | None  # None: the line was longer than max_line_bytes
    start: int
    end: int  # offset just past the line's `\n`
    number: int


def open_regular(path: Path) -> int:
    """A descriptor of the regular file at `path` (never through a symlink); OSError if there
    is none."""
    # O_NONBLOCK: opening a FIFO must not wait for a writer; it has no effect on a regular file.
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise IsADirectoryError(f"{path}: not a regular file")
    return fd


_KINDS = (
    (stat.S_ISLNK, "a symlink"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a device"),
    (stat.S_ISBLK, "a device"),
)


def what_is_at(path: Path) -> str | None:
    """What `path` names when it is not a regular file ("a symlink", "a directory", "a FIFO",
    ...; symlinks are not followed), "nothing" when it names nothing; None for a regular file."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return "nothing"
    if stat.S_ISREG(mode):
        return None
    return next((kind for test, kind in _KINDS if test(mode)), "not a regular file")


def identity_of(st: os.stat_result) -> FileIdentity:
    return FileIdentity(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def identity(path: Path) -> FileIdentity:
    """The file's identity now; raises OSError if it is missing or not a regular file."""
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        raise FileNotFoundError(f"{path}: not a regular file")
    return identity_of(st)


def compare(path: Path, known: FileIdentity) -> Change:
    """How the file at `path` relates to the one seen before as `known`, by identity alone."""
    try:
        now = identity(path)
    except OSError:
        return Change.GONE
    if (now.device, now.inode) != (known.device, known.inode) or now.size < known.size:
        return Change.REPLACED
    return Change.GROWN if now.size > known.size else Change.SAME


def verify(path: Path, known: Fingerprint) -> tuple[Change, FileIdentity | None]:
    """How the file at `path` relates to the bytes fingerprinted as `known`, and its identity now.

    An unchanged identity (inode, size, mtime, ctime) is the same file, without a read. Else the
    bytes decide: when `[0, known.end)` hashes the same, the file was moved, copied or touched
    (SAME) or appended to (GROWN); when not, or when they are gone, it is REPLACED, even if the
    inode is the same (a file rewritten in place).
    """
    try:
        now = identity(path)
    except OSError:
        return Change.GONE, None
    if now == known.identity:
        return Change.SAME, now
    if known.digest is None:  # a fingerprint without a hash: identity is all there is
        return compare(path, known.identity), now
    if now.size < known.end or digest_of(path, known.end, expect=now) != known.digest:
        return Change.REPLACED, now
    return (Change.GROWN if now.size > known.identity.size else Change.SAME), now


def digest_of(path: Path, end: int, *, expect: FileIdentity | None = None) -> bytes:
    """SHA-256 of bytes `[0, end)` of the file (`FileChangedError` if it is not `expect`)."""
    fd = open_regular(path)
    try:
        _check_same(fd, path, expect, end)
        return digest_open(fd, end, path)
    finally:
        os.close(fd)


def digest_open(fd: int, end: int, path: Path) -> bytes:
    """SHA-256 of bytes `[0, end)` of the open file `fd` (`path` names it in errors)."""
    return hash_open(fd, end, path).digest()


def hash_open(fd: int, end: int, path: Path) -> RangeDigest:
    """The SHA-256 of bytes `[0, end)` of the open file `fd`, to read its digest or go on from
    (`path` names it in errors)."""
    digest = RangeDigest()
    offset = 0
    while offset < end:
        chunk = os.pread(fd, min(CHUNK_BYTES, end - offset), offset)
        if not chunk:
            raise FileChangedError(f"{path}: shorter than {end} bytes")
        digest.update(chunk, complete=len(chunk))
        offset += len(chunk)
    return digest


class RangeDigest:
    """SHA-256 of the bytes of the complete lines read so far: `update` takes every byte read and
    where the last complete line in it ends; `digest` covers the bytes up to there."""

    def __init__(self, start: Any = None) -> None:
        """`start`: a SHA-256 state to go on from (a copy is taken), else a new one."""
        self._running = start.copy() if start is not None else hashlib.sha256()
        self._complete = self._running.copy()

    def update(self, chunk: bytes | memoryview, *, complete: int) -> None:
        """Add `chunk`, of which the first `complete` bytes end on a line's end (0: none do)."""
        view = memoryview(chunk)  # slices without copies
        if complete:
            self._running.update(view[:complete])
            self._complete = self._running.copy()
        if complete < len(view):
            self._running.update(view[complete:])

    def digest(self) -> bytes:
        return self._complete.digest()

    def state(self) -> Any:
        """The SHA-256 state at the last complete line (a copy, to go on from later)."""
        return self._complete.copy()


WINDOW_BYTES = 4096
"""What tells a file rewritten in place from one appended to, without hashing it all: this many
bytes at its start and just before the end of what was read, kept and read back."""


def windows(fd: int, end: int) -> tuple[bytes, bytes]:
    """The bytes kept of the open file `fd` read up to `end`: its first `WINDOW_BYTES` and the
    last ones before `end` (empty before anything was read)."""
    width = min(WINDOW_BYTES, end)
    if not width:
        return b"", b""
    return os.pread(fd, width, 0), os.pread(fd, width, end - width)


class Extension(NamedTuple):
    """A file read on from a fingerprinted end: its identity now, the end of its last complete
    line, the SHA-256 of `[0, end)` (and its state, to go on from), and the bytes `windows`
    keeps at that end."""

    file: FileIdentity
    end: int
    digest: bytes
    state: Any
    windows: tuple[bytes, bytes]


def extend(fd: int, path: Path, start: int, state: Any) -> Extension:
    """Read the open file `fd` on from byte `start`, where the SHA-256 `state` covers `[0,
    start)`, to the end of its last complete line: only the bytes it gained are read."""
    file = identity_of(os.fstat(fd))
    digest = RangeDigest(state)
    offset = end = start
    while offset < file.size:
        chunk = os.pread(fd, min(CHUNK_BYTES, file.size - offset), offset)
        if not chunk:
            break
        complete = chunk.rfind(b"\n") + 1
        digest.update(chunk, complete=complete)
        if complete:
            end = offset + complete
        offset += len(chunk)
    return Extension(file, end, digest.digest(), digest.state(), windows(fd, end))


def read_lines(
    path: Path,
    *,
    offset: int = 0,
    number: int = 0,
    end: int | None = None,
    max_line_bytes: int,
    expect: FileIdentity | None = None,
    digest: RangeDigest | None = None,
) -> Iterator[Line]:
    """Yield the complete lines of `path` from byte `offset` up to byte `end` (or EOF).

    `number` is the count of lines before `offset`. With `expect`, the file must still be that
    file (same device and inode), else `FileChangedError` is raised before anything is read.
    With `digest`, every byte read from `offset` on is hashed into it (a byte-order mark too).
    """
    fd = open_regular(path)
    try:
        _check_same(fd, path, expect, offset)
        if offset == 0 and os.pread(fd, len(BOM), 0) == BOM:
            offset = len(BOM)
            if digest is not None:
                digest.update(BOM, complete=len(BOM))
        yield from _lines(fd, offset, number, end, max_line_bytes, digest)
    finally:
        os.close(fd)


def _check_same(fd: int, path: Path, expect: FileIdentity | None, size_at_least: int) -> None:
    if expect is None:
        return
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != (expect.device, expect.inode) or st.st_size < size_at_least:
        raise FileChangedError(f"{path}: the file was replaced or truncated")


class FileChangedError(OSError):
    """The trace file is no longer the file the saved offset belongs to."""


def _lines(
    fd: int,
    offset: int,
    number: int,
    end: int | None,
    max_line_bytes: int,
    digest: RangeDigest | None,
) -> Iterator[Line]:
    line_start = offset  # where the line being assembled began
    read_at = offset  # the next byte to read
    parts: list[bytes] = []  # the current line's bytes so far; dropped once it is too long
    length = 0  # the current line's length so far, held or not
    while end is None or read_at < end:
        chunk = os.pread(
            fd, CHUNK_BYTES if end is None else min(CHUNK_BYTES, end - read_at), read_at
        )
        if not chunk:
            return
        read_at += len(chunk)
        if digest is not None:
            digest.update(chunk, complete=chunk.rfind(b"\n") + 1)
        # find (memchr) rather than split: split walks the chunk a byte at a time, and this
        # loop runs over every byte of every pass (measured: split was a fifth of the tally's
        # instructions).
        find = chunk.find
        begin = 0
        while (newline := find(b"\n", begin)) >= 0:
            piece = chunk[begin:newline]
            begin = newline + 1
            number += 1
            length += len(piece)
            stop = line_start + length + 1
            if length > max_line_bytes:
                yield Line(None, line_start, stop, number)
            elif parts:
                parts.append(piece)
                yield Line(b"".join(parts), line_start, stop, number)
            else:
                yield Line(piece, line_start, stop, number)
            line_start, length, parts = stop, 0, []
        tail = chunk[begin:]
        length += len(tail)
        if length > max_line_bytes:
            parts = []
        elif tail:
            parts.append(tail)
