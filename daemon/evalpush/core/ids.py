"""A run id as people read and type it: short, and still a prefix that `status`, `retry` and
`forget` find the run by."""

from __future__ import annotations

OFFLINE_RUN_PREFIX = "disabled-"
"""A verifiers 0.4 run that ran offline has a run id `disabled-<16 hex>`: no evaluation was
created."""
SHORT_CHARS = 8


def short_id(run_id: str) -> str:
    """The run id's first 8 characters; for an offline 0.4 run, its `disabled-` and 8 of its
    hex digits (the first 8 characters of every such run are the same)."""
    if run_id.startswith(OFFLINE_RUN_PREFIX):
        return run_id[: len(OFFLINE_RUN_PREFIX) + SHORT_CHARS]
    return run_id[:SHORT_CHARS]
