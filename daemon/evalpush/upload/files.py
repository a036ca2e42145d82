"""The trace file under an upload: is it still the file that was scanned?

The scan records the file's identity (device, inode, size, mtime, ctime) and a SHA-256 of the
bytes it covers. Before each batch the file is looked at: a stat while it is unchanged, its bytes
when the stat changed (an append, a touch, or a rewrite: only the bytes can tell; for a followed
run's file, which grows all the time, the bytes `runs.windows` kept at the fingerprint's end
tell growth from a rewrite without hashing it all again). When an upload
resumes (after a crash, a stop, a takeover) the bytes are read whole, whatever the stat says: a
file rewritten in place within the clock's granularity keeps its mtime. A run directory moved
mid-upload keeps its upload going (the file is held open); a trace file deleted, or something
else put in its place, ends it.
"""

from __future__ import annotations

import os
from pathlib import Path

from evalpush.ledger import RunRecord
from evalpush.runs import (
    Change,
    FileChangedError,
    FileIdentity,
    Fingerprint,
    Run,
    digest_of,
    digest_open,
    identity,
    identity_of,
    open_regular,
    verify,
    what_is_at,
    windows,
)


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
    """Looks at the trace file before each batch (see the module docstring). It keeps the file
    open: when the path names nothing any more but the file still exists (its run directory was
    moved or renamed) and that directory is gone from where it was, the upload goes on with the
    same bytes, read through the open file; a file deleted, or moved out of a directory that is
    still there, is gone. Use as a context manager (it closes the file)."""

    def __init__(
        self, path: Path, known: Fingerprint, kept: tuple[bytes, bytes] | None = None
    ) -> None:
        self._path = path
        self._known = known
        self._kept = kept
        self._seen = known.identity
        self._fd = open_regular(path)
        opened = identity_of(os.fstat(self._fd))
        if (opened.device, opened.inode) != (known.identity.device, known.identity.inode):
            os.close(self._fd)
            raise FileChangedError(f"{path}: the file was replaced")

    def __enter__(self) -> FileWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self._fd)

    def check(self) -> None:
        try:
            now = identity(self._path)
        except FileNotFoundError:
            if what_is_at(self._path) != "nothing":  # a symlink, a directory... in its place
                raise FileChangedError(f"{self._path}: replaced mid-upload") from None
            return self._check_moved()
        except OSError as exc:
            raise FileChangedError(f"{self._path}: cannot look at it: {exc}") from None
        if now == self._seen:
            return
        if self._grown(now):
            return
        change, now = verify(self._path, self._known)
        if change == Change.GONE or now is None:
            raise FileChangedError(f"{self._path}: deleted mid-upload")
        if change == Change.REPLACED:
            raise Rewritten(f"{self._path}: replaced or rewritten mid-upload")
        self._seen = now

    def _grown(self, now: FileIdentity) -> bool:
        """A followed run's file grown since its stretch began: the same file, and the bytes
        kept at the fingerprint's end (`kept`, `runs.windows`) still there, tell it without
        hashing it all again (other bytes there: `Rewritten`). False when nothing was kept."""
        known = self._known
        if self._kept is None:
            return False
        same_file = (now.device, now.inode) == (known.identity.device, known.identity.inode)
        if not same_file or now.size < known.end:
            return False  # verify says how
        if windows(self._fd, known.end) != self._kept:
            raise Rewritten(f"{self._path}: rewritten in place while it was followed")
        self._seen = now
        return True

    def _check_moved(self) -> None:
        """The path names nothing: the run directory moved with its file (go on), or the file
        was deleted or moved out of it (gone)."""
        st = os.fstat(self._fd)
        if st.st_nlink == 0 or os.path.lexists(self._path.parent):
            raise FileChangedError(f"{self._path}: deleted mid-upload")
        now = identity_of(st)
        if now == self._seen:
            return
        known = self._known
        if now.size < known.end or digest_open(self._fd, known.end, self._path) != known.digest:
            raise Rewritten(f"{self._path}: rewritten mid-upload, after its directory moved")
        self._seen = now
