"""File names are bytes: how evalpush keeps them and how it shows them.

A Linux file name is any bytes but `/` and NUL; Python hands a name that is not UTF-8 to us as
`str` with lone surrogates (`surrogateescape`), which works for every `os` call but cannot be
encoded for SQLite, a terminal or a JSON log. So:
- `raw(path)` is the bytes the kernel knows the path by: what identifies it (the ledger keeps it);
- `display(path)` is UTF-8 text for people, each byte that is not UTF-8 shown as `\\xNN`;
- `printable(text)` makes any text (say, an error message quoting such a path) safe to store or
  print, lone surrogates shown the same way.
"""

from __future__ import annotations

import os
from pathlib import Path


def raw(path: Path | str) -> bytes:
    """The path's bytes, as the kernel knows them."""
    return os.fsencode(path)


def from_raw(data: bytes) -> Path:
    """The path `raw` gave `data` for."""
    return Path(os.fsdecode(data))


def display(path: Path | str | bytes) -> str:
    """The path as printable UTF-8: bytes that are not UTF-8 are shown as `\\xNN`."""
    data = path if isinstance(path, bytes) else os.fsencode(path)
    return data.decode("utf-8", "backslashreplace")


def printable(text: str) -> str:
    """`text` with any lone surrogate (a non-UTF-8 byte of a file name) shown as `\\xNN`."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate no file name produced: show its code point
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
