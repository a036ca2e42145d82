"""Helpers for tests of `evalpush run` on a temporary tree, in this process or as a subprocess.

- `daemon_environ(platform, tmp_path, roots, **extra)`: `support.environ.cli_environ` (this
  environment less any PRIME_, EVALPUSH_ or systemd variable, pointed at `platform`: its key
  unless `PRIME_API_KEY=None`, with a state dir and home under `tmp_path`) with `roots`
  watched, a short settle time and rescan, small batches and JSON logs at info level. An
  `extra` value of None removes that variable.
- `Daemon(environ, *args, prefix=())`: `[PREFIX...] python -m evalpush [ARGS] run` (a prefix
  such as `setpriv ...` changes how it runs), started at once; a thread reads
  what it prints (stdout and stderr, merged) into `raw` (bytes, every line) and `events` (the
  JSON log lines). `wait_for(event, **fields)` waits for a log line; `stop()` sends SIGTERM and
  returns the exit code; `kill()` SIGKILLs it; as a context manager it is always reaped.
- `InProcessDaemon(environ)`: the same face (`wait_for`, `find`, `started`, `text`, `stop`),
  with `service.Daemon` run on a thread of this process, configured from `environ` as the
  command would be, its JSON log lines captured: the default for a test of what the daemon
  does. `Daemon` (a process) stays where only a process shows it: exit codes on signals,
  kill -9, SIGHUP, sd_notify, claims between processes, what reaches stderr outside the log.
- `wait_until(condition, what)`: polls `condition` until it returns something truthy, which it
  returns; fails the test naming `what` after `timeout` seconds (`support.waiting`).
- `RunDir`: a run directory (uuid name = run id) whose `config.toml` and `traces.jsonl` a test
  writes as a producer would: `write(lines, half_pause=...)` appends line by line, each line
  first cut in two and held half-written for a while.
- `trace_line(i, idx)`: a small valid trace line.
- `NotifySocket`: an AF_UNIX datagram socket standing in for systemd's `$NOTIFY_SOCKET`.
- `status(environ)`: `evalpush status --json` rows, by run id.
- `evaluations_of(platform, run_id)`: the platform's evaluations of a run (id -> summary;
  `support.platform_view`).
"""

from __future__ import annotations

import functools
import io
import json
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Self

import orjson
import pytest

from evalpush.local_platform import LocalPlatform
from support import runs
from support.commands import LOG_HELD, evalpush, status_json
from support.environ import NOT_INHERITED, cli_environ
from support.platform_view import evaluations_of
from support.waiting import POLL_SECONDS, WAIT_SECONDS, wait_until

# re-exported: the daemon's tests import these from here
__all__ = ["NOT_INHERITED", "POLL_SECONDS", "WAIT_SECONDS", "evaluations_of", "wait_until"]

STOP_SECONDS = 15.0
"""How long a SIGTERMed daemon may take to exit before the test calls it hung."""
SETTLE_SECONDS = 1.5
RESCAN_SECONDS = 2.0
BATCH_SAMPLES = 5
RUN_STARTED = "evalpush daemon running"
RUN_FINALIZED = "run finalized"


def daemon_environ(
    platform: LocalPlatform, tmp_path: Path, roots: Iterable[Path], **extra: str | None
) -> dict[str, str]:
    settings: dict[str, str | None] = {
        "EVALPUSH_WATCH__ROOTS": json.dumps([str(root) for root in roots]),
        "EVALPUSH_WATCH__RESCAN_SECONDS": str(RESCAN_SECONDS),
        "EVALPUSH_RUNS__SETTLE_SECONDS": str(SETTLE_SECONDS),
        "EVALPUSH_UPLOAD__MAX_BATCH_SAMPLES": str(BATCH_SAMPLES),
        "EVALPUSH_PLATFORM__READ_TIMEOUT_SECONDS": "5",
        "EVALPUSH_PLATFORM__CONNECT_TIMEOUT_SECONDS": "2",
        "EVALPUSH_LOG__LEVEL": "info",
        "EVALPUSH_LOG__FORMAT": "json",
    }
    return cli_environ(platform, tmp_path, **{**settings, **extra})


