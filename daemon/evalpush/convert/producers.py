"""The later producers' lines (docs/TRACE_FORMATS.md): verifiers 0.2's trace (`version` 2) and
0.3/0.4's episode, each recognised by its own markers and turned into what that version's own
push sends.

- `decode_line` decides what a line is: an object with a top-level `traces` is an episode,
  one with `version` 2 a 0.2 trace, anything else the seed's trace. One parse does it (`_Line`:
  the seed's trace plus those keys and the later producers' own parts, kept raw), so a seed
  line costs what it did; a later line's raw parts are then decoded from their bytes.
- A 0.2 trace decodes into the seed's `Trace` (its task row moved up from `task.data`), with its
  `calls` and `tools`; `sample.build_sample` derives its usage, truncation and token counts from
  the calls, as 0.2 does.
- An episode decodes into `Episode`; `episode_sample` projects it as 0.3/0.4 do: one sample per
  episode, the summary trace's fields (the first trainable trace, else the first) with the
  episode's id, the summary trace's agent, and the whole episode in `info.native_wrapper`.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from evalpush.convert.trace import (
    NULL,
    Call,
    NestedTooDeeply,
    Node,
    Tally,
    Trace,
    V2Trace,
    _check,
    _check_id,
    _check_idx,
    _decode,
    _describe,
    _scores,
    check_errors,
    check_parts,
    check_text,
    checked_tally,
    checked_trace,
)
from evalpush.core.errors import BadRecord


class _Line(Trace, gc=False):
    """Any producer's line in one parse: the seed's trace, plus the top-level keys that mark
    the later producers' lines (`traces`, `version`) and the parts only they have, kept raw (a
    seed line holds none of them, so it decodes and checks exactly as before)."""

    version: Any = None
    traces: msgspec.Raw = NULL
    calls: msgspec.Raw = NULL
    tools: msgspec.Raw = NULL
    ok: Any = None


_LINE = msgspec.json.Decoder(_Line)


class _TallyLine(Tally, gc=False):
    version: Any = None
    traces: msgspec.Raw = NULL


_TALLY_LINE = msgspec.json.Decoder(_TallyLine)


class _TaskRow(msgspec.Struct, gc=False):
    """`task` of a 0.2 trace or an episode: `{"type": ..., "data": {the row}}`."""

    data: dict[str, Any]


class _CallsTrace(msgspec.Struct, gc=False):
    """What 0.2's trace and 0.3/0.4's traces share: the task row under `task.data`, the model
    calls, the advertised tools."""

    id: str
    task: _TaskRow
    nodes: list[Node] = []
    calls: list[Call] = []
    tools: msgspec.Raw = NULL
    metrics: dict[str, float | None] = {}
    info: msgspec.Raw = msgspec.Raw(b"{}")
    is_completed: bool = False
    stop_condition: str | None = None
    errors: list[msgspec.Raw] = []
    timing: msgspec.Raw = msgspec.Raw(b"{}")


class Reward(msgspec.Struct, gc=False):
    """A 0.3/0.4 reward: its raw score and its weight (the trace's reward sums score * weight)."""

    score: float | None = None
    weight: float = 1.0


class Agent(msgspec.Struct, gc=False):
    name: str = "agent"
    trainable: bool = True


class Build(msgspec.Struct, gc=False):
    version: str = ""


class EpisodeTrace(_CallsTrace, gc=False):
    """One agent's trace inside an episode, as conversion reads it."""

    agent: Agent | None = None
    rewards: dict[str, Reward | None] = {}
    verifiers: Build | None = None

    @property
    def trainable(self) -> bool:
        return self.agent is None or self.agent.trainable

    @property
    def reward(self) -> float:
        """Score times weight, summed over the rewards that have a score (nulls left out)."""
        return sum(_value(r) for r in self.rewards.values() if r is not None)

    def scores(self) -> dict[str, float]:
        """Raw scores and metrics as the aggregates read them (nulls left out; a metric wins
        over a reward of the same name)."""
        values = {n: _score(r) for n, r in self.rewards.items() if r is not None}
        for name, value in self.metrics.items():
            if value is not None:
                values[name] = value
        return values


def _score(reward: Reward) -> float:
    return float("nan") if reward.score is None else reward.score


def _value(reward: Reward) -> float:
    return _score(reward) * reward.weight


class Episode(msgspec.Struct, gc=False):
    """A 0.3/0.4 line, as conversion reads it: one rollout of a task by one or more agents."""

    id: str
    ok: bool = False
    errors: list[msgspec.Raw] = []
    traces: list[EpisodeTrace] = []

    @property
    def summary_index(self) -> int:
        """The trace that stands for the episode: the first trainable one, else the first."""
        return next((i for i, t in enumerate(self.traces) if t.trainable), 0)

    @property
    def idx(self) -> int:
        """The summary trace's task idx (what numbers the episode's rollout)."""
        return self.traces[self.summary_index].task.data["idx"]


def _kind(line: _Line | _TallyLine) -> str:
    """ "episode", "v2" or "seed": what a decoded line is, by its producer's top-level markers."""
    if line.traces != NULL:
        return "episode"
    if line.version == 2 and type(line.version) is int:
        return "v2"
    return "seed"


def decode_line(data: bytes, number: int) -> Trace | Episode:
    """The line as a checked seed or 0.2 `Trace`, or a checked `Episode`; `BadRecord` names the
    first problem. One parse tells it apart and decodes the seed's whole; a later producer's
    parts, kept raw by it, are decoded from those bytes."""
    line = _decode(_LINE, data, number)
    kind = _kind(line)
    if kind == "seed":
        return checked_trace(line, data, number)
    check_text(data, number)
    if kind == "v2":
        return _v2_of(line, number)
    return _episode_of(line, number)


def decode_line_tally(data: bytes, number: int) -> Tally | Trace | Episode:
    """The tally's decode: the seed's lines only for what the totals need (as `decode_tally`);
    the later producers' lines fully, as `decode_line` (so the tally refuses exactly what the
    full check refuses for them)."""
    line = _decode(_TALLY_LINE, data, number)
    if _kind(line) == "seed":
        return checked_tally(line, number)
    return decode_line(data, number)


def _part(decoder: msgspec.json.Decoder, raw: msgspec.Raw, at: str, number: int) -> Any:
    """A raw part of the line (`at`, its key) decoded and checked by `decoder`."""
    try:
        return decoder.decode(raw)
    except RecursionError:
        raise NestedTooDeeply("nested too deeply", line=number) from None
    except msgspec.ValidationError as exc:
        message = str(exc).replace("`$", f"`$.{at}")
        if "- at `" not in message:
            message += f" - at `$.{at}`"
        raise BadRecord(_describe(msgspec.ValidationError(message)), line=number) from None


_CALLS = msgspec.json.Decoder(list[Call])


def _v2_of(line: _Line, number: int) -> V2Trace:
    row = line.task.get("data")
    if not isinstance(row, dict):
        raise BadRecord(
            "missing 'task.data'" if row is None else "'task.data' must be an object", line=number
        )
    if "idx" not in row:
        raise BadRecord("missing 'task.data.idx'", line=number)
    trace = V2Trace(
        id=line.id,
        task=row,
        nodes=line.nodes,
        rewards=_scores(line.rewards),
        metrics=_scores(line.metrics),
        info=line.info,
        is_completed=line.is_completed,
        stop_condition=line.stop_condition,
        errors=line.errors,
        timing=line.timing,
        calls=[] if line.calls == NULL else _part(_CALLS, line.calls, "calls", number),
        tools=line.tools,
    )
    _check(trace, number)
    return trace


_EPISODE_TRACES = msgspec.json.Decoder(list[EpisodeTrace])


def _episode_of(line: _Line, number: int) -> Episode:
    if line.ok is not None and type(line.ok) is not bool:
        raise BadRecord(f"'ok' must be a boolean, got {line.ok!r}"[:200], line=number)
    episode = Episode(
        id=line.id,
        ok=bool(line.ok),
        errors=line.errors,
        traces=_part(_EPISODE_TRACES, line.traces, "traces", number),
    )
    _check_episode(episode, number)
    return episode


def _check_episode(episode: Episode, number: int) -> None:
    _check_id(episode.id, number)
    check_errors(episode.errors, number)
    for i, trace in enumerate(episode.traces):
        at = f"traces[{i}]."
        _check_id(trace.id, number, at)
        if "idx" not in trace.task.data:
            raise BadRecord(f"missing '{at}task.data.idx'", line=number)
        _check_idx(trace.task.data["idx"], number, at)
        check_parts(trace, number, at)


# ---------------------------------------------------------------- episode -> sample

TRUNCATING_0_3 = frozenset(
    {"max_turns", "max_input_tokens", "max_output_tokens", "max_total_tokens", "context_length"}
)
TRUNCATING_0_4 = frozenset(
    {"max_turns", "max_input_tokens", "max_output_tokens", "max_total_tokens", "compaction_failed"}
)
_EXCLUDED_NODE_KEYS = (b'"routed_experts"', b'"sampling_mask"')
_EMPTY_CONTAINER = re.compile(rb"[\[{]\s*[\]}]")


def truncating_stops(trace: EpisodeTrace) -> frozenset[str]:
    """The stop conditions that mean truncated, as the trace's own verifiers version has them."""
    version = trace.verifiers.version if trace.verifiers is not None else ""
    return TRUNCATING_0_3 if version.startswith("0.3.") else TRUNCATING_0_4


def native_record(data: bytes) -> msgspec.Raw | dict[str, Any]:
    """The episode as its producer's `to_record` gives it: the line itself, but for the raw
    tensors (`routed_experts`, `sampling_mask` on nodes), which the record leaves out."""
    if not any(key in data for key in _EXCLUDED_NODE_KEYS):
        return msgspec.Raw(data)
    episode = msgspec.json.decode(data)
    for trace in episode.get("traces") or ():
        for node in trace.get("nodes") or ():
            if type(node) is dict:
                node.pop("routed_experts", None)
                node.pop("sampling_mask", None)
    return episode


def episode_sample(
    episode: Episode, rollout_number: int, data: bytes, trace_sample: Any
) -> dict[str, Any]:
    """The sample 0.3/0.4 send for an episode with traces: the summary trace's projection
    (`trace_sample`, the caller's, so the derived views live in one place) under the episode's
    id, with the whole episode in `info`."""
    index = episode.summary_index
    sample = trace_sample(episode.traces[index], rollout_number, episode.id)
    sample["sample_id"] = episode.id
    sample["info"] = {
        **(sample["info"] or {}),
        "native_wrapper": native_record(data),
        "native_trace_index": index,
    }
    return sample


def info_dict(raw: msgspec.Raw) -> dict[str, Any] | None:
    """A trace's info as the producer's `dict(trace.info) or None`."""
    return None if _EMPTY_CONTAINER.fullmatch(raw) else msgspec.json.decode(raw)


__all__ = [
    "Agent",
    "Episode",
    "EpisodeTrace",
    "Reward",
    "decode_line",
    "decode_line_tally",
    "episode_sample",
    "info_dict",
    "native_record",
    "truncating_stops",
]
