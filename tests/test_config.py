"""Configuration: the defaults config.example.toml shows, flag > environment > file > default, and one clear error."""

from __future__ import annotations

import copy
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from evalpush.config import (
    NOT_SETTINGS,
    Config,
    LogConfig,
    MetricsConfig,
    UploadConfig,
    WatchConfig,
    load_config,
)
from evalpush.core.errors import ConfigError
from evalpush.upload import CRASH_ENV


def config_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "evalpush.toml"
    path.write_text(text)
    return path


class TestDefaults:
    def test_the_defaults_are_the_spec_table(self):
        config = load_config(environ={})

        assert config.watch.model_dump() == {
            "roots": [Path("./outputs")],
            "rescan_seconds": 60,
            "observer": "auto",
            "poll_seconds": 30,
            "sweep_seconds": 86400,
            "ledger_poll_seconds": 2,
        }
        assert config.runs.model_dump() == {
            "settle_seconds": 300,
            "marker": "",
            "upload_replays": False,
            "on_incomplete": "upload",
            "follow": True,
            "follow_batch_seconds": 30.0,
        }
        assert config.read.max_line_bytes == 67108864
        assert config.convert.on_bad_line == "skip"
        assert config.upload.model_dump() == {
            "max_concurrent_runs": 4,
            "max_batch_bytes": 26214400,
            "max_batch_samples": 1000,
        }
        assert config.platform.allow_insecure_http is False
        assert config.log.model_dump() == {"level": "info", "format": "auto"}

    def test_no_file_and_no_environment_gives_the_defaults(self):
        assert load_config(environ={}) == Config()

    def test_config_alone_reads_neither_the_environment_nor_a_file(self, monkeypatch, tmp_path):
        monkeypatch.setenv("EVALPUSH_UPLOAD__MAX_CONCURRENT_RUNS", "9")
        monkeypatch.setenv("EVALPUSH_CONFIG", str(config_file(tmp_path, "[runs]\nmarker = 'x'\n")))

        assert Config().upload.max_concurrent_runs == 4
        assert Config.model_validate({"runs": {"settle_seconds": 1}}).runs.marker == ""
        loaded = load_config()
        assert (loaded.upload.max_concurrent_runs, loaded.runs.marker) == (9, "x")


class TestPrecedence:
    @pytest.mark.parametrize(
        "in_file, in_env, in_flag, expected",
        [
            (None, None, None, 60.0),
            (10, None, None, 10.0),
            (10, 20, None, 20.0),
            (None, 20, None, 20.0),
            (10, 20, 30, 30.0),
            (10, None, 30, 30.0),
        ],
    )
    def test_a_flag_beats_the_environment_which_beats_the_file_which_beats_the_default(
        self, tmp_path, in_file, in_env, in_flag, expected
    ):
        path = config_file(tmp_path, f"[watch]\nrescan_seconds = {in_file}\n" if in_file else "")
        environ = {"EVALPUSH_WATCH__RESCAN_SECONDS": str(in_env)} if in_env else {}
        flags = {"watch": {"rescan_seconds": in_flag}} if in_flag else None

        config = load_config(path, environ=environ, flags=flags)

        assert config.watch.rescan_seconds == expected

    def test_the_environment_overrides_only_the_key_it_names(self, tmp_path):
        path = config_file(tmp_path, "[upload]\nmax_concurrent_runs = 2\nmax_batch_samples = 10\n")

        config = load_config(path, environ={"EVALPUSH_UPLOAD__MAX_BATCH_SAMPLES": "20"})

        assert (config.upload.max_concurrent_runs, config.upload.max_batch_samples) == (2, 20)

    def test_evalpush_config_names_the_file_when_none_is_given(self, tmp_path):
        path = config_file(tmp_path, '[runs]\nmarker = ".done"\n')

        config = load_config(environ={"EVALPUSH_CONFIG": str(path)})

        assert config.runs.marker == ".done"

    def test_a_given_file_beats_evalpush_config(self, tmp_path):
        given = config_file(tmp_path, '[runs]\nmarker = "given"\n')
        other = tmp_path / "other.toml"
        other.write_text('[runs]\nmarker = "other"\n')

        config = load_config(given, environ={"EVALPUSH_CONFIG": str(other)})

        assert config.runs.marker == "given"

    def test_evalpush_state_dir_sets_the_state_dir_and_the_flag_beats_it(self):
        environ = {"EVALPUSH_STATE_DIR": "/var/lib/from-env"}

        assert load_config(environ=environ).state_dir == Path("/var/lib/from-env")
        flagged = load_config(environ=environ, flags={"state": {"dir": Path("/from-flag")}})
        assert flagged.state_dir == Path("/from-flag")


