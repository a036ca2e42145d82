"""The platform stage: credentials and one synchronous client for the evaluations API.

What it promises:
- Credentials are found with the `prime` CLI's precedence (PLATFORM_API.md), plus a key file
  (`platform.api_key_file`, or systemd's `$CREDENTIALS_DIRECTORY/prime-api-key`). The key is
  registered with `evalpush.log` so no log line can carry it, and `Credentials` never shows it.
- Plain `http://` is refused unless the host is loopback or `platform.allow_insecure_http` is set.
- Every endpoint method makes exactly ONE attempt and raises the class `evalpush.errors` gives
  the outcome; retrying is `evalpush.retry`'s job. A 2xx whose body cannot be read is
  `Ambiguous` for the steps that must not be replayed (create, push samples, finalize) and
  `Transient` for the rest.
- One `PlatformClient` is safe to share between threads: httpx's connection pool is, and the
  credentials are swapped as one immutable object.
"""

from __future__ import annotations

import ipaddress
import os
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import httpx
import msgspec

from evalpush import __version__, errors
from evalpush.config import PlatformConfig
from evalpush.log import register_secret

__all__ = [
    "Credentials",
    "PlatformClient",
    "is_finalized",
    "load_credentials",
]

DEFAULT_API_BASE = "https://api.primeintellect.ai"
DEFAULT_FRONTEND_URL = "https://app.primeintellect.ai"
API_PREFIX = "/api/v1"
SYSTEMD_CREDENTIAL_NAME = "prime-api-key"
USER_AGENT = f"evalpush/{__version__}"
SAMPLES_PAGE_SIZE = 500
EVALUATIONS_PAGE_SIZE = 100
_FINALIZED_STATUSES = frozenset(
    {"COMPLETED", "COMPLETE", "FINALIZED", "DONE", "FINISHED", "SUCCEEDED"}
)
_ERROR_BODY_CHARS = 300


@dataclass(frozen=True)
class Credentials:
    """Where and as whom to talk to the platform. `repr` leaves the key out."""

    api_key: str = field(repr=False)
    api_base: str
    frontend_url: str
    team_id: str | None = None
    key_source: str = ""
    """Where the key was found (for `evalpush check`), e.g. `$PRIME_API_KEY`."""


def _text(value: Any) -> str | None:
    """A non-empty stripped string from a config value, else None."""
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        value = str(value).strip()
        return value or None
    return None


def _read_prime_config(home: Path) -> tuple[dict[str, Any], str]:
    """`~/.prime/config.json` (written by `prime login`) and a note on how it was found."""
    path = home / ".prime" / "config.json"
    try:
        data = msgspec.json.decode(path.read_bytes())
    except FileNotFoundError:
        return {}, f"{path} (no such file)"
    except (OSError, msgspec.DecodeError, RecursionError) as exc:
        # A broken file must not block a key given another way; it is named if no key is found.
        return {}, f"{path} (unreadable: {exc})"
    if not isinstance(data, dict):
        return {}, f"{path} (not a JSON object)"
    return data, str(path)


def _read_key_file(path: Path, name: str) -> str:
    try:
        key = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise errors.AuthError(
            f"{name}: cannot read the API key from {path}: {exc.strerror}"
        ) from None
    if not key:
        raise errors.AuthError(f"{name}: {path} is empty")
    return key


def _find_key(
    config: PlatformConfig,
    environ: Mapping[str, str],
    prime_config: dict[str, Any],
    prime_note: str,
) -> tuple[str, str]:
    """The API key and where it came from, first found wins."""
    key = _text(environ.get("PRIME_API_KEY"))
    if key:
        return key, "$PRIME_API_KEY"
    if config.api_key_file is not None:
        path = config.api_key_file.expanduser()
        return _read_key_file(path, "platform.api_key_file"), f"platform.api_key_file ({path})"
    looked = ["$PRIME_API_KEY", "platform.api_key_file (not set)"]
    credentials_dir = environ.get("CREDENTIALS_DIRECTORY")
    if credentials_dir:
        path = Path(credentials_dir) / SYSTEMD_CREDENTIAL_NAME
        if path.exists():
            return _read_key_file(path, "$CREDENTIALS_DIRECTORY"), f"systemd credential ({path})"
        looked.append(f"{path} (no such file)")
    else:
        looked.append(f"$CREDENTIALS_DIRECTORY/{SYSTEMD_CREDENTIAL_NAME} (not set)")
    key = _text(prime_config.get("api_key"))
    if key:
        return key, f"api_key in {prime_note}"
    looked.append(f"api_key in {prime_note}")
    raise errors.AuthError(
        "no API key found; looked in "
        + ", ".join(looked)
        + ". Set PRIME_API_KEY, platform.api_key_file, or run `prime login`."
    )


