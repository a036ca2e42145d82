"""Configuration: one pydantic model of every setting, loaded by pydantic-settings.

Precedence, highest first: command-line flag > environment variable > config file > default
(`evalpush.config_sources`, which holds pydantic-settings' part and is imported only when there
is a variable or a file to read). The sources:

- flags: `load_config(flags={section: {key: value}})`, the command-line values that were given;
- the environment: `EVALPUSH_<SECTION>__<KEY>` for any key (pydantic-settings' prefix and
  nesting), plus `EVALPUSH_STATE_DIR` (short for `EVALPUSH_STATE__DIR`, and wins over it).
  Where a key wants an array the value is TOML, as in the file (`["/data/a", "/data/b"]`);
  otherwise it is the plain string, which validation reads as the key's type (`60` is a number
  for a number key and stays "60" for a string key); a quoted string loses its quotes. Any other
  `EVALPUSH_*` variable is an error naming it and the closest real name, except
  `EVALPUSH_CONFIG` and the few in `NOT_SETTINGS`;
- the file: `--config FILE`, else `$EVALPUSH_CONFIG`; TOML, every key optional.

`Config()` alone reads nothing: it is the defaults, or the keyword arguments given. Only
`load_config` reads the environment and the file. Every problem in every source is one
`ConfigError` naming each key and where its value came from: the file, the variable, or the
command line. The platform's own variables (`PRIME_API_KEY`, ...) are read by
`evalpush.platform`, which owns credentials.
"""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import ErrorDetails

from evalpush.errors import BadInput, ConfigError

MIB = 1024 * 1024
MAX_PORT = 65535
ENV_PREFIX = "EVALPUSH_"
ENV_NESTED_DELIMITER = "__"
CONFIG_VARIABLE = "EVALPUSH_CONFIG"
STATE_DIR_VARIABLE = "EVALPUSH_STATE_DIR"
NOT_SETTINGS = frozenset({"EVALPUSH_CRASH_AT", "EVALPUSH_TEST_SEED", "EVALPUSH_BENCH_PEAK_FILE"})
"""`EVALPUSH_*` variables that are not settings: the crash point tests kill at
(`upload.CRASH_ENV`), and the test suite's and the benchmarks' own knobs."""
SUGGESTION_CUTOFF = 0.6
"""How alike (difflib's ratio) a real name must be to a wrong one to be offered instead."""
ENVIRONMENT = "EVALPUSH_* environment variable"
COMMAND_LINE = "command line"