class TestEnvironmentValues:
    def test_a_list_is_written_as_a_toml_array(self):
        config = load_config(environ={"EVALPUSH_WATCH__ROOTS": '["/data/a", "/data/b"]'})

        assert config.watch.roots == [Path("/data/a"), Path("/data/b")]

    def test_an_integer(self):
        config = load_config(environ={"EVALPUSH_READ__MAX_LINE_BYTES": "1024"})

        assert config.read.max_line_bytes == 1024

    def test_a_float(self):
        config = load_config(environ={"EVALPUSH_RUNS__SETTLE_SECONDS": "2.5"})

        assert config.runs.settle_seconds == 2.5

    @pytest.mark.parametrize("raw, expected", [("true", True), ("false", False)])
    def test_a_boolean(self, raw, expected):
        config = load_config(environ={"EVALPUSH_RUNS__UPLOAD_REPLAYS": raw})

        assert config.runs.upload_replays is expected

    def test_a_bare_string(self):
        config = load_config(
            environ={"EVALPUSH_RUNS__MARKER": ".done", "EVALPUSH_LOG__LEVEL": "debug"}
        )

        assert (config.runs.marker, config.log.level) == (".done", "debug")

    def test_a_quoted_string_loses_its_quotes(self):
        config = load_config(environ={"EVALPUSH_RUNS__MARKER": '"finished"'})

        assert config.runs.marker == "finished"

    def test_a_string_key_keeps_a_value_that_reads_as_a_number_or_boolean(self):
        environ = {"EVALPUSH_PLATFORM__TEAM_ID": "12345", "EVALPUSH_RUNS__MARKER": "true"}

        config = load_config(environ=environ)

        assert (config.platform.team_id, config.runs.marker) == ("12345", "true")

    def test_empty_evalpush_config_and_state_dir_set_nothing(self):
        environ = {"EVALPUSH_CONFIG": "", "EVALPUSH_STATE_DIR": ""}

        assert load_config(environ=environ) == Config()

    def test_an_array_may_be_written_with_toml_single_quotes(self):
        config = load_config(environ={"EVALPUSH_WATCH__ROOTS": "['/data/a']"})

        assert config.watch.roots == [Path("/data/a")]

    def test_a_value_is_one_toml_value_and_not_a_document(self):
        with pytest.raises(ConfigError, match="EVALPUSH_WATCH__ROOTS"):
            load_config(environ={"EVALPUSH_WATCH__ROOTS": '["/a"]\nsneaky = 1'})

    @pytest.mark.parametrize("raw", ["DEBUG", "Debug", "debug"])
    def test_a_log_level_name_is_read_in_any_case(self, raw):
        assert load_config(environ={"EVALPUSH_LOG__LEVEL": raw}).log.level == "debug"

    def test_a_log_level_name_in_the_file_is_read_in_any_case(self, tmp_path):
        path = config_file(tmp_path, '[log]\nlevel = "Warning"\n')

        assert load_config(path, environ={}).log.level == "warning"


