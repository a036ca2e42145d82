"""The soak, start to end: `run_soak(SoakParams) -> SoakReport`.

1. Plan the runs (`plan`), start the local platform (`platform`), the writers (`writers`), the
   uploader (`uploaders`: push-only or daemon) and, now and then, overlapping pushes.
2. Chaos phase: faults in a share of the requests and outages (`chaos`), the uploader SIGKILLed
   at random moments while its kill budget lasts, until every writer is done and the platform
   holds a COMPLETED evaluation for every run that should have one, or `max_seconds` pass.
3. Drain: faults cleared, no more kills; the uploader finishes (push-only: `push` of every run;
   daemon: it works until the platform holds everything, then SIGTERM, which must exit 0).
4. Accounting from the platform's stored state (`accounting`); evalpush's own view (`evalpush
   status`) held against it (`ledgerview`); the secret searched for in every log, the ledger
   and the platform's stored state.

Bounded in time (each phase has a deadline) and count; every process it starts is stopped by
pid in `finally`, whatever happened.
"""

from __future__ import annotations

import random
import secrets
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from soakkit.accounting import Accounting, account
from soakkit.chaos import Chaos, ChaosParams
from soakkit.ledgerview import LedgerView, compare, ledger_status
from soakkit.plan import Mix, RunPlan, plan_runs, save_plans
from soakkit.platform import PLATFORM_LOG, PlatformProcess, clean_environ
from soakkit.uploaders import (
    Daemon,
    EvalpushWorld,
    KillPolicy,
    Mode,
    OverlappingPushes,
    PushOnly,
)
from soakkit.writers import ManifestReader, read_manifests

BENCH = Path(__file__).resolve().parents[1]
POLL_SECONDS = 1.0  # how often the platform's summary is read during the chaos phase, at most
POLL_SHARE = 0.1  # of the platform's time its summary may take (it holds the store's lock)
LOOP_SECONDS = 0.05
WRITER_STOP_SECONDS = 10.0


@dataclass
class SoakParams:
    workdir: Path
    mode: Mode = Mode.PUSH_ONLY
    runs: int = 100
    samples: int = 40_000
    writers: int = 4
    pause_seconds: float = 0.05  # a writer's longest pause between bursts of lines
    kills: int = 30
    kill_after_seconds: tuple[float, float] = (0.5, 4.0)
    overlaps: int = 10
    overlap_interval_seconds: float = 8.0
    overlap_kill_share: float = 0.25  # of the overlapping pushes, SIGKILLed at a random moment
    chaos: ChaosParams = field(default_factory=ChaosParams)
    mix: Mix = field(default_factory=Mix)
    batch_samples: int = 50
    read_timeout_seconds: float = 3.0
    log_level: str = "warning"  # of every evalpush process ("debug": each batch acknowledged)
    settle_seconds: float = 6.0
    follow_batch_seconds: float = 2.0  # the daemon follows runs while they are written
    rescan_seconds: float = 2.0
    max_seconds: float = 1800.0  # the chaos phase
    drain_seconds: float = 600.0
    seed: int = 0
    fleet: int = 0  # daemons sharing a PostgreSQL ledger (soakkit.fleet); 0: one, on SQLite
    db_restarts: int = 0  # of the fleet's PostgreSQL, spread over the soak
    clock_ahead_seconds: float = 0.0  # a fleet's first host's wall clock runs this far ahead
    late_write_seconds: float = 3.0  # every uploader's; the chaos's late work lands within it


@dataclass
class FleetReport:
    daemons: int
    db_restarts: int
    runs_per_daemon: dict[str, int]


@dataclass
class SoakReport:
    params: SoakParams
    plans: list[RunPlan]
    accounting: Accounting
    ledger: LedgerView
    kills: int
    uploader_starts: int
    uploader_exits: Counter[int]
    daemon_stop_exit: int | None
    overlaps: int
    overlap_kills: int
    overlap_exits: Counter[int]
    overlap_timeouts: int
    faults: Counter[str]
    faults_left_pending: int
    outages: int
    outage_seconds: float
    chaos_seconds: float
    drain_seconds: float
    account_seconds: float
    wall_seconds: float
    chaos_timed_out: bool
    secret_found_in: list[str]
    tracebacks_in: list[str]
    writer_failures: list[str]
    fleet: FleetReport | None = None

    @property
    def violations(self) -> list[str]:
        found = list(self.accounting.problems)
        found += self.ledger.problems
        found += [f"the API key appears in {place}" for place in self.secret_found_in]
        found += [f"a Python traceback in {log}" for log in self.tracebacks_in]
        found += self.writer_failures
        if self.fleet is not None and self.fleet.db_restarts < self.params.db_restarts:
            found.append(
                f"PostgreSQL restarted {self.fleet.db_restarts} times, not {self.params.db_restarts}"
            )
        if self.params.mode == Mode.DAEMON:
            if self.uploader_exits:
                found.append(f"the daemon exited by itself: {dict(self.uploader_exits)}")
            if self.daemon_stop_exit != 0:
                found.append(f"the daemon's exit on SIGTERM was {self.daemon_stop_exit}, not 0")
        return found


