"""The run's aggregates as running sums (docs/TRACE_FORMAT.md section 6), and its summary.

`RunTotals` are sums over the good traces in file order, so a run of any size is totalled in
bounded memory and a resumed upload continues them from the ledger.
"""

from __future__ import annotations

import array
import base64
import math
import zlib
from collections.abc import Iterable
from typing import Any

import msgspec

from evalpush.convert.trace import Tally, Trace
from evalpush.runs import Run

_ENCODER = msgspec.json.Encoder()
RAW_DENSE_BYTES = 256
"""Rollout counts up to this size (64 tasks) are saved as they are: zlib sets up about 270 KB of
state per call, twice a run (4% of a one-trace run's instructions in `push`), to save a few
bytes here."""


class RolloutCounter:
    """Traces seen so far per task idx: what numbers each task's rollouts.

    Task idxs are nearly always 0..num_tasks-1, so their counts live in one flat array: no
    object per task, which over a run of a million lines would pin heap arenas among the
    transient garbage. Other idxs (negative, or past `DENSE_LIMIT`) go to a dict.
    """

    DENSE_LIMIT = 1 << 22

    def __init__(self, items: Iterable[tuple[int, int]] = ()):
        self._dense = array.array("I")
        self._sparse: dict[int, int] = {}
        self._distinct = 0
        for idx, count in items:
            self._set(idx, count)

    def to_state(self) -> dict[str, Any]:
        """A JSON-able form built without an object per task: the dense counts deflated (raw
        when they are `RAW_DENSE_BYTES` or fewer), then base64. It lives in the run's ledger row,
        which SQLite rewrites whole at every write of the row (two a batch), so its size is paid
        per batch in the ledger's page cache and writes. Raw it is 4 bytes a task (700 KB of
        base64 for 75,000 tasks); the counts are nearly all the run's rollouts per task, which
        deflate to a few hundred bytes."""
        raw = self._dense.tobytes()
        sparse = sorted(self._sparse.items())
        if len(raw) <= RAW_DENSE_BYTES:  # deflating a few bytes costs more than it saves
            return {"dense": base64.b64encode(raw).decode(), "sparse": sparse}
        return {"dense_deflated": base64.b64encode(zlib.compress(raw)).decode(), "sparse": sparse}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> RolloutCounter:
        """The counter `to_state` saved (its counts raw when few, else deflated)."""
        counter = cls((int(idx), count) for idx, count in state["sparse"])
        if "dense_deflated" in state:
            dense = zlib.decompress(base64.b64decode(state["dense_deflated"]))
        else:
            dense = base64.b64decode(state["dense"])
        counter._dense.frombytes(dense)
        counter._distinct += len(counter._dense) - counter._dense.count(0)
        return counter

    def count(self, idx: int) -> int:
        if 0 <= idx < len(self._dense):
            return self._dense[idx]
        return self._sparse.get(idx, 0)

    def add(self, idx: int) -> int:
        """Count one more trace of task `idx`; returns its count (its rollout number)."""
        dense = self._dense
        if 0 <= idx < len(dense):  # the common case, inline: this runs once per line
            number = dense[idx] + 1
            dense[idx] = number
            self._distinct += number == 1
            return number
        number = self.count(idx) + 1
        self._set(idx, number)
        return number

    def _set(self, idx: int, count: int) -> None:
        if self.count(idx) == 0 and count:
            self._distinct += 1
        if 0 <= idx < self.DENSE_LIMIT:
            if idx >= len(self._dense):
                grown = min(max(idx + 1, 2 * len(self._dense)), self.DENSE_LIMIT)
                self._dense.frombytes(bytes(self._dense.itemsize * (grown - len(self._dense))))
            self._dense[idx] = count
        else:
            self._sparse[idx] = count

    def __len__(self) -> int:
        """How many distinct tasks were seen."""
        return self._distinct

    def items(self) -> list[tuple[int, int]]:
        dense = [(idx, count) for idx, count in enumerate(self._dense) if count]
        return dense + sorted(self._sparse.items())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RolloutCounter) and self.items() == other.items()

    def __repr__(self) -> str:
        return f"RolloutCounter({len(self)} tasks)"


class RunTotals(msgspec.Struct):
    """Running sums over a run's good traces in file order (docs/TRACE_FORMAT.md section 6)."""

    traces: int = 0
    reward_sum: float = 0.0
    errored: int = 0
    metric_sums: dict[str, float] = msgspec.field(default_factory=dict)
    metric_counts: dict[str, int] = msgspec.field(default_factory=dict)
    rollouts: RolloutCounter = msgspec.field(default_factory=RolloutCounter)

    def add(self, trace: Trace | Tally) -> int:
        """Count a checked trace in; returns its rollout number within its task."""
        rewards, metrics = trace.rewards, trace.metrics
        self.traces += 1
        self.reward_sum += sum(rewards.values())
        self.errored += bool(trace.errors)
        sums, counts = self.metric_sums, self.metric_counts
        # A metric wins over a reward of the same name within a trace.
        for name, value in ({**rewards, **metrics} if metrics else rewards).items():
            sums[name] = sums.get(name, 0.0) + value
            counts[name] = counts.get(name, 0) + 1
        return self.rollouts.add(trace.idx)

    def metrics(self) -> dict[str, Any]:
        n = self.traces
        return {
            "avg_reward": self.reward_sum / n if n else 0.0,
            "avg_metrics": {k: s / self.metric_counts[k] for k, s in self.metric_sums.items()},
            "avg_error": self.errored / n if n else 0.0,
        }

    def to_json(self) -> bytes:
        # msgspec writes NaN/Infinity as null: keep them as text so a resumed sum stays non-finite
        state = {
            **msgspec.structs.asdict(self),
            "reward_sum": _float_text(self.reward_sum),
            "metric_sums": {k: _float_text(v) for k, v in self.metric_sums.items()},
            "rollouts": self.rollouts.to_state(),
        }
        return _ENCODER.encode(state)

    @classmethod
    def from_json(cls, data: bytes | str) -> RunTotals:
        state = msgspec.json.decode(data)
        state["reward_sum"] = float(state["reward_sum"])
        state["metric_sums"] = {k: float(v) for k, v in state["metric_sums"].items()}
        state["rollouts"] = RolloutCounter.from_state(state["rollouts"])
        return cls(**state)


def _float_text(value: float) -> float | str:
    """A finite float as is, else its text ("nan", "inf", "-inf"), which `float()` reads back."""
    return value if math.isfinite(value) else str(value)


def summary(run: Run, totals: RunTotals) -> dict[str, Any]:
    """Name, metadata and metrics of the run's evaluation (docs/TRACE_FORMAT.md section 6)."""
    metrics = totals.metrics()
    metadata = {
        "framework": "verifiers",
        "run_id": run.run_id,
        "model": run.model,
        "num_examples": len(totals.rollouts),
        "rollouts_per_example": run.num_rollouts,
        **metrics,
    }
    return {
        "name": run.evaluation_name,
        "run_id": run.run_id,
        "env_name": run.env_name,
        "metadata": metadata,
        "metrics": metrics,
    }
