"""Logging: structlog, JSON lines for journald, console lines on a TTY, secrets redacted.

Under systemd, with the stream going to the journal (`$JOURNAL_STREAM` names the stream's
device and inode; or `$INVOCATION_ID` is set and the stream is not a terminal), every line
starts with the syslog priority journald reads (`<3>` error, `<4>` warning, `<6>` info, `<7>`
debug): `journalctl -p warning` then filters evalpush's lines, and the prefix is not shown.

What it promises: `scrub` is THE one scrubber of secrets, and it runs wherever text leaves the
process: every log event (`redact`, a structlog processor), every text column the ledger stores,
and everything the `evalpush` command prints (`scrubbed_output`). It replaces each registered
secret (the API key) raw, JSON-escaped, repr-escaped and percent-encoded, and any run of at
least `MIN_SECRET_CHARS` consecutive characters of any of those forms (a key cut short by a
truncated error body, or split by an escaped newline), plus any `Bearer` token.

"In part" means a run of at least `MIN_SECRET_CHARS` characters that also occurs in the key: a
random key shares no such run with ordinary text, so nothing else is blanked. A key that itself
holds an ordinary word of that length blanks that word too; secrecy wins over readability.

structlog (which imports asyncio) is imported when the first event is logged, not before: a
`push` that has nothing to say never pays for it (start-up). `configure` keeps its settings until
then; `get_logger` returns a `Logger` that binds the structlog logger, with the configuration of
that moment, at each event. An event below the configured level is dropped before structlog is
imported, so a debug line in a quiet process costs a dict lookup.
"""

from __future__ import annotations

import functools
import io
import os
import re
import stat
import sys
import threading
import urllib.parse
from collections.abc import Callable, MutableMapping
from typing import Any, ParamSpec, TextIO, TypeVar

import msgspec

REDACTED = "[redacted]"
MIN_SECRET_CHARS = 8
"""Shorter values are not scrubbed, and shorter runs of a secret are not "part" of it: they
would blank out ordinary words (no real key is this short)."""

P = ParamSpec("P")
R = TypeVar("R")

_BEARER = re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{8,}")
_lock = threading.Lock()
_secrets: set[str] = set()
_parts: re.Pattern[str] | None = None
"""Matches where any run of MIN_SECRET_CHARS characters of a secret's forms starts (lookahead,
so overlapping runs are all found); None while no secret is registered."""
_runs: frozenset[str] = frozenset()
"""Those runs, for `holds_secret`'s window lookups."""
_answers: tuple[frozenset[str], dict[str, bool]] = (_runs, {})
"""`holds_secret`'s answers for the runs they were looked up in: a run's evaluation id and
viewer URL are checked several times each (every request's path, each answer naming them).
Replaced, not cleared, when a secret is registered, so an answer from before cannot land in it."""
MAX_ANSWERS = 4096


def _forms(secret: str) -> set[str]:
    """The ways a secret can be spelled in text that leaves the process."""
    return {
        secret,
        msgspec.json.encode(secret).decode()[1:-1],  # inside a JSON string
        repr(secret)[1:-1],  # inside a Python repr, e.g. of bytes or an exception's args
        urllib.parse.quote(secret, safe=""),  # inside a URL
    }


def register_secret(value: str | None) -> None:
    """Never let `value`, or a part of it, leave the process again."""
    global _parts, _runs, _answers
    if not value or len(value) < MIN_SECRET_CHARS:
        return
    with _lock:
        if value in _secrets:
            return
        _secrets.add(value)
        runs = {
            form[i : i + MIN_SECRET_CHARS]
            for secret in _secrets
            for form in _forms(secret)
            for i in range(len(form) - MIN_SECRET_CHARS + 1)
        }
        alternatives = "|".join(re.escape(run) for run in sorted(runs))
        _parts = re.compile(f"(?=(?:{alternatives}))")
        _runs = frozenset(runs)
        _answers = (_runs, {})


def scrub(text: str) -> str:
    """`text` with every secret, escaped or in part, and every bearer token replaced."""
    parts = _parts
    if parts is not None:
        text = _blank(text, parts)
    return _BEARER.sub(rf"\1{REDACTED}", text)


