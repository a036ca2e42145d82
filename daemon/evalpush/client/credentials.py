"""The platform's credentials: the key, the API base, the viewer base and the team, found with
the `prime` CLI's precedence (docs/PLATFORM_API.md), plus a key file (`platform.api_key_file`,
or systemd's `$CREDENTIALS_DIRECTORY/prime-api-key`).

The key is registered with `evalpush.log` so no log line can carry it, and `Credentials` never
shows it. A key file that users other than its owner may read draws one warning (per file and
mode). A key that is not printable ASCII is refused when it is loaded (`AuthError` naming where
it came from, never quoting it). Plain `http://` is refused unless the host is loopback or
`platform.allow_insecure_http` is set; a platform URL holding a user name or password is
refused.
"""

from __future__ import annotations

import ipaddress
import os
import re
import stat
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import msgspec

from evalpush.config import PlatformConfig
from evalpush.core import errors
from evalpush.core.smallfile import SECRET_FILE_BYTES, read_small_file
from evalpush.log import get_logger, register_secret

DEFAULT_API_BASE = "https://api.primeintellect.ai"
DEFAULT_FRONTEND_URL = "https://app.primeintellect.ai"
API_PREFIX = "/api/v1"
SYSTEMD_CREDENTIAL_NAME = "prime-api-key"
PRIME_CONFIG_BYTES = 1024 * 1024
"""The cap on `~/.prime/config.json`: far above any real one."""
OTHERS_READ = stat.S_IRGRP | stat.S_IROTH
"""A key file with either bit set may be read by users other than its owner: a warning."""


class Credentials(msgspec.Struct, frozen=True):
    """Where and as whom to talk to the platform. `repr` leaves the key out."""

    api_key: str
    api_base: str
    frontend_url: str
    team_id: str | None = None
    key_source: str = ""
    """Where the key was found (for `evalpush check`), e.g. `$PRIME_API_KEY`."""
    warning: str = ""
    """What is wrong with how the key is kept without stopping its use (`check`'s WARN row):
    a key file other users may read."""

    def __repr__(self) -> str:
        return (
            f"Credentials(api_base={self.api_base!r}, frontend_url={self.frontend_url!r}, "
            f"team_id={self.team_id!r}, key_source={self.key_source!r})"
        )


def clean_text(value: Any) -> str | None:
    """A non-empty stripped string from a config value, else None."""
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        value = str(value).strip()
        return value or None
    return None


def _read_prime_config(home: Path) -> tuple[dict[str, Any], str]:
    """`~/.prime/config.json` (written by `prime login`) and a note on how it was found."""
    path = home / ".prime" / "config.json"
    try:
        data = msgspec.json.decode(read_small_file(path, PRIME_CONFIG_BYTES)[0])
    except FileNotFoundError:
        return {}, f"{path} (no such file)"
    except (OSError, msgspec.DecodeError, RecursionError) as exc:
        # A broken file must not block a key given another way; it is named if no key is found.
        return {}, f"{path} (unreadable: {exc})"
    if not isinstance(data, dict):
        return {}, f"{path} (not a JSON object)"
    return data, str(path)


def _read_key_file(path: Path, name: str) -> tuple[str, str]:
    """The key in the file, and a warning when other users may read the file."""
    try:
        data, info = read_small_file(path, SECRET_FILE_BYTES)
        key = data.decode("utf-8").strip()
        mode = stat.S_IMODE(info.st_mode)
    except OSError as exc:
        raise errors.AuthError(
            f"{name}: cannot read the API key from {path}: {exc.strerror}"
        ) from None
    except UnicodeDecodeError:
        raise errors.AuthError(f"{name}: {path} is not UTF-8 text") from None
    if not key:
        raise errors.AuthError(f"{name}: {path} is empty")
    _warn_if_others_read(path, mode)
    return key, others_read_warning(path, mode)


def others_read_warning(path: Path, mode: int) -> str:
    """The warning about a key file users other than its owner may read ("" when none may)."""
    if not mode & OTHERS_READ:
        return ""
    return f"the API key file {path} is readable by other users (mode {mode:04o}): chmod 600 it"


_warned_modes: set[tuple[str, int]] = set()
"""(key file, mode) pairs already warned of: the key is read again on every reload and probe."""


def _warn_if_others_read(path: Path, mode: int) -> None:
    """One warning (per file and mode) when users other than its owner may read the key file."""
    if not mode & OTHERS_READ or (str(path), mode) in _warned_modes:
        return
    _warned_modes.add((str(path), mode))
    get_logger(stage="platform").warning(
        "the API key file is readable by other users: chmod 600 it",  # others_read_warning's
        path=str(path),
        mode=f"{mode:04o}",
    )


def _find_key(
    config: PlatformConfig,
    environ: Mapping[str, str],
    prime_config: dict[str, Any],
    prime_note: str,
) -> tuple[str, str, str]:
    """The API key, where it came from, and a warning about how it is kept; first found wins."""
    key = clean_text(environ.get("PRIME_API_KEY"))
    if key:
        return key, "$PRIME_API_KEY", ""
    if config.api_key_file is not None:
        path = config.api_key_file.expanduser()
        key, warning = _read_key_file(path, "platform.api_key_file")
        return key, f"platform.api_key_file ({path})", warning
    looked = ["$PRIME_API_KEY", "platform.api_key_file (not set)"]
    credentials_dir = environ.get("CREDENTIALS_DIRECTORY")
    if credentials_dir:
        path = Path(credentials_dir) / SYSTEMD_CREDENTIAL_NAME
        if path.exists():
            key, warning = _read_key_file(path, "$CREDENTIALS_DIRECTORY")
            return key, f"systemd credential ({path})", warning
        looked.append(f"{path} (no such file)")
    else:
        looked.append(f"$CREDENTIALS_DIRECTORY/{SYSTEMD_CREDENTIAL_NAME} (not set)")
    key = clean_text(prime_config.get("api_key"))
    if key:
        return key, f"api_key in {prime_note}", ""
    looked.append(f"api_key in {prime_note}")
    raise errors.AuthError(
        "no API key found; looked in "
        + ", ".join(looked)
        + ". Set PRIME_API_KEY, platform.api_key_file, or run `prime login`."
    )


