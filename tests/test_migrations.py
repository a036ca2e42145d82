"""The ledger's upgrade path: Alembic revisions on both stores, from a ledger of any schema an
evalpush from before Alembic wrote (kept in tests/fixtures/ledgers) and from an Alembic one.

An upgraded ledger must have what a new one has: the same tables, columns and indexes (by
their columns and uniqueness: a file from before schema 7 keeps `run_key`'s uniqueness as a
constraint of its table, a new one as the index `runs_run_key`; both refuse a second row).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config

from evalpush.core.errors import LedgerError
from evalpush.ledger import SCHEMA_VERSION, Ledger, default_path
from evalpush.ledger.migrating import VERSIONS, revision
from support.old_ledgers import FILE_VERSIONS, SHARED_VERSIONS, old_file, old_shared
from support.postgres import PASSWORD

LATEST_TABLE, LATEST_COLUMN = "daemons", "follows"  # what the latest revision adds
"""What the latest revision adds (`0011`): applied by Alembic to a ledger it stamped before."""


def shape(ledger: Ledger) -> dict[str, tuple[set[str], set[tuple[tuple[str, ...], bool]]]]:
    """Each table's columns, and its indexes and unique constraints as (columns, unique)."""

    def read(connection: sa.Connection) -> dict:
        inspector = sa.inspect(connection)
        found = {}
        for table in inspector.get_table_names():
            indexed = {
                (tuple(i["column_names"]), bool(i["unique"])) for i in inspector.get_indexes(table)
            }
            indexed |= {
                (tuple(u["column_names"]), True) for u in inspector.get_unique_constraints(table)
            }
            columns = {c["name"] for c in inspector.get_columns(table)}
            found[table] = (columns, indexed)
        return found

    with ledger._lock:
        return read(ledger._file.sql)


def column_names(ledger: Ledger, table: str) -> set[str]:
    with ledger._lock:
        return {c["name"] for c in sa.inspect(ledger._file.sql).get_columns(table)}


def alembic_config(connection: sa.Connection) -> Config:
    config = Config()
    config.set_main_option("script_location", str(VERSIONS.parent))
    config.attributes["connection"] = connection
    return config


@pytest.fixture
def new_file_shape(tmp_path: Path) -> dict:
    with Ledger(default_path(tmp_path / "new")) as ledger:
        return shape(ledger)


@pytest.mark.parametrize("version", FILE_VERSIONS)
def test_a_file_of_each_schema_before_alembic_is_upgraded_to_the_tables_of_a_new_one(
    tmp_path: Path, version: int, new_file_shape: dict
):
    path = default_path(tmp_path / "state")
    old_file(path, version).close()

    with Ledger(path) as ledger:
        upgrade = ledger.upgrade
        upgraded = shape(ledger)
        record = ledger.add(path="/runs/a", run_id="run-a", kind="eval", state="ready")
        assert ledger.get_run("run-a") == record

    assert upgrade is not None and (upgrade.from_version, upgrade.to_version) == (
        version,
        SCHEMA_VERSION,
    )
    assert upgraded == new_file_shape


@pytest.mark.parametrize("version", SHARED_VERSIONS)
def test_a_shared_ledger_of_each_schema_before_alembic_is_upgraded_to_the_tables_of_a_new_one(
    postgres, version: int
):
    new_url, old_url = postgres.database(), postgres.database()
    with Ledger.shared(new_url, password=PASSWORD) as ledger:
        new_shape = shape(ledger)
    old_shared(old_url, version).close()

    with Ledger.shared(old_url, password=PASSWORD) as ledger:
        upgrade = ledger.upgrade
        upgraded = shape(ledger)

    assert upgrade is not None and (upgrade.from_version, upgrade.to_version) == (
        version,
        SCHEMA_VERSION,
    )
    assert upgraded == new_shape


