"""The convert stage: one trace line -> one platform sample, and the run's aggregates.

The rules are TRACE_FORMAT.md sections 4-6, which restate what verifiers' own push does, so a
run uploaded by evalpush looks exactly like one the eval pushed itself. Lines are plain dicts
parsed with orjson (validating every line into full models is what makes the producer slow);
`check_trace` validates just what the conversion relies on, and every failure is a `BadRecord`
naming the line and the reason. Aggregates are running sums (`RunTotals`), so a run of any
size converts in bounded memory and a resumed upload continues the sums from the ledger.

Not-finite numbers: a `NaN`/`Infinity` literal (not JSON, but Python's json writes it) is
accepted, and so is a `null` reward or metric (what pydantic writes for NaN); both count as
NaN and go out as `null`, since orjson encodes non-finite floats as null.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson

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

# orjson parses up to 1024 levels of nesting and the lenient parse is held to the same; the
# stdlib fallbacks (parse, encode) and the null-dropping walk recurse in Python, so give them
# room for anything accepted.
MAX_DEPTH = 1024
RECURSION_LIMIT = 5000
sys.setrecursionlimit(max(sys.getrecursionlimit(), RECURSION_LIMIT))


# ---------------------------------------------------------------- parsing and checking


def parse_trace(data: bytes, number: int) -> dict[str, Any]:
    """The line as a dict; `BadRecord` when it is not a JSON object."""
    try:
        trace = orjson.loads(data)
    except orjson.JSONDecodeError:
        trace = _parse_lenient(data, number)
    if not isinstance(trace, dict):
        kind = {list: "an array", str: "a string"}.get(type(trace), type(trace).__name__)
        raise BadRecord(f"the line is {kind}, not a JSON object", line=number)
    return trace


def _parse_lenient(data: bytes, number: int) -> Any:
    """Python's parser, which also takes NaN/Infinity literals and huge integers."""
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
        raise BadRecord(f"nested too deeply (over {MAX_DEPTH} levels)", line=number)
    return value


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


# The checks below run once per node of every line: exact `type(...) is` tests (orjson and
# json only ever produce these types, and bool must not pass for int) keep them cheap.
_NUMBER_TYPES = (int, float)


def _field(trace: dict[str, Any], key: str, kind: type, default: Any, number: int) -> Any:
    value = trace.get(key, default)
    if value is None:
        return default
    if type(value) is not kind:
        raise BadRecord(f"'{key}' must be {kind.__name__}, got {type(value).__name__}", line=number)
    return value


def _scores(trace: dict[str, Any], key: str, number: int) -> dict[str, float]:
    scores = _field(trace, key, dict, {}, number)
    for name, value in scores.items():
        if type(value) not in _NUMBER_TYPES:
            if value is not None:
                message = f"'{key}.{name}' must be a number, got {value!r}"
                raise BadRecord(message[:200], line=number)
            scores[name] = NAN
    return scores


def _check_usage(usage: Any, i: int, number: int) -> None:
    if type(usage) is not dict:
        raise BadRecord(f"'nodes[{i}].usage' must be an object", line=number)
    if type(usage.get("prompt_tokens", 0)) is not int:
        raise BadRecord(f"'nodes[{i}].usage.prompt_tokens' must be an integer", line=number)
    if type(usage.get("completion_tokens", 0)) is not int:
        raise BadRecord(f"'nodes[{i}].usage.completion_tokens' must be an integer", line=number)
    for key in OPTIONAL_USAGE_FIELDS:
        value = usage.get(key)
        if value is not None and type(value) not in _NUMBER_TYPES:
            raise BadRecord(f"'nodes[{i}].usage.{key}' must be a number", line=number)


def _check_nodes(nodes: list[Any], number: int) -> None:
    count = len(nodes)
    forward_only = True  # every parent precedes its child: then no cycle is possible
    for i, node in enumerate(nodes):
        if type(node) is not dict or type(node.get("message")) is not dict:
            raise BadRecord(f"'nodes[{i}]' must be an object with a 'message' object", line=number)
        parent = node.get("parent")
        if parent is not None:
            if type(parent) is not int or not 0 <= parent < count:
                raise BadRecord(f"'nodes[{i}].parent' {parent!r} is out of range", line=number)
            if parent >= i:
                forward_only = False
        for key in ("token_ids", "mask"):
            value = node.get(key)
            if value is not None and type(value) is not list:
                raise BadRecord(f"'nodes[{i}].{key}' must be a list", line=number)
        usage = node.get("usage")
        if usage is not None:
            _check_usage(usage, i, number)
    if not forward_only:
        _check_acyclic(nodes, number)


