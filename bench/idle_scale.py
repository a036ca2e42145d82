"""The daemon at rest on a very large tree of runs it has already uploaded (targets, on 100,000
finalized runs: idle CPU under 0.5% of a core at the default settings, the slow sweep's share
included; start-up to READY under 5 s; per-run memory small).

Setup, cached in bench/.cache/idle-scale/<N>/: N one-trace runs in the default layout
(`root/<taskset>--<model>--<harness>/<uuid>/`, 100 runs per parent, `config.toml`, a one-line
`traces.jsonl` and an `eval.log` in each), pushed once by `evalpush push` to `evalpush
local-platform` with a SQLite db, so the ledger holds N finalized runs. Past 100,000 runs only
the first 100 are pushed, and the other rows are copies of theirs with each run's own id, path,
file facts and evaluation id (a million pushes take hours; the daemon at rest reads no more). Each measurement copies
that state dir and db to a temp dir and starts `evalpush run` on the tree as its own process
(default settings but for the roots), with a datagram socket of this script as NOTIFY_SOCKET:

1. start-up to READY: from spawning `evalpush run` to READY=1 arriving;
2. settled: seconds until the first full walk is over (the daemon's CPU stops climbing:
   sampled every second until a 10 s window costs under 0.1 s);
3. idle CPU: the daemon's user+system CPU (/proc/<pid>/stat) over --idle-seconds after that, at
   the default `watch.rescan_seconds` (the sweep's share included), as % of one core;
4. its peak RSS (VmHWM), RSS at the end and inotify watches held; RSS per run: the RSS at the
   end less that of the same daemon on --baseline-runs runs (set up the same way), per run;
   then --latency-runs new one-trace runs written into the tree (`bench/idle.py`'s), each
   timed from its line written to its evaluation COMPLETED on the platform;
5. a late append to a finalized run on a polled root (no file event tells of it), the daemon
   started with `watch.sweep_seconds` = --sweep-seconds: seconds until the ledger records it
   uploaded again (not run with --skip-late).

`--at REV` measures the daemon as committed at REV as well (`git archive REV daemon`, run with
PYTHONPATH), side by side; its daemon has no `watch.sweep_seconds` (not set for it).

    .venv/bin/python bench/idle_scale.py [--runs 100000] [--idle-seconds 180] [--at main]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import idle  # noqa: E402 - the sibling bench modules: the daemon runner, the platform
import many_runs  # noqa: E402
import push  # noqa: E402

from evalpush.discover import inotify_watches_in_use  # noqa: E402

RUNS_PER_PARENT = 100
PUSHED_AT_MOST = 100_000
"""Larger trees get their ledger by `copied_rows`."""
BASELINE_IDLE_SECONDS = 20.0
NAMESPACE = uuid.UUID("0b7f6c1e-2a3d-4e5f-8a9b-0c1d2e3f4a5b")
CONFIG = 'model = "org/model"\nnum_rollouts = 1\npush = false\n[taskset]\nid = "{env}"\n'


def the_tree(count: int, home: Path) -> Path:
    """`count` finalized-to-be one-trace runs, 100 per parent, under home/tree (made once)."""
    root = home / "tree"
    done = root / ".complete"
    if done.exists():
        return root
    for n in range(count):
        parent = root / f"task{n // RUNS_PER_PARENT}--org--model--harness"
        run = parent / str(uuid.uuid5(NAMESPACE, str(n)))
        run.mkdir(parents=True, exist_ok=True)
        (run / "config.toml").write_text(CONFIG.format(env=many_runs.ENVIRONMENT))
        (run / "traces.jsonl").write_bytes(many_runs.trace_line(n))
        (run / "eval.log").write_text("done\n")
    done.write_text("")
    return root


def prepared(count: int, cache: Path) -> Path:
    """cache/idle-scale/<count>/ holding `tree/`, `state/` (a ledger with `count` finalized
    runs) and `platform.db`, made once by a real `evalpush push`; past PUSHED_AT_MOST runs, by
    a push of the first ones and their rows copied for the rest (`copied_rows`)."""
    home = cache / "idle-scale" / str(count)
    if (home / ".complete").exists():
        print(f"setup (cached): {(home / '.complete').read_text().strip()}")
        return home
    home.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    root = the_tree(count, home)
    made = time.perf_counter() - started
    shutil.rmtree(home / "state", ignore_errors=True)
    (home / "platform.db").unlink(missing_ok=True)
    if count <= PUSHED_AT_MOST:
        seconds = idle.pushed(home, root, count)
        note = f"tree made in {made:.0f} s; `evalpush push` of {count} runs in {seconds:.0f} s"
    else:
        first = root / "task0--org--model--harness"
        seconds = idle.pushed(home, root, RUNS_PER_PARENT, only=first)
        copied = copied_rows(home / "state" / "state.db", root, count)
        note = (
            f"tree made in {made:.0f} s; `evalpush push` of the first {RUNS_PER_PARENT} runs in "
            f"{seconds:.0f} s, the other {count - RUNS_PER_PARENT:,} rows copied from theirs "
            f"in {copied:.0f} s"
        )
    print(f"setup: {note}")
    (home / ".complete").write_text(note + "\n")
    return home


def copied_rows(ledger: Path, root: Path, count: int) -> float:
    """Every run of the tree in the ledger as finalized, as a push leaves one: the row of a run
    pushed for real, copied with each run's own id, path, file facts and evaluation id (a
    million pushes take hours; the daemon at rest reads only these columns). Seconds taken."""
    started = time.perf_counter()
    db = sqlite3.connect(ledger, isolation_level=None)
    db.row_factory = sqlite3.Row
    template = dict(db.execute("SELECT * FROM runs WHERE state = 'finalized' LIMIT 1").fetchone())
    known = {row[0] for row in db.execute("SELECT path_raw FROM runs")}
    columns = [c for c in template if c != "id"]
    insert = f"INSERT INTO runs ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"
    db.execute("BEGIN")
    batch = []
    for n in range(count):
        parent = root / f"task{n // RUNS_PER_PARENT}--org--model--harness"
        run_id = str(uuid.uuid5(NAMESPACE, str(n)))
        raw = os.fsencode(parent / run_id)
        if raw in known:
            continue
        st = os.lstat(parent / run_id / "traces.jsonl")
        row = dict(
            template,
            run_id=run_id,
            run_key=hashlib.sha256(run_id.encode()).digest(),
            path=os.fsdecode(raw),
            path_raw=raw,
            path_key=hashlib.sha256(raw).digest(),
            evaluation_id=str(uuid.uuid5(NAMESPACE, f"evaluation-{n}")),
            file_device=st.st_dev,
            file_inode=st.st_ino,
            file_size=st.st_size,
            file_mtime_ns=st.st_mtime_ns,
        )
        batch.append(tuple(row[c] for c in columns))
        if len(batch) == 50_000:
            db.executemany(insert, batch)
            batch.clear()
    db.executemany(insert, batch)
    db.execute("COMMIT")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    return time.perf_counter() - started


def settle(
    daemon: idle.Daemon, quiet_cpu: float = 0.1, window: int = 10, at_most: float = 600.0
) -> float | None:
    """Seconds from now until the daemon's CPU over the last `window` seconds is under
    `quiet_cpu`: its first full walk (and whatever start-up work follows READY) is over; None
    if it never is within `at_most` seconds (a daemon that is never at rest)."""
    started = time.perf_counter()
    samples = [daemon.cpu_seconds()]
    while time.perf_counter() - started < at_most:
        time.sleep(1.0)
        samples.append(daemon.cpu_seconds())
        if len(samples) > window and samples[-1] - samples[-1 - window] < quiet_cpu:
            return time.perf_counter() - started - window
    return None


def evaluation_of(state: Path, run_id: str) -> tuple[str, str] | None:
    """The run's evaluation in the ledger and its state (a run uploaded again gets a new one)."""
    with sqlite3.connect(f"file:{state / 'state.db'}?mode=ro", uri=True) as db:
        return db.execute(
            "SELECT evaluation_id, state FROM runs WHERE run_id = ?", (run_id,)
        ).fetchone()


