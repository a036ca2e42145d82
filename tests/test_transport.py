"""The HTTP/1.1 transport against scripted servers on loopback: each server reads requests off a
real socket and answers with exactly the bytes a test gives it (framings the local platform does
not use, answers that are not HTTP, a proxy), so what the transport makes of them is seen
byte for byte. The platform client's behaviour over it is in test_platform.py and
test_hostile_platform.py (the local platform), test_transport_tls.py (TLS)."""

from __future__ import annotations

import contextlib
import gzip
import os
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterator

import pytest

from evalpush import errors
from evalpush.transport import (
    KEEPALIVE_SECONDS,
    MAX_HEAD_BYTES,
    ConnectError,
    LocalProtocolError,
    Origin,
    ProxyError,
    RemoteProtocolError,
    Response,
    StoppableTransport,
    Timeouts,
    UnsupportedProtocol,
)

TIMEOUTS = Timeouts(connect=5.0, read=5.0, write=5.0)
JOIN_SECONDS = 5.0

Script = Callable[["Exchange"], None]
"""What the server does on one connection."""


class Exchange:
    """One accepted connection, seen from the server: read a request, write bytes."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self._buffer = b""

    def request(self) -> bytes:
        """The next request's head and its Content-Length body (b"" once the client closed)."""
        while b"\r\n\r\n" not in self._buffer:
            data = self.conn.recv(65536)
            if not data:
                return b""
            self._buffer += data
        head, _, self._buffer = self._buffer.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(self._buffer) < length:
            self._buffer += self.conn.recv(65536)
        body, self._buffer = self._buffer[:length], self._buffer[length:]
        return head + b"\r\n\r\n" + body

    def send(self, data: bytes) -> None:
        self.conn.sendall(data)


class Server:
    """A loopback listener; connection number n (from 0) is handled by `scripts[n]`, the last
    script serving every later one. `requests` holds every request head read, in order."""

    def __init__(self, *scripts: Script) -> None:
        self._scripts = scripts
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.connections = 0
        self._done = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, name="scripted-server")
        self._accepting.start()

    @property
    def port(self) -> int:
        return self._listener.getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._done.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            script = self._scripts[min(self.connections, len(self._scripts) - 1)]
            self.connections += 1
            thread = threading.Thread(target=self._handle, args=(conn, script), daemon=True)
            self._threads.append(thread)
            thread.start()

    @staticmethod
    def _handle(conn: socket.socket, script: Script) -> None:
        conn.settimeout(JOIN_SECONDS)
        with conn:
            try:
                script(Exchange(conn))
            except OSError:
                pass  # the client went away: what it made of it is the test's to check

    def close(self) -> None:
        self._done.set()
        self._accepting.join(JOIN_SECONDS)
        for thread in self._threads:
            thread.join(JOIN_SECONDS)
        self._listener.close()


@pytest.fixture
def serve() -> Iterator[Callable[..., Server]]:
    servers: list[Server] = []

    def start(*scripts: Script) -> Server:
        servers.append(Server(*scripts))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


@pytest.fixture
def transport() -> Iterator[StoppableTransport]:
    made = StoppableTransport(threading.Event())
    yield made
    made.close()


def get(transport: StoppableTransport, url: str, path: bytes = b"/x") -> Response:
    origin = Origin.of(url)
    return transport.send(b"GET", origin, path, [(b"Host", origin.host_header)], None, TIMEOUTS)


def body_of(response: Response) -> bytes:
    try:
        return b"".join(response.iter_bytes())
    finally:
        response.close()


def answering(*answers: bytes) -> Script:
    """Read a request, send the next answer, for each answer in turn; then wait for the close."""

    def script(exchange: Exchange) -> None:
        for answer in answers:
            if not exchange.request():
                return
            exchange.send(answer)
        exchange.request()

    return script


def once(answer: bytes) -> Script:
    """Read a request, send `answer`, hang up (without saying so in the answer)."""

    def script(exchange: Exchange) -> None:
        exchange.request()
        exchange.send(answer)

    return script


def ok(body: bytes, *headers: bytes) -> bytes:
    extra = b"".join(h + b"\r\n" for h in headers)
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


