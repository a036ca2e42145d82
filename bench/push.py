"""Push throughput and streaming memory: `evalpush push` to the local platform vs the seed's path.

1. Throughput, side by side on one generated run (at least 70 MB; the same cached run as
   bench/convert.py), each contender its own child process, best of --repeat:
   - ours:  `python -m evalpush push RUN_DIR` with a fresh state dir, against
            `evalpush local-platform` started as another subprocess on a free loopback port with a
            `--db` file in a temp dir (a fresh platform per repeat). The platform's CPU and memory
            are its own, not ours; they are printed apart. After each push the platform must hold
            one COMPLETED evaluation with every trace of the file once (`GET /_control/summary`),
            and, once, the stored sample ids must be exactly the file's trace ids.
   - seed:  in the producer venv (verifiers 0.1.15.dev437): `read_traces` + `trace_to_sample` with
            rollout numbers + ONE `httpx.Client(...).post(url, json={"samples": samples})` of the
            whole run, as its `push_traces` does. The local platform refuses bodies over 25 MiB
            (413), so that body goes to a discard endpoint in this process (stdlib http.server on
            loopback: reads the whole body, answers 200). Its resolve/create/finalize calls are
            left out (three tiny requests).
   - floor: bench/convert.py's orjson parse + re-serialize of every line, nothing else.
2. Streaming memory: peak RSS of `evalpush push` on a --big-gib run vs a 10 MiB run (each
   generated once into bench/.cache/push/), each against a fresh local platform.

CPU seconds and peak RSS are per child, measured by bench/convert.py's `measure` (wait4 for CPU,
a `sitecustomize` VmHWM hook for peak RSS). Wall time includes interpreter start and imports.

By default evalpush runs from the working tree (the editable install); `--at REV` runs the
daemon (push and local platform) as committed at REV instead (`git archive REV daemon` into a temp
dir put first on PYTHONPATH), to measure committed code while someone edits the tree.

    python bench/push.py [--mb 72] [--big-gib 1] [--skip-big] [--repeat 3] [--at REV]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from convert import (  # noqa: E402 - the sibling bench module: one measuring method for both
    FLOOR,
    MB,
    MIB,
    PEAK_HOOK,
    REPO,
    Measure,
    compile_daemon,
    measure,
    producer_python,
    the_run,
)
from gen_traces import generate  # noqa: E402

BENCH = Path(__file__).resolve().parent
GIB = 2**30
PLATFORM_KEY = "bench-push-key"
SOURCE: dict[str, str] = {}  # {"PYTHONPATH": daemon dir} with --at REV
START_TIMEOUT = 30.0

SEED_PUSH = """
import json, sys, time
started = time.perf_counter()
from pathlib import Path
import httpx
from verifiers.v1.cli.output import read_traces
from verifiers.v1.push import trace_to_sample
from verifiers.v1.trace import WireTrace
imported = time.perf_counter()
traces = read_traces(Path(sys.argv[1]), WireTrace)
read = time.perf_counter()
counts = {}
samples = []
for trace in traces:
    counts[trace.task.idx] = counts.get(trace.task.idx, 0) + 1
    samples.append(trace_to_sample(trace, counts[trace.task.idx]))
converted = time.perf_counter()
headers = {"Authorization": "Bearer bench", "Content-Type": "application/json"}
with httpx.Client(headers=headers, timeout=300.0) as client:
    resp = client.post(sys.argv[2], json={"samples": samples})
    resp.raise_for_status()
    answer = resp.json()
