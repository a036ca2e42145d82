"""The convert stage: one trace line -> one platform sample, and the run's aggregates.

The rules are TRACE_FORMAT.md sections 4-6, which restate what verifiers' own push does, so a
run uploaded by evalpush looks exactly like one the eval pushed itself.

Speed (the hot path of the daemon): each line is decoded by msgspec into a `Trace` that names
only what conversion reads, so types are checked in C and everything else is skipped unread.
Messages stay raw JSON and go into the sample byte for byte; token ids and masks stay raw and
are only counted. `decode_trace` adds the checks types cannot express (task.idx, the graph),
and every failure is a `BadRecord` naming the line and the reason. Aggregates are running sums
(`RunTotals`), so a run of any size converts in bounded memory and a resumed upload continues
the sums from the ledger.

Not-finite numbers: a `NaN`/`Infinity` literal (not JSON, but Python's json writes it) is
accepted, and so is a `null` reward or metric (what pydantic writes for NaN); both count as
NaN and go out as `null`.
"""

from __future__ import annotations

import array
import base64
import json
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import msgspec

from evalpush.config import Config
from evalpush.errors import BadRecord, RunError
from evalpush.read import Line, read_lines
from evalpush.runs import Run, load_run

TRUNCATING_STOP_CONDITIONS = frozenset(
    {
        "max_turns",
        "max_input_tokens",
        "max_output_tokens",
        "max_total_tokens",
        "context_length",
        "harness_timeout",
    }
)
OPTIONAL_USAGE_FIELDS = ("cached_input_tokens", "reasoning_tokens", "cost")
NAN = float("nan")

MAX_DEPTH = 1024
"""Deepest nesting the lenient parse accepts (msgspec's parser stops a little earlier, at
Python's recursion limit: either way the line is refused as nested too deeply)."""


# ---------------------------------------------------------------- the trace line, as typed


# gc=False: these hold no reference cycles, and untracked objects spare the collector work on
# every line.
class Usage(msgspec.Struct, gc=False):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_input_tokens: int | None = None
    reasoning_tokens: int | None = None
    cost: float | None = None


_EMPTY_OBJECT = msgspec.Raw(b"{}")


class Node(msgspec.Struct, gc=False):
    """A MessageNode. `message` stays raw JSON, passed through to the sample untouched."""

    message: msgspec.Raw
    parent: int | None = None
    sampled: bool = False
    token_ids: list[int] = []
    mask: list[bool] = []
    finish_reason: str | None = None
    usage: Usage | None = None


class Trace(msgspec.Struct, gc=False):
    """What conversion reads of a trace line; keys it does not name are skipped unread."""

    id: str
    task: dict[str, Any]
    nodes: list[Node] = []
    rewards: dict[str, float | None] = {}
    metrics: dict[str, float | None] = {}
    info: msgspec.Raw = _EMPTY_OBJECT
    is_completed: bool = False
    stop_condition: str | None = None
    errors: list[msgspec.Raw] = []
    timing: msgspec.Raw = _EMPTY_OBJECT


_DECODER = msgspec.json.Decoder(Trace)
_ENCODER = msgspec.json.Encoder()
_EMPTY_CONTAINER = re.compile(rb"[\[{]\s*[\]}]")
_NULL = re.compile(rb"null")


# ---------------------------------------------------------------- parsing and checking


def decode_trace(data: bytes, number: int) -> Trace:
    """The line as a checked `Trace`; `BadRecord` names the first problem."""
    try:
        trace = _DECODER.decode(data)
    except msgspec.ValidationError as exc:
        raise BadRecord(_describe(exc), line=number) from None
    except msgspec.DecodeError:
        trace = _decode_lenient(data, number)
    except RecursionError:
        raise BadRecord("nested too deeply", line=number) from None
    if not data.isascii():
        # Raw fields (messages, info) are not checked by the decoder: a bad byte there would
        # reach the platform and get the whole batch refused.
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadRecord(f"not UTF-8 (byte {exc.start})", line=number) from None
    _check(trace, number)
    trace.rewards = _scores(trace.rewards)
    trace.metrics = _scores(trace.metrics)
    return trace


_MISSING = re.compile(
    r"Object missing required field `(?P<field>[^`]+)`(?: - at `\$(?P<at>[^`]*)`)?"
)
_WRONG_TYPE = re.compile(
    r"Expected `(?P<want>[^`]+)`, got `(?P<got>[^`]+)`(?: - at `\$(?P<at>[^`]*)`)?"
)
_KINDS = {
    "object": "an object",
    "array": "a list",
    "str": "a string",
    "int": "an integer",
    "float": "a number",
    "bool": "a boolean",
    "null": "null",
}


