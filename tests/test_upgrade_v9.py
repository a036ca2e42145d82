"""Schema 10: the indexes `status` reads a ledger of a million runs through (runs by state in the
order they were updated, in place of `runs_state`; the runs short of their expected traces; in
the file, the runs someone holds). A ledger of schema 9 is brought to it on each store, its rows
kept: the SQLite file after a backup beside it (`state.db.bak-v9`), a shared ledger's database
by `migrate`; `status` then reads it through them."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import psycopg

from evalpush.core.states import State
from evalpush.ledger import SCHEMA_VERSION, Ledger, default_path
from evalpush.ledger.tables import path_key, run_key
from support.commands import evalpush
from support.environ import cli_environ
from support.old_ledgers import old_file, old_shared
from support.postgres import PASSWORD

RUNS = [("run-finalized", "finalized", 4), ("run-partial", "finalized", 3), ("run-held", "held", 0)]
"""(run id, state, lines seen) of the schema 9 ledger's runs; each expects 4."""


def _insert(execute, mark: str) -> None:  # noqa: ANN001 - a cursor's or a connection's
    for n, (run_id, state, seen) in enumerate(RUNS):
        path = f"/runs/{n}".encode()
        execute(
            "INSERT INTO runs (run_id, run_key, path, path_raw, path_key, kind, state, "
            "samples_seen, expected_traces, created_at, updated_at) "
            f"VALUES ({', '.join([mark] * 5)}, 'eval', {mark}, {mark}, 4, {mark}, {mark})",
            (
                run_id,
                run_key(run_id),
                path.decode(),
                path,
                path_key(path),
                state,
                seen,
                time.time(),
                time.time() + n,
            ),
        )


def test_a_schema_9_file_is_upgraded_after_a_backup_with_the_indexes_status_reads_through(
    platform, tmp_path: Path
):
    path = default_path(tmp_path / "state")
    db = old_file(path, 9)
    _insert(db.execute, "?")
    db.close()

    with Ledger(path) as ledger:
        upgrade = ledger.upgrade
        partial = ledger.short(State.FINALIZED)
    shown = evalpush(cli_environ(platform, tmp_path), "status")

    assert upgrade is not None and (upgrade.from_version, upgrade.to_version) == (9, SCHEMA_VERSION)
    assert upgrade.backup == path.with_name("state.db.bak-v9") and upgrade.backup.exists()
    db = sqlite3.connect(path)
    indexed = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    assert {"runs_state_updated", "runs_short", "runs_claim_owner"} <= indexed
    assert "runs_state" not in indexed
    plan = db.execute(
        "EXPLAIN QUERY PLAN SELECT id FROM runs WHERE state = 'finalized' AND expected_traces > samples_seen"
    ).fetchall()
    assert "runs_short" in str(plan), "the partial runs are found through their index"
    db.close()
    assert [row_id for row_id, _ in partial] == [2]
    assert shown.returncode == 0, shown.stderr
    assert "needs a person: 2 runs (1 held, 1 partial)" in shown.stdout


def test_a_schema_9_shared_ledger_is_upgraded_by_migrate_keeping_its_runs(
    pg_url: str, platform, tmp_path: Path
):
    with old_shared(pg_url, 9) as connection:
        _insert(connection.execute, "%s")
    password_file = tmp_path / "pw"
    password_file.write_text(PASSWORD)
    environ = cli_environ(
        platform,
        tmp_path,
        EVALPUSH_LEDGER__URL=pg_url,
        EVALPUSH_LEDGER__PASSWORD_FILE=str(password_file),
    )

    before = evalpush(environ, "status")
    migrated = evalpush(environ, "migrate")
    shown = evalpush(environ, "status")

    assert before.returncode != 0 and "`evalpush migrate` upgrades it" in before.stderr
    assert migrated.returncode == 0, migrated
    assert f"ledger upgraded 9 -> {SCHEMA_VERSION}" in migrated.stdout, migrated
    with psycopg.connect(pg_url, password=PASSWORD) as connection:
        indexed = {
            name
            for (name,) in connection.execute(
                "SELECT indexname FROM pg_indexes WHERE tablename = 'runs'"
            )
        }
    assert {"runs_state_updated", "runs_short", "runs_claim_owner"} <= indexed
    assert "runs_state" not in indexed
    with Ledger.shared(pg_url, password=PASSWORD) as ledger:
        assert [r.run_id for r in ledger.all()] == [run_id for run_id, _, _ in RUNS]
    assert shown.returncode == 0, shown.stderr
    assert "needs a person: 2 runs (1 held, 1 partial)" in shown.stdout
