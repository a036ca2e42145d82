"""The one scrubber of secrets: `scrub` runs wherever text leaves the process (every log event,
through `evalpush.log`'s processor; every text column the ledger stores; every answer the
platform client quotes; everything the `evalpush` command prints, `scrubbed_output`).

It replaces each registered secret (the API key) raw, JSON-escaped, repr-escaped and
percent-encoded, and any run of at least `MIN_SECRET_CHARS` consecutive characters of any of
those forms (a key cut short by a truncated error body, or split by an escaped newline), plus any
`Bearer` token.

"In part" means a run of at least `MIN_SECRET_CHARS` characters that also occurs in the key: a
random key shares no such run with ordinary text, so nothing else is blanked. A key that itself
holds an ordinary word of that length blanks that word too; secrecy wins over readability.
"""

from __future__ import annotations

import functools
import io
import re
import sys
import threading
import urllib.parse
from collections.abc import Callable
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
    if not value or len(value) < MIN_SECRET_CHARS:
        return
    with _lock:
        if value not in _secrets:
            _register({*_secrets, value})


def registered() -> frozenset[str]:
    """The secrets registered in this process."""
    with _lock:
        return frozenset(_secrets)


def register_only(values: frozenset[str]) -> None:
    """Exactly `values` registered, no other (`registered()` taken before, given back): for a
    process that runs several commands in turn, each with its own secrets, as the tests do."""
    with _lock:
        _register(set(values))


def _register(values: set[str]) -> None:
    """Under `_lock`: `values` become the registered secrets, and the scrubber's runs theirs."""
    global _secrets, _parts, _runs, _answers
    runs = {
        form[i : i + MIN_SECRET_CHARS]
        for secret in values
        for form in _forms(secret)
        for i in range(len(form) - MIN_SECRET_CHARS + 1)
    }
    alternatives = "|".join(re.escape(run) for run in sorted(runs))
    _secrets = values
    _parts = re.compile(f"(?=(?:{alternatives}))") if runs else None
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
