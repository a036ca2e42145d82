"""The daemon at rest and at work on a big tree (target numbers: an idle daemon with 10,000
finished runs uses under 1% of a core, starts up to READY within 2 s, and finalizes a run that
becomes ready within 2 s plus its transfer time).

Setup, cached in bench/.cache/idle/<N>/: N one-trace runs (bench/many_runs.py's tree) pushed
once by `evalpush push` to `evalpush local-platform` with a SQLite db, so the ledger holds N
finalized runs and the platform their evaluations; that push's rate (runs/s) is printed
(and kept with the cache). Each measurement copies that state dir and
db to a temp dir and starts `evalpush run` on the tree as its own process, with a datagram
socket of this script as NOTIFY_SOCKET (what systemd gives a `Type=notify` service):

1. start-up to READY: from spawning `evalpush run` to READY=1 arriving, best of --repeat;
2. idle CPU: the daemon's user+system CPU (from /proc/<pid>/stat) over --idle-seconds of doing
   nothing, a full rescan of the N runs included (`watch.rescan_seconds` is set so one falls in
   the window), as % of one core;
3. ready to finalized: a new one-trace run is written into the tree (config.toml with its
   expected count, then its one line); from the moment the line is written to the moment the
   platform lists the run's evaluation COMPLETED, best and median of --latency-runs.

    python bench/idle.py [--runs 10000] [--repeat 3] [--idle-seconds 60] [--latency-runs 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import many_runs  # noqa: E402 - the sibling bench modules: the tree, the platform runner
import push  # noqa: E402

LATENCY_ENVIRONMENT = "bench-idle-latency"
START_TIMEOUT_SECONDS = 60.0
FINALIZE_TIMEOUT_SECONDS = 60.0


def prepared(count: int, cache: Path) -> Path:
    """cache/idle/<count>/ holding `state/` (a ledger with `count` finalized runs) and
    `platform.db` (their evaluations), made once by a real `evalpush push`."""
    home = cache / "idle" / str(count)
    if (home / ".complete").exists():
        print(f"setup (cached): {(home / '.complete').read_text().strip()}")
        return home
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    root = many_runs.the_runs(count, cache)
    seconds = pushed(home, root, count)
    rate = (
        f"`evalpush push` of {count} one-trace runs in {seconds:.1f} s: {count / seconds:.0f} "
        "runs/s (once; bench/many_runs.py measures this rate with repeats)"
    )
    print(f"setup: {rate}")
    (home / ".complete").write_text(rate + "\n")
    return home


def pushed(home: Path, root: Path, count: int, *, only: Path | None = None) -> float:
    """`evalpush push` of the `count` runs under `root` (or under `only`, a directory in it) to
    a platform keeping its db in `home`, the ledger in `home/state`, checked on the platform;
    the seconds it took."""
    platform = push.Platform(home)
    try:
        env = environ(platform.base, home / "state", root)
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "evalpush", "push", str(only or root)],
            env=env,
            capture_output=True,
        )
        seconds = time.perf_counter() - started
        if done.returncode != 0:
            raise SystemExit(f"the setup push failed: {done.stderr.decode()[-2000:]}")
        many_runs.check(platform, count)
    finally:
        platform.stop()
    return seconds


def environ(base: str, state: Path, root: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EVALPUSH_", "PRIME_"))}
    env.update(push.SOURCE)
    env.update(
        PRIME_API_KEY=push.PLATFORM_KEY,
        PRIME_API_BASE_URL=base,
        EVALPUSH_STATE_DIR=str(state),
        EVALPUSH_WATCH__ROOTS=f'["{root}"]',
        EVALPUSH_LOG__LEVEL="info",
        **extra,
    )
    return env


class Daemon:
    """`evalpush run` as its own process, telling this script's socket when it is READY."""

    def __init__(self, env: dict[str, str], workdir: Path):
        self.address = str(workdir / f"notify-{uuid.uuid4().hex[:8]}")
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.socket.bind(self.address)
        self.log = open(workdir / "daemon.log", "ab")  # noqa: SIM115 - closed in stop()
        started = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "evalpush", "run"],
            env={**env, "NOTIFY_SOCKET": self.address},
            stdout=self.log,
            stderr=subprocess.STDOUT,
            cwd=push.REPO,
        )
        self.ready_seconds = self._await(b"READY=1") - started

    def _await(self, message: bytes) -> float:
        self.socket.settimeout(START_TIMEOUT_SECONDS)
        while True:
            try:
                data = self.socket.recv(4096)
            except TimeoutError:
                self.stop()
                raise SystemExit("the daemon did not send READY=1 in time") from None
            if message in data.split(b"\n"):
                return time.perf_counter()

    def cpu_seconds(self) -> float:
        return push.proc_cpu_seconds(self.proc.pid)

    def rss_bytes(self) -> int:
        return push.proc_status_bytes(self.proc.pid, "VmRSS")

    def stop(self) -> None:
        push.terminate(self.proc)
        self.socket.close()
        self.log.close()


