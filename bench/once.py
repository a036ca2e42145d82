"""A run the daemon watches while it is written is decoded once: what `evalpush run`
spends, in CPU seconds and in bytes read, to upload a large run written line by line.

The run is bench/gen_traces.py's (72 MB, 20,000 traces by default; cached in bench/.cache/).
For each contender (the working tree, and with `--before REV` the daemon as committed at REV,
extracted by `git archive` as bench/push.py's `--at` does) and each of `--repeat` rounds: a
fresh `evalpush local-platform` and a fresh state dir; `evalpush run` watching an empty root
(`runs.settle_seconds` = 600, so the run is ready by its expected count alone); once it is
READY (sd_notify on this script's socket), the run's config.toml and an empty traces.jsonl,
then its lines appended `--lines-per-write` at a time, `--writes-per-second` writes a second
(the producer's pace, compressed). Measured from /proc/<pid>: the daemon's user+system CPU and
its `rchar` (bytes read by read/pread calls: the trace file, and a little of the ledger, the
sockets and lazily imported modules) from just before the first line (a) to the last line
written (b, watching) and to the platform holding the evaluation COMPLETED (c, the upload);
rchar / the file's size counts the passes over the file. The platform must then hold one
COMPLETED evaluation with every trace once, else the bench fails.

With `--instructions`, instead: valgrind's callgrind counts the instructions of the same work
done in one process, which a loaded 2-core machine does not blur: a `Tracker` on a fresh ledger
looks at the run after each write (as the daemon's loop does on each inotify hint), then, if the
run was queued at its scan step, the upload's scan step runs (`Steps.scan`); the push, the same
for both, is left out. Each contender is counted twice: the whole of it, and its imports alone
(subtracted).

    .venv/bin/python bench/once.py [--mb 72] [--repeat 2] [--before 85928fd]
        [--lines-per-write 20] [--writes-per-second 100] [--instructions]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import idle  # noqa: E402 - the sibling bench modules: the daemon runner, the platform
import push  # noqa: E402
from convert import compile_daemon  # noqa: E402
from gen_traces import generate  # noqa: E402

MB = 10**6
FINALIZE_TIMEOUT_SECONDS = 600.0


@dataclass
class Round:
    watching_cpu: float  # CPU seconds from the first line to the last
    upload_cpu: float  # from the last line to the evaluation COMPLETED
    watching_read: int  # bytes read (rchar) over the same spans
    upload_read: int
    ready_to_completed: float  # wall seconds from the last line to COMPLETED

    @property
    def cpu(self) -> float:
        return self.watching_cpu + self.upload_cpu

    @property
    def read(self) -> int:
        return self.watching_read + self.upload_read


def rchar(pid: int) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise SystemExit(f"no rchar in /proc/{pid}/io")


def completed(platform: push.Platform) -> bool:
    summary = platform.get("/_control/summary")
    return any(e["status"] == "COMPLETED" for e in summary["evaluations"].values())


def one_round(
    source: Path, work: Path, args: argparse.Namespace, trace_ids: list[str] | None
) -> Round:
    """Start a platform and the daemon, write the run line by line while it watches, measure."""
    root = work / "outputs"
    root.mkdir()
    platform = push.Platform(work)
    try:
        env = idle.environ(platform.base, work / "state", root, EVALPUSH_RUNS__SETTLE_SECONDS="600")
        daemon = idle.Daemon(env, work)
        try:
            run = root / "bench--model--harness" / source.name
            run.mkdir(parents=True)
            shutil.copy(source / "config.toml", run / "config.toml")
            (run / "traces.jsonl").write_bytes(b"")
            time.sleep(1.0)  # the run is found waiting before its first line, as a real one is
            lines = (source / "traces.jsonl").read_bytes().splitlines(keepends=True)
            cpu_a, read_a = daemon.cpu_seconds(), rchar(daemon.proc.pid)
            interval = 1.0 / args.writes_per_second
            with open(run / "traces.jsonl", "ab", buffering=0) as traces:
                start = time.monotonic()
                for n, at in enumerate(range(0, len(lines), args.lines_per_write)):
                    traces.write(b"".join(lines[at : at + args.lines_per_write]))
                    pause = start + (n + 1) * interval - time.monotonic()
                    if pause > 0:
                        time.sleep(pause)
            written = time.monotonic()
            cpu_b, read_b = daemon.cpu_seconds(), rchar(daemon.proc.pid)
            deadline = written + FINALIZE_TIMEOUT_SECONDS
            while not completed(platform):
                if time.monotonic() > deadline:
                    raise SystemExit(f"not finalized in time; the daemon's log: {work}")
                time.sleep(0.02)
            done = time.monotonic()
            cpu_c, read_c = daemon.cpu_seconds(), rchar(daemon.proc.pid)
        finally:
            daemon.stop()
        push.check_platform(platform, len(lines), trace_ids)
    finally:
        platform.stop()
    return Round(cpu_b - cpu_a, cpu_c - cpu_b, read_b - read_a, read_c - read_b, done - written)


def contender(
    label: str, daemon_dir: Path, source: Path, args: argparse.Namespace, trace_ids: list[str]
) -> list[Round]:
    compile_daemon(daemon_dir)
    push.SOURCE.clear()
    push.SOURCE["PYTHONPATH"] = str(daemon_dir)
    rounds = []
    for n in range(args.repeat):
        with tempfile.TemporaryDirectory(prefix="bench-once-", dir=args.cache) as tmp:
            # every stored sample id compared with the file's once (a long read of the platform)
            rounds.append(one_round(source, Path(tmp), args, trace_ids if n == 0 else None))
        last = rounds[-1]
        print(
            f"  {label} round {n + 1}: CPU {last.watching_cpu:.2f} s watching + "
            f"{last.upload_cpu:.2f} s uploading; read {last.watching_read / MB:.1f} MB + "
            f"{last.upload_read / MB:.1f} MB",
            flush=True,
        )
    return rounds


def report(rows: dict[str, list[Round]], size: int) -> None:
    print(f"\nthe run: {size / MB:.1f} MB; best round of each (least CPU in all)")
    header = (
        f"{'':<16} {'CPU watching':>13} {'CPU upload':>11} {'CPU in all':>11} "
        f"{'read watching':>14} {'read upload':>12} {'passes':>7} {'last line->done':>16}"
    )
    print(header)
    for label, rounds in rows.items():
        best = min(rounds, key=lambda r: r.cpu)
        print(
            f"{label:<16} {best.watching_cpu:>11.2f} s {best.upload_cpu:>9.2f} s "
            f"{best.cpu:>9.2f} s {best.watching_read / MB:>11.1f} MB "
            f"{best.upload_read / MB:>9.1f} MB {best.read / size:>7.2f} "
            f"{best.ready_to_completed:>14.2f} s"
        )
        spread = ", ".join(f"{r.cpu:.2f}" for r in rounds)
        print(f"{'':<16} (CPU in all, every round: {spread})")


CHILD = """
import sys, shutil, tempfile
from pathlib import Path
from evalpush.config import Config
from evalpush.discover import look_at
from evalpush.ledger import Ledger, default_path
from evalpush.runs import load_run
from evalpush.core.states import Step
from evalpush.service import Tracker
from evalpush.upload.context import Context
from evalpush.upload.reconcile import Reconciler
from evalpush.upload.steps import Steps
if sys.argv[1] == "work":
    source, per = Path(sys.argv[2]), int(sys.argv[3])
    lines = (source / "traces.jsonl").read_bytes().splitlines(keepends=True)
    work = Path(tempfile.mkdtemp())
    run_dir = work / "outputs" / source.name
    run_dir.mkdir(parents=True)
    shutil.copy(source / "config.toml", run_dir / "config.toml")
    (run_dir / "traces.jsonl").write_bytes(b"")
    config = Config.model_validate({"runs": {"settle_seconds": 600}})
    with Ledger(default_path(work / "state")) as ledger:
        submitted = []
        tracker = Tracker(ledger, config, submitted.append)
        tracker.load()
        tracker.look(str(run_dir), look_at(str(run_dir), ""))
        with open(run_dir / "traces.jsonl", "ab", buffering=0) as traces:
            for at in range(0, len(lines), per):
                traces.write(b"".join(lines[at : at + per]))
                tracker.look(str(run_dir), look_at(str(run_dir), ""))
        assert submitted == [str(run_dir)], "the run was not found ready"
        run = load_run(run_dir)
        record = ledger.get_run(run.run_id)
        scanned = record.step == Step.SCAN
        if scanned:  # the upload's first step, as the uploader takes it (no request is sent)
            context = Context(config, ledger, None, None)
            record = Steps(context, Reconciler(context)).scan(record, run)
        assert record.step == Step.RESOLVE and record.samples_seen == len(lines)
        print("scan step ran" if scanned else "scan step skipped", file=sys.stderr)
    shutil.rmtree(work)
