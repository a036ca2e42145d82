"""The platform client's HTTP/1.1 transport: every socket wait is short, so a stop or a deadline ends it.

What it promises:
- Every blocking step of an exchange (DNS lookup, TCP connect, TLS handshake, each read and
  each write) waits in slices of at most `SLICE_SECONDS`. Between slices it checks the stop
  event the transport was built with and the deadline of the request in progress
  (`request_deadline`, set per thread by the platform client). So a body that trickles one byte
  a second, a server that accepts and never answers, and one that never reads our upload all
  end within a slice of a stop, and at the request's overall deadline at the latest.
- A failed exchange raises one `TransportError` that says how far it got: `ConnectError` (and
  its `ConnectTimeout`, `ProxyError`) when no connection was made, so the request never left;
  `LocalProtocolError` / `UnsupportedProtocol` when the request cannot be put on the wire;
  anything else (`WriteError`, `ReadError`, their timeouts, `RemoteProtocolError`) once it may
  have reached the server. A stop raises the step's error with "stop requested"; a passed
  deadline its timeout. `evalpush.errors` classifies them; the connection is torn down.
- Answers are read as HTTP/1.1 says (Content-Length, chunked, or to the close; interim 1xx
  answers skipped; gzip and deflate decoded, in bounded steps), and anything else is a
  `RemoteProtocolError`: a head past `MAX_HEAD_BYTES`, a malformed status line or header, a
  body cut short. A connection is kept for the next request only after an answer was read to
  its end with nothing after it; an idle one is dropped after `KEEPALIVE_SECONDS`, or at once
  when the server closed it (or spoke out of turn) meanwhile.
- Proxies named by the standard environment variables (`HTTPS_PROXY`, `ALL_PROXY`, `NO_PROXY`,
  ...) are used as curl and httpx use them: an http URL is asked of the proxy in absolute
  form, an https URL through a CONNECT tunnel, both over the same sliced sockets. An
  `ALL_PROXY` that is not http(s) (socks, for curl and git) is left aside; TLS inside TLS (an
  https proxy in front of an https platform) is refused as `UnsupportedProtocol`.

Why its own: httpx's timeouts are per phase and per socket read, so a body that keeps
trickling never times out, and nothing in httpx or httpcore watches an event; this transport
once fed httpcore's pool a sliced network backend. The platform's exchanges are small and few
kinds (JSON in, JSON out, one connection per worker), and httpx, httpcore and h11 cost about
two fifths of `evalpush push`'s start-up (issue 10: the first request within 150 ms) and of its
CPU per one-trace run. Socket timeouts are used for the slices rather than
`select`: a TLS socket may hold decrypted bytes that `select` does not see, and
`SSLSocket.recv` with a timeout reads those first; a timed-out TLS read or write is resumed
by calling it again. `ssl` (and the CA bundle) is loaded at the first https connection only.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import os
import re
import select
import socket
import threading
import time
import urllib.parse
import zlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import ssl

__all__ = [
    "KEEPALIVE_SECONDS",
    "SLICE_SECONDS",
    "ConnectError",
    "BodyStream",
    "ConnectTimeout",
    "Headers",
    "LocalProtocolError",
    "Origin",
    "ProxyError",
    "ReadError",
    "ReadTimeout",
    "RemoteProtocolError",
    "Response",
    "StoppableTransport",
    "Timeouts",
    "Transport",
    "TransportError",
    "UnsupportedProtocol",
    "WriteError",
    "WriteTimeout",
    "request_deadline",
]

SLICE_SECONDS = 0.2
"""The longest a socket wait lasts before the stop event and the deadline are looked at again."""

WRITE_CHUNK_BYTES = 256 * 1024
"""A write hands the socket at most this much at a time, so a slow reader cannot hold one call."""

READ_BYTES = 64 * 1024
"""What one socket read asks for."""

MAX_HEAD_BYTES = 64 * 1024
"""An answer's status line and headers together; past this it is not an answer we read."""

MAX_IDLE_CONNECTIONS = 20
"""Kept-alive connections per route (proxy and origin); more are closed when released."""

KEEPALIVE_SECONDS = 5.0
"""An idle connection older than this is closed rather than reused (servers drop them too)."""

_INLINE_BODY_BYTES = 64 * 1024
"""A body up to this size goes out in the same write as the head (one segment on loopback)."""

_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "evalpush_request_deadline", default=None
)


# -- what can go wrong, by how far the exchange got --------------------------------------------


class TransportError(Exception):
    """An exchange that failed below HTTP: no answer, or one that is not HTTP."""