def _kind(name: str) -> str:
    names = [part for part in name.split(" | ") if part != "null"] or ["null"]
    return " or ".join(_KINDS.get(part, part) for part in names)


def _describe(exc: msgspec.ValidationError) -> str:
    """msgspec's validation message in the words of the rest of the daemon's reasons."""
    message = str(exc)
    if missing := _MISSING.fullmatch(message):
        at = (missing["at"] or "").lstrip(".")
        return f"missing '{at + '.' if at else ''}{missing['field']}'"
    if wrong := _WRONG_TYPE.fullmatch(message):
        at, want, got = (wrong["at"] or "").lstrip("."), _kind(wrong["want"]), _kind(wrong["got"])
        if not at:
            got = {"a list": "an array"}.get(got, got)
            return f"the line is {got}, not a JSON object"
        if at.endswith("[...]"):
            return f"a value in '{at[:-5]}' must be {want}, got {got}"
        return f"'{at}' must be {want}, got {got}"
    return message


def _decode_lenient(data: bytes, number: int) -> Trace:
    """Python's parser, which also takes NaN/Infinity literals: non-finite numbers become
    null (what goes out for them anyway), then the line is decoded as usual."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRecord(f"not UTF-8 (byte {exc.start})", line=number) from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadRecord(f"invalid JSON: {exc.msg} at column {exc.colno}", line=number) from None
    except RecursionError:
        value = None
    if value is None or _deeper_than(value, MAX_DEPTH):
        raise BadRecord(f"invalid JSON: nested too deeply (over {MAX_DEPTH} levels)", line=number)
    try:
        strict = json.dumps(_finite(value), allow_nan=False).encode()
        return _DECODER.decode(strict)
    except msgspec.ValidationError as exc:
        raise BadRecord(_describe(exc), line=number) from None
    except RecursionError:
        raise BadRecord("nested too deeply", line=number) from None
    except (msgspec.DecodeError, ValueError) as exc:
        raise BadRecord(f"invalid JSON: {exc}", line=number) from None


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether `value` nests containers more than `limit` deep (iterative: no recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if type(item) is dict else item if type(item) is list else ()
        for child in children:
            if type(child) in (dict, list):
                if depth + 1 > limit:
                    return True
                stack.append((child, depth + 1))
    return False


def _finite(value: Any) -> Any:
    """`value` with non-finite floats as None."""
    kind = type(value)
    if kind is float:
        return value if math.isfinite(value) else None
    if kind is dict:
        return {k: _finite(v) for k, v in value.items()}
    if kind is list:
        return [_finite(v) for v in value]
    return value


def _check(trace: Trace, number: int) -> None:
    """What the types alone do not say: task.idx, raw shapes, and the graph."""
    if not trace.id:
        raise BadRecord("'id' must be a non-empty string", line=number)
    if "idx" not in trace.task:
        raise BadRecord("missing 'task.idx'", line=number)
    if type(trace.task["idx"]) is not int:
        raise BadRecord(
            f"'task.idx' must be an integer, got {trace.task['idx']!r}"[:200], line=number
        )
    for name, raw in (("info", trace.info), ("timing", trace.timing)):
        if memoryview(raw)[:1] != b"{":
            raise BadRecord(f"'{name}' must be an object", line=number)
    for i, raw in enumerate(trace.errors):
        if memoryview(raw)[:1] != b"{":
            raise BadRecord(f"'errors[{i}]' must be an object", line=number)
    count = len(trace.nodes)
    forward_only = True  # every parent precedes its child: then no cycle is possible
    for i, node in enumerate(trace.nodes):
        if memoryview(node.message)[:1] != b"{":
            raise BadRecord(f"'nodes[{i}].message' must be an object", line=number)
        parent = node.parent
        if parent is not None:
            if not 0 <= parent < count:
                raise BadRecord(f"'nodes[{i}].parent' {parent} is out of range", line=number)
            if parent >= i:
                forward_only = False
    if not forward_only:
        _check_acyclic([node.parent for node in trace.nodes], number)


def _check_acyclic(parents: list[int | None], number: int) -> None:
    """Every parent chain reaches a root: O(n) with the chains already proven."""
    reaches_root = [False] * len(parents)
    for i in range(len(parents)):
        chain: list[int] = []
        on_chain: set[int] = set()
        j: int | None = i
        while j is not None and not reaches_root[j]:
            if j in on_chain:
                raise BadRecord(f"'nodes' parent links form a cycle through node {j}", line=number)
            chain.append(j)
            on_chain.add(j)
            j = parents[j]
        for k in chain:
            reaches_root[k] = True


# ---------------------------------------------------------------- derived views


def _without_nulls(value: dict[str, Any]) -> dict[str, Any]:
    """An object with null-valued keys dropped at every depth (as exclude_none does)."""
    out = {}
    for key, item in value.items():
        if item is None:
            continue
        kind = type(item)
        if kind is dict:
            item = _without_nulls(item)
        elif kind is list:
            item = [_without_nulls(x) if type(x) is dict else x for x in item]
        out[key] = item
    return out


def _top_level_without_nulls(raw: msgspec.Raw) -> msgspec.Raw | dict[str, Any]:
    """A raw object with its null-valued keys dropped; only the top level (messages, errors):
    the producer writes lines with model nulls already excluded, so a nested null belongs to a
    free-form field (e.g. `provider_state`) that the producer keeps as it is. The raw bytes
    pass through untouched when there is no null at all."""
    if not _NULL.search(raw):
        return raw
    value = msgspec.json.decode(raw)
    return {k: v for k, v in value.items() if v is not None}


def _all_without_nulls(raw: msgspec.Raw) -> msgspec.Raw | dict[str, Any]:
    """A raw object with null-valued keys dropped at every depth (timing: spans are models)."""
    return _without_nulls(msgspec.json.decode(raw)) if _NULL.search(raw) else raw


def _input_tokens(path: list[int], tokens: list[int], masked: list[int], usages: list[Any]) -> int:
    """Tokens on the path minus the last masked node's (the prompt of the final turn); else
    the input size of the last usage on the path; else 0."""
    total = sum(tokens[i] for i in path)
    last = next((masked[i] for i in reversed(path) if masked[i]), 0)
    if total - last:
        return total - last
    usage = next((usages[i] for i in reversed(path) if usages[i] is not None), None)
    if usage is None:
        return 0
    return usage.prompt_tokens + (usage.cached_input_tokens or 0)


def _output_tokens(path: list[int], masked: list[int], usages: list[Any]) -> int:
    """Masked (sampled) tokens on the path; else the completion tokens of its usages."""
    total = sum(masked[i] for i in path)
    if total:
        return total
    return sum(usages[i].completion_tokens for i in path if usages[i] is not None)


def trajectory(nodes: list[Node]) -> list[dict[str, Any]]:
    """One entry per branch (root -> leaf path), in ascending leaf order (section 4)."""
    parents = [node.parent for node in nodes]
    messages = [_top_level_without_nulls(node.message) for node in nodes]
    tokens = [len(node.token_ids) for node in nodes]
    masked = [node.mask.count(True) for node in nodes]
    usages = [node.usage for node in nodes]
    if parents == _chain(len(nodes)):  # the common case: one linear conversation
        paths: list[list[int]] = [list(range(len(nodes)))] if nodes else []
    else:
        paths = [_path_to(leaf, parents) for leaf in _leaves(parents)]
    return [
        {
            "messages": [messages[i] for i in path],
            "num_input_tokens": _input_tokens(path, tokens, masked, usages),
            "num_output_tokens": _output_tokens(path, masked, usages),
        }
        for path in paths
    ]


_CHAINS: dict[int, list[int | None]] = {}


def _chain(length: int) -> list[int | None]:
    """The parents of a linear conversation of `length` nodes: [None, 0, 1, ...]."""
    chain = _CHAINS.get(length)
    if chain is None:
        chain = [None, *range(length - 1)] if length else []
        if length <= 4096:
            _CHAINS[length] = chain
    return chain


def _leaves(parents: list[int | None]) -> list[int]:
    has_child = set(parents)
    return [i for i in range(len(parents)) if i not in has_child]


def _path_to(leaf: int, parents: list[int | None]) -> list[int]:
    """Root -> leaf node indices (the graph is checked acyclic before this runs)."""
    path = []
    i: int | None = leaf
    while i is not None:
        path.append(i)
        i = parents[i]
    path.reverse()
    return path


def usage_total(usages: list[Usage]) -> dict[str, Any] | None:
    """Summed usage, fields no usage reports left out; None when there is no usage at all."""
    if not usages:
        return None
    prompt = completion = 0
    cached = reasoning = cost = None
    for u in usages:  # one pass, summing in the same order as the producer
        prompt += u.prompt_tokens
        completion += u.completion_tokens
        if u.cached_input_tokens is not None:
            cached = u.cached_input_tokens + (cached or 0)
        if u.reasoning_tokens is not None:
            reasoning = u.reasoning_tokens + (reasoning or 0)
        if u.cost is not None:
            cost = u.cost if cost is None else cost + u.cost
    total: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion}
    for key, value in zip(OPTIONAL_USAGE_FIELDS, (cached, reasoning, cost), strict=True):
        if value is not None:
            total[key] = value
    return total


def is_truncated(trace: Trace) -> bool:
    if trace.stop_condition in TRUNCATING_STOP_CONDITIONS:
        return True
    for node in reversed(trace.nodes):
        if node.sampled:
            return node.finish_reason == "length"
    return False


def _scores(scores: dict[str, float | None]) -> dict[str, float]:
    """Scores with null (how pydantic writes NaN) read as NaN."""
    if None in scores.values():
        return {k: NAN if v is None else v for k, v in scores.items()}
    return scores  # type: ignore[return-value]


# ---------------------------------------------------------------- the sample


def build_sample(trace: Trace, rollout_number: int) -> dict[str, Any]:
    """The platform sample of a checked trace (TRACE_FORMAT.md section 5)."""
    branches = trajectory(trace.nodes)
    task = trace.task
    if None in task.values():
        task = {k: v for k, v in task.items() if v is not None}
    errors = trace.errors
    rewards = trace.rewards
    sample = {
        "sample_id": trace.id,
        "example_id": task["idx"],
        "rollout_number": rollout_number,
        "task": task,
        "prompt": [],
        "completion": branches[-1]["messages"] if branches else [],
        "answer": task.get("answer"),
        "reward": sum(rewards.values()),
        "timing": _all_without_nulls(trace.timing),
        "is_completed": trace.is_completed,
        "is_truncated": is_truncated(trace),
        "metrics": trace.metrics,
        "error": _top_level_without_nulls(errors[-1]) if errors else None,
        "stop_condition": trace.stop_condition,
        "trajectory": branches,
        "token_usage": usage_total([n.usage for n in trace.nodes if n.usage is not None]),
        "info": None if _EMPTY_CONTAINER.fullmatch(trace.info) else trace.info,
    }
    for name, value in rewards.items():
        sample.setdefault(name, value)
    return sample


def encode_sample(sample: dict[str, Any], number: int) -> bytes:
    """The sample as JSON (non-finite floats as null)."""
    try:
        return _ENCODER.encode(sample)
    except (msgspec.EncodeError, OverflowError, RecursionError) as exc:
        raise BadRecord(f"cannot be encoded as JSON: {exc}", line=number) from None


# ---------------------------------------------------------------- the run's aggregates


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
        """A JSON-able form built without an object per task (the dense counts as base64)."""
        dense = base64.b64encode(self._dense.tobytes()).decode()
        return {"dense": dense, "sparse": sorted(self._sparse.items())}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> RolloutCounter:
        counter = cls((int(idx), count) for idx, count in state["sparse"])
        counter._dense.frombytes(base64.b64decode(state["dense"]))
        counter._distinct += len(counter._dense) - counter._dense.count(0)
        return counter

    def count(self, idx: int) -> int:
        if 0 <= idx < len(self._dense):
            return self._dense[idx]
        return self._sparse.get(idx, 0)

    def add(self, idx: int) -> int:
        """Count one more trace of task `idx`; returns its count (its rollout number)."""
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


@dataclass
class RunTotals:
    """Running sums over a run's good traces in file order (TRACE_FORMAT.md section 6)."""

    traces: int = 0
    reward_sum: float = 0.0
    errored: int = 0
    metric_sums: dict[str, float] = field(default_factory=dict)
    metric_counts: dict[str, int] = field(default_factory=dict)
    rollouts: RolloutCounter = field(default_factory=RolloutCounter)

    def add(self, trace: Trace) -> int:
        """Count a checked trace in; returns its rollout number within its task."""
        rewards = trace.rewards
        self.traces += 1
        self.reward_sum += sum(rewards.values())
        self.errored += bool(trace.errors)
        for name, value in {**rewards, **trace.metrics}.items():
            self.metric_sums[name] = self.metric_sums.get(name, 0.0) + value
            self.metric_counts[name] = self.metric_counts.get(name, 0) + 1
        return self.rollouts.add(trace.task["idx"])

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
            **self.__dict__,
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
    """Name, metadata and metrics of the run's evaluation (TRACE_FORMAT.md section 6)."""
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