def _check_key(key: str, source: str) -> None:
    """Refuse a key no HTTP header can carry, saying where it came from and never what it is."""
    for position, char in enumerate(key, start=1):
        if not "!" <= char <= "~":
            kind = (
                "a space"
                if char == " "
                else (
                    "a control character (newline, tab...)"
                    if char.isspace() or ord(char) < 32
                    else "a character that is not ASCII"
                )
            )
            raise errors.AuthError(
                f"the API key from {source} holds {kind} at character {position}: an API key is "
                "printable ASCII without spaces; fix the key"
            )


def _first(candidates: list[tuple[str, Any]]) -> tuple[str, str] | None:
    """The first (source, value) whose value is set."""
    for source, value in candidates:
        text = clean_text(value)
        if text:
            return source, text
    return None


def _is_loopback(host: str) -> bool:
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


USERINFO = re.compile(r"^\s*([A-Za-z][A-Za-z0-9+.-]*://)[^/?#]*@")
"""A URL's `user:password@` part (what comes before the host)."""


def _refuse_userinfo(source: str, raw: str) -> None:
    """The API key is the one credential evalpush sends: a platform URL holding a user name or
    password is refused, and named without them (it would be printed, and the frontend's
    stored in every viewer URL)."""
    if USERINFO.match(raw):
        shown = USERINFO.sub(r"\1...@", raw.strip())
        raise errors.ConfigError(
            f"{source}: {shown} holds a user name or password; evalpush sends the platform's "
            "API key and no other credential, and would print the URL: remove the part before "
            "the @"
        )


def http_url(text: str) -> httpx.URL:
    """`text` as an http(s) URL that names a place to connect to; ValueError otherwise."""
    try:
        url = httpx.URL(text)
        url.port  # noqa: B018 - a port out of range raises here
    except (httpx.InvalidURL, ValueError, TypeError) as exc:
        raise ValueError(str(exc) or "not a URL") from None
    if url.scheme not in ("http", "https"):
        raise ValueError(f"the scheme {url.scheme!r} is not http(s)")
    if not url.host:
        raise ValueError("no host")
    return url


def _api_base(source: str, raw: str, allow_insecure_http: bool) -> str:
    _refuse_userinfo(source, raw)
    base = raw.strip().rstrip("/").removesuffix(API_PREFIX).rstrip("/")
    try:
        parts = urllib.parse.urlsplit(base)
        url = http_url(base)
    except ValueError as exc:
        raise errors.ConfigError(f"{source}: {raw!r} is not an http(s) URL: {exc}") from None
    if parts.query or parts.fragment or not parts.path.isprintable() or " " in parts.path:
        raise errors.ConfigError(
            f"{source}: {raw!r} is not a base URL (a query, a fragment, or a space in its path)"
        )
    # A name ending in .localhost passes here; the connection checks the address it resolves to.
    if url.scheme == "http" and not _is_loopback(url.host) and not allow_insecure_http:
        raise errors.ConfigError(
            f"{source}: {base} is plain http to a non-loopback host, which would send the API key "
            "in clear text; use https, or set platform.allow_insecure_http = true"
        )
    return base


def load_credentials(
    config: PlatformConfig,
    environ: Mapping[str, str] = os.environ,
    home: Path | None = None,
) -> Credentials:
    """Find the key, API base, viewer base and team, as docs/PLATFORM_API.md orders them.

    Raises `AuthError` when no key is found (saying where it looked) and `ConfigError` for an
    unusable base URL.
    """
    prime_config, prime_note = _read_prime_config(Path.home() if home is None else home)
    key, key_source, warning = _find_key(config, environ, prime_config, prime_note)
    register_secret(key)
    _check_key(key, key_source)
    source, raw_base = _first(
        [
            ("$PRIME_API_BASE_URL", environ.get("PRIME_API_BASE_URL")),
            ("$PRIME_BASE_URL", environ.get("PRIME_BASE_URL")),
            ("platform.api_base_url", config.api_base_url),
            (f"base_url in {prime_note}", prime_config.get("base_url")),
        ]
    ) or ("default", DEFAULT_API_BASE)
    frontend_source, frontend = _first(
        [
            ("$PRIME_FRONTEND_URL", environ.get("PRIME_FRONTEND_URL")),
            ("platform.frontend_url", config.frontend_url),
            ("config.json", prime_config.get("frontend_url")),
        ]
    ) or ("default", DEFAULT_FRONTEND_URL)
    _refuse_userinfo(frontend_source, frontend)
    team = _first(
        [
            ("$PRIME_TEAM_ID", environ.get("PRIME_TEAM_ID")),
            ("platform.team_id", config.team_id),
            ("config.json", prime_config.get("team_id")),
        ]
    )
    return Credentials(
        api_key=key,
        api_base=_api_base(source, raw_base, config.allow_insecure_http),
        frontend_url=frontend.rstrip("/"),
        team_id=team[1] if team else None,
        key_source=key_source,
        warning=warning,
    )
