"""The runs stage: what a run directory is, its id, its kind, and the config fields it carries."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import uuid
from pathlib import Path

import pytest

from evalpush.core.errors import RunError
from evalpush.discover._scan import walk
from evalpush.runs import (
    Producer,
    RunKind,
    find_run_dirs,
    load_run,
    require_env_name,
    why_not_a_run,
)
from support.runs import make_run

RUN_UUID = "6f1c9a52-0d3e-4b7a-9c1e-2f8d4a6b3c10"


class TestRunId:
    def test_a_uuid_leaf_name_is_the_run_id(self, tmp_path):
        run = load_run(make_run(tmp_path / "gsm8k--m--h" / RUN_UUID))

        assert run.run_id == RUN_UUID

    def test_another_name_gets_the_documented_name_based_uuid(self, tmp_path):
        directory = make_run(tmp_path / "my-run")

        run = load_run(directory)

        key = f"evalpush:{socket.gethostname()}:{directory.absolute()}"
        assert run.run_id == str(uuid.uuid5(uuid.NAMESPACE_URL, key))

    def test_the_derived_id_is_the_same_on_every_load(self, tmp_path, monkeypatch):
        directory = make_run(tmp_path / "my-run")
        first = load_run(directory).run_id
        monkeypatch.chdir(directory)

        assert load_run(Path(".").absolute()).run_id == first
        assert load_run(directory).run_id == first

    def test_the_derived_id_differs_by_path(self, tmp_path):
        one = load_run(make_run(tmp_path / "a" / "run")).run_id
        two = load_run(make_run(tmp_path / "b" / "run")).run_id

        assert one != two

    def test_the_derived_id_differs_by_host(self, tmp_path, monkeypatch):
        directory = make_run(tmp_path / "run")
        monkeypatch.setattr(socket, "gethostname", lambda: "box-a")
        on_a = load_run(directory).run_id
        monkeypatch.setattr(socket, "gethostname", lambda: "box-b")

        assert load_run(directory).run_id != on_a

    def test_another_name_keeps_the_id_the_ledger_knows_for_its_path_whatever_the_host(
        self, tmp_path, monkeypatch
    ):
        directory = make_run(tmp_path / "my-run")
        known = {directory.absolute(): "11111111-2222-4333-8444-555555555555"}
        monkeypatch.setattr(socket, "gethostname", lambda: "renamed-host")

        assert load_run(directory, known=known.get).run_id == known[directory.absolute()]

    def test_a_uuid_leaf_name_is_the_run_id_whatever_the_ledger_knows(self, tmp_path):
        directory = make_run(tmp_path / "gsm8k--m--h" / RUN_UUID)

        assert load_run(directory, known=lambda _path: "another-id").run_id == RUN_UUID

    def test_a_name_that_is_not_utf8_gets_the_id_of_its_bytes(self, tmp_path):
        directory = make_run(tmp_path / os.fsdecode(b"run-\xff"))

        run_id = load_run(directory).run_id

        key = b"evalpush:%s:%s" % (socket.gethostname().encode(), os.fsencode(directory))
        digest = hashlib.sha1(uuid.NAMESPACE_URL.bytes + key).digest()
        assert run_id == str(uuid.UUID(bytes=digest[:16], version=5))
        assert run_id != load_run(make_run(tmp_path / os.fsdecode(b"run-\xfe"))).run_id


class TestRunKind:
    @pytest.mark.parametrize(
        "config, kind",
        [
            ('model = "m"\n[taskset]\nid = "e"\n', RunKind.EVAL),
            ('script_path = "s.py"\n[taskset]\nid = "e"\n', RunKind.DEBUG),
            ('command = "bash"\n[taskset]\nid = "e"\n', RunKind.DEBUG),
            ('num_rescores = 2\n[taskset]\nid = "e"\n', RunKind.REPLAY),
            ('num_rescores = 2\nmodel = "m"\n[taskset]\nid = "e"\n', RunKind.EVAL),
        ],
        ids=["eval", "debug script_path", "debug command", "replay", "num_rescores with a model"],
    )
    def test_the_config_says_which_kind_of_run_it_is(self, tmp_path, config, kind):
        assert load_run(make_run(tmp_path / RUN_UUID, config)).kind is kind


class TestRunFiles:
    def test_results_jsonl_is_read_when_traces_jsonl_is_absent(self, tmp_path):
        run = load_run(make_run(tmp_path / RUN_UUID, traces="results.jsonl"))

        assert run.traces_path == tmp_path / RUN_UUID / "results.jsonl"

    def test_traces_jsonl_is_preferred_when_both_exist(self, tmp_path):
        directory = make_run(tmp_path / RUN_UUID, traces="results.jsonl")
        (directory / "traces.jsonl").write_bytes(b"")

        assert load_run(directory).traces_path == directory / "traces.jsonl"

    def test_a_symlinked_trace_file_does_not_count(self, tmp_path):
        directory = make_run(tmp_path / RUN_UUID, traces=None)
        (tmp_path / "elsewhere.jsonl").write_bytes(b"")
        (directory / "traces.jsonl").symlink_to(tmp_path / "elsewhere.jsonl")

        with pytest.raises(RunError, match="no traces.jsonl"):
            load_run(directory)

    def test_a_missing_config_toml_is_a_run_error_naming_the_file(self, tmp_path):
        directory = make_run(tmp_path / RUN_UUID, config=None)

        with pytest.raises(RunError) as raised:
            load_run(directory)

        assert str(directory / "config.toml") in str(raised.value)

    def test_an_unparsable_config_toml_is_a_run_error_naming_the_file(self, tmp_path):
        directory = make_run(tmp_path / RUN_UUID, config="model = [unclosed\n")

        with pytest.raises(RunError, match="not valid TOML") as raised:
            load_run(directory)

        assert str(directory / "config.toml") in str(raised.value)

    def test_a_config_toml_that_is_not_utf8_is_a_run_error(self, tmp_path):
        directory = make_run(tmp_path / RUN_UUID)
        (directory / "config.toml").write_bytes(b'model = "\xff"\n')

        with pytest.raises(RunError, match="not valid TOML"):
            load_run(directory)

    @pytest.mark.parametrize("value", ["-1", '"two"', "true"])
    def test_a_bad_num_rollouts_is_a_run_error_naming_the_key(self, tmp_path, value):
        directory = make_run(tmp_path / RUN_UUID, f"num_rollouts = {value}\n")

        with pytest.raises(RunError, match="'num_rollouts' must be a non-negative integer"):
            load_run(directory)


class TestConfigFields:
    def test_the_environment_name_is_the_taskset_id(self, tmp_path):
        run = load_run(make_run(tmp_path / RUN_UUID, 'id = "legacy"\n[taskset]\nid = "gsm8k"\n'))

        assert run.env_name == "gsm8k"

    def test_an_empty_taskset_id_falls_back_to_the_top_level_id(self, tmp_path):
        run = load_run(make_run(tmp_path / RUN_UUID, 'id = "legacy-env"\n[taskset]\nid = ""\n'))

        assert run.env_name == "legacy-env"

    def test_a_missing_taskset_falls_back_to_the_top_level_id(self, tmp_path):
        run = load_run(make_run(tmp_path / RUN_UUID, 'id = "legacy-env"\n'))

        assert run.env_name == "legacy-env"

    def test_no_environment_name_is_a_run_error_naming_the_config_file(self, tmp_path):
        directory = make_run(tmp_path / RUN_UUID, 'model = "m"\n[taskset]\nid = ""\n')
        run = load_run(directory)

        with pytest.raises(RunError, match="no environment name") as raised:
            require_env_name(run)

        assert run.env_name == ""
        assert str(directory / "config.toml") in str(raised.value)

    def test_missing_keys_take_the_documented_defaults(self, tmp_path):
        run = load_run(make_run(tmp_path / RUN_UUID))

        assert (run.model, run.num_rollouts, run.num_tasks, run.pushed_inline) == (
            "deepseek/deepseek-v4-flash",
            1,
            None,
            True,
        )
        assert run.expected_traces is None

    def test_set_keys_are_read(self, tmp_path):
        config = (
            'model = "org/model"\nnum_rollouts = 4\nnum_tasks = 25\npush = false\n'
            '[taskset]\nid = "e"\n'
        )

        run = load_run(make_run(tmp_path / RUN_UUID, config))

        assert (run.model, run.num_rollouts, run.num_tasks, run.pushed_inline) == (
            "org/model",
            4,
            25,
            False,
        )
        assert run.expected_traces == 100

    def test_the_evaluation_name_is_env_model_and_the_run_ids_first_8_chars(self, tmp_path):
        run = load_run(
            make_run(tmp_path / RUN_UUID, 'model = "org/model"\n[taskset]\nid = "gsm8k"\n')
        )

        assert run.evaluation_name == "gsm8k--org/model--6f1c9a52"


class TestFindRunDirs:
    def test_runs_are_found_at_any_depth_in_sorted_order(self, tmp_path):
        make_run(tmp_path / "b--m--h" / RUN_UUID)
        make_run(tmp_path / "a--m--h" / "deeper" / "run")
        (tmp_path / "not-a-run").mkdir()
        make_run(tmp_path / "only-config", traces=None)

        found = list(find_run_dirs(tmp_path))

        assert found == [tmp_path / "a--m--h" / "deeper" / "run", tmp_path / "b--m--h" / RUN_UUID]

    def test_a_root_that_is_itself_a_run_is_the_one_run(self, tmp_path):
        root = make_run(tmp_path / RUN_UUID)
        make_run(root / "inside")

        assert list(find_run_dirs(root)) == [root]

    def test_debug_and_replay_runs_are_found_too(self, tmp_path):
        make_run(tmp_path / "e--debug" / "d", 'script_path = "s.py"\n')
        make_run(tmp_path / "e--replay" / "r", "num_rescores = 1\n")

        assert list(find_run_dirs(tmp_path)) == [
            tmp_path / "e--debug" / "d",
            tmp_path / "e--replay" / "r",
        ]

    def test_a_symlink_to_a_run_outside_the_root_is_not_followed(self, tmp_path):
        root = tmp_path / "root"
        make_run(root / "inside")
        outside = make_run(tmp_path / "outside" / "run")
        (root / "link").symlink_to(outside)
        (root / "linked-parent").symlink_to(tmp_path / "outside")

        assert list(find_run_dirs(root)) == [root / "inside"]


# ---------------------------------------------------------------- verifiers 0.3/0.4's layout


def episode_line(run_id: str, n: int = 0) -> bytes:
    episode = {"id": f"e{n}", "run": {"type": "eval", "id": run_id}, "ok": True, "traces": []}
    return json.dumps(episode).encode() + b"\n"


def resolved_run(
    directory: Path, config: dict | None = None, lines: bytes = b"", kind: str = "eval"
) -> Path:
    """A 0.3/0.4 run directory: `configs/resolved/<kind>.json`, `traces.jsonl`, its logs."""
    (directory / "configs" / "resolved").mkdir(parents=True)
    default = {
        "env": {"taskset": {"id": "gsm8k"}},
        "run": {"name": "gsm8k--m--default--0a1b2c3d"},
        "model": "org/model",
        "select": {"limit": 5},
        "num_rollouts": 3,
        "push": True,
    }
    text = json.dumps(default if config is None else config)
    (directory / "configs" / "resolved" / f"{kind}.json").write_text(text)
    (directory / "traces.jsonl").write_bytes(lines)
    (directory / "logs" / "attempt_1").mkdir(parents=True)
    (directory / "logs" / "latest").symlink_to("attempt_1")
    return directory


class TestTheResolvedLayout:
    def test_a_0_4_run_reads_its_config_and_takes_its_run_id_from_its_lines(self, tmp_path):
        directory = resolved_run(
            tmp_path / "gsm8k--m--default--0a1b2c3d", lines=episode_line("ev-1")
        )

        run = load_run(directory)

        assert (run.run_id, run.kind, run.producer) == ("ev-1", RunKind.EVAL, Producer.EPISODES_0_4)
        assert (run.env_name, run.model, run.num_rollouts) == ("gsm8k", "org/model", 3)
        assert run.expected_traces == 15  # select.limit * num_rollouts
        assert run.evaluation_name == "gsm8k--m--default--0a1b2c3d"

    def test_a_0_3_run_expects_num_tasks_times_num_rollouts(self, tmp_path):
        config = {"env": {"taskset": {"id": "x"}}, "model": "m", "num_tasks": 4, "num_rollouts": 2}
        run = load_run(resolved_run(tmp_path / "r", config, episode_line("u-1")))

        assert (run.producer, run.expected_traces) == (Producer.EPISODES_0_3, 8)

    def test_a_resumed_run_is_the_run_of_its_last_attempt(self, tmp_path):
        lines = episode_line("first", 0) + episode_line("first", 1) + episode_line("second", 2)
        directory = resolved_run(tmp_path / "r", lines=lines + b'{"id": "half-writ')

        assert load_run(directory).run_id == "second"

    @pytest.mark.parametrize(
        ("kind", "want"), [("debug", RunKind.DEBUG), ("replay", RunKind.REPLAY)]
    )
    def test_debug_and_replay_configs_mark_their_kind(self, tmp_path, kind, want):
        directory = resolved_run(tmp_path / "r", lines=episode_line("x"), kind=kind)

        assert load_run(directory).kind == want

    def test_it_is_a_run_directory_only_once_a_line_is_written_and_says_so(self, tmp_path):
        directory = resolved_run(tmp_path / "r")

        assert list(find_run_dirs(tmp_path)) == []
        assert "once its first line is written" in why_not_a_run(directory)
        (directory / "traces.jsonl").write_bytes(episode_line("x"))
        assert list(find_run_dirs(tmp_path)) == [directory]

    def test_the_logs_and_their_latest_symlink_are_not_runs(self, tmp_path):
        directory = resolved_run(tmp_path / "r", lines=episode_line("x"))
        (directory / "logs" / "attempt_1" / "traces.jsonl").write_bytes(episode_line("y"))

        assert list(find_run_dirs(tmp_path)) == [directory]
        assert [r.path for r in walk(str(tmp_path))] == [str(directory)]

    def test_a_config_that_is_not_json_is_a_run_error_naming_the_file(self, tmp_path):
        directory = resolved_run(tmp_path / "r", lines=episode_line("x"))
        (directory / "configs" / "resolved" / "eval.json").write_text("{oops")

        with pytest.raises(RunError, match=r"configs/resolved/eval\.json: not valid JSON"):
            load_run(directory)

    def test_no_taskset_id_is_a_run_error_naming_the_key(self, tmp_path):
        directory = resolved_run(tmp_path / "r", {"model": "m"}, episode_line("x"))

        with pytest.raises(RunError, match=r"eval\.json: no environment name \('env\.taskset\.id'"):
            require_env_name(load_run(directory))
