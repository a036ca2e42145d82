"""Start-up: `evalpush push` imports only what the command uses (issue 10).

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
NEVER_FOR_PUSH = {
    "aiohttp": "the local platform's server",
    "prometheus_client": "the daemon's metrics",
    "watchdog": "the daemon's file watching",
    "structlog": "logging, until an event is logged",
    "pydantic_settings": "no longer used: config/load.py merges the sources itself",
    "asyncio": "nothing a push runs needs an event loop",
}
ONLY_FOR_VALIDATION = {
    "pydantic": "validates the settings given (the defaults need none)",
    "pydantic_core": "imported by pydantic",
    "annotated_types": "imported by pydantic",
    "typing_inspection": "imported by pydantic",
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


def test_a_push_with_no_setting_to_read_imports_none_of_the_heavy_modules_it_does_not_use(
    platform: LocalPlatform, tmp_path: Path
) -> None:
    imported = imported_by_push(platform, tmp_path)

    assert {"evalpush", "msgspec", "sqlite3"} <= imported
    unwanted = {**NEVER_FOR_PUSH, **ONLY_FOR_VALIDATION}
    assert {name: why for name, why in unwanted.items() if name in imported} == {}


def test_a_push_given_only_its_state_dir_in_the_environment_uses_it_and_imports_no_pydantic(
    platform: LocalPlatform, tmp_path: Path
) -> None:
    state = tmp_path / "custom-state"

    imported = imported_by_push(platform, tmp_path, EVALPUSH_STATE_DIR=str(state))

    unwanted = {**NEVER_FOR_PUSH, **ONLY_FOR_VALIDATION}
    assert {name: why for name, why in unwanted.items() if name in imported} == {}
    assert (state / "state.db").is_file()


def test_a_push_with_a_setting_in_the_environment_validates_it_with_pydantic(
    platform: LocalPlatform, tmp_path: Path
) -> None:
    imported = imported_by_push(platform, tmp_path, EVALPUSH_UPLOAD__MAX_BATCH_SAMPLES=" 7 ")

    assert "pydantic" in imported
    assert {name: why for name, why in NEVER_FOR_PUSH.items() if name in imported} == {}


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("EVALPUSH_STATE_DIR", "/var/lib/evalpush"),
        ("EVALPUSH_STATE_DIR", "relative/state"),
        ("EVALPUSH_STATE_DIR", "~/state"),
        ("EVALPUSH_STATE_DIR", '"/quoted"'),
        ("EVALPUSH_STATE_DIR", "'/single'"),
        ("EVALPUSH_STATE_DIR", '""'),
        ("EVALPUSH_STATE_DIR", '"unterminated'),
        ("EVALPUSH_STATE_DIR", '"\\u00e9t\\u00e9"'),
        ("EVALPUSH_STATE_DIR", "  spaced  "),
        ("EVALPUSH_STATE_DIR", "\udcff-not-utf-8"),
        ("EVALPUSH_STATE_DIR", '["a"]'),
        ("EVALPUSH_STATE_DIR", ""),
        ("EVALPUSH_STATE__DIR", "/long/name"),
        ("EVALPUSH_STATE__DIR", ""),
        ("evalpush_state_dir", "/lower/case"),
    ],
)
def test_the_state_dir_variable_alone_gives_the_config_the_validated_sources_build_from_it(
    name: str, value: str
) -> None:
    # EVALPUSH_LOG__FORMAT at its default makes load_config merge and validate the sources
    # (config/load.py) without changing a value.
    plain = load_config(environ={name: value})
    sourced = load_config(environ={name: value, "EVALPUSH_LOG__FORMAT": "auto"})

    assert type(plain) is type(sourced) is Config
    assert plain == sourced
    assert plain.state.model_fields_set == sourced.state.model_fields_set


@pytest.mark.parametrize(
    "flags",
    [
        {},
        {"state": {"dir": Path("/var/lib/evalpush")}},
        {"upload": {"max_batch_samples": 7}, "log": {"level": "DEBUG"}},
    ],
)
def test_flags_alone_validate_to_the_config_the_sources_build_from_them(flags) -> None:
    # EVALPUSH_LOG__FORMAT at its default makes load_config merge and validate the sources
    # (config/load.py) without changing a value.
    plain = load_config(environ={}, flags=flags)
    sourced = load_config(environ={"EVALPUSH_LOG__FORMAT": "auto"}, flags=flags)

    assert type(plain) is type(sourced) is Config
    assert plain == sourced == Config.model_validate(flags)


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
