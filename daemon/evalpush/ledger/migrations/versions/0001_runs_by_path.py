"""Schema 1: runs keyed by path, with their set-aside records and history.

A ledger at this version was created by an evalpush before 0.2; a new ledger is created from
the tables as they are now (`evalpush.ledger.tables`) and starts at the latest revision, so
this one has nothing to do: it is where a ledger of schema 1 is stamped to be upgraded from.
"""

revision = "0001"
down_revision = None


def upgrade() -> None:
    pass
