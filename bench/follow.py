"""Following runs while they are written (`runs.follow`): lag, the daemon's CPU, and the cost per
GB against uploading the same file once it is finished.

Each mode starts the local platform in this process and `evalpush run` as a subprocess on a fresh
state dir, and writes runs as an eval writes them: lines of a generated run (`gen_traces`, about
3.6 KB each, `push = false`) appended at a pace by a writer thread here. The daemon's CPU is its
utime + stime from /proc; its peak RSS its VmHWM. Each run is checked on the platform at the end:
one COMPLETED evaluation, every line once, finalized once; else the bench fails.

- `lag [--seconds 600] [--rate 20] [--batch-seconds 30]`: one run written at `rate` lines/s. Each
  line's lag is the time from its newline on disk to the platform holding it (the platform's
  sample count polled every 0.2 s; samples arrive in file order): median, p99, max. Then the time
  from the last line to the finalize, the daemon's CPU, the requests sent.
- `busy [--runs 8] [--rate 100] [--seconds 120] [--follow false]`: `runs` runs written at once
  at `rate` lines/s each: the daemon's CPU as a share of a core while they are written
  (`--follow false`: the same runs only watched, to be uploaded once finished).
- `per-gb [--mib 1024] [--mb-per-second 20]`: one run of `mib` MiB written at `mb-per-second`,
  followed, then the same written with `runs.follow = false` (uploaded once finished): the
  daemon's CPU seconds per GB of each and their ratio, its peak RSS, and the seconds from the
  run's last line to its finalize.

`.venv/bin/python bench/follow.py MODE [options]`
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_traces  # noqa: E402

from evalpush.local_platform import LocalPlatform  # noqa: E402

CACHE = Path(__file__).resolve().parent / ".cache" / "follow"
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM")


def source_lines(mib: float, seed: int = 0) -> list[bytes]:
    """The lines of a generated run of about `mib` MiB (cached)."""
    run = gen_traces.generate(CACHE / f"{mib:g}", int(mib * (1 << 20)), seed=seed, reuse=True)
    return (run / "traces.jsonl").read_bytes().splitlines(keepends=True)


class Writer(threading.Thread):
    """Appends `lines` to a new run directory under `group` at `rate` lines/s (in bursts of
    `burst` lines), recording when each line's newline was on disk."""

    def __init__(self, group: Path, lines: list[bytes], rate: float, burst: int = 1) -> None:
        super().__init__(daemon=True)
        self.lines, self.rate, self.burst = lines, rate, burst
        self.run_id = str(gen_traces.uuid.uuid4())
        self.path = group / self.run_id
        self.path.mkdir(parents=True)
        num_tasks = len(lines) // gen_traces.NUM_ROLLOUTS
        (self.path / "config.toml").write_text(gen_traces.config_toml(num_tasks))
        self.written_at: list[float] = []

    def run(self) -> None:
        start = time.monotonic()
        with open(self.path / "traces.jsonl", "ab", buffering=0) as f:
            for first in range(0, len(self.lines), self.burst):
                due = start + first / self.rate
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                chunk = self.lines[first : first + self.burst]
                f.write(b"".join(chunk))
                now = time.monotonic()
                self.written_at.extend([now] * len(chunk))


