"""One checked trace -> one platform sample (docs/TRACE_FORMAT.md sections 4 and 5).

The derived views (branches, token counts, usage, truncation) are computed here and never
stored; raw message objects pass through untouched unless a top-level null must be dropped.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from evalpush.convert import producers
from evalpush.convert.trace import NULL, Call, NestedTooDeeply, Node, Trace, Usage, V2Trace, chain
from evalpush.core.errors import BadRecord

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

_ENCODER = msgspec.json.Encoder()
_EMPTY_CONTAINER = re.compile(rb"[\[{]\s*[\]}]")
_NULL = re.compile(rb"null")


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


def _branch(nodes: list[Node], messages: list[Any], tokens: list[int], masked: list[int]):
    """A trajectory entry for a root -> leaf path, given its nodes and their views.

    Input tokens: tokens on the path minus the last masked node's (the prompt of the final
    turn); else the input size of the last usage on the path; else 0. Output tokens: masked
    (sampled) tokens on the path; else the completion tokens of its usages."""
    last = 0
    for count in reversed(masked):
        if count:
            last = count
            break
    inputs = sum(tokens) - last
    if not inputs:
        usage = next((n.usage for n in reversed(nodes) if n.usage is not None), None)
        inputs = 0 if usage is None else usage.prompt_tokens + (usage.cached_input_tokens or 0)
    outputs = sum(masked) or sum(n.usage.completion_tokens for n in nodes if n.usage is not None)
    return {"messages": messages, "num_input_tokens": inputs, "num_output_tokens": outputs}


def trajectory(nodes: list[Node]) -> list[dict[str, Any]]:
    """One entry per branch (root -> leaf path), in ascending leaf order (section 4)."""
    if not nodes:
        return []
    messages = [_top_level_without_nulls(node.message) for node in nodes]
    tokens = [len(node.token_ids) for node in nodes]
    masked = [node.mask.count(True) for node in nodes]
    parents = [node.parent for node in nodes]
    if parents == chain(len(nodes)):  # the common case: one linear conversation
        return [_branch(nodes, messages, tokens, masked)]
    return [
        _branch(
            [nodes[i] for i in path],
            [messages[i] for i in path],
            [tokens[i] for i in path],
            [masked[i] for i in path],
        )
        for path in (_path_to(leaf, parents) for leaf in _leaves(parents))
    ]


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
    if cached is not None:
        total["cached_input_tokens"] = cached
    if reasoning is not None:
        total["reasoning_tokens"] = reasoning
    if cost is not None:
        total["cost"] = cost
    return total


def is_truncated(trace: Trace) -> bool:
    if trace.stop_condition in TRUNCATING_STOP_CONDITIONS:
        return True
    for node in reversed(trace.nodes):
        if node.sampled:
            return node.finish_reason == "length"
    return False


def _paths(parents: list[int | None]) -> list[list[int]]:
    """Root -> leaf node indices of each branch, in ascending leaf order."""
    if parents == chain(len(parents)):
        return [list(range(len(parents)))] if parents else []
    return [_path_to(leaf, parents) for leaf in _leaves(parents)]


def call_trajectory(nodes: list[Node], calls: list[Call], *, new_input: bool) -> list[dict]:
    """One entry per branch when usage lives on the calls (verifiers 0.2 on): a branch's calls
    are those of the nodes on its path (the last call recorded for a node counts). Output
    tokens: the completion tokens of its calls. Input tokens: 0.2 (`new_input` False) takes the
    last call's whole sequence (prompt, cached, completion) minus the output; 0.3/0.4
    (`new_input`) sum what each call fed in beyond the sequence the call before it ended on."""
    if not nodes:
        return []
    messages = [_top_level_without_nulls(node.message) for node in nodes]
    by_node = {call.node: call for call in calls if call.node is not None}
    branches = []
    for path in _paths([node.parent for node in nodes]):
        usages = [
            call.usage
            for call in (by_node.get(i) for i in path)
            if call is not None and call.usage is not None
        ]
        outputs = sum(u.completion_tokens for u in usages)
        if new_input:
            inputs = before = 0
            for u in usages:
                fed = u.prompt_tokens + (u.cached_input_tokens or 0)
                inputs += max(0, fed - before)
                before = fed + u.completion_tokens
        elif usages:
            last = usages[-1]
            total = last.prompt_tokens + (last.cached_input_tokens or 0) + last.completion_tokens
            inputs = total - outputs
        else:
            inputs = 0
        branches.append(
            {
                "messages": [messages[i] for i in path],
                "num_input_tokens": inputs,
                "num_output_tokens": outputs,
            }
        )
    return branches


def truncated_by_calls(stop_condition: str | None, calls: list[Call], stops: frozenset) -> bool:
    """Truncated: a stop condition in `stops`, or the last call that did not fail finished on
    length (how 0.2 on tell it)."""
    if stop_condition in stops:
        return True
    last = next((call for call in reversed(calls) if call.error == NULL), None)
    return last is not None and last.finish_reason == "length"


def _tool_defs(tools: msgspec.Raw) -> msgspec.Raw | None:
    return None if tools == NULL or _EMPTY_CONTAINER.fullmatch(tools) else tools


def _task_row(task: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in task.items() if v is not None} if None in task.values() else task


def _v2_sample(trace: V2Trace, rollout_number: int) -> dict[str, Any]:
    """The sample 0.2's push sends: the seed's, with usage, truncation and token counts from
    the trace's calls and the tools it advertised as `tool_defs`."""
    calls = trace.calls
    return _sample(
        trace,
        rollout_number,
        call_trajectory(trace.nodes, calls, new_input=False),
        truncated_by_calls(trace.stop_condition, calls, TRUNCATING_STOP_CONDITIONS),
        usage_total([c.usage for c in calls if c.usage is not None]),
        tool_defs=_tool_defs(trace.tools),
    )