# ---------------------------------------------------------------- a run, line by line


@dataclass(frozen=True, slots=True)
class SetAside:
    """A record that could not be uploaded, kept for a person to see and retry."""

    line: int
    offset: int
    reason: str
    size: int

    def to_dict(self) -> dict[str, Any]:
        return {"line": self.line, "offset": self.offset, "reason": self.reason, "size": self.size}


@dataclass(frozen=True, slots=True)
class Converted:
    line: Line
    sample: bytes  # the encoded sample


def _checked(line: Line, max_line_bytes: int) -> Trace | SetAside | None:
    """The line's checked trace, its SetAside record, or None for a blank line."""
    if line.data is None:
        reason = f"line longer than read.max_line_bytes ({max_line_bytes} bytes)"
        return SetAside(line.number, line.start, reason, line.end - line.start)
    if not line.data.strip():
        return None  # a blank line is no record (the producer skips them too)
    try:
        trace = decode_trace(line.data, line.number)
    except BadRecord as exc:
        return SetAside(line.number, line.start, exc.reason, line.end - line.start)
    return trace


def convert_lines(
    lines: Iterator[Line], totals: RunTotals, *, max_line_bytes: int
) -> Iterator[Converted | SetAside]:
    """Each line as an encoded sample, or as a SetAside record.

    `totals` count a sample in once the consumer asks for the next item, so while a consumer
    holds a sample, `totals` cover exactly the samples before it (what a batch boundary needs).
    """
    for line in lines:
        trace = _checked(line, max_line_bytes)
        if trace is None or isinstance(trace, SetAside):
            if trace is not None:
                yield trace
            continue
        try:
            sample = build_sample(trace, totals.rollouts.count(trace.task["idx"]) + 1)
            encoded = encode_sample(sample, line.number)
        except BadRecord as exc:
            yield SetAside(line.number, line.start, exc.reason, line.end - line.start)
            continue
        yield Converted(line, encoded)
        totals.add(trace)


