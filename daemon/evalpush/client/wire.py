"""The platform client's HTTP: an `httpx.Client` over httpcore pools whose sockets wait in slices.

What it promises:
- HTTP itself (framing, chunked, gzip, keep-alive, proxies, TLS, IDNA) is httpx's, httpcore's
  and h11's. What is added is the network backend (httpcore's public `NetworkBackend` and
  `NetworkStream`): every blocking step of an exchange (DNS lookup, TCP connect, TLS
  handshake, each read and each write) waits in slices of at most `SLICE_SECONDS`, and between
  slices checks the stop event the client was built with and the deadline of the request in
  progress (`request_deadline`, set per thread by the platform client). httpx's timeouts are
  per phase and per socket read, so without this a body trickling one byte a second would never
  end, and nothing in httpx or httpcore watches an event.
- A stop raises the step's error with "stop requested"; a passed deadline its timeout
  ("the request's overall deadline passed"). httpx maps them to its own exceptions, which
  `evalpush.core.errors.from_transport_error` classifies.
- Proxies are taken from the environment as httpx takes them (`HTTPS_PROXY`, `ALL_PROXY`,
  `NO_PROXY`, ...), with one rule on top: a plain `http://` URL is never proxied, so the key
  never reaches a proxy in clear text. A socks proxy (curl's and git's, in `ALL_PROXY`) is not
  for us: direct. TLS inside TLS (an https proxy before an https platform) is refused
  (`UnsupportedProtocol`).
- A plain-http connection goes only to a loopback address unless insecure http is allowed:
  judged by the address connected to, not by the name.
- TLS is verified with httpx's CA bundle (`SSL_CERT_FILE`, `SSL_CERT_DIR`, else certifi's).
- A client never reuses a connection: each request gets one of its own, closed after its
  answer, so a late or repeated answer on a kept-alive connection can never be taken for the
  answer to a later request (the pool keeps no idle connection).

Socket timeouts are used for the slices rather than `select`: a TLS socket may hold decrypted
bytes that `select` does not see, and `SSLSocket.recv` with a timeout reads those first; a
timed-out TLS read or write is resumed by calling it again.
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

import httpcore
import httpx

__all__ = [
    "SLICE_SECONDS",
    "SlicedBackend",
    "SlicedStream",
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
        if not buffer:
            return
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
            return self._sock._sslobj if isinstance(self._sock, ssl.SSLSocket) else None  # noqa: SLF001
        if info == "server_addr":
            return self._sock.getpeername()
        if info == "client_addr":
            return self._sock.getsockname()
        if info == "socket":
            return self._sock
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

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> SlicedStream:
        raise httpcore.UnsupportedProtocol("unix sockets are not used")

    def sleep(self, seconds: float) -> None:
        self._stop.wait(seconds)


class _Transport(httpx.HTTPTransport):
    """httpx's own transport (request and answer conversion, exception mapping) over a pool
    built here, with the sliced backend: httpx takes no backend of its own."""

    def __init__(self, pool: httpcore.ConnectionPool) -> None:
        self._pool = pool  # what `HTTPTransport.handle_request` and `close` use


POOL_LIMITS: dict[str, Any] = {"max_connections": 100, "max_keepalive_connections": 0}
"""No idle connection is kept: a connection carries one exchange."""


class _Client(httpx.Client):
    """An `httpx.Client` for an https platform whose transports, the proxies' included (as
    httpx reads them from the environment), are sliced pools."""

    def __init__(self, stop: threading.Event, **kwargs: Any) -> None:
        self._backend = SlicedBackend(stop)
        self._ssl_context = httpx.create_ssl_context(trust_env=True)
        super().__init__(trust_env=True, **kwargs)

    def _init_transport(self, **_: Any) -> httpx.BaseTransport:
        return _Transport(
            httpcore.ConnectionPool(
                ssl_context=self._ssl_context, network_backend=self._backend, **POOL_LIMITS
            )
        )

    def _init_proxy_transport(self, proxy: httpx.Proxy, **_: Any) -> httpx.BaseTransport:
        if proxy.url.scheme not in ("http", "https"):  # socks: for other tools (curl, git)
            return self._init_transport()
        return _Transport(
            httpcore.HTTPProxy(
                proxy_url=httpcore.URL(
                    scheme=proxy.url.raw_scheme,
                    host=proxy.url.raw_host,
                    port=proxy.url.port,
                    target=proxy.url.raw_path,
                ),
                proxy_auth=proxy.raw_auth,
                proxy_headers=proxy.headers.raw,
                ssl_context=self._ssl_context,
                network_backend=self._backend,
                **POOL_LIMITS,
            )
        )


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
    common: dict[str, Any] = {"timeout": timeout, "headers": headers, "follow_redirects": False}
    if transport is not None:
        return httpx.Client(transport=transport, **common)
    if scheme == "https":
        return _Client(stop, **common)
    backend = SlicedBackend(stop, loopback_only=not allow_insecure_http)
    pool = httpcore.ConnectionPool(network_backend=backend, **POOL_LIMITS)
    return httpx.Client(transport=_Transport(pool), **common)
