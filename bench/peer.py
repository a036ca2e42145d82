"""Side by side with the peer that follows runs today: verifiers 0.4.0's own streaming push
(prime-runs 0.1.4) against evalpush following the same eval written with its push off.

Each leg starts the local platform in this process and runs `peer_eval.py` (a 0.4.0 eval
without the model, writing `rate` episodes a second for `seconds` with the version's own
writer) in the producer venv:

- `prime-runs`: the eval's push on. prime-runs creates the evaluation, posts the samples from
  its upload thread as episodes are handed to it, sends the metadata and metrics, finalizes.
- `evalpush`: the eval's push off (a `disabled-` run); `evalpush run` on a fresh state dir
  follows the run directory (`runs.follow`, `--batch-seconds`) and finalizes it once finished.

Both legs point at the same platform kind with the same key; prime-runs' Prime Traces backend is
opted out (`PRIME_TRACES_OPT_OUT=1`) so its samples go to the evaluations samples endpoint, the
one the local platform serves. `--outage-at S` closes the platform's port (`refuse`) for
`--outage-seconds` from S seconds into the eval.

Per leg: the lag of each sample from its line on disk (`time.time()` after the write) to the
platform holding it (the platform's sample count polled every 0.2 s; both send samples in file
order), median / p99 / max, computed when nothing was lost; the CPU seconds on the box (the
eval's from opening its run to closing it out, every thread; and the daemon's); the requests
the platform received; and what the platform holds at the end: evaluations and their status,
samples stored, distinct, lost, duplicated, finalize calls.

    .venv/bin/python bench/peer.py [--seconds 600] [--rate 20] [--batch-seconds 30]
        [--outage-at S --outage-seconds 60] [--legs prime-runs,evalpush]
        [--venv .venv-producer-0.4.0]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from follow import Bench  # noqa: E402

from evalpush.local_platform import LocalPlatform  # noqa: E402

REPO = HERE.parent


def producer_env(platform: LocalPlatform, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PRIME_", "EVALPUSH_"))}
    return env | {
        "HOME": str(home),
        "PRIME_API_BASE_URL": platform.base_url,
        "PRIME_BASE_URL": platform.base_url,
        "PRIME_FRONTEND_URL": "http://frontend.invalid",
        "PRIME_API_KEY": platform.api_key or "bench-key",
        "PRIME_TRACES_OPT_OUT": "1",
    }


class Counter(threading.Thread):
    """Polls the platform's stored sample count; `seen_at[i]` is when sample i was first held."""

    def __init__(self, platform: LocalPlatform) -> None:
        super().__init__(daemon=True)
        self.platform = platform
        self.seen_at: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.2):
            evaluations = self.platform.summary()["evaluations"].values()  # in process
            held = sum(e["sample_count"] for e in evaluations)
            self.seen_at.extend([time.time()] * (held - len(self.seen_at)))


def outage(platform: LocalPlatform, at: float, seconds: float, started: float) -> None:
    time.sleep(max(0.0, started + at - time.monotonic()))
    platform.inject("refuse", seconds=seconds)


def leg(name: str, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"evalpush-peer-{name}-") as tmp, LocalPlatform() as p:
        scratch = Path(tmp)
        daemon = None
        if name == "evalpush":
            daemon = Bench(scratch, p, EVALPUSH_RUNS__FOLLOW_BATCH_SECONDS=str(args.batch_seconds))
            out = daemon.root
            daemon_cpu_before = daemon.cpu()
        else:
            out = scratch / "outputs"
        counter = Counter(p)
        counter.start()
        report = scratch / "report.json"
        started = time.monotonic()
        if args.outage_at is not None:
            threading.Thread(
                target=outage, args=(p, args.outage_at, args.outage_seconds, started), daemon=True
            ).start()
        eval_cmd = [
            str(args.venv / "bin" / "python"),
            str(HERE / "peer_eval.py"),
            *("--out", str(out), "--report", str(report)),
            *("--seconds", str(args.seconds), "--rate", str(args.rate)),
            "--push" if name == "prime-runs" else "--no-push",
        ]
        subprocess.run(eval_cmd, env=producer_env(p, scratch), check=True)
        done = json.loads(report.read_text())
        written = done["written_at"]
        result: dict = {"leg": name, "written": len(written)}
        if daemon is not None:
            daemon.wait_finalized([done["run_id"]], timeout=args.outage_seconds + 600)
            result["finalized_after_last_line"] = (
                daemon.finalized[done["run_id"]] - time.monotonic() + time.time() - written[-1]
            )
            result["daemon_cpu"] = daemon.cpu() - daemon_cpu_before
            daemon.stop()
        else:
            result["finalized_after_last_line"] = done["finished_at"] - written[-1]
        time.sleep(0.5)  # the counter's last look
        counter.stop.set()
        counter.join()
        summary = p.summary()
    evaluations = list(summary["evaluations"].values())
    stored = sum(e["sample_count"] for e in evaluations)
    distinct = sum(e["distinct_sample_ids"] for e in evaluations)
    result |= {
        "eval_cpu": done["cpu_seconds"],
        "push_error": done["push_error"],
        "evaluations": [e["status"] for e in evaluations],
        "finalize_calls": sum(e["finalize_count"] for e in evaluations),
        "stored": stored,
        "lost": len(written) - distinct,
        "duplicated": stored - distinct,
        "requests": {k: v for k, v in summary["requests"].items() if v},
    }
    if result["lost"] == 0 and len(counter.seen_at) >= len(written):
        lags = sorted(s - w for s, w in zip(counter.seen_at, written, strict=False))
        result["lag"] = {
            "median": statistics.median(lags),
            "p99": lags[int(0.99 * (len(lags) - 1))],
            "max": lags[-1],
        }
    return result


def say(r: dict) -> str:
    cpu = r["eval_cpu"] + r.get("daemon_cpu", 0.0)
    lag = r.get("lag")
    lag_text = (
        f"lag median {lag['median']:.1f} s, p99 {lag['p99']:.1f} s, max {lag['max']:.1f} s"
        if lag
        else "lag not computed (samples lost)"
    )
    daemon = f" + daemon {r['daemon_cpu']:.1f} s" if "daemon_cpu" in r else ""
    return (
        f"{r['leg']}: {r['written']} episodes; {lag_text}; finalized "
        f"{r['finalized_after_last_line']:.1f} s after the last line; CPU {cpu:.1f} s "
        f"(eval {r['eval_cpu']:.1f} s{daemon}); requests {r['requests']}; platform holds "
        f"{r['evaluations']} with {r['stored']} samples, {r['lost']} lost, {r['duplicated']} "
        f"duplicated, {r['finalize_calls']} finalize calls; push error: {r['push_error']}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--rate", type=float, default=20)
    parser.add_argument("--batch-seconds", type=float, default=30)
    parser.add_argument("--outage-at", type=float)
    parser.add_argument("--outage-seconds", type=float, default=60)
    parser.add_argument("--legs", default="prime-runs,evalpush")
    parser.add_argument("--venv", type=Path, default=REPO / ".venv-producer-0.4.0")
    args = parser.parse_args()
    if not (args.venv / "bin" / "python").exists():
        raise SystemExit(
            f"no producer venv at {args.venv}: `python tools/make_fixtures.py --only 0.4.0`"
        )
    for name in args.legs.split(","):
        result = leg(name, args)
        print(say(result), flush=True)
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
