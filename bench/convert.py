"""Convert throughput, side by side: evalpush vs the seed's path vs a bare orjson floor.

On one generated run (at least 70 MB, cached under bench/.cache/), each contender runs as its own
child process; CPU seconds are that child's own (`os.wait4`), and so is peak RSS:

1. ours:  `python -m evalpush convert DIR > /dev/null`
2. seed:  in the producer venv (verifiers 0.1.15.dev437): `read_traces` + `trace_to_sample` with
          rollout numbers + encoding the samples as one JSON body with stdlib `json.dumps`, exactly
          as its `push_traces` hands them to httpx (which encodes with `json.dumps`); no network
3. floor: orjson parse + re-serialize of every line, nothing else

and the same rollouts written as verifiers 0.4 episodes (`gen_traces.rewrite_as`: one agent's
trace an episode, usage in `calls`, rewards as `{score, weight}`), converted by ours
(`ours-0.4`) and by the floor (`floor-0.4`).

Wall time includes interpreter start and imports (what a user waits for); for the seed, the
import of verifiers alone is also reported, from inside the child. --repeat rounds, each running
every path once in turn; wall and CPU are each the best over the rounds, with their ranges.

Peak RSS is the child's VmHWM, which a `sitecustomize` put on the child's PYTHONPATH reads from
/proc/self/status at exit. Not wait4's ru_maxrss: Linux folds the parent's high-water RSS into a
(v)forked child's ru_maxrss at exec, so it would show this script's size, not the child's.

    python bench/convert.py [--mb 72] [--repeat 3]
"""

from __future__ import annotations

import argparse
import compileall
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
    with open(path, "a") as out:  # one line a process
        out.write(peak_kib + "\\n")

if os.environ.get("EVALPUSH_BENCH_PEAK_FILE"):
    atexit.register(_report_peak)
"""


@dataclass
class Measure:
    wall_seconds: float
    cpu_seconds: float
    peak_rss_bytes: int
    stderr: str
    waits: int = 0  # voluntary context switches: the child's threads blocking (I/O, a lock)
    preempted: int = 0  # involuntary ones: a thread's time slice taken for another


def measure(argv: list[str], hook_dir: Path) -> Measure:
    """Run one child with stdout to /dev/null: its wall time, CPU time, peak RSS and context
    switches."""
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
    # The peaks the processes wrote, added (one: the push's).
    peak_bytes = sum(map(int, peak_file.read_text().split())) * 1024
    peak_file.unlink()
    cpu = usage.ru_utime + usage.ru_stime
    return Measure(wall, cpu, peak_bytes, stderr, usage.ru_nvcsw, usage.ru_nivcsw)


def compile_daemon(daemon_dir: Path) -> None:
    """Byte-compile the daemon's modules, as an install does. This machine sets
    PYTHONDONTWRITEBYTECODE, so an editable checkout would otherwise compile every module from
    source at every start (the seed's and the floor's packages were compiled by pip)."""
    compileall.compile_dir(daemon_dir, quiet=1)


def producer_python(venv: Path) -> Path:
    sys.path.insert(0, str(REPO / "tools"))
    from make_fixtures import producer_python as ensure

    return ensure(venv)


def the_run(mb: float, cache: Path) -> Path:
    sys.path.insert(0, str(BENCH))
    from gen_traces import generate

    return generate(cache / "convert", int(mb * MB), reuse=True)


def episode_run(seed_run: Path, cache: Path) -> Path:
    """The seed run's rollouts as a verifiers 0.4 run directory (made once, cached)."""
    sys.path.insert(0, str(BENCH))
    from gen_traces import rewrite_as

    return rewrite_as(seed_run, cache / "convert-episodes", "0.4")


