"""The operator's commands as real subprocesses: `push`, `status`, `retry`, `forget`.

Each test runs `python -m evalpush ...` against a local platform on loopback, with its own state
directory and home, and checks exit codes, what the command prints, and what the platform holds.
"""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
import time

import pytest

import disks
from support.commands import check_rows, status_json
from support.environ import cli_environ
from support.runs import OTHER_RUN_ID, RUN_ID, config_toml, trace_line, traces, write_run
from support.terminal import ANSI, on_a_terminal


class TestPush:
    def test_push_finalizes_a_run_and_prints_its_viewer_url(self, evalpush, platform, tmp_path):
        write_run(tmp_path / "outputs")

        done = evalpush("push", str(tmp_path / "outputs"))

        assert done.returncode == 0, done.stderr
        ((evaluation_id, evaluation),) = platform.summary()["evaluations"].items()
        assert evaluation["status"] == "COMPLETED"
        assert evaluation["sample_count"] == evaluation["distinct_sample_ids"] == 4
        assert (
            f"4/4 samples -> {platform.base_url}/dashboard/evaluations/{evaluation_id}"
            in done.stdout
        )

    def test_a_second_push_of_a_finalized_run_sends_nothing_and_says_so(
        self, evalpush, platform, tmp_path
    ):
        write_run(tmp_path / "outputs")
        assert evalpush("push", str(tmp_path / "outputs")).returncode == 0
        requests = platform.summary()["requests"]

        again = evalpush("push", str(tmp_path / "outputs"))

        assert again.returncode == 0
        assert "already finalized, nothing sent" in again.stdout
        assert platform.summary()["requests"] == requests

    def test_lines_set_aside_make_the_exit_code_1_and_show_in_status(
        self, evalpush, platform, tmp_path
    ):
        lines = [trace_line(0, 0), b"{not json", trace_line(1, 0)]
        write_run(tmp_path / "outputs", lines=lines)

        done = evalpush("push", str(tmp_path / "outputs"))

        assert done.returncode == 1
        assert "1 set aside" in done.stdout
        (row,) = status_json(evalpush)
        assert (row["state"], row["samples_sent"], row["set_aside"]) == ("finalized", 2, 1)

    def test_a_run_whose_every_line_is_set_aside_fails_with_its_reason_and_creates_nothing(
        self, evalpush, platform, tmp_path
    ):
        lines = [b"{not json", b'{"id": "t-1", "task": {}}']
        write_run(tmp_path / "outputs", lines=lines)

        done = evalpush("push", str(tmp_path / "outputs"))

        assert done.returncode == 1
        assert platform.summary()["evaluations"] == {}
        (row,) = status_json(evalpush)
        assert (row["state"], row["samples_sent"], row["set_aside"]) == ("failed", 0, 2)
        assert "2 lines, every one set aside" in row["last_error"], row["last_error"]
        assert "nothing to upload" in row["last_error"]
        detail = evalpush("status", RUN_ID)
        assert "every one set aside" in detail.stdout
        assert "line 2, offset 10, 26 B, bad_line: missing 'task.idx'" in detail.stdout
        assert "every one set aside" in done.stdout + done.stderr

    def test_a_wrong_key_stops_the_push_before_anything_is_sent_with_one_line_and_exit_2(
        self, evalpush, platform, tmp_path
    ):
        # This was exit 1 and one 401 line per run on stdout: credentials are
        # checked once, up front, and a refused key is a setup error (2) said in one line.
        write_run(tmp_path / "outputs")
        write_run(tmp_path / "outputs", run_id=OTHER_RUN_ID)
        wrong_key = "not-the-right-key-0123456789"

        done = evalpush("push", str(tmp_path / "outputs"), PRIME_API_KEY=wrong_key)

        assert done.returncode == 2
        (line,) = done.stderr.splitlines()
        assert "refused the API key from $PRIME_API_KEY" in line and "HTTP 401" in line
        assert wrong_key not in done.stdout + done.stderr
        assert platform.summary()["evaluations"] == {}
        # The local platform counts only the requests it accepted: none (the probe was refused).
        assert not any(platform.summary()["requests"].values())

    def test_no_key_at_all_is_one_clear_error_and_exit_2(self, evalpush, tmp_path):
        # Exit 2 (was 1), as for any configuration error.
        write_run(tmp_path / "outputs")

        done = evalpush("push", str(tmp_path / "outputs"), PRIME_API_KEY="")

        assert done.returncode == 2
        (line,) = done.stderr.splitlines()
        assert "PRIME_API_KEY" in line

    def test_a_missing_directory_is_a_usage_error(self, evalpush, tmp_path):
        done = evalpush("push", str(tmp_path / "nowhere"))

        assert done.returncode == 2
        assert "no such directory" in done.stderr

    def test_a_directory_without_runs_exits_3_saying_no_run_was_found(self, evalpush, tmp_path):
        (tmp_path / "empty").mkdir()

        done = evalpush("push", str(tmp_path / "empty"))

        assert done.returncode == 3
        assert "no eval run found" in done.stderr

    def test_a_bad_config_value_is_a_usage_error_naming_the_key(self, evalpush, tmp_path):
        write_run(tmp_path / "outputs")

        done = evalpush(
            "push", str(tmp_path / "outputs"), EVALPUSH_UPLOAD__MAX_CONCURRENT_RUNS="many"
        )

        assert done.returncode == 2
        assert "upload.max_concurrent_runs" in done.stderr


