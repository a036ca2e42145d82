"""The trace file under an upload: is it still the file that was scanned?

The scan records the file's identity (device, inode, size, mtime, ctime) and a SHA-256 of the
bytes it covers. Before each batch the file is looked at: a stat while it is unchanged, its bytes
when the stat changed (an append, a touch, or a rewrite: only the bytes can tell). When an upload
resumes (after a crash, a stop, a takeover) the bytes are read whole, whatever the stat says: a
file rewritten in place within the clock's granularity keeps its mtime.
"""

from __future__ import annotations

from pathlib import Path

from evalpush.ledger import RunRecord
from evalpush.read import (
    Change,
    FileChangedError,
    FileIdentity,
    Fingerprint,
    digest_of,
    identity,
    verify,
)
from evalpush.runs import Run


class Rewritten(FileChangedError):
    """The trace file's scanned bytes changed (replaced, or rewritten in place)."""


def fingerprint(record: RunRecord) -> Fingerprint | None:
    """What the ledger knows of the run's trace file, once scanned."""
    if record.file_device is None or record.file_inode is None or record.upload_end is None:
        return None
    scanned = FileIdentity(
        record.file_device,
        record.file_inode,
        record.file_size or 0,
        record.file_mtime_ns or 0,
        record.file_ctime_ns or 0,
    )
    return Fingerprint(scanned, record.upload_end, record.file_digest)


def check_bytes(record: RunRecord, run: Run) -> None:
    """On resuming an upload: the file's bytes must still be the ones scanned, read whole."""
    assert record.upload_end is not None
    if digest_of(run.traces_path, record.upload_end) != record.file_digest:
        raise Rewritten(f"{run.traces_path}: rewritten since the upload began")


class FileWatch:
    """Looks at the trace file before each batch (see the module docstring)."""

    def __init__(self, path: Path, known: Fingerprint):
        self._path = path
        self._known = known
        self._seen = known.identity

    def check(self) -> None:
        try:
            now = identity(self._path)
        except OSError:
            raise FileChangedError(f"{self._path}: deleted mid-upload") from None
        if now == self._seen:
            return
        change, now = verify(self._path, self._known)
        if change == Change.GONE or now is None:
            raise FileChangedError(f"{self._path}: deleted mid-upload")
        if change == Change.REPLACED:
            raise Rewritten(f"{self._path}: replaced or rewritten mid-upload")
        self._seen = now
