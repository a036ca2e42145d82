"""The daemon's metrics and health for Prometheus: what is measured, the hooks that feed it, and
the small HTTP server on `[metrics] listen` that serves `/metrics`, `/livez` and `/readyz`.

| metric | type | fed by |
| --- | --- | --- |
| `evalpush_runs{state}` | gauge | `Metrics.set_runs(counts)`: the daemon, from the ledger |
| `evalpush_samples_sent_total` | counter | `Metrics.samples_sent(count, nbytes)` per acknowledged batch |
| `evalpush_samples_sent_bytes_total` | counter | the same call: the request bodies' bytes |
| `evalpush_platform_requests_total{endpoint,outcome}` | counter | `RequestObserver.request_done`: the platform client, after every attempt |
| `evalpush_platform_request_duration_seconds{endpoint}` | histogram | the same call |
| `evalpush_retries_total` | counter | `Metrics.retried()`: the retrier before each new attempt, and the gate's probe after each failed one (every attempt an outage report counts) |
| `evalpush_runs_finalized_total` | counter | `DaemonFeed.upload_done`: an upload job that ended finalized |
| `evalpush_runs_failed_total` | counter | the same call: one that ended failed |
| `evalpush_records_set_aside_total` | counter | the same call: the records set aside in the run (new since the feed last saw it) |
| `evalpush_platform_unreachable_seconds` | gauge | `Probes.unreachable_seconds()`, read at scrape time |
| `evalpush_oldest_waiting_run_age_seconds` | gauge | `Metrics.set_oldest_waiting(since)`; the age is taken at scrape time |
| `evalpush_ledger_size_bytes` | gauge | `Probes.ledger_bytes()`, read at scrape time |
| `evalpush_last_upload_success_timestamp_seconds` | gauge | `Metrics.upload_finalized()` |
| `evalpush_build_info{version}` | info | this module |
| `process_*` | gauge, counter | prometheus_client's process collector (CPU, memory, open files) |

No `_created` series: they double the series for nothing a rate needs.

`/livez` answers 200 `ok` while the daemon's loop turns (it turns at least every few seconds);
503 once it has not for `LIVE_AFTER_SECONDS`: a wedged daemon, which a restart fixes. A platform
outage never makes it fail. `/healthz` is the same check (the name earlier versions documented
as the liveness check). `/readyz` answers 200 `ok` unless the platform has been unreachable (or
has refused the key) longer than `[metrics] unhealthy_after_seconds`, or the ledger cannot be
written; then 503 with one reason a line: uploads cannot happen now, and a restart would not
help. Probes are read on the server's request threads, so each must be quick and safe to call
from any thread (a `stat`, or a value the daemon's loop keeps), never a SQLite query on a
connection another thread owns.

The server outlives no stop and holds up no reload: each connection has one deadline for the
whole request (`REQUEST_DEADLINE_SECONDS`, however slowly it trickles in), at most
`MAX_CONNECTIONS` are served at once, and `stop` shuts down every open connection before it
joins their threads. Idle connections cannot shut the probes out: a connection accepted while
`MAX_CONNECTIONS` are open takes the place of the oldest one that has not sent its request yet
(closed at once); only when every open connection is answering a request is a new one closed. A connection that ends badly (a timeout, a reset) is
one JSON log line at debug, never a traceback.

How the daemon feeds them (`DaemonFeed`, built by `service.Daemon` when `[metrics] listen` is
set, and kept across reloads so counters do not restart): `PlatformClient(observer=...)`
reports each attempt with its endpoint (the public method's name, an `Endpoint` value; the
URL path is no label, it holds evaluation ids), and an attempt that raised is counted under
the `Outcome` of what it raised (`outcome_of`): the client classifies, the metrics only read
the class; `Retrier(on_retry=...)` counts retries (tenacity's `before_sleep`); the upload's
progress hook reports each acknowledged batch (samples and bytes, as deltas of the run's row);
an upload job's end sets the last success; the daemon's loop refreshes runs by state and the
oldest waiting run from the ledger every few seconds; the gate answers how long the platform
has been unreachable. The platform client does not import this module (it would bring
`prometheus_client` into every `push`): it times the attempt itself and calls the observer.
"""