class TestPartial:
    """A run with 3 of the 8 traces its config expects (4 tasks of 2 rollouts)."""

    @staticmethod
    def short_run(root):
        return write_run(root, traces(3), config=config_toml(num_tasks=4))

    def test_a_partial_upload_says_what_is_missing_and_exits_4(self, evalpush, platform, tmp_path):
        self.short_run(tmp_path / "outputs")

        done = evalpush("push", str(tmp_path / "outputs"))

        assert done.returncode == 4, done.stderr
        assert "3/8 samples (PARTIAL: 5 expected traces missing)" in done.stdout
        assert done.stdout.startswith("partial")
        ((_, evaluation),) = platform.summary()["evaluations"].items()
        assert evaluation["status"] == "COMPLETED" and evaluation["sample_count"] == 3

    def test_push_json_says_partial_with_the_expected_and_sent_counts(self, evalpush, tmp_path):
        self.short_run(tmp_path / "outputs")

        done = evalpush("push", "--json", str(tmp_path / "outputs"))

        (result,) = json.loads(done.stdout)["results"]
        assert done.returncode == 4
        assert (result["status"], result["outcome"]) == ("partial", "partial")
        assert (result["samples_sent"], result["expected_traces"]) == (3, 8)
        assert result["missing_traces"] == 5

    def test_push_partial_hold_overrides_the_configured_upload(self, evalpush, platform, tmp_path):
        self.short_run(tmp_path / "outputs")

        done = evalpush("push", "--partial", "hold", str(tmp_path / "outputs"))

        assert done.returncode == 1
        assert (
            done.stdout.startswith("held") and "incomplete: 3 of 8 expected traces" in done.stdout
        )
        assert platform.summary()["evaluations"] == {}
        assert [row["state"] for row in status_json(evalpush)] == ["held"]

    def test_push_partial_upload_overrides_the_configured_hold(self, evalpush, platform, tmp_path):
        self.short_run(tmp_path / "outputs")

        done = evalpush(
            "push",
            "--partial",
            "upload",
            str(tmp_path / "outputs"),
            EVALPUSH_RUNS__ON_INCOMPLETE="hold",
        )

        assert done.returncode == 4, done.stdout
        assert len(platform.summary()["evaluations"]) == 1

    def test_status_shows_sent_of_expected_and_marks_a_partial_run(self, evalpush, tmp_path):
        self.short_run(tmp_path / "outputs")
        write_run(tmp_path / "outputs", run_id=OTHER_RUN_ID)  # whole: 4 of 4
        evalpush("push", str(tmp_path / "outputs"))

        table = evalpush("status").stdout

        lines = table.splitlines()
        header = next(line for line in lines if line.startswith("RUN "))
        assert header.split()[:4] == ["RUN", "STATE", "SENT/EXPECTED", "ASIDE"]
        by_run = {row.split()[0]: row for row in lines[lines.index(header) + 1 :] if row}
        assert "3/8 partial" in by_run[RUN_ID[:8]]
        assert "PARTIAL: 5 of 8 expected traces missing" in by_run[RUN_ID[:8]]
        assert "4/4" in by_run[OTHER_RUN_ID[:8]] and "partial" not in by_run[OTHER_RUN_ID[:8]]

    def test_help_documents_exit_4_for_a_partial_upload(self, evalpush):
        codes = evalpush("push", "--help").stdout.split("exit codes:")[1]

        assert re.search(r"^  4 +every run uploaded .*but some partial", codes, re.M), codes