class ConnectError(TransportError):
    """No connection was made (refused, no address, TLS handshake failed): nothing was sent."""


class ConnectTimeout(ConnectError):
    """The connection (or its TLS handshake) took longer than the connect timeout."""


class ProxyError(ConnectError):
    """The proxy refused to open a tunnel to the platform: nothing reached the platform."""


class UnsupportedProtocol(TransportError):
    """A URL (the platform's or a proxy's) with a scheme this transport does not speak."""


class LocalProtocolError(TransportError):
    """The request cannot be put on the wire as it is (an illegal header name or value)."""


class WriteError(TransportError):
    """The connection broke while the request was being sent."""


class WriteTimeout(WriteError):
    """A write waited longer than the write timeout (the server stopped reading)."""


class ReadError(TransportError):
    """The connection broke while the answer was awaited or read."""


class ReadTimeout(ReadError):
    """A read waited longer than the read timeout."""


class RemoteProtocolError(TransportError):
    """The server's answer is not HTTP/1.1 as it should be, or stops before its end."""


@contextlib.contextmanager
def request_deadline(seconds: float) -> Iterator[None]:
    """Every socket wait in this thread, inside the block, ends `seconds` from now at the latest."""
    token = _deadline.set(time.monotonic() + seconds)
    try:
        yield
    finally:
        _deadline.reset(token)


class Timeouts:
    """How long one step of an exchange may wait: connecting (with TLS), each write, each read."""

    __slots__ = ("connect", "read", "write")

    def __init__(self, *, connect: float, read: float, write: float) -> None:
        self.connect = connect
        self.read = read
        self.write = write


class _Limit:
    """When one socket operation must give up: its own timeout, the request's deadline, a stop."""

    __slots__ = ("_deadline_at", "_stop", "_timeout_at")

    def __init__(self, timeout: float | None, stop: threading.Event) -> None:
        now = time.monotonic()
        self._stop = stop
        self._timeout_at = None if timeout is None else now + timeout
        self._deadline_at = _deadline.get()

    def check(self, timed_out: type[TransportError], stopped: type[TransportError]) -> None:
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


# -- sockets whose every wait is sliced ---------------------------------------------------------


class _SlicedStream:
    """One connection's socket (plain or TLS), every wait cut into slices."""

    __slots__ = ("_sock", "_stop")

    def __init__(self, sock: socket.socket, stop: threading.Event) -> None:
        sock.settimeout(SLICE_SECONDS)
        self._sock = sock
        self._stop = stop

    def read(self, max_bytes: int, timeout: float | None) -> bytes:
        """Up to `max_bytes`; b"" once the peer closed its side."""
        limit = _Limit(timeout, self._stop)
        while True:
            limit.check(ReadTimeout, ReadError)
            try:
                return self._sock.recv(max_bytes)
            except TimeoutError:
                continue  # a slice passed: look at the stop event and the deadline again
            except OSError as exc:
                raise ReadError(str(exc)) from exc

    def write(self, buffer: bytes | memoryview, timeout: float | None) -> None:
        limit = _Limit(timeout, self._stop)
        view = memoryview(buffer)
        self._write(view, limit)

    def _write(self, view: memoryview, limit: _Limit) -> None:
        while view:
            limit.check(WriteTimeout, WriteError)
            try:
                # A timed-out TLS write must be retried with the same bytes: they are.
                view = view[self._sock.send(view[:WRITE_CHUNK_BYTES]) :]
            except TimeoutError:
                continue
            except OSError as exc:
                raise WriteError(str(exc)) from exc

    def close(self) -> None:
        self._sock.close()

    def is_tls(self) -> bool:
        return hasattr(self._sock, "do_handshake")

    def start_tls(
        self, context: ssl.SSLContext, server_hostname: str, timeout: float | None
    ) -> _SlicedStream:
        if self.is_tls():
            self.close()
            raise ConnectError(
                "TLS inside TLS (an https proxy in front of an https platform) is not supported"
            )
        limit = _Limit(timeout, self._stop)
        try:
            tls = context.wrap_socket(
                self._sock, server_hostname=server_hostname, do_handshake_on_connect=False
            )
        except OSError as exc:
            self.close()
            raise ConnectError(str(exc)) from exc
        while True:
            try:
                limit.check(ConnectTimeout, ConnectError)
                tls.do_handshake()
                return _SlicedStream(tls, self._stop)
            except TimeoutError:
                continue  # the handshake resumes where it stopped
            except OSError as exc:
                tls.close()
                raise ConnectError(str(exc)) from exc
            except BaseException:
                tls.close()
                raise

    def readable_now(self) -> bool:
        """Whether bytes (or the close) are waiting: on an idle connection, the server closed
        it or spoke out of turn, and it is not used again."""
        pending = getattr(self._sock, "pending", None)  # TLS: bytes already decrypted
        return bool(pending and pending()) or _poll(self._sock, select.POLLIN, 0)


