"""The batch stage: pack encoded samples into request bodies under a byte and a count limit.

A batch knows the byte range of the trace file it consumed (`start`..`end`, bad lines inside
included) and the running totals after it, which is what the ledger records when the platform
acknowledges it. Only the batch being built is in memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from evalpush.convert import Converted, RunTotals, SetAside

PLATFORM_MAX_BODY_BYTES = 25 * 1024 * 1024
_HEAD, _SEP, _TAIL = b'{"samples":[', b",", b"]}"
OVERHEAD_BYTES = len(_HEAD) + len(_TAIL)


@dataclass(slots=True)
class Batch:
    samples: list[bytes]
    offsets: list[int]  # each sample's line start, for splitting
    numbers: list[int]  # each sample's line number
    start: int  # first byte this batch consumed
    end: int  # first byte after it
    end_line: int  # line number of the last line consumed
    totals_after: bytes  # RunTotals JSON once this batch is counted in

    @property
    def body_bytes(self) -> int:
        return OVERHEAD_BYTES + sum(map(len, self.samples)) + max(len(self.samples) - 1, 0)

    def body(self) -> bytes:
        return _HEAD + _SEP.join(self.samples) + _TAIL

    def split(self) -> tuple[Batch, Batch]:
        """Two halves of a refused batch to send apart; the ledger still acknowledges the whole."""
        half = len(self.samples) // 2
        first = Batch(
            self.samples[:half], self.offsets[:half], self.numbers[:half],
            self.start, self.offsets[half], self.numbers[half] - 1, self.totals_after,
        )
        second = Batch(
            self.samples[half:], self.offsets[half:], self.numbers[half:],
            self.offsets[half], self.end, self.end_line, self.totals_after,
        )
        return first, second


def batches(
    items: Iterator[Converted | SetAside],
    totals: RunTotals,
    *,
    start: int,
    start_line: int,
    end: int,
    max_batch_bytes: int,
    max_batch_samples: int,
    set_aside: Callable[[SetAside, str], None],
) -> Iterator[Batch]:
    """Group converted samples into batches covering `start`..`end` of the file.

    `set_aside(record, kind)` receives bad lines ("bad_line") and samples too large for any
    request ("rejected"). The last batch may hold no sample: it still moves the range to `end`.
    """
    samples: list[bytes] = []
    offsets: list[int] = []
    numbers: list[int] = []
    size = OVERHEAD_BYTES
    batch_start, last_line = start, start_line

    def close(next_offset: int, next_line: int) -> Batch:
        return Batch(samples, offsets, numbers, batch_start, next_offset, next_line, totals.to_json())

    for item in items:
        if isinstance(item, SetAside):
            set_aside(item, "bad_line")
            last_line = item.line
            continue
        line, sample = item.line, item.sample
        if len(sample) + OVERHEAD_BYTES > PLATFORM_MAX_BODY_BYTES:
            reason = f"sample is {len(sample)} bytes encoded; no request may exceed 25 MiB"
            set_aside(SetAside(line.number, line.start, reason, len(sample)), "rejected")
            last_line = line.number
            continue
        grown = size + len(sample) + (1 if samples else 0)
        if samples and (grown > max_batch_bytes or len(samples) >= max_batch_samples):
            yield close(line.start, line.number - 1)
            samples, offsets, numbers = [], [], []
            size, batch_start = OVERHEAD_BYTES, line.start
            grown = size + len(sample)
        samples.append(sample)
        offsets.append(line.start)
        numbers.append(line.number)
        size = grown
        last_line = line.number
    yield close(end, last_line)