def test_a_revision_is_applied_by_alembic_to_a_ledger_it_stamped_before_on_each_store(
    ledger: Ledger,
):
    assert LATEST_COLUMN in column_names(ledger, LATEST_TABLE)
    with ledger._transaction() as db:  # the ledger as the revision before the latest left it
        command.downgrade(alembic_config(db), revision(SCHEMA_VERSION - 1))
    assert LATEST_COLUMN not in column_names(ledger, LATEST_TABLE)

    again = (
        Ledger(ledger.path)
        if ledger.server is None
        else Ledger.shared(ledger.server.url, password=PASSWORD)
    )
    with again:
        upgrade = again.upgrade
        columns = column_names(again, LATEST_TABLE)

    assert upgrade is not None
    assert (upgrade.from_version, upgrade.to_version) == (SCHEMA_VERSION - 1, SCHEMA_VERSION)
    assert LATEST_COLUMN in columns


def test_the_row_of_a_daemon_of_schema_12_running_on_after_the_upgrade_follows_every_root(
    ledger: Ledger,
):
    """`pip install -U` then a `push` before the service restarts: the push upgrades the ledger
    under a daemon of the release before, which goes on following runs and writing its
    heartbeat row without the roots it follows. Its row, from before the upgrade or written by
    it since, must not read as a daemon following nothing (the push then finalized a run it
    followed short, and that daemon superseded it: two COMPLETED); it is taken to follow every
    root, as that release's push took it."""
    old_row = (
        "INSERT INTO daemons (id, host, pid, version, observer, started_at, seen_at, "
        "lease_seconds, status, gate) VALUES (:id, 'other-host', 7, '0.4.0', 'inotify', "
        ":now, :now, 60, '', '{}')"
    )
    now = time.time()
    with ledger._transaction() as db:
        command.downgrade(alembic_config(db), revision(12))
        db.execute(sa.text(old_row), {"id": "other-host/b/n/7/1", "now": now})
    again = (
        Ledger(ledger.path)
        if ledger.server is None
        else Ledger.shared(ledger.server.url, password=PASSWORD)
    )
    with again:
        with again._transaction() as db:  # its first heartbeat after the upgrade: a new row
            db.execute(sa.text(old_row), {"id": "other-host/b/n/7/2", "now": now})
        daemons = again.daemons()

    assert len(daemons) == 2
    assert all(daemon.follows_run_at(b"/any/root/gsm8k--m/0f1e2d3c") for daemon in daemons)


def test_a_file_stamped_by_a_newer_evalpush_is_refused_naming_its_revision(tmp_path: Path):
    path = default_path(tmp_path / "state")
    with Ledger(path) as ledger, ledger._transaction() as db:
        db.execute(sa.text("UPDATE alembic_version SET version_num = '0999'"))

    with pytest.raises(LedgerError, match=f"{path}: schema version 0999 is newer"):
        Ledger(path)


VERSION = "alembic_version"


def version_table(connection: sa.Connection) -> tuple:
    """Alembic's version table as a store holds it: columns, primary key, rows."""
    inspector = sa.inspect(connection)
    columns = [(c["name"], str(c["type"]), c["nullable"]) for c in inspector.get_columns(VERSION)]
    key = inspector.get_pk_constraint(VERSION)
    rows = connection.execute(sa.text(f"SELECT version_num FROM {VERSION}")).all()
    return columns, (key["name"], key["constrained_columns"]), [tuple(r) for r in rows]


def test_a_new_ledger_is_stamped_as_alembic_stamps_one_on_each_store(
    ledger: Ledger, tmp_path: Path
):
    if ledger.server is None:
        engine = sa.create_engine(f"sqlite:///{tmp_path / 'stamped.db'}")
    else:
        url = ledger.server.url.replace("postgresql://", "postgresql+psycopg://", 1)
        engine = sa.create_engine(url, connect_args={"password": PASSWORD})
        with engine.begin() as db:  # an empty schema of its own in the same database
            db.execute(sa.text("CREATE SCHEMA stamped"))
    with engine.begin() as db:
        if ledger.server is not None:
            db.execute(sa.text("SET search_path TO stamped"))
        command.stamp(alembic_config(db), "head")
        by_alembic = version_table(db)
    engine.dispose()

    with ledger._lock:
        ours = version_table(ledger._file.sql)

    assert ours == by_alembic
    assert ours[2] == [(revision(SCHEMA_VERSION),)]
