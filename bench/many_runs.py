"""Many small runs: `evalpush push` of N one-trace runs to the local platform (target: 10,000
one-trace runs pushed at 150 runs per second or more).

The runs (UUID leaves, `push = false`, one environment, one small trace each) are written once
into bench/.cache/many/<N>/. Each repeat pushes them all with one `evalpush push ROOT` and a
fresh state dir, against `evalpush local-platform` started as its own process with a `--db` in
a temp dir (bench/push.py's `Platform`, a fresh one per repeat), and checks that the platform
then holds N COMPLETED evaluations with one sample each. Prints wall s, runs/s, CPU s and peak
RSS (bench/convert.py's `measure`), best of --repeat; per run, the requests the platform
counted by kind, the push's ledger write transactions and syncs of its write-ahead log (counted
by a `sitecustomize` hook in the child), how often its threads blocked or were preempted
(context switches), and the local platform's CPU apart. Per run this is what the per-run costs
of the exactly-once protocol add up to.

`--pin` runs the local platform on the last CPU and the push on the others, as if the platform
were a machine of its own (as the real one is): on a 2-core box, each gets one core, so the rate
is the push's own rather than what two processes sharing two cores can do together.

    python bench/many_runs.py [--runs 1000] [--repeat 3] [--at REV] [--pin]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import push  # noqa: E402 - the sibling bench module: one platform runner and one measure
from convert import PEAK_HOOK, Measure, measure  # noqa: E402

LEDGER_HOOK = """
import atexit, os, sqlite3
import evalpush.ledger as _ledger

_counts = {"writes": 0, "syncs": 0, "statements": 0}
_close = _ledger.Ledger.close
_connect = sqlite3.connect


def _traced(*args, **kwargs):  # every SQL statement the process runs, BEGIN and COMMIT too
    connection = _connect(*args, **kwargs)
    connection.set_trace_callback(_statement)
    return connection


def _statement(_sql):
    _counts["statements"] += 1


sqlite3.connect = _traced


def _closing(self):
    _counts["writes"] += self.writes  # the ledger counts its write transactions and syncs
    _counts["syncs"] += self.syncs
    _close(self)


_ledger.Ledger.close = _closing


def _report(path=os.environ.get("BENCH_MANY_RUNS_LEDGER_FILE")):
    with open(path, "a") as out:  # one line a process
        out.write(f"{_counts['writes']} {_counts['syncs']} {_counts['statements']}\\n")


if os.environ.get("BENCH_MANY_RUNS_LEDGER_FILE"):
    atexit.register(_report)
"""
"""Counts the push's ledger write transactions, syncs of its log and SQL statements (the
ledger's round trips: each is a call into SQLite; written at exit)."""

ENVIRONMENT = "bench-many-runs"
TARGET_RATE = 150  # runs/s
NAMESPACE = uuid.UUID("6d2a4c1e-8b3f-4e5a-9c7d-1f0e2b3a4c5d")


def trace_line(n: int) -> bytes:
    trace = {
        "id": f"many-{n}",
        "task": {"idx": 0, "prompt": "2+2?", "answer": "4"},
        "nodes": [
            {"message": {"role": "user", "content": "2+2?"}},
            {"parent": 0, "message": {"role": "assistant", "content": "4"}, "sampled": True},
        ],
        "rewards": {"correct": 1.0},
        "is_completed": True,
    }
    return json.dumps(trace).encode() + b"\n"


def the_runs(count: int, cache: Path) -> Path:
    """`count` one-trace runs under cache/many/<count>/ (written once, then reused)."""
    root = cache / "many" / str(count)
    done = root / ".complete"
    if done.exists():
        return root
    config = (
        f'model = "org/model"\nnum_rollouts = 1\npush = false\n[taskset]\nid = "{ENVIRONMENT}"\n'
    )
    for n in range(count):
        run = root / "env--model--harness" / str(uuid.uuid5(NAMESPACE, str(n)))
        run.mkdir(parents=True, exist_ok=True)
        (run / "config.toml").write_text(config)
        (run / "traces.jsonl").write_bytes(trace_line(n))
    done.write_text("")
    return root


def check(platform: push.Platform, count: int) -> None:
    evaluations = platform.get("/_control/summary")["evaluations"].values()
    wrong = [e for e in evaluations if e["status"] != "COMPLETED" or e["sample_count"] != 1]
    if len(evaluations) != count or wrong:
        raise SystemExit(f"{len(evaluations)} evaluations for {count} runs, {len(wrong)} wrong")