def _lowercase(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value


LogLevel = Annotated[Literal["debug", "info", "warning", "error"], BeforeValidator(_lowercase)]

_LISTEN = re.compile(r"(?:\[(?P<ipv6>[^\]]*)\]|(?P<host>[A-Za-z0-9.-]+)):(?P<port>[0-9]{1,5})")
LISTEN_FORMAT = "HOST:PORT, e.g. 127.0.0.1:9464, or [::1]:9464 for an IPv6 address"


def parse_listen(text: str) -> tuple[str, int]:
    """`host:port` or `[ipv6]:port` as (host, port); port 0 is any free port.

    A ValueError says what is wrong: a bare IPv6 address is refused, since its last `:` could
    be part of the address.
    """
    match = _LISTEN.fullmatch(text)
    if match is None:
        raise ValueError(f"expected {LISTEN_FORMAT}")
    port = int(match["port"])
    if port > MAX_PORT:
        raise ValueError(f"port {port} is over {MAX_PORT}; expected {LISTEN_FORMAT}")
    if match["ipv6"] is None:
        return match["host"], port
    try:
        ipaddress.IPv6Address(match["ipv6"])
    except ValueError:
        raise ValueError(
            f"[{match['ipv6']}] is not an IPv6 address; expected {LISTEN_FORMAT}"
        ) from None
    return match["ipv6"], port


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
    request_deadline_seconds: float = Field(600.0, gt=0)


class StateConfig(_Section):
    dir: Path | None = None


class LogConfig(_Section):
    level: LogLevel = "info"
    format: Literal["auto", "json", "console"] = "auto"


class MetricsConfig(_Section):
    listen: str = ""  # off; see parse_listen
    unhealthy_after_seconds: float = Field(600.0, gt=0)

    @field_validator("listen")
    @classmethod
    def _host_and_port(cls, value: str) -> str:
        if value:
            parse_listen(value)
        return value

    @property
    def address(self) -> tuple[str, int] | None:
        """Where to serve /metrics and /healthz: (host, port), or None when off."""
        return parse_listen(self.listen) if self.listen else None


class Config(BaseModel):
    """Every setting. `Config(...)` validates what it is given on the defaults and reads
    nothing; `load_config` adds the file and the environment (through pydantic-settings)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    watch: WatchConfig = WatchConfig()
    runs: RunsConfig = RunsConfig()
    read: ReadConfig = ReadConfig()
    convert: ConvertConfig = ConvertConfig()
    upload: UploadConfig = UploadConfig()
    platform: PlatformConfig = PlatformConfig()
    state: StateConfig = StateConfig()
    log: LogConfig = LogConfig()
    metrics: MetricsConfig = MetricsConfig()

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


def _keys() -> dict[str, tuple[str, str]]:
    """Every setting's variable name: `EVALPUSH_<SECTION>__<KEY>` -> (section, key)."""
    return {
        f"{ENV_PREFIX}{section}{ENV_NESTED_DELIMITER}{key}".upper(): (section, key)
        for section, field in Config.model_fields.items()
        for key in field.annotation.model_fields
    }


def _closest(name: str, candidates: Sequence[str]) -> str | None:
    import difflib  # only for an error message

    close = difflib.get_close_matches(name, candidates, n=1, cutoff=SUGGESTION_CUTOFF)
    return close[0] if close else None


# -- the environment --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Variables:
    """The `EVALPUSH_*` variables of one environment, sorted into settings and problems."""

    values: dict[str, str]  # EVALPUSH_<SECTION>__<KEY> (upper case) -> raw value
    names: dict[tuple[str, str], str]  # (section, key) -> the variable as it was spelt
    problems: list[str]


def _unknown_variable(name: str, keys: Sequence[str]) -> str:
    wrong = name.upper().removeprefix(ENV_PREFIX)
    real = [n.removeprefix(ENV_PREFIX) for n in (*keys, CONFIG_VARIABLE, STATE_DIR_VARIABLE)]
    closest = _closest(wrong, real)
    hint = (
        f"did you mean {ENV_PREFIX}{closest}?"
        if closest
        else f"settings are {ENV_PREFIX}<SECTION>{ENV_NESTED_DELIMITER}<KEY> (config.example.toml has every key)"
    )
    key = wrong.lower().replace(ENV_NESTED_DELIMITER, ".")
    return f"{name} ({ENVIRONMENT}): unknown key {key!r}, {hint}"


def _sort_variables(environ: Mapping[str, str]) -> _Variables:
    keys = _keys()
    found = _Variables({}, {}, [])
    state_dir: tuple[str, str] | None = None
    for name, value in environ.items():
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or upper in NOT_SETTINGS or upper == CONFIG_VARIABLE:
            continue
        if upper == STATE_DIR_VARIABLE:
            state_dir = (name, value) if value else None  # empty: unset, as before
        elif upper in keys:
            found.values[upper] = value
            found.names[keys[upper]] = name
        else:
            found.problems.append(_unknown_variable(name, list(keys)))
    if state_dir is not None:
        name, found.values[f"{ENV_PREFIX}STATE{ENV_NESTED_DELIMITER}DIR"] = state_dir
        found.names[("state", "dir")] = name
    return found


def _toml_value(raw: str) -> Any:
    """`raw` read as one TOML value; ValueError when it is not one (or is more than one)."""
    document = tomllib.loads(f"v = {raw}")
    if len(document) != 1:
        raise ValueError("more than one TOML value")
    return document["v"]


def _unquoted(raw: str) -> str:
    """A value written as a TOML string ("x" or 'x') is that string; anything else is itself."""
    if raw[:1] not in ('"', "'"):
        return raw
    try:
        value = _toml_value(raw)
    except ValueError:
        return raw
    return value if isinstance(value, str) else raw


# -- the file ---------------------------------------------------------------------------------


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


# -- errors -----------------------------------------------------------------------------------


def _holds(data: Mapping[str, Any], loc: tuple[int | str, ...]) -> bool:
    for part in loc:
        if not isinstance(data, Mapping) or part not in data:
            return False
        data = data[part]
    return True


@dataclass(frozen=True)
class _Origins:
    """Where each value came from, so an error can name it: the highest source that set it."""

    flags: Mapping[str, Any]
    variables: Mapping[tuple[str, str], str]
    path: Path | None

    def of(self, loc: tuple[int | str, ...]) -> str:
        if _holds(self.flags, loc[:2]):
            return COMMAND_LINE
        variable = self.variables.get((str(loc[0]), str(loc[1]))) if len(loc) > 1 else None
        if variable is not None:
            return f"{variable} ({ENVIRONMENT})"
        return str(self.path)  # defaults are valid, so whatever else failed came from the file


def _unknown_key(key: str) -> str:
    real = [*Config.model_fields, *(f"{s}.{k}" for s, k in _keys().values())]
    closest = _closest(key, real)
    return f"unknown key {key!r}" + (f" (did you mean {closest!r}?)" if closest else "")


def _problem(error: ErrorDetails, origins: _Origins) -> str:
    key = ".".join(str(part) for part in error["loc"])
    where = origins.of(error["loc"])
    if error["type"] == "extra_forbidden":
        return f"{where}: {_unknown_key(key)}"
    return f"{where}: key {key!r}: {error['msg']} (got {error.get('input')!r})"


# -- loading ----------------------------------------------------------------------------------


def load_config(
    path: Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    flags: Mapping[str, Mapping[str, Any]] | None = None,
) -> Config:
    """Build the configuration from defaults, the file, the environment and flags.

    `path` None means `$EVALPUSH_CONFIG` if set, else no file. `flags` is a nested
    `{section: {key: value}}` of command-line values that were given. Every problem found is
    in one `ConfigError`.
    """
    environ = os.environ if environ is None else environ
    flags = flags or {}
    what = "config file"
    if path is None and environ.get(CONFIG_VARIABLE):
        path, what = Path(environ[CONFIG_VARIABLE]), f"config file (named by {CONFIG_VARIABLE})"
    variables = _sort_variables(environ)
    try:
        if variables.values or path is not None:
            from evalpush.config_sources import load_sources

            config = load_sources(flags, variables.values, path, what)
        else:
            # Nothing for pydantic-settings to read, so it is not imported: it is a sixth of
            # `evalpush push`'s start-up. Validating the flags on the defaults is what it would do.
            config = Config(**flags)
    except ConfigError as exc:  # the file cannot be read
        raise _invalid([*variables.problems, str(exc)]) from None
    except ValidationError as exc:
        origins = _Origins(flags, variables.names, path)
        raise _invalid(
            [*variables.problems, *(_problem(error, origins) for error in exc.errors())]
        ) from None
    if variables.problems:
        raise _invalid(variables.problems)
    return config


def _invalid(problems: Sequence[str]) -> ConfigError:
    return ConfigError("invalid configuration: " + "; ".join(problems))
