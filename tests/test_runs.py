"""The runs stage: what a run directory is, its id, its kind, and the config fields it carries."""

from __future__ import annotations

import hashlib
import os
import socket
import uuid
from pathlib import Path

import pytest

from evalpush.errors import RunError
from evalpush.runs import RunKind, find_run_dirs, load_run, require_env_name
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