def holds_secret(text: str) -> bool:
    """Whether `scrub` would change `text`: a secret, part of one, or a bearer token in it. A
    lookup per window, not `scrub`'s regex: ids and URLs from the platform are checked so
    several times per run, each once (`_answers`)."""
    runs, answers = _answers
    held = answers.get(text)
    if held is None:
        held = _holds(text, runs)
        if len(answers) >= MAX_ANSWERS:
            answers.clear()
        answers[text] = held
    return held


def _holds(text: str, runs: frozenset[str]) -> bool:
    if runs:
        for start in range(len(text) - MIN_SECRET_CHARS + 1):
            if text[start : start + MIN_SECRET_CHARS] in runs:
                return True
    return _BEARER.search(text) is not None


def _blank(text: str, parts: re.Pattern[str]) -> str:
    """Replace each stretch of text covered by runs of a secret with one REDACTED."""
    spans: list[list[int]] = []
    for match in parts.finditer(text):
        start, end = match.start(), match.start() + MIN_SECRET_CHARS
        if spans and start <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], end)
        else:
            spans.append([start, end])
    if not spans:
        return text
    pieces, kept = [], 0
    for start, end in spans:
        pieces += (text[kept:start], REDACTED)
        kept = end
    pieces.append(text[kept:])
    return "".join(pieces)


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


class _ScrubbingStream(io.TextIOBase):
    """A text stream that scrubs what is written to it, then hands it on.

    Everything else (`buffer` for binary output, `isatty`, `fileno`, `encoding`) is the wrapped
    stream's: binary output (`convert`'s samples) is data, not messages, and is not scrubbed.
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(scrub(text))
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._stream.encoding

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        return self._stream.errors

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def scrubbed_output(fn: Callable[P, R]) -> Callable[P, R]:
    """Decorator: while `fn` runs, everything printed to stdout and stderr is scrubbed."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _ScrubbingStream(saved[0]), _ScrubbingStream(saved[1])
        try:
            return fn(*args, **kwargs)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            sys.stdout, sys.stderr = saved

    return wrapper


_pending: dict[str, Any] | None = None  # configure()'s settings, until structlog is imported
_pending_lock = threading.Lock()
_threshold: int | None = None  # the configured level's number; None: not configured (log all)

LEVELS = {"debug": 10, "info": 20, "warning": 30, "warn": 30, "error": 40, "exception": 40}
LEVELS |= {"critical": 50, "fatal": 50}
SYSLOG_PRIORITY = {"debug": 7, "info": 6, "warning": 4, "error": 3, "critical": 2}
"""The `<N>` prefix journald reads from a line (sd-daemon(3)): by structlog's level name."""


def configure(level: str = "info", fmt: str = "auto", stream: Any = None) -> None:
    """Set up structlog once for the process: JSON when not a TTY (or asked), else console.

    Applied now if structlog is already imported, else when the first event is logged."""
    global _pending, _threshold
    with _pending_lock:
        _pending = {"level": level, "fmt": fmt, "stream": stream or sys.stderr}
        _threshold = LEVELS[level.lower()]
        if "structlog" in sys.modules:
            _apply_pending()


def capture_warnings() -> None:
    """Python warnings (a library's `warnings.warn`) become log lines at warning level, so a
    daemon's output stays one JSON object per line for the journal; for the process (main).

    watchdog's notice that a directory's inotify watch was registered twice (a directory made
    while its parent's watch was being added: the second registration replaces the first with
    the same callback) is dropped: nothing is lost, and it is not something an operator can act
    on."""
    import warnings

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
    if to_journal(stream):
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
        cache_logger_on_first_use=False,
    )


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


class Logger:
    """A structlog bound logger, made at each event: `debug`/`info`/`warning`/`error`/
    `exception`/... are structlog's, with this logger's context bound."""

    __slots__ = ("_context",)

    def __init__(self, context: dict[str, Any]):
        self._context = context

    def bind(self, **context: Any) -> Logger:
        return Logger({**self._context, **context})

    def __getattr__(self, method: str) -> Any:
        threshold = _threshold
        if threshold is not None and LEVELS.get(method, threshold) < threshold:
            return _drop
        with _pending_lock:
            _apply_pending()
        import structlog

        return getattr(structlog.get_logger("evalpush").bind(**self._context), method)


def _drop(*_args: Any, **_kwargs: Any) -> None:
    """An event below the configured level."""


def get_logger(**context: Any) -> Logger:
    return Logger(context)
