"""`load_config`: the configuration from the flags, the environment and the file, validated.

Precedence, highest first: command-line flag > environment variable > config file > default,
merged key by key, then validated whole by `Config`'s generated pydantic model (one
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
"""

from __future__ import annotations

import os
import tomllib
import typing
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from evalpush.config.settings import (
    _STATE_DIR_KEY,
    COMMAND_LINE,
    CONFIG_VARIABLE,
    ENV_NESTED_DELIMITER,
    ENV_PREFIX,
    ENVIRONMENT,
    NOT_SETTINGS,
    STATE_DIR_VARIABLE,
    Config,
    StateConfig,
    _closest,
    _keys,
    read_toml,
    sections,
    validate_data,
)
from evalpush.core.errors import ConfigError

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails


# -- the environment --------------------------------------------------------------------------


class _Variables(msgspec.Struct, frozen=True):
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
        name, found.values[_STATE_DIR_KEY] = state_dir
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
    if path is None and not flags and variables.values.keys() <= {_STATE_DIR_KEY}:
        # Nothing to validate: the defaults, and the state dir as it is.
        if variables.problems:
            raise _invalid(variables.problems)
        return _with_state_dir(variables.values.get(_STATE_DIR_KEY))
    try:
        config = load_sources(flags, variables.values, path, what)
    except ConfigError as exc:  # the file cannot be read
        raise _invalid([*variables.problems, str(exc)]) from None
    except InvalidValues as exc:
        origins = _Origins(flags, variables.names, path)
        raise _invalid(
            [*variables.problems, *(_problem(error, origins) for error in exc.errors)]
        ) from None
    if variables.problems:
        raise _invalid(variables.problems)
    return config


def _with_state_dir(raw: str | None) -> Config:
    """The defaults, with `EVALPUSH_STATE_DIR`'s value as the state dir: what the validated
    sources make of it (any string is a path; a quoted one loses its quotes), without pydantic."""
    if raw is None:
        return Config()
    return Config._trusted({"state": StateConfig._trusted({"dir": Path(_unquoted(raw))})})


def _invalid(problems: Sequence[str]) -> ConfigError:
    return ConfigError("invalid configuration: " + "; ".join(problems))


# -- merging the sources ----------------------------------------------------------------------

_ARRAYS = (list, tuple, set, frozenset, dict)
"""Annotations (their origins) whose values a variable writes as TOML."""


def load_sources(
    flags: Mapping[str, Mapping[str, Any]],
    variables: Mapping[str, str],
    path: Path | None,
    what: str,
) -> Config:
    """The configuration from the flags, the `EVALPUSH_*` setting variables and the file.

    `variables`: each setting variable's value by its upper-case name (`config._sort_variables`
    has set aside the names of no setting). Raises `ConfigError` when the file cannot be read,
    `InvalidValues` when a value is wrong (`load_config` names where each came from)."""
    data = read_toml(path, ConfigError, what) if path is not None else {}
    keys = {**_keys(), _STATE_DIR_KEY: ("state", "dir")}
    for name, raw in variables.items():
        section, key = keys[name]
        _put(data, section, key, _variable_value(section, key, raw))
    for section, values in flags.items():
        for key, value in values.items():
            _put(data, section, key, value)
    from pydantic import ValidationError

    try:
        return validate_data(Config, data)
    except ValidationError as exc:
        raise InvalidValues(exc.errors()) from None


class InvalidValues(Exception):
    """Values the sources hold that are wrong, as pydantic describes each (where, what, why)."""

    def __init__(self, errors: list[ErrorDetails]):
        super().__init__(f"{len(errors)} invalid values")
        self.errors = errors


def _put(data: dict[str, Any], section: str, key: str, value: Any) -> None:
    """`data[section][key] = value`; a section the file wrote as no table becomes one."""
    table = data.get(section)
    if not isinstance(table, dict):
        table = data[section] = {}
    table[key] = value


def _variable_value(section: str, key: str, raw: str) -> Any:
    value = _unquoted(raw)
    if value and _wants_array(section, key):
        try:
            return _toml_value(value)
        except ValueError:
            return value
    return value


@cache
def _wants_array(section: str, key: str) -> bool:
    """Whether the key's type is an array or a mapping (also inside an optional or a union)."""
    annotation = typing.get_type_hints(sections()[section])[key]
    shapes = typing.get_args(annotation) if typing.get_origin(annotation) in _UNIONS else ()
    return any((typing.get_origin(shape) or shape) in _ARRAYS for shape in (annotation, *shapes))


_UNIONS = (typing.Union, type(int | None))