class TestStatus:
    def test_status_of_an_empty_ledger_says_so(self, evalpush):
        done = evalpush("status")

        assert done.returncode == 0
        assert "no runs" in done.stdout

    def test_status_json_has_every_documented_field(self, evalpush, platform, tmp_path):
        run = write_run(tmp_path / "outputs")
        evalpush("push", str(tmp_path / "outputs"))

        (row,) = status_json(evalpush)

        assert {
            "run_id",
            "path",
            "state",
            "reason",
            "samples_sent",
            "samples_seen",
            "set_aside",
            "evaluation_id",
            "url",
            "last_error",
        } <= set(row)
        assert (row["run_id"], row["path"], row["state"]) == (RUN_ID, str(run), "finalized")
        assert row["url"].endswith(row["evaluation_id"])

    def test_the_status_table_names_each_run_and_its_state(self, evalpush, tmp_path):
        write_run(tmp_path / "outputs")
        evalpush("push", str(tmp_path / "outputs"))

        table = evalpush("status").stdout

        assert RUN_ID[:8] in table
        assert "finalized" in table
        assert "4/4" in table


class TestRetryAndForget:
    def test_a_held_run_uploads_after_retry(self, evalpush, platform, tmp_path):
        lines = [trace_line(0, 0), b"[1, 2]", trace_line(1, 0)]
        write_run(tmp_path / "outputs", lines=lines)
        hold = {"EVALPUSH_CONVERT__ON_BAD_LINE": "hold"}

        held = evalpush("push", str(tmp_path / "outputs"), **hold)
        assert held.returncode == 1
        assert status_json(evalpush)[0]["state"] == "held"
        assert platform.summary()["evaluations"] == {}

        assert evalpush("retry", RUN_ID[:8]).returncode == 0
        evalpush("push", str(tmp_path / "outputs"), **hold)

        (row,) = status_json(evalpush)
        assert (row["state"], row["samples_sent"], row["set_aside"]) == ("finalized", 2, 1)

    def test_retry_refuses_a_run_that_is_not_failed_or_held(self, evalpush, tmp_path):
        write_run(tmp_path / "outputs")
        evalpush("push", str(tmp_path / "outputs"))

        done = evalpush("retry", RUN_ID)

        assert done.returncode == 1
        assert "only failed or held runs" in done.stderr

    def test_forget_drops_the_run_so_it_is_seen_as_new(self, evalpush, tmp_path):
        run = write_run(tmp_path / "outputs")
        evalpush("push", str(tmp_path / "outputs"))

        done = evalpush("forget", str(run), "--yes")

        assert done.returncode == 0
        assert status_json(evalpush) == []

    def test_an_unknown_run_is_a_usage_error(self, evalpush):
        done = evalpush("forget", "no-such-run")

        assert done.returncode == 2
        assert "no run 'no-such-run'" in done.stderr


