"""What uploads the tree during the soak, and the processes pushing beside it.

Two modes share one state directory and one shape (`step` often, `drain` at the end):
- `PushOnly`: `evalpush push DIR...` of the finished runs the platform does not hold yet, run
  again and again; each started process is SIGKILLed at a random moment while the kill budget
  lasts. The soak decides readiness itself (a writer's manifest entry), as `push` takes every
  run it is given as finished.
- `Daemon`: `evalpush run` with a config whose `watch.roots` is the tree (short settle time, the
  marker rule, a fast rescan); SIGKILLed at random moments and started again at once. It decides
  readiness itself. An exit the soak did not cause is recorded.
`OverlappingPushes` starts `evalpush push` of a few finished runs now and then beside either.

Every evalpush process logs to its own file under `logs/` (`processes.jsonl` gives each one's
arguments); exit codes are counted.
"""

from __future__ import annotations

import enum
import json
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from soakkit.platform import clean_environ
from soakkit.writers import MARKER

STOP_TIMEOUT_SECONDS = 30.0
DRAIN_POLL_SECONDS = 1.0
DAEMON_DEATHS_TO_GIVE_UP = 5  # exits the soak did not cause
DRAIN_PUSHES = 3


class Mode(enum.StrEnum):
    """What uploads the tree."""

    PUSH_ONLY = "push-only"
    DAEMON = "daemon"


@dataclass
class EvalpushWorld:
    """What every evalpush process of the soak shares: platform, key, state dir, logs."""

    workdir: Path
    base_url: str
    api_key: str
    batch_samples: int = 50
    read_timeout_seconds: float = 3.0
    log_level: str = "warning"
    settle_seconds: float = 6.0
    follow_batch_seconds: float = 2.0  # runs followed while written send a batch this often
    rescan_seconds: float = 2.0
    late_write_seconds: float = 3.0  # a fleet's lease caps it at a quarter
    shared: dict[str, str] = field(default_factory=dict)  # a fleet's ledger, for every process
    last_log: Path | None = None
    _started: int = 0

    @property
    def state_dir(self) -> Path:
        return self.workdir / "state"

    @property
    def tree(self) -> Path:
        return self.workdir / "tree"

    def environ(self) -> dict[str, str]:
        return clean_environ(
            PRIME_API_KEY=self.api_key,
            PRIME_API_BASE_URL=self.base_url,
            HOME=str(self.workdir / "home"),
            EVALPUSH_STATE_DIR=str(self.state_dir),
            EVALPUSH_UPLOAD__MAX_BATCH_SAMPLES=str(self.batch_samples),
            EVALPUSH_PLATFORM__READ_TIMEOUT_SECONDS=str(self.read_timeout_seconds),
            EVALPUSH_PLATFORM__CONNECT_TIMEOUT_SECONDS="2",
            # the chaos's late work lands within this (`ChaosParams.late_seconds`)
            EVALPUSH_PLATFORM__LATE_WRITE_SECONDS=str(self.late_write_seconds),
            EVALPUSH_LOG__LEVEL=self.log_level,
            EVALPUSH_LOG__FORMAT="json",
            **self.shared,
        )

    def daemon_config(self) -> Path:
        """The daemon's config file: the tree, a short settle time, the marker rule, a short
        batch period for the runs it follows while they are written."""
        path = self.workdir / "daemon.toml"
        path.write_text(
            f"[watch]\nroots = [{json.dumps(str(self.tree))}]\n"  # a JSON string is a TOML one
            f"rescan_seconds = {self.rescan_seconds}\n\n"
            f'[runs]\nsettle_seconds = {self.settle_seconds}\nmarker = "{MARKER}"\n'
            f"follow_batch_seconds = {self.follow_batch_seconds}\n"
        )
        return path

    def start(
        self, name: str, args: list[str], *, prefix: tuple[str, ...] = (), **environ: str
    ) -> subprocess.Popen[bytes]:
        """`[PREFIX...] python -m evalpush ARGS` logging to `logs/NNNNN-name.log` (`environ`
        added to the world's); `processes.jsonl` says which log had which arguments (to find
        who touched a run that went wrong)."""
        self._started += 1
        log = self.last_log = self.workdir / "logs" / f"{self._started:05d}-{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "wb") as out:
            process = subprocess.Popen(
                [*prefix, sys.executable, "-m", "evalpush", *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**self.environ(), **environ},
            )
        entry = {"log": log.name, "pid": process.pid, "started": time.time(), "args": args}
        with open(self.workdir / "processes.jsonl", "a") as index:
            index.write(json.dumps(entry) + "\n")
        return process


