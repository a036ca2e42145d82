"""Start-up: `evalpush push` imports only what the command uses.

Each test runs `python -X importtime -m evalpush push` as a real subprocess against the local
platform and reads the modules the process imported from that log. Timings are bench/startup.py's
business; these tests only say which heavy modules a push must not load.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from evalpush.config import Config, load_config
from evalpush.local_platform import LocalPlatform
from support.environ import clean_environ
from support.runs import config_toml, write_run

RUN_ID = "9d5b7e1c-3f2a-4b6c-8d0e-1a2b3c4d5e6f"
PUSH_TIMEOUT_SECONDS = 60
# asyncio is not in the list: pydantic-settings imports it at the top of its main module.
NEVER_FOR_PUSH = {
    "aiohttp": "the local platform's server",
    "prometheus_client": "the daemon's metrics",
    "watchdog": "the daemon's file watching",
}


def write_one_trace_run(root: Path) -> Path:
    trace = {"id": "t-1", "task": {"idx": 0}, "rewards": {"r": 1.0}, "nodes": []}
    return write_run(root, [orjson.dumps(trace)], run_id=RUN_ID, config=config_toml(num_rollouts=1))


def imported_by_push(platform: LocalPlatform, tmp_path: Path, **extra: str) -> set[str]:
    """The top-level packages a successful `evalpush push` of one run imported."""
    env = clean_environ(
        XDG_STATE_HOME=None,  # the state dir is the default (systemd's STATE_DIRECTORY goes too)
        PRIME_API_KEY=platform.api_key or "any-key",
        PRIME_API_BASE_URL=platform.base_url,
        HOME=str(tmp_path / "home"),
        **extra,
    )
    run = write_one_trace_run(tmp_path / "outputs")
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "evalpush", "push", str(run)],
        env=env,
        capture_output=True,
        timeout=PUSH_TIMEOUT_SECONDS,
    )
    log = done.stderr.decode(errors="replace")
    assert done.returncode == 0 and b"finalized" in done.stdout, log[-3000:]
    return {
        line.split("|")[2].strip().split(".")[0]
        for line in log.splitlines()
        if line.startswith("import time:") and "self [us]" not in line
    }


@pytest.mark.parametrize(
    "variables",
    [{}, {"EVALPUSH_STATE_DIR": "state-of-its-own"}, {"EVALPUSH_UPLOAD__MAX_BATCH_SAMPLES": " 7 "}],
    ids=["no setting", "its state dir", "a setting"],
)
def test_a_push_imports_none_of_the_heavy_modules_it_does_not_use(
    platform: LocalPlatform, tmp_path: Path, variables: dict[str, str]
) -> None:
    if "EVALPUSH_STATE_DIR" in variables:
        variables = {"EVALPUSH_STATE_DIR": str(tmp_path / variables["EVALPUSH_STATE_DIR"])}

    imported = imported_by_push(platform, tmp_path, **variables)

    assert {"evalpush", "msgspec", "sqlite3", "pydantic_settings"} <= imported
    assert {name: why for name, why in NEVER_FOR_PUSH.items() if name in imported} == {}
    if "EVALPUSH_STATE_DIR" in variables:
        assert (Path(variables["EVALPUSH_STATE_DIR"]) / "state.db").is_file()


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("EVALPUSH_STATE_DIR", "/var/lib/evalpush", Path("/var/lib/evalpush")),
        ("EVALPUSH_STATE_DIR", "relative/state", Path("relative/state")),
        ("EVALPUSH_STATE_DIR", "~/state", Path("~/state")),
        ("EVALPUSH_STATE_DIR", '"/quoted"', Path("/quoted")),
        ("EVALPUSH_STATE_DIR", "'/single'", Path("/single")),
        ("EVALPUSH_STATE_DIR", '"unterminated', Path('"unterminated')),
        ("EVALPUSH_STATE_DIR", '"\\u00e9t\\u00e9"', Path("\u00e9t\u00e9")),
        ("EVALPUSH_STATE_DIR", "  spaced  ", Path("  spaced  ")),
        ("EVALPUSH_STATE_DIR", "\udcff-not-utf-8", Path("\udcff-not-utf-8")),
        ("EVALPUSH_STATE_DIR", '["a"]', Path('["a"]')),
        ("EVALPUSH_STATE_DIR", "", None),
        ("EVALPUSH_STATE__DIR", "/long/name", Path("/long/name")),
        ("evalpush_state_dir", "/lower/case", Path("/lower/case")),
    ],
)
def test_the_state_dir_variable_is_taken_as_a_path_a_quoted_one_without_its_quotes(
    name: str, value: str, expected: Path | None
) -> None:
    config = load_config(environ={name: value})

    assert config.state.dir == expected
    assert config.state.model_fields_set == (set() if expected is None else {"dir"})
    assert config.model_dump(exclude={"state"}) == Config().model_dump(exclude={"state"})


def test_the_short_state_dir_variable_wins_over_the_long_one() -> None:
    environ = {"EVALPUSH_STATE__DIR": "/long", "EVALPUSH_STATE_DIR": "/short"}

    assert load_config(environ=environ).state.dir == Path("/short")


@pytest.mark.parametrize(
    "flags",
    [
        {},
        {"state": {"dir": Path("/var/lib/evalpush")}},
        {"upload": {"max_batch_samples": 7}, "log": {"level": "DEBUG"}},
    ],
)
def test_flags_alone_validate_to_the_config_they_give(flags) -> None:
    config = load_config(environ={}, flags=flags)

    assert type(config) is Config
    assert config == Config.model_validate(flags) == Config(**flags)


def test_a_client_of_an_http_platform_builds_no_tls_context(
    local_platform: LocalPlatform, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loading the CA bundle is ~60 ms of a push's start-up; a loopback http:// platform never
    needs it (an https one builds it at its first request: tests/test_wire_tls.py)."""
    import httpx

    from evalpush.client import PlatformClient
    from evalpush.config import PlatformConfig

    built: list[object] = []
    real = httpx.create_ssl_context

    def create_ssl_context(*args: object, **kwargs: object) -> object:
        built.append(args)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(httpx, "create_ssl_context", create_ssl_context)
    config = PlatformConfig(api_base_url=local_platform.base_url)
    environ = {"PRIME_API_KEY": local_platform.api_key or "any-key"}
    (tmp_path / "home").mkdir()
    with PlatformClient(config, environ=environ, home=tmp_path / "home") as client:
        assert client.resolve_environment("gsm8k")
    assert built == []
