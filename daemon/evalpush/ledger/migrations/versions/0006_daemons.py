"""Schema 6: `daemons`, a row per daemon that used the ledger with its heartbeat. (A shared
ledger began here, created with every table at once.)"""

from alembic import op

revision = "0006"
down_revision = "0005"


def upgrade() -> None:
    op.execute("""
    CREATE TABLE daemons (
        id text PRIMARY KEY,
        host text NOT NULL,
        pid integer NOT NULL,
        version text NOT NULL,
        observer text NOT NULL DEFAULT '',
        started_at double precision NOT NULL,
        seen_at double precision NOT NULL,
        lease_seconds double precision NOT NULL,
        stopped_at double precision
    )""")
