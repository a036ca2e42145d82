"""A run, line by line: each line becomes an encoded sample or a set-aside record.

`convert_lines` is the hot path of an upload. The create request needs the run's metrics before
any sample goes out, so an upload first passes over the run once without building samples:
- `tally`, the cheap pass: decodes only what the totals need (`decode_tally`); it sets aside a
  subset of the lines the full check refuses, never a line the full check takes;
- `scan`, the checked pass: every line through the full check (`decode_trace`), so it takes and
  refuses exactly the lines `convert_lines` does, and its totals are exactly conversion's.
Both are a `Pass` fed every line at once; the daemon feeds one as the lines arrive.

How deep a line may nest must not depend on where it is read: the decoder and the encoder
recurse once per level within Python's recursion limit, so the room left depends on how deep the
calling thread's stack already is (a pass in the tracker, the conversion in an upload thread, a
test under a runner). A line too deep for the room left is tried once more on a new thread's
empty stack (`_steady`), whose room is the same every time: the line alone decides.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, TypeVar

import msgspec

from evalpush.convert.producers import Episode, decode_line, decode_line_tally, episode_sample
from evalpush.convert.sample import build_sample, encode_sample, episode_trace_sample
from evalpush.convert.totals import RunTotals
from evalpush.convert.trace import NestedTooDeeply, Tally, Trace
from evalpush.core.errors import BadRecord
from evalpush.core.setaside import SetAside
from evalpush.core.states import SetAsideKind
from evalpush.runs import Line

BAD_LINE = SetAsideKind.BAD_LINE

T = TypeVar("T")


class Converted(NamedTuple):  # a tuple: one is made per line
    line: Line
    sample: bytes  # the encoded sample


def _steady(work: Callable[..., T], *args: Any) -> T:
    """`work(*args)`, with the same outcome whatever the depth of the calling thread's stack:
    work that runs out of stack is done again on a fresh thread's, where running out is final."""
    try:
        return work(*args)
    except (NestedTooDeeply, RecursionError):
        pass
    outcome: list[tuple[bool, Any]] = []

    def fresh() -> None:
        try:
            outcome.append((True, work(*args)))
        except RecursionError:
            outcome.append((False, NestedTooDeeply("nested too deeply")))
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            outcome.append((False, exc))

    thread = threading.Thread(target=fresh, name="evalpush-deep-line", daemon=True)
    thread.start()
    thread.join()
    done, value = outcome[0]
    if done:
        return value
    raise value


def _checked(
    line: Line, max_line_bytes: int, decode: Callable[[bytes, int], T]
) -> T | SetAside | None:
    """The line decoded and checked by `decode`, its SetAside record, or None for a blank line."""
    if line.data is None:
        reason = f"line longer than read.max_line_bytes ({max_line_bytes} bytes)"
        return SetAside(line.number, line.start, line.end - line.start, BAD_LINE, reason)
    if not line.data.strip():
        return None  # a blank line is no record (the producer skips them too)
    try:
        return _steady(decode, line.data, line.number)
    except BadRecord as exc:
        return SetAside(line.number, line.start, line.end - line.start, BAD_LINE, exc.reason)


def convert_lines(
    lines: Iterator[Line], totals: RunTotals, *, max_line_bytes: int
) -> Iterator[Converted | SetAside]:
    """Each line as an encoded sample, or as a SetAside record.

    `totals` count a sample in once the consumer asks for the next item, so while a consumer
    holds a sample, `totals` cover exactly the samples before it (what a batch boundary needs).
    """
    for line in lines:
        trace = _checked(line, max_line_bytes, decode_line)
        if trace is None or isinstance(trace, SetAside):
            if trace is not None:
                yield trace
            continue
        try:
            if type(trace) is Episode:
                if not trace.traces:  # counted in the run's aggregates; no sample to send
                    totals.add(trace)
                    continue
                number = totals.rollouts.count(trace.idx) + 1
                encoded = _steady(_encoded_episode, trace, number, line.data, line.number)
            else:
                number = totals.rollouts.count(trace.idx) + 1
                encoded = _steady(_encoded_sample, trace, number, line.number)
        except BadRecord as exc:
            yield SetAside(line.number, line.start, line.end - line.start, BAD_LINE, exc.reason)
            continue
        yield Converted(line, encoded)
        totals.add(trace)


def _encoded_sample(trace: Trace, rollout_number: int, line_number: int) -> bytes:
    return encode_sample(build_sample(trace, rollout_number), line_number)


def _encoded_episode(episode: Episode, rollout_number: int, data: bytes, line_number: int) -> bytes:
    sample = episode_sample(episode, rollout_number, data, episode_trace_sample)
    return encode_sample(sample, line_number)


class Scan(msgspec.Struct):
    """What one pass over a run's lines found, without building samples."""

    totals: RunTotals
    set_aside: list[SetAside]
    end: int  # the offset just past the last complete line


def scan(lines: Iterator[Line], *, max_line_bytes: int) -> Scan:
    """Check every line as conversion does and sum the good ones."""
    return _pass(lines, Pass(decode_line, max_line_bytes))


def tally(lines: Iterator[Line], *, max_line_bytes: int) -> Scan:
    """Sum the lines, decoding only what the totals need; the cheap first pass."""
    return _pass(lines, Pass(decode_line_tally, max_line_bytes))


class Pass:
    """One first pass taken a line at a time: `scan` and `tally` feed it a file's lines in one
    go, the daemon's tracker (`evalpush.upload.prescan`) as they arrive; either way the same lines in
    the same order make the same `Scan`, bit for bit."""

    __slots__ = ("_decode", "_max_line_bytes", "result")

    def __init__(
        self, decode: Callable[[bytes, int], Trace | Tally | Episode], max_line_bytes: int
    ):
        self._decode = decode
        self._max_line_bytes = max_line_bytes
        self.result = Scan(RunTotals(), [], 0)

    @classmethod
    def like(cls, *, checked: bool, max_line_bytes: int) -> Pass:
        """The pass of `scan` (`checked`: every line fully checked) or of `tally`."""
        return cls(decode_line if checked else decode_line_tally, max_line_bytes)

    def add(self, line: Line) -> None:
        result = self.result
        result.end = line.end
        checked = _checked(line, self._max_line_bytes, self._decode)
        if isinstance(checked, SetAside):
            result.set_aside.append(checked)
        elif checked is not None:
            result.totals.add(checked)


def _pass(lines: Iterator[Line], taken: Pass) -> Scan:
    add = taken.add
    for line in lines:
        add(line)
    return taken.result
