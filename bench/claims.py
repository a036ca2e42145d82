"""What a claim costs on each store: one claim (of a new run and of a known one), one renewal of
its lease, one release; time (median and 99th percentile) and, on PostgreSQL, round trips to
the server (libpq's trace, one `ReadyForQuery` per round trip).

    .venv/bin/python bench/claims.py [--count 500] [--json FILE]

The PostgreSQL is a server of the bench's own on loopback, started as the tests start theirs
(tests/support/postgres.py), so its times are the floor: across a network each round trip adds
the network's round-trip time (the table's last column is what 1 ms of it would add).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent / "tests"))

from evalpush.ledger import Ledger, Process  # noqa: E402
from evalpush.ledger.claims import LEASE_SECONDS  # noqa: E402
from support.postgres import PASSWORD, Cluster, binaries  # noqa: E402

HERE = Process("bench-host", "bench-boot", 4242, 7, "pid:[bench]")


def never_alive(_holder: object, _now: float | None = None) -> bool:
    return False


class Trips:
    """Round trips a psycopg connection made, counted from libpq's protocol trace."""

    def __init__(self, ledger: Ledger) -> None:
        server = ledger.server
        assert server is not None and server._connection is not None
        self._file = tempfile.TemporaryFile()
        server._connection.pgconn.trace(self._file.fileno())

    def count(self) -> int:
        self._file.seek(0)
        return self._file.read().count(b"ReadyForQuery")


def measure(ledger: Ledger, count: int, trips: Trips | None) -> dict[str, dict[str, float]]:
    samples: dict[str, list[float]] = {"claim (new run)": [], "claim (known run)": []}
    samples |= {"renew": [], "release": []}
    rounds: dict[str, list[int]] = {name: [] for name in samples}

    def timed(name: str, call: Callable[[], object]) -> object:
        before = trips.count() if trips else 0
        started = time.perf_counter()
        result = call()
        samples[name].append(time.perf_counter() - started)
        if trips:
            rounds[name].append(trips.count() - before)
        return result

    for n in range(count):
        run_id = str(uuid.uuid4())
        for name in ("claim (new run)", "claim (known run)"):
            owner = HERE.new_owner()
            record, _ = timed(  # type: ignore[misc]
                name,
                lambda owner=owner, run_id=run_id: ledger.claim(
                    run_id=run_id,
                    path=f"/runs/{run_id}",
                    kind="eval",
                    owner=owner,
                    process=HERE,
                    lease_seconds=LEASE_SECONDS,
                    alive=never_alive,
                ),
            )
            timed("renew", lambda owner=owner: ledger.renew([owner], LEASE_SECONDS))
            timed("release", lambda record=record: ledger.release(record))
        del n
    return {
        name: {
            "median_ms": statistics.median(values) * 1000,
            "p99_ms": sorted(values)[int(len(values) * 0.99) - 1] * 1000,
            "round_trips": statistics.mean(rounds[name]) if rounds[name] else 0.0,
        }
        for name, values in samples.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=500)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as scratch, Ledger(Path(scratch) / "state.db") as ledger:
        results["sqlite (state.db)"] = measure(ledger, args.count, None)
    bin_dir = binaries()
    if bin_dir is None:
        print("no PostgreSQL server here: the shared ledger is not measured", file=sys.stderr)
    else:
        cluster = Cluster(bin_dir)
        try:
            cluster.start()
            with Ledger.shared(cluster.database(), password=PASSWORD) as ledger:
                results["postgresql (loopback)"] = measure(ledger, args.count, Trips(ledger))
        finally:
            cluster.destroy()
    print(
        f"{'store':<24}{'operation':<20}{'median ms':>11}{'p99 ms':>9}{'trips':>7}{'+1ms RTT':>10}"
    )
    for store, operations in results.items():
        for name, figures in operations.items():
            extra = f"{figures['round_trips']:.0f} ms" if figures["round_trips"] else "-"
            trips = f"{figures['round_trips']:.1f}" if figures["round_trips"] else "-"
            print(
                f"{store:<24}{name:<20}{figures['median_ms']:>11.3f}{figures['p99_ms']:>9.3f}"
                f"{trips:>7}{extra:>10}"
            )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
