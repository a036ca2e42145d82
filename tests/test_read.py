"""The read stage: complete lines by byte offset, bounded memory, and the file's identity."""

from __future__ import annotations

import errno
import hashlib
import os
import random
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from as_nobody import without_read_access
from evalpush.runs import (
    Change,
    FileChangedError,
    Fingerprint,
    Line,
    RangeDigest,
    compare,
    digest_of,
    identity,
    read,
    read_lines,
    verify,
)
from support.files import append, write

MIB = 1024 * 1024


def read_all(path: Path, *, max_line_bytes: int = MIB, **kwargs: Any) -> list[Line]:
    return list(read_lines(path, max_line_bytes=max_line_bytes, **kwargs))


def outcome_without_read_access(locked: Path, fn: Callable[[], Any]) -> tuple[str, str]:
    """What `fn()` does for a user who may not read `locked`: ("ok", repr) or (error class, text)."""
    return without_read_access(locked, lambda: _outcome(fn))


def _outcome(fn: Callable[[], Any]) -> tuple[str, str]:
    try:
        return ("ok", repr(fn()))
    except Exception as exc:  # noqa: BLE001 - the test asserts on which one
        return (type(exc).__name__, str(exc))


class TestLines:
    def test_only_newline_terminated_lines_are_records(self, tmp_path):
        path = write(tmp_path / "t.jsonl", b"one\ntwo\nthr")

        assert [line.data for line in read_all(path)] == [b"one", b"two"]

    def test_each_line_carries_its_exact_byte_range_and_line_number(self, tmp_path):
        content = b"a\n\nccc\n" + "é".encode() + b"\n"
        path = write(tmp_path / "t.jsonl", content)

        lines = read_all(path)

        assert lines == [
            Line(b"a", 0, 2, 1),
            Line(b"", 2, 3, 2),
            Line(b"ccc", 3, 7, 3),
            Line("é".encode(), 7, 10, 4),
        ]
        assert all(content[line.start : line.end] == line.data + b"\n" for line in lines)

    def test_an_empty_file_has_no_lines(self, tmp_path):
        assert read_all(write(tmp_path / "t.jsonl", b"")) == []

    def test_a_half_written_last_line_is_read_once_it_is_completed(self, tmp_path):
        path = write(tmp_path / "t.jsonl", b'{"a": 1}\n{"b": ')
        first = read_all(path)
        assert first == [Line(b'{"a": 1}', 0, 9, 1)]

        append(path, b'2}\n{"c": 3}\n')
        rest = read_all(path, offset=first[-1].end, number=first[-1].number)

        assert rest == [Line(b'{"b": 2}', 9, 18, 2), Line(b'{"c": 3}', 18, 27, 3)]

    def test_resuming_at_a_saved_offset_gives_the_same_lines_as_one_pass(self, tmp_path):
        path = write(tmp_path / "t.jsonl", b"".join(b"line %d\n" % i for i in range(1, 8)))
        whole = read_all(path)
        saved = whole[2]

        resumed = read_all(path, offset=saved.end, number=saved.number)

        assert resumed == whole[3:]

    def test_end_stops_the_read_before_a_line_it_cuts(self, tmp_path):
        path = write(tmp_path / "t.jsonl", b"aa\nbb\ncc\n")

        assert [line.data for line in read_all(path, end=7)] == [b"aa", b"bb"]
        assert [line.data for line in read_all(path, end=6)] == [b"aa", b"bb"]
        assert [line.data for line in read_all(path, end=5)] == [b"aa"]

    def test_a_utf8_byte_order_mark_opening_the_file_is_skipped_but_counted(self, tmp_path):
        path = write(tmp_path / "t.jsonl", b"\xef\xbb\xbf" + b"a\nbb\n")

        assert read_all(path) == [Line(b"a", 3, 5, 1), Line(b"bb", 5, 8, 2)]
        assert read_all(path, offset=5, number=1) == [Line(b"bb", 5, 8, 2)]

    def test_a_byte_order_mark_after_the_start_is_data(self, tmp_path):
        path = write(tmp_path / "t.jsonl", b"a\n\xef\xbb\xbfb\n")

        assert read_all(path)[1] == Line(b"\xef\xbb\xbfb", 2, 7, 2)

    def test_lines_longer_than_a_read_chunk_are_joined(self, tmp_path, monkeypatch):
        monkeypatch.setattr(read, "CHUNK_BYTES", 4)
        path = write(tmp_path / "t.jsonl", b"abcdefghij\nk\nlmnopq\n")

        lines = read_all(path)

        assert lines == [
            Line(b"abcdefghij", 0, 11, 1),
            Line(b"k", 11, 13, 2),
            Line(b"lmnopq", 13, 20, 3),
        ]


