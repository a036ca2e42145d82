"""Configuration values at the edges are configuration errors naming their key or file, never
a traceback: a ledger URL whose port is no port, a TOML file nested past what can be read, and
a number of seconds that is infinite or not a number."""

from __future__ import annotations

from pathlib import Path

import pytest

from evalpush.config import load_config
from evalpush.core.errors import ConfigError
from support.commands import check_rows

DEEP = "[" * 100_000 + "]" * 100_000


def test_check_says_a_ledger_url_with_a_port_over_65535_is_a_config_error_naming_the_key(
    evalpush,
):
    done = evalpush("check", EVALPUSH_LEDGER__URL="postgresql://evalpush@127.0.0.1:99999/db")

    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    result, detail = check_rows(done.stdout)["config"]
    assert result == "FAIL" and "ledger.url" in detail and "port" in detail


def test_check_says_a_config_file_nested_too_deeply_is_a_config_error_naming_the_file(
    evalpush, tmp_path: Path
):
    deep = tmp_path / "deep.toml"
    deep.write_text(f"a = {DEEP}\n")

    done = evalpush("check", "--config", str(deep))

    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    result, detail = check_rows(done.stdout)["config"]
    assert result == "FAIL" and str(deep) in detail and "nested too deeply" in detail


def test_a_variable_nested_too_deeply_is_a_config_error_naming_it():
    with pytest.raises(ConfigError, match="EVALPUSH_WATCH__ROOTS"):
        load_config(environ={"EVALPUSH_WATCH__ROOTS": DEEP})


SECONDS = [  # every float setting
    "watch.rescan_seconds",
    "watch.poll_seconds",
    "watch.sweep_seconds",
    "watch.ledger_poll_seconds",
    "runs.settle_seconds",
    "runs.follow_batch_seconds",
    "platform.connect_timeout_seconds",
    "platform.read_timeout_seconds",
    "platform.request_deadline_seconds",
    "platform.late_write_seconds",
    "ledger.lease_seconds",
    "metrics.unhealthy_after_seconds",
]


def float_settings() -> set[str]:
    from evalpush.config import Config

    return {
        name
        for section in Config.model_fields.values()
        for name, field in section.annotation.model_fields.items()
        if field.annotation is float
    }


@pytest.mark.parametrize("value", ["inf", "-inf", "nan"])
@pytest.mark.parametrize("key", SECONDS)
def test_a_number_of_seconds_that_is_not_finite_is_refused_naming_its_key(key: str, value: str):
    assert {k.split(".")[1] for k in SECONDS} >= float_settings(), "a float setting is missing"
    section, name = key.split(".")
    variable = f"EVALPUSH_{section.upper()}__{name.upper()}"

    with pytest.raises(ConfigError, match=rf"{key}.*finite|{key}.*greater") as raised:
        load_config(environ={variable: value})

    assert variable in str(raised.value)


@pytest.mark.parametrize("key", ["ledger.lease_seconds", "runs.settle_seconds"])
def test_an_infinite_number_of_seconds_in_the_file_is_refused_naming_its_key(
    key: str, tmp_path: Path
):
    section, name = key.split(".")
    path = tmp_path / "evalpush.toml"
    path.write_text(f"[{section}]\n{name} = inf\n")

    with pytest.raises(ConfigError, match=rf"{key}.*finite") as raised:
        load_config(path, environ={})

    assert str(path) in str(raised.value)
