"""Run completion (runs/completion.py, runs/counter.py): the readiness rules as a pure function, and the line counter."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from evalpush.config import RunsConfig
from evalpush.core.words import format_duration
from evalpush.runs import (
    MARKER_SETTLE_SECONDS,
    Line,
    LineCounter,
    ReadinessRules,
    ReadyRule,
    RunFacts,
    identity,
    read_lines,
    readiness,
)
from support.files import append, write

NOW = 1_700_000_000.0
SETTLE = 300.0
MARKER = ".done"


def facts(
    lines: int = 212,
    expected: int | None = 400,
    *,
    marker_present: bool = False,
    quiet_seconds: float = 48.0,
    grown_at: float | None = None,
    again_after: float | None = None,
) -> RunFacts:
    """Facts of a run whose trace file was last modified `quiet_seconds` before NOW."""
    return RunFacts(lines, expected, marker_present, NOW - quiet_seconds, grown_at, again_after)


WITH_MARKER = ReadinessRules(SETTLE, MARKER)
NO_MARKER = ReadinessRules(SETTLE)


class TestReadiness:
    @pytest.mark.parametrize(
        "run, rules, rule, reason",
        [
            (facts(400), NO_MARKER, ReadyRule.EXPECTED_COUNT, "400/400 traces: the expected count"),
            (
                facts(401, quiet_seconds=SETTLE),
                NO_MARKER,
                ReadyRule.SETTLED,
                "no growth for 5m00s (401/400 traces)",
            ),
            (
                facts(401, marker_present=True, quiet_seconds=MARKER_SETTLE_SECONDS),
                WITH_MARKER,
                ReadyRule.MARKER,
                "marker .done present (401/400 traces, no growth for 10s)",
            ),
            (
                facts(400, again_after=NOW),
                NO_MARKER,
                ReadyRule.EXPECTED_COUNT,
                "400/400 traces: the expected count",
            ),
            (facts(0, 0), NO_MARKER, ReadyRule.EXPECTED_COUNT, "0/0 traces: the expected count"),
            (
                facts(marker_present=True),
                WITH_MARKER,
                ReadyRule.MARKER,
                "marker .done present (212/400 traces)",
            ),
            (
                facts(quiet_seconds=SETTLE),
                NO_MARKER,
                ReadyRule.SETTLED,
                "no growth for 5m00s (212/400 traces)",
            ),
            (
                facts(expected=None, quiet_seconds=7200),
                WITH_MARKER,
                ReadyRule.SETTLED,
                "no growth for 2h00m (212 traces)",
            ),
            (
                facts(quiet_seconds=0),
                ReadinessRules(0.0),
                ReadyRule.SETTLED,
                "no growth for 0s (212/400 traces)",
            ),
        ],
        ids=[
            "count reached exactly",
            "count exceeded, then settled",
            "count exceeded, marker present, then quiet a short while",
            "changed after finalize, its settle period over",
            "num_tasks = 0 expects nothing",
            "marker present",
            "settled at exactly settle_seconds",
            "settled long ago, count unknown",
            "settle_seconds = 0",
        ],
    )
    def test_a_run_is_ready_by_the_rule_that_holds(self, run, rules, rule, reason):
        result = readiness(run, NOW, rules)

        assert (result.ready, result.rule, result.reason) == (True, rule, reason)

    @pytest.mark.parametrize(
        "run, rules, reason",
        [
            (facts(), NO_MARKER, "212/400 traces, settles in 4m12s"),
            (facts(399, quiet_seconds=10), NO_MARKER, "399/400 traces, settles in 4m50s"),
            (facts(), WITH_MARKER, "212/400 traces, no marker .done yet, settles in 4m12s"),
            (
                facts(expected=None),
                WITH_MARKER,
                "212 traces, no marker .done yet, settles in 4m12s",
            ),
            (facts(10**6, None, quiet_seconds=0), NO_MARKER, "1000000 traces, settles in 5m00s"),
            (facts(marker_present=True), NO_MARKER, "212/400 traces, settles in 4m12s"),
            (facts(quiet_seconds=SETTLE - 0.5), NO_MARKER, "212/400 traces, settles in 1s"),
            (facts(quiet_seconds=-3600), NO_MARKER, "212/400 traces, settles in 1h05m"),
            (
                facts(401),
                NO_MARKER,
                "401/400 traces, past the expected count: waits for the file to settle, "
                "settles in 4m12s",
            ),
            (
                facts(401, marker_present=True, quiet_seconds=2),
                WITH_MARKER,
                "401/400 traces, past the expected count: waits for the file to settle, "
                "settles in 8s",
            ),
            (
                facts(400, again_after=NOW + 100),
                NO_MARKER,
                "400/400 traces, changed after it was finalized, again; uploads again in 1m40s",
            ),
        ],
        ids=[
            "short of the count",
            "one line short",
            "marker configured but absent",
            "count unknown, marker absent",
            "any number of lines without num_tasks",
            "a marker file nobody configured",
            "half a second before settling",
            "mtime in the future (a skewed file server)",
            "past the count and still growing",
            "past the count, marker present, growing a moment ago",
            "changed after finalize within its settle period",
        ],
    )
    def test_a_run_waits_with_a_reason_naming_each_rule_and_how_far(self, run, rules, reason):
        result = readiness(run, NOW, rules)

        assert (result.ready, result.rule, result.reason) == (False, None, reason)

    @pytest.mark.parametrize(
        "run, rule",
        [
            (facts(400, marker_present=True, quiet_seconds=3600), ReadyRule.EXPECTED_COUNT),
            (facts(marker_present=True, quiet_seconds=3600), ReadyRule.MARKER),
        ],
        ids=["count before marker and settle", "marker before settle"],
    )
    def test_when_several_rules_hold_the_first_in_spec_order_is_named(self, run, rule):
        assert readiness(run, NOW, WITH_MARKER).rule == rule

    def test_a_finalized_run_that_changed_wakes_its_tracker_when_it_may_upload_again(self):
        result = readiness(facts(400, again_after=NOW + 100), NOW, NO_MARKER)

        assert (result.ready, result.settles_at) == (False, NOW + 100)
        assert readiness(facts(400, again_after=NOW + 100), NOW + 100, NO_MARKER).ready

    def test_settle_counts_from_the_daemons_own_sighting_of_growth_when_it_is_later(self):
        # The file's mtime says an hour ago (another host's clock); the daemon saw it grow 10 s ago.
        run = facts(quiet_seconds=3600, grown_at=NOW - 10)

        result = readiness(run, NOW, NO_MARKER)

        assert (result.ready, result.settles_at) == (False, NOW - 10 + SETTLE)

    def test_settle_counts_from_the_mtime_when_it_is_later_than_the_daemons_sighting(self):
        run = facts(quiet_seconds=20, grown_at=NOW - 100)

        assert readiness(run, NOW, NO_MARKER).settles_at == NOW - 20 + SETTLE

    def test_the_answer_depends_only_on_the_facts_and_now(self):
        run = facts()

        assert readiness(run, NOW, NO_MARKER) == readiness(run, NOW, NO_MARKER)
        assert readiness(run, NOW + SETTLE, NO_MARKER).ready

    def test_the_rules_come_from_the_runs_section_of_the_config(self):
        rules = ReadinessRules.from_config(RunsConfig(settle_seconds=12, marker=".ok"))

        assert rules == ReadinessRules(12.0, ".ok")


@pytest.mark.parametrize(
    "seconds, text",
    [
        (0, "0s"),
        (0.9, "0s"),
        (59, "59s"),
        (60, "1m00s"),
        (252, "4m12s"),
        (3599, "59m59s"),
        (3600, "1h00m"),
        (3720, "1h02m"),
        (86400 + 4 * 3600 + 59, "1d04h"),
        (-5, "0s"),
    ],
)
def test_durations_read_as_at_most_two_units(seconds, text):
    assert format_duration(seconds) == text


class FakeClock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class RecordingSink:
    """A LineSink that keeps what it is fed, restarts included."""

    def __init__(self) -> None:
        self.events: list[Line | str] = []

    def restart(self) -> None:
        self.events.append("restart")

    def line(self, line: Line) -> None:
        self.events.append(line)


def overwrite_in_place(path: Path, offset: int, data: bytes) -> None:
    """Change bytes without changing the file's inode or size (to see what a counter re-reads)."""
    with path.open("r+b") as f:
        f.seek(offset)
        f.write(data)