def _check_acyclic(nodes: list[dict[str, Any]], number: int) -> None:
    """Every parent chain reaches a root: O(n) with the chains already proven."""
    reaches_root = [False] * len(nodes)
    for i in range(len(nodes)):
        chain: list[int] = []
        on_chain: set[int] = set()
        j: int | None = i
        while j is not None and not reaches_root[j]:
            if j in on_chain:
                raise BadRecord(f"'nodes' parent links form a cycle through node {j}", line=number)
            chain.append(j)
            on_chain.add(j)
            j = nodes[j].get("parent")
        for k in chain:
            reaches_root[k] = True


def check_trace(trace: dict[str, Any], number: int) -> None:
    """Validate what the conversion relies on; `BadRecord` names the first problem."""
    if "id" not in trace:
        raise BadRecord("missing 'id'", line=number)
    if type(trace["id"]) is not str or not trace["id"]:
        raise BadRecord("'id' must be a non-empty string", line=number)
    task = trace.get("task")
    if type(task) is not dict:
        raise BadRecord("missing 'task' object", line=number)
    if "idx" not in task:
        raise BadRecord("missing 'task.idx'", line=number)
    if type(task["idx"]) is not int:
        raise BadRecord(f"'task.idx' must be an integer, got {task['idx']!r}"[:200], line=number)
    _check_nodes(_field(trace, "nodes", list, [], number), number)
    trace["rewards"] = _scores(trace, "rewards", number)
    trace["metrics"] = _scores(trace, "metrics", number)
    for key, kind in (("info", dict), ("timing", dict), ("errors", list)):
        _field(trace, key, kind, kind(), number)
    if not all(type(error) is dict for error in trace.get("errors") or ()):
        raise BadRecord("'errors' entries must be objects", line=number)
    stop = trace.get("stop_condition")
    if stop is not None and type(stop) is not str:
        raise BadRecord("'stop_condition' must be a string", line=number)


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


def _message(message: dict[str, Any]) -> dict[str, Any]:
    """A message with its null-valued keys dropped. Only the top level: the producer writes
    lines with model nulls already excluded, so a nested null belongs to a free-form field
    (e.g. `provider_state`) that the producer keeps as it is."""
    if None in message.values():
        return {k: v for k, v in message.items() if v is not None}
    return message


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
    return usage.get("prompt_tokens", 0) + (usage.get("cached_input_tokens") or 0)


def _output_tokens(path: list[int], masked: list[int], usages: list[Any]) -> int:
    """Masked (sampled) tokens on the path; else the completion tokens of its usages."""
    total = sum(masked[i] for i in path)
    if total:
        return total
    return sum(usages[i].get("completion_tokens", 0) for i in path if usages[i] is not None)