_IN_PROGRESS = {errno.EINPROGRESS, errno.EALREADY, errno.EWOULDBLOCK, errno.EINTR}


def _is_address(host: str) -> bool:
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
    except (OSError, ValueError):
        return False
    return True


def _resolve(host: str, port: int, limit: _Limit) -> list[Any]:
    """The addresses to try; a name is looked up aside, so a stop need not wait for DNS."""
    if _is_address(host):  # a literal address: no lookup, nothing to wait for
        try:
            return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise ConnectError(f"{host}: {exc}") from None
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
        limit.check(ConnectTimeout, ConnectError)
    if "error" in found:
        raise ConnectError(f"{host}: {found['error']}")
    return found["addresses"]


def _connect(sock: socket.socket, address: Any, limit: _Limit) -> None:
    sock.setblocking(False)
    error = sock.connect_ex(address)
    while error in _IN_PROGRESS:
        limit.check(ConnectTimeout, ConnectError)
        if _poll(sock, select.POLLOUT, SLICE_SECONDS):
            error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if error:
        raise OSError(error, os.strerror(error))


def _open_tcp(host: str, port: int, timeout: float, stop: threading.Event) -> _SlicedStream:
    """A TCP connection to the first of the host's addresses that takes one."""
    limit = _Limit(timeout, stop)
    failures: list[OSError] = []
    for family, kind, proto, _, address in _resolve(host, port, limit):
        try:  # EMFILE, or EAFNOSUPPORT for an IPv6 address on a host without IPv6
            sock = socket.socket(family, kind, proto)
        except OSError as exc:
            failures.append(exc)
            continue
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _connect(sock, address, limit)
        except OSError as exc:
            sock.close()
            failures.append(exc)
            continue
        except BaseException:
            sock.close()
            raise
        return _SlicedStream(sock, stop)
    raise ConnectError(str(failures[-1]) if failures else f"{host}: no address")


# -- where a request goes -------------------------------------------------------------------------

_DEFAULT_PORTS = {"http": 80, "https": 443}


class Origin:
    """A URL's scheme, host and port, taken apart once: where its requests go."""

    __slots__ = ("host", "host_header", "port", "scheme")

    def __init__(self, scheme: str, host: str, port: int) -> None:
        self.scheme = scheme
        self.host = host  # as written (lower case, no brackets); NO_PROXY: `_bypassed`
        self.port = port
        shown = f"[{host}]" if ":" in host else _ascii_host(host)
        self.host_header = (shown if port == _DEFAULT_PORTS[scheme] else f"{shown}:{port}").encode(
            "ascii"
        )

    @classmethod
    def of(cls, url: str | urllib.parse.SplitResult) -> Origin:
        """The origin of an http(s) URL; ValueError (saying why) for anything else."""
        parts = urllib.parse.urlsplit(url) if isinstance(url, str) else url
        scheme = parts.scheme.lower()
        if scheme not in _DEFAULT_PORTS:
            raise ValueError(f"the scheme {scheme or '(none)'!r} is not http or https")
        host = parts.hostname or ""  # lower case, brackets of an IPv6 address taken off
        if not host or not host.isprintable() or any(c in host for c in " /\\?#@%"):
            raise ValueError(f"{host!r} is not a host name")
        try:
            port = parts.port
        except ValueError:  # urllib quotes the text, which may be a password cut short by a "/"
            raise ValueError("the port is not a number from 0 to 65535") from None
        if port == 0:
            raise ValueError("port 0 is no port to connect to")
        _ascii_host(host)  # ValueError when it has no IDNA spelling
        return cls(scheme, host, _DEFAULT_PORTS[scheme] if port is None else port)

    @property
    def connect_host(self) -> str:
        return _ascii_host(self.host)

    @property
    def authority(self) -> bytes:
        """host:port, always with the port (what a CONNECT names)."""
        shown = f"[{self.host}]" if ":" in self.host else _ascii_host(self.host)
        return f"{shown}:{self.port}".encode("ascii")


def _ascii_host(host: str) -> str:
    """The host as DNS and the Host header carry it: a name that is not ASCII in its IDNA 2008
    spelling, mapped as UTS 46 says (as browsers, curl and httpx spell it; Python's own codec
    is IDNA 2003, which turns `straße` into `strasse`, another host)."""
    if host.isascii():
        return host
    import idna  # only for a name that is not ASCII

    try:
        return idna.encode(host, uts46=True).decode("ascii")
    except idna.IDNAError as exc:
        raise ValueError(f"{host!r} has no IDNA spelling: {exc}") from None