def replace_atomically(path: Path, data: bytes) -> None:
    """What `--resume` does: write a temp file, rename it over the trace file (a new inode)."""
    temp = path.with_name(path.name + ".tmp")
    temp.write_bytes(data)
    os.replace(temp, path)


class TestLineCounter:
    def test_only_newline_terminated_lines_count(self, tmp_path):
        path = write(tmp_path / "traces.jsonl", b'{"a":1}\n{"b":2}\n{"c":')

        count = LineCounter(path).update()

        assert (count.lines, count.offset, count.size) == (2, 16, 21)

    def test_a_half_written_line_counts_once_its_newline_arrives(self, tmp_path):
        path = write(tmp_path / "traces.jsonl", b"one\ntw")
        counter = LineCounter(path)
        assert counter.update().lines == 1

        append(path, b"o\nthr")
        second = counter.update()
        append(path, b"ee\n")
        third = counter.update()

        assert (second.lines, second.offset, third.lines, third.offset) == (2, 8, 3, 14)

    def test_an_empty_file_has_no_lines(self, tmp_path):
        count = LineCounter(write(tmp_path / "traces.jsonl", b"")).update()

        assert (count.lines, count.offset, count.size) == (0, 0, 0)

    def test_only_bytes_added_since_the_last_look_are_read(self, tmp_path):
        path = write(tmp_path / "traces.jsonl", b"a\nb\n")
        counter = LineCounter(path)
        counter.update()
        # Same inode, same size: not a change a counter looks for. A recount from 0 would find
        # no newline in these bytes; the counter does not look at them again.
        overwrite_in_place(path, 0, b"xxxx")
        append(path, b"c\n")

        assert counter.update().lines == 3

    def test_a_half_written_lines_bytes_are_not_read_twice(self, tmp_path):
        path = write(tmp_path / "traces.jsonl", b"abcdef")
        counter = LineCounter(path)
        counter.update()
        overwrite_in_place(path, 0, b"a\nc\ne\n")  # bytes already looked at: not re-read
        append(path, b"g\n")

        count = counter.update()

        assert (count.lines, count.offset) == (1, 8)

    def test_lines_across_many_read_chunks_are_counted(self, tmp_path, monkeypatch):
        monkeypatch.setattr("evalpush.runs.counter.CHUNK_BYTES", 5)
        path = write(tmp_path / "traces.jsonl", b"".join(b"line %d\n" % i for i in range(1, 101)))

        count = LineCounter(path).update()

        assert (count.lines, count.offset) == (100, path.stat().st_size)

    def test_a_line_longer_than_max_line_bytes_still_counts_as_a_line(self, tmp_path):
        path = write(tmp_path / "traces.jsonl", b"x" * 100 + b"\nok\n")

        assert LineCounter(path, max_line_bytes=10).update().lines == 2

    @pytest.mark.parametrize(
        "change",
        [
            lambda path: replace_atomically(path, b"new 1\nnew 2\nnew 3\nnew 4\n"),
            lambda path: replace_atomically(path, b"n\n"),
            lambda path: write(path, b"short\n"),  # truncated in place, then one line
        ],
        ids=["replaced by a larger file", "replaced by a smaller file", "truncated in place"],
    )
    def test_a_replaced_or_shrunk_file_restarts_the_count(self, tmp_path, change):
        path = write(tmp_path / "traces.jsonl", b"old 1\nold 2\nold 3\n")
        counter = LineCounter(path)
        counter.update()

        change(path)
        count = counter.update()

        assert (count.replaced, count.lines) == (True, path.read_bytes().count(b"\n"))
        assert count.offset == path.stat().st_size

    def test_a_file_cut_inside_its_half_written_line_restarts_the_count(self, tmp_path):
        path = write(tmp_path / "traces.jsonl", b"a\nbcdef")
        counter = LineCounter(path)
        counter.update()
        os.truncate(path, 4)  # still past the last complete line, but shorter than seen
        append(path, b"x\n")

        count = counter.update()

        assert (count.replaced, count.lines, count.offset) == (True, 2, 6)

    def test_a_file_that_only_grew_is_not_a_replacement(self, tmp_path):
        path = write(tmp_path / "traces.jsonl", b"1\n")
        counter = LineCounter(path)
        first = counter.update()
        append(path, b"2\n")

        assert (first.replaced, counter.update().replaced) == (False, False)

    def test_growth_is_timed_by_the_injected_clock_and_the_first_look_counts_as_a_sighting(
        self, tmp_path
    ):
        path = write(tmp_path / "traces.jsonl", b"1\n")
        clock = FakeClock()
        counter = LineCounter(path, clock=clock)

        first = counter.update()
        clock.now += 30
        unchanged = counter.update()
        append(path, b"2")  # half a line is still growth: the producer is writing
        clock.now += 30
        grew = counter.update()
        clock.now += 30
        quiet = counter.update()
        replace_atomically(path, b"2\n")
        clock.now += 30
        replaced = counter.update()

        assert [c.grown_at for c in (first, unchanged, grew, quiet, replaced)] == [
            NOW,
            NOW,
            NOW + 60,
            NOW + 60,
            NOW + 120,
        ]

    def test_settle_is_measured_from_the_last_growth(self, tmp_path):
        path = write(tmp_path / "traces.jsonl", b"1\n")
        os.utime(path, (NOW - 3600, NOW - 3600))  # an hour ago by the file server's clock
        clock = FakeClock()
        counter = LineCounter(path, clock=clock)

        def ready_now() -> bool:
            count = counter.update()
            run = RunFacts(count.lines, None, False, count.mtime, count.grown_at)
            return readiness(run, clock.now, NO_MARKER).ready

        # The mtime is another clock's (a file server behind this host's makes a file being
        # written look an hour old): the settle time counts from the first look at the latest.
        assert not ready_now()
        clock.now += SETTLE
        assert ready_now()
        with path.open("ab") as f:
            f.write(b"2\n")
        os.utime(path, (NOW - 3600, NOW - 3600))  # an mtime that lies (a skewed file server)
        clock.now += 1
        assert not ready_now()  # the daemon saw it grow
        clock.now += SETTLE - 1
        assert not ready_now()
        clock.now += 1
        assert ready_now()

    def test_the_mtime_is_the_files(self, tmp_path):
        path = write(tmp_path / "traces.jsonl", b"")
        os.utime(path, ns=(0, 1_650_000_000_123_456_789))

        assert LineCounter(path).update().mtime == pytest.approx(1_650_000_000.123456789)

    @pytest.mark.parametrize(
        "make",
        [
            lambda tmp: tmp / "missing.jsonl",
            lambda tmp: _symlink(tmp, write(tmp / "real.jsonl", b"1\n")),
            lambda tmp: _fifo(tmp),
            lambda tmp: _directory(tmp),
        ],
        ids=["missing", "a symlink to a file", "a fifo without a writer", "a directory"],
    )
    def test_only_a_regular_file_is_read_and_anything_else_raises_oserror(self, tmp_path, make):
        with pytest.raises(OSError):
            LineCounter(make(tmp_path)).update()


