"""The log as a person at a terminal reads it, and as a machine reads it elsewhere: readable
lines on a terminal (coloured only where the terminal has colour), JSON lines through a pipe,
the API key in neither; the demo's warnings written above its live view, never into it.

Each test runs `python -m evalpush ...` as a process, on a pseudo-terminal or through pipes,
against a local platform on loopback.
"""

from __future__ import annotations

import json
import re

import pytest

from support.commands import as_process
from support.environ import cli_environ
from support.runs import write_run
from support.terminal import ANSI, on_a_terminal

COLOUR = re.compile(r"\x1b\[[0-9;]*m")
"""An escape sequence that sets a colour or a style (SGR)."""
KEY_ECHOES = 1
"""The platform answers the first resolve with an error quoting the key: retried, and logged."""


def _lines(screen: bytes) -> list[str]:
    text = ANSI.sub(b"", screen).decode(errors="replace")
    return [line.strip() for line in re.split(r"[\r\n]+", text) if line.strip()]


def _json_objects(lines: list[str]) -> list[dict]:
    objects = []
    for line in lines:
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            objects.append(value)
    return objects


@pytest.fixture
def echoing(platform, tmp_path) -> dict[str, str]:
    """A run to push, a platform that quotes the key in its first resolve's answer, and the
    environment of a push that logs at info."""
    write_run(tmp_path / "outputs")
    platform.inject("echo_key", on="resolve", status=500, count=KEY_ECHOES)
    return cli_environ(platform, tmp_path, EVALPUSH_LOG__LEVEL="info", TERM="xterm-256color")


def test_push_at_a_terminal_logs_readable_lines_and_never_the_key(platform, tmp_path, echoing):
    code, _out, screen = on_a_terminal(echoing, "push", str(tmp_path / "outputs"))

    assert code == 0
    lines = _lines(screen)
    started = [line for line in lines if "upload started" in line]
    assert started and not started[0].startswith("{"), lines
    assert _json_objects(lines) == []
    assert "[redacted]" in screen.decode(errors="replace")  # the echoed key, scrubbed
    assert platform.api_key is not None and platform.api_key.encode() not in screen


def test_push_through_a_pipe_logs_json_lines_and_never_the_key(platform, tmp_path, echoing):
    done = as_process(echoing, "push", str(tmp_path / "outputs"))

    assert done.returncode == 0
    events = _json_objects(done.stderr.splitlines())
    assert "upload started" in [event["event"] for event in events], done.stderr
    assert all(line.startswith("{") for line in done.stderr.splitlines() if line.strip())
    assert "[redacted]" in done.stderr
    assert platform.api_key is not None and platform.api_key not in done.stderr


@pytest.mark.parametrize("colourless", [{"TERM": "dumb"}, {"NO_COLOR": "1"}])
def test_a_terminal_without_colour_gets_log_lines_without_escape_codes(
    platform, tmp_path, echoing, colourless
):
    code, _out, screen = on_a_terminal(
        {**echoing, **colourless, "EVALPUSH_LOG__FORMAT": "console"},
        "push",
        str(tmp_path / "outputs"),
    )

    assert code == 0
    text = screen.decode(errors="replace")
    (started,) = [line for line in re.split(r"[\r\n]+", text) if "upload started" in line]
    assert not COLOUR.search(started), repr(started)


def test_the_demos_warnings_are_written_above_its_live_view_never_inside_it(tmp_path):
    environ = cli_environ(platform=_NoPlatform(), tmp_path=tmp_path, TERM="xterm-256color")

    code, _out, screen = on_a_terminal(
        environ, "demo", "--dir", str(tmp_path / "demo"), stdout_too=True, timeout=120
    )

    assert code == 0, screen.decode(errors="replace")
    text = screen.decode(errors="replace")
    warnings = list(LOG_LINE.finditer(text))
    assert warnings, "the demo's partial run logs a warning"
    for warning in warnings:
        assert not warning["line"].startswith("{"), warning["line"]
        assert warning["before"] == "\x1b[J", repr(warning[0])  # written where the view was
        assert re.match(r"(\x1b\[J)?\[\d\d:\d\d:\d\d\] ", warning["after"]), repr(warning[0])


LOG_LINE = re.compile(
    r"(?P<before>\x1b\[J|\n|\x1b\[F)"
    r"(?P<line>(\x1b\[[0-9;]*m)*(\{|\d{4}-\d\d-\d\dT)[^\n]*?run finalized[^\n]*\n)"
    r"(?P<after>.{0,20})",
    re.S,
)
"""A log line saying a run was finalized, what the terminal got just before it and after it."""


class _NoPlatform:
    """The demo brings its own platform: no key, no URL from the test's."""

    api_key = "not-used-by-the-demo-0123456789"
    base_url = "https://api.example.invalid"
