"""Who a run is: its run id, the first of
- the directory's leaf name, when that is a UUID (the default layout);
- the id (`run.id`) its trace file's last complete line carries (0.2 on; a resumed 0.3/0.4
  run's lines carry the id of the attempt that wrote them, and the last attempt's is the
  run's; before a whole line is in, the daemon's tracker records the run under a stand-in
  from below and renames it once a line names it, `named_by_lines_later`);
- the id the ledger already holds for that path (`known`), so the host being renamed does not
  make it another run;
- `uuid5(NAMESPACE_URL, "evalpush:<hostname>:<absolute path>")`, stable across restarts and
  distinct across hosts (the path taken as the bytes the kernel knows it by, so a name that is
  not UTF-8 has an id too).
"""

from __future__ import annotations

import hashlib
import os
import socket
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from evalpush.config import ReadConfig
from evalpush.runs.layout import traces_file

KnownRunId = Callable[[Path], str | None]
"""The run id a ledger already knows for a directory at this path, if any."""


def derive_run_id(directory: Path, known: KnownRunId | None = None) -> str:
    """The run id of `directory`, by the rules above."""
    absolute = directory.absolute()
    found = _uuid_named(directory) or last_run_id(directory) or (known(absolute) if known else None)
    if found:
        return found
    key = b"evalpush:%s:%s" % (socket.gethostname().encode(), os.fsencode(absolute))
    return str(_uuid5(uuid.NAMESPACE_URL, key))


def named_by_lines_later(directory: Path) -> bool:
    """Whether `derive_run_id`'s answer for `directory` is a stand-in that a line written later
    replaces: its name is not a UUID and no complete line of its trace file names the run yet
    (a 0.3/0.4 run found before its first rollout finished)."""
    return _uuid_named(directory) is None and last_run_id(directory) is None


def _uuid_named(directory: Path) -> str | None:
    try:
        return str(uuid.UUID(directory.name))
    except ValueError:
        return None


class _RunRef(msgspec.Struct, gc=False):
    id: Any = None


class _RunOfLine(msgspec.Struct, gc=False):
    run: _RunRef | None = None


_RUN_OF_LINE = msgspec.json.Decoder(_RunOfLine)
TAIL_CHUNK_BYTES = 64 * 1024


def last_run_id(directory: Path) -> str | None:
    """The run id (`run.id`) of the last complete line of the directory's trace file, if that
    line is an object carrying one. The tail is read backwards, never more than one line of
    `read.max_line_bytes`."""
    traces = traces_file(directory)
    if traces is None:
        return None
    line = _last_line(traces, ReadConfig().max_line_bytes)
    if not line:
        return None
    try:
        found = _RUN_OF_LINE.decode(line)
    except (msgspec.DecodeError, RecursionError):
        return None
    run_id = found.run.id if found.run is not None else None
    return run_id if isinstance(run_id, str) and run_id else None


def _last_line(path: Path, limit: int) -> bytes | None:
    """The last `\n`-terminated line of `path` (a half-written one after it ignored)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        end = os.fstat(fd).st_size
        tail = b""
        position = end
        while position > 0 and len(tail) <= limit + 1:
            start = max(0, position - TAIL_CHUNK_BYTES)
            tail = os.pread(fd, position - start, start) + tail
            position = start
            last = tail.rfind(b"\n")
            if last < 0:
                continue
            before = tail.rfind(b"\n", 0, last)
            if before >= 0 or position == 0:
                line = tail[before + 1 : last]
                return line if line.strip() else None
        return None
    except OSError:
        return None
    finally:
        os.close(fd)


def _uuid5(namespace: uuid.UUID, name: bytes) -> uuid.UUID:
    """`uuid.uuid5` of a name given as bytes (for a UTF-8 name, the same id as `uuid5(str)`)."""
    digest = hashlib.sha1(namespace.bytes + name, usedforsecurity=False).digest()
    return uuid.UUID(bytes=digest[:16], version=5)
