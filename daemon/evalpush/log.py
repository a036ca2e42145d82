"""Logging: structlog, JSON lines for journald, console lines on a TTY, secrets redacted.

Every event goes through `redact`, which replaces any registered secret (the API key) and any
`Authorization` value wherever it appears, so a key can't leak through an exception message.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

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


def configure(level: str = "info", fmt: str = "auto", stream: Any = None) -> None:
    """Set up structlog once for the process: JSON when not a TTY (or asked), else console."""
    stream = stream or sys.stderr
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


def get_logger(**context: Any) -> Any:
    return structlog.get_logger("evalpush").bind(**context)
