"""Settings that are plainly valid, validated without pydantic: what a start-up usually meets.

A config file, a setting variable or a flag most often holds values in their plainest form: a
number written as digits, `true`, a path, a word the setting allows. `plainly_valid` accepts
exactly those, with the same rules `evalpush.config_models` gives pydantic (each field's type,
bounds and functions, read from the dataclasses), and builds the same value pydantic would.
Anything else (a bound broken, an unknown key, `" 4 "`, `4.0`, `"1_0"`, `"inf"`) is left to
pydantic, which accepts what its lax rules accept and names what is wrong: importing it and
generating its models was ~150-200 ms of a start-up with a setting variable.

`tests/test_config_quick.py` checks, on many inputs, that whatever this module accepts, pydantic
accepts as the same value, with the same keys given.
"""

from __future__ import annotations

import math
import operator
import re
import types
import typing
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any, Literal

from evalpush.config import BOUNDS, S, _Settings

_DIGITS = re.compile(r"[0-9]{1,15}")
_DECIMAL = re.compile(r"[0-9]{1,15}(?:\.[0-9]{1,15})?")
_EXACT_FLOAT = 2**53
"""Integers up to here are floats exactly (pydantic's float of a larger one is left to it)."""
_BOOLEANS = {"true": True, "false": False, "yes": True, "no": False, "on": True, "off": False}
_BOUNDS = {rule: getattr(operator, rule) for rule in BOUNDS}


class _Unsure(Exception):
    """A value this module does not judge: pydantic will."""


Check = Callable[[Any], Any]


def plainly_valid(settings: type[S], data: Any) -> S | None:
    """`data` (a mapping of keys to values, sections as mappings or values) as `settings`,
    when every value in it is plainly valid; None when pydantic must judge it."""
    try:
        return _section(settings, data)
    except _Unsure:
        return None


def _section(settings: type[S], data: Any) -> S:
    if type(data) is settings:
        return data  # type: ignore[no-any-return]
    if not isinstance(data, dict):
        raise _Unsure
    checks = _checks(settings)
    if not data.keys() <= checks.keys():
        raise _Unsure
    return settings._trusted({key: checks[key](value) for key, value in data.items()})


@cache
def _checks(settings: type[_Settings]) -> dict[str, Check]:
    hints = typing.get_type_hints(settings)
    return {
        f.name: _field_check(hints[f.name], f.metadata)
        for f in settings.__dataclass_fields__.values()  # type: ignore[attr-defined]
    }


def _field_check(annotation: Any, rules: typing.Mapping[str, Any]) -> Check:
    check = _type_check(annotation)
    before, after = rules.get("before"), rules.get("after")
    bounds = [(_BOUNDS[rule], limit) for rule, limit in rules.items() if rule in _BOUNDS]

    def checked(value: Any) -> Any:
        if before is not None:
            value = before(value)
        value = check(value)
        if not all(holds(value, limit) for holds, limit in bounds):
            raise _Unsure
        if after is not None:
            try:
                value = after(value)
            except ValueError:
                raise _Unsure from None
        return value

    return checked


def _type_check(annotation: Any) -> Check:
    """What turns a plain value into one of `annotation`'s, or raises `_Unsure`."""
    if isinstance(annotation, type) and issubclass(annotation, _Settings):
        return lambda value: _section(annotation, value)
    if annotation in _PLAIN:
        return _PLAIN[annotation]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return lambda value: _one_of(value, args)
    if origin is list:
        (item,) = args
        each = _type_check(item)
        return lambda value: _each(value, each)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        (other,) = (arg for arg in args if arg is not type(None))
        inner = _type_check(other)
        return lambda value: None if value is None else inner(value)
    return _unsure


def _integer(value: Any) -> int:
    if type(value) is int:
        return value
    if type(value) is str and _DIGITS.fullmatch(value):
        return int(value)
    raise _Unsure


def _real(value: Any) -> float:
    if type(value) is float and math.isfinite(value):
        return value
    if type(value) is int and abs(value) <= _EXACT_FLOAT:
        return float(value)
    if type(value) is str and _DECIMAL.fullmatch(value):
        return float(value)
    raise _Unsure


def _boolean(value: Any) -> bool:
    if type(value) is bool:
        return value
    if type(value) is str and value.isascii() and value.lower() in _BOOLEANS:
        return _BOOLEANS[value.lower()]
    raise _Unsure


def _text(value: Any) -> str:
    if type(value) is str:
        return value
    raise _Unsure


def _path(value: Any) -> Path:
    if isinstance(value, Path):
        return value
    if type(value) is str and value and "\0" not in value:
        return Path(value)
    raise _Unsure


def _one_of(value: Any, allowed: tuple[Any, ...]) -> Any:
    if type(value) is str and value in allowed:
        return value
    raise _Unsure


def _each(value: Any, check: Check) -> list[Any]:
    if type(value) is not list:
        raise _Unsure
    return [check(item) for item in value]


def _unsure(value: Any) -> Any:
    raise _Unsure


_PLAIN: dict[Any, Check] = {int: _integer, float: _real, bool: _boolean, str: _text, Path: _path}