from __future__ import annotations

import io
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any, Protocol, Self
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

import msgspec
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    ProcessCollector,
    disable_created_metrics,
    make_wsgi_app,
)

from evalpush import __version__
from evalpush.client import RequestObserver
from evalpush.config import MetricsConfig
from evalpush.core import errors
from evalpush.core.errors import ConfigError
from evalpush.core.states import State
from evalpush.log import get_logger

REQUEST_DEADLINE_SECONDS = 10.0
"""How long one connection may take in all, to send its request and read the answer."""
MAX_CONNECTIONS = 32
"""Connections served at once; one more takes the place of the oldest idle one (that has not
sent its request yet), or is closed as soon as it is accepted if none is idle."""
LISTEN_BACKLOG = 1024
"""Connections the kernel queues before they are accepted (capped by net.core.somaxconn)."""
LIVE_AFTER_SECONDS = 60.0
"""`/livez` fails once the daemon's loop has not turned for this long (it turns every few
seconds; a scan of a huge tree may hold one turn for a while)."""
POLL_SECONDS = 0.25
"""How often the serving loop looks for `stop`: the longest `stop` waits for that loop."""
DURATION_BUCKETS_SECONDS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
"""Request durations: a probe takes milliseconds, a 25 MiB samples batch up to the read timeout."""

RUN_STATES = tuple(str(getattr(State, name)) for name in dir(State) if name.isupper())


class Endpoint(StrEnum):
    """One platform endpoint, named after the `PlatformClient` method that calls it."""

    RESOLVE_ENVIRONMENT = "resolve_environment"
    CREATE_EVALUATION = "create_evaluation"
    PUSH_SAMPLES = "push_samples"
    FINALIZE = "finalize"
    GET_EVALUATION = "get_evaluation"
    LIST_SAMPLES = "list_samples"
    LIST_EVALUATIONS = "list_evaluations"
    CLOSE_OUT = "close_out"
    UPDATE = "update"
    PROBE = "probe"


class Outcome(StrEnum):
    """How one attempt ended, read from the class `core/errors.py` gave its failure."""

    OK = "ok"
    UNREACHABLE = "unreachable"  # no connection was made: nothing was sent
    AMBIGUOUS = "ambiguous"  # sent, and the answer lost (a broken connection, 502, 504)
    THROTTLED = "throttled"  # 429
    TRANSIENT = "transient"  # 408, 500, 503, a pool timeout, a 2xx that cannot be read
    AUTH = "auth"  # 401, 403
    REFUSED = "refused"  # 404, 409, 413, 422 and any other 4xx
    ERROR = "error"  # anything else: a bug, not the platform


HTTP_TOO_MANY_REQUESTS = 429


def outcome_of(error: BaseException | None) -> Outcome:
    match error:
        case None:
            return Outcome.OK
        case errors.Unreachable():
            return Outcome.UNREACHABLE
        case errors.Ambiguous():
            return Outcome.AMBIGUOUS
        case errors.Transient(status=status):
            return Outcome.THROTTLED if status == HTTP_TOO_MANY_REQUESTS else Outcome.TRANSIENT
        case errors.AuthError():
            return Outcome.AUTH
        case errors.Refused():
            return Outcome.REFUSED
        case _:
            return Outcome.ERROR


