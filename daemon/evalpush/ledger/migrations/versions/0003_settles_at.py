"""Schema 3: `settles_at`, when a waiting run becomes ready by the settle rule if its file does
not grow again; an index on `state`. (SQLite only: a shared ledger began at 6.)"""

from alembic import op

revision = "0003"
down_revision = "0002"


def upgrade() -> None:
    op.execute("ALTER TABLE runs ADD COLUMN settles_at REAL")
    op.execute("CREATE INDEX runs_state ON runs (state)")