class TestCheck:
    def test_check_reports_each_part_and_exits_0_when_all_work(self, evalpush, platform, tmp_path):
        roots = tmp_path / "outputs"
        roots.mkdir()
        done = evalpush("check", EVALPUSH_WATCH__ROOTS=f'["{roots}"]')

        assert done.returncode == 0, done.stdout + done.stderr
        rows = check_rows(done.stdout)
        assert list(rows) == ["config", "watch", "ledger", "credentials", "platform"]
        assert {result for result, _ in rows.values()} == {"OK"}
        assert f"key from $PRIME_API_KEY; api {platform.base_url}" in rows["credentials"][1]
        assert "reachable, key accepted" in rows["platform"][1]
        assert platform.api_key not in done.stdout + done.stderr

    def test_check_names_a_retired_key_it_ignored(self, evalpush, tmp_path):
        config = tmp_path / "old.toml"
        config.write_text("[upload]\npush_processes = 1\n")

        done = evalpush("--config", str(config), "check")

        result, detail = check_rows(done.stdout)["config"]
        assert result == "OK"
        assert detail == (
            f"{config}: valid; ignored, retired: {config}: upload.push_processes "
            "(a push uploads every run in its own process)"
        )

    def test_check_exits_2_when_the_platform_refuses_the_key(self, evalpush):
        # A refused key is a credentials error, exit 2 (was 1, `NOT OK`).
        done = evalpush("check", PRIME_API_KEY="wrong-key-wrong-key-0000")

        assert done.returncode == 2
        result, detail = check_rows(done.stdout)["platform"]
        assert result == "FAIL" and "HTTP 401" in detail and "fix: " in detail

    def test_check_exits_2_on_plain_http_to_a_remote_host(self, evalpush):
        done = evalpush("check", PRIME_API_BASE_URL="http://platform.example.com")

        assert done.returncode == 2
        assert "plain http to a non-loopback host" in done.stderr


def frames(screen: bytes) -> list[str]:
    """The bar's frames as drawn one over the other: split where the line is redrawn."""
    text = ANSI.sub(b"", screen.replace(b"\x1b[2K", b"\r")).decode(errors="replace")
    return [frame.strip() for frame in re.split(r"[\r\n]+", text) if frame.strip()]


