"""Configuration: every setting defined once, as frozen dataclasses, validated by their rules.

Each section is a frozen, slotted dataclass whose fields carry their defaults and rules
(`_setting`). What is given (keyword arguments, flags, a file, setting variables) is validated
by the pydantic models generated at the bottom of this module from the same rules, which also
name what is wrong; `EVALPUSH_STATE_DIR` alone is taken as it is.

`Config()` alone reads nothing: it is the defaults, or the keyword arguments given. Only
`evalpush.config.load.load_config` reads the flags, the environment and the file (its
docstring gives the precedence and the sources). Every problem in every source is one
`ConfigError` naming each key and where its value came from: the file, the variable, or the
command line. The platform's own variables (`PRIME_API_KEY`, ...) are read by
`evalpush.client.platform`, which owns credentials.
"""

from __future__ import annotations

import ipaddress
import os
import re
import threading
import tomllib
import typing
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, FrozenInstanceError, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Self, TypeVar

from evalpush.core.errors import BadInput

if TYPE_CHECKING:
    from pydantic import BaseModel

MIB = 1024 * 1024
MAX_PORT = 65535
ENV_PREFIX = "EVALPUSH_"
ENV_NESTED_DELIMITER = "__"
CONFIG_VARIABLE = "EVALPUSH_CONFIG"
STATE_DIR_VARIABLE = "EVALPUSH_STATE_DIR"
_STATE_DIR_KEY = f"{ENV_PREFIX}STATE{ENV_NESTED_DELIMITER}DIR"
NOT_SETTINGS = frozenset({"EVALPUSH_CRASH_AT", "EVALPUSH_TEST_SEED", "EVALPUSH_BENCH_PEAK_FILE"})
"""`EVALPUSH_*` variables that are not settings: the crash point tests kill at
(`upload.CRASH_ENV`), and the test suite's and the benchmarks' own knobs."""
SUGGESTION_CUTOFF = 0.6
"""How alike (difflib's ratio) a real name must be to a wrong one to be offered instead."""
ENVIRONMENT = "EVALPUSH_* environment variable"
COMMAND_LINE = "command line"


def _lowercase(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value


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


def _host_and_port(value: str) -> str:
    if value:
        parse_listen(value)
    return value


def _setting(default: Any = MISSING, *, factory: Any = MISSING, **rules: Any) -> Any:
    """A setting's default and its rules, which the pydantic models generated below gives pydantic:
    `gt`, `ge`, `le` (bounds), `before` (a function applied to the input before validation),
    `after` (a check of the validated value that raises ValueError)."""
    return field(default=default, default_factory=factory, metadata=rules)


S = TypeVar("S", bound="_Settings")
BOUNDS = ("gt", "ge", "le")
"""The rules of `_setting` that bound a value (as the `operator` functions of those names)."""


class _Settings:
    """A frozen, slotted dataclass of settings (each subclass), validated by its fields' rules.

    `Section(key=value, ...)` validates what it is given on the defaults (`_validated`: a
    pydantic model generated from the dataclass judges what is not plainly valid, and raises
    pydantic's `ValidationError`). `Section()` is the defaults and imports nothing. The `model_*` names are pydantic's,
    with the same meaning, so code written against the pydantic models reads the same.
    """

    __slots__ = ("_given",)  # the keys set explicitly (pydantic's model_fields_set)

    def __init__(self, **values: Any) -> None:
        if values:
            self._fill(_validated(type(self), values))
        else:
            self._fill(type(self)._trusted({}))

    @classmethod
    def _trusted(cls, values: Mapping[str, Any]) -> Self:
        """The defaults with `values` (valid already: not validated again) set over them."""
        settings = object.__new__(cls)
        for f in fields(cls):  # type: ignore[arg-type]
            if f.name in values:
                value = values[f.name]
            else:
                value = f.default if f.default_factory is MISSING else f.default_factory()
            object.__setattr__(settings, f.name, value)
        object.__setattr__(settings, "_given", frozenset(values))
        return settings

    def _fill(self, other: _Settings) -> None:
        for f in fields(self):  # type: ignore[arg-type]
            object.__setattr__(self, f.name, getattr(other, f.name))
        object.__setattr__(self, "_given", other._given)

    @classmethod
    def model_validate(cls, data: Any) -> Self:
        """`data` (a mapping of keys to values) validated on the defaults; pydantic's error."""
        return _validated(cls, data)

    @property
    def model_fields_set(self) -> frozenset[str]:
        """The keys that were given, rather than left at their defaults."""
        return self._given

    def model_dump(self, mode: Literal["python", "json"] = "python") -> dict[str, Any]:
        """Every key and its value, nested sections as dicts; `json`: paths as strings."""
        return {f.name: _dumped(getattr(self, f.name), mode) for f in fields(self)}  # type: ignore[arg-type]

    # Equality, hashing, repr and immutability are written once here rather than generated
    # by `dataclass` for each section: its generated methods were 5 ms of `evalpush push`.
    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self.__dataclass_fields__)  # type: ignore[attr-defined]

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._values() == other._values()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        values = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__dataclass_fields__)  # type: ignore[attr-defined]
        return f"{type(self).__name__}({values})"

    def __setattr__(self, name: str, value: Any) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def __reduce__(self) -> tuple[Any, ...]:
        # A copy or a pickle keeps which keys were given (the dataclass's own state omits it).
        values = {f.name: getattr(self, f.name) for f in fields(self)}  # type: ignore[arg-type]
        return _restored, (type(self), values, self._given)