class Bench:
    """The platform and a daemon on a fresh state dir."""

    def __init__(self, scratch: Path, platform: LocalPlatform, **settings: str) -> None:
        self.root = scratch / "outputs"
        self.root.mkdir()
        self.platform = platform
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PRIME_", "EVALPUSH_"))}
        env |= {
            "PRIME_API_BASE_URL": platform.base_url,
            "PRIME_API_KEY": platform.api_key or "bench-key",
            "EVALPUSH_STATE_DIR": str(scratch / "state"),
            "EVALPUSH_WATCH__ROOTS": json.dumps([str(self.root)]),
            "EVALPUSH_LOG__FORMAT": "json",
            "HOME": str(scratch),
            **settings,
        }
        self.daemon = subprocess.Popen(
            [sys.executable, "-m", "evalpush", "run"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.finalized: dict[str, float] = {}
        self._ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not self._ready.wait(60):
            raise SystemExit("the daemon did not start")

    def _read(self) -> None:
        assert self.daemon.stdout is not None
        for line in self.daemon.stdout:
            if '"evalpush daemon running"' in line:
                self._ready.set()
            elif '"run finalized"' in line:
                event = json.loads(line)
                self.finalized[event["run"]] = time.monotonic()

    def cpu(self) -> float:
        return cpu_seconds(self.daemon.pid)

    def wait_finalized(self, run_ids: list[str], timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while not all(r in self.finalized for r in run_ids):
            if time.monotonic() > deadline or self.daemon.poll() is not None:
                raise SystemExit(f"not finalized: {set(run_ids) - set(self.finalized)}")
            time.sleep(0.05)

    def check(self, run_id: str, lines: int) -> None:
        found = [
            e
            for e in self.platform.summary()["evaluations"].values()
            if e["metadata"].get("run_id") == run_id
        ]
        if len(found) != 1:
            raise SystemExit(f"{run_id}: {len(found)} evaluations")
        (e,) = found
        got = (e["status"], e["sample_count"], e["distinct_sample_ids"], e["finalize_count"])
        if got != ("COMPLETED", lines, lines, 1):
            raise SystemExit(f"{run_id}: {got}, expected COMPLETED with {lines} once")

    def stop(self) -> None:
        self.daemon.send_signal(signal.SIGTERM)
        self.daemon.wait(60)


def stored(platform: LocalPlatform, run_id: str) -> int:
    return sum(
        e["sample_count"]
        for e in platform.summary()["evaluations"].values()
        if e["metadata"].get("run_id") == run_id
    )


def lag(args: argparse.Namespace) -> None:
    count = int(args.seconds * args.rate)
    lines = source_lines(max(1.0, count * 3.7 / 1024))[:count]
    with tempfile.TemporaryDirectory(prefix="evalpush-follow-") as tmp, LocalPlatform() as platform:
        bench = Bench(
            Path(tmp), platform, EVALPUSH_RUNS__FOLLOW_BATCH_SECONDS=str(args.batch_seconds)
        )
        cpu_before = bench.cpu()
        writer = Writer(bench.root / "env--model", lines, args.rate)
        writer.start()
        seen_at: list[float] = []
        while len(seen_at) < count:
            now_stored = stored(platform, writer.run_id)
            seen_at.extend([time.monotonic()] * (now_stored - len(seen_at)))
            if bench.daemon.poll() is not None:
                raise SystemExit("the daemon exited")
            time.sleep(0.2)
        writer.join()
        bench.wait_finalized([writer.run_id])
        end = bench.finalized[writer.run_id] - writer.written_at[-1]
        cpu = bench.cpu() - cpu_before
        requests = platform.summary()["requests"]
        bench.check(writer.run_id, count)
        bench.stop()
    lags = sorted(s - w for s, w in zip(seen_at, writer.written_at, strict=True))
    p99 = lags[int(0.99 * (len(lags) - 1))]
    print(
        f"lag, {count} lines at {args.rate:g}/s for {args.seconds:g} s, batch period "
        f"{args.batch_seconds:g} s: median {statistics.median(lags):.1f} s, p99 {p99:.1f} s, "
        f"max {lags[-1]:.1f} s; finalized {end:.2f} s after the last line; daemon CPU "
        f"{cpu:.1f} s ({100 * cpu / args.seconds:.2f}% of a core); requests {requests}"
    )


def busy(args: argparse.Namespace) -> None:
    count = int(args.seconds * args.rate)
    lines = source_lines(max(1.0, count * 3.7 / 1024))[:count]
    with tempfile.TemporaryDirectory(prefix="evalpush-follow-") as tmp, LocalPlatform() as platform:
        bench = Bench(Path(tmp), platform, EVALPUSH_RUNS__FOLLOW=args.follow)
        writers = [
            Writer(bench.root / f"env--model{n}", lines, args.rate) for n in range(args.runs)
        ]
        cpu_before, started = bench.cpu(), time.monotonic()
        for writer in writers:
            writer.start()
        for writer in writers:
            writer.join()
        cpu, took = bench.cpu() - cpu_before, time.monotonic() - started
        bench.wait_finalized([w.run_id for w in writers])
        for writer in writers:
            bench.check(writer.run_id, count)
        bench.stop()
    mb = args.runs * sum(map(len, lines)) / 1e6
    print(
        f"busy (follow {args.follow}), {args.runs} runs at {args.rate:g} lines/s each for "
        f"{took:.0f} s ({mb:.0f} MB): "
        f"daemon CPU {cpu:.1f} s, {100 * cpu / took:.2f}% of a core while they were written"
    )


def per_gb(args: argparse.Namespace) -> None:
    lines = source_lines(args.mib)
    size = sum(map(len, lines))
    rate = args.mb_per_second * 1e6 / (size / len(lines))
    results = {}
    for follow in ("true", "false"):
        with (
            tempfile.TemporaryDirectory(prefix="evalpush-follow-") as tmp,
            LocalPlatform(db=Path(tmp) / "platform.db") as platform,
        ):
            bench = Bench(Path(tmp), platform, EVALPUSH_RUNS__FOLLOW=follow)
            cpu_before = bench.cpu()
            writer = Writer(bench.root / "env--model", lines, rate, burst=64)
            writer.start()
            writer.join()
            bench.wait_finalized([writer.run_id])
            end = bench.finalized[writer.run_id] - writer.written_at[-1]
            cpu = bench.cpu() - cpu_before
            peak = peak_rss_mib(bench.daemon.pid)
            bench.check(writer.run_id, len(lines))
            bench.stop()
        results[follow] = cpu
        name = "followed" if follow == "true" else "at the end"
        print(
            f"per-gb, {size / 1e9:.2f} GB written at {args.mb_per_second:g} MB/s, {name}: "
            f"daemon CPU {cpu:.1f} s ({cpu / (size / 1e9):.1f} s per GB), peak RSS "
            f"{peak:.0f} MiB, finalized {end:.2f} s after the last line"
        )
    print(f"per-gb: followed / at the end = {results['true'] / results['false']:.2f}x CPU")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    modes = parser.add_subparsers(dest="mode", required=True)
    p = modes.add_parser("lag")
    p.add_argument("--seconds", type=float, default=600)
    p.add_argument("--rate", type=float, default=20)
    p.add_argument("--batch-seconds", type=float, default=30)
    p.set_defaults(run=lag)
    p = modes.add_parser("busy")
    p.add_argument("--runs", type=int, default=8)
    p.add_argument("--rate", type=float, default=100)
    p.add_argument("--seconds", type=float, default=120)
    p.add_argument("--follow", choices=("true", "false"), default="true")
    p.set_defaults(run=busy)
    p = modes.add_parser("per-gb")
    p.add_argument("--mib", type=float, default=1024)
    p.add_argument("--mb-per-second", type=float, default=20)
    p.set_defaults(run=per_gb)
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
