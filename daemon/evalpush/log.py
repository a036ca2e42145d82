"""Logging: structlog, JSON lines for journald, console lines on a TTY, secrets redacted.

Every event goes through `redact`, which replaces any registered secret (the API key) and any
`Authorization` value wherever it appears, so a key can't leak through an exception message.

structlog (which imports asyncio) is imported when the first event is logged, not before: a
`push` that has nothing to say never pays for it (start-up, issue 10). `configure` keeps its
settings until then; `get_logger` returns a `Logger` that binds the structlog logger, with the
configuration of that moment, at each event.
"""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import MutableMapping
from typing import Any

_secrets: set[str] = set()
_BEARER = re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{8,}")
REDACTED = "[redacted]"
MIN_SECRET_CHARS = 8
"""Shorter values are not scrubbed: they would blank out ordinary words (no real key is this short)."""


def register_secret(value: str | None) -> None:
    """Never print `value` again, in any log event."""
    if value and len(value) >= MIN_SECRET_CHARS:
        _secrets.add(value)


def scrub(text: str) -> str:
    """`text` with every registered secret and bearer token replaced."""
    for secret in _secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return _BEARER.sub(rf"\1{REDACTED}", text)


def _scrub_value(value: Any) -> Any:
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, BaseException):
        return scrub(f"{type(value).__name__}: {value}")
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


_pending: dict[str, Any] | None = None  # configure()'s settings, until structlog is imported
_pending_lock = threading.Lock()


def configure(level: str = "info", fmt: str = "auto", stream: Any = None) -> None:
    """Set up structlog once for the process: JSON when not a TTY (or asked), else console.

    Applied now if structlog is already imported, else when the first event is logged."""
    global _pending
    with _pending_lock:
        _pending = {"level": level, "fmt": fmt, "stream": stream or sys.stderr}
        if "structlog" in sys.modules:
            _apply_pending()


def _apply_pending() -> None:
    global _pending
    if _pending is not None:
        settings, _pending = _pending, None
        _configure_structlog(**settings)


def _configure_structlog(level: str, fmt: str, stream: Any) -> None:
    import logging

    import structlog

    if fmt == "auto":
        fmt = "console" if stream.isatty() else "json"
    renderer: Any = (
        structlog.dev.ConsoleRenderer(colors=stream.isatty())
        if fmt == "console"
        else structlog.processors.JSONRenderer()
    )
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
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(stream),
        cache_logger_on_first_use=False,
    )


class Logger:
    """A structlog bound logger, made at each event: `debug`/`info`/`warning`/`error`/
    `exception`/... are structlog's, with this logger's context bound."""

    __slots__ = ("_context",)

    def __init__(self, context: dict[str, Any]):
        self._context = context

    def bind(self, **context: Any) -> Logger:
        return Logger({**self._context, **context})

    def __getattr__(self, method: str) -> Any:
        with _pending_lock:
            _apply_pending()
        import structlog

        return getattr(structlog.get_logger("evalpush").bind(**self._context), method)


def get_logger(**context: Any) -> Logger:
    return Logger(context)
