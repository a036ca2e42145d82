"""`load_config`: the configuration from the flags, the environment and the file, validated.

Precedence, highest first: command-line flag > environment variable > config file > default,
each a pydantic-settings source of `Config`, merged key by key and validated whole (one
`ConfigError` naming every wrong key and where its value came from: the command line, the
variable, or the file; an unknown key or variable gets the closest real name).

- flags: `load_config(flags={section: {key: value}})`, the command-line values that were given;
- the environment: `EVALPUSH_<SECTION>__<KEY>` for any key, plus `EVALPUSH_STATE_DIR` (short for
  `EVALPUSH_STATE__DIR`, and wins over it). A TOML string ("x" or 'x') loses its quotes; for a
  key that wants an array (a list, a set, a mapping) the value is read as TOML
  (`["/a", "/b"]`), and left as it is when it is not TOML, so validation says what the key
  wants and names the variable; any other key gets the plain string, which validation reads as
  the key's type. Any other `EVALPUSH_*` variable is an error naming it and the closest real
  name, except `EVALPUSH_CONFIG` and the few in `NOT_SETTINGS`;
- the file: `--config FILE`, else `$EVALPUSH_CONFIG`; TOML, every key optional.

A key an earlier release read (`RETIRED`), in the file or as a variable, is dropped before
validation and named in `Config.ignored`, so an older config file still loads.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
from pydantic import ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails
from pydantic_settings import EnvSettingsSource, InitSettingsSource

from evalpush.config.settings import (
    _STATE_DIR_KEY,
    COMMAND_LINE,
    CONFIG_VARIABLE,
    ENV_NESTED_DELIMITER,
    ENV_PREFIX,
    ENVIRONMENT,
    NOT_SETTINGS,
    RETIRED,
    STATE_DIR_VARIABLE,
    Config,
    _closest,
    _keys,
    masked_ledger_url,
    read_toml,
    sections,
    sources_below_flags,
    variable_name,
)
from evalpush.core.errors import ConfigError

# -- the environment --------------------------------------------------------------------------


class _Variables(msgspec.Struct, frozen=True):
    """The `EVALPUSH_*` variables of one environment, sorted into settings and problems."""

    values: dict[str, str]  # EVALPUSH_<SECTION>__<KEY> (upper case) -> raw value
    names: dict[tuple[str, str], str]  # (section, key) -> the variable as it was spelt
    problems: list[str]
    retired: list[tuple[str, str, str]]  # (the variable as spelt, section, key)


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
    found = _Variables({}, {}, [], [])
    retired = {variable_name(section, key): (section, key) for section, key in RETIRED}
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
        elif upper in retired:
            found.retired.append((name, *retired[upper]))
        else:
            found.problems.append(_unknown_variable(name, list(keys)))
    if state_dir is not None:
        name, found.values[_STATE_DIR_KEY] = state_dir
        found.names[("state", "dir")] = name
    return found


def _toml_value(raw: str) -> Any:
    """`raw` read as one TOML value; ValueError when it is not one (or is more than one)."""
    try:
        document = tomllib.loads(f"v = {raw}")
    except RecursionError:  # nested arrays or inline tables past the interpreter's depth
        raise ValueError("nested too deeply to read") from None
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


# -- errors -----------------------------------------------------------------------------------


def _holds(data: Mapping[str, Any], loc: tuple[int | str, ...]) -> bool:
    for part in loc:
        if not isinstance(data, Mapping) or part not in data:
            return False
        data = data[part]
    return True


class _Origins(msgspec.Struct, frozen=True):
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
    real = [*sections(), *(f"{s}.{k}" for s, k in _keys().values())]
    closest = _closest(key, real)
    return f"unknown key {key!r}" + (f" (did you mean {closest!r}?)" if closest else "")


def _problem(error: ErrorDetails, origins: _Origins) -> str:
    key = ".".join(str(part) for part in error["loc"])
    where = origins.of(error["loc"])
    if error["type"] == "extra_forbidden":
        return f"{where}: {_unknown_key(key)}"
    given = error.get("input")
    if error["loc"] == ("ledger", "url") and isinstance(given, str):
        given = masked_ledger_url(given)  # the password it may hold is never quoted
    return f"{where}: key {key!r}: {error['msg']} (got {given!r})"


# -- the sources -----------------------------------------------------------------------------


class _SettingVariables(EnvSettingsSource):
    """The `EVALPUSH_*` setting variables given (not the process's own environment): quoted
    strings lose their quotes, and a key that wants an array reads its value as TOML, as the
    file writes it (a value that is not TOML is left as it is, for validation to name)."""

    def __init__(self, values: Mapping[str, str]) -> None:
        self._given = values
        super().__init__(Config)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return {name.lower(): _unquoted(raw) for name, raw in self._given.items()}

    def decode_complex_value(self, field_name: str, field: FieldInfo, value: Any) -> Any:
        try:
            return _toml_value(value)
        except ValueError:
            return value


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
    problems = list(variables.problems)
    try:
        file = read_toml(path, ConfigError, what, named_how=NAMED_HOW) if path is not None else {}
    except ConfigError as exc:
        raise _invalid([*problems, str(exc)], [*([KEY_FIX] if problems else []), exc.fix]) from None
    ignored = [
        f"{name} ({ENVIRONMENT}): {section}.{key} ({RETIRED[section, key]})"
        for name, section, key in variables.retired
    ]
    for section, key in RETIRED:
        table = file.get(section)
        if isinstance(table, dict) and key in table:
            del table[key]
            ignored.append(f"{path}: {section}.{key} ({RETIRED[section, key]})")
    try:
        with sources_below_flags(
            _SettingVariables(variables.values), InitSettingsSource(Config, file)
        ):
            config = Config(**flags)
    except ValidationError as exc:
        origins = _Origins(flags, variables.names, path)
        problems += [_problem(error, origins) for error in exc.errors()]
    if problems:
        raise _invalid(problems)
    config._ignored = tuple(ignored)
    return config


KEY_FIX = "correct the key it names"
NAMED_HOW = f"point --config (or ${CONFIG_VARIABLE}) at the file"
"""How another configuration file is named: the fix of one that cannot be read."""


def _invalid(problems: Sequence[str], fixes: Sequence[str] = (KEY_FIX,)) -> ConfigError:
    return ConfigError(
        "invalid configuration: " + "; ".join(problems),
        fix="; ".join(dict.fromkeys(fix for fix in fixes if fix)),
    )
