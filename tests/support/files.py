"""Files and directories as tests make them.

- `write(path, data)`: `data` as the whole file (returns `path`); `append(path, data)`.
- `open_directory(prefix)`: a fresh directory every user may enter, removed afterwards (pytest's
  tmp_path is inside root's 0700 tree, so user `nobody` could not reach anything in it). The
  `open_dir` fixture (conftest.py) is one.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def append(path: Path, data: bytes) -> None:
    with path.open("ab") as f:
        f.write(data)


@contextlib.contextmanager
def open_directory(prefix: str = "evalpush-test-") -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path)
