"""Counting a growing trace file's complete lines, reading only the bytes it gained since the
last look (`LineCounter`), and handing them to a running total (`LineSink`) on the way."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import msgspec

from evalpush.config import ReadConfig
from evalpush.runs.read import (
    CHUNK_BYTES,
    FileIdentity,
    Line,
    identity_of,
    read_lines,
    windows,
)


class LineCount(msgspec.Struct, frozen=True, gc=False):
    """A trace file as a `LineCounter` last saw it."""

    lines: int  # complete lines
    offset: int  # just past the last complete line
    size: int  # the file's size when looked at (bytes past `offset` are a half-written line)
    mtime: float  # its modification time, epoch seconds
    grown_at: float | None  # when it was seen growing, or first looked at (the counter's clock)
    replaced: bool  # replaced, shrunk or rewritten since the last look: restarted from 0
    file: FileIdentity  # the file looked at (device, inode, size, mtime, ctime), as it was then


class LineSink(Protocol):
    """Where a `LineCounter` feeds the lines it reads, for running totals kept as lines arrive."""

    def restart(self) -> None:
        """The file was replaced or truncated: forget every line fed so far."""

    def line(self, line: Line) -> None:
        """The next complete line, in file order (`line.data` None: over `max_line_bytes`)."""


class LineCounter:
    """Counts the complete lines of a growing trace file, reading only bytes it has not seen.

    Each `update()` opens the file (never through a symlink), and reads from where the last one
    stopped: counting `\\n` bytes in 1 MiB chunks with no decoding, or, given a `LineSink`, handing
    every new complete line to it (through `read.read_lines`). A half-written last line is not
    counted until its `\\n` arrives. Another inode at the path, or a file smaller than last time,
    restarts the count from 0 (and calls `sink.restart()` first). Feeding a sink, so does a file
    rewritten in place: whenever the file's stat changed, `read.WINDOW_BYTES` at its start
    and just before the end of what was fed are read back and must be the bytes fed. (A rewrite
    that keeps both windows and changes only bytes between them goes unseen: an append-only
    producer never does that, and `--resume` replaces the file.) Raises `OSError` when the file
    is gone or not a regular file. No I/O until `update()`; one counter per file, one thread.

    A new counter's first `update()` reads the whole file; `resume()` starts from a point known
    from before (the ledger's), so a restarted daemon does not re-read what it already counted.
    """

    def __init__(
        self,
        path: Path,
        *,
        clock: Callable[[], float] = time.time,
        max_line_bytes: int = ReadConfig().max_line_bytes,
    ) -> None:
        self.path = path
        self._clock = clock
        self._max_line_bytes = max_line_bytes
        self._identity: tuple[int, int] | None = None  # (device, inode) of the file counted
        self._size = 0  # its size at the last look
        self._stat: tuple[int, int, int] | None = None  # (size, mtime_ns, ctime_ns) then
        self._lines = 0
        self._offset = 0  # just past the last complete line counted
        self._scanned = 0  # bytes already looked at (>= offset: a half-written line's bytes)
        self._looked = False  # an update() ran: from then on, a change of size is growth seen
        self._grown_at: float | None = None
        self._windows: tuple[bytes, bytes] | None = None  # fed bytes: the head, before offset

    @classmethod
    def resume(
        cls, path: Path, file: FileIdentity, offset: int, lines: int, **options: Any
    ) -> LineCounter:
        """A counter that knows `lines` complete lines end at `offset` in `file` (as it was then)."""
        counter = cls(path, **options)
        counter._identity, counter._size = (file.device, file.inode), file.size
        counter._offset = counter._scanned = offset
        counter._lines = lines
        return counter

    def update(self, sink: LineSink | None = None) -> LineCount:
        fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise FileNotFoundError(f"{self.path}: not a regular file")
            file = identity_of(st)
            replaced = self._notice(st, sink, fd)
            if sink is None:
                self._windows = None  # bytes counted but not fed: nothing to compare later
                self._count(fd, st.st_size)
            else:
                self._feed(sink, file)
                self._windows = self._read_windows(fd)
        finally:
            os.close(fd)
        mtime = st.st_mtime_ns / 1e9
        return LineCount(
            self._lines, self._offset, st.st_size, mtime, self._grown_at, replaced, file
        )

    def _notice(self, st: os.stat_result, sink: LineSink | None, fd: int) -> bool:
        """Take in the file's stat: restart on a replacement (or, feeding a sink, a rewrite in
        place), time growth; whether it was replaced."""
        now = (st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        replaced = self._identity is not None and (
            (st.st_dev, st.st_ino) != self._identity
            or st.st_size < self._size
            or (sink is not None and now != self._stat and self._rewritten(fd))
        )
        if replaced:
            self._lines = self._offset = self._scanned = 0
            self._windows = None
            if sink is not None:
                sink.restart()
        if not self._looked or replaced or st.st_size != self._size:
            # The first look counts as a sighting: a file's mtime is the file server's clock,
            # and a host whose clock runs ahead of it would take a file being written for one
            # that settled long ago.
            self._grown_at = self._clock()
        self._identity, self._size, self._looked = (st.st_dev, st.st_ino), st.st_size, True
        self._stat = now
        return replaced

    def _read_windows(self, fd: int) -> tuple[bytes, bytes] | None:
        """The fed bytes kept to tell a rewrite in place (`read.windows`: the file's first ones
        and the last ones before the offset; None: nothing fed yet)."""
        return windows(fd, self._offset) if self._offset else None

    def _rewritten(self, fd: int) -> bool:
        """Whether the bytes kept from the last feed are other bytes now."""
        if self._windows is None:
            return False
        return self._read_windows(fd) != self._windows

    def _count(self, fd: int, size: int) -> None:
        position = self._scanned
        while position < size:
            chunk = os.pread(fd, min(CHUNK_BYTES, size - position), position)
            if not chunk:
                break
            newlines = chunk.count(b"\n")
            if newlines:
                self._lines += newlines
                self._offset = position + chunk.rindex(b"\n") + 1
            position += len(chunk)
        self._scanned = position

    def _feed(self, sink: LineSink, file: FileIdentity) -> None:
        for line in read_lines(
            self.path,
            offset=self._offset,
            number=self._lines,
            end=file.size,
            max_line_bytes=self._max_line_bytes,
            expect=file,
        ):
            sink.line(line)
            self._lines, self._offset = line.number, line.end
        self._scanned = max(self._scanned, self._offset)
