"""What the local platform holds, as tests ask it: a run's evaluations, requests by kind."""

from __future__ import annotations

from typing import Any

from evalpush.local_platform import LocalPlatform


def evaluations_of(platform: LocalPlatform, run_id: str) -> dict[str, dict[str, Any]]:
    """The platform's evaluations of a run (by `metadata.run_id`): id -> summary."""
    return {
        key: evaluation
        for key, evaluation in platform.summary()["evaluations"].items()
        if evaluation["metadata"].get("run_id") == run_id
    }


def requests(platform: LocalPlatform, kind: str) -> int:
    """How many requests of `kind` (create, samples, finalize, ...) the platform has answered."""
    return platform.summary()["requests"].get(kind, 0)
