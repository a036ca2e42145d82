"""The soak's fleet (`--fleet N`): N `evalpush run` daemons over the one tree, sharing a ledger
in a PostgreSQL of the soak's own, each in a PID namespace of its own (`unshare --pid --fork
--mount-proc`: to one another they are other hosts, whose claims go by lease). Daemons are
SIGKILLed at random moments (one kill budget for the fleet) and started again; PostgreSQL is
crash-restarted (`pg_ctl restart -m immediate`) `--db-restarts` times, spread over the soak as
runs complete. At the end every daemon gets SIGTERM and must exit 0.

The PostgreSQL is started as the tests start theirs (tests/support/postgres.py: initdb as a user
who is not root, a free loopback port, a password).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from soakkit.uploaders import (
    DAEMON_DEATHS_TO_GIVE_UP,
    STOP_TIMEOUT_SECONDS,
    EvalpushWorld,
    KillPolicy,
    kill,
    work_until_done,
)

TESTS = Path(__file__).resolve().parents[2] / "tests"
sys.path.insert(0, str(TESTS))

from support.postgres import PASSWORD, Cluster, binaries  # noqa: E402 - the tests' own server

NAMESPACE = ("unshare", "--pid", "--fork", "--mount-proc", "--kill-child")
LEASE_SECONDS = 10


class Database:
    """The fleet's PostgreSQL: one database, its URL and password file (`environ`: what every
    evalpush process of the soak is given, pushes beside the fleet included)."""

    def __init__(self, workdir: Path) -> None:
        bin_dir = binaries()
        if bin_dir is None:
            raise SystemExit("--fleet needs a PostgreSQL server (Debian's postgresql package)")
        self.cluster = Cluster(bin_dir)
        self.cluster.start()
        self.url = self.cluster.database()
        self.password_file = workdir / "ledger-password"
        self.password_file.write_text(PASSWORD)
        self.restarts = 0

    @property
    def environ(self) -> dict[str, str]:
        return {
            "EVALPUSH_LEDGER__URL": self.url,
            "EVALPUSH_LEDGER__PASSWORD_FILE": str(self.password_file),
            "EVALPUSH_LEDGER__LEASE_SECONDS": str(LEASE_SECONDS),
        }

    def restart(self) -> None:
        self.cluster.restart()
        self.restarts += 1

    def stop(self) -> None:
        self.cluster.destroy()


@dataclass
class _Host:
    name: str
    process: subprocess.Popen[bytes] | None = None
    kill_at: float | None = None
    logs: list[Path] = field(default_factory=list)


@dataclass
class Fleet:
    """N daemons on the tree, killed at random and started again; the database restarted."""

    world: EvalpushWorld
    kills: KillPolicy
    database: Database
    size: int
    db_restarts: int
    progress: Callable[[], float]  # the share of the uploading runs COMPLETED on the platform
    rng: random.Random
    clock_ahead_seconds: float = 0.0  # the first host's clock runs this far ahead (libfaketime)
    killed: int = 0
    starts: int = 0
    exits: Counter[int] = field(default_factory=Counter)  # exits the soak did not cause
    stop_exits: list[int | None] = field(default_factory=list)
    _hosts: list[_Host] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._hosts = [_Host(f"host-{chr(ord('a') + n)}") for n in range(self.size)]

    @property
    def stop_exit(self) -> int | None:
        """0 when every daemon exited 0 on SIGTERM at the end; else the first other exit."""
        return next((code for code in self.stop_exits if code != 0), 0)

    @property
    def broken(self) -> bool:
        return sum(self.exits.values()) >= DAEMON_DEATHS_TO_GIVE_UP * self.size

    def step(self, todo: list[Path]) -> None:
        """`todo` is ignored: the daemons find their work themselves."""
        now = time.monotonic()
        for host in self._hosts:
            if host.process is not None:
                if host.process.poll() is not None:
                    self.exits[host.process.returncode] += 1
                    host.process = None
                elif host.kill_at is not None and now >= host.kill_at:
                    host.kill_at = None
                    if self.kills.budget > 0:  # one budget for the fleet
                        kill(host.process)  # unshare, and the daemon with it (--kill-child)
                        self.killed += 1
                        self.kills.budget -= 1
                        host.process = None
            if host.process is None and not self.broken:
                self._start(host)
        due = self.database.restarts < self.db_restarts and self.progress() >= (
            (self.database.restarts + 1) / (self.db_restarts + 1)
        )
        if due:
            self.database.restart()

    def _start(self, host: _Host) -> None:
        args = ["--config", str(self.world.daemon_config()), "run"]
        skew = {}
        if self.clock_ahead_seconds and host is self._hosts[0]:
            # libfaketime preloaded, not its `faketime` wrapper (which forks and waits, and
            # names a semaphore by its pid: pid 1 in every namespace); the wall clock only,
            # monotonic time (timeouts, deadlines) runs true.
            skew = {
                "LD_PRELOAD": str(libfaketime()),
                "FAKETIME": f"+{self.clock_ahead_seconds:g}s",
                "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            }
        host.process = self.world.start(
            f"daemon-{host.name}",
            args,
            prefix=NAMESPACE,
            EVALPUSH_STATE_DIR=str(self.world.workdir / f"state-{host.name}"),
            EVALPUSH_LOG__LEVEL="info",  # each run finalized: the runs per daemon
            **skew,
        )
        host.logs.append(self.world.last_log)
        self.starts += 1
        host.kill_at = self.kills.deadline()
        if host.kill_at is not None:  # spread the kills over the fleet: one host at a time
            host.kill_at += self.rng.uniform(0, self.size * 2.0)

    def drain(self, every_run: list[Path], done: Callable[[], bool], seconds: float) -> None:
        """Kills off: wait until `done()` and a quiet while, then SIGTERM every daemon."""
        self.kills.budget = 0
        for host in self._hosts:
            host.kill_at = None
        work_until_done(self, done, seconds)
        for host in self._hosts:
            if host.process is None or host.process.poll() is not None:
                continue
            daemon = _child(host.process.pid)
            if daemon is not None:
                os.kill(daemon, signal.SIGTERM)
            try:
                self.stop_exits.append(host.process.wait(STOP_TIMEOUT_SECONDS))
            except subprocess.TimeoutExpired:
                kill(host.process)
                self.stop_exits.append(None)
            host.process = None

    def runs_per_daemon(self) -> dict[str, int]:
        """Runs each host's daemons logged as finalized (by this daemon, this time)."""
        counts = {}
        for host in self._hosts:
            counts[host.name] = sum(
                1
                for log in host.logs
                for line in log.read_bytes().splitlines()
                if b'"run finalized"' in line and _event(line) == "run finalized"
            )
        return counts

    def close(self) -> None:
        for host in self._hosts:
            if host.process is not None and host.process.poll() is None:
                kill(host.process)


def _event(line: bytes) -> str | None:
    try:
        return json.loads(line).get("event")
    except (ValueError, AttributeError):
        return None


def libfaketime() -> Path:
    """Debian's `faketime` package's library (`apt-get install faketime`)."""
    found = sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))
    if not found:
        raise SystemExit("--clock-ahead needs libfaketime (Debian's faketime package)")
    return found[0]


def _child(pid: int) -> int | None:
    """The daemon `unshare` started (pid 1 of its namespace, or faketime's child there), by its
    pid here."""
    while True:
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            if not children:
                return None
            pid = int(children[0])
            if b"evalpush" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        except OSError:
            return None