def kill(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait()


@dataclass
class KillPolicy:
    """Kill each started process after a random delay, while the budget lasts."""

    budget: int
    after_seconds: tuple[float, float]
    rng: random.Random

    def deadline(self) -> float | None:
        if self.budget <= 0:
            return None
        return time.monotonic() + self.rng.uniform(*self.after_seconds)


@dataclass
class _KilledAtRandom:
    """One uploader process at a time, SIGKILLed at its random moment while the budget lasts."""

    world: EvalpushWorld
    kills: KillPolicy
    killed: int = 0
    starts: int = 0
    exits: Counter[int] = field(default_factory=Counter)  # exits the soak did not cause
    _process: subprocess.Popen[bytes] | None = None
    _kill_at: float | None = None

    def _reap_or_kill(self) -> None:
        """Forget the process once it has exited (its code counted) or been killed as due."""
        if self._process is None:
            return
        if self._process.poll() is not None:
            self.exits[self._process.returncode] += 1
            self._process = None
        elif self._kill_at is not None and time.monotonic() >= self._kill_at:
            kill(self._process)
            self.killed += 1
            self.kills.budget -= 1
            self._process = None

    @property
    def broken(self) -> bool:
        """It keeps dying by itself: starting it again is pointless."""
        return False

    def _start(self, name: str, args: list[str]) -> None:
        self._process = self.world.start(name, args)
        self.starts += 1
        self._kill_at = self.kills.deadline()

    def close(self) -> None:
        if self._process is not None and self._process.poll() is None:
            kill(self._process)


@dataclass
class PushOnly(_KilledAtRandom):
    """`evalpush push` of the runs with work left, killed at random, started again."""

    def step(self, todo: list[Path]) -> None:
        self._reap_or_kill()
        if self._process is None and todo:
            self._start("push", ["push", *map(str, todo)])

    def drain(self, every_run: list[Path], done: Callable[[], bool], seconds: float) -> None:
        """Kills off: push every run until `done()` says the platform holds what it should."""
        self.kills.budget, self._kill_at = 0, None
        deadline = time.monotonic() + seconds
        if self._process is not None:
            self._wait(deadline)
        for attempt in range(DRAIN_PUSHES):  # at least one: pushing finalized runs sends nothing
            if attempt and done() or time.monotonic() >= deadline:
                return
            self._start("push-drain", ["push", *map(str, every_run)])
            self._wait(deadline)

    def _wait(self, deadline: float) -> None:
        assert self._process is not None
        try:
            self.exits[self._process.wait(max(0.0, deadline - time.monotonic()))] += 1
        except subprocess.TimeoutExpired:
            kill(self._process)
            self.exits[-signal.SIGKILL] += 1
        self._process = None


def work_until_done(uploader: Daemon | Any, done: Callable[[], bool], seconds: float) -> None:
    """Step `uploader` (daemons: started again if they die) until `done()`, then a quiet while
    (the settle time and two rescans: a run that cannot upload, written last and ready by
    settling, is still waiting when the uploading runs are all done), or `seconds` pass."""
    deadline = time.monotonic() + seconds
    world = uploader.world
    while time.monotonic() < deadline and not uploader.broken:
        uploader.step([])
        if done():
            time.sleep(world.settle_seconds + 2 * world.rescan_seconds)
            return
        time.sleep(DRAIN_POLL_SECONDS)


@dataclass
class Daemon(_KilledAtRandom):
    """`evalpush run` on the tree, killed at random and started again; it must not die alone."""

    stop_exit: int | None = None  # its exit code on SIGTERM at the end (None: it hung)

    @property
    def broken(self) -> bool:
        return sum(self.exits.values()) >= DAEMON_DEATHS_TO_GIVE_UP

    def step(self, todo: list[Path]) -> None:
        """`todo` is ignored: the daemon finds its work itself."""
        self._reap_or_kill()
        if self._process is None and not self.broken:
            self._start("daemon", ["--config", str(self.world.daemon_config()), "run"])

    def drain(self, every_run: list[Path], done: Callable[[], bool], seconds: float) -> None:
        """Kills off: work until `done()` and a quiet while (`work_until_done`), then SIGTERM."""
        self.kills.budget, self._kill_at = 0, None
        work_until_done(self, done, seconds)
        self._reap_or_kill()
        if self._process is None:
            return
        self._process.send_signal(signal.SIGTERM)
        try:
            self.stop_exit = self._process.wait(STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            kill(self._process)
        self._process = None


@dataclass
class _Overlap:
    """One overlapping push: its process, when it times out, and when it is killed (if ever)."""

    process: subprocess.Popen[bytes]
    deadline: float
    kill_at: float | None


@dataclass
class OverlappingPushes:
    """`evalpush push` of a few finished runs now and then, beside the uploader; a share of
    them SIGKILLed at a random moment (`kill_share`, `kill_after_seconds` after the start)."""

    world: EvalpushWorld
    budget: int
    interval_seconds: float
    rng: random.Random
    kill_share: float = 0.0
    kill_after_seconds: tuple[float, float] = (0.5, 4.0)
    max_at_once: int = 2
    max_runs: int = 8
    timeout_seconds: float = 300.0
    started: int = 0
    killed: int = 0
    timed_out: int = 0
    exits: Counter[int] = field(default_factory=Counter)  # exits the soak did not cause
    _running: list[_Overlap] = field(default_factory=list)
    _next_at: float = 0.0

    def __post_init__(self) -> None:
        self._next_at = time.monotonic() + self.rng.uniform(0, self.interval_seconds)

    def step(self, todo: list[Path], finished: list[Path]) -> None:
        """Maybe start one: half the time among the runs with work left, else any finished."""
        self._reap(wait=False)
        now = time.monotonic()
        if self.started >= self.budget or now < self._next_at or not finished:
            return
        if len(self._running) >= self.max_at_once:
            return
        pool = todo if todo and self.rng.random() < 0.5 else finished
        chosen = self.rng.sample(pool, k=self.rng.randint(1, min(self.max_runs, len(pool))))
        process = self.world.start("overlap-push", ["push", *map(str, chosen)])
        killed = self.rng.random() < self.kill_share
        kill_at = now + self.rng.uniform(*self.kill_after_seconds) if killed else None
        self._running.append(_Overlap(process, now + self.timeout_seconds, kill_at))
        self.started += 1
        self._next_at = now + self.rng.expovariate(1.0 / self.interval_seconds)

    def _reap(self, *, wait: bool) -> None:
        for entry in list(self._running):
            process = entry.process
            if wait:
                entry.kill_at = None  # the drain: every one left runs to its end
                try:
                    process.wait(max(0.0, entry.deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
            now = time.monotonic()
            if process.poll() is not None:
                self.exits[process.returncode] += 1
            elif entry.kill_at is not None and now >= entry.kill_at:
                kill(process)
                self.killed += 1
            elif now >= entry.deadline:
                kill(process)
                self.timed_out += 1
            else:
                continue
            self._running.remove(entry)

    def finish(self) -> None:
        """Wait for the ones running (each within its timeout)."""
        self._reap(wait=True)

    def close(self) -> None:
        for entry in self._running:
            if entry.process.poll() is None:
                kill(entry.process)