def _validated(settings: type[S], data: Any) -> S:
    """`data` validated as `settings` by the pydantic models (imported at the first value given:
    defaults alone need none), which raise pydantic's `ValidationError` naming what is wrong."""
    return validate_data(settings, data)


def _restored(cls: type[_Settings], values: dict[str, Any], given: frozenset[str]) -> _Settings:
    settings = cls._trusted(values)
    object.__setattr__(settings, "_given", given)
    return settings


def _dumped(value: Any, mode: str) -> Any:
    if isinstance(value, _Settings):
        return value.model_dump(mode)  # type: ignore[arg-type]
    if isinstance(value, list):
        return [_dumped(item, mode) for item in value]
    if mode == "json" and isinstance(value, Path):
        return str(value)
    return value


_SECTION = dataclass(slots=True, init=False, repr=False, eq=False)
"""Every section, and `Config`: no per-instance dict; `_Settings` validates, compares, freezes."""


@_SECTION
class WatchConfig(_Settings):
    """Where runs are found: the roots watched, and how often they are walked again."""

    roots: list[Path] = _setting(factory=lambda: [Path("./outputs")])
    rescan_seconds: float = _setting(60.0, gt=0)
    observer: Literal["auto", "inotify", "polling"] = _setting("auto")
    # When a root is polled, the daemon rescans this often instead of every rescan_seconds
    # (about 0.15 s of CPU per 10,000 runs: every 30 s is 0.5% of a core).
    poll_seconds: float = _setting(30.0, gt=0)


@_SECTION
class RunsConfig(_Settings):
    """When a run counts as finished, and whether replayed runs are uploaded."""

    settle_seconds: float = _setting(300.0, ge=0)
    marker: str = _setting("")
    upload_replays: bool = _setting(False)
    # a run ready (settled, or its marker) with fewer traces than expected: upload it as a
    # partial evaluation (`complete: false`), or hold it for a person (`evalpush retry`)
    on_incomplete: Literal["upload", "hold"] = _setting("upload")


@_SECTION
class ReadConfig(_Settings):
    """How a trace file is read."""

    max_line_bytes: int = _setting(64 * MIB, gt=0)


@_SECTION
class ConvertConfig(_Settings):
    """What a line that cannot be converted does to its run."""

    on_bad_line: Literal["skip", "hold"] = _setting("skip")


@_SECTION
class UploadConfig(_Settings):
    """How many runs upload at once, and how big a batch of samples may be."""

    max_concurrent_runs: int = _setting(4, ge=1, le=64)
    max_batch_bytes: int = _setting(25 * MIB, ge=1024, le=25 * MIB)
    max_batch_samples: int = _setting(1000, ge=1)


