"""Upload threads take turns: one runs at a time, handing over only while it waits.

Python runs one thread at a time anyway, but a thread gives up Python's lock around each call
into the system (a stat, an SQLite statement, a send), and with several upload threads on
several CPUs the lock changed hands at nearly every one: a one-trace run's upload blocked about
50 times, a quarter of the push's CPU going to the hand-overs. A thread that holds the turn
keeps running through its short calls and hands the turn over only around a wait that lasts (an
answer from the platform, a sync of the ledger's log, a batch being converted, a retry's
backoff), as an event loop would.

On one CPU (a process confined with `taskset` or `CPUAffinity=`) there is nothing to gain: the
threads cannot run at once, and handing the turn over only added switches (blocks a one-trace
run 15 -> 20 there). So a job takes turns only while its thread may run on more than one CPU.

The turn is a hint, never a condition: a thread that cannot have it within `PATIENCE_SECONDS`
runs without it, as all did before, and asks again after its next wait. So a wait that forgets
to hand the turn over slows the others down by that much; it cannot stop them.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

PATIENCE_SECONDS = 0.005

_turn = threading.Lock()
_thread = threading.local()  # .taking: inside `taking_turns()`; .holds: has the turn now;
# .waiting: inside `waiting()` (a wait within a wait hands nothing over and takes nothing back)


def _take() -> None:
    if not getattr(_thread, "holds", False):
        _thread.holds = _turn.acquire(timeout=PATIENCE_SECONDS)


def _give() -> None:
    if getattr(_thread, "holds", False):
        _thread.holds = False
        _turn.release()


def _several_cpus() -> bool:
    """Whether this thread may run on more than one CPU (its affinity, looked at each job)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) > 1
    return (os.cpu_count() or 1) > 1


@contextmanager
def taking_turns() -> Iterator[None]:
    """Run the block taking turns with the other threads inside one (an upload thread's job)."""
    if getattr(_thread, "taking", False) or not _several_cpus():
        yield
        return
    _thread.taking = True
    _take()
    try:
        yield
    finally:
        _give()
        _thread.taking = False


@contextmanager
def waiting() -> Iterator[None]:
    """A wait: inside `taking_turns()`, the turn goes to another thread meanwhile and is asked
    back after. Outside, or inside another wait, nothing."""
    if not getattr(_thread, "taking", False) or getattr(_thread, "waiting", False):
        yield
        return
    _thread.waiting = True
    _give()
    try:
        yield
    finally:
        _thread.waiting = False
        _take()


def holds_turn() -> bool:
    """Whether this thread has the turn now."""
    return getattr(_thread, "holds", False)
