"""`evalpush ...` on a pseudo-terminal, as a person at a terminal runs it.

- `on_a_terminal(env, *args, columns=160, stdout_too=False, timeout=60)`: `python -m evalpush
  ARGS` with stderr (and with `stdout_too` stdout as well) on a pseudo-terminal `columns` wide,
  read while it runs so a full terminal never blocks it; returns its exit code, stdout (b""
  with `stdout_too`) and what the terminal got.
- `ANSI`: an escape sequence (colour, cursor movement, erasing).
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import threading

ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


def on_a_terminal(
    env: dict[str, str],
    *args: str,
    columns: int = 160,
    stdout_too: bool = False,
    timeout: float = 60,
) -> tuple[int, bytes, bytes]:
    primary, secondary = pty.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    process = subprocess.Popen(
        [sys.executable, "-m", "evalpush", *args],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=secondary if stdout_too else subprocess.PIPE,
        stderr=secondary,
    )
    os.close(secondary)
    chunks: list[bytes] = []

    def read_terminal() -> None:
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # the terminal closed: everything is read
                return
            if not chunk:
                return
            chunks.append(chunk)

    reader = threading.Thread(target=read_terminal, name="pty-reader")
    reader.start()
    out, _ = process.communicate(timeout=timeout)
    reader.join(10)
    os.close(primary)
    return process.returncode, out or b"", b"".join(chunks)
