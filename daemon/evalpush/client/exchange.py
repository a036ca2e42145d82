"""The platform client's exchange: one request and its answer, classified, over the
credentials in use.

`Exchange.send` makes one attempt: the stop event looked at first, the credentials read as one
snapshot (another thread may reload them), the body handed to httpx once, the request bounded
by `platform.request_deadline_seconds` and cut off by the stop event (`evalpush.client.wire`),
a non-2xx answer turned into the failure it stands for (`errors.from_status`), a 2xx answer read
under its byte cap. The observer, if any, hears how every attempt ended. What a 2xx says is
read by `evalpush.client.answers`.
"""

from __future__ import annotations

import os
import threading
import time
import urllib.parse
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

import httpx
import msgspec

from evalpush import __version__
from evalpush.client.credentials import API_PREFIX, Credentials, load_credentials
from evalpush.client.wire import make_client, request_deadline
from evalpush.config import PlatformConfig
from evalpush.core import errors
from evalpush.log import scrub

USER_AGENT = f"evalpush/{__version__}"
MIB = 1024 * 1024
ERROR_BODY_BYTES = 4096
"""Of an error answer's body only this much is read (the message quotes its start)."""
_ERROR_BODY_CHARS = 300
MAX_ANSWER_BYTES = 1 * MIB
"""A JSON answer (an id, an evaluation, an acknowledgement) is small; past this it is malformed."""


def _handed_once(body: bytes) -> Iterator[bytes]:
    """`body` for httpx as a stream that lets go of it once sent: httpx's request and answer
    objects form reference cycles, which would hold each (up to 25 MiB) body until a full
    garbage collection."""
    yield body


class Answer(msgspec.Struct, frozen=True):
    """A 2xx answer, its body read whole under its cap."""

    status: int
    body: bytes | bytearray


class TooLarge(errors.Transient):
    """A read's answer ran past its byte cap (a listing shrinks its page and asks again)."""


class Undecodable(Exception):
    """An answer's body in a content coding the client did not ask for, or not valid in the
    one it names."""


_CODINGS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
"""The content codings asked for (`Accept-Encoding: gzip, deflate`), as zlib's window bits."""


def _decoded(response: httpx.Response, limit: int) -> Iterator[bytes]:
    """The body's bytes as its `Content-Encoding` says, decoded here in bounded steps: never
    more than `limit` + 1 bytes in all, however much they inflate (httpx's own decoder
    inflates a whole network read at once: 64 KiB of a compression bomb is 64 MiB, and a
    stacked `gzip, gzip` is unbounded). One coding asked for (gzip, deflate) or none; anything
    else (stacked codings, br, zstd...) is `Undecodable`: the client never asked for it."""
    if response.is_stream_consumed:  # made whole in this process (a test's canned answer)
        yield response.content[: limit + 1]
        return
    codings = [
        c.strip().lower()
        for c in response.headers.get("Content-Encoding", "").split(",")
        if c.strip().lower() not in ("", "identity")
    ]
    if not codings:
        yield from response.iter_raw()
        return
    if len(codings) > 1 or codings[0] not in _CODINGS:
        raise Undecodable(
            f"a body in content coding {', '.join(codings)!r}, which was not asked for "
            f"(Accept-Encoding: {_DEFAULT_HEADERS['Accept-Encoding']})"
        )
    coding = codings[0]
    decoder = zlib.decompressobj(_CODINGS[coding])
    first = coding == "deflate"  # deflate is sent with its zlib wrapper, or raw: httpx's rule
    budget = limit + 1
    for data in response.iter_raw():
        while data and budget > 0 and not decoder.eof:
            try:
                out = decoder.decompress(data, budget)
            except zlib.error as exc:
                if not first:
                    raise Undecodable(f"a body that is not valid {coding}: {exc}") from None
                decoder = zlib.decompressobj(-zlib.MAX_WBITS)
                first = False
                continue
            first = False
            budget -= len(out)
            data = decoder.unconsumed_tail
            if out:
                yield out
        if budget <= 0 or decoder.eof:
            return