class TestErrors:
    def test_an_unknown_key_is_one_error_naming_the_key_and_the_file(self, tmp_path):
        path = config_file(tmp_path, "[watch]\nrescan_secs = 5\n")

        with pytest.raises(ConfigError) as raised:
            load_config(path, environ={})

        assert "unknown key 'watch.rescan_secs'" in str(raised.value)
        assert str(path) in str(raised.value)

    def test_an_unknown_section_is_an_error_naming_it(self, tmp_path):
        path = config_file(tmp_path, "[uplaod]\nmax_concurrent_runs = 2\n")

        with pytest.raises(ConfigError, match="unknown key 'uplaod'"):
            load_config(path, environ={})

    @pytest.mark.parametrize(
        "text, key",
        [
            ('[watch]\nrescan_seconds = "soon"\n', "watch.rescan_seconds"),
            ('[watch]\nroots = "/data"\n', "watch.roots"),
            ('[watch]\nobserver = "fanotify"\n', "watch.observer"),
            ("[read]\nmax_line_bytes = 0\n", "read.max_line_bytes"),
            ("[upload]\nmax_batch_bytes = 26214401\n", "upload.max_batch_bytes"),
            ('[convert]\non_bad_line = "drop"\n', "convert.on_bad_line"),
            ("[runs]\nupload_replays = 3\n", "runs.upload_replays"),
            ("watch = 5\n", "watch"),
        ],
    )
    def test_a_wrong_type_or_value_is_an_error_naming_the_key_and_the_file(
        self, tmp_path, text, key
    ):
        path = config_file(tmp_path, text)

        with pytest.raises(ConfigError) as raised:
            load_config(path, environ={})

        assert f"key '{key}'" in str(raised.value)
        assert str(path) in str(raised.value)

    def test_several_problems_are_one_error_naming_each(self, tmp_path):
        path = config_file(
            tmp_path, '[watch]\nbogus = 1\nrescan_seconds = "x"\n[log]\nlevel = "loud"\n'
        )

        with pytest.raises(ConfigError) as raised:
            load_config(path, environ={})

        message = str(raised.value)
        assert all(key in message for key in ("watch.bogus", "watch.rescan_seconds", "log.level"))

    def test_a_bad_environment_value_is_an_error_naming_the_key_and_the_environment(self):
        with pytest.raises(ConfigError) as raised:
            load_config(environ={"EVALPUSH_READ__MAX_LINE_BYTES": "abc"})

        assert "key 'read.max_line_bytes'" in str(raised.value)
        assert "EVALPUSH_* environment" in str(raised.value)

    def test_an_unknown_environment_key_is_an_error_naming_it(self):
        with pytest.raises(ConfigError, match="unknown key 'watch.bogus'"):
            load_config(environ={"EVALPUSH_WATCH__BOGUS": "1"})

    def test_a_missing_file_is_an_error_naming_it(self, tmp_path):
        path = tmp_path / "absent.toml"

        with pytest.raises(ConfigError, match="not found") as raised:
            load_config(path, environ={})

        assert str(path) in str(raised.value)

    def test_invalid_toml_is_an_error_naming_the_file(self, tmp_path):
        path = config_file(tmp_path, "[watch\nroots = \n")

        with pytest.raises(ConfigError, match="not valid TOML") as raised:
            load_config(path, environ={})

        assert str(path) in str(raised.value)

    def test_a_file_that_is_not_utf8_is_an_error_naming_it(self, tmp_path):
        path = tmp_path / "evalpush.toml"
        path.write_bytes(b'[runs]\nmarker = "\xff"\n')

        with pytest.raises(ConfigError, match="not valid TOML") as raised:
            load_config(path, environ={})

        assert str(path) in str(raised.value)

    def test_a_directory_given_as_the_file_is_an_error_naming_it(self, tmp_path):
        with pytest.raises(ConfigError) as raised:
            load_config(tmp_path, environ={})

        assert str(tmp_path) in str(raised.value)


