"""Schema 12: `following`, 1 while a run is followed: its evaluation was created while the run
was being written and is filled batch by batch as lines arrive, finalized once it is finished;
`followed_at`, when its last stretch of lines was acknowledged (`status` shows its age)."""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"


def upgrade() -> None:
    op.add_column(
        "runs", sa.Column("following", sa.Integer, nullable=False, server_default=sa.text("0"))
    )
    op.add_column("runs", sa.Column("followed_at", sa.Double))


def downgrade() -> None:
    op.drop_column("runs", "followed_at")
    op.drop_column("runs", "following")
