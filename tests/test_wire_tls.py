"""The platform client's HTTP over TLS: a real handshake with a certificate made by `openssl`, a
small TLS server on loopback, and a stop that ends a wait whether it is in the handshake or in
a body that trickles."""

from __future__ import annotations

import contextlib
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from evalpush.client import PlatformClient
from evalpush.config import PlatformConfig
from evalpush.core import errors
from support.environ import clean_environ
from support.runs import trace_line, write_run

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI")

STOP_AFTER_SECONDS = 0.5
"""How long after the server begins the wait under test the stop is set."""
REACH_SECONDS = 30.0
"""How long the wait under test may take to begin (a TLS handshake on a loaded 2-core box)."""
SERVER_JOIN_SECONDS = 5.0


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for localhost and 127.0.0.1, and its key."""
    where = tmp_path_factory.mktemp("tls")
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        + ["-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost"]
        + ["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )
    return cert, key


Behaviour = Callable[[socket.socket, ssl.SSLContext, threading.Event], None]


class TlsServer:
    """One connection at a time on loopback, handled by `behaviour` until `done` is set."""

    def __init__(self, context: ssl.SSLContext, behaviour: Behaviour) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self._context = context
        self._behaviour = behaviour
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="tls-test-server")
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"https://localhost:{self._listener.getsockname()[1]}"

    def _serve(self) -> None:
        while not self.done.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            with conn, contextlib.suppress(ssl.SSLError):  # a client refusing our certificate
                self._behaviour(conn, self._context, self.done)

    def close(self) -> None:
        self.done.set()
        self._thread.join(SERVER_JOIN_SECONDS)
        self._listener.close()


def read_request(tls: ssl.SSLSocket) -> None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = tls.recv(65536)
        if not chunk:
            return
        data += chunk


def answer(
    body: bytes, *, trickle: bool = False, trickling: threading.Event | None = None
) -> Behaviour:
    """A 200 with `body`, whole or (`trickle`) a byte a second; `trickling` is set once the
    head is sent and the body begins to trickle."""

    def behave(conn: socket.socket, context: ssl.SSLContext, done: threading.Event) -> None:
        conn.settimeout(5)
        with context.wrap_socket(conn, server_side=True) as tls:
            read_request(tls)
            head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            tls.sendall(head)
            if not trickle:
                tls.sendall(body)
                return
            if trickling is not None:
                trickling.set()
            for i in range(len(body)):
                if done.wait(1.0):
                    return
                tls.sendall(body[i : i + 1])

    return behave


def never_handshake(accepted: threading.Event) -> Behaviour:
    """Accepts the TCP connection (setting `accepted`) and says nothing."""

    def behave(conn: socket.socket, context: ssl.SSLContext, done: threading.Event) -> None:
        accepted.set()
        done.wait(30)

    return behave


@pytest.fixture
def serve(certificate: tuple[Path, Path]) -> Iterator[Callable[[Behaviour], TlsServer]]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*certificate)
    servers: list[TlsServer] = []

    def start(behaviour: Behaviour) -> TlsServer:
        servers.append(TlsServer(context, behaviour))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


@pytest.fixture
def make_client(
    certificate: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., PlatformClient]]:
    monkeypatch.setenv("SSL_CERT_FILE", str(certificate[0]))  # trust the test certificate
    clients: list[PlatformClient] = []

    def make(server: TlsServer, stop: threading.Event | None = None) -> PlatformClient:
        config = PlatformConfig(api_base_url=server.base_url, read_timeout_seconds=60)
        clients.append(
            PlatformClient(
                config, environ={"PRIME_API_KEY": "k-tls-1234"}, home=tmp_path, stop=stop
            )
        )
        return clients[-1]

    yield make
    for client in clients:
        client.close()


def test_an_exchange_over_tls_reads_a_large_answer_whole(
    serve: Callable[[Behaviour], TlsServer], make_client: Callable[..., PlatformClient]
) -> None:
    # Larger than one TLS record many times over: bytes wait in the SSL object between reads.
    evaluation = {"id": "e1", "status": "RUNNING", "metadata": {"pad": "x" * 500_000}}
    client = make_client(serve(answer(orjson.dumps(evaluation))))
    assert client.get_evaluation("e1").metadata == evaluation["metadata"]


@pytest.mark.parametrize("waiting_in", ["trickling body", "no handshake"])
def test_a_stop_ends_a_tls_wait_and_raises_interrupted(
    waiting_in: str,
    serve: Callable[[Behaviour], TlsServer],
    make_client: Callable[..., PlatformClient],
) -> None:
    began = threading.Event()  # the server is in the wait under test: the stop lands in it
    if waiting_in == "trickling body":
        behaviour = answer(b'{"id": "e1", "status": "RUNNING"}', trickle=True, trickling=began)
        cut_in: type[Exception] = httpx.ReadError
    else:
        behaviour, cut_in = never_handshake(began), httpx.ConnectError
    stop = threading.Event()
    client = make_client(serve(behaviour), stop)
    stopped_at: list[float] = []

    def stop_once_waiting() -> None:
        if began.wait(REACH_SECONDS):
            time.sleep(STOP_AFTER_SECONDS)
        stopped_at.append(time.monotonic())
        stop.set()

    stopper = threading.Thread(target=stop_once_waiting, name="stopper")
    stopper.start()
    with pytest.raises(errors.Interrupted) as caught:
        client.get_evaluation("e1")
    ended = time.monotonic()
    stopper.join()
    assert began.is_set(), f"the server never began its {waiting_in} wait"
    assert isinstance(caught.value.__cause__, cut_in), caught.value.__cause__
    assert ended - stopped_at[0] < 2.0


class TunnelProxy:
    """An HTTP proxy on loopback that opens CONNECT tunnels (to loopback, whatever host is
    named) and relays bytes both ways; `requests` holds each CONNECT head's first line."""

    def __init__(self, to_port: int) -> None:
        self._to_port = to_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.requests: list[bytes] = []
        self._done = threading.Event()
        self._threads = [threading.Thread(target=self._serve, name="tunnel-proxy")]
        self._threads[0].start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def _serve(self) -> None:
        while not self._done.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            head = b""
            while b"\r\n\r\n" not in head:
                head += client.recv(65536)
            self.requests.append(head.split(b"\r\n", 1)[0])
            upstream = socket.create_connection(("127.0.0.1", self._to_port))
            client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            for source, sink in ((client, upstream), (upstream, client)):
                relay = threading.Thread(target=self._relay, args=(source, sink), daemon=True)
                self._threads.append(relay)
                relay.start()

    @staticmethod
    def _relay(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._done.set()
        for thread in self._threads:
            thread.join(SERVER_JOIN_SECONDS)
        self._listener.close()


def test_an_https_platform_is_reached_through_a_connect_tunnel(
    serve: Callable[[Behaviour], TlsServer],
    make_client: Callable[..., PlatformClient],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """HTTPS_PROXY: a CONNECT to the platform's host and port, then TLS with the platform
    (its certificate checked for its own name) inside the tunnel."""
    server = serve(answer(b'{"id": "e1", "status": "RUNNING"}'))
    proxy = TunnelProxy(int(server.base_url.rsplit(":", 1)[1]))
    try:
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        client = make_client(server)
        assert client.get_evaluation("e1").status == "RUNNING"
        client.close()
    finally:
        proxy.close()
    port = server.base_url.rsplit(":", 1)[1]
    assert proxy.requests == [f"CONNECT localhost:{port} HTTP/1.1".encode()]


def tunnel_opened(conn: socket.socket, context: ssl.SSLContext, done: threading.Event) -> None:
    """An https proxy: TLS with the client, a CONNECT answered 200, then nothing behind it."""
    conn.settimeout(5)
    with contextlib.suppress(OSError), context.wrap_socket(conn, server_side=True) as tls:
        read_request(tls)
        tls.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        done.wait(5)


def test_an_https_proxy_for_an_https_platform_is_refused_as_unsendable(
    serve: Callable[[Behaviour], TlsServer],
    make_client: Callable[..., PlatformClient],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """TLS inside TLS is not supported: said at once, not waited on as an outage."""
    proxy = serve(tunnel_opened)
    platform = serve(answer(b"{}"))
    monkeypatch.setenv("HTTPS_PROXY", proxy.base_url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    with pytest.raises(errors.Unsendable, match="TLS inside TLS"):
        make_client(platform).probe()


def test_a_certificate_that_fails_verification_is_refused_as_such(
    serve: Callable[[Behaviour], TlsServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The test certificate is not trusted here (certifi's bundle): the daemon waits it out as
    an outage, saying why."""
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    server = serve(answer(b"{}"))
    config = PlatformConfig(api_base_url=server.base_url)
    with PlatformClient(config, environ={"PRIME_API_KEY": "k-tls-1234"}, home=tmp_path) as client:
        with pytest.raises(errors.CertificateRefused, match="CERTIFICATE_VERIFY_FAILED"):
            client.probe()


def test_push_to_a_platform_whose_certificate_fails_verification_exits_2_saying_why(
    serve: Callable[[Behaviour], TlsServer], tmp_path: Path
) -> None:
    server = serve(answer(b"{}"))
    root = tmp_path / "outputs"
    write_run(root, lines=[trace_line(0, 0)])
    (tmp_path / "home").mkdir()
    environ = clean_environ(
        PRIME_API_KEY="k-tls-1234",
        PRIME_API_BASE_URL=server.base_url,
        HOME=str(tmp_path / "home"),
        EVALPUSH_STATE_DIR=str(tmp_path / "state"),
        SSL_CERT_FILE=None,
        SSL_CERT_DIR=None,
    )
    done = subprocess.run(
        [sys.executable, "-m", "evalpush", "push", str(root)],
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "CERTIFICATE_VERIFY_FAILED" in done.stderr
