"""The trace line, as typed and checked (docs/TRACE_FORMAT.md section 3).

Each line is decoded by msgspec into a `Trace` that names only what conversion reads, so types
are checked in C and everything else is skipped unread. Messages stay raw JSON (they go into the
sample byte for byte); token ids and masks are decoded as typed lists and only counted.
`decode_trace` adds the checks types cannot express (task.idx, raw shapes, the message graph),
and every failure is a `BadRecord` naming the line and the reason.

`decode_tally` is the cheap first pass's decode: only what the run's totals need (id, task.idx,
rewards, metrics, errors), everything else skipped unread (its JSON syntax is still checked).
It refuses a line only for a reason `decode_trace` refuses it too: what it checks is a subset of
the full check on the same bytes, through the same fallbacks. The converse does not hold: a
line can pass the tally and be refused by the full check (bad UTF-8 in a raw field, a broken
message graph, a wrong type in a field the tally skips). docs/ARCHITECTURE.md ("scan") says how
the upload keeps such a line out of the totals it reports.

Not-finite numbers: a `NaN`/`Infinity` literal (not JSON, but Python's json writes it) is
accepted, and so is a `null` reward or metric (what pydantic writes for NaN); both count as
NaN and go out as `null`.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import msgspec

from evalpush.core.errors import BadRecord

NAN = float("nan")

MAX_DEPTH = 1024
"""Deepest nesting the lenient parse accepts (msgspec's parser stops a little earlier, at
Python's recursion limit: either way the line is refused as nested too deeply)."""


class NestedTooDeeply(BadRecord):
    """A line nested deeper than the stack this thread had left could hold (see
    `evalpush.convert.lines`, which tries such a line again on a fresh stack)."""


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
NULL = msgspec.Raw(b"null")
"""A raw field's default: absent reads as null (msgspec takes no `Raw | None`)."""


class Node(msgspec.Struct, gc=False):
    """A MessageNode. `message` stays raw JSON, passed through to the sample untouched."""

    message: msgspec.Raw
    parent: int | None = None
    sampled: bool = False
    token_ids: list[int] = []
    mask: list[bool] = []
    finish_reason: str | None = None
    usage: Usage | None = None


class Call(msgspec.Struct, gc=False):
    """A model call (verifiers 0.2 on): the node it committed, how it finished, its usage."""

    node: int | None = None
    finish_reason: str | None = None
    usage: Usage | None = None
    error: msgspec.Raw = NULL


class Trace(msgspec.Struct, gc=False):
    """What conversion reads of a trace line; keys it does not name are skipped unread.

    The seed's line (verifiers 0.1) carries usage and finish reasons on its nodes; a 0.2 line
    carries them in `calls` (`V2Trace`)."""

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

    @property
    def idx(self) -> int:
        """`task.idx` (checked an int by `decode_trace`)."""
        return self.task["idx"]


class V2Trace(Trace, gc=False):
    """A verifiers 0.2 trace, checked (`convert.producers` decodes it): the seed's fields, its
    task row moved up from `task.data`, plus its model calls and the tools it advertised."""

    calls: list[Call] = []
    tools: msgspec.Raw = NULL


_DECODER = msgspec.json.Decoder(Trace)


class _TaskIdx(msgspec.Struct, gc=False):
    # any JSON value, then checked as `decode_trace` checks it (an int, never a bool); UNSET:
    # absent (so a later producer's line, whose task holds no idx, decodes to show its markers)
    idx: Any = msgspec.UNSET


class Tally(msgspec.Struct, gc=False):
    """What the run's totals read of a trace line; every other key is skipped unread."""

    id: str
    task: _TaskIdx
    rewards: dict[str, float | None] = {}
    metrics: dict[str, float | None] = {}
    errors: list[msgspec.Raw] = []

    @property
    def idx(self) -> int:
        return self.task.idx


_TALLY = msgspec.json.Decoder(Tally)


# ---------------------------------------------------------------- parsing and checking


def decode_trace(data: bytes, number: int) -> Trace:
    """The line as a checked `Trace`; `BadRecord` names the first problem."""
    return checked_trace(_decode(_DECODER, data, number), data, number)


def checked_trace(trace: Trace, data: bytes, number: int) -> Trace:
    """A decoded seed trace, checked (`data`: its line): what the types alone do not say."""
    check_text(data, number)
    _check(trace, number)
    trace.rewards = _scores(trace.rewards)
    trace.metrics = _scores(trace.metrics)
    return trace


def check_text(data: bytes, number: int) -> None:
    """Raw fields (messages, info) are not checked by the decoder: a byte that is not UTF-8
    there would reach the platform and get the whole batch refused."""
    if not data.isascii():
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadRecord(f"not UTF-8 (byte {exc.start})", line=number) from None


def decode_tally(data: bytes, number: int) -> Tally:
    """The fields of the line the totals need, checked as `decode_trace` checks them."""
    return checked_tally(_decode(_TALLY, data, number), number)


def checked_tally(tally: Tally, number: int) -> Tally:
    _check_id(tally.id, number)
    if tally.task.idx is msgspec.UNSET:
        raise BadRecord("missing 'task.idx'", line=number)
    _check_idx(tally.task.idx, number)
    tally.rewards = _scores(tally.rewards)
    tally.metrics = _scores(tally.metrics)
    return tally


def _decode(decoder: msgspec.json.Decoder, data: bytes, number: int) -> Any:
    """`data` decoded by `decoder` (or leniently, for NaN/Infinity literals), or `BadRecord`."""
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise BadRecord(_describe(exc), line=number) from None
    except msgspec.DecodeError:
        return _decode_lenient(decoder, data, number)
    except RecursionError:
        raise NestedTooDeeply("nested too deeply", line=number) from None


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


def _decode_lenient(decoder: msgspec.json.Decoder, data: bytes, number: int) -> Any:
    """Python's parser, which also takes NaN/Infinity literals: non-finite numbers become
    null (what goes out for them anyway), then the line is decoded as usual."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRecord(f"not UTF-8 (byte {exc.start})", line=number) from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        # Some of Python's messages end in " at" (`Unterminated string starting at`): one "at"
        what = exc.msg.removesuffix(" at")
        raise BadRecord(f"invalid JSON: {what} at column {exc.colno}", line=number) from None
    except RecursionError:
        value = None
    if value is None or _deeper_than(value, MAX_DEPTH):
        raise NestedTooDeeply(
            f"invalid JSON: nested too deeply (over {MAX_DEPTH} levels)", line=number
        )
    try:
        strict = json.dumps(_finite(value), allow_nan=False).encode()
        return decoder.decode(strict)
    except msgspec.ValidationError as exc:
        raise BadRecord(_describe(exc), line=number) from None
    except RecursionError:
        raise NestedTooDeeply("nested too deeply", line=number) from None
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


_OPEN_BRACE = ord("{")
_OPEN_BRACKET = ord("[")


def _check(trace: Trace, number: int, at: str = "") -> None:
    """What the types alone do not say: task.idx, raw shapes, and the graph. `at` prefixes the
    keys named (a trace inside an episode: `traces[1].`)."""
    _check_id(trace.id, number, at)
    if "idx" not in trace.task:
        raise BadRecord(f"missing '{at}task.idx'", line=number)
    _check_idx(trace.task["idx"], number, at)
    check_parts(trace, number, at)


def check_parts(trace: Any, number: int, at: str = "") -> None:
    """The raw parts of a trace (its info, timing, errors, tools, messages) and its graph."""
    # A raw value is valid JSON: it is an object when it starts with a brace.
    if memoryview(trace.info)[0] != _OPEN_BRACE:
        raise BadRecord(f"'{at}info' must be an object", line=number)
    if memoryview(trace.timing)[0] != _OPEN_BRACE:
        raise BadRecord(f"'{at}timing' must be an object", line=number)
    check_errors(trace.errors, number, at)
    tools = getattr(trace, "tools", NULL)
    if tools != NULL and memoryview(tools)[0] != _OPEN_BRACKET:
        raise BadRecord(f"'{at}tools' must be a list", line=number)
    nodes = trace.nodes
    for i, node in enumerate(nodes):
        if memoryview(node.message)[0] != _OPEN_BRACE:
            raise BadRecord(f"'{at}nodes[{i}].message' must be an object", line=number)
    parents = [node.parent for node in nodes]
    if parents != chain(len(nodes)):  # a linear conversation is a valid graph: compared in C
        _check_graph(parents, number, at)


def check_errors(errors: list[msgspec.Raw], number: int, at: str = "") -> None:
    for i, raw in enumerate(errors):
        if memoryview(raw)[0] != _OPEN_BRACE:
            raise BadRecord(f"'{at}errors[{i}]' must be an object", line=number)


def _check_graph(parents: list[int | None], number: int, at: str = "") -> None:
    """Every parent in range, and no cycle."""
    count = len(parents)
    forward_only = True  # every parent precedes its child: then no cycle is possible
    for i, parent in enumerate(parents):
        if parent is not None:
            if not 0 <= parent < count:
                raise BadRecord(f"'{at}nodes[{i}].parent' {parent} is out of range", line=number)
            if parent >= i:
                forward_only = False
    if not forward_only:
        _check_acyclic(parents, number, at)


_CHAINS: dict[int, list[int | None]] = {}
_CACHED_CHAIN_LENGTH = 4096


def chain(length: int) -> list[int | None]:
    """The parents of a linear conversation of `length` nodes: [None, 0, 1, ...]."""
    parents = _CHAINS.get(length)
    if parents is None:
        parents = [None, *range(length - 1)] if length else []
        if length <= _CACHED_CHAIN_LENGTH:
            _CHAINS[length] = parents
    return parents


def _check_id(id: str, number: int, at: str = "") -> None:
    if not id:
        raise BadRecord(f"'{at}id' must be a non-empty string", line=number)


def _check_idx(idx: Any, number: int, at: str = "") -> None:
    if type(idx) is not int:
        raise BadRecord(f"'{at}task.idx' must be an integer, got {idx!r}"[:200], line=number)


def _check_acyclic(parents: list[int | None], number: int, at: str = "") -> None:
    """Every parent chain reaches a root: O(n) with the chains already proven."""
    reaches_root = [False] * len(parents)
    for i in range(len(parents)):
        chain: list[int] = []
        on_chain: set[int] = set()
        j: int | None = i
        while j is not None and not reaches_root[j]:
            if j in on_chain:
                raise BadRecord(
                    f"'{at}nodes' parent links form a cycle through node {j}", line=number
                )
            chain.append(j)
            on_chain.add(j)
            j = parents[j]
        for k in chain:
            reaches_root[k] = True


def _scores(scores: dict[str, float | None]) -> dict[str, float]:
    """Scores with null (how pydantic writes NaN) read as NaN."""
    if None in scores.values():
        return {k: NAN if v is None else v for k, v in scores.items()}
    return scores  # type: ignore[return-value]
