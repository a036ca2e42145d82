"""Claims: which process works on a run, and whether that process is still there.

A process works on a run only while it holds the run's claim: columns of the run's ledger row,
taken and released in one `BEGIN IMMEDIATE` transaction each (`Ledger.claim`, `Ledger.release`),
and every write an upload makes is conditional on still holding it (the ledger's fencing).
docs/ARCHITECTURE.md tells the protocol and why it is safe; this module holds its two policies:

- **Who owns a claim** (`Process`): the host name, the boot id, the pid and the process's start
  time (clock ticks after boot, from `/proc/<pid>/stat`), and its pid namespace. A pid alone is
  recycled; the start time tells a recycled pid apart, and the boot id a reboot. Each claim adds
  a nonce to that, so two claims of one process are never confused.
- **Whether an owner is gone** (`holder_alive`): after a reboot, always; on this host and in
  this pid namespace, when no process runs under its pid with its start time (a zombie counts as
  gone); elsewhere (another host, or a container whose pids this process cannot see), which
  cannot be looked at, when its lease expired.

A `Heartbeat` thread renews the lease of every claim this process holds, a few times per lease,
whatever the upload threads are doing (a platform outage waited out included). It runs only while
the process holds a claim.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from evalpush.core.errors import Busy, ClaimLost
from evalpush.log import get_logger

if TYPE_CHECKING:
    from evalpush.ledger.store import Ledger, RunRecord

LEASE_SECONDS = 120.0
"""How long a claim outlives its last renewal (by the ledger's clock), for an owner on another
host (one on this host is checked directly). An owner's writes end `platform.late_write_seconds`
before its lease could lapse (`upload.Context.once`), so none can still land once it does."""

RENEWALS_PER_LEASE = 4
"""The heartbeat renews this many times per lease: three renewals can fail before it lapses."""

LINGER_SECONDS = 1.0
"""How long the heartbeat's thread outlives the last claim released: runs uploaded one after
another (the daemon's usual case) share one thread instead of starting one each (a start and
its handshake were a fortieth of a one-trace run's time in `push`)."""

PROC = Path("/proc")

_held: set[str] = set()
"""The claims this process holds now (owners), whichever `Claims` took them: a claim in the
ledger with this process's identity but not in here was left by an exit Python did not see
through (a failed release) and may be taken over."""
_held_lock = threading.Lock()


class Process(msgspec.Struct, frozen=True):
    """A process, as the claims name it."""

    host: str
    boot: str
    pid: int
    start: int  # clock ticks after boot; 0 where /proc is not there
    pidns: str = ""  # the pid namespace, e.g. "pid:[4026531836]"; empty where /proc is not there

    @classmethod
    def current(cls) -> Process:
        pid = os.getpid()
        return cls(socket.gethostname(), boot_id(), pid, process_start(pid) or 0, pid_namespace())

    def same_process(self, holder: Holder) -> bool:
        return (self.host, self.boot, self.pid, self.start, self.pidns) == (
            holder.host,
            holder.boot,
            holder.pid,
            holder.start,
            holder.pidns,
        )

    def new_owner(self) -> str:
        """A fresh claim owner: this process, plus a nonce for this one claim."""
        return f"{self.host}/{self.boot}/{self.pid}/{self.start}/{os.urandom(4).hex()}"


class Holder(msgspec.Struct, frozen=True, gc=False):
    """Who holds a run's claim, since when, and until when its lease runs."""

    owner: str
    host: str
    boot: str
    pid: int
    start: int
    pidns: str
    since: float
    expires: float

    def describe(self, here: Process | None = None) -> str:
        where = "" if here is not None and here.host == self.host else f" on {self.host}"
        return f"pid {self.pid}{where}"


def held_by(holder: Holder, message: str) -> Busy:
    """`Busy` saying `message`, naming who holds the run (its pid, host and since when)."""
    return Busy(message, pid=holder.pid, host=holder.host, since=holder.since)


def taken_over(run_id: str) -> ClaimLost:
    """`ClaimLost` for a run whose claim another process holds now: the upload stops."""
    return ClaimLost(
        f"run {run_id}: its claim was taken over by another process; this upload stops and "
        "leaves the run to it"
    )


def boot_id() -> str:
    """This boot's id (changes at every reboot); empty where the kernel does not say."""
    try:
        return (PROC / "sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def pid_namespace() -> str:
    """This process's pid namespace (a container has its own); empty where /proc is not there."""
    try:
        return os.readlink(PROC / "self/ns/pid")
    except OSError:
        return ""


def process_start(pid: int) -> int | None:
    """When process `pid` started (clock ticks after boot); None if it does not run (a zombie
    has finished running: None too)."""
    try:
        stat = (PROC / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = stat[stat.rfind(b")") + 2 :].split()
    state, start = fields[0], fields[19]
    return None if state in (b"Z", b"X") else int(start)


def holder_alive(holder: Holder, here: Process, now: float) -> bool:
    """Whether the process holding a claim may still be working on the run."""
    if holder.host == here.host and holder.boot != here.boot:
        return False  # this host rebooted since
    if holder.host != here.host or holder.pidns != here.pidns:
        return holder.expires > now  # its pid means nothing here: only the lease tells
    if holder.start == 0:  # recorded without /proc: the pid is all there is to go by
        return _pid_exists(holder.pid)
    return process_start(holder.pid) == holder.start


def alive_now(now: float | None = None) -> Callable[[Holder], bool]:
    """`holder_alive` as this process can tell at `now` (None: the time now)."""
    here, at = Process.current(), time.time() if now is None else now
    return lambda holder: holder_alive(holder, here, at)


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


Renew = Callable[[list[str], float], set[str]]
"""`renew(owners, lease_seconds)`: push the leases of `owners` to `lease_seconds` past the
ledger's clock; returns the owners that still held their claim."""


class Heartbeat:
    """Renews the leases of the claims this process holds, from its own thread.

    The thread starts with the first claim and ends once none has been held for
    `LINGER_SECONDS` (or at `stop`), so nothing outlives the uploads it serves by more. Taking
    and releasing a claim never wakes it: it looks at the claims held once a tick (`_tick`, a
    second at most), renews them once per interval, and a claim taken between two renewals has
    a new lease anyway. Waking it twice a run (to renew nothing) was a fifth of the CPU a
    one-trace run's claims and ledger writes took.
    """

    def __init__(
        self,
        renew: Renew,
        *,
        lease_seconds: float = LEASE_SECONDS,
        clock: Callable[[], float] = time.time,
    ):
        self._renew = renew
        self.lease_seconds = lease_seconds
        self._clock = clock
        self._interval = lease_seconds / RENEWALS_PER_LEASE
        self._tick = min(self._interval, LINGER_SECONDS)
        self._owners: set[str] = set()
        self._valid_until: dict[str, float] = {}  # owner -> monotonic time its lease runs out
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._idle_since: float | None = None  # monotonic: when the last claim was released
        self._stopped = False

    def expires(self) -> float:
        """When a lease taken or renewed now runs out."""
        return self._clock() + self.lease_seconds

    def lease_left(self, owner: str) -> float | None:
        """How long the claim `owner` is sure to be held still (None: not one of this process's
        claims), by this process's monotonic clock: its lease counted from the moment before
        the claim's (or last renewal's) transaction began, which the ledger's own expiry (its
        clock at commit, plus the lease) can only follow."""
        with self._changed:
            valid_until = self._valid_until.get(owner)
        return None if valid_until is None else valid_until - time.monotonic()

    def add(self, owner: str, *, asked_at: float) -> None:
        """`owner`'s claim, taken by a transaction that began at `asked_at` (monotonic)."""
        with self._changed:
            self._owners.add(owner)
            self._valid_until[owner] = asked_at + self.lease_seconds
            self._stopped = False
            self._idle_since = None
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="claim-heartbeat")
                self._thread.start()

    def remove(self, owner: str) -> None:
        with self._changed:
            self._owners.discard(owner)
            self._valid_until.pop(owner, None)
            if not self._owners:
                self._idle_since = time.monotonic()

    def stop(self) -> None:
        """Renew nothing more; the thread ends now."""
        with self._changed:
            self._owners.clear()
            self._valid_until.clear()
            self._stopped = True
            self._changed.notify_all()

    def _run(self) -> None:
        renew_at = time.monotonic() + self._interval
        while True:
            with self._changed:
                wait = min(max(renew_at - time.monotonic(), 0.0), self._tick)
                self._changed.wait_for(lambda: self._stopped, timeout=wait)
                if self._stopped or self._lingered():
                    self._thread = None
                    return
                if not self._owners or time.monotonic() < renew_at:
                    continue
                owners = sorted(self._owners)
            renew_at = time.monotonic() + self._interval
            self._renew_once(owners)

    def _lingered(self) -> bool:
        """With the lock held: whether no claim has been held for `LINGER_SECONDS`."""
        idle = self._idle_since
        return not self._owners and idle is not None and time.monotonic() - idle >= LINGER_SECONDS

    def _renew_once(self, owners: list[str]) -> None:
        asked_at = time.monotonic()
        try:
            held = self._renew(owners, self.lease_seconds)
        except Exception as exc:  # noqa: BLE001 - a heartbeat that dies would let leases lapse
            get_logger().warning("could not renew the claims' leases", error=str(exc))
            return
        with self._changed:
            for owner in held & self._owners:
                self._valid_until[owner] = asked_at + self.lease_seconds
        lost = set(owners) - held
        if lost:
            with self._changed:  # a claim released since `owners` was taken was given back
                lost &= self._owners
        if lost:
            # The uploads holding them fail their next write (fencing); this says why, once.
            get_logger().warning("claims taken over by another process", owners=sorted(lost))


class Claims:
    """This process's claims on one ledger: take one, release it, keep the leases renewed."""

    def __init__(
        self,
        ledger: Ledger,
        *,
        lease_seconds: float = LEASE_SECONDS,
        clock: Callable[[], float] = time.time,
        process: Process | None = None,
    ):
        self._ledger = ledger
        self._clock = clock
        self.process = process or Process.current()
        self._heartbeat = Heartbeat(ledger.renew, lease_seconds=lease_seconds, clock=clock)

    def take(self, *, run_id: str, path: Path, kind: str) -> tuple[RunRecord, Holder | None]:
        """Claim the run (added to the ledger if new); returns it and the holder that was gone
        (its claim taken over), if any. `Busy` if a live process holds it."""
        owner = self.process.new_owner()
        with _held_lock:
            _held.add(owner)
        asked_at = time.monotonic()
        try:
            claimed, previous = self._ledger.claim(
                run_id=run_id,
                path=path,
                kind=kind,
                owner=owner,
                process=self.process,
                lease_seconds=self._heartbeat.lease_seconds,
                alive=self.alive,
            )
        except BaseException:
            self._forget(owner)
            raise
        self._heartbeat.add(owner, asked_at=asked_at)
        return claimed, previous

    def lease_left(self, owner: str | None) -> float | None:
        """How long this process is sure to hold the claim `owner` still (None: not its own)."""
        return None if owner is None else self._heartbeat.lease_left(owner)

    def release(self, record: RunRecord) -> RunRecord:
        """Give the claim `record` holds back; returns the run as nobody's."""
        owner = record.claim_owner
        if owner is not None:
            # Renewed no more before it is released: a renewal after the release would find it
            # gone and say another process took it over.
            self._heartbeat.remove(owner)
        try:
            return self._ledger.release(record)
        finally:
            if owner is not None:
                self._forget(owner)

    def close(self) -> None:
        """Stop renewing. Claims still held stay in the ledger as a killed process leaves them
        (its leases run out); every way out of an upload has released its claim before."""
        self._heartbeat.stop()

    def alive(self, holder: Holder, now: float | None = None) -> bool:
        """Whether `holder` may still be working on its run (then its claim is not taken); its
        lease judged at `now` (the ledger's clock, when a claim asks), else by this host's."""
        if self.process.same_process(holder):
            with _held_lock:
                return holder.owner in _held
        return holder_alive(holder, self.process, self._clock() if now is None else now)

    @staticmethod
    def _forget(owner: str) -> None:
        with _held_lock:
            _held.discard(owner)
