"""A run, line by line: each line becomes an encoded sample or a set-aside record.

`convert_lines` is the hot path of an upload; `scan` is the cheap first pass that checks every
line and sums the good ones (the create request needs the run's metrics before any sample goes
out).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from evalpush.convert.sample import build_sample, encode_sample
from evalpush.convert.totals import RunTotals
from evalpush.convert.trace import Trace, decode_trace
from evalpush.errors import BadRecord
from evalpush.read import Line


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
