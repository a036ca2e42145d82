"""The file and the environment under the flags, for `config.load_config`.

Imported only when there is an `EVALPUSH_*` setting or a config file to read. The sources are
merged as pydantic-settings merged them for this project, which it no longer loads (its import,
asyncio and its sources package, was ~225 ms of a start-up with a setting variable): the
file's tables, then each variable's value over them, then the flags over both, key by key.
`Config`'s generated pydantic model then validates it.

A variable's value: a TOML string ("x" or 'x') loses its quotes; for a key that wants an array
(a list, a set, a mapping) the value is read as TOML (`["/a", "/b"]`), and left as it is when
it is not TOML, so validation says what the key wants and names the variable; any other key
gets the plain string, which validation reads as the key's type.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from evalpush.config.settings import (
    _STATE_DIR_KEY,
    Config,
    _keys,
    _toml_value,
    _unquoted,
    read_toml,
    sections,
)
from evalpush.core.errors import ConfigError

if typing.TYPE_CHECKING:
    from pydantic_core import ErrorDetails

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

    from evalpush.config.models import validate_data

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