def report(rows: dict[str, list[Measure]], size: int, traces: int, episode_bytes: int = 0) -> None:
    """Best wall and best CPU per path (each over the rounds), with every round's range (the
    0.4 rows are over the episode file, `episode_bytes`: their MB/s and CPU s/GB are of it)."""
    print(
        f"{'path':<7}{'wall s':>9}{'MB/s':>9}{'traces/s':>11}{'CPU s':>8}{'CPU s/GB':>10}"
        f"{'peak RSS MiB':>14}  {'walls':>11}  {'CPU s':>11}"
    )
    wall = {name: min(m.wall_seconds for m in runs) for name, runs in rows.items()}
    cpu = {name: min(m.cpu_seconds for m in runs) for name, runs in rows.items()}
    for name, runs in rows.items():
        walls, cpus = [m.wall_seconds for m in runs], [m.cpu_seconds for m in runs]
        mb = (episode_bytes if name.endswith("-0.4") else size) / MB
        print(
            f"{name:<9}{wall[name]:>7.2f}{mb / wall[name]:>9.1f}"
            f"{traces / wall[name]:>11.0f}{cpu[name]:>8.2f}{cpu[name] / (mb / 1e3):>10.1f}"
            f"{max(m.peak_rss_bytes for m in runs) / MIB:>14.1f}  "
            f"{f'{min(walls):.2f}-{max(walls):.2f}':>11}  {f'{min(cpus):.2f}-{max(cpus):.2f}':>11}"
        )
    seed = min(rows["seed"], key=lambda m: m.wall_seconds)
    seed_report = json.loads(seed.stderr.strip().splitlines()[-1])
    seed_import = seed_report["import_seconds"]
    assert seed_report["samples"] == traces, f"the seed read {seed_report['samples']} of {traces}"
    print()
    print(
        f"ours vs seed throughput: {wall['seed'] / wall['ours']:.1f}x "
        f"(seed without its {seed_import:.1f} s import: "
        f"{(wall['seed'] - seed_import) / wall['ours']:.1f}x)"
    )
    print(
        f"ours vs floor: {wall['ours'] / wall['floor']:.2f}x the floor's wall, "
        f"{cpu['ours'] / cpu['floor']:.2f}x its CPU"
    )
    print(f"ours CPU seconds per GB: {cpu['ours'] / (size / 1e9):.1f}")
    if "ours-0.4" in rows:
        print(
            f"ours CPU seconds per GB of the same rollouts as 0.4 episodes "
            f"({episode_bytes / MB:.1f} MB): {cpu['ours-0.4'] / (episode_bytes / 1e9):.1f} "
            f"(floor {cpu['floor-0.4'] / (episode_bytes / 1e9):.1f})"
        )
    peaks = {name: max(m.peak_rss_bytes for m in runs) for name, runs in rows.items()}
    print(f"ours peak RSS vs seed: {peaks['seed'] / peaks['ours']:.0f}x smaller")


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

    episodes = episode_run(run_dir, args.cache)
    episode_bytes = (episodes / "traces.jsonl").stat().st_size
    contenders = {
        "ours": [sys.executable, "-m", "evalpush", "convert", str(run_dir)],
        "seed": [str(seed_python), "-c", SEED_PATH, str(run_dir)],
        "floor": [sys.executable, "-c", FLOOR, str(traces_file)],
        "ours-0.4": [sys.executable, "-m", "evalpush", "convert", str(episodes)],
        "floor-0.4": [sys.executable, "-c", FLOOR, str(episodes / "traces.jsonl")],
    }
    rows: dict[str, list[Measure]] = {name: [] for name in contenders}
    compile_daemon(REPO / "daemon")
    with tempfile.TemporaryDirectory(prefix="bench-hook-") as hook_dir:
        (Path(hook_dir) / "sitecustomize.py").write_text(PEAK_HOOK)
        for _ in range(args.repeat):  # in turn, so a swing in speed hits every path alike
            for name, argv in contenders.items():
                rows[name].append(measure(argv, Path(hook_dir)))
    report(rows, size, traces, episode_bytes)
    summary = json.loads(rows["ours"][0].stderr.strip().splitlines()[-1])
    print(f"\nours: {summary['name']}, set aside: {summary['set_aside']}")


if __name__ == "__main__":
    main()