@dataclass
class ManyRuns:
    measure: Measure
    platform_cpu: float
    requests: dict[str, int]
    writes: int
    syncs: int  # of the ledger's write-ahead log
    statements: int  # SQL statements run on the ledger, BEGIN and COMMIT included


def push_all(root: Path, count: int, hook_dir: Path, *, pin: bool = False) -> ManyRuns:
    cpus = sorted(os.sched_getaffinity(0))
    if pin and len(cpus) < 2:
        raise SystemExit("--pin needs at least 2 CPUs")
    ours = ["taskset", "-c", ",".join(map(str, cpus[:-1]))] if pin else []
    with tempfile.TemporaryDirectory(prefix="bench-many-", dir=push.BENCH / ".cache") as tmp:
        work = Path(tmp)
        platform = push.Platform(work, cpus={cpus[-1]} if pin else None)
        try:
            env = {
                "PRIME_API_KEY": push.PLATFORM_KEY,
                "PRIME_API_BASE_URL": platform.base,
                "EVALPUSH_STATE_DIR": str(work / "state"),
                "EVALPUSH_LOG__LEVEL": "warning",
                "BENCH_MANY_RUNS_LEDGER_FILE": str(work / "ledger-counts"),
                # The upload settings given to this bench (`child_environ` drops the others).
                **{k: v for k, v in os.environ.items() if k.startswith("EVALPUSH_UPLOAD__")},
            }
            with push.child_environ(env):
                m = measure([*ours, sys.executable, "-m", "evalpush", "push", str(root)], hook_dir)
            check(platform, count)
            requests = platform.get("/_control/summary")["requests"]
            platform_cpu = platform.cpu_seconds()
            counts = [map(int, line.split()) for line in (work / "ledger-counts").open()]
            writes, syncs, statements = (sum(column) for column in zip(*counts, strict=True))
        finally:
            platform.stop()
    return ManyRuns(m, platform_cpu, requests, writes, syncs, statements)


