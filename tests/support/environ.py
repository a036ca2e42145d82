"""Environments for `python -m evalpush ...` run as a subprocess: nothing of this machine's
evalpush, platform or systemd settings leaks in, so a test's child sees only what the test sets.

- `clean_environ(**overrides)`: this process's environment less `NOT_INHERITED`, plus
  `overrides` (a value of None removes that variable).
- `cli_environ(platform, tmp_path, **overrides)`: `clean_environ` pointed at `platform` (its key,
  its URL), with an empty home (`tmp_path/home`, made) and a state dir (`tmp_path/state`).
"""

from __future__ import annotations

import os
from pathlib import Path

from evalpush.local_platform import LocalPlatform

NOT_INHERITED = (
    "PRIME_",
    "EVALPUSH_",
    # systemd's: the notify socket, the watchdog, credentials, the state dir, the journal
    "NOTIFY_SOCKET",
    "WATCHDOG_",
    "CREDENTIALS_DIRECTORY",
    "STATE_DIRECTORY",
    "JOURNAL_STREAM",
    "INVOCATION_ID",
)


def clean_environ(**overrides: str | None) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(NOT_INHERITED)}
    for key, value in overrides.items():
        if value is None:
            environ.pop(key, None)
        else:
            environ[key] = value
    return environ


LATE_WRITE_SECONDS = "0.2"
"""`platform.late_write_seconds` for the tests' processes, against the local platform."""


def cli_environ(platform: LocalPlatform, tmp_path: Path, **overrides: str | None) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    pointed: dict[str, str | None] = {
        "PRIME_API_KEY": platform.api_key or "any-key",
        "PRIME_API_BASE_URL": platform.base_url,
        "HOME": str(home),
        "EVALPUSH_STATE_DIR": str(tmp_path / "state"),
        # A write cut off (or left by a killed process) lands within this on the loopback
        # platform: reconciling reads wait this long, not the default's 10 s.
        "EVALPUSH_PLATFORM__LATE_WRITE_SECONDS": LATE_WRITE_SECONDS,
    }
    return clean_environ(**{**pointed, **overrides})