class TestResume:
    def test_a_resumed_counter_reads_only_past_the_point_it_resumes_from(self, tmp_path):
        path = write(tmp_path / "traces.jsonl", b"a\nb\n")
        file = identity(path)
        overwrite_in_place(path, 0, b"xxxx")  # were these bytes read, no line would be found
        append(path, b"c\nd")

        count = LineCounter.resume(path, file, offset=4, lines=2).update()

        assert (count.replaced, count.lines, count.offset) == (False, 3, 6)

    def test_a_file_replaced_since_the_resume_point_is_counted_from_zero(self, tmp_path):
        path = write(tmp_path / "traces.jsonl", b"a\nb\n")
        file = identity(path)
        replace_atomically(path, b"new\n")

        count = LineCounter.resume(path, file, offset=4, lines=2).update()

        assert (count.replaced, count.lines, count.offset) == (True, 1, 4)

    def test_the_first_look_after_a_resume_is_not_growth_seen(self, tmp_path):
        # Growth while the daemon was down happened at an unknown time: the mtime tells it.
        path = write(tmp_path / "traces.jsonl", b"a\n")
        file = identity(path)
        append(path, b"b\n")
        clock = FakeClock()
        counter = LineCounter.resume(path, file, offset=2, lines=1, clock=clock)

        first = counter.update()
        append(path, b"c\n")
        clock.now += 5
        second = counter.update()

        assert (first.grown_at, second.grown_at) == (NOW, NOW + 5)


