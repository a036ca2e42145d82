"""The daemon's metrics for Prometheus: what is measured, and the hooks that feed it (`DaemonFeed`,
which also keeps the probes `health` reads and the `server` on `[metrics] listen`).

| metric | type | fed by |
| --- | --- | --- |
| `evalpush_runs{state}` | gauge | `Metrics.set_runs(counts)`: the daemon, from the ledger (`RunCounts`: `finalized` and `skipped` recounted after an upload ends and every 5 minutes) |
| `evalpush_samples_sent_total` | counter | `Metrics.samples_sent(count, nbytes)` per acknowledged batch |
| `evalpush_samples_sent_bytes_total` | counter | the same call: the request bodies' bytes |
| `evalpush_platform_requests_total{endpoint,outcome}` | counter | `RequestObserver.request_done`: the platform client, after every attempt |
| `evalpush_platform_request_duration_seconds{endpoint}` | histogram | the same call |
| `evalpush_retries_total` | counter | `Metrics.retried()`: the retrier before each new attempt, and the gate's probe after each failed one (every attempt an outage report counts) |
| `evalpush_runs_finalized_total` | counter | `DaemonFeed.upload_done`: an upload job that ended finalized |
| `evalpush_runs_failed_total` | counter | the same call: one that ended failed |
| `evalpush_records_set_aside_total` | counter | the same call: the records set aside in the run (new since the feed last saw it) |
| `evalpush_runs_followed` | gauge | `Metrics.set_followed(count)`: the daemon's loop, the runs its tracker follows (`runs.follow`) |
| `evalpush_follow_lag_seconds` | histogram | `DaemonFeed.followed(lag)`: at each stretch of a followed run, from when the oldest line it sent was first seen to the platform's acknowledgement of the stretch |
| `evalpush_platform_unreachable_seconds` | gauge | `Probes.unreachable_seconds()`, read at scrape time |
| `evalpush_oldest_waiting_run_age_seconds` | gauge | `Metrics.set_oldest_waiting(since)`; the age is taken at scrape time |
| `evalpush_ledger_size_bytes` | gauge | `Probes.ledger_bytes()`, read at scrape time |
| `evalpush_last_upload_success_timestamp_seconds` | gauge | `Metrics.upload_finalized()` |
| `evalpush_build_info{version}` | info | this module |
| `process_*` | gauge, counter | prometheus_client's process collector (CPU, memory, open files) |

No `_created` series: they double the series for nothing a rate needs.

How the daemon feeds them (`DaemonFeed`, built by `service.Daemon` when `[metrics] listen` is
set, and kept across reloads so counters do not restart): `PlatformClient(observer=...)`
reports each attempt with its endpoint (the public method's name, an `Endpoint` value; the
URL path is no label, it holds evaluation ids), and an attempt that raised is counted under
the `RequestOutcome` of what it raised (`outcome_of`): the client classifies, the metrics only read
the class; `Retrier(on_retry=...)` counts retries (tenacity's `before_sleep`); the upload's
progress hook reports each acknowledged batch (samples and bytes, as deltas of the run's row);
an upload job's end sets the last success; the daemon's loop refreshes runs by state and the
oldest waiting run from the ledger every few seconds; the gate answers how long the platform
has been unreachable. The platform client does not import this module (it would bring
`prometheus_client` into every `push`): `Exchange.send` times each attempt (the one place a
request is timed) and calls the observer.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    ProcessCollector,
    disable_created_metrics,
)

from evalpush import __version__
from evalpush.config import MetricsConfig
from evalpush.core import errors
from evalpush.core.states import State
from evalpush.service.health import Health, Probes
from evalpush.service.server import MetricsServer

DURATION_BUCKETS_SECONDS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
"""Request durations: a probe takes milliseconds, a 25 MiB samples batch up to the read timeout."""
LAG_BUCKETS_SECONDS = (1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 35.0, 45.0, 60.0, 120.0, 300.0, 900.0)
"""A followed line's lag: about a second with a short batch period, the period (30 s) by
default, minutes through an outage."""

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


class RequestOutcome(StrEnum):
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


def outcome_of(error: BaseException | None) -> RequestOutcome:
    match error:
        case None:
            return RequestOutcome.OK
        case errors.Unreachable():
            return RequestOutcome.UNREACHABLE
        case errors.Ambiguous():
            return RequestOutcome.AMBIGUOUS
        case errors.Transient(status=status):
            return (
                RequestOutcome.THROTTLED
                if status == HTTP_TOO_MANY_REQUESTS
                else RequestOutcome.TRANSIENT
            )
        case errors.AuthError():
            return RequestOutcome.AUTH
        case errors.Refused():
            return RequestOutcome.REFUSED
        case _:
            return RequestOutcome.ERROR


def ledger_file_bytes(path: Path) -> int:
    """The ledger's size on disk: the database and its write-ahead log (absent counts 0)."""
    total = 0
    for part in (path, path.with_name(path.name + "-wal")):
        try:
            total += part.stat().st_size
        except FileNotFoundError:
            pass
    return total


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
        self._followed = Gauge(
            "evalpush_runs_followed",
            "Runs followed now: their evaluation filled while they are written.",
            registry=r,
        )
        self._follow_lag = Histogram(
            "evalpush_follow_lag_seconds",
            "A followed run's stretch: from when its oldest line was seen to its acknowledgement.",
            buckets=LAG_BUCKETS_SECONDS,
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
            for outcome in RequestOutcome:
                self._requests.labels(endpoint=endpoint, outcome=outcome)

    # -- fed by the daemon -------------------------------------------------------------------

    def set_runs(self, counts: Mapping[str, int]) -> None:
        """Runs by state, all of them: a state missing from `counts` has none now."""
        self._known_states.update(counts)
        for state in self._known_states:
            self._runs.labels(state=state).set(counts.get(state, 0))

    def set_followed(self, count: int) -> None:
        self._followed.set(count)

    def follow_lag(self, seconds: float) -> None:
        self._follow_lag.observe(seconds)

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

    def followed(self, lag: float) -> None:
        """A stretch of a followed run was acknowledged, `lag` seconds after its oldest line
        was seen."""
        self.metrics.follow_lag(lag)

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

    def refresh(
        self,
        ledger: Any,
        counts: Mapping[str, int] | errors.LedgerError,
        followed: int = 0,
    ) -> None:
        """Runs by state (`counts`, the daemon's `RunCounts`, or why the ledger could not
        count them) and the oldest run waiting for upload (ready, or uploading: the time its
        row last moved), from the ledger; a ledger that fails is a `/readyz` problem. And the
        runs the daemon follows now (`followed`)."""
        self.metrics.set_followed(followed)
        if isinstance(counts, errors.LedgerError):
            self._ledger_problem = str(counts)
            return
        try:
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
