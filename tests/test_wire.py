"""The platform client's HTTP (httpx over sliced sockets) against scripted servers on loopback:
answers that are not HTTP, answers left over on a kept-alive connection, a stop while the server
says nothing, proxies, redirects, plain http to an address that is not loopback. Every case
goes through the platform client as a whole: what a caller sees is a classified error, never a
crash, a hang, or another request's answer. TLS is in test_wire_tls.py."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from evalpush.client import UNUSABLE_ANSWER_ATTEMPTS, PlatformClient, Retrier, wire
from evalpush.config import PlatformConfig
from evalpush.core import errors
from support.scripted import Exchange, Server, answering, ok, once, recording

SAFETY_SECONDS = 10.0
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")
RUNNING = orjson.dumps({"id": "e1", "status": "RUNNING"})


@pytest.fixture
def serve() -> Iterator[Callable[..., Server]]:
    servers: list[Server] = []

    def start(*scripts: Callable[[Exchange], None]) -> Server:
        servers.append(Server(*scripts))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


@pytest.fixture
def client_for(tmp_path: Path) -> Iterator[Callable[..., PlatformClient]]:
    """`client_for(url, stop=None, **settings)`: a platform client of that base URL."""
    clients: list[PlatformClient] = []

    def make(url: str, stop: threading.Event | None = None, **settings: Any) -> PlatformClient:
        settings.setdefault("read_timeout_seconds", 5.0)
        environ = {"PRIME_API_KEY": "k-wire-1234", "PRIME_API_BASE_URL": url}
        clients.append(
            PlatformClient(PlatformConfig(**settings), environ=environ, home=tmp_path, stop=stop)
        )
        return clients[-1]

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def no_proxies(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    return monkeypatch


def chunked(*pieces: bytes, headers: bytes = b"") -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
    return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n" + headers + b"\r\n" + body


NOT_HTTP = {
    "an SSH banner": b"SSH-2.0-OpenSSH\r\n\r\n",
    "a status of four digits": b"HTTP/1.1 2000 OK\r\n\r\n",
    "a status under 100": b"HTTP/1.1 099 Odd\r\nContent-Length: 2\r\n\r\n{}",
    "a header without a colon": b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
    "a folded header first": b"HTTP/1.1 200 OK\r\n folded: header\r\n\r\n",
    "two Content-Lengths": b"HTTP/1.1 200 OK\r\nContent-Length: 1, 2\r\n\r\nab",
    "a negative Content-Length": b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
    "a Latin-1 digit Content-Length": b"HTTP/1.1 200 OK\r\nContent-Length: \xb2\r\n\r\n{}",
    "a transfer coding not chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
    "a protocol switch unasked": b"HTTP/1.1 101 Switching\r\nUpgrade: x\r\n\r\n",
    "a body cut short": b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{}",
    "a chunk cut short": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nabc",
    "a malformed chunk size": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    "a gzip body that is not gzip": (
        b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nContent-Encoding: gzip\r\n\r\nabcd"
    ),
    "an encoding not asked for": (
        b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nContent-Encoding: br\r\n\r\nabcd"
    ),
    "a Latin-1 Content-Length beside chunked": chunked(
        b'{"id": "e1"}', headers=b"Content-Length: \xb2\r\n"
    ),
}


class TestMalformedAnswers:
    @pytest.mark.parametrize("answer", NOT_HTTP.values(), ids=NOT_HTTP.keys())
    @pytest.mark.parametrize("step", ["finalize", "read"])
    def test_an_answer_that_is_not_http_is_a_classified_error(
        self,
        serve: Callable[..., Server],
        client_for: Callable[..., PlatformClient],
        answer: bytes,
        step: str,
    ) -> None:
        """A write's malformed answer is Ambiguous (the work may be done: reconcile); a read's
        merely Transient. Never another exception, never a hang."""
        client = client_for(serve(once(answer)).url)
        call = client.finalize if step == "finalize" else client.get_evaluation
        started = time.monotonic()
        with pytest.raises(errors.Transient) as raised:
            call("e1", {}) if step == "finalize" else call("e1")  # type: ignore[call-arg]
        if step == "finalize":
            assert isinstance(raised.value, errors.Ambiguous), raised.value
        assert time.monotonic() - started < SAFETY_SECONDS

    def test_a_head_that_never_ends_is_refused_at_its_bound(
        self, serve: Callable[..., Server], client_for: Callable[..., PlatformClient]
    ) -> None:
        def endless_head(exchange: Exchange) -> None:
            exchange.request()
            exchange.send(b"HTTP/1.1 200 OK\r\n")
            for _ in range(10_000):  # far past the bound, unless the client hung up
                exchange.send(b"X-Filler: " + b"y" * 1000 + b"\r\n")

        client = client_for(serve(endless_head).url)
        with pytest.raises(errors.Ambiguous, match="RemoteProtocolError"):
            client.finalize("e1", {})

    def test_a_server_that_closes_without_answering_is_ambiguous(
        self, serve: Callable[..., Server], client_for: Callable[..., PlatformClient]
    ) -> None:
        client = client_for(serve(lambda exchange: exchange.request() and None).url)
        with pytest.raises(errors.Ambiguous, match="without sending a response"):
            client.finalize("e1", {})

    def test_interim_answers_forever_end_at_the_deadline(
        self, serve: Callable[..., Server], client_for: Callable[..., PlatformClient]
    ) -> None:
        def interim_forever(exchange: Exchange) -> None:
            exchange.request()
            while True:
                exchange.send(b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n")
                time.sleep(0.05)

        client = client_for(serve(interim_forever).url, request_deadline_seconds=1.0)
        started = time.monotonic()
        with pytest.raises(errors.Ambiguous, match="deadline"):
            client.finalize("e1", {})
        assert time.monotonic() - started < SAFETY_SECONDS

    @pytest.mark.parametrize(
        "answer",
        [
            b"HTTP/1.1 401 Unauthorized\r\nContent-Encoding: gzip\r\nContent-Length: 4\r\n\r\nxxxx",
            b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 100\r\n\r\n{}",  # then the close
        ],
        ids=["a body that does not decode", "a body cut short"],
    )
    def test_an_error_status_stands_whatever_its_body(
        self,
        serve: Callable[..., Server],
        client_for: Callable[..., PlatformClient],
        answer: bytes,
    ) -> None:
        """The status of an error answer is the platform's word; its body only decorates the
        message (a 401 read as a broken exchange would be retried, never paused on)."""
        client = client_for(serve(once(answer)).url)
        with pytest.raises(errors.AuthError):
            client.resolve_environment("gsm8k")

    def test_a_redirect_is_not_followed(
        self, serve: Callable[..., Server], client_for: Callable[..., PlatformClient]
    ) -> None:
        elsewhere: list[bytes] = []
        other = serve(recording(elsewhere, ok(b"{}")))
        moved = b"HTTP/1.1 307 Moved\r\nLocation: %s/api/v1/x\r\nContent-Length: 0\r\n\r\n"
        client = client_for(serve(answering(moved % other.url.encode())).url)
        with pytest.raises(errors.Refused, match="HTTP 307"):
            client.finalize("e1", {})
        assert elsewhere == []


class TestConnections:
    def test_an_answer_sent_twice_is_never_taken_for_the_next_requests(
        self, serve: Callable[..., Server], client_for: Callable[..., PlatformClient]
    ) -> None:
        """A server that sends a second answer with the first: h11 would keep the extra bytes
        and give them as the answer to the next request on the connection. No connection
        carries a second request, so the extra answer is never read."""
        other = orjson.dumps({"id": "e-OTHER", "status": "COMPLETED"})

        def doubled(exchange: Exchange) -> None:
            exchange.request()
            exchange.send(ok(RUNNING) + ok(other))
            while exchange.request():
                exchange.send(ok(other))

        server = serve(doubled, doubled, doubled)
        client = client_for(server.url)
        assert [client.get_evaluation("e1").id for _ in range(3)] == ["e1"] * 3
        assert server.connections == 3

    def test_bytes_arriving_on_an_idle_connection_retire_it(
        self, serve: Callable[..., Server], client_for: Callable[..., PlatformClient]
    ) -> None:
        answered, repeated = threading.Event(), threading.Event()

        def repeats(exchange: Exchange) -> None:
            exchange.request()
            exchange.send(ok(RUNNING))
            answered.wait(SAFETY_SECONDS)
            exchange.send(ok(orjson.dumps({"id": "e-OTHER"})))  # an answer again, late
            repeated.set()
            while exchange.request():
                exchange.send(ok(orjson.dumps({"id": "e-OTHER"})))

        server = serve(repeats, answering(ok(RUNNING)))
        client = client_for(server.url)
        assert client.get_evaluation("e1").id == "e1"
        answered.set()
        assert repeated.wait(SAFETY_SECONDS)
        time.sleep(0.05)  # let the repeated answer reach the client's socket
        assert client.get_evaluation("e1").id == "e1"
        assert server.connections == 2

    def test_no_request_shares_a_connection(
        self, serve: Callable[..., Server], client_for: Callable[..., PlatformClient]
    ) -> None:
        """Every request, read or write, gets a connection of its own, so no answer left on a
        connection can be read as another's (reads decide what is written)."""

        def platform(exchange: Exchange) -> None:
            while request := exchange.request():
                path = request.split(b" ", 2)[1]
                if path.endswith(b"/resolve"):
                    exchange.send(ok(b'{"data": {"id": "env-1"}}'))
                elif path.endswith(b"/samples"):
                    exchange.send(ok(b'{"accepted": 1}'))
                elif path.endswith(b"/finalize"):
                    exchange.send(ok(b'{"evaluation_id": "e1", "status": "COMPLETED"}'))
                elif path.endswith(b"/evaluations/"):
                    exchange.send(ok(b'{"evaluation_id": "e1"}'))
                else:
                    exchange.send(ok(RUNNING))

        server = serve(platform)
        client = client_for(server.url)
        client.resolve_environment("gsm8k")
        client.get_evaluation("e1")
        assert server.connections == 2
        client.create_evaluation({"name": "n"})
        client.push_samples("e1", b'{"samples": [{"sample_id": 1}]}')
        client.finalize("e1", {})
        client.get_evaluation("e1")
        assert server.connections == 6

    def test_threads_sharing_one_client_never_read_each_others_answers(
        self, serve: Callable[..., Server], client_for: Callable[..., PlatformClient]
    ) -> None:
        """Each answer echoes its request's evaluation id: an answer read by the wrong thread,
        or a connection handed to two at once, shows as a mismatch or an error."""

        def echo(exchange: Exchange) -> None:
            while request := exchange.request():
                evaluation_id = request.split(b" ", 2)[1].rsplit(b"/", 1)[1]
                answer = orjson.dumps({"id": evaluation_id.decode(), "status": "RUNNING"})
                if evaluation_id.endswith(b"7"):
                    exchange.send(ok(answer, b"Connection: close"))
                    return
                exchange.send(ok(answer))

        client = client_for(serve(echo).url)
        failures: list[BaseException] = []

        def worker(n: int) -> None:
            try:
                for i in range(60):
                    assert client.get_evaluation(f"t{n}-{i}").id == f"t{n}-{i}"
            except BaseException as exc:  # handed to the test thread
                failures.append(exc)

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(SAFETY_SECONDS * 3)
        assert failures == []