@dataclass(slots=True)
class Scan:
    """What one cheap pass over a run's lines found."""

    totals: RunTotals
    set_aside: list[SetAside]
    end: int  # the offset just past the last complete line


def scan(lines: Iterator[Line], *, max_line_bytes: int) -> Scan:
    """Check every line and sum the good ones, without building samples."""
    result = Scan(RunTotals(), [], 0)
    for line in lines:
        result.end = line.end
        trace = _checked(line, max_line_bytes)
        if isinstance(trace, SetAside):
            result.set_aside.append(trace)
        elif trace is not None:
            result.totals.add(trace)
    return result


def _readable_lines(path: Path, max_line_bytes: int) -> Iterator[Line]:
    """`read_lines`, with a trace file that cannot be read reported as the run's error."""
    try:
        yield from read_lines(path, max_line_bytes=max_line_bytes)
    except PermissionError:
        raise RunError(f"{path}: not readable (permission denied)") from None
    except OSError as exc:
        raise RunError(f"{path}: cannot be read: {exc.strerror or exc}") from None


def convert_to_streams(
    directory: Path, config: Config, out: IO[bytes], err: IO[bytes]
) -> dict[str, Any]:
    """`evalpush convert`: samples as JSON lines on `out`, then the summary on `err`.

    Returns the summary (with its `set_aside` records).
    """
    run = load_run(directory)
    totals = RunTotals()
    set_aside: list[dict[str, Any]] = []
    lines = _readable_lines(run.traces_path, config.read.max_line_bytes)
    pending: list[bytes] = []
    for item in convert_lines(lines, totals, max_line_bytes=config.read.max_line_bytes):
        if isinstance(item, SetAside):
            set_aside.append(item.to_dict())
            err.write(f"{run.traces_path}: line {item.line}: {item.reason}\n".encode())
            continue
        pending.append(item.sample)
        if len(pending) >= 256:
            out.write(b"\n".join(pending) + b"\n")
            pending.clear()
    if pending:
        out.write(b"\n".join(pending) + b"\n")
    out.flush()
    if not run.env_name:
        err.write(f"{run.path}: no environment name ('[taskset] id' or 'id')\n".encode())
    report = {**summary(run, totals), "set_aside": set_aside}
    err.write(_ENCODER.encode(report) + b"\n")
    err.flush()
    return report


__all__ = [
    "Converted",
    "RunTotals",
    "SetAside",
    "build_sample",
    "convert_lines",
    "convert_to_streams",
    "decode_trace",
    "scan",
    "summary",
]
