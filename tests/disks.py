"""A real, tiny filesystem to fill up: what SQLite meets on a full disk (ENOSPC).

`tiny_disk(directory)` mounts a 1 MiB tmpfs there for the block (skipping the test where
mounting is not allowed, i.e. not root); `fill(disk)` takes every free byte, `free(disk)` gives
them back.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

TINY_DISK_BYTES = 1024 * 1024


@contextlib.contextmanager
def tiny_disk(directory: Path) -> Iterator[Path]:
    directory.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TINY_DISK_BYTES}", "tmpfs", str(directory)],
        capture_output=True,
    )
    if mounted.returncode != 0:
        pytest.skip("mounting a tmpfs needs root: " + mounted.stderr.decode().strip())
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=True)


def fill(disk: Path) -> None:
    """Take every free byte (a writer on the disk may have taken the last ones already)."""
    try:
        with open(disk / "filler", "ab") as f:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
    except OSError:
        pass


def free(disk: Path) -> None:
    (disk / "filler").unlink(missing_ok=True)
