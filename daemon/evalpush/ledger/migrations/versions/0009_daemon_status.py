"""Schema 9: a daemon's STATUS line and its gate (as JSON) in its `daemons` row, where `status`
reads them on either store."""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"


def upgrade() -> None:
    op.add_column("daemons", sa.Column("status", sa.Text, nullable=False, server_default=""))
    op.add_column("daemons", sa.Column("gate", sa.Text, nullable=False, server_default="{}"))