def requests_only(count: int, workers: int, *, pin: bool = False) -> str:
    """A run's 4 requests (create, the read that confirms it, samples, finalize) and nothing
    else, through evalpush's platform client from `workers` threads in this process, against a
    fresh local platform: what the push's per-run bookkeeping (claim, ledger, syncs, run
    loading, scan, conversion) comes on top of."""
    from evalpush.client import PlatformClient
    from evalpush.config import PlatformConfig

    cpus = sorted(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory(prefix="bench-many-", dir=push.BENCH / ".cache") as tmp:
        platform = push.Platform(Path(tmp), cpus={cpus[-1]} if pin else None)
        environ = {"PRIME_API_KEY": push.PLATFORM_KEY, "PRIME_API_BASE_URL": platform.base}
        client = PlatformClient(PlatformConfig(), environ=environ, home=Path(tmp))
        try:
            env_id = client.resolve_environment(ENVIRONMENT)

            def upload(runs: range) -> None:
                for n in runs:
                    run_id = str(uuid.uuid5(NAMESPACE, f"requests-only-{n}"))
                    evaluation, _ = client.create_evaluation(
                        {
                            "name": f"{ENVIRONMENT}--{run_id[:8]}",
                            "environments": [{"id": env_id}],
                            "model_name": "org/model",
                            "dataset": ENVIRONMENT,
                            "framework": "verifiers",
                            "metadata": {"run_id": run_id, "framework": "verifiers"},
                            "metrics": {"avg_reward": 1.0},
                            "tags": [],
                        }
                    )
                    client.get_evaluation(evaluation)
                    sample = {"sample_id": f"many-{n}", "example_id": 0, "rollout_number": 1}
                    client.push_samples(evaluation, json.dumps({"samples": [sample]}).encode())
                    client.finalize(evaluation, {"avg_reward": 1.0})

            threads = [
                threading.Thread(target=upload, args=(range(w, count, workers),))
                for w in range(workers)
            ]
            if pin:
                os.sched_setaffinity(0, cpus[:-1])  # this thread's, and the threads it starts
            platform_before = platform.cpu_seconds()
            ours_before = resource.getrusage(resource.RUSAGE_SELF)
            started = time.perf_counter()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            wall = time.perf_counter() - started
            ours = resource.getrusage(resource.RUSAGE_SELF)
            platform_cpu = platform.cpu_seconds() - platform_before
            check(platform, count)  # a thread that failed would have left runs undone
        finally:
            if pin:
                os.sched_setaffinity(0, cpus)
            client.close()
            platform.stop()
    cpu = ours.ru_utime - ours_before.ru_utime + ours.ru_stime - ours_before.ru_stime
    return (
        f"the requests alone (evalpush's platform client, {workers} threads, no ledger): "
        f"{count / wall:.0f} runs/s, client {cpu / count * 1000:.2f} ms/run, "
        f"platform {platform_cpu / count * 1000:.2f} ms/run"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cache", type=Path, default=push.BENCH / ".cache")
    parser.add_argument("--at", default=None, help="run the daemon as committed at REV")
    parser.add_argument(
        "--pin", action="store_true", help="the platform on the last CPU, the push on the others"
    )
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    root = the_runs(args.runs, args.cache)
    with tempfile.TemporaryDirectory(prefix="bench-hook-") as hook:
        (Path(hook) / "sitecustomize.py").write_text(PEAK_HOOK + LEDGER_HOOK)
        if args.at:
            push.SOURCE["PYTHONPATH"] = push.checkout(args.at, Path(hook))
        runs = [push_all(root, args.runs, Path(hook), pin=args.pin) for _ in range(args.repeat)]
    best = min(runs, key=lambda r: r.measure.wall_seconds)
    m, n = best.measure, args.runs
    if args.pin:
        cpus = sorted(os.sched_getaffinity(0))
        print(f"pinned: the platform on CPU {cpus[-1]}, the push on CPUs {cpus[:-1]}")
    print(
        f"{n} one-trace runs, best of {args.repeat} (walls: "
        + ", ".join(f"{r.measure.wall_seconds:.2f}" for r in runs)
        + f"; CPU: {', '.join(f'{r.measure.cpu_seconds:.2f}' for r in runs)})"
    )
    print(
        f"wall {m.wall_seconds:.2f} s, {n / m.wall_seconds:.0f} runs/s (target >= {TARGET_RATE}), "
        f"CPU {m.cpu_seconds:.2f} s ({m.cpu_seconds / n * 1000:.2f} ms/run), "
        f"peak RSS {m.peak_rss_bytes / push.MIB:.1f} MiB"
    )
    kinds = ", ".join(f"{k} {v / n:.2f}" for k, v in sorted(best.requests.items()) if v)
    print(
        f"per run: {sum(best.requests.values()) / n:.2f} requests ({kinds}), "
        f"{best.writes / n:.2f} ledger write transactions, {best.syncs / n:.2f} syncs of its log, "
        f"{best.statements / n:.1f} SQL statements"
        f"; {m.waits / n:.1f} times one of its threads blocked (a socket, the disk, a lock, "
        f"Python's lock), {m.preempted / n:.1f} preempted"
    )
    print(
        f"the local platform (apart, not ours): CPU {best.platform_cpu:.2f} s "
        f"({best.platform_cpu / n * 1000:.2f} ms/run)"
    )
    print(ceiling(m.cpu_seconds / n, best.platform_cpu / n, len(os.sched_getaffinity(0)), args.pin))
    if not args.at:
        print(requests_only(n, push_workers(), pin=args.pin))


def push_workers() -> int:
    """How many runs the push uploads at once (its default, or the variable's)."""
    from evalpush.config import UploadConfig

    given = os.environ.get("EVALPUSH_UPLOAD__MAX_CONCURRENT_RUNS")
    return int(given) if given else UploadConfig().max_concurrent_runs


def ceiling(push_cpu: float, platform_cpu: float, cpus: int, pin: bool) -> str:
    """The most runs a second this box could do if its CPUs were never idle: what the CPU a run
    costs allows, whatever the push does with its waits."""
    ms = 1000 / TARGET_RATE
    if pin:
        rate = min((cpus - 1) / push_cpu, 1 / platform_cpu)
        how = f"push on {cpus - 1} CPU(s), platform on 1"
        need = f"the push under {(cpus - 1) * ms:.2f} ms and the platform under {ms:.2f} ms"
    else:
        rate = cpus / (push_cpu + platform_cpu)
        how = f"{cpus} CPUs shared by push and platform"
        need = f"push + platform under {cpus * ms:.2f} ms"
    return (
        f"CPU ceiling ({how}): {rate:.0f} runs/s with no CPU ever idle; "
        f"{TARGET_RATE} runs/s needs {need} of CPU a run"
    )


if __name__ == "__main__":
    main()
