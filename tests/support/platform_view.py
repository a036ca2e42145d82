"""What the local platform holds, as tests ask it: a run's evaluations, requests by kind."""

from __future__ import annotations

from typing import Any

import httpx

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


def stored(platform: LocalPlatform, evaluation_id: str) -> dict[str, Any]:
    """The evaluation as the platform holds it, every field (its own `GET /evaluations/{id}`)."""
    headers = {"Authorization": f"Bearer {platform.api_key}"} if platform.api_key else {}
    url = f"{platform.base_url}/api/v1/evaluations/{evaluation_id}"
    answer = httpx.get(url, headers=headers)
    answer.raise_for_status()
    return answer.json()
