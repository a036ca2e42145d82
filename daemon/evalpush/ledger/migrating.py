"""How a ledger is brought to this evalpush's schema, on either store: by Alembic, from the
revisions in `evalpush/ledger/migrations/versions` (one per schema version, `0001` ... ).

- **A new ledger** is created from the tables as they are now (`evalpush.ledger.tables`) and
  stamped with the latest revision: Alembic's version table written with them, as Alembic's
  `stamp` writes it (`tests/test_migrations.py` holds the two the same), without loading
  Alembic and its revisions (a third of a second, which every first start on a box, and
  every test of a new state directory, would pay).
- **A ledger of an evalpush from before Alembic** has its schema version where that evalpush
  kept it (SQLite's `user_version`; a shared ledger's `evalpush_schema` table): it is stamped
  with the revision of that version, then upgraded like any other.
- **Every upgrade** runs in the one transaction the caller holds, which read the version
  first (`BEGIN IMMEDIATE` on the file; on PostgreSQL, a transaction begun under the advisory
  lock), so any number of processes and hosts may open an empty or an old ledger at once and
  each sees it wholly before or wholly after.
- The version is also written where an evalpush from before Alembic looks, so that one refuses
  a ledger newer than it knows instead of misreading it.

Alembic is loaded only to upgrade a ledger: seeing that one is current is one read of its
version table (`version`).
"""

from __future__ import annotations

import threading
from pathlib import Path

import sqlalchemy as sa

from evalpush.core.errors import LedgerError
from evalpush.ledger.tables import metadata

VERSIONS = Path(__file__).with_name("migrations") / "versions"
SCHEMA_VERSION = max(int(p.name[:4]) for p in VERSIONS.glob("[0-9][0-9][0-9][0-9]_*.py"))
"""The latest revision's number: this evalpush's schema version."""

_ALEMBIC = threading.Lock()
"""Alembic's `context` and `op` are module-wide proxies: one migration at a time in a process
(a daemon and a command in one process, or two ledgers, may open at once)."""
_ALEMBIC_VERSION = sa.Table(
    "alembic_version",
    sa.MetaData(),
    sa.Column("version_num", sa.String(32), nullable=False),
    sa.PrimaryKeyConstraint("version_num", name="alembic_version_pkc"),
)
"""Alembic's version table, as Alembic creates it: the ledger's revision."""
_LEGACY_PG = sa.Table(
    "evalpush_schema", sa.MetaData(), sa.Column("version", sa.Integer, nullable=False)
)


def revision(version: int) -> str:
    """The Alembic revision of schema version `version`."""
    return f"{version:04d}"


def version(connection: sa.Connection) -> int:
    """The ledger's schema version: its Alembic revision, else the version an evalpush from
    before Alembic wrote (0: a new ledger). `LedgerError` for a version this evalpush does not
    know (a newer evalpush's)."""
    found: list[str] = []
    if sa.inspect(connection).has_table("alembic_version"):
        found = connection.execute(sa.select(_ALEMBIC_VERSION.c.version_num)).scalars().all()
    if not found:
        legacy = _legacy_version(connection)
        if legacy > SCHEMA_VERSION:
            raise LedgerError(_newer(legacy))
        return legacy
    if len(found) != 1 or not found[0].isdigit() or int(found[0]) > SCHEMA_VERSION:
        raise LedgerError(_newer(", ".join(found)))
    return int(found[0])


def _newer(found: object) -> str:
    return (
        f"schema version {found} is newer than this evalpush knows ({SCHEMA_VERSION}): "
        "upgrade evalpush, or use the one that wrote it"
    )


def _legacy_version(connection: sa.Connection) -> int:
    """The schema version an evalpush from before Alembic wrote (0: none)."""
    if connection.dialect.name == "sqlite":
        return connection.exec_driver_sql("PRAGMA user_version").scalar_one()
    if not sa.inspect(connection).has_table("evalpush_schema"):
        return 0
    return connection.execute(sa.select(sa.func.max(_LEGACY_PG.c.version))).scalar() or 0


def upgrade(connection: sa.Connection, found: int) -> None:
    """Inside the caller's transaction, which read `found` (`version`) and holds the ledger
    against every other writer (see the module's docstring): the ledger brought from `found`
    to `SCHEMA_VERSION`."""
    if found == 0:
        metadata.create_all(connection)
        _ALEMBIC_VERSION.create(connection)
        connection.execute(sa.insert(_ALEMBIC_VERSION).values(version_num=revision(SCHEMA_VERSION)))
    else:  # from Alembic's revision, or the one of the version an older evalpush wrote
        from alembic import command
        from alembic.config import Config

        config = Config()
        config.set_main_option("script_location", str(VERSIONS.parent))
        config.attributes["connection"] = connection
        with _ALEMBIC:
            command.stamp(config, revision(found))
            command.upgrade(config, "head")
    _mark_for_older(connection)


def _mark_for_older(connection: sa.Connection) -> None:
    """The version where an evalpush from before Alembic reads it (it refuses a newer one)."""
    if connection.dialect.name == "sqlite":
        connection.exec_driver_sql(f"PRAGMA user_version = {SCHEMA_VERSION}")
        return
    _LEGACY_PG.create(connection, checkfirst=True)
    connection.execute(sa.delete(_LEGACY_PG))
    connection.execute(sa.insert(_LEGACY_PG).values(version=SCHEMA_VERSION))
