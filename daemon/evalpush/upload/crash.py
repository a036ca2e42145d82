"""Named crash points: where the crash tests kill an upload, between a request and the ledger
write that records it (tests/test_crash.py)."""

from __future__ import annotations

import os
import signal

CRASH_ENV = "EVALPUSH_CRASH_AT"
"""`<point>` or `<point>:<n>` makes the process SIGKILL itself the n-th time it passes that point
(points: create-sent, batch-intent, batch-sent, batch-acked, followed (a followed run's stretch
recorded, its row waiting again), finalize-sent)."""

_crash_counts: dict[str, int] = {}


def crash_point(point: str) -> None:
    wanted = os.environ.get(CRASH_ENV)
    if not wanted:
        return
    name, _, count = wanted.partition(":")
    if name != point:
        return
    _crash_counts[point] = seen = _crash_counts.get(point, 0) + 1
    if seen >= int(count or 1):
        os.kill(os.getpid(), signal.SIGKILL)
