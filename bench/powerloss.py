"""Power loss under two pushes at once: exactly once when the ledger keeps only what was synced.

N runs (one trace each; every 30th 400 lines, 8 batches of 50) in one environment. Each round
starts two `evalpush push` on one state dir, SIGKILLs both at a random instant, and then cuts
the ledger's write-ahead log back to what its last sync had covered when it began: what a
machine losing power keeps (a commit not synced may be gone, a synced one may not). A
`sitecustomize` hook in the pushes logs the log's size as each sync begins and turns SQLite's
autocheckpoint off, so the synced prefix of the log stays where it was written. A round in
which a push ended by itself (its clean close checkpoints the log) cuts nothing. Last, one
clean push; then the platform must hold one COMPLETED evaluation per run, each sample once,
none finalized twice. `tests/test_crash.py` does this at each step boundary; this does it at
random instants, with two processes sharing syncs.

    .venv/bin/python bench/powerloss.py [--runs 1000] [--rounds 6] [--seed 7]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import many_runs
import push

LONG_RUN_EVERY = 30
LONG_RUN_LINES = 400
HOOK = """
import os, sqlite3

_log = os.environ.get("BENCH_POWERLOSS_LOG")
if _log:
    _connect, _fsync = sqlite3.connect, os.fsync

    def connect(*args, **kwargs):
        db = _connect(*args, **kwargs)
        db.execute("PRAGMA wal_autocheckpoint=0")  # the log only grows: its prefix stays put
        return db

    def fsync(fd):
        synced = os.fstat(fd).st_size  # what this sync makes durable: the log as it begins
        _fsync(fd)
        if os.readlink(f"/proc/self/fd/{fd}").endswith("state.db-wal"):
            out = os.open(_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(out, f"{synced}\\n".encode())
            finally:
                os.close(out)

    sqlite3.connect, os.fsync = connect, fsync
"""


def write_runs(root: Path, count: int, seed: int) -> None:
    config = 'model = "m"\nnum_rollouts = 1\npush = false\n[taskset]\nid = "bench-powerloss"\n'
    for n in range(count):
        run = root / "env--model--harness" / str(uuid.uuid5(many_runs.NAMESPACE, f"{seed}-{n}"))
        run.mkdir(parents=True)
        (run / "config.toml").write_text(config)
        lines = LONG_RUN_LINES if n % LONG_RUN_EVERY == 0 else 1
        (run / "traces.jsonl").write_bytes(
            b"".join(
                many_runs.trace_line(n * LONG_RUN_LINES + i).replace(
                    b'"idx": 0', f'"idx": {i}'.encode()
                )
                for i in range(lines)
            )
        )


def lose_power(state: Path, synced_log: Path) -> int:
    """Cut the ledger's log back to its last sync; returns the bytes cut."""
    wal = state / "state.db-wal"
    sizes = [int(size) for size in synced_log.read_text().split()] if synced_log.exists() else []
    if not wal.exists() or not sizes:
        return 0
    cut = wal.stat().st_size - max(sizes)
    os.truncate(wal, max(sizes))
    (state / "state.db-shm").unlink(missing_ok=True)  # rebuilt from the log, as after a reboot
    return cut


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    (push.BENCH / ".cache").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-powerloss-", dir=push.BENCH / ".cache") as tmp:
        work = Path(tmp)
        root, state, synced_log, hook = (
            work / "runs",
            work / "state",
            work / "synced",
            work / "hook",
        )
        write_runs(root, args.runs, args.seed)
        hook.mkdir()
        (hook / "sitecustomize.py").write_text(HOOK)
        platform = push.Platform(work)
        environ = {
            **os.environ,
            "PRIME_API_KEY": push.PLATFORM_KEY,
            "PRIME_API_BASE_URL": platform.base,
            "EVALPUSH_STATE_DIR": str(state),
            "EVALPUSH_LOG__LEVEL": "error",
            "EVALPUSH_UPLOAD__MAX_BATCH_SAMPLES": "50",
            "PYTHONPATH": os.pathsep.join(
                [str(hook), push.SOURCE.get("PYTHONPATH", str(push.REPO / "daemon"))]
            ),
        }
        command = [sys.executable, "-m", "evalpush", "push", str(root)]
        losses = cut = 0
        try:
            for _ in range(args.rounds):
                pushes = [
                    subprocess.Popen(
                        command,
                        env={**environ, "BENCH_POWERLOSS_LOG": str(synced_log)},
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                    for _ in range(2)
                ]
                time.sleep(rng.uniform(0.3, 1.5))
                for process in pushes:
                    process.send_signal(signal.SIGKILL)
                    process.wait()
                if any(p.returncode != -signal.SIGKILL for p in pushes):
                    synced_log.unlink(missing_ok=True)  # a clean close checkpointed the log
                    continue
                cut += lose_power(state, synced_log)
                losses += 1
            final = subprocess.run(command, env=environ, capture_output=True, timeout=600)
            summary = platform.get("/_control/summary")
        finally:
            platform.stop()
    evaluations = summary["evaluations"].values()
    wrong = {
        "runs without exactly one evaluation": sum(n != 1 for n in summary["runs"].values())
        + args.runs
        - len(summary["runs"]),
        "evaluations not COMPLETED": sum(e["status"] != "COMPLETED" for e in evaluations),
        "evaluations holding a sample twice": sum(bool(e["duplicates"]) for e in evaluations),
        "evaluations finalized twice": sum(e["finalize_count"] > 1 for e in evaluations),
        "wrong sample counts": sum(
            e["sample_count"] not in (1, LONG_RUN_LINES) for e in evaluations
        ),
    }
    print(
        f"{args.runs} runs, seed {args.seed}: {args.rounds} rounds, {losses} power losses "
        f"({cut} bytes of the ledger's log cut); the clean push exited {final.returncode}"
    )
    print(", ".join(f"{what}: {count}" for what, count in wrong.items()))
    if final.returncode != 0 or any(wrong.values()):
        sys.exit(final.stderr.decode(errors="replace")[-2000:] or "NOT exactly once")
    print("exactly once")


if __name__ == "__main__":
    main()
