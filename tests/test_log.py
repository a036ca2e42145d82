"""The daemon's log: Python warnings from libraries become JSON log lines (journald reads one
JSON object per line), and watchdog's double-registration notice is dropped."""

from __future__ import annotations

import io
import json
import warnings

import pytest
import structlog

from evalpush import log


def test_a_library_warning_is_a_json_log_line_and_watchdogs_double_watch_notice_is_dropped():
    saved = structlog.get_config()
    out = io.StringIO()
    try:
        with warnings.catch_warnings():  # restores the filters and showwarning after
            warnings.simplefilter("always")
            log.configure(level="info", fmt="json", stream=out)
            log.capture_warnings()
            warnings.warn("a deprecated call", DeprecationWarning, stacklevel=1)
            warnings.warn(
                "Callback with id '1' already exists for watch b'/x'. It will be Overwritten.",
                RuntimeWarning,
                stacklevel=1,
            )
    finally:
        structlog.configure(**saved)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(line["event"], line["category"], line["warning"]) for line in lines] == [
        ("python warning", "DeprecationWarning", "a deprecated call")
    ]
    assert lines[0]["level"] == "warning" and "test_log.py:" in lines[0]["where"]


@pytest.mark.parametrize(
    "text",
    [
        "sk-holds-0123456789abcdef",
        "prefix-0123456789abcdef-suffix",
        "x" * 300 + "89abcdef",  # a run of it at the very end
        "sk-holds%2D0123",  # quoted as in a URL
        "Authorization: Bearer abcdefgh12345678",
        "e1",
        "https://app.test/dashboard/evaluations/e1",
        "0123456",  # shorter than a run
        "",
    ],
)
def test_holds_secret_says_exactly_when_scrub_would_change_the_text(text: str) -> None:
    log.register_secret("sk-holds-0123456789abcdef")
    assert log.holds_secret(text) == (log.scrub(text) != text)


def test_holds_secret_answers_anew_once_a_secret_is_registered() -> None:
    """Its answers are kept (an evaluation id is checked at every request): a text checked
    before a secret was registered is checked again after, and then holds it."""
    text = "https://app.test/evaluations/key-registered-late-QWXZJKVP"
    assert not log.holds_secret(text)
    assert not log.holds_secret(text)
    log.register_secret("key-registered-late-QWXZJKVP")
    assert log.holds_secret(text)