class TestProgress:
    def test_on_a_terminal_the_bar_has_its_totals_from_the_start_and_ends_on_them(
        self, platform, tmp_path
    ):
        run = write_run(tmp_path / "outputs", lines=[trace_line(i, i // 2) for i in range(400)])
        size = (run / "traces.jsonl").stat().st_size
        total = f"{size / 1000:.1f} kB"
        env = cli_environ(
            platform,
            tmp_path,
            EVALPUSH_UPLOAD__MAX_BATCH_SAMPLES="10",
            EVALPUSH_LOG__LEVEL="warning",
        )

        code, out, screen = on_a_terminal(env, "push", str(tmp_path / "outputs"))

        assert code == 0
        drawn = [frame for frame in frames(screen) if " runs" in frame]
        assert len(drawn) >= 2, drawn
        assert f"0.0/{total}" in drawn[0] and "0/1 runs" in drawn[0], "totals before any byte"
        last = drawn[-1]
        assert f"{size / 1000:.1f}/{total}" in last, last
        assert "100%" in last and "400 samples" in last and "1/1 runs" in last, last
        assert re.search(r"\d[\d.,]* [kM]?B/s", last), "a byte rate"
        assert b"400/400 samples" in out

    def test_without_a_terminal_each_run_is_one_line_as_it_finishes(self, evalpush, tmp_path):
        write_run(tmp_path / "outputs")
        write_run(tmp_path / "outputs", run_id=OTHER_RUN_ID)

        done = evalpush("push", str(tmp_path / "outputs"))

        assert done.returncode == 0
        lines = done.stdout.splitlines()
        assert len(lines) == 2 and all(line.startswith("finalized ") for line in lines)
        assert done.stderr == ""


# ---------------------------------------------------------------- names that are not UTF-8


class TestNamesThatAreNotUtf8:
    def test_runs_under_directory_names_that_are_not_utf8_upload_beside_the_others(
        self, evalpush, platform, tmp_path
    ):
        outputs = tmp_path / "outputs"
        write_run(outputs)
        odd_parent = outputs / os.fsdecode(b"env-\xff-model")
        write_run(odd_parent, run_id=OTHER_RUN_ID)
        not_a_uuid = odd_parent / "gsm8k--org--model--default" / os.fsdecode(b"run-\xfe")
        not_a_uuid.mkdir(parents=True)
        for name in ("config.toml", "traces.jsonl"):
            (not_a_uuid / name).write_bytes(
                (outputs / "gsm8k--org--model--default" / RUN_ID / name).read_bytes()
            )

        done = evalpush("push", str(outputs))

        assert done.returncode == 0, done.stdout + done.stderr
        assert "Traceback" not in done.stderr
        assert "env-\\xff-model" in done.stdout and "run-\\xfe" in done.stdout
        evaluations = platform.summary()["evaluations"].values()
        assert len(evaluations) == 3
        assert {e["status"] for e in evaluations} == {"COMPLETED"}
        rows = status_json(evalpush)
        assert sorted(row["state"] for row in rows) == ["finalized"] * 3
        assert any("env-\\xff-model" in row["path"] for row in rows)
        escaped = next(row for row in rows if "env-\\xff-model" in row["path"])
        assert "env-\\xff-model" in evalpush("status", escaped["run_id"]).stdout


# ---------------------------------------------------------------- naming a run on the command line


class TestRunKeys:
    def test_an_empty_run_key_is_refused_and_forgets_nothing(self, evalpush, tmp_path):
        write_run(tmp_path / "outputs")
        evalpush("push", str(tmp_path / "outputs"))

        done = evalpush("forget", "", "--yes")

        assert done.returncode == 2
        assert "empty run key" in done.stderr
        assert len(status_json(evalpush)) == 1

    def test_a_prefix_is_literal_so_wildcards_match_nothing(self, evalpush, tmp_path):
        write_run(tmp_path / "outputs")  # run id 5b0c7f3e-...
        evalpush("push", str(tmp_path / "outputs"))

        for key in ("5b_c", "5b0%", "%"):
            done = evalpush("forget", key, "--yes")
            assert done.returncode == 2, key
            assert f"no run {key!r}" in done.stderr
        assert len(status_json(evalpush)) == 1

    def test_an_ambiguous_prefix_lists_its_candidates(self, evalpush, tmp_path):
        twin = "5b0c7f3e-0000-4000-8000-000000000000"
        write_run(tmp_path / "outputs")
        write_run(tmp_path / "outputs", run_id=twin)
        evalpush("push", str(tmp_path / "outputs"))

        done = evalpush("retry", "5b0c")

        assert done.returncode == 2
        assert "could be any of 2 runs" in done.stderr
        assert RUN_ID in done.stderr and twin in done.stderr


class TestForgettingAnUploadedRun:
    def test_forget_of_a_finalized_run_says_what_it_costs_and_refuses_without_a_tty(
        self, evalpush, tmp_path
    ):
        write_run(tmp_path / "outputs")
        evalpush("push", str(tmp_path / "outputs"))

        done = evalpush("forget", RUN_ID)

        assert done.returncode == 1
        assert "SECOND evaluation" in done.stderr and "--yes" in done.stderr
        assert len(status_json(evalpush)) == 1

    @pytest.mark.parametrize(("answer", "forgotten"), [(b"y\n", True), (b"\n", False)])
    def test_forget_on_a_terminal_asks_first(self, platform, tmp_path, answer, forgotten):
        write_run(tmp_path / "outputs")
        env = cli_environ(platform, tmp_path)
        subprocess.run(
            [sys.executable, "-m", "evalpush", "push", str(tmp_path / "outputs")],
            env=env,
            capture_output=True,
            timeout=60,
        )
        primary, secondary = pty.openpty()
        os.write(primary, answer)
        done = subprocess.run(
            [sys.executable, "-m", "evalpush", "forget", RUN_ID],
            env=env,
            stdin=secondary,
            capture_output=True,
            text=True,
            timeout=60,
        )
        os.close(secondary)
        os.close(primary)

        assert done.returncode == (0 if forgotten else 1)
        assert "Forget it? [y/N]" in done.stdout
        listed = subprocess.run(
            [sys.executable, "-m", "evalpush", "status", "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert len(json.loads(listed.stdout)) == (0 if forgotten else 1)

    def test_push_after_forget_creates_a_second_evaluation_as_it_said(
        self, evalpush, platform, tmp_path
    ):
        write_run(tmp_path / "outputs")
        evalpush("push", str(tmp_path / "outputs"))
        assert evalpush("forget", RUN_ID, "--yes").returncode == 0

        done = evalpush("push", str(tmp_path / "outputs"))

        assert done.returncode == 0
        assert platform.summary()["runs"][RUN_ID] == 2


# ---------------------------------------------------------------- after a ledger error


class TestAfterALedgerError:
    def test_a_run_stopped_by_a_full_ledger_disk_shows_as_interrupted_not_uploading(
        self, platform, tmp_path
    ):
        lines = [trace_line(i, i) for i in range(600)]
        write_run(tmp_path / "outputs", lines=lines)
        with disks.tiny_disk(tmp_path / "disk") as disk:
            env = cli_environ(
                platform,
                tmp_path,
                EVALPUSH_STATE_DIR=str(disk / "state"),
                EVALPUSH_UPLOAD__MAX_BATCH_SAMPLES="5",
                EVALPUSH_LOG__LEVEL="warning",
            )
            push = subprocess.Popen(
                [sys.executable, "-m", "evalpush", "push", str(tmp_path / "outputs")],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            deadline = time.monotonic() + 30
            while platform.summary()["requests"].get("samples", 0) < 2:
                assert push.poll() is None and time.monotonic() < deadline
                time.sleep(0.01)
            disks.fill(disk)
            _, err = push.communicate(timeout=60)
            disks.free(disk)

            listed = subprocess.run(
                [sys.executable, "-m", "evalpush", "status", "--json"],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )

        assert push.returncode == 1
        assert b"database or disk is full" in err
        (row,) = json.loads(listed.stdout)
        assert row["state"] == "ready"
        assert row["reason"].startswith("interrupted")
        assert row["holder"] is None


def test_a_run_that_fails_under_a_name_that_is_not_utf8_is_reported_escaped(
    evalpush, platform, tmp_path
):
    outputs = tmp_path / "outputs"
    write_run(outputs)
    broken = write_run(outputs / os.fsdecode(b"env-\xff"), run_id=OTHER_RUN_ID)
    (broken / "config.toml").write_text('model = "org/model"\n')  # no environment name

    done = evalpush("push", str(outputs))

    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    [failed] = [line for line in done.stdout.splitlines() if line.startswith("failed")]
    assert "env-\\xff" in failed and "no environment name" in failed
    assert platform.summary()["runs"] == {RUN_ID: 1}


def test_push_json_reports_a_run_that_fails_under_a_name_that_is_not_utf8_escaped(
    evalpush, platform, tmp_path
):
    # Its error names the path with a lone surrogate for the byte: `--json` ended with a
    # UnicodeEncodeError traceback, and no document.
    outputs = tmp_path / "outputs"
    write_run(outputs)
    broken = write_run(outputs / os.fsdecode(b"env-\xff"), run_id=OTHER_RUN_ID)
    (broken / "config.toml").write_text("not = toml [[[")

    done = evalpush("push", str(outputs), "--json")

    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    [failed] = [r for r in json.loads(done.stdout)["results"] if r["status"] == "failed"]
    assert "env-\\xff" in failed["error"] and "not valid TOML" in failed["error"]