def episode_trace_sample(trace: Any, rollout_number: int, episode_id: str) -> dict[str, Any]:
    """The sample 0.3/0.4 make of one trace of an episode (`producers.EpisodeTrace`): the
    episode's id, the trace's agent, the reward score times weight, raw scores flattened (null
    rewards left out)."""
    calls = trace.calls
    return _sample(
        trace,
        rollout_number,
        call_trajectory(trace.nodes, calls, new_input=True),
        truncated_by_calls(trace.stop_condition, calls, producers.truncating_stops(trace)),
        usage_total([c.usage for c in calls if c.usage is not None]),
        tool_defs=_tool_defs(trace.tools),
        head={
            "episode_id": episode_id,
            "agent": trace.agent.name if trace.agent is not None else "agent",
            "trainable": trace.trainable,
        },
        row=trace.task.data,
        reward=trace.reward,
        info=producers.info_dict(trace.info),
        flat={name: r.score for name, r in trace.rewards.items() if r is not None},
    )


def build_sample(trace: Trace, rollout_number: int) -> dict[str, Any]:
    """The platform sample of a checked trace (docs/TRACE_FORMAT.md section 5)."""
    if type(trace) is V2Trace:
        return _v2_sample(trace, rollout_number)
    return _sample(
        trace,
        rollout_number,
        trajectory(trace.nodes),
        is_truncated(trace),
        usage_total([n.usage for n in trace.nodes if n.usage is not None]),
    )


_NO_TOOL_DEFS = object()
_NO_HEAD: dict[str, Any] = {}
_THE_TRACES = object()


def _sample(
    trace: Any,
    rollout_number: int,
    branches: list[dict[str, Any]],
    truncated: bool,
    usage: dict[str, Any] | None,
    *,
    tool_defs: Any = _NO_TOOL_DEFS,
    head: dict[str, Any] = _NO_HEAD,
    row: Any = _THE_TRACES,
    reward: Any = _THE_TRACES,
    info: Any = _THE_TRACES,
    flat: Any = _THE_TRACES,
) -> dict[str, Any]:
    """The sample of a trace given its derived views: the seed's; 0.2's with `tool_defs`; an
    episode's trace's with its `head` (after the rollout number), task `row`, `reward`, `info`
    and the scores it `flat`tens (left as they are: the trace's own task, reward sum, raw info,
    rewards)."""
    task = _task_row(trace.task if row is _THE_TRACES else row)
    errors = trace.errors
    rewards = trace.rewards if flat is _THE_TRACES else flat
    sample = {
        "sample_id": trace.id,
        "example_id": task["idx"],
        "rollout_number": rollout_number,
        **head,
        "task": task,
        "prompt": [],
        "completion": branches[-1]["messages"] if branches else [],
        "answer": task.get("answer"),
        "tool_defs": tool_defs,
        "reward": sum(rewards.values()) if reward is _THE_TRACES else reward,
        "timing": _all_without_nulls(trace.timing),
        "is_completed": trace.is_completed,
        "is_truncated": truncated,
        "metrics": trace.metrics,
        "error": _top_level_without_nulls(errors[-1]) if errors else None,
        "stop_condition": trace.stop_condition,
        "trajectory": branches,
        "token_usage": usage,
        "info": (None if _EMPTY_CONTAINER.fullmatch(trace.info) else trace.info)
        if info is _THE_TRACES
        else info,
    }
    if tool_defs is _NO_TOOL_DEFS:  # the seed's sample has no such key
        del sample["tool_defs"]
    for name, value in rewards.items():
        sample.setdefault(name, value)
    return sample


def encode_sample(sample: dict[str, Any], number: int) -> bytes:
    """The sample as JSON (non-finite floats as null)."""
    try:
        return _ENCODER.encode(sample)
    except RecursionError:
        raise NestedTooDeeply("cannot be encoded as JSON: nested too deeply", line=number) from None
    except (msgspec.EncodeError, OverflowError) as exc:
        raise BadRecord(f"cannot be encoded as JSON: {exc}", line=number) from None
