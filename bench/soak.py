"""The chaos soak: many runs written while the platform misbehaves and the uploader is killed.

Writer processes write `--runs` runs (about `--samples` trace lines in all) line by line deep
under a watched tree: some finish by the expected count, some by a marker file, some by
settling; some hold bad lines, name no environment or have an unparsable config.toml; some are
replaced mid-way by an atomic rename, as `--resume` does. Meanwhile the local platform (its own
process, SQLite db) injects faults into a set share of requests (5xx, 429 with Retry-After,
resets and stalls after the work, malformed bodies, a connection refused for half a second) and
refuses connections for seconds at a time (outages); the uploader is SIGKILLed at random moments
(`--kill-after` seconds after each start) and started again; `evalpush push` of a few finished
runs starts beside it now and then, sharing its state dir, and a share of those pushes
(`--overlap-kill-share`) is SIGKILLed too.

Uploader (`--mode`):
- `push-only`: `evalpush push` of the finished runs the platform does not hold yet, again and
  again (the soak decides readiness from the writers' manifests: `push` takes runs as finished);
- `daemon`: `evalpush run` with `watch.roots` = the tree, `runs.settle_seconds` short,
  `runs.marker = ".done"`; it decides readiness itself, and follows the runs while they are
  written (`runs.follow`, a batch every `--follow-batch-seconds`, 2 by default).

Then, faults off, the uploader drains, and the accounting reads the platform's stored state
(never evalpush's ledger): per run one COMPLETED evaluation (any other CANCELLED), no sample lost,
duplicated or never written, each stored sample and the metrics equal to a fresh
`evalpush convert` of the final file, one finalize request; runs that cannot upload have no
evaluation. It prints the table and exits 1 on any violation (0 otherwise).

A fleet (`--fleet N`, `--db-restarts K`): N daemons, each in a PID namespace of its own, over
the one tree, sharing a ledger in a PostgreSQL the soak starts (and crash-restarts K times as
runs complete); the kills fall on all of them; pushes beside them share that ledger too; the
table adds the runs each daemon finalized.

    .venv/bin/python bench/soak.py [--mode push-only|daemon] [--runs 100] [--samples 40000]
        [--kills 30] [--kill-after LOW HIGH] [--overlaps 10] [--overlap-kill-share 0.25]
        [--writers 4] [--fleet N] [--db-restarts 2] [--seed 0] [--workdir DIR] [--keep]
        [--json FILE]

Only loopback. Bounded: `--max-seconds` for the chaos phase, `--drain-seconds` for the drain.
The work dir (default a temp dir under bench/.cache/) holds the tree, manifests, every
process's log and the platform's db; it is removed afterwards unless `--keep` or a violation.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from soakkit.chaos import ChaosParams  # noqa: E402 - bench/ on the path first
from soakkit.run import SoakParams, run_soak  # noqa: E402
from soakkit.table import table  # noqa: E402
from soakkit.uploaders import Mode  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", type=Mode, choices=list(Mode), default=Mode.PUSH_ONLY)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--samples", type=int, default=40_000, help="trace lines in all, about")
    parser.add_argument("--kills", type=int, default=30, help="SIGKILLs of the uploader, at most")
    parser.add_argument(
        "--kill-after",
        type=float,
        nargs=2,
        default=(0.5, 4.0),
        metavar=("LOW", "HIGH"),
        help="seconds after a start a kill lands",
    )
    parser.add_argument("--overlaps", type=int, default=10, help="overlapping pushes")
    parser.add_argument("--overlap-interval", type=float, default=8.0, help="mean seconds")
    parser.add_argument(
        "--overlap-kill-share", type=float, default=0.25, help="of the overlapping pushes"
    )
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument(
        "--pause-seconds",
        type=float,
        default=0.05,
        help="a writer's longest pause between bursts of lines",
    )
    parser.add_argument(
        "--fault-share", type=float, default=0.08, help="of the requests of each kind, about"
    )
    parser.add_argument("--outage-interval", type=float, default=20.0, help="mean seconds")
    parser.add_argument("--batch-samples", type=int, default=50)
    parser.add_argument(
        "--read-timeout", type=float, default=3.0, help="the uploaders' read timeout, seconds"
    )
    parser.add_argument(
        "--stall-seconds", type=float, default=4.0, help="a stall fault, after the work"
    )
    parser.add_argument(
        "--stall-weight", type=int, default=1, help="of the fault menu's 23 at 1 (a share)"
    )
    parser.add_argument(
        "--twice-weight",
        type=int,
        default=0,
        help="answers sent again on their connection, late (weight in the fault menu)",
    )
    parser.add_argument(
        "--log-level", default="warning", help="of every evalpush process (debug: each batch)"
    )
    parser.add_argument("--max-seconds", type=float, default=1800.0, help="chaos phase bound")
    parser.add_argument("--drain-seconds", type=float, default=600.0, help="drain phase bound")
    parser.add_argument(
        "--fleet",
        type=int,
        default=0,
        metavar="N",
        help="N daemons (each in a PID namespace of its own) sharing a PostgreSQL ledger",
    )
    parser.add_argument(
        "--db-restarts", type=int, default=2, help="with --fleet: PostgreSQL crash-restarts"
    )
    parser.add_argument(
        "--clock-ahead",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="with --fleet: the first host's wall clock runs this far ahead (needs faketime)",
    )
    parser.add_argument(
        "--late-weight", type=int, default=2, help="requests whose work lands late (menu weight)"
    )
    parser.add_argument(
        "--follow-batch-seconds",
        type=float,
        default=2.0,
        help="the daemon's batch period for the runs it follows while they are written",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the work dir")
    parser.add_argument("--json", type=Path, default=None, help="also write the report here")
    return parser.parse_args(argv)


def _stop(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt  # unwinds through run_soak's cleanup, which stops every child


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _stop)
    cache = BENCH / ".cache"
    cache.mkdir(exist_ok=True)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="soak-", dir=cache))
    params = SoakParams(
        workdir=workdir,
        mode=Mode.DAEMON if args.fleet else args.mode,
        runs=args.runs,
        samples=args.samples,
        writers=args.writers,
        pause_seconds=args.pause_seconds,
        kills=args.kills,
        kill_after_seconds=tuple(args.kill_after),
        overlaps=args.overlaps,
        overlap_interval_seconds=args.overlap_interval,
        overlap_kill_share=args.overlap_kill_share,
        chaos=ChaosParams(
            fault_share=args.fault_share,
            outage_interval_seconds=args.outage_interval,
            stall_seconds=args.stall_seconds,
            stall_weight=args.stall_weight,
            twice_weight=args.twice_weight,
            late_weight=args.late_weight,
        ),
        batch_samples=args.batch_samples,
        read_timeout_seconds=args.read_timeout,
        log_level=args.log_level,
        follow_batch_seconds=args.follow_batch_seconds,
        max_seconds=args.max_seconds,
        drain_seconds=args.drain_seconds,
        seed=args.seed,
        fleet=args.fleet,
        db_restarts=args.db_restarts if args.fleet else 0,
        clock_ahead_seconds=args.clock_ahead if args.fleet else 0.0,
    )
    report = run_soak(params)
    print(table(report))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "params": {**asdict(params), "workdir": str(workdir)},
                    "violations": report.violations,
                    "kills": report.kills,
                    "overlaps": report.overlaps,
                    "overlap_kills": report.overlap_kills,
                    "faults": dict(report.faults),
                    "outages": report.outages,
                    "samples_written": report.accounting.total("samples_written"),
                    "wall_seconds": report.wall_seconds,
                    "fleet": None if report.fleet is None else asdict(report.fleet),
                },
                indent=2,
                default=str,
            )
        )
    if report.violations or args.keep:
        print(f"work dir kept: {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