"""


def instructions(daemon_dir: Path, source: Path, per: int, what: str) -> tuple[int, str]:
    """Instructions callgrind counts for CHILD doing `what` ("work", or "imports" alone)."""
    with tempfile.TemporaryDirectory(prefix="bench-once-cg-") as tmp:
        out = Path(tmp) / "callgrind.out"
        done = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={out}",
                sys.executable,
                "-c",
                CHILD,
                what,
                str(source),
                str(per),
            ],
            env={**os.environ, "PYTHONPATH": str(daemon_dir), "PYTHONHASHSEED": "0"},
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise SystemExit(f"callgrind run failed:\n{done.stderr[-3000:]}")
        collected = re.search(r"Collected : (\d+)", done.stderr)
        assert collected is not None, done.stderr[-2000:]
        note = next((line for line in done.stderr.splitlines() if "scan step" in line), "")
        return int(collected.group(1)), note


def count_instructions(rows: dict[str, Path], source: Path, per: int) -> None:
    print(f"instructions (callgrind), the run written in writes of {per} lines; imports removed")
    for label, daemon_dir in rows.items():
        compile_daemon(daemon_dir)
        work, note = instructions(daemon_dir, source, per, "work")
        imports, _ = instructions(daemon_dir, source, per, "imports")
        print(f"  {label:<16} {(work - imports) / 1e9:>7.3f} G instructions ({note})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=72.0)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--before", metavar="REV", help="also measure the daemon as at REV")
    parser.add_argument("--lines-per-write", type=int, default=20)
    parser.add_argument("--writes-per-second", type=float, default=100.0)
    parser.add_argument("--cache", type=Path, default=push.BENCH / ".cache")
    parser.add_argument("--instructions", action="store_true", help="count with callgrind")
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    source = generate(args.cache, int(args.mb * MB), reuse=True)
    size = (source / "traces.jsonl").stat().st_size
    trace_ids = push.trace_ids_of(source / "traces.jsonl")
    rows: dict[str, list[Round]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-once-src-", dir=args.cache) as tmp:
        if args.instructions:
            dirs = {"working tree": push.REPO / "daemon"}
            if args.before:
                dirs = {f"at {args.before}": Path(push.checkout(args.before, Path(tmp))), **dirs}
            count_instructions(dirs, source, args.lines_per_write)
            return
        if args.before:
            before = Path(push.checkout(args.before, Path(tmp)))
            rows[f"at {args.before}"] = contender(
                f"at {args.before}", before, source, args, trace_ids
            )
        rows["working tree"] = contender(
            "working tree", push.REPO / "daemon", source, args, trace_ids
        )
    report(rows, size)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
