"""The HTTP server on `[metrics] listen`: `/metrics` (a Prometheus scrape of the daemon's
registry), `/livez` and `/readyz` (`health.Health`'s verdicts), on a threaded WSGI server.

The server outlives no stop and holds up no reload: each connection has one deadline for the
whole request (`REQUEST_DEADLINE_SECONDS`, however slowly it trickles in), at most
`MAX_CONNECTIONS` are served at once, and `stop` shuts down every open connection before it
joins their threads. Idle connections cannot shut the probes out: a connection accepted while
`MAX_CONNECTIONS` are open takes the place of the oldest one that has not sent its request yet
(closed at once); only when every open connection is answering a request is a new one closed. A connection that ends badly (a timeout, a reset) is
one JSON log line at debug, never a traceback.
"""

from __future__ import annotations

import io
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any, Self
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import make_wsgi_app

from evalpush.config import MetricsConfig
from evalpush.core.errors import ConfigError
from evalpush.log import get_logger

if TYPE_CHECKING:
    from evalpush.service.health import Health
    from evalpush.service.metrics import Metrics

REQUEST_DEADLINE_SECONDS = 10.0
"""How long one connection may take in all, to send its request and read the answer."""
MAX_CONNECTIONS = 32
"""Connections served at once; one more takes the place of the oldest idle one (that has not
sent its request yet), or is closed as soon as it is accepted if none is idle."""
LISTEN_BACKLOG = 1024
"""Connections the kernel queues before they are accepted (capped by net.core.somaxconn)."""
POLL_SECONDS = 0.25
"""How often the serving loop looks for `stop`: the longest `stop` waits for that loop."""

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
TEXT = (("Content-Type", "text/plain; charset=utf-8"),)
"""Headers of every answer but a scrape: a tuple, since start_response adds to the list it is given."""
PATHS = "/metrics, /livez, /readyz or /healthz"


class _DeadlineSocket(io.RawIOBase):
    """A connection's reading side that gives up at one deadline for the whole request: a
    client sending a byte every few seconds cannot keep its thread past it."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the request's deadline passed")
        self._sock.settimeout(remaining)  # also bounds the answer's sendall that follows
        return self._sock.recv_into(buffer)


class _Handler(WSGIRequestHandler):
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # makefile's reader: replaced by one that keeps the deadline
        deadline = time.monotonic() + self.server.request_deadline
        self.rfile = io.BufferedReader(_DeadlineSocket(self.connection, deadline))

    def parse_request(self) -> bool:
        """The request line and headers are in: the connection is no longer idle."""
        parsed = super().parse_request()
        self.server.answering(self.connection)
        return parsed

    def log_message(self, format: str, *args: Any) -> None:
        """Say nothing: a scrape every 15 s would drown the daemon's own log."""


