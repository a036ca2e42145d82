"""A run's scan kept up to date while the daemon watches it being written, so that its upload
does not read the file a second time before the push.

The upload's scan step (docs/ARCHITECTURE.md, step 1) records the trace file's identity, the
SHA-256 of its bytes `[0, upload_end)`, the run's totals and the lines it sets aside. All of it
is a running sum over the file's complete lines in order, so the tracker feeds each line to a
`RunningScan` as the `LineCounter` reads it (each new line decoded once, as `tally` or `scan`
would: the same `convert.Pass`), and when the run is ready, `Prescan.columns` are exactly what
the scan step would write for the file as it was at that last look. The tracker writes them with
the run's queueing, and the upload starts at resolve.

What it promises: equal to the scan step on the same bytes, bit for bit (same lines, same order
of sums, same decoder, the same bytes hashed). What voids it: the file replaced, shrunk or
rewritten in place (`LineCounter` restarts the sink), a line over `read.max_line_bytes` (its
bytes are never held, so they cannot be hashed here): then `result()` is None and the upload
scans as before. Nothing of it outlives the process: a restarted daemon builds it again from
the file (see `Tracker`).
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from evalpush.convert import Pass, Scan
from evalpush.core.states import Step
from evalpush.runs import BOM, FileIdentity, Line


class Prescan(msgspec.Struct, frozen=True):
    """What the scan step finds in a trace file: the file as it was (`file`), the SHA-256 of
    its bytes up to `found.end`, the totals and the set-aside lines."""

    file: FileIdentity
    digest: bytes
    found: Scan

    def columns(self) -> dict[str, Any]:
        """The ledger columns the scan step writes (the set-aside lines go to their table)."""
        file, totals = self.file, self.found.totals
        return {
            "step": Step.RESOLVE,
            "file_device": file.device,
            "file_inode": file.inode,
            "file_size": file.size,
            "file_mtime_ns": file.mtime_ns,
            "file_ctime_ns": file.ctime_ns,
            "file_digest": self.digest,
            "upload_end": self.found.end,
            "totals": totals.to_json(),
            "samples_seen": totals.traces,
        }


class RunningScan:
    """A `runs.LineSink`: the scan of the lines fed so far, and the hash of their bytes."""

    def __init__(self, *, checked: bool, max_line_bytes: int) -> None:
        self._checked = checked
        self._max_line_bytes = max_line_bytes
        self.restart()

    def restart(self) -> None:
        self._pass = Pass.like(checked=self._checked, max_line_bytes=self._max_line_bytes)
        self._hash = hashlib.sha256()
        self._hashed = 0  # the bytes [0, _hashed) are in the hash
        self._void = False  # a byte was not seen (an over-long line): the hash is not the file's

    def line(self, line: Line) -> None:
        if line.start != self._hashed:
            if self._hashed == 0 and line.start == len(BOM):
                # read.read_lines skips a byte-order mark opening the file; the scan hashes it
                self._hash.update(BOM)
            else:
                self._void = True  # not the next line: nothing fed from here on is trusted
        if line.data is None:
            self._void = True
        else:
            self._hash.update(line.data)
            self._hash.update(b"\n")
        self._hashed = line.end
        self._pass.add(line)

    def result(self, file: FileIdentity) -> Prescan | None:
        """The scan of `file` (as the counter last saw it, its lines all fed), or None when it
        cannot stand for one."""
        found = self._pass.result
        if self._void or found.end != self._hashed or file.size < found.end:
            return None
        return Prescan(file, self._hash.digest(), found)


__all__ = ["Prescan", "RunningScan"]