class _Route:
    """How requests for one origin travel: straight there, or through a proxy (which then
    sees the request in absolute form, or opens a tunnel for TLS)."""

    __slots__ = ("authorization", "key", "origin", "proxy", "tunnel")

    def __init__(self, origin: Origin, proxy: Origin | None, authorization: bytes | None):
        self.origin = origin
        self.proxy = proxy
        self.authorization = authorization  # Proxy-Authorization, from the proxy URL's user
        self.tunnel = proxy is not None and origin.scheme == "https"
        self.key = (origin.scheme, origin.host, origin.port) + (
            (proxy.scheme, proxy.host, proxy.port) if proxy else ()
        )

    def target(self, path: bytes) -> bytes:
        """What the request line names: the path, or the whole URL when a proxy forwards it."""
        if self.proxy is None or self.tunnel:
            return path
        return b"%s://%s%s" % (self.origin.scheme.encode(), self.origin.host_header, path)


def _proxies_from_environment() -> dict[str, str]:
    """The proxies the environment names, per scheme, plus `no` (NO_PROXY); empty when none
    is named (the common case costs no import of `urllib.request`)."""
    if not any(name.lower().endswith("_proxy") for name in os.environ):
        return {}
    import urllib.request

    return urllib.request.getproxies_environment()


def _proxy_route(origin: Origin, proxies: Mapping[str, str]) -> _Route:
    """The route for `origin`: its scheme's proxy, else ALL_PROXY's, unless NO_PROXY names it.
    An ALL_PROXY that is not http(s) (socks, as curl and git use it) is not for us: direct."""
    proxy_url = proxies.get(origin.scheme)
    from_all = not proxy_url
    if from_all:
        proxy_url = proxies.get("all")
    if not proxy_url:
        return _Route(origin, None, None)
    if _bypassed(origin, proxies):
        return _Route(origin, None, None)
    if "://" not in proxy_url:
        proxy_url = f"http://{proxy_url}"
    parts = urllib.parse.urlsplit(proxy_url)
    if from_all and parts.scheme.lower() not in _DEFAULT_PORTS:
        return _Route(origin, None, None)
    try:
        proxy = Origin.of(parts)
    except ValueError as exc:  # the URL is not quoted: it may hold the proxy's password
        raise UnsupportedProtocol(
            f"the {origin.scheme} proxy named by the environment: {exc}"
        ) from None
    if proxy.scheme == "https" and origin.scheme == "https":
        raise UnsupportedProtocol(
            "an https proxy in front of an https platform (TLS inside TLS) is not supported; "
            "name the proxy as http://"
        )
    authorization = None
    if parts.username or parts.password:
        import base64

        user = urllib.parse.unquote(parts.username)
        password = urllib.parse.unquote(parts.password or "")
        authorization = b"Basic " + base64.b64encode(f"{user}:{password}".encode())
    return _Route(origin, proxy, authorization)


def _bypassed(origin: Origin, proxies: Mapping[str, str]) -> bool:
    """Whether NO_PROXY names `origin`'s host: as written, or (a name that is not ASCII on
    either side) in the IDNA spelling the request goes to, so `bücher.example` and
    `xn--bcher-kva.example` name one host in the URL and in NO_PROXY alike."""
    import urllib.request

    if urllib.request.proxy_bypass_environment(origin.host, dict(proxies)):
        return True
    no_proxy = proxies.get("no", "")
    if origin.host.isascii() and no_proxy.isascii():
        return False
    spelt = ",".join(_idna_entry(entry) for entry in no_proxy.split(","))
    return urllib.request.proxy_bypass_environment(origin.connect_host, {**proxies, "no": spelt})


def _idna_entry(entry: str) -> str:
    """A NO_PROXY entry (a host, or a domain after a dot) in its IDNA spelling; as it is when it
    has none (a port, an address: urllib matches those as written)."""
    entry = entry.strip()
    host = entry.lstrip(".")
    try:
        return entry[: len(entry) - len(host)] + _ascii_host(host)
    except ValueError:
        return entry


def _ssl_context() -> ssl.SSLContext:
    """The CA bundle httpx would use: `SSL_CERT_FILE`, `SSL_CERT_DIR`, else certifi's."""
    import ssl

    if os.environ.get("SSL_CERT_FILE"):
        context = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
    elif os.environ.get("SSL_CERT_DIR"):
        context = ssl.create_default_context(capath=os.environ["SSL_CERT_DIR"])
    else:
        import certifi

        context = ssl.create_default_context(cafile=certifi.where())
    context.set_alpn_protocols(["http/1.1"])
    return context


