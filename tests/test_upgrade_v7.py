"""Schema 7: runs found by digests of their run id and path (and schema 9: a daemon's STATUS
line and gate in its row). A ledger of schema 6 is brought to the current schema on each store,
its rows kept: the SQLite file after a backup beside it
(`state.db.bak-v6`), a shared ledger's database in one transaction by the first evalpush that
opens it to write (`migrate`, `push`, `run`)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from evalpush.core.states import State
from evalpush.ledger import SCHEMA_VERSION, Ledger, default_path
from evalpush.ledger.records import GateState
from support.commands import evalpush
from support.environ import cli_environ
from support.old_ledgers import old_file, old_shared
from support.postgres import PASSWORD

NUL_RUN_ID = "disabled-nul\x00byte"
MARKED_RUN_ID = "evalpush-hex:not-hex-at-all"  # a run id that starts with the stored form's mark
LONG_RUN_ID = "disabled-" + "0123456789abcdef" * 300


def v6_file(path: Path, rows: list[tuple[str, bytes]]) -> None:
    """A ledger file at schema 6 holding a run for each (run id, path) and a forgotten
    evaluation of the first."""
    db = old_file(path, 6)
    for n, (run_id, raw) in enumerate(rows):
        db.execute(
            "INSERT INTO runs (run_id, path, path_raw, kind, state, evaluation_id, "
            "created_at, updated_at) VALUES (?, ?, ?, 'eval', 'finalized', ?, ?, ?)",
            (run_id, raw.decode(), raw, f"eval-{n}", time.time(), time.time()),
        )
    db.execute(
        "INSERT INTO forgotten (run_id, evaluation_id, at) VALUES (?, 'eval-forgotten', 1.0)",
        (rows[0][0],),
    )
    db.execute(
        "INSERT INTO daemons (id, host, pid, version, started_at, seen_at, lease_seconds) "
        "VALUES ('h/b/ns/7/1', 'h', 7, '0.4.0', 1.0, 2.0, 120.0)"
    )
    db.close()


def test_a_schema_6_file_is_upgraded_after_a_backup_keeping_every_run_id_and_path(tmp_path: Path):
    path = default_path(tmp_path / "state")
    rows = [(NUL_RUN_ID, b"/runs/a"), (MARKED_RUN_ID, b"/runs/b"), (LONG_RUN_ID, b"/runs/c")]
    v6_file(path, rows)

    with Ledger(path) as ledger:
        upgrade = ledger.upgrade
        found = {run_id: ledger.get_run(run_id) for run_id, _ in rows}
        at = {raw: ledger.run_id_at(Path(raw.decode())) for _, raw in rows}
        forgotten = ledger.earlier_evaluations(found[NUL_RUN_ID])
        by_prefix = ledger.match("disabled-nul")
        (daemon,) = ledger.daemons()

    assert upgrade is not None and (upgrade.from_version, upgrade.to_version) == (6, SCHEMA_VERSION)
    assert upgrade.backup == path.with_name("state.db.bak-v6") and upgrade.backup.exists()
    assert {run_id: r.run_id for run_id, r in found.items() if r} == {r: r for r, _ in rows}
    assert at == {raw: run_id for run_id, raw in rows}
    assert forgotten == {"eval-forgotten"}
    assert [r.run_id for r in by_prefix] == [NUL_RUN_ID]
    assert (daemon.pid, daemon.status, daemon.gate) == (7, "", GateState())
    db = sqlite3.connect(path)
    indexed = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    assert "runs_path_raw" not in indexed and "runs_path_key" in indexed
    assert db.execute("SELECT count(*) FROM runs WHERE run_key IS NULL").fetchone() == (0,)


def test_a_schema_6_shared_ledger_is_upgraded_by_migrate_keeping_its_runs(
    pg_url: str, local_platform, tmp_path: Path
):
    with old_shared(pg_url, 6) as connection:
        connection.execute(
            "INSERT INTO runs (run_id, path, path_raw, kind, state, evaluation_id, created_at, "
            "updated_at) VALUES (%s, '/runs/a', '/runs/a', 'eval', 'finalized', 'eval-0', 1, 1)",
            (MARKED_RUN_ID,),
        )
        connection.execute(
            "INSERT INTO forgotten (run_id, evaluation_id, at) VALUES (%s, 'eval-gone', 1)",
            (MARKED_RUN_ID,),
        )
    password_file = tmp_path / "pw"
    password_file.write_text(PASSWORD)
    environ = cli_environ(
        local_platform,
        tmp_path,
        EVALPUSH_LEDGER__URL=pg_url,
        EVALPUSH_LEDGER__PASSWORD_FILE=str(password_file),
    )

    before = evalpush(environ, "status")
    migrated = evalpush(environ, "migrate")
    again = evalpush(environ, "migrate")

    assert before.returncode != 0 and "`evalpush migrate` upgrades it" in before.stderr
    assert migrated.returncode == 0, migrated
    assert f"ledger upgraded 6 -> {SCHEMA_VERSION}" in migrated.stdout, migrated
    assert "nothing to do" in again.stdout
    with Ledger.shared(pg_url, password=PASSWORD) as ledger:
        (run,) = ledger.all()
        assert run.run_id == MARKED_RUN_ID and run.state == State.FINALIZED
        assert ledger.get_run(MARKED_RUN_ID) == run
        assert ledger.run_id_at(Path("/runs/a")) == MARKED_RUN_ID
        assert ledger.earlier_evaluations(run) == {"eval-gone"}
        assert ledger.daemons() == []  # the daemons' table has its schema 9 columns
        long = ledger.add(path="/runs/long", run_id=LONG_RUN_ID, kind="eval", state=State.READY)
        nul = ledger.add(path="/runs/nul", run_id=NUL_RUN_ID, kind="eval", state=State.READY)
        assert (ledger.get_run(LONG_RUN_ID), ledger.get_run(NUL_RUN_ID)) == (long, nul)
