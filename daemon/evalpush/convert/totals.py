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

from evalpush.convert.producers import Episode
from evalpush.convert.trace import Tally, Trace
from evalpush.runs import Producer, Run

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
    """Running sums over a run's good lines in file order (docs/TRACE_FORMAT.md section 6).

    A run of traces (the seed's, 0.2's): `traces` counts them, the sums are over them, `errored`
    counts those with errors. A run of episodes (0.3/0.4): `traces` counts the samples (the
    episodes with a trace), `episodes` every episode and `not_ok` those not ok (`avg_error`); the
    sums are over every trace of every episode (`all_traces` of them), and again over the
    trainable ones only (`trainable_*`), which the aggregates use when there are any."""

    traces: int = 0
    reward_sum: float = 0.0
    errored: int = 0
    metric_sums: dict[str, float] = msgspec.field(default_factory=dict)
    metric_counts: dict[str, int] = msgspec.field(default_factory=dict)
    rollouts: RolloutCounter = msgspec.field(default_factory=RolloutCounter)
    episodes: int = 0
    not_ok: int = 0
    all_traces: int = 0
    trainable_traces: int = 0
    trainable_reward_sum: float = 0.0
    trainable_metric_sums: dict[str, float] = msgspec.field(default_factory=dict)
    trainable_metric_counts: dict[str, int] = msgspec.field(default_factory=dict)

    def add(self, trace: Trace | Tally | Episode) -> int:
        """Count a checked line in; returns its rollout number within its task (0 for an
        episode with no trace: it has no sample)."""
        if type(trace) is Episode:
            return self._add_episode(trace)
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

    def _add_episode(self, episode: Episode) -> int:
        self.episodes += 1
        self.not_ok += not episode.ok
        for trace in episode.traces:
            reward, scores = trace.reward, trace.scores()
            self.all_traces += 1
            self.reward_sum += reward
            _add_scores(self.metric_sums, self.metric_counts, scores)
            if trace.trainable:
                self.trainable_traces += 1
                self.trainable_reward_sum += reward
                _add_scores(self.trainable_metric_sums, self.trainable_metric_counts, scores)
        if not episode.traces:
            return 0
        self.traces += 1
        return self.rollouts.add(episode.idx)

    def metrics(self) -> dict[str, Any]:
        if self.episodes:
            return self._episode_metrics()
        n = self.traces
        return {
            "avg_reward": self.reward_sum / n if n else 0.0,
            "avg_metrics": {k: s / self.metric_counts[k] for k, s in self.metric_sums.items()},
            "avg_error": self.errored / n if n else 0.0,
        }

    def _episode_metrics(self) -> dict[str, Any]:
        """0.3/0.4's aggregates: over the trainable traces, or every trace when none is
        trainable; `avg_error` the share of episodes not ok."""
        if self.trainable_traces:
            n, reward = self.trainable_traces, self.trainable_reward_sum
            sums, counts = self.trainable_metric_sums, self.trainable_metric_counts
        else:
            n, reward = self.all_traces, self.reward_sum
            sums, counts = self.metric_sums, self.metric_counts
        return {
            "avg_reward": reward / n if n else 0.0,
            "avg_metrics": {k: s / counts[k] for k, s in sums.items()},
            "avg_error": self.not_ok / self.episodes,
        }

    def to_json(self) -> bytes:
        # msgspec writes NaN/Infinity as null: keep them as text so a resumed sum stays non-finite
        state = {
            **msgspec.structs.asdict(self),
            "reward_sum": _float_text(self.reward_sum),
            "metric_sums": {k: _float_text(v) for k, v in self.metric_sums.items()},
            "rollouts": self.rollouts.to_state(),
        }
        if self.episodes:
            state["trainable_reward_sum"] = _float_text(self.trainable_reward_sum)
            state["trainable_metric_sums"] = {
                k: _float_text(v) for k, v in self.trainable_metric_sums.items()
            }
        else:  # a run of traces saves what it always did
            for key in _EPISODE_KEYS:
                del state[key]
        return _ENCODER.encode(state)

    @classmethod
    def from_json(cls, data: bytes | str) -> RunTotals:
        state = msgspec.json.decode(data)
        state["reward_sum"] = float(state["reward_sum"])
        state["metric_sums"] = {k: float(v) for k, v in state["metric_sums"].items()}
        state["rollouts"] = RolloutCounter.from_state(state["rollouts"])
        if "trainable_reward_sum" in state:
            state["trainable_reward_sum"] = float(state["trainable_reward_sum"])
            state["trainable_metric_sums"] = {
                k: float(v) for k, v in state["trainable_metric_sums"].items()
            }
        return cls(**state)


_EPISODE_KEYS = (
    "episodes",
    "not_ok",
    "all_traces",
    "trainable_traces",
    "trainable_reward_sum",
    "trainable_metric_sums",
    "trainable_metric_counts",
)


def _add_scores(sums: dict[str, float], counts: dict[str, int], scores: dict[str, float]) -> None:
    for name, value in scores.items():
        sums[name] = sums.get(name, 0.0) + value
        counts[name] = counts.get(name, 0) + 1


def _float_text(value: float) -> float | str:
    """A finite float as is, else its text ("nan", "inf", "-inf"), which `float()` reads back."""
    return value if math.isfinite(value) else str(value)


PRIME_RUNS_BOOKKEEPING = {"prime_runs": {"traces_episodes_written": 0}}
"""What prime-runs adds to a 0.4 run's metrics when its episodes went to the legacy samples
endpoint (no episode written to Prime Traces), as evalpush's do."""


def summary(run: Run, totals: RunTotals) -> dict[str, Any]:
    """Name, metadata and metrics of the run's evaluation (docs/TRACE_FORMAT.md section 6; a 0.4
    run's as prime-runs sends them, docs/TRACE_FORMATS.md)."""
    metrics = totals.metrics()
    if run.producer == Producer.EPISODES_0_4:
        # prime-runs' config document, plus the run id: evalpush finds its own evaluations by it
        metadata = {
            "model": run.model,
            "num_examples": len(totals.rollouts),
            "rollouts_per_example": run.num_rollouts,
            "run_id": run.run_id,
        }
        metrics = {**metrics, **PRIME_RUNS_BOOKKEEPING}
    else:
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