def measure(
    label: str, home: Path, args: argparse.Namespace, daemon_src: str | None, idle_seconds: float
) -> dict[str, str]:
    root = home / "tree"
    with tempfile.TemporaryDirectory(prefix="bench-idle-scale-", dir=args.cache) as tmp:
        work = Path(tmp)
        shutil.copytree(home / "state", work / "state")
        shutil.copy(home / "platform.db", work / "platform.db")
        platform = push.Platform(work)
        extra = {"PYTHONPATH": daemon_src} if daemon_src else {}
        env = idle.environ(platform.base, work / "state", root, **extra)
        try:
            daemon = idle.Daemon(env, work)
            try:
                ready = daemon.ready_seconds
                walked = settle(daemon, at_most=args.settle_seconds)
                before = daemon.cpu_seconds()
                time.sleep(idle_seconds)
                used = daemon.cpu_seconds() - before
                peak = push.proc_status_bytes(daemon.proc.pid, "VmHWM")
                rss = daemon.rss_bytes()
                watches = inotify_watches_in_use(daemon.proc.pid)
                latencies: list[float] = []
                try:
                    for n in range(args.latency_runs):  # new runs, each ready once its line is
                        run_id, written = idle.latency_run(root, n)
                        latencies.append(idle.finalized_at(platform, run_id) - written)
                except TimeoutError:
                    latencies.append(float("inf"))  # not finalized within a minute
            finally:
                shutil.rmtree(root / "latency", ignore_errors=True)
                daemon.stop()
        finally:
            platform.stop()
    return {
        "daemon": label,
        "start-up to READY": f"{ready:.2f} s",
        "first walk over after READY": f"{walked:.0f} s" if walked is not None else "never at rest",
        "idle CPU": f"{100 * used / idle_seconds:.3f}% ({used:.2f} s / {idle_seconds:g} s)",
        "peak RSS": f"{peak / push.MIB:.0f} MiB",
        "RSS at the end": f"{rss / push.MIB:.0f} MiB",
        "inotify watches": f"{watches:,}",
        "new run: line to finalized": (
            f"median {statistics.median(latencies):.2f} s, worst {max(latencies):.2f} s"
            if latencies
            else "not measured"
        ),
        "rss": rss,  # type: ignore[dict-item]
    }