@_SECTION
class PlatformConfig(_Settings):
    """The platform: where it is, the key's file, the team, and request timeouts."""

    api_base_url: str | None = _setting(None)
    frontend_url: str | None = _setting(None)
    api_key_file: Path | None = _setting(None)
    team_id: str | None = _setting(None)
    allow_insecure_http: bool = _setting(False)
    connect_timeout_seconds: float = _setting(10.0, gt=0)
    read_timeout_seconds: float = _setting(120.0, gt=0)
    request_deadline_seconds: float = _setting(600.0, gt=0)


@_SECTION
class StateConfig(_Settings):
    """Where the ledger lives (None: `Config.state_dir`'s default)."""

    dir: Path | None = _setting(None)


@_SECTION
class LogConfig(_Settings):
    """What the daemon logs, and how."""

    level: Literal["debug", "info", "warning", "error"] = _setting("info", before=_lowercase)
    format: Literal["auto", "json", "console"] = _setting("auto")


@_SECTION
class MetricsConfig(_Settings):
    """The /metrics and /healthz endpoint."""

    listen: str = _setting("", after=_host_and_port)  # "": off; see parse_listen
    unhealthy_after_seconds: float = _setting(600.0, gt=0)

    @property
    def address(self) -> tuple[str, int] | None:
        """Where to serve /metrics and /healthz: (host, port), or None when off."""
        return parse_listen(self.listen) if self.listen else None


@_SECTION
class Config(_Settings):
    """Every setting. `Config(...)` validates what it is given on the defaults and reads
    nothing; `load_config` adds the file and the environment (`config_sources`)."""

    watch: WatchConfig = _setting(factory=WatchConfig)
    runs: RunsConfig = _setting(factory=RunsConfig)
    read: ReadConfig = _setting(factory=ReadConfig)
    convert: ConvertConfig = _setting(factory=ConvertConfig)
    upload: UploadConfig = _setting(factory=UploadConfig)
    platform: PlatformConfig = _setting(factory=PlatformConfig)
    state: StateConfig = _setting(factory=StateConfig)
    log: LogConfig = _setting(factory=LogConfig)
    metrics: MetricsConfig = _setting(factory=MetricsConfig)

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


def sections() -> dict[str, type[_Settings]]:
    """Each section's name and its dataclass."""
    return {f.name: f.default_factory for f in fields(Config)}  # type: ignore[misc]


def section_keys(section: type[_Settings]) -> list[str]:
    """The keys of one section."""
    return [f.name for f in fields(section)]  # type: ignore[arg-type]


def _keys() -> dict[str, tuple[str, str]]:
    """Every setting's variable name: `EVALPUSH_<SECTION>__<KEY>` -> (section, key)."""
    return {
        f"{ENV_PREFIX}{section}{ENV_NESTED_DELIMITER}{key}".upper(): (section, key)
        for section, settings in sections().items()
        for key in section_keys(settings)
    }


def _closest(name: str, candidates: Sequence[str]) -> str | None:
    import difflib  # only for an error message

    close = difflib.get_close_matches(name, candidates, n=1, cutoff=SUGGESTION_CUTOFF)
    return close[0] if close else None


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


# -- validation: pydantic models generated from the dataclasses -----------------------------
#
# The dataclasses are the one definition of every setting (type, default, rules); each model is
# built from one of them the first time it is needed, with pydantic's `extra="forbid"` and
# `frozen`, so a validation error (its location, its message) is what a hand-written model
# gives. pydantic is imported at the first value given (defaults alone need none).

VALIDATORS = ("before", "after")
"""The rules of `_setting` that are functions (pydantic's BeforeValidator, AfterValidator)."""

_models: dict[type[_Settings], type[BaseModel]] = {}  # built at first use
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
    from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field, create_model

    wrap = {"before": BeforeValidator, "after": AfterValidator}
    hints = typing.get_type_hints(settings)
    definitions: dict[str, Any] = {}
    for f in fields(settings):  # type: ignore[arg-type]
        annotation = hints[f.name]
        if isinstance(annotation, type) and issubclass(annotation, _Settings):
            annotation = model_of(annotation)
            definitions[f.name] = (annotation, Field(default_factory=annotation))
            continue
        wrappers = [wrap[rule](f.metadata[rule]) for rule in VALIDATORS if rule in f.metadata]
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
    from pydantic import BaseModel

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
