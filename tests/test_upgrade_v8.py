"""Schema 8: `expected_traces`, the traces a run's config expects (`status` shows a partial run
as such). A ledger of schema 7 is brought to it on each store, its rows kept with no expected
count: the SQLite file after a backup beside it (`state.db.bak-v7`), a shared ledger's database
by `migrate`."""

from __future__ import annotations

import time
from pathlib import Path

from evalpush.core.states import State
from evalpush.ledger import SCHEMA_VERSION, Ledger, default_path
from evalpush.ledger.tables import path_key, run_key
from support.commands import evalpush
from support.environ import cli_environ
from support.old_ledgers import old_file, old_shared
from support.postgres import PASSWORD

RUN_ID = "run-from-schema-7"


def test_a_schema_7_file_is_upgraded_after_a_backup_its_runs_with_no_expected_count(
    tmp_path: Path,
):
    path = default_path(tmp_path / "state")
    db = old_file(path, 7)
    db.execute(
        "INSERT INTO runs (run_id, run_key, path, path_raw, path_key, kind, state, evaluation_id, "
        "created_at, updated_at) VALUES (?, ?, '/runs/a', ?, ?, 'eval', 'finalized', 'e', ?, ?)",
        (
            RUN_ID,
            run_key(RUN_ID),
            b"/runs/a",
            path_key(b"/runs/a"),
            time.time(),
            time.time(),
        ),
    )
    db.close()

    with Ledger(path) as ledger:
        upgrade = ledger.upgrade
        run = ledger.get_run(RUN_ID)

    assert upgrade is not None and (upgrade.from_version, upgrade.to_version) == (7, SCHEMA_VERSION)
    assert upgrade.backup == path.with_name("state.db.bak-v7") and upgrade.backup.exists()
    assert run is not None and run.state == State.FINALIZED
    assert run.expected_traces is None and run.missing_traces(0) == 0


def test_a_schema_7_shared_ledger_is_upgraded_by_migrate_keeping_its_runs(
    pg_url: str, local_platform, tmp_path: Path
):
    with old_shared(pg_url, 7) as connection:
        connection.execute(
            "INSERT INTO runs (run_id, run_key, path, path_raw, path_key, kind, state, "
            "created_at, updated_at) VALUES (%s, %s, '/runs/a', '/runs/a', %s, 'eval', "
            "'finalized', 1, 1)",
            (RUN_ID, run_key(RUN_ID), path_key(b"/runs/a")),
        )
    password_file = tmp_path / "pw"
    password_file.write_text(PASSWORD)
    environ = cli_environ(
        local_platform,
        tmp_path,
        EVALPUSH_LEDGER__URL=pg_url,
        EVALPUSH_LEDGER__PASSWORD_FILE=str(password_file),
    )

    migrated = evalpush(environ, "migrate")

    assert (
        migrated.returncode == 0 and f"ledger upgraded 7 -> {SCHEMA_VERSION}" in migrated.stdout
    ), migrated
    with Ledger.shared(pg_url, password=PASSWORD) as ledger:
        (run,) = ledger.all()
        assert (run.run_id, run.expected_traces) == (RUN_ID, None)
        assert ledger.update(run, expected_traces=40).expected_traces == 40