class TestAnyFile:
    @pytest.mark.parametrize("seed", range(20))
    def test_every_chunk_size_finds_the_lines_a_plain_split_finds(
        self, tmp_path, monkeypatch, seed
    ):
        # Random lines (empty ones, ones longer than a chunk or than max_line_bytes, a last one
        # left unterminated) read in random small chunks: the lines, their byte ranges, numbers
        # and the over-long ones match what splitting the whole file at once says.
        rng = random.Random(seed)
        max_line_bytes = rng.randint(1, 12)
        data = b"".join(
            bytes(rng.choice(b"ab{}") for _ in range(rng.choice([0, 1, 3, 8, 13, 30]))) + b"\n"
            for _ in range(rng.randint(0, 40))
        ) + bytes(rng.choice(b"ab") for _ in range(rng.randint(0, 5)))
        path = write(tmp_path / "t.jsonl", data)
        expected, start = [], 0
        for number, piece in enumerate(data.split(b"\n")[:-1], start=1):
            end = start + len(piece) + 1
            expected.append(
                Line(piece if len(piece) <= max_line_bytes else None, start, end, number)
            )
            start = end
        monkeypatch.setattr(read, "CHUNK_BYTES", rng.randint(1, 16))

        assert read_all(path, max_line_bytes=max_line_bytes) == expected


class TestLongLines:
    def test_a_line_of_exactly_max_line_bytes_is_kept_and_one_byte_more_is_not(self, tmp_path):
        path = write(tmp_path / "t.jsonl", b"x" * 10 + b"\n" + b"y" * 11 + b"\nz\n")

        lines = read_all(path, max_line_bytes=10)

        assert lines == [
            Line(b"x" * 10, 0, 11, 1),
            Line(None, 11, 23, 2),
            Line(b"z", 23, 25, 3),
        ]

    def test_a_too_long_line_across_chunks_is_skipped_and_the_next_line_is_read(
        self, tmp_path, monkeypatch
    ):
        monkeypatch.setattr(read, "CHUNK_BYTES", 3)
        path = write(tmp_path / "t.jsonl", b"ok\n" + b"L" * 20 + b"\nnext\n")

        lines = read_all(path, max_line_bytes=5)

        assert lines == [Line(b"ok", 0, 3, 1), Line(None, 3, 24, 2), Line(b"next", 24, 29, 3)]

    def test_a_100_mb_line_is_skipped_without_being_held_in_memory(self, tmp_path):
        path = tmp_path / "t.jsonl"
        block = b"x" * MIB
        with path.open("wb") as f:
            f.write(b'{"before": 1}\n')
            for _ in range(100):
                f.write(block)
            f.write(b'\n{"after": 1}\n')
        del block

        tracemalloc.start()
        try:
            lines = read_all(path, max_line_bytes=MIB)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

        huge_start = len(b'{"before": 1}\n')
        assert lines == [
            Line(b'{"before": 1}', 0, huge_start, 1),
            Line(None, huge_start, huge_start + 100 * MIB + 1, 2),
            Line(b'{"after": 1}', huge_start + 100 * MIB + 1, path.stat().st_size, 3),
        ]
        assert peak < 5 * MIB, f"peak {peak / MIB:.1f} MiB: the long line was held"


class TestWhatIsRead:
    def test_a_symlink_is_not_followed(self, tmp_path):
        target = write(tmp_path / "real.jsonl", b"line\n")
        link = tmp_path / "traces.jsonl"
        link.symlink_to(target)

        with pytest.raises(OSError) as raised:
            read_all(link)

        assert raised.value.errno == errno.ELOOP

    def test_a_directory_is_not_read(self, tmp_path):
        with pytest.raises(IsADirectoryError, match="not a regular file"):
            read_all(tmp_path)

    @pytest.mark.timeout(5)
    def test_a_fifo_is_refused_without_waiting_for_a_writer(self, tmp_path):
        fifo = tmp_path / "traces.jsonl"
        os.mkfifo(fifo)

        with pytest.raises(IsADirectoryError, match="not a regular file"):
            read_all(fifo)

    def test_an_unreadable_file_raises_permission_error_naming_it(self, open_dir):
        path = write(open_dir / "traces.jsonl", b"line\n")

        kind, message = outcome_without_read_access(path, lambda: read_all(path))

        assert kind == "PermissionError"
        assert str(path) in message

    def test_expect_refuses_a_file_replaced_by_an_atomic_rename(self, tmp_path):
        path = write(tmp_path / "t.jsonl", b"old\n")
        known = identity(path)
        write(tmp_path / "t.tmp", b"old\nnew\n")
        os.replace(tmp_path / "t.tmp", path)

        with pytest.raises(FileChangedError):
            read_all(path, expect=known)

    def test_expect_refuses_a_file_truncated_below_the_offset(self, tmp_path):
        path = write(tmp_path / "t.jsonl", b"first\nsecond\n")
        known = identity(path)
        with path.open("r+b") as f:
            f.truncate(3)

        with pytest.raises(FileChangedError):
            read_all(path, offset=6, number=1, expect=known)

    def test_expect_reads_the_same_file_as_it_grows(self, tmp_path):
        path = write(tmp_path / "t.jsonl", b"first\n")
        known = identity(path)
        append(path, b"second\n")

        lines = read_all(path, offset=6, number=1, expect=known)

        assert lines == [Line(b"second", 6, 13, 2)]


