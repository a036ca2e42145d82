"""A followed run's trace file between two stretches of its upload: what this process keeps of
it, so that each stretch reads only the bytes the file gained.

A followed run (docs/ARCHITECTURE.md, "Following a run") is uploaded a stretch at a time while
it is written: each stretch extends the run's fingerprint (the ledger's `upload_end` and the
SHA-256 of `[0, upload_end)`) to the file's last complete line, and pushes the lines that are new.
Hashing the whole file again at every stretch would cost its size each time, so a `Follows`
keeps, per run, the SHA-256 state at the fingerprint's end, the bytes `runs.windows` keeps there,
and conversion's running totals at the acknowledged offset. It is used only when it is exactly
what the ledger holds (the same end, digest and file): after a restart, a takeover, or another
process's stretch, the next stretch hashes the file once from its start, and conversion's totals
are rebuilt by one pass, as any resumed upload's are.

What it promises: an extension is taken only over the bytes the ledger fingerprinted, unchanged
as far as the windows show (the file's first bytes and those just before the fingerprint's end,
read back: an append-only producer never rewrites between them; `--resume` replaces the file,
which a new inode or a shorter file shows); anything else is `Rewritten`. The run's last
extension, before its finalize, hashes the whole prefix again (`whole`): a rewrite between the
windows may show in the open evaluation for a while, never in a finalized one.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalpush.convert import RunTotals
from evalpush.ledger import RunRecord
from evalpush.runs import Extension, extend, hash_open, identity_of, open_regular, windows
from evalpush.upload.files import Rewritten, fingerprint

__all__ = ["Follows"]


@dataclass
class _Known:
    """One followed run's file as this process last extended it."""

    device: int
    inode: int
    end: int
    digest: bytes
    state: Any  # SHA-256 of [0, end)
    windows: tuple[bytes, bytes]
    totals_at: int = -1  # the acknowledged offset `totals` (conversion's, JSON) are at
    totals: bytes = b""


class Follows:
    """What this process keeps of the runs it follows (shared by its upload workers; one job
    per run at a time, so a run's entry is only ever used by one of them)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: dict[str, _Known] = {}

    def extend(self, record: RunRecord, path: Path, *, whole: bool = False) -> Extension | None:
        """The run's trace file read on from its fingerprint's end to its last complete line;
        None when it gained no complete line. `Rewritten` when the fingerprinted bytes are not
        there any more (another file, shorter, or other bytes); `OSError` when it cannot be
        read (its caller finds out why). With `whole` (the run's last extension, before it is
        finalized), the prefix is hashed again whatever this process kept: the windows do not
        see bytes rewritten between them, and the finalize holds the file's every byte."""
        known = fingerprint(record)
        assert known is not None and known.digest is not None
        scanned, end = known.identity, known.end
        fd = open_regular(path)
        try:
            now = identity_of(os.fstat(fd))
            if (now.device, now.inode) != (scanned.device, scanned.inode) or now.size < end:
                raise Rewritten(f"{path}: replaced or truncated while it was followed")
            with self._lock:
                kept = self._known.get(record.run_id)
            at = (now.device, now.inode, end, known.digest)
            if kept is not None and (kept.device, kept.inode, kept.end, kept.digest) != at:
                kept = None  # what this process kept is of another file, or another end
            if whole or kept is None:
                hashed = hash_open(fd, end, path)  # the whole prefix: nothing kept, or the end
                if hashed.digest() != known.digest:
                    raise Rewritten(f"{path}: rewritten since its last stretch was uploaded")
                state = hashed.state()
            elif windows(fd, end) != kept.windows:
                raise Rewritten(f"{path}: rewritten in place while it was followed")
            else:
                state = kept.state
            extension = extend(fd, path, end, state)
        finally:
            os.close(fd)
        totals_at, totals = (kept.totals_at, kept.totals) if kept is not None else (-1, b"")
        with self._lock:
            self._known[record.run_id] = _Known(
                now.device,
                now.inode,
                extension.end,
                extension.digest,
                extension.state,
                extension.windows,
                totals_at,
                totals,
            )
        return extension if extension.end > end else None

    def windows(self, record: RunRecord) -> tuple[bytes, bytes] | None:
        """The bytes kept at the run's fingerprint's end, if this process extended it there."""
        with self._lock:
            kept = self._known.get(record.run_id)
        if kept is None or (kept.end, kept.digest) != (record.upload_end, record.file_digest):
            return None
        return kept.windows

    def totals(self, record: RunRecord) -> RunTotals | None:
        """Conversion's running totals at the run's acknowledged offset, if this process pushed
        up to there."""
        with self._lock:
            kept = self._known.get(record.run_id)
        if kept is None or kept.totals_at != record.acked_offset:
            return None
        return RunTotals.from_json(kept.totals)

    def converted(self, record: RunRecord, totals: RunTotals) -> None:
        """Conversion's totals once the run's lines up to its acknowledged offset were pushed."""
        with self._lock:
            kept = self._known.get(record.run_id)
            if kept is not None:
                kept.totals_at, kept.totals = record.acked_offset, totals.to_json()

    def forget(self, run_id: str) -> None:
        """The run is not followed any more (finalized, held, failed...): nothing kept of it
        is of use."""
        with self._lock:
            self._known.pop(run_id, None)
