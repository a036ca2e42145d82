"""The platform client's HTTP: an `httpx.Client` over httpcore pools whose sockets wait in slices,
all through the libraries' public interfaces.

What it promises:
- HTTP itself (framing, chunked, keep-alive, proxies, TLS, IDNA) is httpx's, httpcore's and
  h11's. What is added is a network backend (httpcore's `NetworkBackend` / `NetworkStream`):
  every blocking step (DNS lookup, TCP connect, TLS handshake, each read and write) waits in
  slices of at most `SLICE_SECONDS`, and between slices checks the client's stop event and the
  deadline of the request in progress (`request_deadline`). httpx's timeouts are per phase and
  per socket read, so without this a body trickling a byte a second would never end.
- A stop raises the step's error with "stop requested"; a passed deadline its timeout ("the
  request's overall deadline passed"); `SlicedTransport` hands them on as httpx's exceptions,
  which `evalpush.core.errors.from_transport_error` classifies.
- Proxies as `urllib.request.getproxies()` reads them (`HTTPS_PROXY`, `ALL_PROXY`, `NO_PROXY`),
  for https only: a plain `http://` URL is never proxied, so the key never reaches a proxy in
  clear text. A socks proxy (curl's and git's) is not for us: direct. TLS inside TLS (an https
  proxy before an https platform) is refused (`UnsupportedProtocol`).
- Plain http goes only to a loopback address unless insecure http is allowed: judged by the
  address connected to, not by the name.
- TLS is verified with httpx's CA bundle (`SSL_CERT_FILE`, `SSL_CERT_DIR`, else certifi's).
- No connection is reused: each request gets one of its own, closed after its answer, so a late
  or repeated answer can never be taken for a later request's.

Socket timeouts make the slices rather than `select`: a TLS socket may hold decrypted bytes that
`select` does not see; a timed-out TLS read or write is resumed by calling it again.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import ipaddress
import os
import select
import socket
import ssl
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.request import getproxies, proxy_bypass_environment

import httpcore
import httpx

__all__ = [
    "SLICE_SECONDS",
    "SlicedBackend",
    "SlicedStream",
    "SlicedTransport",
    "make_client",
    "request_deadline",
]

SLICE_SECONDS = 0.2
"""The longest a socket wait lasts before the stop event and the deadline are looked at again."""

WRITE_CHUNK_BYTES = 256 * 1024
"""A write hands the socket at most this much at a time, so a slow reader cannot hold one call."""

_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "evalpush_request_deadline", default=None
)


@contextlib.contextmanager
def request_deadline(seconds: float) -> Iterator[None]:
    """Every socket wait in this thread, inside the block, ends `seconds` from now at the latest
    (or at an enclosing block's deadline, if that comes first)."""
    at = time.monotonic() + seconds
    outer = _deadline.get()
    token = _deadline.set(at if outer is None else min(at, outer))
    try:
        yield
    finally:
        _deadline.reset(token)


class _Limit:
    """When one socket operation must give up: its own timeout, the request's deadline, a stop."""

    __slots__ = ("_deadline_at", "_stop", "_timeout_at")

    def __init__(self, timeout: float | None, stop: threading.Event) -> None:
        self._stop = stop
        self._timeout_at = None if timeout is None else time.monotonic() + timeout
        self._deadline_at = _deadline.get()

    def check(self, timed_out: type[Exception], stopped: type[Exception]) -> None:
        """Raise `stopped` on a stop request, `timed_out` past the timeout or the deadline."""
        if self._stop.is_set():
            raise stopped("stop requested")
        now = time.monotonic()
        if self._deadline_at is not None and now >= self._deadline_at:
            raise timed_out("the request's overall deadline passed")
        if self._timeout_at is not None and now >= self._timeout_at:
            raise timed_out("timed out")


def _poll(sock: socket.socket, events: int, seconds: float) -> bool:
    """Whether `sock` is ready for `events` within `seconds` (poll: no 1024-descriptor limit)."""
    poller = select.poll()
    poller.register(sock, events)
    return bool(poller.poll(seconds * 1000))


class SlicedStream(httpcore.NetworkStream):
    """One connection's socket (plain or TLS), every wait cut into slices."""

    def __init__(self, sock: socket.socket, stop: threading.Event) -> None:
        sock.settimeout(SLICE_SECONDS)
        self._sock = sock
        self._stop = stop

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        limit = _Limit(timeout, self._stop)
        while True:
            limit.check(httpcore.ReadTimeout, httpcore.ReadError)
            try:
                data = self._sock.recv(max_bytes)
            except TimeoutError:
                continue  # a slice passed: look at the stop event and the deadline again
            except OSError as exc:
                raise httpcore.ReadError(str(exc)) from exc
            return data

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        limit = _Limit(timeout, self._stop)
        view = memoryview(buffer)
        while view:
            limit.check(httpcore.WriteTimeout, httpcore.WriteError)
            try:
                # A timed-out TLS write must be retried with the same bytes: they are.
                view = view[self._sock.send(view[:WRITE_CHUNK_BYTES]) :]
            except TimeoutError:
                continue
            except OSError as exc:
                raise httpcore.WriteError(str(exc)) from exc

    def close(self) -> None:
        self._sock.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> SlicedStream:
        if isinstance(self._sock, ssl.SSLSocket):
            self.close()
            raise httpcore.UnsupportedProtocol(
                "TLS inside TLS (an https proxy in front of an https platform) is not supported"
            )
        limit = _Limit(timeout, self._stop)
        try:
            tls = ssl_context.wrap_socket(
                self._sock, server_hostname=server_hostname, do_handshake_on_connect=False
            )
        except OSError as exc:
            self.close()
            raise httpcore.ConnectError(str(exc)) from exc
        while True:
            try:
                limit.check(httpcore.ConnectTimeout, httpcore.ConnectError)
                tls.do_handshake()
                return SlicedStream(tls, self._stop)
            except TimeoutError:
                continue  # the handshake resumes where it stopped
            except OSError as exc:
                tls.close()
                raise httpcore.ConnectError(str(exc)) from exc
            except BaseException:
                tls.close()
                raise

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":  # asked of an idle connection: closed or spoken out of turn
            if self._sock.fileno() < 0:
                return True
            pending = getattr(self._sock, "pending", None)  # TLS: bytes already decrypted
            return bool(pending and pending()) or _poll(self._sock, select.POLLIN, 0)
        if info == "ssl_object":
            # An SSLSocket has the SSLObject methods httpcore asks for (`selected_alpn_protocol`).
            return self._sock if isinstance(self._sock, ssl.SSLSocket) else None
        return None


_IN_PROGRESS = {errno.EINPROGRESS, errno.EALREADY, errno.EWOULDBLOCK, errno.EINTR}


def _resolve(host: str, port: int, limit: _Limit) -> list[Any]:
    """The addresses to try; a name is looked up aside, so a stop need not wait for DNS."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:  # a literal address: nothing to wait for
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    found: dict[str, Any] = {}
    done = threading.Event()

    def look_up() -> None:
        try:
            found["addresses"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            found["error"] = exc
        finally:
            done.set()

    # A daemon thread: a lookup stuck in the resolver is left behind, not waited for.
    threading.Thread(target=look_up, name="evalpush-dns", daemon=True).start()
    while not done.wait(SLICE_SECONDS):
        limit.check(httpcore.ConnectTimeout, httpcore.ConnectError)
    if "error" in found:
        raise httpcore.ConnectError(f"{host}: {found['error']}")
    return found["addresses"]


def _connect(sock: socket.socket, address: Any, limit: _Limit) -> None:
    sock.setblocking(False)
    error = sock.connect_ex(address)
    while error in _IN_PROGRESS:
        limit.check(httpcore.ConnectTimeout, httpcore.ConnectError)
        if _poll(sock, select.POLLOUT, SLICE_SECONDS):
            error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if error:
        raise OSError(error, os.strerror(error))


class SlicedBackend(httpcore.NetworkBackend):
    """Connections whose every wait is sliced. `loopback_only`: a name that resolves to no
    loopback address is not connected to (plain http, where the key would go in clear text)."""

    def __init__(self, stop: threading.Event, *, loopback_only: bool = False) -> None:
        self._stop = stop
        self._loopback_only = loopback_only

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> SlicedStream:
        limit = _Limit(timeout, self._stop)
        failures: list[str] = []
        try:
            addresses = _resolve(host, port, limit)
        except OSError as exc:
            raise httpcore.ConnectError(f"{host}: {exc}") from None
        for family, kind, proto, _, address in addresses:
            if self._loopback_only and not ipaddress.ip_address(address[0]).is_loopback:
                failures.append(f"{address[0]} is not a loopback address")
                continue
            try:  # EMFILE, or EAFNOSUPPORT for an IPv6 address on a host without IPv6
                sock = socket.socket(family, kind, proto)
            except OSError as exc:
                failures.append(str(exc))
                continue
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                _connect(sock, address, limit)
            except OSError as exc:
                sock.close()
                failures.append(str(exc))
                continue
            except BaseException:
                sock.close()
                raise
            return SlicedStream(sock, self._stop)
        if self._loopback_only and failures and all("loopback" in f for f in failures):
            raise httpcore.UnsupportedProtocol(
                f"plain http to {host}, which resolves to no loopback address "
                f"({', '.join(failures)}): the API key would go in clear text; use https, "
                "or set platform.allow_insecure_http = true"
            )
        raise httpcore.ConnectError(failures[-1] if failures else f"{host}: no address")

    def sleep(self, seconds: float) -> None:
        self._stop.wait(seconds)


_ERRORS: dict[type[Exception], type[httpx.TransportError]] = {
    getattr(httpcore, name): getattr(httpx, name)
    for name in (
        "TimeoutException ConnectTimeout ReadTimeout WriteTimeout PoolTimeout NetworkError "
        "ConnectError ReadError WriteError ProxyError UnsupportedProtocol ProtocolError "
        "LocalProtocolError RemoteProtocolError"
    ).split()
}
"""httpcore's exceptions and httpx's of the same names (httpx's own transport maps them so)."""


@contextlib.contextmanager
def _as_httpx_errors() -> Iterator[None]:
    try:
        yield
    except tuple(_ERRORS) as exc:
        mapped = next(_ERRORS[c] for c in type(exc).__mro__ if c in _ERRORS)  # the closest
        raise mapped(str(exc)) from exc


class _Body(httpx.SyncByteStream):
    """An httpcore answer's body, read as httpx reads a body."""

    def __init__(self, answer: httpcore.Response) -> None:
        self._answer = answer

    def __iter__(self) -> Iterator[bytes]:
        with _as_httpx_errors():
            yield from self._answer.iter_stream()

    def close(self) -> None:
        with _as_httpx_errors():
            self._answer.close()


class SlicedTransport(httpx.BaseTransport):
    """httpx's requests over httpcore pools of sliced connections: `direct`, or `proxied` for a
    host that `proxies` (`urllib.request.getproxies()`, read once) do not exempt."""

    def __init__(
        self,
        direct: httpcore.ConnectionPool,
        proxied: httpcore.HTTPProxy | None = None,
        proxies: dict[str, str] | None = None,
    ) -> None:
        self._direct = direct
        self._proxied = proxied
        self._proxies = proxies or {}

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        pool = self._direct
        if self._proxied is not None and not proxy_bypass_environment(
            url.netloc.decode(), self._proxies
        ):
            pool = self._proxied
        target = httpcore.URL(
            scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path
        )
        with _as_httpx_errors():
            answer = pool.handle_request(
                httpcore.Request(
                    request.method,
                    target,
                    headers=request.headers.raw,
                    content=request.stream,
                    extensions=request.extensions,
                )
            )
        return httpx.Response(
            answer.status,
            headers=answer.headers,
            stream=_Body(answer),
            extensions=answer.extensions,
        )

    def close(self) -> None:
        self._direct.close()
        if self._proxied is not None:
            self._proxied.close()


POOL_LIMITS: dict[str, Any] = {"max_connections": 100, "max_keepalive_connections": 0}
"""No idle connection is kept: a connection carries one exchange."""


def _sliced_transport(stop: threading.Event, scheme: str, loopback_only: bool) -> SlicedTransport:
    """Plain http: direct, at a loopback address only if `loopback_only`. https: direct, or
    through the http(s) proxy the environment names (`HTTPS_PROXY`, else `ALL_PROXY`; a socks
    one is for curl and git)."""
    if scheme != "https":
        backend = SlicedBackend(stop, loopback_only=loopback_only)
        return SlicedTransport(httpcore.ConnectionPool(network_backend=backend, **POOL_LIMITS))
    backend = SlicedBackend(stop)
    context = httpx.create_ssl_context(trust_env=True)
    direct = httpcore.ConnectionPool(ssl_context=context, network_backend=backend, **POOL_LIMITS)
    proxies = getproxies()
    named = proxies.get("https") or proxies.get("all")
    if not named:
        return SlicedTransport(direct)
    url = httpx.URL(named if "://" in named else f"http://{named}")
    if url.scheme not in ("http", "https"):
        return SlicedTransport(direct)
    proxy = httpx.Proxy(url)  # its credentials taken out of the URL
    proxied = httpcore.HTTPProxy(
        proxy_url=httpcore.URL(
            scheme=proxy.url.raw_scheme,
            host=proxy.url.raw_host,
            port=proxy.url.port,
            target=proxy.url.raw_path,
        ),
        proxy_auth=proxy.raw_auth,
        proxy_headers=proxy.headers.raw,
        ssl_context=context,
        network_backend=backend,
        **POOL_LIMITS,
    )
    return SlicedTransport(direct, proxied, proxies)


def make_client(
    stop: threading.Event,
    *,
    scheme: str,
    timeout: httpx.Timeout,
    headers: dict[str, str],
    allow_insecure_http: bool,
    transport: httpx.BaseTransport | None = None,
) -> httpx.Client:
    """The client for a platform reached by `scheme`: redirects off, every wait sliced. An
    https platform is reached through the proxies the environment names; a plain-http one
    never is, and only at a loopback address unless `allow_insecure_http`. `transport`
    replaces the network (tests: canned answers)."""
    if transport is None:
        transport = _sliced_transport(stop, scheme, loopback_only=not allow_insecure_http)
    return httpx.Client(
        transport=transport, timeout=timeout, headers=headers, follow_redirects=False
    )
