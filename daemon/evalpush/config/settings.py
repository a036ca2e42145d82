"""Configuration: every setting defined once, as pydantic models, with its default and its rules.

Each section is a frozen pydantic model that forbids unknown keys; `Config` holds them and is
pydantic-settings' `BaseSettings`, whose sources `load_config` (`evalpush.config.load`) fills:
the flags, the `EVALPUSH_*` variables and the file. `Config(...)` alone reads nothing: it is
the defaults, or the keyword arguments given, validated. Every problem in every source is one
`ConfigError` naming each key and where its value came from: the file, the variable, or the
command line. The platform's own variables (`PRIME_API_KEY`, ...) are read by
`evalpush.client.credentials`, which owns them.
"""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
import urllib.parse
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from evalpush.core.errors import BadInput
from evalpush.core.secrets import register_secret
from evalpush.core.smallfile import NotRegularFile, read_small_file

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
RETIRED = {
    ("upload", "push_processes"): "a push uploads every run in its own process",
}
"""Keys an earlier release read, now accepted and ignored so its config files still load;
`Config.ignored` names each one given (the daemon's start-up line and `check` show it)."""
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


class _Section(BaseModel):
    """A section of settings: frozen, an unknown key is an error naming it, and a number of
    seconds (every float setting) is finite: no setting means "never" by infinity or NaN."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class WatchConfig(_Section):
    """Where runs are found: the roots watched, and how often they are walked again."""

    roots: list[Path] = Field(default_factory=lambda: [Path("./outputs")])
    rescan_seconds: float = Field(60.0, gt=0)
    observer: Literal["auto", "inotify", "polling"] = "auto"
    # When a root is polled, the daemon rescans this often instead of every rescan_seconds
    # (a rescan costs what changed: about 0.04 s of CPU on 100,000 finalized runs).
    poll_seconds: float = Field(30.0, gt=0)
    # A rescan skips what has not changed (a directory whose mtime has not moved, a finalized
    # run); a late append to a finalized run's trace file moves no directory's mtime. The slow
    # sweep looks at every known directory fully once per this period, spread over the rescans.
    sweep_seconds: float = Field(86400.0, gt=0)
    # How often the daemon looks in the ledger for runs another command queued (`evalpush
    # retry`, a push's interrupted run): one indexed query.
    ledger_poll_seconds: float = Field(2.0, gt=0)


class RunsConfig(_Section):
    """When a run counts as finished, and whether replayed runs are uploaded."""

    settle_seconds: float = Field(300.0, ge=0)
    marker: str = ""
    upload_replays: bool = False
    # a run ready (settled, or its marker) with fewer traces than expected: upload it as a
    # partial evaluation (`complete: false`), or hold it for a person (`evalpush retry`)
    on_incomplete: Literal["upload", "hold"] = "upload"
    # follow a run from its first good line: its evaluation is created (open) and filled in
    # batches as the run is written, and finalized once it is finished (false: a run uploads
    # once it is finished). A run whose eval pushes itself is never followed.
    follow: bool = True
    # a followed run's batch goes once it holds upload.max_batch_bytes, or this long after its
    # first line was seen
    follow_batch_seconds: float = Field(30.0, gt=0)


class ReadConfig(_Section):
    """How a trace file is read."""

    max_line_bytes: int = Field(64 * MIB, gt=0)


class ConvertConfig(_Section):
    """What a line that cannot be converted does to its run."""

    on_bad_line: Literal["skip", "hold"] = "skip"


class UploadConfig(_Section):
    """How many runs upload at once, and how big a batch of samples may be."""

    max_concurrent_runs: int = Field(4, ge=1, le=64)
    max_batch_bytes: int = Field(25 * MIB, ge=1024, le=25 * MIB)
    max_batch_samples: int = Field(1000, ge=1)


class PlatformConfig(_Section):
    """The platform: where it is, the key's file, the team, and request timeouts."""

    api_base_url: str | None = None
    frontend_url: str | None = None
    api_key_file: Path | None = None
    team_id: str | None = None
    allow_insecure_http: bool = False
    connect_timeout_seconds: float = Field(10.0, gt=0)
    read_timeout_seconds: float = Field(120.0, gt=0)
    request_deadline_seconds: float = Field(600.0, gt=0)
    late_write_seconds: float = Field(10.0, ge=0)


class StateConfig(_Section):
    """Where the ledger lives (None: `Config.state_dir`'s default)."""

    dir: Path | None = None


def _names_a_password(key: str) -> bool:
    """Whether a URL query key (percent-decoded) names a password, however it is spelt:
    `password`, `PASSWORD`, `%70assword`, libpq's `sslpassword`."""
    return "password" in key.strip().lower()


