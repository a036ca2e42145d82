"""Schema 13: `daemons.follows`, the roots under which a daemon follows runs while they are
written (a JSON list of each root's path bytes in hex; empty for a daemon that follows none), so
that `push` can tell a run some running daemon will go on following (its follower, or one
started since over the same tree) from a run nobody follows any more. NULL (no default) in the
row of a daemon of an older evalpush, which does not say: one still running over the upgraded
ledger (a `push` of the new version upgraded it before the service restarted) follows runs."""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"


def upgrade() -> None:
    op.add_column("daemons", sa.Column("follows", sa.Text))


def downgrade() -> None:
    op.drop_column("daemons", "follows")
