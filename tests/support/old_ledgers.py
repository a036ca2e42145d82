"""Ledgers as evalpushes from before Alembic left them, empty, at each schema version they
wrote: the file at 1 to 10 (`user_version`), a shared ledger at 6 to 10 (`evalpush_schema`).
The schemas are kept as SQL in tests/fixtures/ledgers, written by evalpush 0.4.0's own
statements before they were replaced by revisions; a test adds the rows it needs."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg

from support.postgres import PASSWORD

LEDGERS = Path(__file__).resolve().parent.parent / "fixtures" / "ledgers"
FILE_VERSIONS = range(1, 11)
SHARED_VERSIONS = range(6, 11)


def old_file(path: Path, version: int) -> sqlite3.Connection:
    """A ledger file at `path` of schema `version`; an open connection to add rows with."""
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, isolation_level=None)
    db.executescript((LEDGERS / f"file-v{version}.sql").read_text())
    return db


def old_shared(url: str, version: int) -> psycopg.Connection:
    """The shared ledger's tables of schema `version` in the (empty) database at `url`; an
    open connection (autocommit) to add rows with."""
    connection = psycopg.connect(url, password=PASSWORD, autocommit=True)
    connection.execute((LEDGERS / f"shared-v{version}.sql").read_text().encode())
    return connection