class _Server(ThreadingMixIn, WSGIServer):
    # Request threads are not daemons, and server_close joins them: none outlives `stop`,
    # which first shuts down every connection so that none of them waits.
    daemon_threads = False
    block_on_close = True
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, address: tuple[Any, ...], family: socket.AddressFamily, deadline: float):
        self.address_family = family  # read by TCPServer.__init__ to open the socket
        self.request_deadline = deadline
        self._open: dict[socket.socket, bool] = {}  # accepted first first -> answering yet
        self._open_lock = threading.Lock()
        self._log = get_logger(stage="metrics")
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        """Serve `request` on a thread of its own; at the cap, in place of the oldest idle
        connection (which is shut down: its thread sees the end of its input and returns)."""
        idle = None
        with self._open_lock:
            if len(self._open) >= MAX_CONNECTIONS:
                idle = next((c for c, answering in self._open.items() if not answering), None)
                if idle is not None:
                    del self._open[idle]
            full = len(self._open) >= MAX_CONNECTIONS
            if not full:
                self._open[request] = False
        if idle is not None:
            try:
                idle.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # closed meanwhile
        if full:
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def answering(self, request: socket.socket) -> None:
        """`request` sent its request: it is answered, never dropped for a newer one."""
        with self._open_lock:
            if request in self._open:
                self._open[request] = True

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.pop(request, None)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that ended badly (a timeout, a reset): one line, no traceback."""
        error = sys.exc_info()[1]
        self._log.debug(
            "metrics connection ended early",
            client=str(client_address[0]) if client_address else "",
            error=f"{type(error).__name__}: {error}",
        )

    def cut_connections(self) -> None:
        """Shut down every open connection: a thread reading or writing one returns at once."""
        with self._open_lock:
            open_now = list(self._open)
        for request in open_now:
            try:
                request.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # closed meanwhile


def _routes(metrics: Metrics, health: Health) -> WSGIApp:
    scrape = make_wsgi_app(metrics.registry)

    def verdict(
        check: Callable[[], list[str]], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        try:
            problems = check()
        except Exception as exc:  # a check that fails is a verdict too: not well, and why
            problems = [f"health check failed: {type(exc).__name__}: {exc}"]
        if problems:
            start_response("503 Service Unavailable", [*TEXT])
            return ["".join(f"{problem}\n" for problem in problems).encode()]
        start_response("200 OK", [*TEXT])
        return [b"ok\n"]

    checks = {
        "/livez": health.liveness,
        "/healthz": health.liveness,
        "/readyz": health.readiness,
    }

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if environ.get("REQUEST_METHOD") != "GET":
            start_response("405 Method Not Allowed", [*TEXT, ("Allow", "GET")])
            return [f"GET {PATHS}\n".encode()]
        if path == "/metrics":
            return scrape(environ, start_response)
        if path in checks:
            return verdict(checks[path], start_response)
        start_response("404 Not Found", [*TEXT])
        return [f"not found: {PATHS}\n".encode()]

    return app


def _listen_text(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _bind(host: str, port: int, deadline: float) -> _Server:
    """The server's socket, bound and listening; a ConfigError naming `metrics.listen` (the
    daemon's refusal at start, and `check`'s metrics row) when the address cannot be used."""
    try:
        family, *_, sockaddr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        return _Server(sockaddr, family, deadline)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ConfigError(
            f"metrics.listen = {_listen_text(host, port)!r}: cannot listen there: {reason}"
        ) from None


def check_listen(config: MetricsConfig) -> str:
    """`check`: bind where `[metrics] listen` says, as the daemon would at start, and let go at
    once; the address as shown. A ConfigError in the daemon's words when it cannot be used."""
    if config.address is None:
        return "off"
    host, port = config.address
    _bind(host, port, REQUEST_DEADLINE_SECONDS).server_close()
    return _listen_text(host, port)


class MetricsServer:
    """`/metrics`, `/livez`, `/readyz` (and `/healthz`) on one address, served by one thread
    between `start` and `stop`.

    Each request runs on a thread of its own with one deadline for all of it; `stop` shuts
    down every open connection and then waits for those threads, so none outlives it and a
    slow client holds it up not at all.
    """

    def __init__(
        self,
        metrics: Metrics,
        health: Health,
        host: str,
        port: int,
        *,
        request_deadline: float = REQUEST_DEADLINE_SECONDS,
    ) -> None:
        self._app = _routes(metrics, health)
        self._host, self._port = host, port
        self._request_deadline = request_deadline
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Bind and serve; a ConfigError naming `metrics.listen` when the address cannot be used."""
        if self._server is not None:
            raise RuntimeError("the metrics server is already started")
        listen = _listen_text(self._host, self._port)
        server = _bind(self._host, self._port, self._request_deadline)
        server.set_app(self._app)
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": POLL_SECONDS},
            name=f"evalpush-metrics {listen}",
        )
        self._thread.start()

    @property
    def address(self) -> tuple[str, int]:
        """The bound (host, port): the port the system picked when 0 was asked for."""
        if self._server is None:
            raise RuntimeError("the metrics server is not started")
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        return f"http://{_listen_text(*self.address)}"

    def stop(self) -> None:
        """Stop serving, close the socket, cut every open connection and wait for its thread.
        Idempotent."""
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is None or thread is None:
            return
        server.shutdown()  # returns once serve_forever has: nothing more is accepted
        server.cut_connections()
        server.server_close()  # closes the socket, joins the request threads
        thread.join()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
