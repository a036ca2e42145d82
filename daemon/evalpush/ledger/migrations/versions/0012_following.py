"""Schema 12: `following`, 1 while a run is followed: its evaluation was created while the run
was being written and is filled batch by batch as lines arrive, finalized once it is finished."""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"


def upgrade() -> None:
    op.add_column(
        "runs", sa.Column("following", sa.Integer, nullable=False, server_default=sa.text("0"))
    )


def downgrade() -> None:
    op.drop_column("runs", "following")