class TestVariablesThatNameNoSetting:
    def test_one_underscore_too_few_is_an_error_naming_the_variable_and_the_real_one(self):
        with pytest.raises(ConfigError) as raised:
            load_config(environ={"EVALPUSH_UPLOAD_MAX_CONCURRENT_RUNS": "3"})

        message = str(raised.value)
        assert "EVALPUSH_UPLOAD_MAX_CONCURRENT_RUNS" in message
        assert "did you mean EVALPUSH_UPLOAD__MAX_CONCURRENT_RUNS?" in message

    def test_a_variable_like_no_setting_at_all_is_an_error_naming_it(self):
        with pytest.raises(ConfigError, match="EVALPUSH_DEBUG") as raised:
            load_config(environ={"EVALPUSH_DEBUG": "1"})

        assert "did you mean" not in str(raised.value)

    def test_a_whole_section_in_one_variable_is_an_error(self):
        with pytest.raises(ConfigError, match="EVALPUSH_WATCH "):
            load_config(environ={"EVALPUSH_WATCH": '{roots = ["/a"]}'})

    def test_a_key_nested_too_deep_is_an_error(self):
        with pytest.raises(ConfigError, match="EVALPUSH_WATCH__ROOTS__0"):
            load_config(environ={"EVALPUSH_WATCH__ROOTS__0": "/a"})

    def test_variables_evalpush_reads_elsewhere_are_not_errors(self):
        environ = {name: "1" for name in NOT_SETTINGS}

        assert load_config(environ=environ) == Config()

    def test_the_crash_point_variable_is_one_of_them(self):
        assert CRASH_ENV in NOT_SETTINGS

    def test_other_variables_are_not_looked_at(self):
        environ = {"PRIME_API_KEY": "k", "MY_EVALPUSH_UPLOAD": "x", "HOME": "/root"}

        assert load_config(environ=environ) == Config()

    def test_unknown_variables_and_bad_values_are_one_error_naming_each(self, tmp_path):
        path = config_file(tmp_path, '[log]\nlevel = "loud"\n')
        environ = {"EVALPUSH_UPLOAD_MAX_CONCURRENT_RUNS": "3", "EVALPUSH_READ__MAX_LINE_BYTES": "x"}

        with pytest.raises(ConfigError) as raised:
            load_config(path, environ=environ)

        message = str(raised.value)
        assert "EVALPUSH_UPLOAD_MAX_CONCURRENT_RUNS" in message
        assert "EVALPUSH_READ__MAX_LINE_BYTES" in message
        assert "key 'log.level'" in message and str(path) in message


class TestEveryErrorNamesItsSource:
    def test_a_bad_environment_value_names_the_variable(self):
        with pytest.raises(ConfigError) as raised:
            load_config(environ={"EVALPUSH_READ__MAX_LINE_BYTES": "abc"})

        assert "EVALPUSH_READ__MAX_LINE_BYTES" in str(raised.value)

    def test_a_bad_value_set_by_the_environment_does_not_blame_the_file(self, tmp_path):
        path = config_file(tmp_path, "[read]\nmax_line_bytes = 1024\n")

        with pytest.raises(ConfigError) as raised:
            load_config(path, environ={"EVALPUSH_READ__MAX_LINE_BYTES": "abc"})

        assert "EVALPUSH_READ__MAX_LINE_BYTES" in str(raised.value)
        assert str(path) not in str(raised.value)

    def test_a_bad_file_value_does_not_blame_the_environment(self, tmp_path):
        path = config_file(tmp_path, '[read]\nmax_line_bytes = "abc"\n')

        with pytest.raises(ConfigError) as raised:
            load_config(path, environ={"EVALPUSH_UPLOAD__MAX_BATCH_SAMPLES": "10"})

        assert str(path) in str(raised.value)
        assert "EVALPUSH_" not in str(raised.value)

    def test_a_bad_flag_value_names_the_command_line(self, tmp_path):
        path = config_file(tmp_path, "[state]\ndir = 5\n")

        with pytest.raises(ConfigError) as raised:
            load_config(path, environ={}, flags={"state": {"dir": 7}})

        assert "command line" in str(raised.value)
        assert str(path) not in str(raised.value)

    def test_a_missing_file_named_by_evalpush_config_says_which_variable_named_it(self, tmp_path):
        path = tmp_path / "absent.toml"

        with pytest.raises(ConfigError, match="not found") as raised:
            load_config(environ={"EVALPUSH_CONFIG": str(path)})

        assert str(path) in str(raised.value)
        assert "EVALPUSH_CONFIG" in str(raised.value)

    def test_an_unknown_file_key_suggests_the_closest_real_one(self, tmp_path):
        path = config_file(tmp_path, "[watch]\nrescan_secs = 5\n")

        with pytest.raises(ConfigError, match="did you mean 'watch.rescan_seconds'"):
            load_config(path, environ={})