@contextmanager
def observed(
    observer: RequestObserver | None,
    endpoint: Endpoint,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[None]:
    """Report the attempt inside the block to `observer` (None: nobody is listening)."""
    started = clock()
    try:
        yield
    except BaseException as exc:
        if observer is not None:
            observer.request_done(endpoint, exc, clock() - started)
        raise
    if observer is not None:
        observer.request_done(endpoint, None, clock() - started)


def ledger_file_bytes(path: Path) -> int:
    """The ledger's size on disk: the database and its write-ahead log (absent counts 0)."""
    total = 0
    for part in (path, path.with_name(path.name + "-wal")):
        try:
            total += part.stat().st_size
        except FileNotFoundError:
            pass
    return total


class Probes(msgspec.Struct, frozen=True):
    """What metrics and health read at scrape time (see the module docstring: any thread)."""

    unreachable_seconds: Callable[[], float]
    """How long the platform has been unreachable; 0 while it answers."""
    ledger_problem: Callable[[], str | None]
    """Why the ledger cannot be used (e.g. the last write failed), or None when it can."""
    ledger_bytes: Callable[[], int]
    key_refused: Callable[[], bool] = lambda: False
    """Whether the platform refuses the API key (or there is none) now."""
    loop_idle_seconds: Callable[[], float] = lambda: 0.0
    """How long since the daemon's loop last turned."""


class Metrics:
    """The daemon's metrics, in a registry of their own (so tests and two daemons never share)."""

    def __init__(self, probes: Probes, *, clock: Callable[[], float] = time.time) -> None:
        disable_created_metrics()  # process-wide, and only this module exports metrics
        self.registry = CollectorRegistry()
        self._clock = clock
        self._oldest_waiting_since: float | None = None
        self._known_states: set[str] = set(RUN_STATES)
        r = self.registry
        Info("evalpush_build", "The running evalpush.", registry=r).info({"version": __version__})
        ProcessCollector(registry=r)
        self._runs = Gauge(
            "evalpush_runs", "Runs the ledger knows, by state.", ["state"], registry=r
        )
        self._samples = Counter(
            "evalpush_samples_sent", "Samples the platform acknowledged.", registry=r
        )
        self._bytes = Counter(
            "evalpush_samples_sent_bytes", "Bytes of acknowledged samples requests.", registry=r
        )
        self._requests = Counter(
            "evalpush_platform_requests",
            "Platform requests (single attempts), by endpoint and outcome.",
            ["endpoint", "outcome"],
            registry=r,
        )
        self._durations = Histogram(
            "evalpush_platform_request_duration_seconds",
            "How long each platform request took, by endpoint.",
            ["endpoint"],
            buckets=DURATION_BUCKETS_SECONDS,
            registry=r,
        )
        self._retries = Counter(
            "evalpush_retries",
            "Platform calls attempted again after a failure, probes of an outage included.",
            registry=r,
        )
        self._finalized = Counter(
            "evalpush_runs_finalized", "Uploads that ended finalized.", registry=r
        )
        self._failed = Counter("evalpush_runs_failed", "Uploads that ended failed.", registry=r)
        self._set_aside = Counter(
            "evalpush_records_set_aside",
            "Trace records set aside (bad lines, samples the platform refused).",
            registry=r,
        )
        self._last_success = Gauge(
            "evalpush_last_upload_success_timestamp_seconds",
            "When a run was last finalized (Unix time; 0: not since start).",
            registry=r,
        )
        Gauge(
            "evalpush_platform_unreachable_seconds",
            "How long the platform has been unreachable (0 while it answers).",
            registry=r,
        ).set_function(probes.unreachable_seconds)
        Gauge(
            "evalpush_oldest_waiting_run_age_seconds",
            "Age of the oldest run waiting to be uploaded (0: none waits).",
            registry=r,
        ).set_function(self._oldest_waiting_age)
        Gauge(
            "evalpush_ledger_size_bytes", "The ledger's size on disk, WAL included.", registry=r
        ).set_function(probes.ledger_bytes)
        self._start_series()

    def _start_series(self) -> None:
        # Every series exists from the start at 0, so rate() and alerts see the first event.
        for state in RUN_STATES:
            self._runs.labels(state=state).set(0)
        for endpoint in Endpoint:
            self._durations.labels(endpoint=endpoint)
            for outcome in Outcome:
                self._requests.labels(endpoint=endpoint, outcome=outcome)

    # -- fed by the daemon -------------------------------------------------------------------

    def set_runs(self, counts: Mapping[str, int]) -> None:
        """Runs by state, all of them: a state missing from `counts` has none now."""
        self._known_states.update(counts)
        for state in self._known_states:
            self._runs.labels(state=state).set(counts.get(state, 0))

    def samples_sent(self, count: int, nbytes: int) -> None:
        self._samples.inc(count)
        self._bytes.inc(nbytes)

    def retried(self) -> None:
        self._retries.inc()

    def upload_finalized(self) -> None:
        self._finalized.inc()
        self._last_success.set(self._clock())

    def upload_failed(self) -> None:
        self._failed.inc()

    def records_set_aside(self, count: int) -> None:
        self._set_aside.inc(count)

    def set_oldest_waiting(self, since: float | None) -> None:
        """When the oldest run still waiting for upload became ready (Unix time), or None."""
        self._oldest_waiting_since = since

    def _oldest_waiting_age(self) -> float:
        since = self._oldest_waiting_since
        return 0.0 if since is None else max(0.0, self._clock() - since)

    # -- fed by the platform client (RequestObserver) -----------------------------------------

    def request_done(self, endpoint: Endpoint, error: BaseException | None, seconds: float) -> None:
        self._requests.labels(endpoint=endpoint, outcome=outcome_of(error)).inc()
        self._durations.labels(endpoint=endpoint).observe(seconds)


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


class Health(msgspec.Struct, frozen=True):
    """The verdicts of `/livez` and `/readyz`: each a list of reasons, empty when all is well."""

    probes: Probes
    unhealthy_after_seconds: float
    live_after_seconds: float = LIVE_AFTER_SECONDS

    def liveness(self) -> list[str]:
        """Why the daemon is wedged (its loop has stopped turning), or nothing."""
        idle = self.probes.loop_idle_seconds()
        if idle > self.live_after_seconds:
            return [f"the daemon's loop has not turned for {_duration(idle)}"]
        return []

    def readiness(self) -> list[str]:
        """Why uploads cannot happen now: the platform, the ledger."""
        problems = []
        unreachable = self.probes.unreachable_seconds()
        if unreachable > self.unhealthy_after_seconds:
            problems.append(
                f"platform unreachable for {_duration(unreachable)}"
                f" (over metrics.unhealthy_after_seconds = {self.unhealthy_after_seconds:g})"
            )
        if self.probes.key_refused():
            problems.append("the platform refuses the API key (or none is set)")
        ledger = self.probes.ledger_problem()
        if ledger is not None:
            problems.append(f"ledger: {ledger}")
        return problems


# -- the HTTP server ---------------------------------------------------------------------------

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
        host, port = self.address
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

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


class _Gate(Protocol):
    @property
    def mode(self) -> str: ...

    def unreachable_seconds(self) -> float: ...


class DaemonFeed:
    """The daemon's side of the metrics: the hooks its parts report to, what its loop
    refreshes, the probes `/metrics`, `/livez` and `/readyz` read, and the server on
    `[metrics] listen`.

    One per daemon: each set of parts built from a configuration (again on SIGHUP) reports to
    it, so counters survive a reload; `attach` points the probes at the new gate and ledger and
    moves the server when `listen` changed. Hooks are called from upload threads, `refresh`
    from the loop, probes from the server's threads: each touches only its own values.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._gate: _Gate | None = None
        self._ledger_path: Path | None = None
        self._ledger_problem: str | None = None
        self._lock = threading.Lock()
        self._sent: dict[str, tuple[int, int]] = {}  # run id -> (samples, bytes) counted so far
        self._set_aside: dict[str, int] = {}  # run id -> records set aside counted so far
        self._monotonic = monotonic
        self._turned = monotonic()
        self.probes = Probes(
            self._unreachable_seconds,
            self._problem,
            self._ledger_bytes,
            key_refused=self._key_refused,
            loop_idle_seconds=self._loop_idle_seconds,
        )
        self.metrics = Metrics(self.probes, clock=clock)
        self._server: MetricsServer | None = None
        self._config: MetricsConfig | None = None

    def attach(self, config: MetricsConfig, gate: _Gate, ledger_path: Path) -> None:
        """Parts were built: read their gate and ledger; serve where `config` says (a
        `ConfigError` naming `metrics.listen` when that address cannot be used)."""
        self._gate, self._ledger_path = gate, ledger_path
        self.loop_turned()
        if config == self._config:
            return
        self.stop()
        server = server_for(config, self.metrics, self.probes)
        if server is not None:
            server.start()
        self._server, self._config = server, config

    @property
    def url(self) -> str | None:
        return None if self._server is None else self._server.url

    def stop(self) -> None:
        server, self._server, self._config = self._server, None, None
        if server is not None:
            server.stop()

    # -- hooks (upload threads) ----------------------------------------------------------------

    def request_done(self, endpoint: Endpoint, error: BaseException | None, seconds: float) -> None:
        self.metrics.request_done(endpoint, error, seconds)

    def retried(self) -> None:
        self.metrics.retried()

    def loop_turned(self) -> None:
        """The daemon's loop went round once (what `/livez` reads)."""
        self._turned = self._monotonic()

    def batch_acked(self, record: Any) -> None:
        """A `RunRecord` after an acknowledged batch: what it sent since the last one counted
        (a run that started over counts from 0 again)."""
        samples, nbytes = record.samples_sent, record.bytes_sent
        with self._lock:
            before = self._sent.get(record.run_id, (0, 0))
            self._sent[record.run_id] = (samples, nbytes)
        if samples < before[0] or nbytes < before[1]:
            before = (0, 0)
        self.metrics.samples_sent(samples - before[0], nbytes - before[1])

    def upload_done(self, record: Any | None, set_aside: int = 0) -> None:
        """An upload job ended with the run's row (None: it ended without one) and the count of
        its records set aside (those not counted before: a run retried counts only new ones)."""
        if record is None:
            return
        with self._lock:
            self._sent.pop(record.run_id, None)
            counted = self._set_aside.get(record.run_id, 0)
            self._set_aside[record.run_id] = max(counted, set_aside)
        if set_aside > counted:
            self.metrics.records_set_aside(set_aside - counted)
        if record.state == State.FINALIZED:
            self.metrics.upload_finalized()
        elif record.state == State.FAILED:
            self.metrics.upload_failed()

    # -- the loop --------------------------------------------------------------------------------

    def refresh(self, ledger: Any) -> None:
        """Runs by state and the oldest run waiting for upload (ready, or uploading: the time
        its row last moved), from the ledger; a ledger that fails is a `/readyz` problem."""
        try:
            counts = ledger.state_counts()
            pending = ledger.in_state(State.READY, State.UPLOADING)
        except errors.LedgerError as exc:
            self._ledger_problem = str(exc)
            return
        self._ledger_problem = None
        self.metrics.set_runs(counts)
        self.metrics.set_oldest_waiting(min((r.updated_at for r in pending), default=None))

    # -- probes (server threads) ------------------------------------------------------------------

    def _unreachable_seconds(self) -> float:
        gate = self._gate
        return 0.0 if gate is None else gate.unreachable_seconds()

    def _key_refused(self) -> bool:
        gate = self._gate
        return gate is not None and gate.mode == "auth"

    def _loop_idle_seconds(self) -> float:
        return max(0.0, self._monotonic() - self._turned)

    def _problem(self) -> str | None:
        if self._ledger_problem is not None:
            return self._ledger_problem
        path = self._ledger_path
        if path is not None:
            for target in (path, path.parent):  # SQLite writes its log beside the file
                if os.path.exists(target) and not os.access(target, os.W_OK):
                    return f"{target}: not writable by this process"
        return None

    def _ledger_bytes(self) -> int:
        path = self._ledger_path
        return 0 if path is None else ledger_file_bytes(path)


def server_for(config: MetricsConfig, metrics: Metrics, probes: Probes) -> MetricsServer | None:
    """The server `[metrics]` asks for, not started; None when `listen` is empty (off)."""
    if config.address is None:
        return None
    host, port = config.address
    return MetricsServer(metrics, Health(probes, config.unhealthy_after_seconds), host, port)