def latency_run(root: Path, n: int) -> tuple[str, float]:
    """Write a one-trace run that is ready as soon as its line is written; (run id, when)."""
    run_id = str(uuid.uuid4())
    directory = root / "latency" / run_id
    directory.mkdir(parents=True)
    (directory / "config.toml").write_text(
        'model = "org/model"\nnum_tasks = 1\nnum_rollouts = 1\npush = false\n'
        f'[taskset]\nid = "{LATENCY_ENVIRONMENT}"\n'
    )
    (directory / "traces.jsonl").write_bytes(b"")
    time.sleep(0.2)  # the run is seen waiting first, as a real one would be
    with (directory / "traces.jsonl").open("ab") as traces:
        traces.write(many_runs.trace_line(1_000_000 + n))
    return run_id, time.perf_counter()


def finalized_at(platform: push.Platform, run_id: str) -> float:
    deadline = time.monotonic() + FINALIZE_TIMEOUT_SECONDS
    path = f"/api/v1/evaluations/?environment_name={LATENCY_ENVIRONMENT}&limit=100"
    while time.monotonic() < deadline:
        for evaluation in platform.get(path)["evaluations"]:
            if evaluation["metadata"]["run_id"] == run_id and evaluation["status"] == "COMPLETED":
                return time.perf_counter()
        time.sleep(0.01)
    raise TimeoutError(f"run {run_id} was not finalized within {FINALIZE_TIMEOUT_SECONDS:g} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--latency-runs", type=int, default=5)
    parser.add_argument("--cache", type=Path, default=push.BENCH / ".cache")
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    home = prepared(args.runs, args.cache)
    root = many_runs.the_runs(args.runs, args.cache)
    shutil.rmtree(root / "latency", ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix="bench-idle-", dir=args.cache) as tmp:
        work = Path(tmp)
        shutil.copytree(home / "state", work / "state")
        shutil.copy(home / "platform.db", work / "platform.db")
        platform = push.Platform(work)
        rescan = args.idle_seconds * 0.75  # one full rescan falls inside the idle window
        env = environ(
            platform.base,
            work / "state",
            root,
            EVALPUSH_WATCH__RESCAN_SECONDS=str(rescan),
            EVALPUSH_RUNS__SETTLE_SECONDS="30",
        )
        try:
            readies = []
            for _ in range(args.repeat - 1):
                daemon = Daemon(env, work)
                readies.append(daemon.ready_seconds)
                daemon.stop()
            daemon = Daemon(env, work)
            readies.append(daemon.ready_seconds)
            try:
                time.sleep(5.0)  # the first scan, right after READY, is part of start-up
                before = daemon.cpu_seconds()
                time.sleep(args.idle_seconds)
                idle_cpu = daemon.cpu_seconds() - before
                latencies = []
                for n in range(args.latency_runs):
                    run_id, written = latency_run(root, n)
                    latencies.append(finalized_at(platform, run_id) - written)
                rss = daemon.rss_bytes()
            except TimeoutError as exc:
                kept = args.cache / "idle-failed-daemon.log"
                shutil.copy(work / "daemon.log", kept)
                raise SystemExit(f"{exc}; the daemon's log: {kept}") from None
            finally:
                daemon.stop()
        finally:
            platform.stop()
            shutil.rmtree(root / "latency", ignore_errors=True)
    print(f"evalpush run on {args.runs} finalized one-trace runs (ledger and tree)")
    print(f"{'measure':<34} {'result':<28} target")
    print(
        f"{'start-up to READY':<34} {min(readies):<28.2f} < 2 s"
        f"   (all: {', '.join(f'{r:.2f}' for r in readies)})"
    )
    percent = idle_cpu / args.idle_seconds * 100
    print(
        f"{'idle CPU, one rescan included':<34} "
        f"{f'{percent:.2f}% of a core ({idle_cpu:.2f} s / {args.idle_seconds:g} s)':<28} < 1%"
    )
    print(
        f"{'ready to finalized (one trace)':<34} "
        f"{f'best {min(latencies):.3f} s, median {statistics.median(latencies):.3f} s':<28}"
        " < 2 s + transfer"
    )
    print(f"{'daemon RSS after':<34} {rss / push.MIB:.1f} MiB")


if __name__ == "__main__":
    main()
