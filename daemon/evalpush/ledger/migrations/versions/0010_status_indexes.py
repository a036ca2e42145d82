"""Schema 10: the indexes `status` reads a ledger of a million runs through without reading
every row: runs by state in the order they were updated (`runs_state_updated`, which takes the
place of `runs_state`), the runs short of their expected traces (`runs_short`, partial); and,
in the file, the runs someone holds (`runs_claim_owner`, which PostgreSQL had from the start)."""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"

_SHORT = sa.text("expected_traces > samples_seen")
_HELD = sa.text("claim_owner IS NOT NULL")


def upgrade() -> None:
    op.drop_index("runs_state", table_name="runs")
    op.create_index("runs_state_updated", "runs", ["state", "updated_at"])
    op.create_index(
        "runs_short",
        "runs",
        ["state", "updated_at"],
        sqlite_where=_SHORT,
        postgresql_where=_SHORT,
    )
    if op.get_bind().dialect.name == "sqlite":
        op.create_index("runs_claim_owner", "runs", ["claim_owner"], sqlite_where=_HELD)