# -- one connection: a request out, an answer in ------------------------------------------------

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_FIELD_VALUE = re.compile(rb"[^\x00-\x08\x0a-\x1f\x7f]*")
"""A header value we send: no control character but the tab (no CR or LF above all)."""
_TARGET = re.compile(rb"[\x21-\x7e]+")
_STATUS_LINE = re.compile(rb"HTTP/1\.([01]) ([1-5][0-9]{2})(?: [^\x00-\x08\x0a-\x1f\x7f]*)?")
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]+")
_DIGITS = re.compile(r"[0-9]{1,18}")
"""A Content-Length: ASCII digits (`str.isdigit` also takes "\xb2", which `int` refuses)."""
_NO_BODY_STATUSES = frozenset({204, 304})


class Headers:
    """An answer's headers, looked up without regard to case; repeated ones joined with ", "."""

    __slots__ = ("_fields",)

    def __init__(self, fields: Mapping[str, str]) -> None:
        self._fields = fields

    def get(self, name: str, default: str | None = None) -> str | None:
        return self._fields.get(name.lower(), default)


def _request_head(method: bytes, target: bytes, headers: list[tuple[bytes, bytes]]) -> bytes:
    if _TOKEN.fullmatch(method) is None:
        raise LocalProtocolError(f"illegal method {method!r}")
    if _TARGET.fullmatch(target) is None:
        raise LocalProtocolError("illegal request target (a space or a control character)")
    lines = [b"%s %s HTTP/1.1\r\n" % (method, target)]
    for name, value in headers:
        if _TOKEN.fullmatch(name) is None:
            raise LocalProtocolError(f"illegal header name {name!r}")
        if _FIELD_VALUE.fullmatch(value) is None:
            # The value is not quoted: it may be the key.
            raise LocalProtocolError(f"illegal header value in {name.decode('ascii')}")
        lines.append(b"%s: %s\r\n" % (name, value))
    lines.append(b"\r\n")
    return b"".join(lines)


class _Connection:
    """One socket and what has been read from it but not yet used."""

    __slots__ = ("_buffer", "idle_since", "route", "stream")

    def __init__(self, stream: _SlicedStream, route: _Route) -> None:
        self.stream = stream
        self.route = route
        self.idle_since = 0.0
        self._buffer = bytearray()

    def close(self) -> None:
        self.stream.close()

    @property
    def has_unread(self) -> bool:
        return bool(self._buffer)

    def _fill(self, timeout: float) -> bool:
        """Read more into the buffer; False once the server closed its side."""
        data = self.stream.read(READ_BYTES, timeout)
        self._buffer += data
        return bool(data)

    def read_head(self, timeout: float) -> tuple[int, bool, dict[str, str]]:
        """The next answer's status, whether it is HTTP/1.1, and its headers (names lower case)."""
        while True:
            end = self._buffer.find(b"\r\n\r\n")
            if end >= 0:
                break
            if len(self._buffer) > MAX_HEAD_BYTES:
                raise RemoteProtocolError(f"an answer head of more than {MAX_HEAD_BYTES} bytes")
            if not self._fill(timeout):
                if self._buffer:
                    raise RemoteProtocolError("the server closed the connection mid-answer")
                raise RemoteProtocolError("the server closed the connection without answering")
        if end > MAX_HEAD_BYTES:
            raise RemoteProtocolError(f"an answer head of more than {MAX_HEAD_BYTES} bytes")
        head = bytes(self._buffer[:end])
        del self._buffer[: end + 4]
        status_line, *lines = head.split(b"\r\n")
        matched = _STATUS_LINE.fullmatch(status_line)
        if matched is None:
            raise RemoteProtocolError(f"not an HTTP/1.x status line: {status_line[:80]!r}")
        fields: dict[str, str] = {}
        for line in lines:
            name, colon, value = line.partition(b":")
            if not colon or _TOKEN.fullmatch(name) is None:
                raise RemoteProtocolError(f"a malformed header line: {line[:80]!r}")
            key, text = name.decode("ascii").lower(), value.strip(b" \t").decode("latin-1")
            fields[key] = f"{fields[key]}, {text}" if key in fields else text
        return int(matched[2]), matched[1] == b"1", fields

    # -- the body, by its framing --------------------------------------------------------------

    def take(self, most: int, timeout: float) -> bytes:
        """Up to `most` bytes of what follows (b"" at the server's close)."""
        if not self._buffer and not self._fill(timeout):
            return b""
        data = bytes(self._buffer[:most])
        del self._buffer[:most]
        return data

    def line(self, timeout: float) -> bytes:
        """One CRLF-ended line (a chunk size or a trailer), without its end."""
        while True:
            end = self._buffer.find(b"\r\n")
            if end >= 0:
                line = bytes(self._buffer[:end])
                del self._buffer[: end + 2]
                return line
            if len(self._buffer) > MAX_HEAD_BYTES:
                raise RemoteProtocolError("a chunk size or trailer line past its bound")
            if not self._fill(timeout):
                raise RemoteProtocolError("the server closed the connection mid-chunk")


