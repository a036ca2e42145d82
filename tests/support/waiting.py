"""Waiting for a condition in a test: polled, bounded, and failing the test by name.

`wait_until(condition, what, timeout=...)` returns the first truthy value `condition()` gives;
after `timeout` seconds it fails the test saying what it waited for (and `explain()`, if given:
e.g. what a subprocess printed).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")

WAIT_SECONDS = 30.0
"""How long a condition is waited for unless a test says: generous, CI is a loaded 2-core box."""
POLL_SECONDS = 0.05


def wait_until(
    condition: Callable[[], T | None],
    what: str,
    *,
    timeout: float = WAIT_SECONDS,
    explain: Callable[[], str] | None = None,
) -> T:
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() >= deadline:
            detail = f"\n{explain()}" if explain is not None else ""
            pytest.fail(f"waited {timeout:.0f} s for {what}{detail}")
        time.sleep(POLL_SECONDS)