sent = time.perf_counter()
print(json.dumps({
    "import_seconds": imported - started, "read_seconds": read - imported,
    "convert_seconds": converted - read, "send_seconds": sent - converted,
    "samples": len(samples), "body_bytes": answer["bytes"],
}), file=sys.stderr)
"""


# ---------------------------------------------------------------- the seed's discard endpoint


class _Discard(BaseHTTPRequestHandler):
    """Reads the whole request body, keeps nothing, answers 200 `{"bytes": n}`."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        left = int(self.headers.get("Content-Length", 0))
        received = 0
        while left:
            chunk = self.rfile.read(min(left, MIB))
            if not chunk:
                break
            received += len(chunk)
            left -= len(chunk)
        body = json.dumps({"bytes": received}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def discard_endpoint() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Discard)
    thread = threading.Thread(target=server.serve_forever, name="discard", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/api/v1/evaluations/bench/samples"
    finally:
        server.shutdown()
        server.server_close()


# ---------------------------------------------------------------- the local platform


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def proc_status_bytes(pid: int, key: str) -> int:
    """A size from /proc/PID/status (`VmHWM`: peak RSS, `VmRSS`: RSS now), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) * 1024
    return 0


def terminate(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 30 s; reaped either way."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Platform:
    """`evalpush local-platform` as a subprocess with a SQLite db in `workdir`."""

    def __init__(self, workdir: Path, cpus: set[int] | None = None):
        """`cpus`: the CPUs the platform may run on (all by default)."""
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.db = workdir / "platform.db"
        self._log = open(workdir / "platform.log", "wb")  # noqa: SIM115 - closed in stop()
        env = {k: v for k, v in os.environ.items() if not k.startswith("EVALPUSH_")}
        env.update(SOURCE)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "evalpush",
                "local-platform",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--api-key",
                PLATFORM_KEY,
                "--db",
                str(self.db),
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env=env,
            preexec_fn=None if cpus is None else partial(os.sched_setaffinity, 0, cpus),
        )
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(
                    f"local platform exited {self.proc.returncode}: "
                    f"{(workdir / 'platform.log').read_text()[-2000:]}"
                )
            try:
                self.get("/_control/summary")
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("local platform did not start in time") from None
                time.sleep(0.05)

    def get(self, path: str) -> dict:
        request = urllib.request.Request(
            self.base + path, headers={"Authorization": f"Bearer {PLATFORM_KEY}"}
        )
        with urllib.request.urlopen(request, timeout=600) as response:
            return json.loads(response.read())

    def cpu_seconds(self) -> float:
        return proc_cpu_seconds(self.proc.pid)

    def peak_rss(self) -> int:
        return proc_status_bytes(self.proc.pid, "VmHWM")

    def stop(self) -> None:
        terminate(self.proc)
        self._log.close()


@contextlib.contextmanager
def child_environ(values: dict[str, str]) -> Iterator[None]:
    """`measure` hands its child a copy of os.environ: set `values` (and drop other EVALPUSH_*
    and PRIME_* variables) for the duration, then restore."""
    saved = dict(os.environ)
    for name in list(os.environ):
        if name.startswith(("EVALPUSH_", "PRIME_")):
            del os.environ[name]
    os.environ.update(values)
    os.environ.update(SOURCE)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@dataclass
class PushRun:
    measure: Measure
    platform_cpu: float
    platform_peak: int
    batches: int
    db_bytes: int


def check_platform(platform: Platform, traces: int, trace_ids: list[str] | None) -> dict:
    """One COMPLETED evaluation holding every trace once; the request counts."""
    summary = platform.get("/_control/summary")
    evaluations = summary["evaluations"]
    problems = []
    if len(evaluations) != 1:
        problems.append(f"{len(evaluations)} evaluations, not 1")
    for evaluation_id, ev in evaluations.items():
        if ev["status"] != "COMPLETED":
            problems.append(f"{evaluation_id}: status {ev['status']}")
        if ev["sample_count"] != traces or ev["distinct_sample_ids"] != traces:
            problems.append(
                f"{evaluation_id}: {ev['sample_count']} samples, "
                f"{ev['distinct_sample_ids']} distinct, file has {traces} traces"
            )
        if ev["duplicates"] or ev["finalize_count"] != 1:
            problems.append(
                f"{evaluation_id}: {ev['duplicates']} duplicates, "
                f"{ev['finalize_count']} finalize requests"
            )
        if trace_ids is not None and not problems:
            stored = platform.get(f"/_control/evaluations/{evaluation_id}/samples")["samples"]
            if sorted(s["sample_id"] for s in stored) != sorted(trace_ids):
                problems.append(f"{evaluation_id}: stored sample ids differ from the file's ids")
    if problems:
        raise SystemExit(
            "the platform does not hold the run exactly once:\n  " + "\n  ".join(problems)
        )
    return summary


def push_once(run_dir: Path, traces: int, hook_dir: Path, trace_ids: list[str] | None) -> PushRun:
    """`evalpush push run_dir` against a fresh local platform, checked afterwards."""
    with tempfile.TemporaryDirectory(prefix="bench-push-", dir=BENCH / ".cache") as tmp:
        work = Path(tmp)
        platform = Platform(work)
        try:
            env = {
                "PRIME_API_KEY": PLATFORM_KEY,
                "PRIME_API_BASE_URL": platform.base,
                "EVALPUSH_STATE_DIR": str(work / "state"),
            }
            cpu_before = platform.cpu_seconds()
            with child_environ(env):
                m = measure([sys.executable, "-m", "evalpush", "push", str(run_dir)], hook_dir)
            platform_cpu = platform.cpu_seconds() - cpu_before
            summary = check_platform(platform, traces, trace_ids)
            platform_peak = platform.peak_rss()
            db_bytes = sum(p.stat().st_size for p in work.glob("platform.db*"))
        finally:
            platform.stop()
    return PushRun(m, platform_cpu, platform_peak, summary["requests"].get("samples", 0), db_bytes)


# ---------------------------------------------------------------- reporting


def count_lines(path: Path) -> int:
    with open(path, "rb") as f:  # also warms the page cache
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(MIB), b""))


def trace_ids_of(path: Path) -> list[str]:
    try:
        from orjson import loads
    except ImportError:
        from json import loads
    with open(path, "rb") as f:
        return [loads(line)["id"] for line in f]


def spread(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}"


def table(rows: dict[str, list[Measure]], size: int, traces: int) -> None:
    """Best wall (MB/s, samples/s from it) and best CPU (CPU s per GB from it) per contender,
    with the spread of every run, since one machine's speed swings between runs."""
    print(
        f"{'path':<7}{'wall s':>8}{'MB/s':>8}{'samples/s':>11}{'CPU s':>8}{'CPU s/GB':>10}"
        f"{'peak RSS MiB':>14}  {'walls':>11}  {'CPU s':>11}"
    )
    for name, runs in rows.items():
        wall = min(m.wall_seconds for m in runs)
        cpu = min(m.cpu_seconds for m in runs)
        peak = max(m.peak_rss_bytes for m in runs)
        print(
            f"{name:<7}{wall:>8.2f}{size / MB / wall:>8.1f}{traces / wall:>11.0f}{cpu:>8.2f}"
            f"{cpu / (size / 1e9):>10.1f}{peak / MIB:>14.1f}  "
            f"{spread([m.wall_seconds for m in runs]):>11}  "
            f"{spread([m.cpu_seconds for m in runs]):>11}"
        )


def verdict(ok: bool) -> str:
    return "meets" if ok else "MISSES"


def throughput(args: argparse.Namespace, hook_dir: Path) -> None:
    run_dir = the_run(args.mb, args.cache)
    traces_file = run_dir / "traces.jsonl"
    size = traces_file.stat().st_size
    traces = count_lines(traces_file)
    seed_python = producer_python(args.producer_venv)
    print(f"== throughput: {run_dir}\n{size / MB:.1f} MB, {traces} traces, best of {args.repeat}")
    print(
        "ours = `evalpush push` to `evalpush local-platform` (own process, SQLite --db); "
        "seed = read_traces + trace_to_sample + ONE httpx post of the whole body to a discard "
        "endpoint in the bench process (the local platform refuses bodies over 25 MiB); "
        "floor = orjson loads+dumps per line. One round runs each once, in turn, so a swing in "
        "the machine's speed hits all three alike; wall and CPU are each the best of the "
        "rounds, with every round's range beside them.\n"
    )

    trace_ids = trace_ids_of(traces_file)
    ours: list[PushRun] = []
    seed: list[Measure] = []
    floor: list[Measure] = []
    with discard_endpoint() as url:
        for i in range(args.repeat):
            ours.append(push_once(run_dir, traces, hook_dir, trace_ids if i == 0 else None))
            seed.append(measure([str(seed_python), "-c", SEED_PUSH, str(run_dir), url], hook_dir))
            floor.append(measure([sys.executable, "-c", FLOOR, str(traces_file)], hook_dir))

    mine = [r.measure for r in ours]
    table({"ours": mine, "seed": seed, "floor": floor}, size, traces)
    our_run = min(ours, key=lambda r: r.measure.wall_seconds)
    phases = json.loads(min(seed, key=lambda m: m.wall_seconds).stderr.strip().splitlines()[-1])
    if phases["samples"] != traces:
        raise SystemExit(f"the seed converted {phases['samples']} of {traces} traces")
    print()
    print(
        f"ours: platform verified (1 COMPLETED evaluation, {traces} samples, each once, ids = "
        f"the file's); {our_run.batches} sample requests; the platform process (not counted "
        f"above) used {our_run.platform_cpu:.2f} CPU s, peak RSS "
        f"{our_run.platform_peak / MIB:.0f} MiB, db {our_run.db_bytes / MB:.0f} MB"
    )
    print(
        f"seed phases (its best run): import {phases['import_seconds']:.2f} s, read_traces "
        f"{phases['read_seconds']:.2f} s, trace_to_sample {phases['convert_seconds']:.2f} s, "
        f"json encode + send {phases['send_seconds']:.2f} s "
        f"(one body of {phases['body_bytes'] / MB:.1f} MB, received whole by the discard "
        "endpoint)"
    )
    best = {
        name: min(m.wall_seconds for m in runs) for name, runs in (("ours", mine), ("seed", seed))
    }
    cpu = {
        name: min(m.cpu_seconds for m in runs) for name, runs in (("ours", mine), ("floor", floor))
    }
    by_round_wall = [s.wall_seconds / o.wall_seconds for s, o in zip(seed, mine, strict=True)]
    by_round_cpu = [o.cpu_seconds / f.cpu_seconds for o, f in zip(mine, floor, strict=True)]
    wall_ratio = best["seed"] / best["ours"]
    cpu_ratio = cpu["ours"] / cpu["floor"]
    print()
    print("against the targets (best vs best; in brackets, the range of the per-round ratios):")
    print(
        f"  wall: seed / ours = {wall_ratio:.1f}x [{spread(by_round_wall)}]; "
        f"target >= 10x: {verdict(wall_ratio >= 10)}"
    )
    print(
        f"  CPU per GB: ours {cpu['ours'] / (size / 1e9):.1f} s, floor "
        f"{cpu['floor'] / (size / 1e9):.1f} s: {cpu_ratio:.2f}x the floor's "
        f"[{spread(by_round_cpu)}]; target <= 3x: {verdict(cpu_ratio <= 3)}"
    )


def streaming(args: argparse.Namespace, hook_dir: Path) -> None:
    big_bytes = int(args.big_gib * GIB)
    free = shutil.disk_usage(args.cache.parent if not args.cache.exists() else args.cache).free
    need = 3 * big_bytes  # the run, the platform's db (about the same), headroom
    if free < need:
        raise SystemExit(
            f"streaming: {free / GIB:.1f} GiB free under {args.cache}, need ~{need / GIB:.1f} GiB"
        )
    print(
        f"\n== streaming memory: `evalpush push`, peak RSS of the push process "
        f"({free / GIB:.0f} GiB free on disk)"
    )
    rows = {}
    for label, size_bytes in (("10 MiB", 10 * MIB), (f"{args.big_gib:g} GiB", big_bytes)):
        started = time.perf_counter()
        run_dir = generate(args.cache / "push", size_bytes, reuse=True)
        made = time.perf_counter() - started
        traces_file = run_dir / "traces.jsonl"
        size = traces_file.stat().st_size
        traces = count_lines(traces_file)
        run = push_once(run_dir, traces, hook_dir, None)
        rows[label] = (run, size, traces, made)
    print(
        f"{'run':<8}{'MB':>8}{'traces':>9}{'wall s':>8}{'MB/s':>7}{'CPU s':>7}{'CPU s/GB':>10}"
        f"{'batches':>9}{'peak RSS MiB':>14}{'platform db MB':>16}"
    )
    for label, (run, size, traces, _) in rows.items():
        m = run.measure
        print(
            f"{label:<8}{size / MB:>8.1f}{traces:>9}{m.wall_seconds:>8.2f}"
            f"{size / MB / m.wall_seconds:>7.1f}{m.cpu_seconds:>7.2f}"
            f"{m.cpu_seconds / (size / 1e9):>10.1f}{run.batches:>9}"
            f"{m.peak_rss_bytes / MIB:>14.1f}{run.db_bytes / MB:>16.0f}"
        )
    small, big = (rows[label][0].measure.peak_rss_bytes for label in rows)
    big_label = list(rows)[1]
    print("each verified on the platform: 1 COMPLETED evaluation, every trace once")
    # The steady state, apart from start-up (a fixed cost that is a sixth of a 72 MB push's CPU):
    # the same floor as the throughput table, on the big file.
    big_run, big_size = rows[big_label][0], rows[big_label][1]
    big_file = generate(args.cache / "push", big_bytes, reuse=True) / "traces.jsonl"
    floor_cpu = measure([sys.executable, "-c", FLOOR, str(big_file)], hook_dir).cpu_seconds
    print(
        f"CPU per GB on {big_label} (start-up a rounding error there): ours "
        f"{big_run.measure.cpu_seconds / (big_size / 1e9):.1f} s, floor "
        f"{floor_cpu / (big_size / 1e9):.1f} s: {big_run.measure.cpu_seconds / floor_cpu:.2f}x"
    )
    print(f"peak on {big_label}: {big / MIB:.1f} MiB; target < 150 MiB: {verdict(big < 150 * MIB)}")
    print(
        f"{big_label} vs 10 MiB peak: {big / small:.3f}x; target within 1.2x: "
        f"{verdict(big <= 1.2 * small)}"
    )


def checkout(rev: str, into: Path) -> str:
    """`daemon/` as committed at `rev`, extracted under `into`; its path, for PYTHONPATH."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", rev], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout.strip()
    archive = subprocess.Popen(
        ["git", "archive", commit, "daemon"], cwd=REPO, stdout=subprocess.PIPE
    )
    subprocess.run(["tar", "-x", "-C", str(into)], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise SystemExit(f"git archive {commit} failed")
    print(f"evalpush as committed at {commit} ({rev})")
    return str(into / "daemon")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=72.0, help="throughput run, MB (>= 70)")
    parser.add_argument("--big-gib", type=float, default=1.0, help="streaming run, GiB")
    parser.add_argument("--skip-big", action="store_true", help="skip the streaming measurement")
    parser.add_argument("--repeat", type=int, default=3, help="throughput runs per path (best)")
    parser.add_argument("--cache", type=Path, default=BENCH / ".cache")
    parser.add_argument("--producer-venv", type=Path, default=REPO / ".venv-producer")
    parser.add_argument("--at", metavar="REV", help="run the daemon as committed at REV")
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)

    with tempfile.TemporaryDirectory(prefix="bench-hook-") as hook_dir:
        (Path(hook_dir) / "sitecustomize.py").write_text(PEAK_HOOK)
        if args.at:
            SOURCE["PYTHONPATH"] = checkout(args.at, Path(hook_dir))
        compile_daemon(Path(SOURCE.get("PYTHONPATH", REPO / "daemon")))
        throughput(args, Path(hook_dir))
        if not args.skip_big:
            streaming(args, Path(hook_dir))


if __name__ == "__main__":
    main()
