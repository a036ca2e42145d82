"""`evalpush ...` the way an operator runs it: by `cli.main` in this process, or as a real
subprocess where only a process shows it.

- `evalpush(environ, *args, **extra)`: run to its end (text output captured, bounded);
  `extra` variables are added to `environ` for this run only. Most commands run in this process
  (`in_process`): every process start pays the imports (about half a second of CPU, most of
  the suite's time when each command was a process). `run`, `demo` and `local-platform` run as
  processes (they serve, or start a daemon), and so does `push` while an in-process daemon runs
  (`LOG_HELD`): the process's log is the daemon's capture then, and a push's claims must not
  share the daemon's process identity. So does a command given a crash point
  (`EVALPUSH_CRASH_AT`: it SIGKILLs its process) or told it runs under systemd
  (`JOURNAL_STREAM`, `INVOCATION_ID`: whether its log goes to the journal is read from its
  stderr's file descriptor). A test that signals a push, or kills it, starts
  it as a process (`Started`, `pushing.start_push`).
- `as_process(environ, *args)`: `python -m evalpush ARGS` as a process, whatever the command.
- `in_process(environ, *args)`: `cli.main(args)` with the process environment replaced by
  `environ` for the call and stdout/stderr captured, as a `CompletedProcess`.
- `Started`: processes started with `start(environ, *args)` (output piped) and reaped by
  `reap()`: each one still running is continued (it may be SIGSTOPped) and SIGKILLed. The
  `start_evalpush` fixture (conftest.py) reaps them when the test ends.
- `status_json(run)`: `status --json`'s rows, where `run(*args)` runs evalpush (an exit other
  than 0 fails the test); `check_rows(stdout)`: `check`'s table.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

import structlog

from evalpush.core import secrets
from evalpush.upload.crash import CRASH_ENV

COMMAND_SECONDS = 60
"""How long one command may run before the test calls it hung (a loaded 2-core box)."""


AS_PROCESS = frozenset({"run", "demo", "local-platform"})
"""The commands `evalpush` runs as processes (see the module's docstring)."""


PROCESS_VARIABLES = frozenset({CRASH_ENV, "JOURNAL_STREAM", "INVOCATION_ID"})
"""Variables that make `evalpush` run any command as a process (see the module's docstring)."""


def evalpush(environ: dict[str, str], *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    environ = {**environ, **extra}
    if (
        AS_PROCESS.isdisjoint(args)
        and not ("push" in args and LOG_HELD)
        and PROCESS_VARIABLES.isdisjoint(environ)
    ):
        return in_process(environ, *args)
    return subprocess.run(
        [sys.executable, "-m", "evalpush", *args],
        env=environ,
        capture_output=True,
        text=True,
        timeout=COMMAND_SECONDS,
    )


def as_process(environ: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m evalpush ARGS` as a process, whatever the command: what it printed and its
    exit code."""
    return subprocess.run(
        [sys.executable, "-m", "evalpush", *args],
        env=environ,
        capture_output=True,
        text=True,
        timeout=COMMAND_SECONDS,
    )


LOG_HELD: list[object] = []
"""In-process daemons running now (`daemon_support.InProcessDaemon` adds itself): while one runs,
the process's log is its capture, and an in-process command leaves it alone."""


def in_process(environ: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`evalpush ARGS` by `cli.main`, here: what it printed (text, as a process's pipes would
    carry it) and its exit code; the process environment is `environ` while it runs.

    `main` configures the process's log for its command, as a process's would: here that log is
    shared, so it is put back afterwards, and while an in-process daemon runs (`LOG_HELD`) the
    command does not configure it at all: the daemon's lines logged meanwhile stay in its
    capture (the command's own log lines join them there)."""
    with _IN_PROCESS:
        return _in_process(environ, *args)


_IN_PROCESS = threading.Lock()
"""One in-process command at a time: each replaces the process's environment and streams."""


def _in_process(environ: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    from evalpush import log
    from evalpush.cli import main

    out, err = io.BytesIO(), io.BytesIO()
    streams = (
        io.TextIOWrapper(out, encoding="utf-8", write_through=True),
        io.TextIOWrapper(err, encoding="utf-8", write_through=True),
    )
    saved_environ, saved_streams = dict(os.environ), (sys.stdout, sys.stderr)
    saved_log, configure = dict(structlog.get_config()), log.configure
    saved_secrets = secrets.registered()
    if not LOG_HELD:  # as a new process: no secret registered but the command's own
        secrets.register_only(frozenset())
    if LOG_HELD:
        log.configure = lambda *args, **kwargs: None  # type: ignore[assignment]
    _become(environ)
    sys.stdout, sys.stderr = streams
    try:
        code = main(list(args))
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code if isinstance(exc.code, int) else 2
    finally:
        log.configure = configure  # type: ignore[assignment]
        structlog.configure(**saved_log)
        sys.stdout, sys.stderr = saved_streams
        _become(saved_environ)
        secrets.register_only(saved_secrets)  # what the command registered ends with it
    return subprocess.CompletedProcess(
        ["evalpush", *args],
        code,
        out.getvalue().decode("utf-8", "replace"),
        err.getvalue().decode("utf-8", "replace"),
    )


def _become(environ: dict[str, str]) -> None:
    """The process environment made `environ`, variable by variable: a thread of the test's
    (an in-process daemon) reading one meanwhile never sees the environment empty."""
    for name in [name for name in os.environ if name not in environ]:
        del os.environ[name]
    for name, value in environ.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


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