class _Output:
    """What a daemon printed: every line (`raw`) and its JSON log lines (`events`), waited on."""

    def __init__(self) -> None:
        self.raw: list[bytes] = []
        self.events: list[dict[str, Any]] = []
        self._cond = threading.Condition()

    def _line(self, line: bytes) -> None:
        try:
            event = orjson.loads(line)
        except orjson.JSONDecodeError:
            event = None
        with self._cond:
            self.raw.append(line)
            if isinstance(event, dict):
                self.events.append(event)
            self._cond.notify_all()

    def _ended(self) -> bool:
        """Whether the daemon has exited and everything it printed was read."""
        raise NotImplementedError

    def _exit(self) -> object:
        """How it exited, for a failure's message (None while it runs)."""
        raise NotImplementedError

    def find(self, event: str, **fields: Any) -> list[dict[str, Any]]:
        """The log lines saying `event` whose fields include `fields`."""
        with self._cond:
            return [
                e
                for e in self.events
                if e.get("event") == event and all(e.get(k) == v for k, v in fields.items())
            ]

    def wait_for(
        self, event: str, *, timeout: float = WAIT_SECONDS, count: int = 1, **fields: Any
    ) -> dict[str, Any]:
        """The `count`th log line saying `event` with `fields`, waited for; fails the test
        (showing what the daemon printed) if it does not come or the daemon exits first."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = self.find(event, **fields)
                if len(found) >= count:
                    return found[count - 1]
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._ended():
                    break
                self._cond.wait(min(remaining, 0.5))
        pytest.fail(
            f"the daemon did not log {event!r} {fields or ''} ({count}x) within {timeout:.0f} s; "
            f"exit {self._exit()}; it printed:\n{self.text()}"
        )

    def started(self) -> Self:
        self.wait_for(RUN_STARTED)
        return self

    def text(self) -> str:
        with self._cond:
            return b"".join(self.raw).decode("utf-8", "replace")


class Daemon(_Output):
    """`python -m evalpush [ARGS] run` as a subprocess, and what it printed."""

    def __init__(self, environ: dict[str, str], *args: str, prefix: Sequence[str] = ()) -> None:
        super().__init__()
        self.environ = environ
        self.process = subprocess.Popen(
            [*prefix, sys.executable, "-m", "evalpush", *args, "run"],
            env=environ,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self._reader = threading.Thread(target=self._read, name="daemon-output", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._line(line)

    def _ended(self) -> bool:
        return self.process.poll() is not None and not self._reader.is_alive()

    def _exit(self) -> object:
        return self.process.poll()

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def stop(self, timeout: float = STOP_SECONDS) -> int:
        """SIGTERM, then its exit code; fails the test if it does not exit within `timeout`."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"the daemon did not exit within {timeout} s of SIGTERM:\n{self.text()}")
        self._reader.join()
        return code

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self._reader.join()

    def __enter__(self) -> Daemon:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
        assert self.process.stdout is not None
        self.process.stdout.close()


class _LogLines(io.RawIOBase):
    """The stream the in-process daemon logs to: each write is one line (structlog's
    WriteLogger writes a line in one call), handed to the output."""

    def __init__(self, output: _Output) -> None:
        self._output = output

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def write(self, text: Any) -> int:
        data = text.encode() if isinstance(text, str) else bytes(text)
        for line in data.splitlines(keepends=True):
            self._output._line(line)
        return len(text)

    def flush(self) -> None:
        pass


class InProcessDaemon(_Output):
    """`evalpush run` in this process: `service.Daemon` on a thread, configured from `environ`
    as the command would be (`load_config(environ=...)`, its key and home from `environ`), its
    JSON log lines captured as a subprocess's would be. No process start-up; what only a process
    shows (exit codes on signals, kill -9, sd_notify, reload by SIGHUP) stays with `Daemon`.
    `stop()` asks the loop to stop as SIGTERM does and returns `run`'s result; a daemon that
    does not stop within `STOP_SECONDS` fails the test."""

    def __init__(self, environ: dict[str, str]) -> None:
        from evalpush import log
        from evalpush.config import load_config
        from evalpush.service import Daemon as ServiceDaemon

        super().__init__()
        self.environ = environ
        self._code: object = None
        self._error: BaseException | None = None
        config = load_config(environ=environ)
        log.configure(config.log.level, config.log.format, stream=_LogLines(self))
        LOG_HELD.append(self)
        config_file = environ.get("EVALPUSH_CONFIG")
        self._daemon = ServiceDaemon(
            lambda: load_config(environ=environ),
            environ=environ,
            home=Path(environ["HOME"]),
            config_file=None if config_file is None else str(Path(config_file).absolute()),
        )
        self._thread = threading.Thread(
            target=self._run, args=(config,), name="in-process-daemon", daemon=True
        )
        self._thread.start()

    def _run(self, config: Any) -> None:
        try:
            self._code = self._daemon.run(config)
        except BaseException as exc:  # the test sees it: `stop` raises it, `wait_for` shows it
            self._error = exc
        finally:
            LOG_HELD.remove(self)
            with self._cond:
                self._cond.notify_all()

    def _ended(self) -> bool:
        return not self._thread.is_alive()

    def _exit(self) -> object:
        return self._error or self._code

    def reload(self) -> None:
        """What SIGHUP asks: read the configuration again."""
        from evalpush.service import Request

        self._daemon.request(Request.RELOAD)

    def stop(self, timeout: float = STOP_SECONDS) -> object:
        """Stop as SIGTERM does; `run`'s result (0), or its error raised."""
        from evalpush import log
        from evalpush.service import Request

        self._daemon.request(Request.STOP)
        self._thread.join(timeout)
        if self._thread.is_alive():
            pytest.fail(f"the daemon did not stop within {timeout} s:\n{self.text()}")
        log.configure("info", "json", stream=sys.stderr)
        if self._error is not None:
            raise self._error
        return self._code

    def __enter__(self) -> InProcessDaemon:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread.is_alive():
            self.stop()