class _Body:
    """An answer's body as it arrives, framed by Content-Length, chunks, or the close; the
    connection goes back to the pool once it was read to its end and is fit to reuse."""

    def __init__(
        self,
        transport: StoppableTransport,
        connection: _Connection,
        timeout: float,
        length: int | None,
        chunked: bool,
        reusable: bool,
    ) -> None:
        self._transport = transport
        self._connection: _Connection | None = connection
        self._timeout = timeout
        self._left = length  # Content-Length still to read; None: chunked or to the close
        self._chunked = chunked
        self._chunk_left = 0
        self._reusable = reusable and (chunked or length is not None)
        if length == 0 and not chunked:
            self._done()

    def chunks(self) -> Iterator[bytes]:
        while self._connection is not None:
            data = self._next()
            if data:
                yield data

    def _next(self) -> bytes:
        connection = self._connection
        assert connection is not None
        if self._chunked:
            return self._next_chunk(connection)
        want = READ_BYTES if self._left is None else min(self._left, READ_BYTES)
        data = connection.take(want, self._timeout)
        if self._left is None:  # read to the close
            if not data:
                self._done()
            return data
        if not data:
            raise RemoteProtocolError(
                f"the server closed the connection with {self._left} bytes of the body unsent"
            )
        self._left -= len(data)
        if self._left == 0:
            self._done()
        return data

    def _next_chunk(self, connection: _Connection) -> bytes:
        if self._chunk_left == 0:
            size_text = connection.line(self._timeout).split(b";", 1)[0].strip(b" \t")
            if len(size_text) > 16 or _CHUNK_SIZE.fullmatch(size_text) is None:
                raise RemoteProtocolError(f"a malformed chunk size: {size_text[:20]!r}")
            self._chunk_left = int(size_text, 16)
            if self._chunk_left == 0:
                while connection.line(self._timeout):  # trailers, up to the empty line
                    pass
                self._done()
                return b""
        data = connection.take(self._chunk_left, self._timeout)
        if not data:
            raise RemoteProtocolError("the server closed the connection mid-chunk")
        self._chunk_left -= len(data)
        if self._chunk_left == 0 and connection.line(self._timeout):
            raise RemoteProtocolError("a chunk longer than its size")
        return data

    def _done(self) -> None:
        connection, self._connection = self._connection, None
        if connection is None:
            return
        if self._reusable and not connection.has_unread:
            self._transport.release(connection)
        else:
            connection.close()

    def close(self) -> None:
        """Stop reading: a body not read to its end takes its connection with it."""
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()


_COMPRESSED_SLACK_BYTES = 64 * 1024
"""How far a compressed body's bytes may run ahead of what they decode to."""


def _decoded(chunks: Iterator[bytes], encoding: str) -> Iterator[bytes]:
    """`chunks` decompressed (gzip, deflate), in steps of at most `READ_BYTES` bytes out, so an
    answer that inflates a thousandfold is stopped by the caller's cap like any other. A body
    that goes on after the end of its compressed stream, or stops before it, is a
    `RemoteProtocolError`: zlib would keep every byte after the end (copying them all at each
    step) while putting out nothing for the cap to count. So is one that takes in more than
    `_COMPRESSED_SLACK_BYTES` beyond what it puts out (real compression never does: stored
    blocks cost 5 bytes per 64 KiB): endless empty blocks would burn CPU to the deadline."""
    taken = given = 0
    if encoding in ("gzip", "x-gzip"):
        decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
    else:  # deflate: zlib-wrapped as the RFC says, or raw as some servers send it
        decompressor = None
    start = b""  # deflate: its first two bytes tell which, and a chunk may hold one
    fed = False
    try:
        for raw in chunks:
            if decompressor is None:
                start += raw
                if len(start) < 2:
                    continue
                raw, start = start, b""
                wrapped = raw[0] & 0x0F == 8 and (raw[0] << 8 | raw[1]) % 31 == 0
                decompressor = zlib.decompressobj(zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)
            if decompressor.eof:
                raise RemoteProtocolError(f"bytes after the end of the {encoding} body")
            fed = True
            taken += len(raw)
            data = raw
            while data:
                out = decompressor.decompress(data, READ_BYTES)
                if out:
                    given += len(out)
                    yield out
                if decompressor.unused_data:
                    raise RemoteProtocolError(f"bytes after the end of the {encoding} body")
                data = decompressor.unconsumed_tail
            if taken > given + _COMPRESSED_SLACK_BYTES:
                raise RemoteProtocolError(
                    f"a {encoding} body that takes in far more than it puts out"
                )
        if start:
            raise RemoteProtocolError(f"a {encoding} body that stops before its end")
        if fed:
            assert decompressor is not None
            if rest := decompressor.flush():  # what the last step held back (a match's end)
                yield rest
            if not decompressor.eof:
                raise RemoteProtocolError(f"a {encoding} body that stops before its end")
    except zlib.error as exc:
        raise RemoteProtocolError(f"an answer that does not decode as {encoding}: {exc}") from None