def late_append(home: Path, args: argparse.Namespace) -> str:
    """A line appended to a finalized run while the daemon idles: seconds until the ledger has
    its new evaluation (the run uploads again), with `watch.sweep_seconds` short."""
    root = home / "tree"
    with tempfile.TemporaryDirectory(prefix="bench-idle-scale-", dir=args.cache) as tmp:
        work = Path(tmp)
        shutil.copytree(home / "state", work / "state")
        shutil.copy(home / "platform.db", work / "platform.db")
        platform = push.Platform(work)
        env = idle.environ(
            platform.base,
            work / "state",
            root,
            EVALPUSH_WATCH__SWEEP_SECONDS=str(args.sweep_seconds),
            EVALPUSH_WATCH__OBSERVER="polling",  # no file event: the sweep is what finds it
            EVALPUSH_RUNS__SETTLE_SECONDS="0",
        )
        run = root / "task7--org--model--harness" / str(uuid.uuid5(NAMESPACE, "777"))
        traces = run / "traces.jsonl"
        original = traces.read_bytes()
        try:
            daemon = idle.Daemon(env, work)
            try:
                settle(daemon)
                before = evaluation_of(work / "state", run.name)
                with traces.open("ab") as f:
                    f.write(many_runs.trace_line(10_000_000))
                appended = time.perf_counter()
                while (now := evaluation_of(work / "state", run.name)) == before or (
                    now is None or now[1] != "finalized"
                ):
                    if time.perf_counter() - appended > 3 * args.sweep_seconds + 60:
                        return "not uploaded again in time"
                    time.sleep(0.5)
                return f"{time.perf_counter() - appended:.1f} s (sweep_seconds = {args.sweep_seconds:g})"
            finally:
                daemon.stop()
        finally:
            traces.write_bytes(original)
            platform.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--idle-seconds", type=float, default=180.0)
    parser.add_argument("--baseline-runs", type=int, default=1000, help="for RSS per run")
    parser.add_argument("--sweep-seconds", type=float, default=120.0)
    parser.add_argument(
        "--settle-seconds", type=float, default=600.0, help="give up waiting for rest after"
    )
    parser.add_argument("--latency-runs", type=int, default=5, help="new runs timed to finalized")
    parser.add_argument("--skip-late", action="store_true", help="no late-append measurement")
    parser.add_argument("--setup-only", action="store_true")
    parser.add_argument("--at", metavar="REV", help="also measure the daemon as committed at REV")
    parser.add_argument("--only-at", action="store_true", help="measure only the one at --at")
    parser.add_argument("--cache", type=Path, default=push.BENCH / ".cache")
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    home = prepared(args.runs, args.cache)
    small = prepared(args.baseline_runs, args.cache)
    if args.setup_only:
        return
    with tempfile.TemporaryDirectory(prefix="bench-idle-scale-src-") as src:
        daemons: dict[str, str | None] = {} if args.only_at else {"this tree": None}
        if args.at:
            daemons[f"at {args.at}"] = push.checkout(args.at, Path(src))
        rows = []
        for label, daemon_src in daemons.items():
            row = measure(label, home, args, daemon_src, args.idle_seconds)
            baseline = measure(label, small, args, daemon_src, BASELINE_IDLE_SECONDS)
            per_run = (row["rss"] - baseline["rss"]) / (args.runs - args.baseline_runs)
            row["RSS per run"] = (
                f"{per_run:.0f} bytes (RSS at the end, against {args.baseline_runs:,} runs)"
            )
            rows.append(row)
    print(f"evalpush run on {args.runs:,} finalized one-trace runs (ledger and tree), defaults")
    for key in rows[0]:
        if key != "rss":
            print(f"{key:<30} " + "".join(f"{row[key]:<44}" for row in rows))
    if not args.skip_late:
        print(
            f"{'late append to a finalized run':<30} uploaded again after {late_append(home, args)}"
        )


if __name__ == "__main__":
    main()