def trajectory(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per branch (root -> leaf path), in ascending leaf order (section 4)."""
    parents = [node.get("parent") for node in nodes]
    has_child = set(parents)
    messages = [_message(node["message"]) for node in nodes]
    tokens = [len(node.get("token_ids") or ()) for node in nodes]
    masked = [(node.get("mask") or []).count(True) for node in nodes]
    usages = [node.get("usage") for node in nodes]
    branches = []
    for leaf in range(len(nodes)):
        if leaf in has_child:
            continue
        path = []
        i: int | None = leaf
        while i is not None:  # the graph is checked acyclic before this runs
            path.append(i)
            i = parents[i]
        path.reverse()
        branches.append(
            {
                "messages": [messages[i] for i in path],
                "num_input_tokens": _input_tokens(path, tokens, masked, usages),
                "num_output_tokens": _output_tokens(path, masked, usages),
            }
        )
    return branches


def usage_total(usages: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Summed usage, null fields dropped; None when there is no usage at all."""
    if not usages:
        return None
    total: dict[str, Any] = {
        "prompt_tokens": sum(u.get("prompt_tokens", 0) for u in usages),
        "completion_tokens": sum(u.get("completion_tokens", 0) for u in usages),
    }
    for key in OPTIONAL_USAGE_FIELDS:
        reported = [u[key] for u in usages if u.get(key) is not None]
        if reported:
            total[key] = sum(reported)
    return total


def is_truncated(trace: dict[str, Any]) -> bool:
    if trace.get("stop_condition") in TRUNCATING_STOP_CONDITIONS:
        return True
    for node in reversed(trace.get("nodes") or ()):
        if node.get("sampled"):
            return node.get("finish_reason") == "length"
    return False


# ---------------------------------------------------------------- the sample


def build_sample(trace: dict[str, Any], rollout_number: int) -> dict[str, Any]:
    """The platform sample of a checked trace (TRACE_FORMAT.md section 5)."""
    nodes = trace.get("nodes") or []
    branches = trajectory(nodes)
    task = trace["task"]
    if None in task.values():
        task = {k: v for k, v in task.items() if v is not None}
    errors = trace.get("errors")
    rewards = trace["rewards"]
    usages = [usage for node in nodes if (usage := node.get("usage")) is not None]
    sample = {
        "sample_id": trace["id"],
        "example_id": task["idx"],
        "rollout_number": rollout_number,
        "task": task,
        "prompt": [],
        "completion": branches[-1]["messages"] if branches else [],
        "answer": task.get("answer"),
        "reward": sum(rewards.values()),
        "timing": _without_nulls(trace.get("timing") or {}),
        "is_completed": bool(trace.get("is_completed", False)),
        "is_truncated": is_truncated(trace),
        "metrics": trace["metrics"],
        "error": _without_nulls(errors[-1]) if errors else None,
        "stop_condition": trace.get("stop_condition"),
        "trajectory": branches,
        "token_usage": usage_total(usages),
        "info": trace.get("info") or None,
    }
    for name, value in rewards.items():
        sample.setdefault(name, value)
    return sample


def encode_sample(sample: dict[str, Any], number: int) -> bytes:
    """The sample as JSON. orjson first; what it cannot encode (a lone surrogate, nesting past
    its 255 levels) goes through the stdlib encoder, so every line that parsed also encodes and
    the cheap first pass (`scan`) agrees with the conversion on which lines are good."""
    try:
        return orjson.dumps(sample)
    except orjson.JSONEncodeError:
        pass
    try:
        return json.dumps(_finite(sample), ensure_ascii=True, allow_nan=False).encode()
    except (ValueError, RecursionError) as exc:
        raise BadRecord(f"cannot be encoded as JSON: {exc}", line=number) from None


def _finite(value: Any) -> Any:
    """`value` with non-finite floats as None (the stdlib encoder would write NaN)."""
    kind = type(value)
    if kind is float:
        return value if math.isfinite(value) else None
    if kind is dict:
        return {k: _finite(v) for k, v in value.items()}
    if kind is list:
        return [_finite(v) for v in value]
    return value


# ---------------------------------------------------------------- the run's aggregates


@dataclass
class RunTotals:
    """Running sums over a run's good traces in file order (TRACE_FORMAT.md section 6)."""

    traces: int = 0
    reward_sum: float = 0.0
    errored: int = 0
    metric_sums: dict[str, float] = field(default_factory=dict)
    metric_counts: dict[str, int] = field(default_factory=dict)
    rollouts: dict[int, int] = field(default_factory=dict)  # task idx -> traces so far

    def add(self, trace: dict[str, Any]) -> int:
        """Count a checked trace in; returns its rollout number within its task."""
        self.traces += 1
        self.reward_sum += sum(trace["rewards"].values())
        self.errored += bool(trace.get("errors"))
        for name, value in {**trace["rewards"], **trace["metrics"]}.items():
            self.metric_sums[name] = self.metric_sums.get(name, 0.0) + value
            self.metric_counts[name] = self.metric_counts.get(name, 0) + 1
        idx = trace["task"]["idx"]
        self.rollouts[idx] = number = self.rollouts.get(idx, 0) + 1
        return number

    def metrics(self) -> dict[str, Any]:
        n = self.traces
        return {
            "avg_reward": self.reward_sum / n if n else 0.0,
            "avg_metrics": {k: s / self.metric_counts[k] for k, s in self.metric_sums.items()},
            "avg_error": self.errored / n if n else 0.0,
        }

    def to_json(self) -> bytes:
        # orjson writes NaN/Infinity as null: keep them as text so a resumed sum stays non-finite
        state = {
            **self.__dict__,
            "reward_sum": _float_text(self.reward_sum),
            "metric_sums": {k: _float_text(v) for k, v in self.metric_sums.items()},
            "rollouts": list(self.rollouts.items()),
        }
        return orjson.dumps(state)

    @classmethod
    def from_json(cls, data: bytes | str) -> RunTotals:
        state = orjson.loads(data)
        state["reward_sum"] = float(state["reward_sum"])
        state["metric_sums"] = {k: float(v) for k, v in state["metric_sums"].items()}
        state["rollouts"] = {int(k): v for k, v in state["rollouts"]}
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


def _checked(line: Line, max_line_bytes: int) -> dict[str, Any] | SetAside | None:
    """The line's checked trace, its SetAside record, or None for a blank line."""
    if line.data is None:
        reason = f"line longer than read.max_line_bytes ({max_line_bytes} bytes)"
        return SetAside(line.number, line.start, reason, line.end - line.start)
    if not line.data.strip():
        return None  # a blank line is no record (the producer skips them too)
    try:
        trace = parse_trace(line.data, line.number)
        check_trace(trace, line.number)
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
            sample = build_sample(trace, totals.rollouts.get(trace["task"]["idx"], 0) + 1)
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
    err.write(orjson.dumps(report) + b"\n")
    err.flush()
    return report


__all__ = [
    "Converted",
    "RunTotals",
    "SetAside",
    "build_sample",
    "check_trace",
    "convert_lines",
    "convert_to_streams",
    "parse_trace",
    "scan",
    "summary",
]