def _symlink(tmp: Path, target: Path) -> Path:
    (tmp / "traces.jsonl").symlink_to(target)
    return tmp / "traces.jsonl"


def _fifo(tmp: Path) -> Path:
    os.mkfifo(tmp / "traces.jsonl")
    return tmp / "traces.jsonl"


def _directory(tmp: Path) -> Path:
    (tmp / "traces.jsonl").mkdir()
    return tmp / "traces.jsonl"


class TestFeedingLines:
    def all_lines(self, path: Path) -> list[Line]:
        return list(read_lines(path, max_line_bytes=1 << 20))

    def test_the_sink_gets_each_complete_line_once_in_order_across_appends(self, tmp_path):
        path = write(tmp_path / "traces.jsonl", b'{"a":1}\n{"b"')
        counter, sink = LineCounter(path), RecordingSink()

        counter.update(sink)
        append(path, b':2}\n{"c":3}\n{')
        counter.update(sink)
        append(path, b'"d":4}\n')
        count = counter.update(sink)

        assert sink.events == self.all_lines(path)
        assert (count.lines, count.offset) == (4, path.stat().st_size)

    def test_a_replacement_restarts_the_sink_before_the_new_files_lines(self, tmp_path):
        path = write(tmp_path / "traces.jsonl", b"old 1\nold 2\n")
        counter, sink = LineCounter(path), RecordingSink()
        counter.update(sink)

        replace_atomically(path, b"new 1\n")
        counter.update(sink)

        assert sink.events[2] == "restart"
        assert sink.events[3:] == self.all_lines(path)

    def test_a_line_over_max_line_bytes_reaches_the_sink_without_its_bytes(self, tmp_path):
        path = write(tmp_path / "traces.jsonl", b"x" * 100 + b"\nok\n")
        sink = RecordingSink()

        LineCounter(path, max_line_bytes=10).update(sink)

        assert sink.events == [Line(None, 0, 101, 1), Line(b"ok", 101, 104, 2)]

    @pytest.mark.parametrize(
        "modes",
        [["count", "feed", "count", "feed"], ["feed", "count", "feed", "count"]],
        ids=["count first", "feed first"],
    )
    def test_counting_and_feeding_can_alternate_and_each_line_is_seen_once(self, tmp_path, modes):
        path = write(tmp_path / "traces.jsonl", b"")
        counter, sink = LineCounter(path), RecordingSink()
        counted_only = seen = 0
        for step, mode in enumerate(modes):
            # each step completes the half line the step before left, and leaves one
            append(path, (b"f\n" if step else b"") + b"line %d\nhal" % step)
            if mode == "count":
                lines = counter.update().lines
                counted_only, seen = counted_only + lines - seen, lines
            else:
                seen = counter.update(sink).lines

        whole = self.all_lines(path)
        assert counter.update().lines == len(whole)
        assert counted_only + len(sink.events) == len(whole)
        assert sink.events == [whole[line.number - 1] for line in sink.events]
