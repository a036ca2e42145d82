"""The environment and the file as pydantic-settings sources, for `config.load_config`.

Imported only when there is an `EVALPUSH_*` setting or a config file to read: pydantic-settings
(with the asyncio it imports) is about a sixth of `evalpush push`'s start-up, and without a
variable or a file it would only validate the flags on the defaults, which `Config` does alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from evalpush.config import (
    ENV_NESTED_DELIMITER,
    ENV_PREFIX,
    Config,
    _toml_value,
    _unquoted,
    read_toml,
)
from evalpush.config_models import as_settings, model_of
from evalpush.errors import ConfigError

# The sources of the `load_sources` call under way; outside one, `Sourced()` reads nothing.
_LOADING: ContextVar[tuple[PydanticBaseSettingsSource, ...]] = ContextVar(
    "evalpush_config_sources", default=()
)


class Sourced(BaseSettings, model_of(Config)):  # type: ignore[misc]
    """`Config`'s model as pydantic-settings loads it: keyword arguments (the flags) > environment >
    file > defaults."""

    model_config = SettingsConfigDict(
        extra="forbid",
        frozen=True,
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_NESTED_DELIMITER,
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """The environment and the file are the ones `load_sources` was given: the library's
        own sources read `os.environ` and a file fixed on the class."""
        return (init_settings, *_LOADING.get())


class _Environment(EnvSettingsSource):
    """pydantic-settings' environment source over given variables, with values written as TOML."""

    def __init__(self, settings_cls: type[BaseSettings], variables: Mapping[str, str]):
        self._variables = variables  # read by _load_env_vars, which the base __init__ calls
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        # The library reads os.environ; load_config is given the environment (tests give theirs)
        # and has already set aside every variable that names no setting.
        return {name.lower(): _unquoted(value) for name, value in self._variables.items()}

    def decode_complex_value(self, field_name: str, field: FieldInfo, value: Any) -> Any:
        # An array is written as in the file, so ['/a'] works as well as the library's JSON.
        try:
            return _toml_value(value)
        except ValueError:
            return value  # validation then says what the key wants, naming the variable


class _ConfigFile(TomlConfigSettingsSource):
    """pydantic-settings' TOML source, except that a file it cannot read is an error naming it.

    The library skips a missing file without a word, and anything that is not a regular file,
    such as the pipe of `--config <(...)`.
    """

    def __init__(self, settings_cls: type[BaseSettings], path: Path, what: str):
        self._what = what  # read by _read_files, which the base __init__ calls
        super().__init__(settings_cls, toml_file=path)

    def _read_files(self, files: Any, deep_merge: bool = False) -> dict[str, Any]:
        return read_toml(Path(files), ConfigError, self._what)


def load_sources(
    flags: Mapping[str, Mapping[str, Any]],
    variables: Mapping[str, str],
    path: Path | None,
    what: str,
) -> Config:
    """The configuration from the flags, the `EVALPUSH_*` setting variables and the file.

    Raises `ConfigError` when the file cannot be read, pydantic's `ValidationError` when a value
    is wrong (`load_config` names where each came from)."""
    sources: list[PydanticBaseSettingsSource] = [_Environment(Sourced, variables)]
    if path is not None:
        sources.append(_ConfigFile(Sourced, path, what))
    token = _LOADING.set(tuple(sources))
    try:
        loaded = Sourced(**flags)
    finally:
        _LOADING.reset(token)
    return as_settings(Config, loaded)
