"""Metrics and health: a real server on loopback, scraped with httpx and read with Prometheus'
own text parser; the probes are plain values the test sets, as the daemon will feed them."""

from __future__ import annotations

import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from evalpush import __version__
from evalpush.client import PlatformClient
from evalpush.config import MetricsConfig, PlatformConfig
from evalpush.core import errors
from evalpush.core.errors import ConfigError
from evalpush.service.health import Health, Probes
from evalpush.service.metrics import (
    RUN_STATES,
    DaemonFeed,
    Endpoint,
    Metrics,
    RequestOutcome,
    ledger_file_bytes,
    outcome_of,
    server_for,
)
from evalpush.service.server import MAX_CONNECTIONS, MetricsServer

THRESHOLD_SECONDS = 600.0
NOW = 1_700_000_000.0
HTTP_TIMEOUT_SECONDS = 10.0


@dataclass
class World:
    """What the daemon knows, as values a test sets; `probes()` reads them as the daemon's would."""

    ledger: Path
    unreachable: float = 0.0
    ledger_problem: str | None = None
    now: float = NOW
    fail_probe: Exception | None = None
    key_refused: bool = False
    loop_idle: float = 0.0

    def _unreachable(self) -> float:
        if self.fail_probe is not None:
            raise self.fail_probe
        return self.unreachable

    def probes(self) -> Probes:
        return Probes(
            unreachable_seconds=self._unreachable,
            ledger_problem=lambda: self.ledger_problem,
            ledger_bytes=lambda: ledger_file_bytes(self.ledger),
            key_refused=lambda: self.key_refused,
            loop_idle_seconds=lambda: self.loop_idle,
        )


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(ledger=tmp_path / "state.db")


@pytest.fixture
def metrics(world: World) -> Metrics:
    return Metrics(world.probes(), clock=lambda: world.now)


@pytest.fixture
def server(world: World, metrics: Metrics) -> Iterator[MetricsServer]:
    with MetricsServer(metrics, Health(world.probes(), THRESHOLD_SECONDS), "127.0.0.1", 0) as s:
        yield s


