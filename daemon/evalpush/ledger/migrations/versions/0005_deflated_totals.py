"""Schema 5: no table changes. A run's `totals` may hold its rollout counts deflated (over 256
bytes raw), which an evalpush of schema 4 would fail on mid-upload: the version makes it refuse
the file at once instead, naming it. Counts saved raw still read."""

revision = "0005"
down_revision = "0004"


def upgrade() -> None:
    pass
