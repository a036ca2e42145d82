"""Schema 4: `last_error_at`, when `last_error` was written. (SQLite only: a shared ledger
began at 6.)"""

from alembic import op

revision = "0004"
down_revision = "0003"


def upgrade() -> None:
    op.execute("ALTER TABLE runs ADD COLUMN last_error_at REAL")
