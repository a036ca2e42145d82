"""The pydantic models that validate `evalpush.config`'s settings, generated from its dataclasses.

The dataclasses are the one definition of every setting (type, default, rules); each model here
is built from one of them the first time it is needed, with pydantic's `extra="forbid"` and
`frozen`, so a validation error (its location, its message) is what a hand-written model gives.
Imported at the first value given (defaults alone need none).
"""

from __future__ import annotations

import threading
import typing
from dataclasses import MISSING, fields
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, create_model

from evalpush.config.settings import BOUNDS, S, _Settings

VALIDATORS = {"before": BeforeValidator, "after": AfterValidator}
"""The rules of `config._setting` that are functions, and what pydantic wraps each in."""

_models: dict[type[_Settings], type[BaseModel]] = {}
# One model per dataclass even when two threads validate first at once: pydantic takes a
# section's model instance only where the field's model is that very class.
_building = threading.RLock()


def model_of(settings: type[_Settings]) -> type[BaseModel]:
    """The pydantic model of one dataclass of settings (a section, or `Config`)."""
    with _building:
        if settings not in _models:
            _models[settings] = _generated(settings)
        return _models[settings]


def _generated(settings: type[_Settings]) -> type[BaseModel]:
    hints = typing.get_type_hints(settings)
    definitions: dict[str, Any] = {}
    for f in fields(settings):  # type: ignore[arg-type]
        annotation = hints[f.name]
        if isinstance(annotation, type) and issubclass(annotation, _Settings):
            annotation = model_of(annotation)
            definitions[f.name] = (annotation, Field(default_factory=annotation))
            continue
        wrappers = [VALIDATORS[rule](f.metadata[rule]) for rule in VALIDATORS if rule in f.metadata]
        if wrappers:
            annotation = Annotated[(annotation, *wrappers)]  # type: ignore[valid-type]
        bounds = {rule: f.metadata[rule] for rule in BOUNDS if rule in f.metadata}
        if f.default_factory is MISSING:
            info = Field(f.default, **bounds)
        else:
            info = Field(default_factory=f.default_factory, **bounds)
        definitions[f.name] = (annotation, info)
    return create_model(  # type: ignore[call-overload,no-any-return]
        settings.__name__,
        __config__=ConfigDict(extra="forbid", frozen=True),
        __doc__=settings.__doc__,
        __module__=__name__,
        **definitions,
    )


def as_model(settings: _Settings) -> BaseModel:
    """`settings` as its model, keeping which keys were given (pydantic takes it unvalidated)."""
    values = {f.name: _model_value(getattr(settings, f.name)) for f in fields(settings)}  # type: ignore[arg-type]
    return model_of(type(settings)).model_construct(set(settings.model_fields_set), **values)


def _model_value(value: Any) -> Any:
    return as_model(value) if isinstance(value, _Settings) else value


def as_settings(settings: type[S], model: BaseModel) -> S:
    """A validated model as its dataclass (nested sections too), keeping which keys were given."""
    values = {}
    for f in fields(settings):  # type: ignore[arg-type]
        value = getattr(model, f.name)
        if isinstance(value, BaseModel):
            value = as_settings(f.default_factory, value)  # type: ignore[arg-type]
        values[f.name] = value
    built = settings._trusted(values)
    object.__setattr__(built, "_given", frozenset(model.model_fields_set))
    return built


def validate_data(settings: type[S], data: Any) -> S:
    """`settings.model_validate(data)`: `data` a mapping of keys to values (or settings)."""
    if isinstance(data, dict):
        data = _as_models(data)
    elif isinstance(data, _Settings):
        data = as_model(data)
    return as_settings(settings, model_of(settings).model_validate(data))


def _as_models(values: dict[str, Any]) -> dict[str, Any]:
    return {key: _model_value(value) for key, value in values.items()}