def _url_pieces(value: str) -> tuple[str, str, str, str, str]:
    """A URL cut as it is written, never failing: (`scheme://` or "", userinfo, `@host...` up
    to the path, the path, `?query#fragment` or "")."""
    scheme, sep, rest = value.partition("://")
    head = f"{scheme}{sep}" if sep else ""
    rest = rest if sep else value
    netloc = re.match(r"[^/?#]*", rest)[0]  # type: ignore[index] - always matches
    userinfo, at, host = netloc.rpartition("@")
    tail = rest[len(netloc) :]
    cut = min((i for i in (tail.find("?"), tail.find("#")) if i >= 0), default=len(tail))
    return head, userinfo if at else "", f"{at}{host}", tail[:cut], tail[cut:]


def _query_pairs(rest: str) -> list[tuple[str, str, str]]:
    """`?query#fragment`'s parameters: (the piece as written, its key decoded, its value
    decoded)."""
    query = rest.partition("?")[2].partition("#")[0] if rest.startswith("?") else ""
    pairs = []
    for piece in query.split("&") if query else []:
        key, _, secret = piece.partition("=")
        pairs.append((piece, urllib.parse.unquote_plus(key), urllib.parse.unquote_plus(secret)))
    return pairs


_KEYWORD_PASSWORD = re.compile(r"(?i)(\w*password\w*\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)")
"""libpq's keyword/value form (`host=h password=x`): a password given in it, and its value."""


def ledger_url_passwords(value: str) -> list[str]:
    """Every password a ledger URL holds: its userinfo's, and each query parameter's whose key
    names one (keys percent-decoded before they are judged); in libpq's keyword/value form
    (not a URL, refused for that), each value of a key naming a password."""
    if "://" not in value:
        return [match[2].strip("'") for match in _KEYWORD_PASSWORD.finditer(value)]
    _, userinfo, _, _, rest = _url_pieces(value)
    found = [urllib.parse.unquote(userinfo.partition(":")[2])] if ":" in userinfo else []
    found += [secret for _, key, secret in _query_pairs(rest) if _names_a_password(key)]
    return found


def masked_ledger_url(value: str) -> str:
    """A ledger URL as it may be shown when it is refused: the userinfo's password and every
    password query parameter's value replaced by `***` (in libpq's keyword/value form, each
    value of a key naming a password)."""
    if "://" not in value:
        return _KEYWORD_PASSWORD.sub(r"\1***", value)
    head, userinfo, host, path, rest = _url_pieces(value)
    if ":" in userinfo:
        userinfo = f"{userinfo.partition(':')[0]}:***"
    if rest.startswith("?"):
        query, hash_, fragment = rest[1:].partition("#")
        pieces = [
            f"{piece.partition('=')[0]}=***" if _names_a_password(key) else piece
            for piece, key, _ in _query_pairs(rest)
        ]
        rest = f"?{'&'.join(pieces)}{hash_}{fragment}"
    return f"{head}{userinfo}{host}{path}{rest}"


def check_ledger_url(value: str) -> str:
    """`""` (the SQLite file in the state dir) or a PostgreSQL URL with no password in it (a
    URL is shown in status and logs; the password comes from `password_file`). A password
    found in it is registered with the scrubber at once, and the refusal never quotes it."""
    if not value:
        return value
    passwords = ledger_url_passwords(value)
    for password in passwords:
        register_secret(password)
    parts = urllib.parse.urlsplit(value)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ValueError(
            "expected empty (the SQLite ledger in the state dir) or postgresql://USER@HOST:PORT/DB"
        )
    if passwords:
        raise ValueError(
            "the URL holds a password, which would be shown wherever the URL is: put it in "
            "[ledger] password_file (or the systemd credential ledger-password) instead"
        )
    try:
        parts.port  # noqa: B018 - read to see it is one: 0 to 65535
    except ValueError as exc:
        raise ValueError(
            f"not a usable port ({exc}); expected postgresql://USER@HOST:PORT/DB"
        ) from None
    return value


class LedgerConfig(_Section):
    """Where the ledger lives: the SQLite file in the state dir (`url` empty), or a PostgreSQL
    database several daemons share (a fleet), and the lease a claim holds between renewals."""

    url: Annotated[str, AfterValidator(check_ledger_url)] = ""
    password_file: Path | None = None
    lease_seconds: float = Field(120.0, ge=5)


class LogConfig(_Section):
    """What the daemon logs, and how."""

    level: Annotated[Literal["debug", "info", "warning", "error"], BeforeValidator(_lowercase)] = (
        "info"
    )
    format: Literal["auto", "json", "console"] = "auto"


