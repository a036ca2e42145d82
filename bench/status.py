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

import argparse
import hashlib
import os
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO / "daemon"))

sys.path.insert(0, str(BENCH))

from convert import PEAK_HOOK  # noqa: E402 - the sibling bench's hook: one way to read a peak
from push import checkout  # noqa: E402 - the sibling bench's: one way to extract a revision

from evalpush.ledger import SCHEMA_VERSION, Ledger  # noqa: E402
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
                set_aside.append((n, line, line * 3600, 3600, "bad_line", "line is not JSON"))
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
    db.execute("DROP INDEX daemons_seen_at")  # schema 11's
    db.execute("DROP TABLE alembic_version")  # evalpush 9 kept its version in user_version
    db.execute("PRAGMA user_version = 9")
    db.execute("VACUUM")
    db.close()


def load_postgres(url: str, password: str, source: Path) -> None:
    """The shared ledger at `url` made by the ledger (its tables and indexes) and filled from
    the file `source` with COPY, one table at a time."""
    import psycopg

    started = time.perf_counter()
    with psycopg.connect(url, password=password, autocommit=True) as connection:
        for table in (
            "alembic_version",
            "evalpush_schema",
            "set_aside",
            "history",
            "forgotten",
            "daemons",
            "runs",
        ):
            connection.execute(f"DROP TABLE IF EXISTS {table} CASCADE")
    Ledger.shared(url, password=password).close()
    db = sqlite3.connect(f"file:{source}?immutable=1", uri=True)
    with psycopg.connect(url, password=password) as connection:
        for table in ("runs", "set_aside", "history"):
            columns = [row[1] for row in db.execute(f"PRAGMA table_info({table})")]
            quoted = ", ".join(f'"{c}"' for c in columns)
            with connection.cursor().copy(f"COPY {table} ({quoted}) FROM STDIN") as copy:
                for row in db.execute(f"SELECT {quoted} FROM {table}"):
                    copy.write_row(row)
        connection.execute("SELECT setval(pg_get_serial_sequence('runs', 'id'), max(id)) FROM runs")
        connection.commit()
    with psycopg.connect(url, password=password, autocommit=True) as connection:
        connection.execute("VACUUM ANALYZE")
    db.close()
    print(f"loaded {url}: {time.perf_counter() - started:.1f}s")


def postgres_as_schema_9(admin_url: str, password: str, source: str, target: str) -> None:
    """Database `target`, a copy of `source` as evalpush 9 left it (its version 10 indexes
    gone, `runs_state` back)."""
    import psycopg

    with psycopg.connect(admin_url, password=password, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {target}")
        admin.execute(f"CREATE DATABASE {target} TEMPLATE {source}")
    url = admin_url.rsplit("/", 1)[0] + f"/{target}"
    with psycopg.connect(url, password=password, autocommit=True) as connection:
        connection.execute("DROP INDEX runs_state_updated")
        connection.execute("DROP INDEX runs_short")
        connection.execute("CREATE INDEX runs_state ON runs (state)")
        connection.execute("DROP INDEX daemons_seen_at")  # schema 11's
        connection.execute("DROP TABLE alembic_version")  # evalpush 9 kept its version apart
        connection.execute("UPDATE evalpush_schema SET version = 9")
        connection.execute("ANALYZE")


class Figure:
    """One command's measurements: wall seconds, CPU seconds, peak RSS (KiB)."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self.rss: list[int] = []

    def text(self) -> str:
        best = min(self.wall)
        return (
            f"wall best {best:6.2f}s median {statistics.median(self.wall):6.2f}s  "
            f"CPU best {min(self.cpu):6.2f}s  peak RSS {max(self.rss) / 1024:6.1f} MiB"
        )


def measure(argv: list[str], env: dict[str, str], figure: Figure) -> None:
    """Run one child, stdout to /dev/null; its wall, CPU and peak RSS into `figure`. The peak is
    the child's own VmHWM at its exit (convert.py's `sitecustomize` hook: `wait4`'s would
    include this process's high-water mark)."""
    with tempfile.TemporaryDirectory(prefix="bench-status-hook-") as hook:
        (Path(hook) / "sitecustomize.py").write_text(PEAK_HOOK)
        peak = Path(hook) / "peak_kib"
        env = {**env, "EVALPUSH_BENCH_PEAK_FILE": str(peak)}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [hook, env.get("PYTHONPATH")]))
        with open(os.devnull, "wb") as devnull, tempfile.TemporaryFile() as err:
            started = time.perf_counter()
            child = subprocess.Popen(argv, stdout=devnull, stderr=err, env=env, cwd=REPO)
            _, status, usage = os.wait4(child.pid, 0)
            wall = time.perf_counter() - started
            if os.waitstatus_to_exitcode(status) != 0:
                err.seek(0)
                raise SystemExit(f"{argv} failed:\n{err.read().decode(errors='replace')[-3000:]}")
        figure.rss.append(int(peak.read_text().split()[0]))
    figure.wall.append(wall)
    figure.cpu.append(usage.ru_utime + usage.ru_stime)


COMMANDS = {
    "status": ["status"],
    "status --json": ["status", "--json"],
    "status --all": ["status", "--all"],
}


def compiled(daemon: str) -> str:
    """Byte-compile a daemon tree, as an install does (this machine sets
    PYTHONDONTWRITEBYTECODE: each start would compile every module again)."""
    import compileall

    compileall.compile_dir(daemon, quiet=1)
    return daemon