def trace_line(i: int, idx: int, *, reward: float | None = None) -> bytes:
    return runs.trace_line(i, idx, prompt=f"{i}+2?", answer=str(i + 2), reward=reward)


class RunDir:
    """A run directory written as the producer writes one (see the module docstring)."""

    def __init__(self, parent: Path, *, run_id: str | None = None) -> None:
        self.run_id = run_id or str(uuid.uuid4())
        self.path = parent / self.run_id
        self.traces = self.path / "traces.jsonl"

    def config(
        self,
        *,
        num_tasks: int | None = None,
        num_rollouts: int = 2,
        env: str = "gsm8k",
        extra: str = "",
    ) -> RunDir:
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / "config.toml").write_text(
            runs.config_toml(env=env, num_rollouts=num_rollouts, num_tasks=num_tasks, extra=extra)
        )
        return self

    def write(self, lines: Iterable[bytes], *, half_pause: float = 0.0, pause: float = 0.0) -> None:
        """Append each line and its `\\n`; with `half_pause`, each line is first written cut in
        two and held half-written that long."""
        with open(self.traces, "ab") as f:
            for line in lines:
                if half_pause:
                    f.write(line[: len(line) // 2])
                    f.flush()
                    time.sleep(half_pause)
                    f.write(line[len(line) // 2 :] + b"\n")
                else:
                    f.write(line + b"\n")
                f.flush()
                if pause:
                    time.sleep(pause)

    def touch_traces(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        self.traces.touch()

    def lines(self, count: int, *, start: int = 0, rollouts: int = 2) -> list[bytes]:
        return [trace_line(i, i // rollouts) for i in range(start, start + count)]


class NotifySocket:
    """An AF_UNIX datagram socket bound at a short path, as `$NOTIFY_SOCKET` (systemd's)."""

    def __init__(self) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="ep-", dir="/tmp"))  # AF_UNIX: 107 bytes
        self.address = str(self._dir / "notify")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.address)
        self.received: list[str] = []

    def wait_for(self, prefix: str, *, timeout: float = WAIT_SECONDS) -> str:
        """The next message starting with `prefix` (every message is kept in `received`)."""
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            self.sock.settimeout(remaining)
            try:
                message = self.sock.recv(65536).decode("utf-8")
            except TimeoutError:
                break
            self.received.append(message)
            if message.startswith(prefix):
                return message
        pytest.fail(f"no {prefix!r} within {timeout:.0f} s; received {self.received}")

    def close(self) -> None:
        self.sock.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> NotifySocket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def status(environ: dict[str, str]) -> dict[str, dict[str, Any]]:
    """`evalpush status --json`, rows by run id (a run's earlier evaluations left out)."""
    rows = status_json(functools.partial(evalpush, environ))
    return {row["run_id"]: row for row in rows if row["state"] != "superseded"}


def completed(platform: LocalPlatform, run_id: str) -> dict[str, Any] | None:
    """The run's COMPLETED evaluation (with its `id`), or None."""
    for key, evaluation in evaluations_of(platform, run_id).items():
        if evaluation["status"] == "COMPLETED":
            return {**evaluation, "id": key}
    return None


def slow_run(
    platform: LocalPlatform,
    group: Path,
    *,
    traces: int = 40,
    stalls: int = 5,
    seconds: float = 0.3,
) -> RunDir:
    """A finished run under `group` whose upload (one sample a batch:
    `EVALPUSH_UPLOAD__MAX_BATCH_SAMPLES=1`) is kept mid-way: the platform holds each of the next
    `stalls` samples requests for `seconds`."""
    run = RunDir(group).config(num_tasks=traces // 2)
    run.write(run.lines(traces))
    platform.inject("stall", on="samples", count=stalls, seconds=seconds)
    return run


def upload_under_way(platform: LocalPlatform) -> None:
    """Wait until the platform has seen a samples request."""
    wait_until(lambda: platform.summary()["requests"].get("samples"), "the upload to be under way")