class MetricsConfig(_Section):
    """The /metrics and /healthz endpoint."""

    listen: Annotated[str, AfterValidator(_host_and_port)] = ""  # "": off; see parse_listen
    unhealthy_after_seconds: float = Field(600.0, gt=0)

    @property
    def address(self) -> tuple[str, int] | None:
        """Where to serve /metrics and /healthz: (host, port), or None when off."""
        return parse_listen(self.listen) if self.listen else None


class Config(BaseSettings):
    """Every setting. `Config(...)` validates what it is given on the defaults and reads
    nothing; `load_config` gives it the flags, the `EVALPUSH_*` variables and the file."""

    model_config = SettingsConfigDict(
        extra="forbid",
        frozen=True,
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_NESTED_DELIMITER,
        case_sensitive=False,
    )

    watch: WatchConfig = Field(default_factory=WatchConfig)
    runs: RunsConfig = Field(default_factory=RunsConfig)
    read: ReadConfig = Field(default_factory=ReadConfig)
    convert: ConvertConfig = Field(default_factory=ConvertConfig)
    upload: UploadConfig = Field(default_factory=UploadConfig)
    platform: PlatformConfig = Field(default_factory=PlatformConfig)
    state: StateConfig = Field(default_factory=StateConfig)
    ledger: LedgerConfig = Field(default_factory=LedgerConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    _ignored: tuple[str, ...] = PrivateAttr(default=())

    @property
    def ignored(self) -> tuple[str, ...]:
        """The retired keys the sources gave, each as `where: section.key (why)`."""
        return self._ignored

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """The keyword arguments, and below them the sources `load_config` gives (none
        otherwise: a `Config` built in code never depends on the process's environment)."""
        return (init_settings, *_SOURCES.get())

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


_SOURCES: ContextVar[tuple[PydanticBaseSettingsSource, ...]] = ContextVar("sources", default=())
"""The sources below the keyword arguments while `load_config` builds a `Config`."""


@contextmanager
def sources_below_flags(*sources: PydanticBaseSettingsSource) -> Iterator[None]:
    """While inside, a `Config` built reads `sources` (highest first) below its keyword arguments."""
    token = _SOURCES.set(sources)
    try:
        yield
    finally:
        _SOURCES.reset(token)


def sections() -> dict[str, type[BaseModel]]:
    """Each section's name and its model."""
    return {name: field.annotation for name, field in Config.model_fields.items()}  # type: ignore[misc]


def section_keys(section: type[BaseModel]) -> list[str]:
    """The keys of one section."""
    return list(section.model_fields)


def variable_name(section: str, key: str) -> str:
    """A setting's variable: `EVALPUSH_<SECTION>__<KEY>`."""
    return f"{ENV_PREFIX}{section}{ENV_NESTED_DELIMITER}{key}".upper()


def _keys() -> dict[str, tuple[str, str]]:
    """Every setting's variable name -> (section, key)."""
    return {
        variable_name(section, key): (section, key)
        for section, settings in sections().items()
        for key in section_keys(settings)
    }


def _closest(name: str, candidates: Sequence[str]) -> str | None:
    import difflib  # only for an error message

    close = difflib.get_close_matches(name, candidates, n=1, cutoff=SUGGESTION_CUTOFF)
    return close[0] if close else None


# -- the file ---------------------------------------------------------------------------------


TOML_FILE_BYTES = 16 * 1024 * 1024
"""The cap on a config file: far above any real one."""


def read_toml(
    path: Path, error: type[BadInput], what: str, *, named_how: str = ""
) -> dict[str, Any]:
    """A TOML file as a dict; every way it can fail is one `error` naming the file, with its
    fix (`named_how`: how another file is named instead). Only a regular file is read
    (`read_small_file`): a FIFO (or a device) would block the reader, or never end."""
    elsewhere = f", or {named_how}" if named_how else ""
    try:
        data, _ = read_small_file(path, TOML_FILE_BYTES)
        return tomllib.loads(data.decode("utf-8"))
    except NotRegularFile as exc:
        raise error(
            f"{path}: {what} is {exc.strerror}", fix=f"make it a regular file{elsewhere}"
        ) from None
    except FileNotFoundError:
        raise error(f"{path}: {what} not found", fix=f"create it{elsewhere}") from None
    except PermissionError:
        raise error(
            f"{path}: {what} not readable (permission denied)",
            fix=f"make it readable by this user (its owner and mode){elsewhere}",
        ) from None
    except OSError as exc:
        raise error(
            f"{path}: {what} cannot be read: {exc.strerror}", fix=f"see the message{elsewhere}"
        ) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise error(
            f"{path}: {what} is not valid TOML: {exc}",
            fix="correct the TOML syntax where the message says (line and column)",
        ) from None
    except RecursionError:  # tomllib recurses once per nested array or inline table
        raise error(
            f"{path}: {what} is not valid TOML: nested too deeply to read",
            fix="flatten the nesting (no real configuration nests this deep)",
        ) from None