class TestStop:
    @pytest.mark.parametrize("phase", ["head", "body"])
    def test_a_stop_ends_a_silent_server_within_a_slice(
        self,
        serve: Callable[..., Server],
        client_for: Callable[..., PlatformClient],
        phase: str,
    ) -> None:
        def silent(exchange: Exchange) -> None:
            exchange.request()
            if phase == "body":
                exchange.send(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{")
            time.sleep(3)

        stop = threading.Event()
        client = client_for(serve(silent).url, stop=stop, read_timeout_seconds=60)
        threading.Timer(0.3, stop.set).start()
        started = time.monotonic()
        with pytest.raises(errors.Interrupted):
            client.finalize("e1", {})
        assert time.monotonic() - started < 0.3 + wire.SLICE_SECONDS + 1.0


class TestProxies:
    @pytest.mark.parametrize(
        "variables",
        [
            {"HTTP_PROXY": "{proxy}"},
            {"ALL_PROXY": "{proxy}"},
            {"HTTP_PROXY": "{proxy}", "NO_PROXY": "example.com"},
        ],
        ids=["HTTP_PROXY", "ALL_PROXY", "HTTP_PROXY with an unrelated NO_PROXY"],
    )
    def test_a_plain_http_platform_is_never_proxied(
        self,
        serve: Callable[..., Server],
        client_for: Callable[..., PlatformClient],
        no_proxies: pytest.MonkeyPatch,
        variables: dict[str, str],
    ) -> None:
        """The key would reach the proxy in clear text: plain http always goes direct."""
        seen: list[bytes] = []
        proxy = serve(recording(seen, ok(b'{"data": {"id": "via-proxy"}}')))
        for name, value in variables.items():
            no_proxies.setenv(name, value.format(proxy=proxy.url))
        server = serve(answering(ok(b'{"data": {"id": "env-1"}}')))
        assert client_for(server.url).resolve_environment("gsm8k") == "env-1"
        assert seen == [] and proxy.connections == 0

    def test_a_tunnel_the_proxy_refuses_is_unreachable_and_names_no_password(
        self,
        serve: Callable[..., Server],
        client_for: Callable[..., PlatformClient],
        no_proxies: pytest.MonkeyPatch,
    ) -> None:
        seen: list[bytes] = []
        refused = b"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n"
        proxy = serve(recording(seen, refused))
        no_proxies.setenv("HTTPS_PROXY", f"http://user:Pr0xyS3cretPw@127.0.0.1:{proxy.port}")
        with pytest.raises(errors.Unreachable) as raised:
            client_for("https://platform.test").probe()
        assert seen[0].startswith(b"CONNECT platform.test:443 HTTP/1.1\r\n")
        assert b"Authorization: Bearer" not in seen[0]
        assert "Pr0xyS3cretPw" not in str(raised.value)

    def test_an_https_platform_named_in_no_proxy_is_reached_directly(
        self,
        serve: Callable[..., Server],
        client_for: Callable[..., PlatformClient],
        no_proxies: pytest.MonkeyPatch,
    ) -> None:
        seen: list[bytes] = []
        proxy = serve(recording(seen, ok(b"{}")))
        no_proxies.setenv("HTTPS_PROXY", proxy.url)
        no_proxies.setenv("NO_PROXY", "example.com, 127.0.0.1")
        listener = socket.create_server(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        listener.close()  # nothing listens there now: a direct connect is refused
        with pytest.raises(errors.Unreachable, match="ConnectError"):
            client_for(f"https://127.0.0.1:{port}").probe()
        assert seen == [] and proxy.connections == 0

    def test_a_socks_all_proxy_is_left_to_the_tools_it_is_for(
        self, client_for: Callable[..., PlatformClient], no_proxies: pytest.MonkeyPatch
    ) -> None:
        """curl and git read ALL_PROXY as socks; without socksio httpx would fail to start."""
        no_proxies.setenv("ALL_PROXY", "socks5://127.0.0.1:9")
        listener = socket.create_server(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        listener.close()  # nothing listens there now: a direct connect is refused
        with pytest.raises(errors.Unreachable, match="ConnectError"):
            client_for(f"https://127.0.0.1:{port}").probe()


class TestPlainHttpGoesOnlyToLoopback:
    def test_a_name_that_resolves_to_no_loopback_address_is_refused_before_a_connect(
        self, client_for: Callable[..., PlatformClient], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """`http://anything.localhost` is loopback only once it resolves to one. The resolver
        (the host's DNS, out of a test's reach) is made to say 192.0.2.1, an address nothing
        answers at: a connect would hang to its timeout; the refusal comes first."""
        real = socket.getaddrinfo

        def resolve(host: str, port: Any, *args: Any, **kwargs: Any) -> Any:
            if host == "evil.localhost":
                return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("192.0.2.1", port))]
            return real(host, port, *args, **kwargs)

        monkeypatch.setattr(wire.socket, "getaddrinfo", resolve)
        client = client_for("http://evil.localhost:8080", connect_timeout_seconds=60)
        started = time.monotonic()
        with pytest.raises(errors.Unsendable, match="no loopback address"):
            client.probe()
        assert time.monotonic() - started < SAFETY_SECONDS

    def test_a_name_that_resolves_to_loopback_is_reached(
        self, serve: Callable[..., Server], client_for: Callable[..., PlatformClient]
    ) -> None:
        server = serve(answering(ok(b'{"data": {"id": "env-1"}}')))
        assert client_for(f"http://localhost:{server.port}").resolve_environment("g") == "env-1"


class TestAnswersBeforeTheRequest:
    def test_a_server_answering_before_reading_the_request_fails_the_call_after_bounded_tries(
        self,
        serve: Callable[..., Server],
        client_for: Callable[..., PlatformClient],
        make_retrier: Callable[[PlatformClient], Retrier],
    ) -> None:
        """Every connection gets `{}` at once, whatever is asked: a resolve never learns an id.
        It is retried `UNUSABLE_ANSWER_ATTEMPTS` times, then fails with the reason."""

        def answer_first(exchange: Exchange) -> None:
            exchange.send(ok(b"{}"))
            exchange.request()

        server = serve(answer_first)
        client = client_for(server.url)
        with pytest.raises(errors.UnusableAnswers, match="no environment id"):
            make_retrier(client).call(
                lambda: client.resolve_environment("gsm8k"), replayable=True, what="resolve"
            )
        assert server.connections == UNUSABLE_ANSWER_ATTEMPTS
