"""The platform client's HTTP transport: every socket wait is short, so a stop or a deadline ends it.

What it promises:
- Every blocking step of an exchange (DNS lookup, TCP connect, TLS handshake, each read and
  each write) waits in slices of at most `SLICE_SECONDS`. Between slices it checks the stop
  event the transport was built with and the deadline of the request in progress
  (`request_deadline`, set per thread by the platform client). So a body that trickles one byte
  a second, a server that accepts and never answers, and one that never reads our upload all
  end within a slice of a stop, and at the request's overall deadline at the latest.
- A stop raises httpcore's `ConnectError`, `ReadError` or `WriteError` ("stop requested") and a
  passed deadline its `ConnectTimeout`, `ReadTimeout` or `WriteTimeout`, which reach the caller
  as the matching httpx exceptions, the connection torn down; `evalpush.errors` classifies them.
- Proxies named by the standard environment variables (`HTTPS_PROXY`, `NO_PROXY`, ...) are used
  as httpx would, through the same sliced sockets. TLS inside TLS (an https proxy in front of an
  https platform) is not supported.

Why a network backend: httpx's timeouts are per phase and per socket read, so a body that
keeps trickling never times out, and nothing in httpx or httpcore watches an event. httpcore's
public `NetworkBackend` / `NetworkStream` interface is the layer where every socket wait
happens; httpx 0.28 has no parameter for it, so this module owns the small transport that
builds httpcore's pool with it. Socket timeouts are used for the slices rather than `select`:
a TLS socket may hold decrypted bytes that `select` does not see, and `SSLSocket.recv` with a
timeout reads those first; a timed-out TLS read or write is resumed by calling it again.
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
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import httpcore
import httpx

__all__ = ["SLICE_SECONDS", "Origin", "StoppableTransport", "request_deadline"]

SLICE_SECONDS = 0.2
"""The longest a socket wait lasts before the stop event and the deadline are looked at again."""

WRITE_CHUNK_BYTES = 256 * 1024
"""A write hands the socket at most this much at a time, so a slow reader cannot hold one call."""

_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "evalpush_request_deadline", default=None
)


@contextlib.contextmanager
def request_deadline(seconds: float) -> Iterator[None]:
    """Every socket wait in this thread, inside the block, ends `seconds` from now at the latest."""
    token = _deadline.set(time.monotonic() + seconds)
    try:
        yield
    finally:
        _deadline.reset(token)


class _Limit:
    """When one socket operation must give up: its own timeout, the request's deadline, a stop."""

    def __init__(self, timeout: float | None, stop: threading.Event) -> None:
        now = time.monotonic()
        self._stop = stop
        self._timeout_at = None if timeout is None else now + timeout
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


class _SlicedStream(httpcore.NetworkStream):
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
                return self._sock.recv(max_bytes)
            except TimeoutError:
                continue  # a slice passed: look at the stop event and the deadline again
            except OSError as exc:
                raise httpcore.ReadError(str(exc)) from exc

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
    ) -> httpcore.NetworkStream:
        if isinstance(self._sock, ssl.SSLSocket):
            self.close()
            raise httpcore.ConnectError(
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
                return _SlicedStream(tls, self._stop)
            except TimeoutError:
                continue  # the handshake resumes where it stopped
            except OSError as exc:
                tls.close()
                raise httpcore.ConnectError(str(exc)) from exc
            except BaseException:
                tls.close()
                raise

    def get_extra_info(self, info: str) -> Any:
        if info == "ssl_object" and isinstance(self._sock, ssl.SSLSocket):
            return self._sock  # what httpcore asks of it (the ALPN protocol) it answers too
        if info == "client_addr":
            return self._sock.getsockname()
        if info == "server_addr":
            return self._sock.getpeername()
        if info == "socket":
            return self._sock
        if info == "is_readable":
            # An idle pooled connection that is readable was closed (or spoken to) by the server.
            return _poll(self._sock, select.POLLIN, 0)
        return None


_IN_PROGRESS = {errno.EINPROGRESS, errno.EALREADY, errno.EWOULDBLOCK, errno.EINTR}


class _SlicedBackend(httpcore.NetworkBackend):
    """Opens connections whose every wait is sliced; DNS runs aside so a stop need not wait."""

    def __init__(self, stop: threading.Event) -> None:
        self._stop = stop

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        limit = _Limit(timeout, self._stop)
        failures: list[OSError] = []
        for family, kind, proto, _, address in self._resolve(host, port, limit):
            sock = socket.socket(family, kind, proto)
            try:
                for option in socket_options or ():
                    sock.setsockopt(*option)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if local_address is not None:
                    sock.bind((local_address, 0))
                self._connect(sock, address, limit)
            except OSError as exc:
                sock.close()
                failures.append(exc)
                continue
            except BaseException:
                sock.close()
                raise
            return _SlicedStream(sock, self._stop)
        raise httpcore.ConnectError(str(failures[-1]) if failures else f"{host}: no address")

    def _resolve(self, host: str, port: int, limit: _Limit) -> list[Any]:
        try:
            ipaddress.ip_address(host)
        except ValueError:
            pass
        else:  # a literal address: no lookup, nothing to wait for
            return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        found: dict[str, Any] = {}
        done = threading.Event()

        def look_up() -> None:
            try:
                found["addresses"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError as exc:
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

    @staticmethod
    def _connect(sock: socket.socket, address: Any, limit: _Limit) -> None:
        sock.setblocking(False)
        error = sock.connect_ex(address)
        while error in _IN_PROGRESS:
            limit.check(httpcore.ConnectTimeout, httpcore.ConnectError)
            if _poll(sock, select.POLLOUT, SLICE_SECONDS):
                error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if error:
            raise OSError(error, os.strerror(error))

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        raise httpcore.ConnectError("unix sockets are not used by evalpush")

    def sleep(self, seconds: float) -> None:
        self._stop.wait(seconds)


# httpcore's exceptions as httpx's, most specific first (what httpx's own transport does).
_EXCEPTIONS: list[tuple[type[Exception], type[httpx.TransportError]]] = [
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.TimeoutException, httpx.TimeoutException),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.NetworkError, httpx.NetworkError),
    (httpcore.ProxyError, httpx.ProxyError),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.ProtocolError, httpx.ProtocolError),
]


