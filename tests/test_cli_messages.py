"""What the `evalpush` command says of itself and of what went wrong: each subcommand's help
with its own exit codes and every argument explained, the fix a configuration error offers,
what `push` says (and exits) when it finds no run, and counts in words that agree with them.

Each test runs `python -m evalpush ...` as a process.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from support.commands import as_process, check_rows
from support.environ import clean_environ, cli_environ
from support.runs import RUN_ID, make_run, trace_line, write_run

COMMANDS = [
    "convert",
    "push",
    "run",
    "status",
    "retry",
    "forget",
    "check",
    "migrate",
    "demo",
    "local-platform",
]


def _help(*args: str) -> str:
    done = as_process(clean_environ(), *args, "--help")
    assert done.returncode == 0, done.stderr
    return done.stdout


def _exit_codes(text: str) -> str:
    return text[text.index("exit codes:") :]


@pytest.mark.parametrize("command", COMMANDS)
def test_each_commands_help_states_its_own_exit_codes(command):
    codes = _exit_codes(_help(command))

    assert re.search(r"^  0 ", codes, re.M)
    if command == "push":
        assert "every run finalized" in codes
        assert re.search(r"^  124 ", codes, re.M) and re.search(r"^  3 ", codes, re.M)
    else:
        assert "every run finalized" not in codes
        assert "push --timeout" not in codes


def test_push_dir_and_local_platform_host_and_port_are_explained_in_their_help():
    push, platform = _help("push"), _help("local-platform")

    assert re.search(r"^  DIR +\S", push, re.M), push
    assert re.search(r"^  --host HOST +\S", platform, re.M), platform
    assert re.search(r"^  --port PORT +\S", platform, re.M), platform


@pytest.mark.parametrize("command", ["convert", "demo", "local-platform"])
def test_a_command_that_uses_no_ledger_of_the_users_offers_no_state_dir(command):
    assert "--state-dir" not in _help(command)


def test_the_top_level_help_says_check_exits_1_for_the_ledger_or_a_watched_root_too():
    codes = _exit_codes(_help())

    assert "check: the ledger, the platform or a watched root cannot be used" in " ".join(
        codes.split()
    )


@pytest.mark.parametrize(
    ("content", "fix"),
    [
        ("[upload\nmax_concurrent_runs = 2\n", "correct the TOML syntax"),
        (None, "create it, or point --config"),
    ],
    ids=["a TOML syntax error", "a missing file"],
)
def test_check_offers_the_fix_for_a_config_file_that_names_no_key(tmp_path, content, fix):
    config = tmp_path / "evalpush.toml"
    if content is not None:
        config.write_text(content)

    done = as_process(clean_environ(HOME=str(tmp_path)), "check", "--config", str(config))

    assert done.returncode == 2
    result, detail = check_rows(done.stdout)["config"]
    assert result == "FAIL"
    assert "correct the key it names" not in detail
    assert f"fix: {fix}" in detail


def test_push_of_a_directory_holding_no_run_exits_3_not_the_code_of_a_configuration_error(
    platform, tmp_path
):
    (tmp_path / "empty").mkdir()

    done = as_process(cli_environ(platform, tmp_path), "push", str(tmp_path / "empty"))

    assert done.returncode == 3
    assert "no eval run found" in done.stderr


@pytest.mark.parametrize("kind", ["fifo", "symlink out of the root"])
def test_push_of_a_tree_whose_only_trace_file_is_not_a_regular_file_says_what_it_found_and_why(
    platform, tmp_path, kind
):
    run = make_run(tmp_path / "outputs" / "gsm8k--m" / RUN_ID, traces=None)
    traces = run / "traces.jsonl"
    if kind == "fifo":
        os.mkfifo(traces)
        said = f"{traces} is a FIFO (named pipe), not a regular file"
    else:
        elsewhere = make_run(tmp_path / "elsewhere", data=trace_line(0, 0) + b"\n")
        traces.symlink_to(elsewhere / "traces.jsonl")
        said = f"{traces} is a symlink (to {elsewhere / 'traces.jsonl'}), not a regular file"

    done = as_process(cli_environ(platform, tmp_path), "push", str(tmp_path / "outputs"))

    assert done.returncode == 3
    assert "no eval run found" in done.stderr
    assert said in done.stderr, done.stderr


def test_a_run_held_for_one_bad_line_says_1_bad_line(platform, tmp_path):
    write_run(tmp_path / "outputs", lines=[trace_line(0, 0), b"{not json", trace_line(1, 0)])
    environ = cli_environ(platform, tmp_path, EVALPUSH_CONVERT__ON_BAD_LINE="hold")
    assert as_process(environ, "push", str(tmp_path / "outputs")).returncode == 1

    done = as_process(environ, "status", RUN_ID)

    assert "1 bad line set aside" in done.stdout, done.stdout


def test_check_counts_one_run_known_in_the_singular(platform, tmp_path):
    write_run(tmp_path / "outputs")
    environ = cli_environ(platform, tmp_path)
    assert as_process(environ, "push", str(tmp_path / "outputs")).returncode == 0

    done = as_process(environ, "check")

    assert check_rows(done.stdout)["ledger"][1].startswith(
        f"{Path(environ['EVALPUSH_STATE_DIR']) / 'state.db'}: 1 run known"
    )