def environs(ledgers: dict[str, dict[str, str]], trees: dict[str, str]) -> dict[str, dict]:
    """Each contender's environment: its daemon tree and its ledger (a state dir or a URL)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("EVALPUSH_", "PRIME_"))}
    found = {}
    for name, tree in trees.items():
        found[name] = {**base, **ledgers[name], "PYTHONPATH": tree}
    return found


def run_rounds(label: str, envs: dict[str, dict[str, str]], repeat: int, skip: set[str]) -> None:
    # An evalpush before `--all` printed every run by default: its `status` is both figures.
    figures = {
        (who, cmd): Figure()
        for who in envs
        for cmd in COMMANDS
        if cmd not in skip and (who == "ours" or cmd != "status --all")
    }
    baseline = Figure()
    for _ in range(repeat):  # interleaved, so that a swing of the machine hits each alike
        measure([sys.executable, "-c", "pass"], dict(os.environ), baseline)
        for (who, cmd), figure in figures.items():
            measure([sys.executable, "-m", "evalpush", *COMMANDS[cmd]], envs[who], figure)
    print(f"\n{label}: {repeat} rounds; `python -c pass`: {baseline.text()}")
    for (who, cmd), figure in figures.items():
        print(f"  {who:<14} {cmd:<15} {figure.text()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--at", metavar="REV", help="also measure evalpush as committed at REV")
    parser.add_argument("--postgres", metavar="URL", help="also on PostgreSQL: URL, or auto")
    parser.add_argument(
        "--skip", action="append", default=[], choices=list(COMMANDS), help="a command not to time"
    )
    parser.add_argument(
        "--migrate", action="store_true", help="time migrate 9 -> the current schema on the file"
    )
    parser.add_argument("--cache", type=Path, default=BENCH / ".cache" / "status")
    args = parser.parse_args()
    skip = set(args.skip)
    here = compiled(str(REPO / "daemon"))
    ledger = args.cache / f"sqlite-{args.runs}" / "state.db"
    if not ledger.exists():
        build_sqlite(ledger, args.runs)
    old = args.cache / f"sqlite-{args.runs}-v9" / "state.db"
    if (args.at or args.migrate) and not old.exists():
        as_schema_9(ledger, old)
    with tempfile.TemporaryDirectory(prefix="bench-status-") as scratch:
        trees = {"ours": here}
        ledgers = {"ours": {"EVALPUSH_STATE_DIR": str(ledger.parent)}}
        if args.at:
            name = f"at {args.at}"
            trees[name] = compiled(checkout(args.at, Path(scratch)))
            ledgers[name] = {"EVALPUSH_STATE_DIR": str(old.parent)}
        for name in trees:
            ledgers[name]["HOME"] = scratch
        rows = sqlite3.connect(f"file:{ledger}?immutable=1", uri=True)
        (runs,) = rows.execute("SELECT count(*) FROM runs").fetchone()
        rows.close()
        print(f"ledger: {ledger} ({runs:,} runs, {ledger.stat().st_size / 1e6:.0f} MB)")
        run_rounds("SQLite file", environs(ledgers, trees), args.repeat, skip)
        if args.migrate:
            time_migrate(old, here, scratch)
        if args.postgres:
            on_postgres(args, ledger, trees, scratch, skip)


def time_migrate(old: Path, tree: str, scratch: str) -> None:
    """`evalpush migrate` of the schema 9 file to 10, on a copy."""
    state = Path(scratch) / "migrate"
    state.mkdir()
    shutil.copyfile(old, state / "state.db")
    env = {**os.environ, "PYTHONPATH": tree, "EVALPUSH_STATE_DIR": str(state), "HOME": scratch}
    figure = Figure()
    measure([sys.executable, "-m", "evalpush", "migrate"], env, figure)
    print(f"\nmigrate 9 -> {SCHEMA_VERSION} (file, with its backup): {figure.text()}")
    shutil.rmtree(state)


def on_postgres(
    args: argparse.Namespace, ledger: Path, trees: dict[str, str], scratch: str, skip: set[str]
) -> None:
    sys.path.insert(0, str(REPO / "tests"))
    from support.postgres import PASSWORD, Cluster, binaries

    cluster = None
    if args.postgres == "auto":
        bin_dir = binaries()
        if bin_dir is None:
            raise SystemExit("--postgres auto: no PostgreSQL here (Debian's postgresql package)")
        cluster = Cluster(bin_dir)
        cluster.start()
        with cluster.admin() as admin:
            admin.execute("CREATE DATABASE ledger")
        url, password = cluster.url("ledger"), PASSWORD
    else:
        url, password = args.postgres, os.environ.get("PGPASSWORD", "")
    try:
        load_postgres(url, password, ledger)
        password_file = Path(scratch) / "pw"
        password_file.write_text(password)
        ledgers = {
            "ours": {
                "EVALPUSH_LEDGER__URL": url,
                "EVALPUSH_LEDGER__PASSWORD_FILE": str(password_file),
            }
        }
        if len(trees) > 1:
            if cluster is None:
                raise SystemExit("--at with --postgres URL: only with --postgres auto")
            postgres_as_schema_9(cluster.url("postgres"), password, "ledger", "ledger_v9")
            (name,) = [n for n in trees if n != "ours"]
            ledgers[name] = {
                "EVALPUSH_LEDGER__URL": cluster.url("ledger_v9"),
                "EVALPUSH_LEDGER__PASSWORD_FILE": str(password_file),
            }
        for name in trees:
            ledgers[name]["HOME"] = scratch
            ledgers[name]["EVALPUSH_STATE_DIR"] = str(Path(scratch) / "state")
        run_rounds(f"PostgreSQL ({url})", environs(ledgers, trees), args.repeat, skip)
    finally:
        if cluster is not None:
            cluster.destroy()


if __name__ == "__main__":
    main()