class TestCompare:
    def test_an_untouched_file_is_the_same(self, tmp_path):
        path = write(tmp_path / "t.jsonl", b"a\n")

        assert compare(path, identity(path)) is Change.SAME

    def test_an_appended_file_has_grown(self, tmp_path):
        path = write(tmp_path / "t.jsonl", b"a\n")
        known = identity(path)
        append(path, b"b\n")

        assert compare(path, known) is Change.GROWN

    def test_an_atomic_rename_over_the_file_is_a_replacement_even_when_larger(self, tmp_path):
        path = write(tmp_path / "t.jsonl", b"a\n")
        known = identity(path)
        write(tmp_path / "t.tmp", b"a\nb\nc\n")
        os.replace(tmp_path / "t.tmp", path)

        assert compare(path, known) is Change.REPLACED

    def test_a_truncated_file_is_a_replacement(self, tmp_path):
        path = write(tmp_path / "t.jsonl", b"a\nb\n")
        known = identity(path)
        with path.open("r+b") as f:
            f.truncate(2)

        assert compare(path, known) is Change.REPLACED

    def test_a_deleted_file_is_gone(self, tmp_path):
        path = write(tmp_path / "t.jsonl", b"a\n")
        known = identity(path)
        path.unlink()

        assert compare(path, known) is Change.GONE

    def test_a_file_swapped_for_a_symlink_is_gone(self, tmp_path):
        path = write(tmp_path / "t.jsonl", b"a\n")
        known = identity(path)
        path.unlink()
        path.symlink_to(write(tmp_path / "elsewhere.jsonl", b"a\n"))

        assert compare(path, known) is Change.GONE


def fingerprint(path: Path) -> Fingerprint:
    digest = RangeDigest()
    lines = read_all(path, digest=digest)
    return Fingerprint(identity(path), lines[-1].end, digest.digest())


class TestFingerprint:
    def test_the_digest_covers_the_complete_lines_only(self, tmp_path):
        path = write(tmp_path / "t.jsonl", b"one\ntwo\nthr")

        known = fingerprint(path)

        assert known.end == 8
        assert known.digest == digest_of(path, 8) == hashlib.sha256(b"one\ntwo\n").digest()

    def test_an_untouched_file_is_the_same_without_a_read(self, tmp_path):
        path = write(tmp_path / "t.jsonl", b"a\nb\n")

        assert verify(path, fingerprint(path)) == (Change.SAME, identity(path))

    def test_a_file_rewritten_in_place_at_the_same_size_is_replaced(self, tmp_path):
        path = write(tmp_path / "t.jsonl", b"a\nb\n")
        known = fingerprint(path)
        with path.open("r+b") as f:
            f.write(b"c\nd\n")

        assert verify(path, known)[0] is Change.REPLACED

    def test_a_touched_file_or_a_copy_with_the_same_bytes_is_the_same(self, tmp_path):
        path = write(tmp_path / "t.jsonl", b"a\nb\n")
        known = fingerprint(path)
        os.utime(path, ns=(1, 1))
        assert verify(path, known)[0] is Change.SAME
        write(tmp_path / "t.tmp", b"a\nb\n")
        os.replace(tmp_path / "t.tmp", path)

        change, now = verify(path, known)

        assert change is Change.SAME and now.inode != known.identity.inode

    def test_a_file_with_more_lines_after_the_same_bytes_has_grown(self, tmp_path):
        path = write(tmp_path / "t.jsonl", b"a\nb\n")
        known = fingerprint(path)
        append(path, b"c\n")

        assert verify(path, known)[0] is Change.GROWN

    def test_a_file_rewritten_in_place_and_larger_is_replaced_not_grown(self, tmp_path):
        path = write(tmp_path / "t.jsonl", b"a\nb\n")
        known = fingerprint(path)
        with path.open("r+b") as f:
            f.truncate(0)
            f.write(b"x\ny\nz\n")

        assert verify(path, known)[0] is Change.REPLACED