class BodyStream(Protocol):
    """An answer's body as it arrives (`_Body` off a socket; tests feed canned ones)."""

    def chunks(self) -> Iterator[bytes]: ...

    def close(self) -> None: ...


class Response:
    """An answer: its status and headers, its body read by the caller as it arrives."""

    __slots__ = ("_body", "headers", "status_code")

    def __init__(self, status_code: int, headers: Headers, body: BodyStream) -> None:
        self.status_code = status_code
        self.headers = headers
        self._body = body

    @property
    def is_success(self) -> bool:
        return 200 <= self.status_code < 300

    def iter_bytes(self) -> Iterator[bytes]:
        """The body, decoded, piece by piece."""
        encoding = (self.headers.get("content-encoding") or "identity").strip().lower()
        if encoding in ("identity", ""):
            return self._body.chunks()
        if encoding in ("gzip", "x-gzip", "deflate"):
            return _decoded(self._body.chunks(), encoding)
        raise RemoteProtocolError(f"an answer encoded as {encoding!r}, which was not asked for")

    def close(self) -> None:
        self._body.close()


# -- the transport ------------------------------------------------------------------------------


class Transport(Protocol):
    """What the platform client sends its requests through (tests feed canned answers)."""

    def send(
        self,
        method: bytes,
        origin: Origin,
        path: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes | None,
        timeouts: Timeouts,
    ) -> Response: ...

    def close(self) -> None: ...