class TestMetricsSection:
    def test_metrics_are_off_by_default_and_health_turns_bad_after_ten_minutes(self):
        metrics = load_config(environ={}).metrics

        assert (metrics.listen, metrics.address, metrics.unhealthy_after_seconds) == ("", None, 600)

    @pytest.mark.parametrize(
        "listen, address",
        [
            ("127.0.0.1:9464", ("127.0.0.1", 9464)),
            ("0.0.0.0:9464", ("0.0.0.0", 9464)),
            ("[::1]:9464", ("::1", 9464)),
            ("[::]:80", ("::", 80)),
            ("localhost:0", ("localhost", 0)),
        ],
    )
    def test_listen_is_a_host_and_a_port(self, listen, address):
        config = load_config(environ={"EVALPUSH_METRICS__LISTEN": listen})

        assert config.metrics.address == address

    @pytest.mark.parametrize(
        "listen",
        [
            "9464",
            ":9464",
            "127.0.0.1",
            "127.0.0.1:",
            "127.0.0.1:http",
            "127.0.0.1:65536",
            "::1:9464",
            "[::1]",
            "[not-v6]:9464",
            "[127.0.0.1]:9464",
            "my host:9464",
            "127.0.0.1:9464/metrics",
        ],
    )
    def test_a_bad_listen_value_is_an_error_naming_the_key_and_the_file(self, tmp_path, listen):
        path = config_file(tmp_path, f"[metrics]\nlisten = {listen!r}\n".replace("'", '"'))

        with pytest.raises(ConfigError) as raised:
            load_config(path, environ={})

        assert "key 'metrics.listen'" in str(raised.value)
        assert str(path) in str(raised.value)
        assert "HOST:PORT" in str(raised.value)

    def test_unhealthy_after_seconds_must_be_positive(self):
        with pytest.raises(ConfigError, match="metrics.unhealthy_after_seconds"):
            load_config(environ={"EVALPUSH_METRICS__UNHEALTHY_AFTER_SECONDS": "0"})


class TestThroughTheCommand:
    def test_a_misspelt_variable_stops_the_command_with_exit_2_and_the_real_name(self, tmp_path):
        environ = {k: v for k, v in os.environ.items() if not k.startswith(("EVALPUSH_", "PRIME_"))}
        environ.update(
            EVALPUSH_STATE_DIR=str(tmp_path / "state"), EVALPUSH_UPLOAD_MAX_CONCURRENT_RUNS="3"
        )

        done = subprocess.run(
            [sys.executable, "-m", "evalpush", "status"],
            capture_output=True,
            text=True,
            env=environ,
            timeout=60,
            check=False,
        )

        assert done.returncode == 2
        assert "did you mean EVALPUSH_UPLOAD__MAX_CONCURRENT_RUNS?" in done.stderr
        assert "Traceback" not in done.stderr


