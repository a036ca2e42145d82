"""The read stage: tail a JSONL file by byte offset, one `\\n`-terminated line at a time.

Promises:
- only `\\n`-terminated lines are yielded; a half-written last line is left for a later read;
- each line comes with its byte range and its 1-based line number, so a reader can resume
  exactly at a saved offset;
- memory stays bounded by `max_line_bytes` plus one read chunk, whatever the file's size: a
  line longer than `max_line_bytes` is skipped over without being held, and yielded with
  `data=None` so the caller can set it aside;
- symlinks are never followed, and only regular files are read.
"""

from __future__ import annotations

import enum
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

CHUNK_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class FileIdentity:
    """Which file a path names (device, inode) and how big it was when looked at."""

    device: int
    inode: int
    size: int


class Change(enum.Enum):
    SAME = "same"
    GROWN = "grown"
    REPLACED = "replaced"  # another inode, or the same one shrunk (truncated)
    GONE = "gone"


class Line(NamedTuple):
    data: bytes | None  # None: the line was longer than max_line_bytes
    start: int
    end: int  # offset just past the line's `\n`
    number: int


def _open(path: Path) -> int:
    # O_NONBLOCK: opening a FIFO must not wait for a writer; it has no effect on a regular file.
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise IsADirectoryError(f"{path}: not a regular file")
    return fd


def identity(path: Path) -> FileIdentity:
    """The file's identity now; raises OSError if it is missing or not a regular file."""
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        raise FileNotFoundError(f"{path}: not a regular file")
    return FileIdentity(st.st_dev, st.st_ino, st.st_size)


def compare(path: Path, known: FileIdentity) -> Change:
    """How the file at `path` relates to the one seen before as `known`."""
    try:
        now = identity(path)
    except OSError:
        return Change.GONE
    if (now.device, now.inode) != (known.device, known.inode) or now.size < known.size:
        return Change.REPLACED
    return Change.GROWN if now.size > known.size else Change.SAME


def read_lines(
    path: Path,
    *,
    offset: int = 0,
    number: int = 0,
    end: int | None = None,
    max_line_bytes: int,
    expect: FileIdentity | None = None,
) -> Iterator[Line]:
    """Yield the complete lines of `path` from byte `offset` up to byte `end` (or EOF).

    `number` is the count of lines before `offset`. With `expect`, the file must still be that
    file (same device and inode), else `FileChangedError` is raised before anything is read.
    """
    fd = _open(path)
    try:
        if expect is not None:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != (expect.device, expect.inode) or st.st_size < offset:
                raise FileChangedError(f"{path}: the file was replaced or truncated")
        yield from _lines(fd, offset, number, end, max_line_bytes)
    finally:
        os.close(fd)


class FileChangedError(OSError):
    """The trace file is no longer the file the saved offset belongs to."""


def _lines(
    fd: int, offset: int, number: int, end: int | None, max_line_bytes: int
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
        pieces = chunk.split(b"\n")
        tail = pieces.pop()
        for piece in pieces:
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
        length += len(tail)
        if length > max_line_bytes:
            parts = []
        elif tail:
            parts.append(tail)