class TestFraming:
    def test_a_content_length_answer_is_read_whole_and_its_connection_reused(
        self, serve: Callable[..., Server], transport: StoppableTransport
    ) -> None:
        server = serve(answering(ok(b'{"a": 1}'), ok(b'{"b": 2}')))
        assert body_of(get(transport, server.url)) == b'{"a": 1}'
        assert body_of(get(transport, server.url)) == b'{"b": 2}'
        assert server.connections == 1

    def test_a_chunked_answer_with_extensions_and_trailers_is_read_and_reused(
        self, serve: Callable[..., Server], transport: StoppableTransport
    ) -> None:
        chunked = (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b'4;name=value\r\n{"a"\r\n6\r\n: 123}\r\n0\r\nX-Trailer: yes\r\n\r\n'
        )
        server = serve(answering(chunked, ok(b"next")))
        assert body_of(get(transport, server.url)) == b'{"a": 123}'
        assert body_of(get(transport, server.url)) == b"next"
        assert server.connections == 1

    def test_an_answer_read_to_the_close_is_whole_and_the_connection_not_kept(
        self, serve: Callable[..., Server], transport: StoppableTransport
    ) -> None:
        server = serve(once(b"HTTP/1.1 200 OK\r\n\r\nall of it"))
        assert body_of(get(transport, server.url)) == b"all of it"
        assert body_of(get(transport, server.url)) == b"all of it"
        assert server.connections == 2

    def test_connection_close_and_http_1_0_answers_are_not_kept(
        self, serve: Callable[..., Server], transport: StoppableTransport
    ) -> None:
        server = serve(
            answering(ok(b"a", b"Connection: close")),
            answering(b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nb"),
            answering(ok(b"c")),
        )
        assert [body_of(get(transport, server.url)) for _ in range(3)] == [b"a", b"b", b"c"]
        assert server.connections == 3

    def test_interim_answers_are_skipped(
        self, serve: Callable[..., Server], transport: StoppableTransport
    ) -> None:
        server = serve(answering(b"HTTP/1.1 100 Continue\r\n\r\n" + ok(b"done")))
        assert body_of(get(transport, server.url)) == b"done"

    def test_a_204_has_no_body_and_its_connection_is_reused(
        self, serve: Callable[..., Server], transport: StoppableTransport
    ) -> None:
        server = serve(answering(b"HTTP/1.1 204 No Content\r\n\r\n", ok(b"x")))
        response = get(transport, server.url)
        assert response.status_code == 204 and body_of(response) == b""
        assert body_of(get(transport, server.url)) == b"x"
        assert server.connections == 1

    @pytest.mark.parametrize(
        ("encoding", "encode"),
        [
            (b"gzip", gzip.compress),
            (b"deflate", zlib.compress),  # as the RFC says: zlib-wrapped
            (b"deflate", lambda data: zlib.compress(data)[2:-4]),  # raw, as some servers send
        ],
    )
    def test_a_compressed_answer_is_decoded(
        self,
        serve: Callable[..., Server],
        transport: StoppableTransport,
        encoding: bytes,
        encode: Callable[[bytes], bytes],
    ) -> None:
        plain = b'{"samples": []}' * 1000
        server = serve(answering(ok(encode(plain), b"Content-Encoding: " + encoding)))
        assert body_of(get(transport, server.url)) == plain

    def test_a_compressed_answer_is_decoded_in_bounded_steps(
        self, serve: Callable[..., Server], transport: StoppableTransport
    ) -> None:
        """64 MiB of zeros in ~64 KiB of gzip: each piece handed out is at most 64 KiB, so the
        caller's byte cap stops it long before it is all inflated."""
        bomb = gzip.compress(bytes(64 * 1024 * 1024))
        server = serve(answering(ok(bomb, b"Content-Encoding: gzip")))
        response = get(transport, server.url)
        pieces = response.iter_bytes()
        sizes = [len(next(pieces)) for _ in range(4)]
        response.close()
        assert 0 < max(sizes) <= 64 * 1024

    def test_an_incompressible_gzip_answer_is_decoded(
        self, serve: Callable[..., Server], transport: StoppableTransport
    ) -> None:
        """Random bytes gzip into stored blocks, a little longer than they decode to."""
        plain = os.urandom(1024 * 1024)
        server = serve(answering(ok(gzip.compress(plain), b"Content-Encoding: gzip")))
        assert body_of(get(transport, server.url)) == plain

    def test_endless_empty_deflate_blocks_are_refused_long_before_the_deadline(
        self, serve: Callable[..., Server], transport: StoppableTransport
    ) -> None:
        """Empty stored blocks decode to nothing, so no byte cap would ever stop them."""

        def endless(exchange: Exchange) -> None:
            exchange.request()
            exchange.send(
                b"HTTP/1.1 200 OK\r\nContent-Encoding: deflate\r\nTransfer-Encoding: chunked\r\n\r\n"
            )
            empty_blocks = b"\x00\x00\x00\xff\xff" * 2000
            while True:  # until the client hangs up
                exchange.send(b"%x\r\n%s\r\n" % (len(empty_blocks), empty_blocks))

        server = serve(endless)
        started = time.monotonic()
        response = get(transport, server.url)
        with pytest.raises(RemoteProtocolError, match="far more than it puts out"):
            body_of(response)
        assert time.monotonic() - started < TIMEOUTS.read


class TestMalformedAnswers:
    @pytest.mark.parametrize(
        ("answer", "says"),
        [
            (b"SSH-2.0-OpenSSH\r\n\r\n", "not an HTTP/1.x status line"),
            (b"HTTP/1.1 2000 OK\r\n\r\n", "not an HTTP/1.x status line"),
            (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "malformed header line"),
            (b"HTTP/1.1 200 OK\r\n folded: header\r\n\r\n", "malformed header line"),
            (b"HTTP/1.1 200 OK\r\nContent-Length: 1, 2\r\n\r\nab", "malformed Content-Length"),
            (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "malformed Content-Length"),
            (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", "transfer coding"),
            (b"HTTP/1.1 101 Switching\r\n\r\n", "switched protocols"),
        ],
    )
    def test_an_answer_that_is_not_http_is_a_protocol_error(
        self,
        serve: Callable[..., Server],
        transport: StoppableTransport,
        answer: bytes,
        says: str,
    ) -> None:
        server = serve(answering(answer))
        with pytest.raises(RemoteProtocolError, match=says):
            get(transport, server.url)

    @pytest.mark.parametrize(
        ("answer", "says"),
        [
            (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort", "95 bytes of the body"),
            (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nabc", "mid-chunk"),
            (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "chunk size"),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nContent-Encoding: br\r\n\r\nabcd",
                "encoded as 'br'",
            ),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nContent-Encoding: gzip\r\n\r\nabcd",
                "does not decode as gzip",
            ),
        ],
    )
    def test_a_body_cut_short_or_malformed_is_a_protocol_error(
        self,
        serve: Callable[..., Server],
        transport: StoppableTransport,
        answer: bytes,
        says: str,
    ) -> None:
        server = serve(once(answer))
        response = get(transport, server.url)
        with pytest.raises(RemoteProtocolError, match=says):
            body_of(response)

    def test_a_head_that_never_ends_is_refused_at_its_bound(
        self, serve: Callable[..., Server], transport: StoppableTransport
    ) -> None:
        def endless_head(exchange: Exchange) -> None:
            exchange.request()
            exchange.send(b"HTTP/1.1 200 OK\r\n")
            for _ in range(10_000):  # far past the bound, unless the client hung up
                exchange.send(b"X-Filler: " + b"y" * 1000 + b"\r\n")

        server = serve(endless_head)
        with pytest.raises(RemoteProtocolError, match=f"more than {MAX_HEAD_BYTES} bytes"):
            get(transport, server.url)

    def test_a_server_that_closes_without_answering_is_ambiguous(
        self, serve: Callable[..., Server], transport: StoppableTransport
    ) -> None:
        def hang_up(exchange: Exchange) -> None:
            exchange.request()

        server = serve(hang_up)
        with pytest.raises(RemoteProtocolError, match="without answering") as raised:
            get(transport, server.url)
        assert isinstance(errors.from_transport_error(raised.value, what="x"), errors.Ambiguous)


class TestConnections:
    def test_an_idle_connection_the_server_closed_is_not_used_again(
        self, serve: Callable[..., Server], transport: StoppableTransport
    ) -> None:
        """The server closes after its first answer without saying so: the next request must
        go on a new connection, not fail on the dead one (which would be ambiguous)."""
        server = serve(once(ok(b"first")), answering(ok(b"second")))
        assert body_of(get(transport, server.url)) == b"first"
        time.sleep(0.2)  # the server's close arrives
        assert body_of(get(transport, server.url)) == b"second"
        assert server.connections == 2

    def test_a_body_not_read_to_its_end_takes_its_connection_with_it(
        self, serve: Callable[..., Server], transport: StoppableTransport
    ) -> None:
        server = serve(answering(ok(b"x" * 100_000)), answering(ok(b"y")))
        response = get(transport, server.url)
        next(response.iter_bytes())
        response.close()
        assert body_of(get(transport, server.url)) == b"y"
        assert server.connections == 2

    def test_an_idle_connection_past_keepalive_is_not_reused(
        self,
        serve: Callable[..., Server],
        transport: StoppableTransport,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        server = serve(answering(ok(b"a"), ok(b"b")))
        assert body_of(get(transport, server.url)) == b"a"
        later = time.monotonic() + KEEPALIVE_SECONDS + 1
        monkeypatch.setattr("evalpush.transport.time.monotonic", lambda: later)
        assert body_of(get(transport, server.url)) == b"a"
        assert server.connections == 2

    def test_a_refused_connection_is_a_connect_error(self, transport: StoppableTransport) -> None:
        unused = socket.create_server(("127.0.0.1", 0))
        port = unused.getsockname()[1]
        unused.close()
        with pytest.raises(ConnectError) as raised:
            get(transport, f"http://127.0.0.1:{port}")
        assert isinstance(errors.from_transport_error(raised.value, what="x"), errors.Unreachable)

    def test_a_413_answered_before_a_large_body_was_read_is_the_answer(
        self, serve: Callable[..., Server], transport: StoppableTransport
    ) -> None:
        """A server refusing a body by its Content-Length answers at once and hangs up; the
        broken pipe that follows is not what the exchange came to."""

        def refuse_early(exchange: Exchange) -> None:
            data = b""
            while b"\r\n\r\n" not in data:
                data += exchange.conn.recv(65536)
            exchange.send(b"HTTP/1.1 413 Too Large\r\nContent-Length: 8\r\n\r\ntoo big!")
            exchange.conn.shutdown(socket.SHUT_WR)
            time.sleep(0.5)  # what arrived meanwhile is dropped with the socket

        server = serve(refuse_early)
        origin = Origin.of(server.url)
        body = b"x" * (32 * 1024 * 1024)
        headers = [(b"Host", origin.host_header), (b"Content-Length", b"%d" % len(body))]
        response = transport.send(b"POST", origin, b"/s", headers, body, TIMEOUTS)
        assert response.status_code == 413
        assert body_of(response) == b"too big!"


class TestRequests:
    @pytest.mark.parametrize(
        "header",
        [
            (b"Authorization", b"Bearer k\r\nX-Injected: 1"),
            (b"Authorization", b"Bearer k\x00"),
            (b"Bad Name", b"v"),
        ],
    )
    def test_a_header_that_would_split_the_request_is_never_sent(
        self, serve: Callable[..., Server], transport: StoppableTransport, header: tuple
    ) -> None:
        server = serve(answering(ok(b"")))
        origin = Origin.of(server.url)
        with pytest.raises(LocalProtocolError):
            transport.send(
                b"GET", origin, b"/", [(b"Host", origin.host_header), header], None, TIMEOUTS
            )
        assert server.connections == 0

    def test_the_request_carries_its_head_and_body_as_given(
        self, serve: Callable[..., Server], transport: StoppableTransport
    ) -> None:
        seen: list[bytes] = []

        def record(exchange: Exchange) -> None:
            seen.append(exchange.request())
            exchange.send(ok(b""))

        server = serve(record)
        origin = Origin.of(server.url)
        headers = [(b"Host", origin.host_header), (b"Content-Length", b"2")]
        body_of(transport.send(b"POST", origin, b"/a?b=c", headers, b"{}", TIMEOUTS))
        assert seen == [
            b"POST /a?b=c HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Length: 2\r\n\r\n{}"
            % server.port
        ]


PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


@contextlib.contextmanager
def proxied(monkeypatch: pytest.MonkeyPatch, **variables: str) -> Iterator[StoppableTransport]:
    """A transport built under exactly these proxy variables (the others unset)."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    transport = StoppableTransport(threading.Event())
    try:
        yield transport
    finally:
        transport.close()


def recording(seen: list[bytes], answer: bytes) -> Script:
    """Note each request whole, answer `answer`."""

    def script(exchange: Exchange) -> None:
        seen.append(exchange.request())
        exchange.send(answer)

    return script


class TestProxies:
    def test_an_http_url_is_asked_of_the_proxy_in_absolute_form_with_its_credentials(
        self, serve: Callable[..., Server], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        seen: list[bytes] = []
        server = serve(recording(seen, ok(b"via proxy")))
        proxy = f"http://user:p%40ss@127.0.0.1:{server.port}"
        with proxied(monkeypatch, HTTP_PROXY=proxy) as transport:
            assert body_of(get(transport, "http://platform.test:8080", b"/api")) == b"via proxy"
        (request,) = seen
        assert request.startswith(b"GET http://platform.test:8080/api HTTP/1.1\r\n")
        assert b"\r\nProxy-Authorization: Basic dXNlcjpwQHNz\r\n" in request  # user:p@ss

    def test_a_proxy_password_without_a_user_is_sent_as_curl_sends_it(
        self, serve: Callable[..., Server], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        seen: list[bytes] = []
        server = serve(recording(seen, ok(b"")))
        proxy = f"http://:secret@127.0.0.1:{server.port}"
        with proxied(monkeypatch, HTTP_PROXY=proxy) as transport:
            body_of(get(transport, "http://platform.test"))
        assert b"\r\nProxy-Authorization: Basic OnNlY3JldA==\r\n" in seen[0]  # ":secret"

    @pytest.mark.parametrize(
        "variables",
        [
            {"HTTP_PROXY": "http://127.0.0.1:9", "NO_PROXY": "127.0.0.1"},  # 9: nothing listens
            {"ALL_PROXY": "socks5://127.0.0.1:9"},  # for curl and git: not ours to use
        ],
        ids=["NO_PROXY", "a socks ALL_PROXY"],
    )
    def test_the_platform_is_reached_directly(
        self,
        serve: Callable[..., Server],
        monkeypatch: pytest.MonkeyPatch,
        variables: dict[str, str],
    ) -> None:
        server = serve(answering(ok(b"direct")))
        with proxied(monkeypatch, **variables) as transport:
            assert body_of(get(transport, server.url)) == b"direct"

    @pytest.mark.parametrize(
        ("host", "no_proxy"),
        [
            # Fullwidth letters: IDNA (UTS 46) spells the name localhost.
            ("ｌｏｃａｌｈｏｓｔ", "localhost"),
            ("localhost", "ｌｏｃａｌｈｏｓｔ"),
            ("localhost", ".ＬＯＣＡＬＨＯＳＴ"),  # a leading dot, upper case: mapped as well
        ],
        ids=["unicode URL, ASCII NO_PROXY", "ASCII URL, unicode NO_PROXY", "a domain"],
    )
    def test_no_proxy_names_a_host_whichever_way_either_spells_it(
        self,
        serve: Callable[..., Server],
        monkeypatch: pytest.MonkeyPatch,
        host: str,
        no_proxy: str,
    ) -> None:
        """NO_PROXY names the host the request goes to: a name that is not ASCII is that host
        in its IDNA spelling (`bücher.example` is `xn--bcher-kva.example`), so either spelling,
        in the URL or in NO_PROXY, keeps the request off the proxy (the platform's key with it,
        for an http URL)."""
        seen: list[bytes] = []
        proxy = serve(recording(seen, ok(b"via proxy")))
        server = serve(answering(ok(b"direct")))
        variables = {"HTTP_PROXY": f"http://127.0.0.1:{proxy.port}", "NO_PROXY": no_proxy}
        with proxied(monkeypatch, **variables) as transport:
            assert body_of(get(transport, f"http://{host}:{server.port}")) == b"direct"
        assert seen == []

    def test_a_tunnel_the_proxy_refuses_is_unreachable_not_ambiguous(
        self, serve: Callable[..., Server], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        seen: list[bytes] = []
        refused = b"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n"
        server = serve(recording(seen, refused))
        with proxied(monkeypatch, HTTPS_PROXY=f"http://127.0.0.1:{server.port}") as transport:
            with pytest.raises(ProxyError, match="HTTP 407") as raised:
                get(transport, "https://platform.test")
        assert seen[0].startswith(b"CONNECT platform.test:443 HTTP/1.1\r\nHost: platform.test:443")
        assert isinstance(errors.from_transport_error(raised.value, what="x"), errors.Unreachable)

    def test_an_https_proxy_for_an_https_platform_is_refused_as_unsendable(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """TLS inside TLS is not supported: said at once, not waited on as an outage."""
        with proxied(monkeypatch, HTTPS_PROXY="https://127.0.0.1:9") as transport:
            with pytest.raises(UnsupportedProtocol, match="TLS inside TLS") as raised:
                get(transport, "https://platform.test")
        assert isinstance(errors.from_transport_error(raised.value, what="x"), errors.Unsendable)


@pytest.mark.parametrize("url", ["http://host:0", "ftp://host", "http://", "http://a b"])
def test_a_url_that_names_no_place_to_connect_to_is_refused(url: str) -> None:
    with pytest.raises(ValueError):
        Origin.of(url)
