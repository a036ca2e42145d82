"""Convert throughput, side by side: evalpush vs the seed's path vs a bare orjson floor.

On one generated run (at least 70 MB, cached under bench/.cache/), each contender runs as its own
child process; CPU seconds are that child's own (`os.wait4`), and so is peak RSS:

1. ours:  `python -m evalpush convert DIR > /dev/null`
2. seed:  in the producer venv (verifiers 0.1.15.dev437): `read_traces` + `trace_to_sample` with
          rollout numbers + encoding the samples as one JSON body with stdlib `json.dumps`, exactly
          as its `push_traces` hands them to httpx (which encodes with `json.dumps`); no network
3. floor: orjson parse + re-serialize of every line, nothing else

Wall time includes interpreter start and imports (what a user waits for); for the seed, the
import of verifiers alone is also reported, from inside the child. Best of --repeat runs.

Peak RSS is the child's VmHWM, which a `sitecustomize` put on the child's PYTHONPATH reads from
/proc/self/status at exit. Not wait4's ru_maxrss: Linux folds the parent's high-water RSS into a
(v)forked child's ru_maxrss at exec, so it would show this script's size, not the child's.

    python bench/convert.py [--mb 72] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
MB = 10**6
MIB = 2**20

SEED_PATH = """
import json, sys, time
started = time.perf_counter()
from pathlib import Path
from verifiers.v1.cli.output import read_traces
from verifiers.v1.push import trace_to_sample
from verifiers.v1.trace import WireTrace
imported = time.perf_counter()
traces = read_traces(Path(sys.argv[1]), WireTrace)
seen = {}
samples = []
for trace in traces:
    seen[trace.task.idx] = seen.get(trace.task.idx, 0) + 1
    samples.append(trace_to_sample(trace, seen[trace.task.idx]))
body = json.dumps({"samples": samples}, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
sys.stdout.buffer.write(body.encode())
print(json.dumps({"import_seconds": imported - started, "samples": len(samples)}), file=sys.stderr)
"""

FLOOR = """
import sys, orjson
out = sys.stdout.buffer
with open(sys.argv[1], "rb") as lines:
    for line in lines:
        out.write(orjson.dumps(orjson.loads(line)) + b"\\n")
"""


PEAK_HOOK = """
import atexit, os

def _report_peak(path=os.environ.get("EVALPUSH_BENCH_PEAK_FILE")):
    with open("/proc/self/status") as status:
        peak_kib = next(line.split()[1] for line in status if line.startswith("VmHWM:"))
    with open(path, "w") as out:
        out.write(peak_kib)

if os.environ.get("EVALPUSH_BENCH_PEAK_FILE"):
    atexit.register(_report_peak)
"""


@dataclass
class Measure:
    wall_seconds: float
    cpu_seconds: float
    peak_rss_bytes: int
    stderr: str


def measure(argv: list[str], hook_dir: Path) -> Measure:
    """Run one child with stdout to /dev/null: its wall time, CPU time and peak RSS."""
    peak_file = hook_dir / "peak_kib"
    env = dict(os.environ, EVALPUSH_BENCH_PEAK_FILE=str(peak_file))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(hook_dir), env.get("PYTHONPATH")]))
    with open(os.devnull, "wb") as devnull, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        child = subprocess.Popen(argv, stdout=devnull, stderr=err, cwd=REPO, env=env)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - started
        child.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        stderr = err.read().decode(errors="replace")
    if child.returncode != 0:
        raise SystemExit(f"{argv[:4]} exited {child.returncode}:\n{stderr[-3000:]}")
    peak_bytes = int(peak_file.read_text()) * 1024
    peak_file.unlink()
    return Measure(wall, usage.ru_utime + usage.ru_stime, peak_bytes, stderr)


def best_of(argv: list[str], repeat: int, hook_dir: Path) -> tuple[Measure, list[float]]:
    runs = [measure(argv, hook_dir) for _ in range(repeat)]
    return min(runs, key=lambda m: m.wall_seconds), [m.wall_seconds for m in runs]


def producer_python(venv: Path) -> Path:
    sys.path.insert(0, str(REPO / "tools"))
    from make_fixtures import producer_python as ensure

    return ensure(venv)


def the_run(mb: float, cache: Path) -> Path:
    sys.path.insert(0, str(BENCH))
    from gen_traces import generate

    return generate(cache / "convert", int(mb * MB), reuse=True)


def report(rows: dict[str, Measure], walls: dict[str, list[float]], size: int, traces: int) -> None:
    print(
        f"{'path':<7}{'wall s':>9}{'MB/s':>9}{'traces/s':>11}{'CPU s':>8}{'peak RSS MiB':>14}"
        f"{'  all walls':<12}"
    )
    for name, m in rows.items():
        print(
            f"{name:<7}{m.wall_seconds:>9.2f}{size / MB / m.wall_seconds:>9.1f}"
            f"{traces / m.wall_seconds:>11.0f}{m.cpu_seconds:>8.2f}"
            f"{m.peak_rss_bytes / MIB:>14.1f}  {', '.join(f'{w:.2f}' for w in walls[name])}"
        )
    ours, seed, floor = rows["ours"], rows["seed"], rows["floor"]
    seed_report = json.loads(seed.stderr.strip().splitlines()[-1])
    seed_import = seed_report["import_seconds"]
    assert seed_report["samples"] == traces, f"the seed read {seed_report['samples']} of {traces}"
    print()
    print(
        f"ours vs seed throughput: {seed.wall_seconds / ours.wall_seconds:.1f}x "
        f"(seed without its {seed_import:.1f} s import: "
        f"{(seed.wall_seconds - seed_import) / ours.wall_seconds:.1f}x)"
    )
    print(f"ours vs floor: {ours.wall_seconds / floor.wall_seconds:.2f}x the floor's wall time")
    print(f"ours CPU seconds per GB: {ours.cpu_seconds / (size / 1e9):.1f}")
    print(f"ours peak RSS vs seed: {seed.peak_rss_bytes / ours.peak_rss_bytes:.0f}x smaller")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=72.0, help="run size, 10**6 bytes (>= 70)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per path; the best is shown")
    parser.add_argument("--cache", type=Path, default=BENCH / ".cache")
    parser.add_argument("--producer-venv", type=Path, default=REPO / ".venv-producer")
    args = parser.parse_args()

    run_dir = the_run(args.mb, args.cache)
    traces_file = run_dir / "traces.jsonl"
    size = traces_file.stat().st_size
    with open(traces_file, "rb") as f:  # also warms the page cache for every contender
        traces = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(MIB), b""))
    seed_python = producer_python(args.producer_venv)
    print(f"run: {run_dir}\n{size / MB:.1f} MB, {traces} traces, best of {args.repeat}\n")

    contenders = {
        "ours": [sys.executable, "-m", "evalpush", "convert", str(run_dir)],
        "seed": [str(seed_python), "-c", SEED_PATH, str(run_dir)],
        "floor": [sys.executable, "-c", FLOOR, str(traces_file)],
    }
    rows, walls = {}, {}
    with tempfile.TemporaryDirectory(prefix="bench-hook-") as hook_dir:
        (Path(hook_dir) / "sitecustomize.py").write_text(PEAK_HOOK)
        for name, argv in contenders.items():
            rows[name], walls[name] = best_of(argv, args.repeat, Path(hook_dir))
    report(rows, walls, size, traces)
    summary = json.loads(rows["ours"].stderr.strip().splitlines()[-1])
    print(f"\nours: {summary['name']}, set aside: {summary['set_aside']}")


if __name__ == "__main__":
    main()
