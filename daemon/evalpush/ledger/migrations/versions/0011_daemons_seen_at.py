"""Schema 11: `daemons` by when each was last heard from: every heartbeat drops the rows of
daemons gone for a week, and `status` lists them the last heard from first."""

from alembic import op

revision = "0011"
down_revision = "0010"


def upgrade() -> None:
    op.create_index("daemons_seen_at", "daemons", ["seen_at"])


def downgrade() -> None:
    op.drop_index("daemons_seen_at", table_name="daemons")
