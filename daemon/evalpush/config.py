"""Configuration: one pydantic model of every setting, loaded with a fixed precedence.

Precedence, highest first: command-line flag > environment variable > config file > default.
Environment variables are `EVALPUSH_<SECTION>__<KEY>` for any key (an array, table or quoted
string is read as TOML; anything else is the plain string, which validation reads as the key's
type, so `60` is a number for a number key and stays "60" for a string key), plus `EVALPUSH_CONFIG` (the file) and
`EVALPUSH_STATE_DIR`. The platform's own variables (`PRIME_API_KEY`, ...) are read by
`evalpush.platform`, which owns credentials.

A bad file or value raises one `ConfigError` naming the key and the file.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from evalpush.errors import BadInput, ConfigError

MIB = 1024 * 1024
ENV_PREFIX = "EVALPUSH_"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WatchConfig(_Section):
    roots: list[Path] = Field(default_factory=lambda: [Path("./outputs")])
    rescan_seconds: float = Field(60.0, gt=0)
    observer: Literal["auto", "inotify", "polling"] = "auto"
    # A poll walks the roots as a rescan does (about 0.15 s of CPU per 10,000 runs): every
    # 30 s, with the rescan every 60 s, an idle polled daemon stays under 1% of a core.
    poll_seconds: float = Field(30.0, gt=0)


class RunsConfig(_Section):
    settle_seconds: float = Field(300.0, ge=0)
    marker: str = ""
    upload_replays: bool = False


class ReadConfig(_Section):
    max_line_bytes: int = Field(64 * MIB, gt=0)


class ConvertConfig(_Section):
    on_bad_line: Literal["skip", "hold"] = "skip"


class UploadConfig(_Section):
    max_concurrent_runs: int = Field(4, ge=1, le=64)
    max_batch_bytes: int = Field(25 * MIB, ge=1024, le=25 * MIB)
    max_batch_samples: int = Field(1000, ge=1)


class PlatformConfig(_Section):
    api_base_url: str | None = None
    frontend_url: str | None = None
    api_key_file: Path | None = None
    team_id: str | None = None
    allow_insecure_http: bool = False
    connect_timeout_seconds: float = Field(10.0, gt=0)
    read_timeout_seconds: float = Field(120.0, gt=0)


class StateConfig(_Section):
    dir: Path | None = None


class LogConfig(_Section):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "json", "console"] = "auto"


class Config(_Section):
    watch: WatchConfig = WatchConfig()
    runs: RunsConfig = RunsConfig()
    read: ReadConfig = ReadConfig()
    convert: ConvertConfig = ConvertConfig()
    upload: UploadConfig = UploadConfig()
    platform: PlatformConfig = PlatformConfig()
    state: StateConfig = StateConfig()
    log: LogConfig = LogConfig()

    @property
    def state_dir(self) -> Path:
        """Where the ledger lives: the configured dir, systemd's StateDirectory, or XDG state."""
        if self.state.dir is not None:
            return self.state.dir.expanduser()
        systemd_dir = os.environ.get("STATE_DIRECTORY")
        if systemd_dir:
            return Path(systemd_dir.split(":")[0])
        xdg = os.environ.get("XDG_STATE_HOME")
        base = Path(xdg) if xdg else Path.home() / ".local" / "state"
        return base / "evalpush"


def _env_value(raw: str) -> Any:
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw
    return value if isinstance(value, (list, dict, str)) else raw


def _env_overrides(environ: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    overrides: dict[str, dict[str, Any]] = {}
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue
        section, _, key = name[len(ENV_PREFIX) :].partition("__")
        overrides.setdefault(section.lower(), {})[key.lower()] = _env_value(raw)
    if environ.get("EVALPUSH_STATE_DIR"):
        overrides.setdefault("state", {})["dir"] = environ["EVALPUSH_STATE_DIR"]
    return overrides


def _merge(base: dict[str, Any], layer: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in layer.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def read_toml(path: Path, error: type[BadInput], what: str) -> dict[str, Any]:
    """A TOML file as a dict; every way it can fail is one `error` naming the file."""
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise error(f"{path}: {what} not found") from None
    except PermissionError:
        raise error(f"{path}: {what} not readable (permission denied)") from None
    except OSError as exc:
        raise error(f"{path}: {what} cannot be read: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise error(f"{path}: {what} is not valid TOML: {exc}") from None


def _describe(exc: ValidationError, origin: str) -> str:
    problems = []
    for err in exc.errors():
        key = ".".join(str(part) for part in err["loc"])
        if err["type"] == "extra_forbidden":
            problems.append(f"unknown key {key!r}")
        else:
            problems.append(f"key {key!r}: {err['msg']} (got {err.get('input')!r})")
    return f"{origin}: invalid configuration: " + "; ".join(problems)


def load_config(
    path: Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    flags: Mapping[str, Mapping[str, Any]] | None = None,
) -> Config:
    """Build the configuration from defaults, the file, the environment and flags.

    `path` None means `$EVALPUSH_CONFIG` if set, else no file. `flags` is a nested
    `{section: {key: value}}` of command-line values that were given.
    """
    environ = os.environ if environ is None else environ
    if path is None and environ.get("EVALPUSH_CONFIG"):
        path = Path(environ["EVALPUSH_CONFIG"])
    data: dict[str, Any] = read_toml(path, ConfigError, "config file") if path else {}
    env_layer = _env_overrides(environ)
    data = _merge(_merge(data, env_layer), flags or {})
    origin = str(path) if path is not None else "configuration"
    if env_layer:
        origin += " (with EVALPUSH_* environment overrides)"
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, origin)) from None