def _first(candidates: list[tuple[str, Any]]) -> tuple[str, str] | None:
    """The first (source, value) whose value is set."""
    for source, value in candidates:
        text = _text(value)
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


def _api_base(source: str, raw: str, allow_insecure_http: bool) -> str:
    base = raw.rstrip("/").removesuffix(API_PREFIX).rstrip("/")
    try:
        url = httpx.URL(base)
    except httpx.InvalidURL as exc:
        raise errors.ConfigError(f"{source}: {raw!r} is not a URL: {exc}") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise errors.ConfigError(f"{source}: {raw!r} is not an http(s) URL")
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
    """Find the key, API base, viewer base and team, as PLATFORM_API.md orders them.

    Raises `AuthError` when no key is found (saying where it looked) and `ConfigError` for an
    unusable base URL.
    """
    prime_config, prime_note = _read_prime_config(Path.home() if home is None else home)
    key, key_source = _find_key(config, environ, prime_config, prime_note)
    register_secret(key)
    source, raw_base = _first(
        [
            ("$PRIME_API_BASE_URL", environ.get("PRIME_API_BASE_URL")),
            ("$PRIME_BASE_URL", environ.get("PRIME_BASE_URL")),
            ("platform.api_base_url", config.api_base_url),
            (f"base_url in {prime_note}", prime_config.get("base_url")),
        ]
    ) or ("default", DEFAULT_API_BASE)
    _, frontend = _first(
        [
            ("$PRIME_FRONTEND_URL", environ.get("PRIME_FRONTEND_URL")),
            ("platform.frontend_url", config.frontend_url),
            ("config.json", prime_config.get("frontend_url")),
        ]
    ) or ("default", DEFAULT_FRONTEND_URL)
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
    )


def is_finalized(evaluation: Mapping[str, Any]) -> bool:
    """Whether an evaluation as read from the platform is finalized, whatever its spelling."""
    if isinstance(evaluation.get("data"), Mapping) and "status" not in evaluation:
        evaluation = evaluation["data"]
    if evaluation.get("finalized") is True or evaluation.get("is_finalized") is True:
        return True
    status = evaluation.get("status")
    return isinstance(status, str) and status.strip().upper() in _FINALIZED_STATUSES


def _first_id(data: Any, keys: tuple[str, ...]) -> str | None:
    """The id under the first of `keys` present, at the top level or under `data`."""
    for holder in (data, data.get("data") if isinstance(data, dict) else None):
        if isinstance(holder, dict):
            for key in keys:
                found = _text(holder.get(key))
                if found:
                    return found
    return None


def _viewer_url_in(data: Any) -> str | None:
    if isinstance(data, dict):
        return _text(data.get("viewer_url")) or _viewer_url_in(data.get("data"))
    return None


def _page_items(data: Any, keys: tuple[str, ...]) -> list[Any] | None:
    """The items of a page that is either a list or an object holding the list under a key."""
    if isinstance(data, list):
        return data
    if isinstance(data, dict):
        for key in keys:
            if isinstance(data.get(key), list):
                return data[key]
    return None


def _int(data: Any, *keys: str) -> int | None:
    if isinstance(data, dict):
        for key in keys:
            value = data.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    return None


def _is_last_page(data: Any, *, page: int | None, seen: int) -> bool:
    """Whether a page's own hints (has_more, total_pages, total) say nothing follows it.

    Without hints only an empty page ends the listing: a server may cap `limit` below what was
    asked, so a short page does not prove the end, and a missed sample id would be sent twice.
    """
    if isinstance(data, dict) and data.get("has_more") is False:
        return True
    total_pages = _int(data, "total_pages", "pages")
    if total_pages is not None and page is not None and page >= total_pages:
        return True
    total = _int(data, "total", "total_count", "count")
    return total is not None and seen >= total


class _SentOnce(httpx.SyncByteStream):
    """A request body that lets go of its bytes once they are sent.

    httpcore's per-request objects form reference cycles, so a sent request lives on until the
    cyclic garbage collector runs; a body held that long (up to 25 MiB a batch) made a long
    upload's memory climb batch after batch.
    """

    def __init__(self, body: bytes):
        self._body = body

    def __iter__(self) -> Iterator[bytes]:
        body, self._body = self._body, b""
        yield body


