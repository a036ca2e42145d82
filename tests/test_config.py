"""Configuration: SPEC.md's defaults, flag > environment > file > default, and one clear error."""

from __future__ import annotations

from pathlib import Path

import pytest

from evalpush.config import Config, load_config
from evalpush.errors import ConfigError


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
        }
        assert config.runs.model_dump() == {
            "settle_seconds": 300,
            "marker": "",
            "upload_replays": False,
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

    def test_evalpush_variables_that_name_no_key_are_not_settings(self):
        environ = {"EVALPUSH_CONFIG": "", "EVALPUSH_STATE_DIR": "", "EVALPUSH_DEBUG": "1"}

        assert load_config(environ=environ) == Config()


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
