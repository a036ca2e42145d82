"""The batch stage: request bodies and ranges, and the prefetching thread."""

from __future__ import annotations

import threading

import msgspec
import pytest

from evalpush.convert import Converted
from evalpush.core.setaside import SetAside
from evalpush.core.states import SetAsideKind
from evalpush.runs import Line
from evalpush.upload import Batch, Prefetch, batches


def converted(number: int, size: int = 10) -> Converted:
    sample = msgspec.json.encode({"sample_id": f"s{number}", "pad": "x" * size})
    return Converted(Line(b"", number * 100, number * 100 + 100, number), sample)


def batch_all(items: list, *, end: int, max_bytes: int = 10_000, max_samples: int = 1000):
    """Every batch of `items`, read from byte 100 (line 0) to `end`."""
    return list(
        batches(
            iter(items),
            start=100,
            start_line=0,
            end=end,
            max_batch_bytes=max_bytes,
            max_batch_samples=max_samples,
        )
    )


class TestBatches:
    def test_bodies_are_valid_json_holding_every_sample_once(self):
        items = [converted(n) for n in range(1, 8)]

        out = batch_all(items, end=800, max_bytes=10_000, max_samples=3)

        assert [len(b.samples) for b in out] == [3, 3, 1]
        ids = [s["sample_id"] for b in out for s in msgspec.json.decode(b.body())["samples"]]
        assert ids == [f"s{n}" for n in range(1, 8)]
        assert all(len(b.body()) == b.body_bytes for b in out)

    def test_batches_cover_the_range_end_to_end(self):
        items = [converted(n) for n in range(1, 6)]

        out = batch_all(items, end=600, max_bytes=10_000, max_samples=2)

        assert [(b.start, b.end, b.end_line) for b in out] == [
            (100, 300, 2),
            (300, 500, 4),
            (500, 600, 5),
        ]

    def test_a_body_never_exceeds_max_batch_bytes_unless_one_sample_does(self):
        items = [converted(n, size=400) for n in range(1, 10)]

        out = batch_all(items, end=1000, max_bytes=1_500, max_samples=1000)

        assert all(b.body_bytes <= 1_500 for b in out)
        assert sum(len(b.samples) for b in out) == 9

    def test_bad_lines_and_oversize_samples_travel_with_their_batch(self):
        huge = Converted(Line(b"", 300, 400, 3), b"x" * (26 * 1024 * 1024))
        bad = SetAside(2, 200, 100, SetAsideKind.BAD_LINE, "invalid JSON")
        items = [converted(1), bad, huge, converted(4)]

        (batch,) = batch_all(items, end=500, max_bytes=10_000, max_samples=10)

        assert [item.kind for item in batch.set_aside] == [
            SetAsideKind.BAD_LINE,
            SetAsideKind.REJECTED,
        ]
        assert batch.set_aside[1].size == 26 * 1024 * 1024
        assert len(batch.samples) == 2

    def test_a_split_keeps_the_samples_in_order_across_the_halves(self):
        batch = Batch([b"1", b"2", b"3"], [10, 20, 30], [1, 2, 3], 10, 40, 3)

        first, second = batch.split()

        assert first.samples + second.samples == batch.samples
        assert first.offsets + second.offsets == batch.offsets


class TestPrefetch:
    def test_items_arrive_in_order_and_the_thread_ends(self):
        with Prefetch(iter(range(50))) as ahead:
            assert list(ahead) == list(range(50))

    def test_the_producers_exception_is_raised_in_the_consumer_after_its_items(self):
        def source():
            yield 1
            yield 2
            raise ValueError("boom")

        seen = []
        with Prefetch(source()) as ahead, pytest.raises(ValueError, match="boom"):
            for item in ahead:
                seen.append(item)
        assert seen == [1, 2]

    def test_the_producer_builds_at_most_depth_items_ahead(self):
        built = []
        taken = threading.Event()

        def source():
            for n in range(10):
                built.append(n)
                yield n

        with Prefetch(source(), depth=1) as ahead:
            iterator = iter(ahead)
            assert next(iterator) == 0
            taken.wait(0.3)  # give the producer time to run ahead if it could
            assert len(built) <= 2  # the one taken, and one ahead

    def test_leaving_early_stops_the_producer(self):
        def endless():
            n = 0
            while True:
                n += 1
                yield n

        with Prefetch(endless()) as ahead:
            for item in ahead:
                if item == 3:
                    break
        # the autouse fixture fails the test if the producer thread were still alive