@contextlib.contextmanager
def _as_httpx_errors() -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        for source, target in _EXCEPTIONS:
            if isinstance(exc, source):
                raise target(str(exc)) from exc
        raise


class _ResponseStream(httpx.SyncByteStream):
    def __init__(self, stream: Iterable[bytes]) -> None:
        self._stream = stream

    def __iter__(self) -> Iterator[bytes]:
        with _as_httpx_errors():
            yield from self._stream

    def close(self) -> None:
        close = getattr(self._stream, "close", None)
        if close is not None:
            close()


_LIMITS = httpx.Limits()  # httpx's defaults


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a request goes: a URL's scheme, host and port, taken from it once."""

    scheme: str
    host: str  # as `httpx.URL.host` (what NO_PROXY is matched against)
    raw_scheme: bytes
    raw_host: bytes
    port: int | None

    @classmethod
    def of(cls, url: httpx.URL) -> Origin:
        return cls(url.scheme, url.host, url.raw_scheme, url.raw_host, url.port)


class StoppableTransport(httpx.BaseTransport):
    """httpx transport over httpcore's pool with the sliced backend; proxies from the environment."""

    def __init__(self, stop: threading.Event, limits: httpx.Limits = _LIMITS) -> None:
        self._backend = _SlicedBackend(stop)
        self._limits = limits
        self._ssl_context: ssl.SSLContext | None = None  # built for the first https pool
        self._proxies = urllib.request.getproxies_environment()
        self._pools: dict[tuple[str, bool], httpcore.ConnectionPool] = {}
        self._lock = threading.Lock()

    def _pool_for(self, scheme: str, host: str) -> httpcore.ConnectionPool:
        """The pool for the URL's proxy (none: "") and scheme: an https URL's pool carries the
        TLS context (built once, at the first: loading the CA bundle costs ~60 ms of start-up
        that a loopback http:// platform never needs); an http URL's pool has none."""
        proxy = self._proxies.get(scheme)
        if proxy and urllib.request.proxy_bypass_environment(host, self._proxies):
            proxy = None
        tls = scheme == "https"
        with self._lock:
            pool = self._pools.get((proxy or "", tls))
            if pool is None:
                pool = self._pools[(proxy or "", tls)] = self._new_pool(proxy, tls)
            return pool

    def _new_pool(self, proxy: str | None, tls: bool) -> httpcore.ConnectionPool:
        if tls and self._ssl_context is None:
            self._ssl_context = httpx.create_ssl_context(verify=True, trust_env=True)
        common: dict[str, Any] = {
            "ssl_context": self._ssl_context if tls else None,
            "max_connections": self._limits.max_connections,
            "max_keepalive_connections": self._limits.max_keepalive_connections,
            "keepalive_expiry": self._limits.keepalive_expiry,
            "network_backend": self._backend,
        }
        if proxy is None:
            return httpcore.ConnectionPool(**common)
        url = httpx.URL(proxy if "://" in proxy else f"http://{proxy}")
        if url.scheme not in ("http", "https"):
            raise httpx.UnsupportedProtocol(f"proxy {url.scheme}:// is not supported")
        return httpcore.HTTPProxy(
            proxy_url=httpcore.URL(
                scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path
            ),
            proxy_auth=(url.username, url.password) if url.username else None,
            **common,
        )

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.SyncByteStream)
        url = request.url
        return self.send(
            request.method.encode("ascii"),
            Origin.of(url),
            url.raw_path,
            request.headers.raw,
            request.stream,
            request.extensions,
        )

    def send(
        self,
        method: bytes,
        origin: Origin,
        target: bytes,
        headers: list[tuple[bytes, bytes]],
        body: httpx.SyncByteStream,
        extensions: dict[str, Any],
    ) -> httpx.Response:
        """`handle_request` without an `httpx.Request`: the platform client's requests, whose
        URL is its checked base and a path of quoted segments, need no URL parsed each time.
        `headers` must hold the Host."""
        core_request = httpcore.Request(
            method=method,
            url=httpcore.URL(
                scheme=origin.raw_scheme, host=origin.raw_host, port=origin.port, target=target
            ),
            headers=headers,
            content=body,
            extensions=extensions,
        )
        pool = self._pool_for(origin.scheme, origin.host)
        with _as_httpx_errors():
            response = pool.handle_request(core_request)
        assert isinstance(response.stream, Iterable)
        return httpx.Response(
            status_code=response.status,
            headers=response.headers,
            stream=_ResponseStream(response.stream),
            extensions=response.extensions,
        )

    def close(self) -> None:
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()
