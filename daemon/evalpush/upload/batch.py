"""The batch stage: pack encoded samples into request bodies under a byte and a count limit.

A batch knows the byte range of the trace file it consumed (`start`..`end`, bad lines inside
included) and the records set aside inside that range, which is what the ledger records when
the platform acknowledges it. Only the batches being built and sent are in memory: `Prefetch`
builds the next batch in a thread while the current one is on the wire, so conversion overlaps
the platform's work instead of waiting for it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Generic, TypeVar

import msgspec

from evalpush.convert import Converted
from evalpush.core.setaside import SetAside
from evalpush.core.states import SetAsideKind

PLATFORM_MAX_BODY_BYTES = 25 * 1024 * 1024
_HEAD, _SEP, _TAIL = b'{"samples":[', b",", b"]}"
OVERHEAD_BYTES = len(_HEAD) + len(_TAIL)


class Batch(msgspec.Struct):
    samples: list[bytes]
    offsets: list[int]  # each sample's line start, for splitting
    numbers: list[int]  # each sample's line number
    start: int  # first byte this batch consumed
    end: int  # first byte after it
    end_line: int  # line number of the last line consumed
    set_aside: list[SetAside] = msgspec.field(default_factory=list)

    @property
    def body_bytes(self) -> int:
        return OVERHEAD_BYTES + sum(map(len, self.samples)) + max(len(self.samples) - 1, 0)

    def body(self) -> bytes:
        """The request body, built with one copy of the samples (a batch can be 25 MiB)."""
        if not self.samples:
            return _HEAD + _TAIL
        if len(self.samples) == 1:
            return _HEAD + self.samples[0] + _TAIL
        first, *middle, last = self.samples
        return _SEP.join([_HEAD + first, *middle, last + _TAIL])

    def only(self, keep: list[int]) -> Batch:
        """The same range with only the samples at indices `keep`."""
        return Batch(
            [self.samples[i] for i in keep],
            [self.offsets[i] for i in keep],
            [self.numbers[i] for i in keep],
            self.start,
            self.end,
            self.end_line,
            self.set_aside,
        )

    def split(self) -> tuple[Batch, Batch]:
        """Two halves of a refused batch to send apart; the ledger still acknowledges the whole."""
        half = len(self.samples) // 2
        return self.only(list(range(half))), self.only(list(range(half, len(self.samples))))


def batches(
    items: Iterator[Converted | SetAside],
    *,
    start: int,
    start_line: int,
    end: int,
    max_batch_bytes: int,
    max_batch_samples: int,
) -> Iterator[Batch]:
    """Group converted samples into batches covering `start`..`end` of the file.

    Bad lines travel with the batch whose range holds them, and so do samples too large for any
    request (`rejected`). The last batch may hold no sample: it still moves the
    range to `end`.
    """
    batch = Batch([], [], [], start, start, start_line)
    size = OVERHEAD_BYTES
    for item in items:
        if isinstance(item, SetAside):
            batch.set_aside.append(item)
            batch.end_line = item.line
            continue
        line, sample = item.line, item.sample
        if len(sample) + OVERHEAD_BYTES > PLATFORM_MAX_BODY_BYTES:
            reason = f"sample is {len(sample)} bytes encoded; no request may exceed 25 MiB"
            batch.set_aside.append(
                SetAside(line.number, line.start, len(sample), SetAsideKind.REJECTED, reason)
            )
            batch.end_line = line.number
            continue
        grown = size + len(sample) + (1 if batch.samples else 0)
        if batch.samples and (grown > max_batch_bytes or len(batch.samples) >= max_batch_samples):
            batch.end, batch.end_line = line.start, line.number - 1
            yield batch
            batch = Batch([], [], [], line.start, line.start, line.number - 1)
            size, grown = OVERHEAD_BYTES, OVERHEAD_BYTES + len(sample)
        batch.samples.append(sample)
        batch.offsets.append(line.start)
        batch.numbers.append(line.number)
        batch.end_line = line.number
        size = grown
    batch.end = end
    yield batch


T = TypeVar("T")
_DONE = object()


class _Failed:
    def __init__(self, error: BaseException):
        self.error = error


class Prefetch(Generic[T]):
    """Iterate `source` in a thread, building up to `depth` items ahead of the consumer.

    The producer starts on the next item only once the consumer has taken the previous one, so
    at most `depth` items wait besides the one in use. Its exception is raised in the consumer,
    in order. Leaving the `with` block stops the producer after its current item and joins it.
    """

    POLL_SECONDS = 0.1

    def __init__(self, source: Iterator[T], *, depth: int = 1, name: str = "prefetch"):
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._slots = threading.Semaphore(depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._produce, args=(source,), name=name)
        self._thread.start()

    def _produce(self, source: Iterator[T]) -> None:
        try:
            while self._take_slot():
                try:
                    item: object = next(source)
                except StopIteration:
                    item = _DONE
                self._queue.put(item)
                if item is _DONE:
                    return
        except BaseException as exc:  # handed to the consumer, which raises it
            self._queue.put(_Failed(exc))

    def _take_slot(self) -> bool:
        while not self._stop.is_set():
            if self._slots.acquire(timeout=self.POLL_SECONDS):
                return True
        return False

    def __iter__(self) -> Iterator[T]:
        while True:
            item = self._queue.get()
            self._slots.release()
            if item is _DONE:
                return
            if isinstance(item, _Failed):
                raise item.error
            yield item  # type: ignore[misc]

    def close(self) -> None:
        self._stop.set()
        self._thread.join()

    def __enter__(self) -> Prefetch[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