def _read_capped(response: httpx.Response, cap: int) -> bytearray | None:
    """The body, read as a stream and decoded in bounded steps (`_decoded`); None as soon as it
    runs past `cap` bytes. `Undecodable` if its coding was not asked for or is broken."""
    declared = response.headers.get("Content-Length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > cap:  # not "\xb2"
        return None
    body = bytearray()
    for chunk in _decoded(response, cap):
        body += chunk
        if len(body) > cap:
            return None
    return body


def _read_start(response: httpx.Response) -> str:
    """The start of an error answer's body, as text; the rest is never read (nor inflated).
    A body that cannot be read (cut short, an encoding not asked for) is said so: the status
    stands, whatever its body (a 401 read as a broken exchange would be retried, not paused
    on)."""
    body = bytearray()
    unreadable = ""
    try:
        for chunk in _decoded(response, ERROR_BODY_BYTES):
            body += chunk
            if len(body) >= ERROR_BODY_BYTES:
                break
    except httpx.RequestError as exc:
        unreadable = f" [the rest of the body could not be read: {exc}]"
    except Undecodable as exc:
        unreadable = f" [the body could not be read: {exc}]"
    text = body[:ERROR_BODY_BYTES].decode("utf-8", "replace")[:_ERROR_BODY_CHARS]
    return text + unreadable


_DEFAULT_HEADERS = {
    "Accept": "*/*",
    "Accept-Encoding": "gzip, deflate",
    "Connection": "close",  # a connection of its own, closed after the answer (`platform` says why)
    "User-Agent": USER_AGENT,
}
"""What every request carries, the key aside."""


class _Target(msgspec.Struct, frozen=True):
    """Where the requests made with one credentials snapshot go, and the key they carry: the
    base URL taken apart once, not once per request."""

    credentials: Credentials
    scheme: str
    prefix: str  # the base URL and the API prefix: a request's URL starts so
    headers: dict[str, str]

    @classmethod
    def of(cls, credentials: Credentials) -> _Target:
        base = urllib.parse.urlsplit(credentials.api_base)  # checked when loaded
        path = urllib.parse.quote(base.path, safe="/%:@!$&'()*+,;=~").rstrip("/")
        return cls(
            credentials,
            base.scheme,
            f"{base.scheme}://{base.netloc}{path}{API_PREFIX}",
            {"Authorization": f"Bearer {credentials.api_key}"},
        )


class RequestObserver(Protocol):
    """Told of every attempt the client makes, once it has ended: its endpoint (the public
    method's name), what it raised (None: it worked) and how long it took (the daemon's metrics
    listen; a push has no observer)."""

    def request_done(self, endpoint: str, error: BaseException | None, seconds: float) -> None: ...


class Exchange:
    """One attempt per call, over the credentials in use and one httpx client per scheme."""

    def __init__(
        self,
        config: PlatformConfig,
        *,
        environ: Mapping[str, str] | None = None,
        home: Path | None = None,
        transport: httpx.BaseTransport | None = None,
        stop: threading.Event | None = None,
        observer: RequestObserver | None = None,
    ) -> None:
        """`stop`: once set, a request in flight is cut off within `wire.SLICE_SECONDS`
        and raises `Interrupted` (the service's stop event; by default one never set).
        `transport` replaces the network (tests feed canned answers through it).
        `observer` is told of every attempt once it ended: its endpoint (the public method's
        name, a `metrics.Endpoint` value), what it raised (None: it worked), and how long it
        took (the daemon's metrics)."""
        self._config = config
        self._observer = observer
        self._environ = os.environ if environ is None else environ
        self._home = home
        self._stop = threading.Event() if stop is None else stop
        self._credentials: Credentials | None = None  # read at first use: see `credentials`
        self._reload_lock = threading.Lock()
        self._transport = transport
        self._timeout = httpx.Timeout(
            connect=config.connect_timeout_seconds,
            read=config.read_timeout_seconds,
            write=config.read_timeout_seconds,
            pool=config.connect_timeout_seconds,
        )
        self._clients: dict[tuple[str, bool], httpx.Client] = {}  # see `_client`
        self._clients_lock = threading.Lock()
        self._target: _Target | None = None  # built from one credentials snapshot: `_target_for`

    @property
    def credentials(self) -> Credentials:
        """The credentials in use, read at first use: a client can be built before a key
        exists. Raises like `load_credentials` while none could be read."""
        credentials = self._credentials
        if credentials is None:
            with self._reload_lock:
                if self._credentials is None:
                    self._credentials = load_credentials(self._config, self._environ, self._home)
                credentials = self._credentials
        return credentials

    def reload_credentials(self) -> bool:
        """Read the credentials again (SIGHUP, each probe); True if the key or the base changed
        (or none had been read before).

        Raises like `load_credentials`; the credentials in use stay as they were then.
        """
        with self._reload_lock:
            new = load_credentials(self._config, self._environ, self._home)
            old, self._credentials = self._credentials, new
        return old is None or (new.api_key, new.api_base) != (old.api_key, old.api_base)

    def close(self) -> None:
        with self._clients_lock:
            clients, self._clients = self._clients, {}
        for client in clients.values():
            client.close()

    def _client(self, scheme: str) -> httpx.Client:
        """The httpx client for a platform reached by `scheme`, built at its first use."""
        key = scheme
        client = self._clients.get(key)
        if client is None:
            with self._clients_lock:
                client = self._clients.get(key)
                if client is None:
                    client = self._clients[key] = make_client(
                        self._stop,
                        scheme=scheme,
                        timeout=self._timeout,
                        headers=_DEFAULT_HEADERS,
                        allow_insecure_http=self._config.allow_insecure_http,
                        transport=self._transport,
                    )
        return client

    def _target_for(self, credentials: Credentials) -> _Target:
        """Where requests go and the headers every one carries, built once per snapshot."""
        target = self._target
        if target is None or target.credentials is not credentials:
            target = self._target = _Target.of(credentials)
        return target

    def send(
        self,
        method: str,
        path: str,
        *,
        endpoint: str,
        what: str,
        replayable: bool,
        body: bytes | None = None,
        params: Mapping[str, Any] | None = None,
        cap: int = MAX_ANSWER_BYTES,
    ) -> Answer:
        """One request; its 2xx answer read under `cap` bytes, or the error it stands for. The
        observer, if any, hears how it ended."""
        if self._observer is None:
            return self._attempt(method, path, what, replayable, body, params, cap)
        started = time.monotonic()
        try:
            answer = self._attempt(method, path, what, replayable, body, params, cap)
        except BaseException as exc:
            self._observer.request_done(endpoint, exc, time.monotonic() - started)
            raise
        self._observer.request_done(endpoint, None, time.monotonic() - started)
        return answer

    def _attempt(
        self,
        method: str,
        path: str,
        what: str,
        replayable: bool,
        body: bytes | None,
        params: Mapping[str, Any] | None,
        cap: int,
    ) -> Answer:
        if self._stop.is_set():
            raise errors.Interrupted(f"{what}: stop requested; not sent")
        target = self._target_for(self.credentials)  # one snapshot, even if another thread reloads
        client = self._client(target.scheme)
        headers = target.headers
        content = None
        if body is not None:
            headers = {
                **headers,
                "Content-Type": "application/json",
                "Content-Length": str(len(body)),
            }
            content = _handed_once(body)
        with request_deadline(self._config.request_deadline_seconds):
            try:
                with client.stream(
                    method, target.prefix + path, params=params, content=content, headers=headers
                ) as response:
                    if not response.is_success:
                        raise errors.from_status(
                            response.status_code,
                            what=what,
                            replayable=replayable,
                            retry_after=response.headers.get("Retry-After"),
                            body=_read_start(response),
                        )
                    try:
                        content = _read_capped(response, cap)
                    except Undecodable as exc:
                        raise (errors.Transient if replayable else errors.Ambiguous)(
                            scrub(f"{what}: HTTP {response.status_code} with {exc}"),
                            status=response.status_code,
                            unusable=True,
                        ) from None
            except httpx.RequestError as exc:
                if self._stop.is_set():
                    raise errors.Interrupted(
                        f"{what}: stop requested; the request was cut off, its outcome unknown"
                    ) from exc
                raise errors.from_transport_error(exc, what=what) from exc
            except httpx.InvalidURL as exc:
                raise errors.Unsendable(scrub(f"{what}: cannot build the request: {exc}")) from None
        if content is None:
            cls = TooLarge if replayable else errors.Ambiguous
            raise cls(
                f"{what}: HTTP {response.status_code} with a body over {cap} bytes",
                status=response.status_code,
            )
        return Answer(response.status_code, content)