class _Soak:
    """One soak's live parts; `run()` drives them through the phases."""

    def __init__(self, params: SoakParams) -> None:
        self.params = params
        self.rng = random.Random(params.seed)
        self.workdir = params.workdir.resolve()  # writers run in bench/
        self.plans = plan_runs(params.seed, params.runs, params.samples, params.mix)
        self.uploading = {p.run_id for p in self.plans if p.flaw.uploads}
        self.key = f"soak-key-{secrets.token_hex(12)}"
        self.manifests = [self.workdir / f"manifest-{i}.jsonl" for i in range(params.writers)]
        self.writers: list[subprocess.Popen[bytes]] = []
        self.completed: set[str] = set()  # run ids with a COMPLETED evaluation, last read

    def run(self) -> SoakReport:
        started = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "tree").mkdir()
        save_plans(self.plans, self.workdir / "plans.json")
        self.platform = PlatformProcess(self.workdir, self.key)
        self.world = EvalpushWorld(
            self.workdir,
            self.platform.base_url,
            self.key,
            batch_samples=self.params.batch_samples,
            read_timeout_seconds=self.params.read_timeout_seconds,
            log_level=self.params.log_level,
            settle_seconds=self.params.settle_seconds,
            follow_batch_seconds=self.params.follow_batch_seconds,
            rescan_seconds=self.params.rescan_seconds,
            late_write_seconds=self.params.late_write_seconds,
        )
        kills = KillPolicy(self.params.kills, self.params.kill_after_seconds, self.rng)
        self.database = None
        if self.params.fleet:
            from soakkit.fleet import Database, Fleet

            self.database = Database(self.workdir)
            self.world.shared = self.database.environ
            self.uploader = Fleet(
                self.world,
                kills,
                self.database,
                self.params.fleet,
                self.params.db_restarts,
                lambda: len(self.completed & self.uploading) / max(1, len(self.uploading)),
                self.rng,
                self.params.clock_ahead_seconds,
            )
        else:
            uploader_type = Daemon if self.params.mode == Mode.DAEMON else PushOnly
            self.uploader = uploader_type(self.world, kills)
        self.overlaps = OverlappingPushes(
            self.world,
            self.params.overlaps,
            self.params.overlap_interval_seconds,
            self.rng,
            kill_share=self.params.overlap_kill_share,
            kill_after_seconds=self.params.kill_after_seconds,
        )
        self.chaos = Chaos(self.platform, self.params.chaos, self.rng)
        try:
            return self._phases(started)
        finally:
            self.uploader.close()
            self.overlaps.close()
            self._stop_writers()
            self.platform.stop()
            if self.database is not None:
                self.database.stop()

    def _phases(self, started: float) -> SoakReport:
        self._start_writers()
        chaos_timed_out = not self._chaos_phase()
        chaos_end = time.monotonic()
        self.chaos.finish()
        self.uploader.drain(self._run_dirs(), self._all_completed, self.params.drain_seconds)
        daemon_stop_exit = getattr(self.uploader, "stop_exit", None)
        self.overlaps.finish()
        writer_failures = self._stop_writers()
        drain_end = time.monotonic()
        accounting = account(
            self.platform, self.plans, read_manifests(self.manifests), self.world.tree
        )
        ledger = compare(ledger_status(self.world.environ()), accounting, self.platform.summary())
        account_end = time.monotonic()
        return SoakReport(
            params=self.params,
            plans=self.plans,
            accounting=accounting,
            ledger=ledger,
            kills=self.uploader.killed,
            uploader_starts=self.uploader.starts,
            uploader_exits=self.uploader.exits,
            daemon_stop_exit=daemon_stop_exit,
            overlaps=self.overlaps.started,
            overlap_kills=self.overlaps.killed,
            overlap_exits=self.overlaps.exits,
            overlap_timeouts=self.overlaps.timed_out,
            faults=self.chaos.injected,
            faults_left_pending=self.chaos.left_pending,
            outages=self.chaos.outages,
            outage_seconds=self.chaos.outage_seconds,
            chaos_seconds=chaos_end - started,
            drain_seconds=drain_end - chaos_end,
            account_seconds=account_end - drain_end,
            wall_seconds=time.monotonic() - started,
            chaos_timed_out=chaos_timed_out,
            secret_found_in=self._secret_found_in(),
            tracebacks_in=self._tracebacks_in(),
            writer_failures=writer_failures,
            fleet=None
            if self.database is None
            else FleetReport(
                self.params.fleet, self.database.restarts, self.uploader.runs_per_daemon()
            ),
        )

    # -- phases ---------------------------------------------------------------------------

    def _start_writers(self) -> None:
        for i, manifest in enumerate(self.manifests):
            command = [sys.executable, "-m", "soakkit.writers", "--plans"]
            command += [str(self.workdir / "plans.json"), "--tree", str(self.world.tree)]
            command += ["--writer", str(i), "--writers", str(len(self.manifests))]
            command += ["--manifest", str(manifest), "--seed", str(self.params.seed)]
            command += ["--pause-seconds", str(self.params.pause_seconds)]
            log = open(self.workdir / "logs" / f"writer-{i}.log", "wb")  # noqa: SIM115
            with log:
                self.writers.append(
                    subprocess.Popen(
                        command,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        cwd=BENCH,
                        env=clean_environ(PYTHONPATH=str(BENCH)),
                    )
                )

    def _chaos_phase(self) -> bool:
        """Until every run is written and held by the platform; False if time ran out."""
        deadline = time.monotonic() + self.params.max_seconds
        manifests = ManifestReader(self.manifests)
        next_poll = 0.0
        while time.monotonic() < deadline:
            self.chaos.tick()
            finished = manifests.read()
            if not self.chaos.in_outage() and time.monotonic() >= next_poll:
                polled = time.monotonic()
                summary = self.platform.summary()
                self.completed = _completed_runs(summary)
                self.chaos.observe(summary["requests"])
                took = time.monotonic() - polled
                next_poll = polled + max(POLL_SECONDS, took / POLL_SHARE)
            todo, finished_dirs = self._work(finished)
            self.uploader.step(todo)
            self.overlaps.step(todo, finished_dirs)
            if self.uploader.broken:
                return False
            codes = [w.poll() for w in self.writers]
            if any(code not in (None, 0) for code in codes):
                return False  # a writer failed: the runs will not all come; account for what did
            if all(code == 0 for code in codes) and self.uploading <= self.completed:
                return True
            time.sleep(LOOP_SECONDS)
        return False

    def _work(self, finished: dict[str, dict]) -> tuple[list[Path], list[Path]]:
        """Finished runs with work left (with the finished runs that cannot upload, so every
        push meets them too), and every finished run."""
        plans = [p for p in self.plans if p.run_id in finished]
        left = [p for p in plans if p.run_id in self.uploading and p.run_id not in self.completed]
        cannot = [p for p in plans if p.run_id not in self.uploading]
        tree = self.world.tree
        todo = [tree / p.relpath for p in left + cannot] if left else []
        return todo, [tree / p.relpath for p in plans]

    def _all_completed(self) -> bool:
        self.completed = _completed_runs(self.platform.summary())
        return self.uploading <= self.completed

    def _run_dirs(self) -> list[Path]:
        return [self.world.tree / p.relpath for p in self.plans]

    def _stop_writers(self) -> list[str]:
        failures = []
        for i, writer in enumerate(self.writers):
            try:
                code = writer.wait(WRITER_STOP_SECONDS)
            except subprocess.TimeoutExpired:
                writer.kill()
                code = writer.wait()
            if code != 0:
                failures.append(f"writer {i} exited {code} (logs/writer-{i}.log)")
        self.writers.clear()
        return failures

    # -- what else must hold ----------------------------------------------------------------

    def _secret_found_in(self) -> list[str]:
        """Every log, the ledger's files and the platform's stored state, searched for the key."""
        secrets = [self.key.encode()]
        if self.database is not None:
            secrets.append(self.database.password_file.read_bytes())
        places = sorted((self.workdir / "logs").iterdir())
        places += sorted(self.workdir.glob("state*/state.db*"))
        found = [
            str(p.relative_to(self.workdir))
            for p in places
            if any(secret in p.read_bytes() for secret in secrets)
        ]
        if self.key in str(self.platform.summary()):
            found.append("the platform's stored evaluations")
        return found

    def _tracebacks_in(self) -> list[str]:
        """Logs of evalpush and the writers with a Python traceback in them. The platform's is
        left out: aiohttp logs one whenever a killed client drops a request mid-body."""
        return sorted(
            str(p.relative_to(self.workdir))
            for p in (self.workdir / "logs").iterdir()
            if p.name != PLATFORM_LOG and b"Traceback" in p.read_bytes()
        )


def _completed_runs(summary: dict) -> set[str]:
    """Run ids with a COMPLETED evaluation on the platform."""
    return {
        e["metadata"]["run_id"]
        for e in summary["evaluations"].values()
        if e["status"] == "COMPLETED" and "run_id" in (e.get("metadata") or {})
    }


def run_soak(params: SoakParams) -> SoakReport:
    return _Soak(params).run()
