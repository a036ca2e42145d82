"""sd_notify(3) in pure Python: tell systemd that the daemon is ready, what it does, that it lives.

Under `Type=notify` systemd passes `$NOTIFY_SOCKET`, an AF_UNIX datagram socket: a filesystem
path, or an abstract name written `@name`. Each message is one datagram of `KEY=value` lines:
`READY=1` (start-up is done), `STATUS=...` (one line `systemctl status` shows), `WATCHDOG=1`
(still alive), `RELOADING=1` (a SIGHUP reload began; `READY=1` ends it), `STOPPING=1`.

Promises:
- without `$NOTIFY_SOCKET` (not under systemd) every method does nothing;
- nothing here raises or blocks: a send that fails (a listener whose queue is full included:
  the socket does not block) is logged once (again only after a send succeeded in between) and
  the daemon goes on; no libsystemd, no I/O until the first message;
- `watchdog_seconds` is half of `$WATCHDOG_USEC` (the margin sd_watchdog_enabled(3) advises),
  and None when the watchdog is off or meant for another process (`$WATCHDOG_PID`). The loop
  that does the work should call `ping_if_due(time.monotonic())` on each turn and wake at least
  that often, so a wedged loop stops pinging and systemd restarts it.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any

from evalpush.log import get_logger

MAX_STATUS_CHARS = 512  # systemd reads at most 4096 bytes per datagram; a status is one line


class Notifier:
    """Sends sd_notify messages to one socket address (None: a notifier that does nothing)."""

    def __init__(
        self, address: str | None, *, watchdog_seconds: float | None = None, log: Any = None
    ) -> None:
        self.address = address
        self.watchdog_seconds = watchdog_seconds if address is not None else None
        self._log = log if log is not None else get_logger(stage="sdnotify")
        self._socket: socket.socket | None = None
        self._lock = threading.Lock()
        self._failing = False  # a failure was logged; the next success re-arms the log
        self._last_ping: float | None = None

    @classmethod
    def from_environ(
        cls, environ: Mapping[str, str] | None = None, *, pid: int | None = None, log: Any = None
    ) -> Notifier:
        """The notifier systemd's environment asks for (`os.environ` and `os.getpid()` default)."""
        environ = os.environ if environ is None else environ
        log = log if log is not None else get_logger(stage="sdnotify")
        address = _address(environ.get("NOTIFY_SOCKET", ""), log)
        seconds = _watchdog_seconds(environ, os.getpid() if pid is None else pid, log)
        return cls(address, watchdog_seconds=seconds, log=log)

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def ready(self) -> bool:
        return self.send("READY=1")

    def reloading(self) -> bool:
        # systemd >= 253 (Type=notify-reload) wants the monotonic time with it; older ones ignore it.
        return self.send("RELOADING=1", f"MONOTONIC_USEC={time.monotonic_ns() // 1000}")

    def status(self, text: str) -> bool:
        return self.send(f"STATUS={one_line(text)}")

    def stopping(self) -> bool:
        return self.send("STOPPING=1")

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1")

    def ping_if_due(self, now: float) -> bool:
        """Send `WATCHDOG=1` if `watchdog_seconds` have passed since the last ping (`now`: monotonic)."""
        if self.watchdog_seconds is None:
            return False
        if self._last_ping is not None and now - self._last_ping < self.watchdog_seconds:
            return False
        self._last_ping = now
        return self.watchdog()

    def send(self, *fields: str) -> bool:
        """Send `KEY=value` fields as one message; whether it went (never raises)."""
        if self.address is None:
            return False
        message = "\n".join(fields).encode("utf-8", "backslashreplace")
        try:
            with self._lock:
                if self._socket is None:
                    # Non-blocking: a listener that stopped reading (its queue full) must cost
                    # a dropped message, never a daemon stuck in sendto.
                    self._socket = socket.socket(
                        socket.AF_UNIX,
                        socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK,
                    )
                self._socket.sendto(message, self.address)
        except OSError as exc:
            if not self._failing:
                self._failing = True
                self._log.warning(
                    "cannot notify systemd; going on without it",
                    socket=_shown(self.address),
                    error=exc.strerror or str(exc),
                )
            return False
        if self._failing:
            self._failing = False
            self._log.info("notifying systemd again", socket=_shown(self.address))
        return True

    def close(self) -> None:
        with self._lock:
            if self._socket is not None:
                self._socket.close()
                self._socket = None

    def __enter__(self) -> Notifier:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def one_line(text: str) -> str:
    """`text` as one status line: line breaks become spaces, and it is cut to a readable length."""
    line = " ".join(text.split())
    return line if len(line) <= MAX_STATUS_CHARS else line[: MAX_STATUS_CHARS - 1] + "…"


def _address(value: str, log: Any) -> str | None:
    if not value:
        return None
    if value.startswith("@"):
        return "\0" + value[1:]  # an abstract socket name
    if value.startswith("/"):
        return value
    log.warning("NOTIFY_SOCKET is not a path or @name; not notifying systemd", socket=value)
    return None


def _watchdog_seconds(environ: Mapping[str, str], pid: int, log: Any) -> float | None:
    usec = environ.get("WATCHDOG_USEC", "")
    if not usec:
        return None
    owner = environ.get("WATCHDOG_PID", "")
    if owner and owner != str(pid):
        return None  # the watchdog is another process's
    try:
        micros = int(usec)
    except ValueError:
        micros = 0
    if micros <= 0:
        log.warning("WATCHDOG_USEC is not a positive number; no watchdog pings", value=usec)
        return None
    return micros / 2 / 1e6


def _shown(address: str) -> str:
    return "@" + address[1:] if address.startswith("\0") else address


__all__ = ["Notifier", "one_line"]
