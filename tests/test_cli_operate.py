"""Operating evalpush through the real CLI, as an operator would: `status RUN` and the
JSON of `status` and `push`, exit codes (credentials, --timeout, signals), outages told while
they last, `check`, read-only commands, logs and their journald priorities.

Each test runs `python -m evalpush ...` as a subprocess against a local platform on loopback,
with its own state directory and home (the `platform` and `evalpush` fixtures of conftest.py).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evalpush.local_platform import LocalPlatform
from support.commands import as_process, check_rows, status_json
from support.environ import cli_environ
from support.runs import OTHER_RUN_ID, RUN_ID, append_lines, trace_line, write_run
from support.waiting import wait_until

SAFETY_SECONDS = 60.0
"""A bound on waits that normally take a second or two (a loaded 2-core CI box)."""


# ---------------------------------------------------------------- status RUN, --json


class TestStatusOfOneRun:
    @pytest.fixture
    def pushed_twice(self, evalpush, platform, tmp_path) -> Path:
        """A run with a bad second line, pushed, then grown by a line and pushed again: one
        superseded evaluation, one current, one line set aside."""
        bad = b"{not json"
        run = write_run(tmp_path / "outputs", lines=[trace_line(0, 0), bad, trace_line(1, 0)])
        assert evalpush("push", str(tmp_path / "outputs")).returncode == 1
        append_lines(run, trace_line(2, 1))
        assert evalpush("push", str(tmp_path / "outputs")).returncode == 1
        return run

    def test_status_of_a_run_shows_its_evaluations_set_aside_lines_claim_and_timings(
        self, evalpush, platform, pushed_twice
    ):
        done = evalpush("status", RUN_ID[:8])
        first, second = (e["evaluation_id"] for e in status_json(evalpush)[0]["evaluations"])

        assert done.returncode == 0, done.stderr
        text = done.stdout
        assert f"run:        {RUN_ID}" in text
        assert f"path:       {pushed_twice}" in text
        assert "state:      finalized" in text
        assert "samples:    3 sent of 3 seen" in text
        assert "claim:      nobody holds it" in text
        assert platform.summary()["runs"][RUN_ID] == 2
        url = f"{platform.base_url}/dashboard/evaluations/"
        assert re.search(rf"^  superseded  {url}{first}  superseded: the run changed", text, re.M)
        assert re.search(rf"^  current     {url}{second}  finalized, \d{{4}}-", text, re.M)
        offset = len(trace_line(0, 0)) + 1
        assert f"  line 2, offset {offset}, 10 B, bad_line: invalid JSON: " in text, (
            "line number, byte offset, size (with its newline), kind and reason"
        )
        for label in ("created", "updated", "finalized"):
            assert re.search(rf"^{label}:\s+\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d", text, re.M), label

    def test_status_json_of_a_run_is_one_object_carrying_the_same(self, evalpush, pushed_twice):
        done = evalpush("status", str(pushed_twice), "--json")

        assert done.returncode == 0, done.stderr
        detail = json.loads(done.stdout)
        assert detail["run_id"] == RUN_ID and detail["state"] == "finalized"
        assert [e["outcome"] for e in detail["evaluations"]] == ["superseded", "current"]
        assert detail["evaluations"][1]["evaluation_id"] == detail["evaluation_id"]
        assert detail["set_aside"] == 1
        (record,) = detail["set_aside_records"]
        assert (record["line"], record["offset"], record["size"], record["kind"]) == (
            2,
            len(trace_line(0, 0)) + 1,
            10,
            "bad_line",
        )
        assert record["reason"].startswith("invalid JSON")
        assert detail["claim"] is None and detail["holder"] is None
        assert detail["created_at"] <= detail["updated_at"]
        assert detail["finalized_at"] is not None
        assert status_json(evalpush) == [detail], "status --json: the same object per run"

    def test_a_failed_run_shows_its_last_error_and_when(self, evalpush, tmp_path):
        run = write_run(tmp_path / "outputs")
        (run / "config.toml").write_text('model = "org/model"\n')  # no environment name
        before = time.time()
        assert evalpush("push", str(tmp_path / "outputs")).returncode == 1

        text = evalpush("status", RUN_ID).stdout
        detail = json.loads(evalpush("status", RUN_ID, "--json").stdout)

        assert detail["state"] == "failed" and "environment" in detail["last_error"]
        assert before - 1 <= detail["last_error_at"] <= time.time() + 1
        assert re.search(r"^last error: .*environment.* \(at \d{4}-\d\d-\d\d ", text, re.M), text

    def test_status_names_the_ledger_it_read(self, evalpush, tmp_path):
        write_run(tmp_path / "outputs")
        evalpush("push", str(tmp_path / "outputs"))

        done = evalpush("status")

        assert (
            done.stdout.splitlines()[0]
            == f"ledger:     {tmp_path / 'state' / 'state.db'}: 1 run: 1 finalized"
        )

    def test_an_unknown_run_is_a_usage_error(self, evalpush, tmp_path):
        write_run(tmp_path / "outputs")
        evalpush("push", str(tmp_path / "outputs"))

        done = evalpush("status", "ffffffff")

        assert done.returncode == 2 and "no run 'ffffffff'" in done.stderr


class TestPushJson:
    def test_push_json_is_one_object_per_run_with_state_evaluation_url_error_and_set_aside(
        self, evalpush, platform, tmp_path
    ):
        good = write_run(tmp_path / "outputs")
        bad = write_run(
            tmp_path / "outputs",
            run_id=OTHER_RUN_ID,
            lines=[trace_line(0, 0), b"[1, 2]", trace_line(1, 0)],
        )

        done = evalpush("push", "--json", str(tmp_path / "outputs"))

        assert done.returncode == 1, done.stderr
        results = {r["path"]: r for r in json.loads(done.stdout)["results"]}
        assert set(results) == {str(good), str(bad)}
        ok, partial = results[str(good)], results[str(bad)]
        for result in (ok, partial):
            assert result["state"] == "finalized"
            assert (
                result["url"]
                == f"{platform.base_url}/dashboard/evaluations/" + result["evaluation_id"]
            )
            assert result["error"] is None
        assert (ok["status"], ok["set_aside"], ok["set_aside_records"]) == ("success", 0, [])
        # 2 sent and 1 set aside of the 4 traces its config expects: partial, loudly.
        assert (partial["status"], partial["set_aside"], partial["missing_traces"]) == (
            "partial",
            1,
            1,
        )
        assert partial["set_aside_records"][0]["line"] == 2
        assert (ok["samples_sent"], partial["samples_sent"]) == (4, 2)

    def test_push_json_of_a_failed_run_carries_its_error(self, evalpush, tmp_path):
        run = write_run(tmp_path / "outputs")
        (run / "config.toml").write_text('model = "org/model"\n')

        done = evalpush("push", str(tmp_path / "outputs"), "--json")

        (result,) = json.loads(done.stdout)["results"]
        assert (result["state"], result["status"]) == ("failed", "failed")
        assert "environment" in result["error"] and result["evaluation_id"] is None


# ---------------------------------------------------------------- flags, help, read-only


class TestCommandLine:
    def test_global_flags_are_accepted_after_the_subcommand(self, evalpush, platform, tmp_path):
        write_run(tmp_path / "outputs")
        state = tmp_path / "elsewhere"
        config = tmp_path / "evalpush.toml"
        config.write_text(f'[state]\ndir = "{state}"\n')

        pushed = evalpush("push", str(tmp_path / "outputs"), "--state-dir", str(state))
        listed = evalpush("status", "--json", "--state-dir", str(state))
        checked = evalpush("check", "--config", str(config), EVALPUSH_STATE_DIR="")

        assert pushed.returncode == 0, pushed.stderr
        assert [row["run_id"] for row in json.loads(listed.stdout)] == [RUN_ID]
        assert checked.returncode == 0, checked.stdout + checked.stderr
        rows = check_rows(checked.stdout)
        assert rows["config"][1].startswith(f"{config}: valid")
        assert rows["ledger"][1].startswith(f"{state / 'state.db'}: 1 run known")
        assert not (tmp_path / "state").exists(), "the default state dir was not used"

    @pytest.mark.parametrize("where", [(), ("push",)])
    def test_help_documents_the_exit_codes(self, evalpush, where):
        done = evalpush(*where, "--help")

        assert done.returncode == 0
        codes = done.stdout[done.stdout.index("exit codes:") :]
        for code in ("0 ", "1 ", "2 ", "124 ", "130 "):
            assert re.search(rf"^  {code}", codes, re.M), code
        assert "143 by SIGTERM" in codes

    @pytest.mark.parametrize(
        "args",
        [("status",), ("status", "--json"), ("check",), ("retry", "abc"), ("forget", "abc")],
    )
    def test_read_only_commands_never_create_a_state_dir_or_ledger(self, evalpush, tmp_path, args):
        state = tmp_path / "never" / "state"

        done = evalpush(*args, EVALPUSH_STATE_DIR=str(state))

        assert not (tmp_path / "never").exists()
        if args[0] in ("retry", "forget"):
            assert done.returncode == 2
            assert f"no run 'abc': there is no ledger at {state / 'state.db'} yet" in done.stderr
        elif args == ("status",):
            assert done.stdout == f"no runs: there is no ledger at {state / 'state.db'} yet\n"
        elif args == ("status", "--json"):
            assert json.loads(done.stdout) == []


# ---------------------------------------------------------------- a reader that went away


class TestClosedPipe:
    """`evalpush status | head -1`: the reader goes away before evalpush is done writing."""

    @pytest.mark.parametrize(
        "args",
        [("status",), ("status", "--json"), ("push", "--json", "OUTPUTS"), ("--help",)],
    )
    def test_output_to_a_closed_pipe_ends_quietly_with_141_as_sigpipe_would(
        self, platform, tmp_path, args
    ):
        outputs = tmp_path / "outputs"
        write_run(outputs)
        environ = cli_environ(platform, tmp_path)
        if args[0] == "status":  # a ledger with a run to list
            pushed = subprocess.run(
                [sys.executable, "-m", "evalpush", "push", str(outputs)],
                env=environ,
                capture_output=True,
                timeout=SAFETY_SECONDS,
            )
            assert pushed.returncode == 0, pushed.stderr
        read_end, write_end = os.pipe()
        os.close(read_end)  # the reader is gone before a byte is written
        try:
            done = subprocess.run(
                [sys.executable, "-m", "evalpush"]
                + [str(outputs) if a == "OUTPUTS" else a for a in args],
                env=environ,
                stdout=write_end,
                stderr=subprocess.PIPE,
                text=True,
                timeout=SAFETY_SECONDS,
            )
        finally:
            os.close(write_end)

        assert done.stderr == ""
        # argparse drops a write error of its help and exits 0; every other output says 141
        assert done.returncode == (0 if args == ("--help",) else 141)
        if args[0] == "push":  # the upload was done; only its report found no reader
            (row,) = status_json(lambda *a: as_process(environ, *a))
            assert row["state"] == "finalized"


# ---------------------------------------------------------------- check


class TestCheck:
    def test_a_bad_configuration_is_a_failed_row_the_others_skipped_and_exit_2(self, evalpush):
        done = evalpush("check", EVALPUSH_UPLOAD__MAX_CONCURRENT_RUNS="many")

        assert done.returncode == 2
        rows = check_rows(done.stdout)
        assert rows["config"][0] == "FAIL" and "upload.max_concurrent_runs" in rows["config"][1]
        assert "fix: " in rows["config"][1]
        assert {rows[c][0] for c in ("ledger", "credentials", "platform")} == {"SKIP"}

    def test_no_key_is_a_failed_credentials_row_and_exit_2(self, evalpush):
        done = evalpush("check", PRIME_API_KEY="")

        assert done.returncode == 2
        rows = check_rows(done.stdout)
        assert rows["credentials"][0] == "FAIL" and "PRIME_API_KEY" in rows["credentials"][1]
        assert rows["ledger"][0] == "OK" and rows["platform"][0] == "SKIP"

    def test_a_platform_that_cannot_be_reached_is_exit_1_with_the_fix(self, evalpush, platform):
        platform.inject("refuse", seconds=30)

        done = evalpush("check")

        assert done.returncode == 1, done.stdout + done.stderr
        result, detail = check_rows(done.stdout)["platform"]
        assert result == "FAIL" and "cannot be reached" in detail
        assert "fix: check platform.api_base_url" in detail
        assert "platform" in done.stderr


# ---------------------------------------------------------------- stopping: timeout, signals


def stalled_push(platform: LocalPlatform, tmp_path: Path, *flags: str) -> subprocess.Popen:
    """A push whose first samples request the platform acts on but does not answer (its
    answer is held past the test): the push waits there until it is stopped."""
    write_run(tmp_path / "outputs")
    platform.inject("stall", on="samples", seconds=SAFETY_SECONDS, count=1)
    return subprocess.Popen(
        [sys.executable, "-m", "evalpush", "push", str(tmp_path / "outputs"), *flags],
        env=cli_environ(platform, tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def assert_resumes_exactly_once(evalpush, platform: LocalPlatform, tmp_path: Path) -> None:
    """The stopped run is `ready` (interrupted, progress kept); the next push finishes it,
    every sample once."""
    (row,) = status_json(evalpush)
    assert row["state"] == "ready" and "interrupted" in row["reason"], row
    platform.clear_faults()
    again = evalpush("push", str(tmp_path / "outputs"))
    assert again.returncode == 0, again.stdout + again.stderr
    ((_, evaluation),) = platform.summary()["evaluations"].items()
    assert evaluation["status"] == "COMPLETED"
    assert evaluation["sample_count"] == evaluation["distinct_sample_ids"] == 4


class TestStopping:
    def test_push_timeout_stops_cleanly_keeps_progress_and_exits_124(
        self, evalpush, platform, tmp_path
    ):
        push = stalled_push(platform, tmp_path, "--timeout", "2s")
        out, err = push.communicate(timeout=SAFETY_SECONDS)

        assert push.returncode == 124, err
        assert "--timeout 2s ran out" in err and "progress is kept" in err
        assert "interrupted; push again to resume" in out
        assert_resumes_exactly_once(evalpush, platform, tmp_path)

    @pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
    def test_a_push_stopped_by_a_signal_exits_128_plus_it_and_keeps_progress(
        self, evalpush, platform, tmp_path, signum
    ):
        push = stalled_push(platform, tmp_path)
        wait_until(
            lambda: platform.summary()["requests"]["samples"] >= 1,
            "the samples request",
            timeout=SAFETY_SECONDS,
        )
        push.send_signal(signum)
        out, err = push.communicate(timeout=SAFETY_SECONDS)

        assert push.returncode == 128 + signum, err
        assert f"{signal.Signals(signum).name}: stopped" in err
        assert_resumes_exactly_once(evalpush, platform, tmp_path)

    def test_a_timeout_that_is_not_a_duration_is_a_usage_error(self, evalpush, tmp_path):
        write_run(tmp_path / "outputs")

        done = evalpush("push", str(tmp_path / "outputs"), "--timeout", "soon")

        assert done.returncode == 2 and "'soon' is not a duration" in done.stderr


# ---------------------------------------------------------------- outages


class TestOutage:
    # Past the first report (5 s) with room to spare: the outage starts when the fault is
    # injected, the push's own clock when its first request fails, a process start later (up
    # to several seconds on a loaded box: 4 s of the outage were left to it once at 8 s), and
    # the report must still come.
    OUTAGE_SECONDS = 10.0

    def test_push_says_when_the_platform_went_away_how_long_it_lasts_and_when_it_came_back(
        self, evalpush, platform, tmp_path
    ):
        write_run(tmp_path / "outputs")
        platform.inject("refuse", seconds=self.OUTAGE_SECONDS)
        started = time.monotonic()

        done = evalpush("push", str(tmp_path / "outputs"))

        assert done.returncode == 0, done.stderr
        assert time.monotonic() - started >= self.OUTAGE_SECONDS - 0.5
        lines = done.stderr.splitlines()
        assert lines[0].startswith("evalpush: platform unreachable: uploads wait while one probe")
        ongoing = [line for line in lines[1:-1] if "platform unreachable for" in line]
        assert ongoing, lines
        assert re.fullmatch(
            r"evalpush: platform unreachable for [5-9]s, \d+ attempts, next in \d+s; 1 upload paused",
            ongoing[0],
        ), ongoing[0]
        ended = re.fullmatch(
            r"evalpush: platform answers again: uploads resume after (\d+)s \((\d+) attempts\)",
            lines[-1],
        )
        assert ended, lines[-1]
        # As the push saw it: from its first failed request (which may come seconds after the
        # outage began, on a loaded box) past its report at 5 s, to the probe that got through
        # (probes back off, so that may be well after the platform's return).
        assert int(ended[1]) >= 5
        assert "4/4 samples" in done.stdout


# ---------------------------------------------------------------- logs


def log_lines(stream: str) -> list[dict]:
    return [json.loads(line) for line in stream.splitlines()]


class TestLogs:
    def test_at_debug_push_logs_each_upload_its_outcome_and_each_batch(
        self, evalpush, platform, tmp_path
    ):
        write_run(tmp_path / "outputs")

        done = evalpush(
            "push",
            str(tmp_path / "outputs"),
            EVALPUSH_LOG__LEVEL="DEBUG",  # any case
            EVALPUSH_LOG__FORMAT="json",
            EVALPUSH_UPLOAD__MAX_BATCH_SAMPLES="2",
        )

        assert done.returncode == 0, done.stderr
        events = log_lines(done.stderr)
        by_name = {e["event"]: e for e in events}
        assert by_name["upload started"]["level"] == "info"
        assert by_name["upload started"]["run"] == RUN_ID
        finalized = by_name["run finalized"]
        assert finalized["level"] == "info"
        assert (finalized["samples"], finalized["url"]) == (4, done.stdout.split(" -> ")[1].strip())
        assert finalized["bytes"] > 0 and finalized["seconds"] >= 0
        batches = [e for e in events if e["event"] == "batch acknowledged"]
        assert [b["lines"] for b in batches] == ["1-2", "3-4"]
        assert {b["level"] for b in batches} == {"debug"}

    def test_a_failed_upload_is_logged_with_why(self, evalpush, tmp_path):
        run = write_run(tmp_path / "outputs")
        (run / "config.toml").write_text('model = "org/model"\n')

        done = evalpush(
            "push",
            str(tmp_path / "outputs"),
            EVALPUSH_LOG__LEVEL="info",
            EVALPUSH_LOG__FORMAT="json",
        )

        (failed,) = [e for e in log_lines(done.stderr) if e["event"] == "upload failed"]
        assert failed["level"] == "error" and "environment" in failed["error"]
        assert failed["error"].endswith("fix config.toml, then `evalpush retry " + RUN_ID[:8] + "`")

    def test_under_systemd_each_json_line_starts_with_its_syslog_priority(
        self, evalpush, platform, tmp_path
    ):
        write_run(tmp_path / "outputs")
        broken = write_run(tmp_path / "outputs", run_id=OTHER_RUN_ID)
        (broken / "config.toml").write_text('model = "org/model"\n')

        done = evalpush(
            "push", str(tmp_path / "outputs"), EVALPUSH_LOG__LEVEL="info", INVOCATION_ID="0123abcd"
        )

        priorities = {}
        for line in done.stderr.splitlines():
            match = re.fullmatch(r"<(\d)>(\{.*\})", line)
            assert match, f"no priority prefix: {line!r}"
            priorities[json.loads(match[2])["event"]] = int(match[1])
        assert priorities["run finalized"] == 6 and priorities["upload failed"] == 3

    def test_journal_stream_naming_the_stream_prefixes_and_naming_another_does_not(
        self, platform, tmp_path
    ):
        write_run(tmp_path / "outputs")
        env = cli_environ(platform, tmp_path, EVALPUSH_LOG__LEVEL="info")
        read_end, write_end = os.pipe()
        st = os.fstat(write_end)
        outputs = []
        for journal in (f"{st.st_dev}:{st.st_ino}", f"{st.st_dev}:{st.st_ino + 1}"):
            done = subprocess.run(
                [sys.executable, "-m", "evalpush", "push", str(tmp_path / "outputs")],
                env={**env, "JOURNAL_STREAM": journal},
                stdout=subprocess.DEVNULL,
                stderr=write_end,
                timeout=SAFETY_SECONDS,
            )
            assert done.returncode == 0
            os.write(write_end, b"--\n")
        os.close(write_end)
        with os.fdopen(read_end, "rb") as pipe:
            outputs = pipe.read().decode().split("--\n")
        named, other = outputs[0].splitlines(), outputs[1].splitlines()
        assert named and all(line.startswith("<6>{") for line in named), named
        assert other and all(line.startswith("{") for line in other), other


class TestOfflineRunIds:
    """verifiers 0.4 names every run it ran offline `disabled-<16 hex>`: their first 8
    characters are all the same, so the short id people read and type keeps 8 hex digits."""

    def test_two_offline_runs_have_short_ids_of_their_own_that_status_and_retry_find(
        self, evalpush, tmp_path
    ):
        from evalpush.core.states import State
        from evalpush.ledger import Ledger, default_path, transitions

        ids = ["disabled-0123456789abcdef", "disabled-fedcba9876543210"]
        with Ledger(default_path(tmp_path / "state")) as ledger:
            for run_id in ids:
                record = ledger.add(
                    path=f"/runs/{run_id}", run_id=run_id, kind="eval", state=State.READY
                )
                transitions.fail(ledger, record, "the trace file is gone")

        table = evalpush("status").stdout
        lines = table.splitlines()
        header = next(i for i, line in enumerate(lines) if line.startswith("RUN "))
        shown = [line.split()[0] for line in lines[header + 1 :]]
        detail = evalpush("status", "disabled-01234567")
        retried = evalpush("retry", "disabled-fedcba98")

        assert shown == ["disabled-01234567", "disabled-fedcba98"]
        assert "`evalpush retry disabled-01234567`" in detail.stdout
        assert detail.returncode == 0 and ids[0] in detail.stdout and ids[1] not in detail.stdout
        assert retried.returncode == 0, retried.stdout + retried.stderr
        rows = {
            row["run_id"]: row["state"] for row in json.loads(evalpush("status", "--json").stdout)
        }
        assert rows == {ids[0]: "failed", ids[1]: "ready"}
