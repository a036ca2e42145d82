"""Schema 8: `expected_traces`, the traces a run's config.toml expects (NULL when it names no
count): `status` shows a partial run's sent of expected, and what is missing."""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"


def upgrade() -> None:
    op.add_column("runs", sa.Column("expected_traces", sa.BigInteger))
