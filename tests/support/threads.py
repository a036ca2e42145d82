"""Threads that outlive what started them: the check behind conftest.py's leak guards.

`alive()` is the set of running threads; after the test (or module), `outliving(before)` joins
each thread not in `before` until one shared deadline `grace` seconds away and returns those
still running; `describe(thread)` names one for the failure. Daemon threads count like any
other: watchdog's observer, emitter and inotify threads are daemon threads, and one left running
keeps its inotify watches and reads for the rest of the session.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Set

THREAD_JOIN_GRACE_SECONDS = float(os.environ.get("EVALPUSH_TEST_THREAD_GRACE_SECONDS", "5"))
"""How long threads get to finish once the test is done (a stop() may take a poll to be seen;
a claim's heartbeat lingers `claims.LINGER_SECONDS` after its last release, and on a loaded
2-core box its wake-up can take as long again). A thread that ends sooner is not waited for.
The guards' own test shortens it (its leaked threads never end)."""


def alive() -> set[threading.Thread]:
    return set(threading.enumerate())


def outliving(
    before: Set[threading.Thread], grace: float = THREAD_JOIN_GRACE_SECONDS
) -> list[threading.Thread]:
    """The threads not in `before` still running after `grace` seconds."""
    deadline = time.monotonic() + grace
    leaked = []
    for thread in threading.enumerate():
        if thread in before:
            continue
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            leaked.append(thread)
    return leaked


def describe(thread: threading.Thread) -> str:
    """`name (daemon module.Class)`."""
    kind = "daemon " if thread.daemon else ""
    return f"{thread.name} ({kind}{type(thread).__module__}.{type(thread).__name__})"