def scrape(server: MetricsServer) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of /metrics, keyed by name and labels, as Prometheus would read it."""
    response = httpx.get(f"{server.url}/metrics", timeout=HTTP_TIMEOUT_SECONDS)
    assert response.status_code == 200
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def value(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def healthz(server: MetricsServer, path: str = "/readyz") -> httpx.Response:
    return httpx.get(f"{server.url}{path}", timeout=HTTP_TIMEOUT_SECONDS)


def closed_by_peer(sock: socket.socket) -> bool:
    """Whether the other end closed `sock` (without waiting, or taking what it sent)."""
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except ConnectionError:
        return True


def metrics_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("evalpush-metrics")]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TestScrape:
    def test_every_series_is_served_at_zero_before_anything_happens(self, server):
        samples = scrape(server)

        assert {state: value(samples, "evalpush_runs", state=state) for state in RUN_STATES} == (
            dict.fromkeys(RUN_STATES, 0.0)
        )
        for endpoint in Endpoint:
            for outcome in RequestOutcome:
                name = "evalpush_platform_requests_total"
                assert value(samples, name, endpoint=endpoint, outcome=outcome) == 0.0
        for name in (
            "evalpush_samples_sent_total",
            "evalpush_samples_sent_bytes_total",
            "evalpush_retries_total",
            "evalpush_runs_finalized_total",
            "evalpush_runs_failed_total",
            "evalpush_records_set_aside_total",
            "evalpush_platform_unreachable_seconds",
            "evalpush_oldest_waiting_run_age_seconds",
            "evalpush_ledger_size_bytes",
            "evalpush_last_upload_success_timestamp_seconds",
        ):
            assert value(samples, name) == 0.0, name
        assert value(samples, "evalpush_build_info", version=__version__) == 1.0

    def test_what_the_daemon_feeds_is_what_a_scrape_reads(self, server, metrics, world):
        metrics.set_runs({"finalized": 3, "ready": 2})
        metrics.set_runs({"finalized": 4, "uploading": 1})
        metrics.samples_sent(10, 2048)
        metrics.samples_sent(5, 1000)
        for _ in range(3):
            metrics.retried()
        metrics.upload_finalized()
        metrics.set_oldest_waiting(NOW - 120)
        world.now = NOW + 30
        world.unreachable = 42.5

        samples = scrape(server)

        assert value(samples, "evalpush_runs", state="finalized") == 4
        assert value(samples, "evalpush_runs", state="uploading") == 1
        assert value(samples, "evalpush_runs", state="ready") == 0  # none left: not stale
        assert value(samples, "evalpush_samples_sent_total") == 15
        assert value(samples, "evalpush_samples_sent_bytes_total") == 3048
        assert value(samples, "evalpush_retries_total") == 3
        assert value(samples, "evalpush_last_upload_success_timestamp_seconds") == NOW
        assert value(samples, "evalpush_oldest_waiting_run_age_seconds") == 150
        assert value(samples, "evalpush_platform_unreachable_seconds") == 42.5

    def test_no_run_waiting_reads_as_age_zero(self, server, metrics):
        metrics.set_oldest_waiting(NOW - 120)
        metrics.set_oldest_waiting(None)

        assert value(scrape(server), "evalpush_oldest_waiting_run_age_seconds") == 0

    def test_a_state_the_ledger_gains_later_is_served_and_reset_like_the_others(
        self, server, metrics
    ):
        metrics.set_runs({"parked": 2})
        metrics.set_runs({})

        assert value(scrape(server), "evalpush_runs", state="parked") == 0

    def test_the_ledger_size_is_the_database_and_its_wal_on_disk(self, server, world):
        with closing(sqlite3.connect(world.ledger)) as db:  # open: the WAL stays on disk
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("CREATE TABLE runs (id TEXT, body BLOB)")
            rows = [(str(i), b"x" * 4096) for i in range(50)]
            db.executemany("INSERT INTO runs VALUES (?, ?)", rows)
            db.commit()
            wal_bytes = world.ledger.with_name("state.db-wal").stat().st_size
            on_disk = world.ledger.stat().st_size + wal_bytes

            served = value(scrape(server), "evalpush_ledger_size_bytes")

        assert wal_bytes > 0
        assert served == on_disk > 50 * 4096


class TestRequests:
    def test_each_attempt_of_the_real_client_is_counted_by_endpoint_and_outcome(
        self, server, metrics, local_platform, tmp_path
    ):
        def client(base_url: str) -> PlatformClient:
            config = PlatformConfig(api_base_url=base_url, connect_timeout_seconds=2.0)
            environ = {"PRIME_API_KEY": local_platform.api_key or "any-key"}
            return PlatformClient(config, environ=environ, home=tmp_path, observer=metrics)

        with client(local_platform.base_url) as platform_client:
            platform_client.probe()
            local_platform.inject("status", on="read", status=503)
            local_platform.inject("status", on="read", status=429, retry_after="1")
            for expected in (errors.Transient, errors.Transient):
                with pytest.raises(expected):
                    platform_client.probe()
            local_platform.inject("status", on="read", status=401)
            with pytest.raises(errors.AuthError):
                platform_client.get_evaluation("any")
        with (
            client(f"http://127.0.0.1:{closed_port()}") as nobody,
            pytest.raises(errors.Unreachable),
        ):
            nobody.probe()

        samples = scrape(server)

        def requests(endpoint: Endpoint, outcome: RequestOutcome) -> float:
            name = "evalpush_platform_requests_total"
            return value(samples, name, endpoint=endpoint, outcome=outcome)

        assert requests(Endpoint.PROBE, RequestOutcome.OK) == 1
        assert requests(Endpoint.PROBE, RequestOutcome.TRANSIENT) == 1
        assert requests(Endpoint.PROBE, RequestOutcome.THROTTLED) == 1
        assert requests(Endpoint.PROBE, RequestOutcome.UNREACHABLE) == 1
        assert requests(Endpoint.GET_EVALUATION, RequestOutcome.AUTH) == 1
        durations = "evalpush_platform_request_duration_seconds_count"
        assert value(samples, durations, endpoint=Endpoint.PROBE) == 4

    @pytest.mark.parametrize(
        "error, outcome",
        [
            (None, RequestOutcome.OK),
            (
                errors.from_transport_error(httpx.ConnectError("refused"), what="x"),
                RequestOutcome.UNREACHABLE,
            ),
            (
                errors.from_transport_error(httpx.ReadTimeout("slow"), what="x"),
                RequestOutcome.AMBIGUOUS,
            ),
            (errors.Transient("full"), RequestOutcome.TRANSIENT),
            (errors.from_status(502, what="x"), RequestOutcome.AMBIGUOUS),
            (errors.from_status(429, what="x"), RequestOutcome.THROTTLED),
            (errors.from_status(503, what="x"), RequestOutcome.TRANSIENT),
            (errors.from_status(401, what="x"), RequestOutcome.AUTH),
            (errors.from_status(403, what="x"), RequestOutcome.AUTH),
            (errors.from_status(404, what="x"), RequestOutcome.REFUSED),
            (errors.from_status(409, what="x"), RequestOutcome.REFUSED),
            (errors.from_status(422, what="x"), RequestOutcome.REFUSED),
            (errors.from_status(418, what="x"), RequestOutcome.REFUSED),
            (KeyError("bug"), RequestOutcome.ERROR),
        ],
    )
    def test_the_outcome_is_read_from_the_class_errors_gave(self, error, outcome):
        assert outcome_of(error) is outcome


class TestHealth:
    def test_readyz_is_503_while_unreachable_past_the_threshold_and_200_again_after(
        self, server, world
    ):
        assert (healthz(server).status_code, healthz(server).text) == (200, "ok\n")
        world.unreachable = THRESHOLD_SECONDS
        assert healthz(server).status_code == 200  # at the threshold, not yet past it

        world.unreachable = THRESHOLD_SECONDS + 125
        unready = healthz(server)

        assert unready.status_code == 503
        assert unready.text == (
            "platform unreachable for 12m05s (over metrics.unhealthy_after_seconds = 600)\n"
        )
        world.unreachable = 0.0
        assert healthz(server).status_code == 200

    def test_livez_and_healthz_stay_200_through_an_outage_a_refused_key_and_a_bad_ledger(
        self, server, world
    ):
        world.unreachable = 10 * THRESHOLD_SECONDS
        world.key_refused = True
        world.ledger_problem = "database or disk is full"

        assert healthz(server).status_code == 503
        for path in ("/livez", "/healthz"):
            assert (healthz(server, path).status_code, healthz(server, path).text) == (200, "ok\n")

    def test_livez_and_healthz_are_503_once_the_loop_stops_turning(self, server, world):
        world.loop_idle = 61

        for path in ("/livez", "/healthz"):
            response = healthz(server, path)
            assert (response.status_code, response.text) == (
                503,
                "the daemon's loop has not turned for 1m01s\n",
            )
        assert healthz(server).status_code == 200, "readiness is about the platform and ledger"

    def test_a_refused_key_makes_readyz_503(self, server, world):
        world.key_refused = True

        response = healthz(server)

        assert (response.status_code, response.text) == (
            503,
            "the platform refuses the API key (or none is set)\n",
        )

    def test_a_ledger_problem_is_503_with_its_reason(self, server, world):
        world.ledger_problem = "database or disk is full"

        response = healthz(server)

        assert (response.status_code, response.text) == (503, "ledger: database or disk is full\n")

    def test_every_reason_is_given_one_a_line(self, server, world):
        world.unreachable = 3 * 3600 + 7
        world.ledger_problem = "locked"

        assert healthz(server).text.splitlines() == [
            "platform unreachable for 3h00m (over metrics.unhealthy_after_seconds = 600)",
            "ledger: locked",
        ]

    def test_a_probe_that_fails_is_503_naming_the_failure(self, server, world):
        world.fail_probe = RuntimeError("gate closed for good")

        response = healthz(server)

        assert response.status_code == 503
        assert response.text == "health check failed: RuntimeError: gate closed for good\n"


class TestServer:
    def test_other_paths_are_404_and_other_methods_405(self, server):
        assert httpx.get(f"{server.url}/", timeout=HTTP_TIMEOUT_SECONDS).status_code == 404
        assert httpx.post(f"{server.url}/metrics", timeout=HTTP_TIMEOUT_SECONDS).status_code == 405

    def test_stop_ends_every_thread_and_closes_the_port(self, world, metrics):
        server = MetricsServer(metrics, Health(world.probes(), THRESHOLD_SECONDS), "127.0.0.1", 0)
        server.start()
        url = server.url
        scrape(server)
        assert len(metrics_threads()) == 1

        server.stop()

        assert metrics_threads() == []
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{url}/healthz", timeout=HTTP_TIMEOUT_SECONDS)
        server.stop()  # a second stop is harmless

    def test_a_second_start_is_refused_rather_than_leaking_the_first_server(self, server):
        with pytest.raises(RuntimeError, match="already started"):
            server.start()

        assert len(metrics_threads()) == 1

    def test_a_client_that_sends_nothing_does_not_hold_up_stop(self, world, metrics):
        before = set(threading.enumerate())
        server = MetricsServer(metrics, Health(world.probes(), THRESHOLD_SECONDS), "127.0.0.1", 0)
        server.start()
        with socket.create_connection(server.address, timeout=HTTP_TIMEOUT_SECONDS) as silent:
            silent.sendall(b"GET /metr")  # a request begun and never finished
            assert healthz(server).status_code == 200  # others are still served meanwhile
            server.stop()  # the default deadline is 10 s: a stop that waited would show below
            assert silent.recv(1) == b""  # the server closed it

        assert [t.name for t in set(threading.enumerate()) - before] == []

    def test_a_client_trickling_bytes_is_cut_off_at_the_whole_request_deadline(
        self, world, metrics
    ):
        server = MetricsServer(
            metrics,
            Health(world.probes(), THRESHOLD_SECONDS),
            "127.0.0.1",
            0,
            request_deadline=1.0,
        )
        request = b"GET /metrics HTTP/1.1\r\nX-Slow: " + b"a" * 200
        with server, socket.create_connection(server.address, timeout=30) as slow:
            sent = 0
            while sent < len(request) and not closed_by_peer(slow):
                try:  # a byte every 0.3 s: each read alone is quick, the whole never ends
                    slow.sendall(request[sent : sent + 1])
                except (BrokenPipeError, ConnectionResetError):
                    break
                sent += 1
                time.sleep(0.3)

            assert closed_by_peer(slow)
        assert sent < len(request), "cut off at the 1 s deadline, before the request ended"

    def test_idle_connections_past_the_cap_close_the_oldest_idle_ones_and_livez_answers_meanwhile(
        self, world, metrics
    ):
        server = MetricsServer(metrics, Health(world.probes(), THRESHOLD_SECONDS), "127.0.0.1", 0)
        with server:
            idle = [
                socket.create_connection(server.address, timeout=HTTP_TIMEOUT_SECONDS)
                for _ in range(MAX_CONNECTIONS + 8)  # 40 held open, sending nothing
            ]
            try:
                live = httpx.get(f"{server.url}/livez", timeout=HTTP_TIMEOUT_SECONDS)
                assert live.status_code == 200 and live.text == "ok\n"
                assert idle[0].recv(1) == b"", "the oldest idle connection made room"
            finally:
                for conn in idle:
                    conn.close()
            assert healthz(server).status_code == 200

    def test_a_request_whose_headers_never_end_counts_as_idle_and_makes_room_too(
        self, world, metrics
    ):
        server = MetricsServer(metrics, Health(world.probes(), THRESHOLD_SECONDS), "127.0.0.1", 0)
        with server, socket.create_connection(server.address, timeout=30) as begun:
            begun.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n")  # headers not ended yet
            idle = [
                socket.create_connection(server.address, timeout=HTTP_TIMEOUT_SECONDS)
                for _ in range(MAX_CONNECTIONS + 8)
            ]
            try:
                assert healthz(server).status_code == 200
            finally:
                for conn in idle:
                    conn.close()
            assert begun.recv(1) == b"", "a request not ended is idle too: made room"

    def test_an_idle_connection_that_times_out_logs_one_json_line_and_no_traceback(
        self, world, metrics, capfd
    ):
        server = MetricsServer(
            metrics,
            Health(world.probes(), THRESHOLD_SECONDS),
            "127.0.0.1",
            0,
            request_deadline=0.2,
        )
        with server, socket.create_connection(server.address, timeout=30) as idle:
            assert idle.recv(1) == b""  # closed by the server at its deadline

        captured = capfd.readouterr()
        assert "Traceback" not in captured.out + captured.err
        assert "Exception occurred during processing" not in captured.out + captured.err

    def test_no_created_series_and_the_process_collector_is_served(self, server):
        names = {name for name, _ in scrape(server)}

        assert not [name for name in names if name.endswith("_created")]
        assert {"process_cpu_seconds_total", "process_resident_memory_bytes"} <= names

    def test_ipv6_loopback_is_served(self, world, metrics):
        if not ipv6_loopback():
            pytest.skip("no IPv6 loopback on this machine")
        with MetricsServer(metrics, Health(world.probes(), THRESHOLD_SECONDS), "::1", 0) as server:
            assert server.url.startswith("http://[::1]:")
            assert healthz(server).status_code == 200
            assert value(scrape(server), "evalpush_retries_total") == 0

    def test_a_port_in_use_is_a_config_error_naming_metrics_listen(self, world, metrics):
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            server = MetricsServer(
                metrics, Health(world.probes(), THRESHOLD_SECONDS), "127.0.0.1", port
            )

            with pytest.raises(ConfigError, match=rf"metrics.listen = '127.0.0.1:{port}'"):
                server.start()

        assert metrics_threads() == []


class TestFromConfig:
    def test_no_listen_address_means_no_server(self, world, metrics):
        assert server_for(MetricsConfig(), metrics, world.probes()) is None

    def test_the_configured_address_and_threshold_are_used(self, world, metrics):
        config = MetricsConfig(listen="127.0.0.1:0", unhealthy_after_seconds=5)
        server = server_for(config, metrics, world.probes())
        assert server is not None
        world.unreachable = 6

        with server:
            response = healthz(server)

        assert response.status_code == 503
        assert "over metrics.unhealthy_after_seconds = 5" in response.text


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


# ---------------------------------------------------------------- the daemon's feed


@dataclass
class Row:
    """The fields of a ledger row the feed reads."""

    run_id: str
    samples_sent: int
    bytes_sent: int
    state: str = "uploading"
    updated_at: float = NOW


class Recorder:
    """A RequestObserver that keeps what it heard."""

    def __init__(self) -> None:
        self.heard: list[tuple[str, RequestOutcome]] = []

    def request_done(self, endpoint: Endpoint, error: BaseException | None, seconds: float) -> None:
        assert seconds >= 0
        self.heard.append((endpoint, outcome_of(error)))


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def observed_client(local_platform, tmp_path, recorder) -> Iterator[PlatformClient]:
    """A client of the local platform that reports every attempt to `recorder`."""
    home = tmp_path / "home"
    home.mkdir()
    config = PlatformConfig(
        api_base_url=local_platform.base_url, connect_timeout_seconds=2, read_timeout_seconds=5
    )
    environ = {"PRIME_API_KEY": local_platform.api_key or "any-key"}
    with PlatformClient(config, environ=environ, home=home, observer=recorder) as client:
        yield client


class TestTheClientsRequestsAreObserved:
    def test_each_attempt_is_heard_with_its_endpoint_and_outcome(self, observed_client, recorder):
        client = observed_client
        env_id = client.resolve_environment("gsm8k")
        client.probe()
        list(client.iter_evaluations("gsm8k"))
        with pytest.raises(errors.Gone):
            client.get_evaluation("no-such-evaluation")

        assert recorder.heard == [
            ("resolve_environment", RequestOutcome.OK),
            ("probe", RequestOutcome.OK),
            ("list_evaluations", RequestOutcome.OK),
            ("get_evaluation", RequestOutcome.REFUSED),
        ]
        assert env_id and {endpoint for endpoint, _ in recorder.heard} <= set(Endpoint)

    def test_an_attempt_that_cannot_connect_is_heard_as_unreachable(
        self, observed_client, recorder, local_platform
    ):
        local_platform.inject("refuse", seconds=2)
        with pytest.raises(errors.Unreachable):
            observed_client.probe()

        assert recorder.heard == [("probe", RequestOutcome.UNREACHABLE)]


class TestDaemonFeed:
    def test_batches_count_what_was_sent_since_the_last_and_a_restart_counts_from_zero(self):
        feed = DaemonFeed(clock=lambda: NOW)
        feed.batch_acked(Row("a", 10, 1000))
        feed.batch_acked(Row("a", 25, 2500))
        feed.batch_acked(Row("b", 5, 400))
        feed.batch_acked(Row("a", 3, 300))  # started over (a replaced file): counts from 0
        feed.upload_done(Row("a", 3, 300, state="finalized"))

        samples = {
            s.name: s.value
            for family in feed.metrics.registry.collect()
            for s in family.samples
            if not s.labels
        }
        assert samples["evalpush_samples_sent_total"] == 25 + 5 + 3
        assert samples["evalpush_samples_sent_bytes_total"] == 2500 + 400 + 300
        assert samples["evalpush_last_upload_success_timestamp_seconds"] == NOW

    def test_finalized_failed_and_set_aside_are_counted_once_per_run_however_often_it_ends(self):
        feed = DaemonFeed(clock=lambda: NOW)
        feed.upload_done(Row("a", 0, 0, state="failed"), set_aside=2)
        feed.upload_done(Row("a", 9, 900, state="finalized"), set_aside=3)  # retried: 1 new
        feed.upload_done(Row("b", 4, 400, state="finalized"))
        feed.upload_done(Row("c", 0, 0, state="held"), set_aside=1)

        samples = {
            s.name: s.value
            for family in feed.metrics.registry.collect()
            for s in family.samples
            if not s.labels
        }
        assert samples["evalpush_runs_finalized_total"] == 2
        assert samples["evalpush_runs_failed_total"] == 1
        assert samples["evalpush_records_set_aside_total"] == 3 + 1

    def test_the_loop_turning_is_what_livez_reads(self):
        now = [100.0]
        feed = DaemonFeed(monotonic=lambda: now[0])
        health = Health(feed.probes, THRESHOLD_SECONDS)
        now[0] += 59
        assert health.liveness() == []
        now[0] += 2
        assert health.liveness() == ["the daemon's loop has not turned for 1m01s"]
        feed.loop_turned()
        assert health.liveness() == []

    def test_refresh_reads_runs_by_state_and_the_oldest_waiting_run_and_a_ledger_failure(
        self, tmp_path
    ):
        class Ledger:
            fail = False

            def in_state(self, *states):
                if self.fail:
                    raise errors.LedgerError("state.db: disk I/O error")
                return [Row("a", 0, 0, "ready", NOW - 90), Row("b", 0, 0, "uploading", NOW - 5)]

        feed = DaemonFeed(clock=lambda: NOW)
        ledger = Ledger()
        feed.refresh(ledger, {"finalized": 3, "ready": 1})  # the daemon's `RunCounts`
        health = Health(feed.probes, THRESHOLD_SECONDS)

        values = {
            (s.name, s.labels.get("state")): s.value
            for family in feed.metrics.registry.collect()
            for s in family.samples
        }
        assert (
            values[("evalpush_runs", "finalized")] == 3 and values[("evalpush_runs", "ready")] == 1
        )
        assert values[("evalpush_oldest_waiting_run_age_seconds", None)] == 90
        assert health.readiness() == []
        ledger.fail = True
        feed.refresh(ledger, {"finalized": 3, "ready": 1})
        assert health.readiness() == ["ledger: state.db: disk I/O error"]
        ledger.fail = False
        feed.refresh(ledger, errors.LedgerUnavailable("the shared ledger is unreachable"))
        assert health.readiness() == ["ledger: the shared ledger is unreachable"]

    def test_attach_serves_where_listen_says_and_moves_when_it_changes(self, tmp_path):
        class Gate:
            mode = "open"

            def unreachable_seconds(self) -> float:
                return 0.0

        feed = DaemonFeed()
        try:
            feed.attach(MetricsConfig(listen="127.0.0.1:0"), Gate(), tmp_path / "state.db")
            first = feed.url
            assert first is not None and healthz_at(first).status_code == 200
            feed.attach(MetricsConfig(listen="127.0.0.1:0"), Gate(), tmp_path / "state.db")
            assert feed.url == first, "the same configuration keeps the server"
            feed.attach(MetricsConfig(listen=""), Gate(), tmp_path / "state.db")
            assert feed.url is None and metrics_threads() == []
        finally:
            feed.stop()


def healthz_at(url: str) -> httpx.Response:
    return httpx.get(f"{url}/healthz", timeout=HTTP_TIMEOUT_SECONDS)
