"""Logging: structlog, JSON lines for journald, console lines on a TTY, secrets redacted.

`log.format = "auto"` (the default): structlog's `ConsoleRenderer` when the stream is a
terminal, coloured only where the terminal has colour (`colours`: not with `$NO_COLOR`, nor on
`TERM=dumb`), exceptions as plain tracebacks; JSON lines when it is not a terminal or goes to
the journal. `console` and `json` force one. Both renderers get every event scrubbed.

Under systemd, with the stream going to the journal (`$JOURNAL_STREAM` names the stream's
device and inode; or `$INVOCATION_ID` is set and the stream is not a terminal), every line
starts with the syslog priority journald reads (`<3>` error, `<4>` warning, `<6>` info, `<7>`
debug): `journalctl -p warning` then filters evalpush's lines, and the prefix is not shown.

Every event passes `redact` (a structlog processor) on its way out: each value goes through
`evalpush.core.secrets.scrub`, the one scrubber of secrets (re-exported here with the rest of
its face, `register_secret`, `scrubbed_output`, `REDACTED`).

`main` configures structlog once for the process (`configure`, `capture_warnings`); a command
that draws a live view on the terminal (`push`, `demo`) points it at that view, and a reload
of the daemon configures it again. `get_logger` is structlog's own: its events take the
configuration of the moment they are logged.
"""

from __future__ import annotations

import io
import logging
import os
import stat
import sys
import threading
import traceback
import warnings
from collections.abc import MutableMapping
from typing import Any

import structlog

from evalpush.core.secrets import (  # re-exported: the scrubber is part of log's face
    MIN_SECRET_CHARS,
    REDACTED,
    holds_secret,
    register_secret,
    scrub,
    scrubbed_output,
)


def _scrub_value(value: Any) -> Any:
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, BaseException):
        return scrub(f"{type(value).__name__}: {value}")
    if isinstance(value, (bytes, bytearray)):
        return scrub(repr(bytes(value)))
    if isinstance(value, dict):
        return {k: _scrub_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_scrub_value(v) for v in value]
    return value


def redact(_logger: Any, _method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """structlog processor: scrub secrets from every value of the event."""
    for key, value in event.items():
        if key.lower() in ("api_key", "authorization", "key"):
            event[key] = REDACTED
        else:
            event[key] = _scrub_value(value)
    return event


SYSLOG_PRIORITY = {"debug": 7, "info": 6, "warning": 4, "error": 3, "critical": 2}
"""The `<N>` prefix journald reads from a line (sd-daemon(3)): by structlog's level name."""


Logger = structlog.typing.FilteringBoundLogger


def get_logger(**context: Any) -> Logger:
    """structlog's logger with `context` bound to each of its events."""
    return structlog.get_logger(**context)  # type: ignore[no-any-return]


def configure(level: str = "info", fmt: str = "auto", stream: Any = None) -> None:
    """Set up structlog for the process: JSON when not a TTY (or asked), else console."""
    stream = stream or sys.stderr
    journal = to_journal(stream)
    if fmt == "auto":
        fmt = "console" if _isatty(stream) and not journal else "json"
    renderer: Any = (
        structlog.dev.ConsoleRenderer(
            colors=colours(stream),
            exception_formatter=structlog.dev.plain_traceback,  # never a frame's locals
        )
        if fmt == "console"
        else structlog.processors.JSONRenderer()
    )
    if journal:
        renderer = _Prioritized(renderer)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            redact,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]  # level names in any case
        ),
        logger_factory=structlog.WriteLoggerFactory(stream),  # a line in one write
        cache_logger_on_first_use=False,  # a reload's new level reaches loggers made before
    )


def capture_warnings() -> None:
    """Python warnings (a library's `warnings.warn`) become log lines at warning level, and a
    thread's uncaught exception one at error level, so a daemon's output stays one JSON object
    per line for the journal, scrubbed; for the process (main).

    watchdog's notice that a directory's inotify watch was registered twice (a directory made
    while its parent's watch was being added: the second registration replaces the first with
    the same callback) is dropped: nothing is lost, and it is not something an operator can act
    on."""
    warnings.filterwarnings(
        "ignore", message=r"Callback with id .* already exists", category=RuntimeWarning
    )

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: Any = None,
        line: str | None = None,
    ) -> None:
        get_logger(stage="python").warning(
            "python warning",
            category=category.__name__,
            where=f"{filename}:{lineno}",
            warning=str(message),
        )

    warnings.showwarning = show
    threading.excepthook = _log_thread_exception


def _log_thread_exception(args: threading.ExceptHookArgs) -> None:
    """A thread's uncaught exception (one of a library's: watchdog's observer) is one log line,
    its traceback a field, scrubbed like any other; Python's default printed it raw, past the
    scrubber and across many lines of the journal."""
    if args.exc_type is SystemExit:
        return
    get_logger(stage="python").error(
        "a thread ended with an exception",
        thread=args.thread.name if args.thread is not None else None,
        error=f"{args.exc_type.__name__}: {args.exc_value}",
        traceback="".join(
            traceback.format_exception(args.exc_type, args.exc_value, args.exc_traceback)
        ),
    )


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def colours(stream: Any, environ: dict[str, str] | None = None) -> bool:
    """Whether console lines on `stream` are coloured: on a terminal that has colour, unless
    `$NO_COLOR` is set (no-color.org); `$TERM` unset or `dumb` has none."""
    environ = dict(os.environ) if environ is None else environ
    if environ.get("NO_COLOR"):
        return False
    return _isatty(stream) and environ.get("TERM", "") not in ("", "dumb")


def to_journal(stream: Any, environ: dict[str, str] | None = None) -> bool:
    """Whether `stream` goes to the journal: `$JOURNAL_STREAM` (`device:inode`, set by systemd
    for a unit's stdout/stderr) names it, or, without that variable, `$INVOCATION_ID` says
    systemd started us and the stream is not a terminal."""
    environ = dict(os.environ) if environ is None else environ
    journal = environ.get("JOURNAL_STREAM")
    try:
        fd = stream.fileno()
        if journal:
            device, _, inode = journal.partition(":")
            st = os.fstat(fd)
            return (str(st.st_dev), str(st.st_ino)) == (device, inode)
        return bool(environ.get("INVOCATION_ID")) and not os.isatty(fd) and _not_a_file(fd)
    except (OSError, ValueError, io.UnsupportedOperation, AttributeError):
        return False


def _not_a_file(fd: int) -> bool:
    """A unit's `StandardOutput=file:` is not the journal: no prefix there."""
    return not stat.S_ISREG(os.fstat(fd).st_mode)


class _Prioritized:
    """A structlog renderer wrapped to start each line with its syslog priority, `<N>`."""

    def __init__(self, renderer: Any) -> None:
        self._renderer = renderer

    def __call__(self, logger: Any, method: str, event: MutableMapping[str, Any]) -> str:
        priority = SYSLOG_PRIORITY.get(str(event.get("level", method)), 6)
        return f"<{priority}>{self._renderer(logger, method, event)}"


__all__ = [
    "MIN_SECRET_CHARS",
    "REDACTED",
    "Logger",
    "capture_warnings",
    "configure",
    "get_logger",
    "holds_secret",
    "redact",
    "register_secret",
    "scrub",
    "scrubbed_output",
    "to_journal",
]
