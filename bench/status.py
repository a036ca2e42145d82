"""`evalpush status` on a ledger of a million runs: wall and peak RSS of the default view,
`status --json` and `status --all`, each as its own process (output to /dev/null).

The ledger is built once and cached in `bench/.cache/status/` (`--runs`, default 1,000,000):
finalized runs over the last 180 days, and a few hundred that need a person (failed, held,
partial, with records set aside, ready, waiting, some with an earlier evaluation superseded),
inserted with SQL in one transaction into a file the ledger made (its schema, its indexes).
Beside it, the same file at schema 9 (the version 10 indexes dropped, `runs_state` back), for
evalpush as committed at `--at REV` (`git archive REV daemon`, as bench/push.py's `--at`), which
refuses a newer schema; the time `migrate` takes from 9 to 10 on it is printed too.

`--postgres URL` (a database of its own, emptied first; the password in PGPASSWORD) measures
the same on a shared ledger, loaded with COPY; `--postgres auto` starts a PostgreSQL of its own
the way the tests do (tests/support/postgres.py).

    .venv/bin/python bench/status.py [--runs 1000000] [--repeat 3] [--at main] [--postgres auto]
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import sqlite3
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO / "daemon"))

from evalpush.ledger import Ledger  # noqa: E402
from evalpush.ledger.records import COLUMNS  # noqa: E402

DAY = 86400.0
EXPECTED = 40
NOW = 1_796_000_000.0  # a fixed "now" (2026-11), so the cached file is the same every time
NEEDING = {"failed": 120, "held": 60, "partial": 60, "set_aside": 60, "ready": 30, "waiting": 20}
SUPERSEDED = 100
"""Runs needing a person, by kind; and finalized runs that had an earlier evaluation."""


def _row(n: int, rng: random.Random, kind: str) -> dict[str, object]:
    run_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
    path = f"/srv/evals/outputs/{n // 1000:04d}/{run_id}"
    raw = path.encode()
    updated = NOW - rng.random() * 180 * DAY
    state = {"partial": "finalized", "set_aside": "finalized"}.get(kind, kind)
    seen = EXPECTED - 10 if kind == "partial" else EXPECTED
    row: dict[str, object] = dict.fromkeys(COLUMNS)
    row.update(
        id=n,
        run_id=run_id,
        run_key=hashlib.sha256(run_id.encode()).digest(),
        path=path,
        path_raw=raw,
        path_key=hashlib.sha256(raw).digest(),
        kind="eval",
        state=state,
        reason="",
        step="done" if state == "finalized" else "scan",
        acked_offset=seen * 3600,
        acked_line=seen,
        samples_sent=seen if state == "finalized" else 0,
        samples_seen=seen,
        bytes_sent=seen * 3600 if state == "finalized" else 0,
        release_hold=0,
        attempts=1,
        looked_up=1,
        created_at=updated - 600,
        updated_at=updated,
        expected_traces=EXPECTED,
        upload_end=seen * 3600,
        file_size=seen * 3600,
    )
    if state == "finalized":
        evaluation = f"{n:08x}-0000-4000-8000-{rng.getrandbits(48):012x}"
        row.update(
            evaluation_id=evaluation,
            viewer_url=f"https://app.example/evaluations/{evaluation}",
            finalized_at=updated,
        )
    if kind == "failed":
        row["last_error"] = "config.toml: no environment name ('[taskset] id' or 'id')"
        row["last_error_at"] = updated
    elif kind == "held":
        row["reason"] = "2 bad lines set aside; convert.on_bad_line = 'hold'"
    elif kind == "waiting":
        row["reason"] = "waiting for 40 traces (12 so far)"
    return row


def _kinds(runs: int, rng: random.Random) -> Iterator[str]:
    """Each row's kind: the few needing a person scattered among the finalized."""
    special = [kind for kind, count in NEEDING.items() for _ in range(count)]
    at = dict(zip(rng.sample(range(1, runs + 1), len(special)), special, strict=True))
    for n in range(1, runs + 1):
        yield at.get(n, "finalized")


def build_sqlite(path: Path, runs: int) -> None:
    """A ledger the ledger made (schema and indexes), filled with SQL in one transaction."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    for leftover in path.parent.glob(partial.name + "*"):
        leftover.unlink()
    Ledger(partial).close()
    rng = random.Random(7)
    db = sqlite3.connect(partial, isolation_level=None)
    columns = [*COLUMNS, "run_key", "path_key"]
    insert = f"INSERT INTO runs ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"
    started = time.perf_counter()
    db.execute("BEGIN")
    batch, set_aside, history = [], [], []
    for n, kind in enumerate(_kinds(runs, rng), start=1):
        row = _row(n, rng, kind)
        batch.append(tuple(row[c] for c in columns))
        if kind == "set_aside":
            for line in (3, 17):
                set_aside.append((n, line, line * 3600, 3600, "malformed", "line is not JSON"))
        if kind == "finalized" and len(history) < SUPERSEDED and n % 9973 == 0:
            at = float(row["updated_at"]) - DAY  # type: ignore[arg-type]
            history.append((n, f"earlier-{n}", None, "superseded", at))
        if len(batch) == 50_000:
            db.executemany(insert, batch)
            batch.clear()
    db.executemany(insert, batch)
    db.executemany(
        'INSERT INTO set_aside (run, line, "offset", size, kind, reason) VALUES (?, ?, ?, ?, ?, ?)',
        set_aside,
    )
    db.executemany(
        "INSERT INTO history (run, evaluation_id, viewer_url, outcome, at) VALUES (?, ?, ?, ?, ?)",
        history,
    )
    db.execute("COMMIT")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    os.replace(partial, path)
    print(f"built {path}: {runs:,} runs in {time.perf_counter() - started:.1f}s")


def as_schema_9(source: Path, target: Path) -> None:
    """`source` as evalpush 9 left it: the version 10 indexes gone, `runs_state` back."""
    target.parent.mkdir(parents=True, exist_ok=True)
    for leftover in target.parent.glob(target.name + "*"):
        leftover.unlink()
    shutil.copyfile(source, target)
    db = sqlite3.connect(target, isolation_level=None)
    db.execute("DROP INDEX runs_state_updated")
    db.execute("DROP INDEX runs_short")
    db.execute("DROP INDEX runs_claim_owner")
    db.execute("CREATE INDEX runs_state ON runs (state)")
    db.execute("PRAGMA user_version = 9")
    db.execute("VACUUM")
    db.close()