class PlatformClient:
    """One attempt per call to each endpoint of PLATFORM_API.md, errors already classified."""

    def __init__(
        self,
        config: PlatformConfig,
        *,
        environ: Mapping[str, str] | None = None,
        home: Path | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._config = config
        self._environ = os.environ if environ is None else environ
        self._home = home
        self._credentials = load_credentials(config, self._environ, home)
        self._reload_lock = threading.Lock()
        self._http = httpx.Client(
            transport=transport,
            headers={"User-Agent": USER_AGENT},
            timeout=httpx.Timeout(
                connect=config.connect_timeout_seconds,
                read=config.read_timeout_seconds,
                write=config.read_timeout_seconds,
                pool=config.connect_timeout_seconds,
            ),
            follow_redirects=False,
            verify=True,
        )

    @property
    def credentials(self) -> Credentials:
        return self._credentials

    def reload_credentials(self) -> bool:
        """Read the credentials again (SIGHUP, each probe); True if the key or the base changed.

        Raises like `load_credentials`; the credentials in use stay as they were then.
        """
        with self._reload_lock:
            new = load_credentials(self._config, self._environ, self._home)
            old, self._credentials = self._credentials, new
        return (new.api_key, new.api_base) != (old.api_key, old.api_base)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def viewer_url(self, evaluation_id: str) -> str:
        return f"{self._credentials.frontend_url}/dashboard/evaluations/{evaluation_id}"

    # -- the exchange: one attempt, classified --------------------------------------------

    def _send(
        self,
        method: str,
        path: str,
        *,
        what: str,
        body: bytes | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> httpx.Response:
        credentials = self._credentials  # one snapshot, even if another thread reloads
        headers = {"Authorization": f"Bearer {credentials.api_key}"}
        request = self._http.build_request(
            method, f"{credentials.api_base}{API_PREFIX}{path}", params=params, headers=headers
        )
        if body is not None:
            request.headers["Content-Type"] = "application/json"
            request.headers["Content-Length"] = str(len(body))
            request.stream = _SentOnce(body)
        try:
            response = self._http.send(request)
        except httpx.TransportError as exc:
            raise errors.from_transport_error(exc, what=what) from exc
        if response.is_success:
            return response
        raise errors.from_status(
            response.status_code,
            what=what,
            retry_after=response.headers.get("Retry-After"),
            body=response.text[:_ERROR_BODY_CHARS],
        )

    @staticmethod
    def _decode(response: httpx.Response, *, what: str, replayable: bool) -> Any:
        try:
            return msgspec.json.decode(response.content)
        except (msgspec.DecodeError, RecursionError):  # RecursionError: nested too deeply
            raise PlatformClient._unexpected(response, what=what, replayable=replayable) from None

    @staticmethod
    def _unexpected(
        response: httpx.Response,
        *,
        what: str,
        replayable: bool,
        why: str = "a body that is not JSON",
    ) -> errors.Transient:
        """A 2xx we cannot read: the work may be done, so a non-replayable step is ambiguous."""
        cls = errors.Transient if replayable else errors.Ambiguous
        snippet = response.content[:120].decode("utf-8", "replace")
        return cls(
            f"{what}: HTTP {response.status_code} with {why}: {snippet!r}",
            status=response.status_code,
        )

    def _get_json(self, path: str, *, what: str, params: Mapping[str, Any] | None = None) -> Any:
        return self._decode(
            self._send("GET", path, what=what, params=params), what=what, replayable=True
        )

    # -- the endpoints ----------------------------------------------------------------------

    def _with_team(self, body: dict[str, Any]) -> dict[str, Any]:
        team_id = self._credentials.team_id
        return {**body, "team_id": team_id} if team_id and "team_id" not in body else body

    def resolve_environment(self, name: str) -> str:
        """The environment's id, created on the platform if new (get-or-create: replayable)."""
        what = f"resolve environment {name!r}"
        body = msgspec.json.encode(self._with_team({"name": name}))
        response = self._send("POST", "/environmentshub/resolve", what=what, body=body)
        env_id = _first_id(self._decode(response, what=what, replayable=True), ("id",))
        if env_id is None:
            raise self._unexpected(response, what=what, replayable=True, why="no environment id")
        return env_id

    def create_evaluation(self, body: dict[str, Any]) -> tuple[str, str | None]:
        """Create an evaluation; its id and viewer URL (if the platform gave one). NOT replayable."""
        what = "create evaluation"
        response = self._send(
            "POST", "/evaluations/", what=what, body=msgspec.json.encode(self._with_team(body))
        )
        data = self._decode(response, what=what, replayable=False)
        evaluation_id = _first_id(data, ("evaluation_id", "id"))
        if evaluation_id is None:
            raise self._unexpected(response, what=what, replayable=False, why="no evaluation id")
        return evaluation_id, _viewer_url_in(data)

    def push_samples(self, evaluation_id: str, body: bytes) -> None:
        """Append one encoded `{"samples": [...]}` batch. NOT replayable."""
        what = f"push samples to {evaluation_id}"
        response = self._send("POST", f"/evaluations/{evaluation_id}/samples", what=what, body=body)
        if response.content.strip():
            self._decode(response, what=what, replayable=False)

    def finalize(self, evaluation_id: str, metrics: dict[str, Any]) -> str | None:
        """Finalize with the run's metrics; the viewer URL if given. NOT replayable."""
        what = f"finalize {evaluation_id}"
        body = msgspec.json.encode({"metrics": metrics})
        response = self._send(
            "POST", f"/evaluations/{evaluation_id}/finalize", what=what, body=body
        )
        if not response.content.strip():
            return None
        return _viewer_url_in(self._decode(response, what=what, replayable=False))

    def get_evaluation(self, evaluation_id: str) -> dict[str, Any]:
        what = f"read evaluation {evaluation_id}"
        response = self._send("GET", f"/evaluations/{evaluation_id}", what=what)
        data = self._decode(response, what=what, replayable=True)
        if isinstance(data, dict) and isinstance(data.get("data"), dict) and "status" not in data:
            data = data["data"]
        if not isinstance(data, dict):
            raise self._unexpected(response, what=what, replayable=True, why="no evaluation object")
        return data

    def iter_sample_ids(
        self, evaluation_id: str, page_size: int = SAMPLES_PAGE_SIZE
    ) -> Iterator[str]:
        """Every stored sample id (as a string, duplicates included), page by page."""
        what = f"list samples of {evaluation_id}"
        page, seen = 1, 0
        while True:
            data = self._get_json(
                f"/evaluations/{evaluation_id}/samples",
                what=what,
                params={"page": page, "limit": page_size},
            )
            items = _page_items(data, ("samples", "data", "items"))
            if items is None:
                raise errors.Transient(f"{what}: page {page} holds no list of samples")
            for item in items:
                sample_id = _text(item.get("sample_id")) if isinstance(item, dict) else None
                if sample_id is None:
                    raise errors.Transient(f"{what}: page {page} has a sample without sample_id")
                yield sample_id
            seen += len(items)
            if not items or _is_last_page(data, page=page, seen=seen):
                return
            page += 1

    def iter_evaluations(
        self, environment_name: str, page_size: int = EVALUATIONS_PAGE_SIZE
    ) -> Iterator[dict[str, Any]]:
        """Every evaluation of an environment (each with its `metadata`), skip/limit paged."""
        what = f"list evaluations of {environment_name!r}"
        skip = 0
        while True:
            params = {"environment_name": environment_name, "skip": skip, "limit": page_size}
            data = self._get_json("/evaluations/", what=what, params=params)
            items = _page_items(data, ("evaluations", "data", "items"))
            if items is None or not all(isinstance(item, dict) for item in items):
                raise errors.Transient(
                    f"{what}: the page at skip={skip} holds no list of evaluations"
                )
            yield from items
            # Advance by what came back, not by what was asked: the server may cap `limit`.
            skip += len(items)
            if not items or _is_last_page(data, page=None, seen=skip):
                return

    def close_out(
        self,
        evaluation_id: str,
        status: str,
        error_message: str | None = None,
        metadata: dict[str, Any] | None = None,
        metrics: dict[str, Any] | None = None,
    ) -> None:
        """Mark an evaluation FAILED or CANCELLED (409 `Conflict` when already closed)."""
        body: dict[str, Any] = {"status": status}
        for key, value in (
            ("error_message", error_message),
            ("metadata", metadata),
            ("metrics", metrics),
        ):
            if value is not None:
                body[key] = value
        what = f"close out {evaluation_id} as {status}"
        self._send(
            "PUT", f"/evaluations/{evaluation_id}", what=what, body=msgspec.json.encode(body)
        )

    def probe(self) -> None:
        """A cheap authenticated read: returns if the platform answers and accepts the key."""
        self._send("GET", "/evaluations/", what="probe the platform", params={"limit": 1})
