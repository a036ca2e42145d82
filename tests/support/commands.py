"""`python -m evalpush ...` as a real subprocess, the way an operator runs it.

- `evalpush(environ, *args, **extra)`: run to its end (text output captured, bounded);
  `extra` variables are added to `environ` for this run only.
- `Started`: processes started with `start(environ, *args)` (output piped) and reaped by
  `reap()`: each one still running is continued (it may be SIGSTOPped) and SIGKILLed. The
  `start_evalpush` fixture (conftest.py) reaps them when the test ends.
- `status_json(run)`: `status --json`'s rows, where `run(*args)` runs evalpush (an exit other
  than 0 fails the test); `check_rows(stdout)`: `check`'s table.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable
from typing import Any

COMMAND_SECONDS = 60
"""How long one command may run before the test calls it hung (a loaded 2-core box)."""


def evalpush(environ: dict[str, str], *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "evalpush", *args],
        env={**environ, **extra},
        capture_output=True,
        text=True,
        timeout=COMMAND_SECONDS,
    )


class Started:
    """`evalpush ARGS...` processes started by a test, reaped at its end."""

    def __init__(self) -> None:
        self._processes: list[subprocess.Popen[bytes]] = []

    def start(self, environ: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            [sys.executable, "-m", "evalpush", *args],
            env=environ,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self._processes.append(process)
        return process

    def reap(self) -> None:
        for process in self._processes:
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.kill()
            process.communicate()


def status_json(run: Callable[..., subprocess.CompletedProcess[Any]]) -> list[dict]:
    done = run("status", "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def check_rows(stdout: str) -> dict[str, tuple[str, str]]:
    """`check`'s table: check -> (result, detail and fix)."""
    header, *rows = stdout.splitlines()
    assert header.split() == ["CHECK", "RESULT", "DETAIL"]
    return {
        name: (result, detail) for name, result, detail in (row.split(maxsplit=2) for row in rows)
    }