class TestRetiredKeys:
    """A key an earlier release read (and its example config file wrote) still loads: ignored,
    and named where it came from."""

    def test_a_0_2_0_config_file_with_push_processes_loads_and_names_it_ignored(self, tmp_path):
        path = tmp_path / "config.toml"
        path.write_text("[upload]\nmax_concurrent_runs = 3\npush_processes = 1\n")

        config = load_config(path, environ={})

        assert config.upload.max_concurrent_runs == 3
        assert config.upload.model_fields_set == {"max_concurrent_runs"}
        assert config.ignored == (
            f"{path}: upload.push_processes (a push uploads every run in its own process)",
        )

    def test_the_retired_variable_is_ignored_and_named_not_an_unknown_key(self):
        config = load_config(environ={"evalpush_upload__push_processes": "2"})

        assert config.model_dump() == Config().model_dump()
        assert config.ignored == (
            "evalpush_upload__push_processes (EVALPUSH_* environment variable): "
            "upload.push_processes (a push uploads every run in its own process)",
        )

    def test_nothing_is_ignored_when_no_retired_key_is_given(self, tmp_path):
        path = tmp_path / "config.toml"
        path.write_text("[upload]\nmax_concurrent_runs = 3\n")

        assert load_config(path, environ={"EVALPUSH_LOG__LEVEL": "debug"}).ignored == ()


class TestConfigFileThatIsNotAFile:
    def test_a_fifo_given_as_the_config_file_is_an_error_naming_it_not_a_hang(self, tmp_path):
        fifo = tmp_path / "config.toml"
        os.mkfifo(fifo)
        environ = {k: v for k, v in os.environ.items() if not k.startswith(("EVALPUSH_", "PRIME_"))}
        environ["EVALPUSH_STATE_DIR"] = str(tmp_path / "state")

        done = subprocess.run(  # a process: a reader blocked on the FIFO would hang the test's
            [sys.executable, "-m", "evalpush", "--config", str(fifo), "status"],
            capture_output=True,
            text=True,
            env=environ,
            timeout=30,
            check=False,
        )

        assert done.returncode == 2
        assert f"{fifo}: config file is not a regular file" in done.stderr
        assert "Traceback" not in done.stderr


class TestSettingsValues:
    """The sections are frozen pydantic models: keyword arguments
    are validated as before, and a value is immutable and compares by its keys."""

    @pytest.mark.parametrize(
        "build",
        [
            lambda: Config(upload={"max_concurrent_runs": 0}),
            lambda: Config(nope=1),
            lambda: UploadConfig(max_concurrent_runs=65),
            lambda: MetricsConfig(listen="no-port"),
            lambda: WatchConfig(roots="not a list"),
        ],
    )
    def test_keyword_arguments_are_validated(self, build):
        with pytest.raises(ValidationError):
            build()

    def test_keyword_arguments_are_converted_as_pydantic_converts_them(self):
        config = Config(watch={"roots": ["/data"], "rescan_seconds": "5"}, log={"level": "DEBUG"})

        assert config.watch.roots == [Path("/data")]
        assert config.watch.rescan_seconds == 5.0
        assert config.log.level == "debug"
        assert config == Config.model_validate(
            {"watch": {"roots": ["/data"], "rescan_seconds": 5}, "log": {"level": "debug"}}
        )

    def test_a_value_cannot_be_changed(self):
        config = Config()

        with pytest.raises(ValidationError, match="frozen"):
            config.log = LogConfig(level="debug")  # type: ignore[misc]
        with pytest.raises(ValidationError, match="frozen"):
            config.log.level = "debug"  # type: ignore[misc]
        assert config == Config()

    def test_the_keys_given_are_remembered_through_a_copy_and_a_pickle(self):
        config = Config(log={"level": "info"})

        assert config == Config() and config.log.model_fields_set == {"level"}
        for copied in (copy.deepcopy(config), pickle.loads(pickle.dumps(config))):
            assert copied == config and copied.log.model_fields_set == {"level"}
        assert Config().log.model_fields_set == set()

    def test_a_section_given_as_a_value_keeps_its_keys(self):
        config = Config(log=LogConfig(level="error"), watch=WatchConfig())

        assert config.log.level == "error" and config.log.model_fields_set == {"level"}
        assert config.watch == WatchConfig()
