"""The daemon's log: Python warnings from libraries become JSON log lines (journald reads one
JSON object per line), and watchdog's double-registration notice is dropped."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
import warnings

import pytest
import structlog

from evalpush import log


def test_a_library_warning_is_a_json_log_line_and_watchdogs_double_watch_notice_is_dropped():
    saved, hook = structlog.get_config(), threading.excepthook
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
        threading.excepthook = hook
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(line["event"], line["category"], line["warning"]) for line in lines] == [
        ("python warning", "DeprecationWarning", "a deprecated call")
    ]
    assert lines[0]["level"] == "warning" and "test_log.py:" in lines[0]["where"]


THREAD_RAISES = """
import sys, threading
from evalpush import log
log.configure(level="info", fmt="json", stream=sys.stdout)
log.capture_warnings()
log.register_secret("sk-thread-secret-0123456789")
def fail():
    raise OSError("watch gone; key sk-thread-secret-0123456789")
thread = threading.Thread(target=fail, name="observer")
thread.start()
thread.join()
"""


def test_a_threads_uncaught_exception_is_one_scrubbed_json_log_line_not_a_raw_traceback():
    """A library's thread dying (watchdog's observer did, under the fleet soak) is said in the
    log, scrubbed like every line, instead of a raw traceback on stderr."""
    done = subprocess.run(
        [sys.executable, "-c", THREAD_RAISES], capture_output=True, text=True, timeout=60
    )

    assert done.returncode == 0, done.stderr
    assert done.stderr == "", "nothing raw on stderr"
    (line,) = [json.loads(text) for text in done.stdout.splitlines()]
    assert (line["event"], line["level"], line["thread"]) == (
        "a thread ended with an exception",
        "error",
        "observer",
    )
    assert line["error"].startswith("OSError: watch gone") and "in fail" in line["traceback"]
    assert "thread-secret" not in done.stdout


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