class StoppableTransport:
    """HTTP/1.1 over sliced sockets, kept-alive connections per route; proxies from the
    environment. Safe to share between threads: each connection serves one at a time."""

    def __init__(self, stop: threading.Event) -> None:
        self._stop = stop
        self._proxies = _proxies_from_environment()
        self._routes: dict[tuple[str, str, int], _Route] = {}
        self._idle: dict[tuple[Any, ...], list[_Connection]] = {}
        self._ssl: ssl.SSLContext | None = None  # built at the first TLS connection
        self._lock = threading.Lock()
        self._closed = False

    def send(
        self,
        method: bytes,
        origin: Origin,
        path: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes | None,
        timeouts: Timeouts,
    ) -> Response:
        """Send one request (`headers` must hold the Host) and read its answer's head; the body
        is the caller's to read (`Response.iter_bytes`) and close."""
        route = self._route(origin)
        if route.authorization is not None and not route.tunnel:
            headers = [*headers, (b"Proxy-Authorization", route.authorization)]
        head = _request_head(method, route.target(path), headers)
        connection = self._checkout(route, timeouts)
        try:
            answered_early = self._write(connection, head, body, timeouts)
            status, http11, fields = connection.read_head(timeouts.read)
            while 100 <= status < 200:  # interim answers (100 Continue, 103): the real one follows
                if status == 101:
                    raise RemoteProtocolError("the server switched protocols unasked")
                status, http11, fields = connection.read_head(timeouts.read)
            reusable = http11 and not answered_early
            framed = self._body(connection, method, status, fields, reusable, timeouts.read)
            response = Response(status, Headers(fields), framed)
        except BaseException:
            connection.close()
            raise
        return response

    def _write(
        self, connection: _Connection, head: bytes, body: bytes | None, timeouts: Timeouts
    ) -> bool:
        """Put the request on the wire; True if the server answered before taking all of it."""
        stream = connection.stream
        if not body:
            stream.write(head, timeouts.write)
        elif len(body) <= _INLINE_BODY_BYTES:
            stream.write(head + body, timeouts.write)
        else:
            stream.write(head, timeouts.write)
            try:
                stream.write(body, timeouts.write)
            except WriteError as exc:
                if isinstance(exc, WriteTimeout) or self._stop.is_set():
                    raise
                # The server may have answered (a 413) and closed before reading it all: that
                # answer, if it came, says more than the broken pipe.
                if not stream.readable_now():
                    raise
                return True
        return False

    def _body(
        self,
        connection: _Connection,
        method: bytes,
        status: int,
        fields: dict[str, str],
        reusable: bool,
        timeout: float,
    ) -> _Body:
        """The answer's body, framed as its head says."""
        tokens = {token.strip().lower() for token in fields.get("connection", "").split(",")}
        reusable = reusable and "close" not in tokens
        if method == b"HEAD" or status in _NO_BODY_STATUSES:
            return _Body(self, connection, timeout, 0, False, reusable)
        coding = fields.get("transfer-encoding")
        if coding is not None:
            if coding.strip().lower() != "chunked":
                raise RemoteProtocolError(f"an answer in transfer coding {coding!r}")
            # With a Content-Length too it may be smuggling: the connection ends with it (RFC
            # 9112 6.3).
            reusable = reusable and "content-length" not in fields
            return _Body(self, connection, timeout, None, True, reusable)
        declared = fields.get("content-length")
        if declared is None:
            return _Body(self, connection, timeout, None, False, False)
        lengths = {value.strip() for value in declared.split(",")}
        if len(lengths) != 1 or _DIGITS.fullmatch(length := lengths.pop()) is None:
            raise RemoteProtocolError(f"a malformed Content-Length: {declared[:40]!r}")
        return _Body(self, connection, timeout, int(length), False, reusable)

    def _route(self, origin: Origin) -> _Route:
        key = (origin.scheme, origin.host, origin.port)
        route = self._routes.get(key)
        if route is None:
            route = self._routes[key] = _proxy_route(origin, self._proxies)
        return route

    def _checkout(self, route: _Route, timeouts: Timeouts) -> _Connection:
        """An idle connection of the route fit to reuse, else a new one."""
        now = time.monotonic()
        stale: list[_Connection] = []
        found = None
        with self._lock:
            idle = self._idle.get(route.key)
            while idle:
                candidate = idle.pop()
                if now - candidate.idle_since < KEEPALIVE_SECONDS:
                    found = candidate
                    break
                stale.append(candidate)
        for connection in stale:
            connection.close()
        if found is not None:
            if not found.stream.readable_now():
                return found
            found.close()
        return self._connect(route, timeouts)

    def _connect(self, route: _Route, timeouts: Timeouts) -> _Connection:
        first = route.proxy or route.origin
        stream = _open_tcp(first.connect_host, first.port, timeouts.connect, self._stop)
        try:
            if first.scheme == "https":
                stream = stream.start_tls(self._tls(), first.connect_host, timeouts.connect)
            if route.tunnel:
                stream = self._tunnel(stream, route, timeouts)
        except BaseException:
            stream.close()
            raise
        return _Connection(stream, route)

    def _tunnel(self, stream: _SlicedStream, route: _Route, timeouts: Timeouts) -> _SlicedStream:
        """Through the proxy to the origin (CONNECT), then TLS with the origin inside it."""
        origin = route.origin
        authority = origin.authority
        headers = [(b"Host", authority)]
        if route.authorization is not None:
            headers.append((b"Proxy-Authorization", route.authorization))
        tunnel = _Connection(stream, route)
        try:
            stream.write(_request_head(b"CONNECT", authority, headers), timeouts.write)
            status, _, _ = tunnel.read_head(timeouts.read)
        except TransportError as exc:
            raise ProxyError(f"the proxy did not open a tunnel: {exc}") from exc
        if not 200 <= status < 300 or tunnel.has_unread:
            raise ProxyError(f"the proxy refused a tunnel to {authority.decode()}: HTTP {status}")
        return stream.start_tls(self._tls(), origin.connect_host, timeouts.connect)

    def _tls(self) -> ssl.SSLContext:
        with self._lock:
            if self._ssl is None:
                self._ssl = _ssl_context()
            return self._ssl

    def release(self, connection: _Connection) -> None:
        """A connection whose answer was read to its end: kept for the next request."""
        connection.idle_since = time.monotonic()
        with self._lock:
            idle = self._idle.setdefault(connection.route.key, [])
            if not self._closed and len(idle) < MAX_IDLE_CONNECTIONS:
                idle.append(connection)
                return
        connection.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, {}
        for connections in idle.values():
            for connection in connections:
                connection.close()
