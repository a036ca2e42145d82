"""The daemon as an operator sees it during a real outage of the local platform and after it:
`/metrics`, `/livez` and `/readyz` scraped from a running `evalpush run` subprocess, its log (JSON lines
with the syslog priority journald reads), and `evalpush status` showing its gate.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from evalpush.local_platform import LocalPlatform
from evalpush.service.server import REQUEST_DEADLINE_SECONDS
from support.environ import cli_environ
from support.runs import RUN_ID, write_run
from support.waiting import wait_until

SAFETY_SECONDS = 60.0
OUTAGE_SECONDS = 6.0
"""Past the first "still unreachable" report (5 s) and the daemon's STATUS tick (5 s)."""


class Daemon:
    """`python -m evalpush run` with its JSON log lines read as they come (each line under
    systemd: `<priority>{...}`)."""

    def __init__(self, env: dict[str, str], config: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "evalpush", "--config", str(config), "run"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[tuple[int, dict[str, Any]]] = []
        self.raw: list[str] = []
        self._reader = threading.Thread(target=self._read, name="daemon-log")
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.raw.append(line)
            match = re.fullmatch(r"<(\d)>(\{.*\})\n", line)
            if match:
                self.lines.append((int(match[1]), json.loads(match[2])))

    def event(self, name: str) -> tuple[int, dict[str, Any]] | None:
        return next(((p, e) for p, e in list(self.lines) if e["event"] == name), None)

    def wait_for_event(self, name: str) -> tuple[int, dict[str, Any]]:
        wait_for(lambda: self.event(name) is not None, f"log event {name!r}", self)
        found = self.event(name)
        assert found is not None
        return found

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(SAFETY_SECONDS)
        self._reader.join(SAFETY_SECONDS)
        return code


def wait_for(condition: Callable[[], Any], what: str, daemon: Daemon | None = None) -> Any:
    """`wait_until` within SAFETY_SECONDS, showing the daemon's last lines if it times out."""
    explain = (lambda: "".join(daemon.raw[-30:])) if daemon else None
    return wait_until(condition, what, timeout=SAFETY_SECONDS, explain=explain)


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """`/metrics` as {(sample name, sorted labels): value}."""
    status, text = get(f"{url}/metrics")
    assert status == 200
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


@pytest.fixture
def daemon(platform: LocalPlatform, tmp_path: Path) -> Iterator[Daemon]:
    root = tmp_path / "outputs"
    root.mkdir()
    config = tmp_path / "evalpush.toml"
    config.write_text(
        f'[watch]\nroots = ["{root}"]\nrescan_seconds = 1\n'
        '[metrics]\nlisten = "127.0.0.1:0"\nunhealthy_after_seconds = 1\n'
    )
    env = cli_environ(platform, tmp_path, INVOCATION_ID="0123456789abcdef")  # as systemd sets it
    started = Daemon(env, config)
    try:
        yield started
    finally:
        started.stop()


def status(platform: LocalPlatform, tmp_path: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "evalpush", "status"],
        env=cli_environ(platform, tmp_path),
        capture_output=True,
        text=True,
        timeout=SAFETY_SECONDS,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_metrics_health_log_and_status_during_a_real_outage_and_after_it(
    daemon: Daemon, platform: LocalPlatform, tmp_path: Path
) -> None:
    _, serving = daemon.wait_for_event("serving /metrics, /livez and /readyz")
    url = serving["url"]
    for path in ("/livez", "/readyz", "/healthz"):
        assert get(f"{url}{path}") == (200, "ok\n"), path

    platform.inject("refuse", seconds=OUTAGE_SECONDS)
    write_run(tmp_path / "outputs")  # 4 of 4 expected traces: ready at once

    priority, started = daemon.wait_for_event(
        "platform unreachable: uploads wait while one probe checks it"
    )
    assert priority == 4 and started["outage"] == "unreachable"
    health = wait_for(
        lambda: (lambda h: h if h[0] == 503 else None)(get(f"{url}/readyz")),
        "/readyz to turn 503",
        daemon,
    )
    assert get(f"{url}/livez") == (200, "ok\n"), "the daemon is alive through the outage"
    assert get(f"{url}/healthz") == (200, "ok\n"), "the liveness check earlier versions served"
    assert re.fullmatch(
        r"platform unreachable for [1-9]s \(over metrics.unhealthy_after_seconds = 1\)\n",
        health[1],
    ), health
    during = scrape(url)
    assert value(during, "evalpush_platform_unreachable_seconds") > 1
    unreachable = [
        v
        for (name, labels), v in during.items()
        if name == "evalpush_platform_requests_total" and ("outcome", "unreachable") in labels
    ]
    assert sum(unreachable) >= 2, "the failed call and at least one probe"
    shown = wait_for(
        lambda: (lambda text: text if "platform unreachable for" in text else None)(
            status(platform, tmp_path)
        ),
        "status to show the daemon's gate",
        daemon,
    )
    assert re.search(
        rf"^daemon:     pid {daemon.process.pid}: platform unreachable for \d+s, \d+ attempts, "
        r"next in \d+s; 1 upload paused \(",
        shown,
        re.M,
    ), shown
    reports = wait_for(
        lambda: [
            (p, e)
            for p, e in list(daemon.lines)
            if e["event"].startswith("platform unreachable for")
        ],
        "a report of the outage going on",
        daemon,
    )
    priority, ongoing = reports[0]
    assert priority == 4 and ongoing["runs_waiting"] == 1 and ongoing["attempts"] >= 2

    priority, finalized = daemon.wait_for_event("run finalized")
    priority_ended, ended = daemon.wait_for_event("platform answers again: uploads resume")
    assert (priority, priority_ended) == (6, 6)
    assert finalized["samples"] == 4 and finalized["run"] == RUN_ID
    assert ended["seconds"] >= OUTAGE_SECONDS - 1 and ended["attempts"] >= 2

    for path in ("/livez", "/readyz"):
        assert get(f"{url}{path}") == (200, "ok\n"), path
    after = wait_for(
        lambda: (lambda s: s if value(s, "evalpush_runs", state="finalized") == 1 else None)(
            scrape(url)
        ),
        "the runs gauge to count the finalized run",
        daemon,
    )
    assert value(after, "evalpush_platform_unreachable_seconds") == 0
    assert value(after, "evalpush_samples_sent_total") == 4
    assert value(after, "evalpush_samples_sent_bytes_total") == finalized["bytes"] > 0
    assert value(after, "evalpush_last_upload_success_timestamp_seconds") > time.time() - 120
    assert value(after, "evalpush_retries_total") >= ended["attempts"], "every attempt reported"
    assert value(after, "evalpush_runs_finalized_total") == 1
    assert "evalpush_samples_sent_created" not in {name for name, _ in after}
    assert value(after, "evalpush_oldest_waiting_run_age_seconds") == 0
    assert value(after, "evalpush_ledger_size_bytes") > 0
    ok = {
        dict(labels)["endpoint"]
        for (name, labels), v in after.items()
        if name == "evalpush_platform_requests_total" and ("outcome", "ok") in labels and v
    }
    assert {"resolve_environment", "create_evaluation", "push_samples", "finalize", "probe"} <= ok
    assert wait_for(
        lambda: (
            "daemon:     pid" in (text := status(platform, tmp_path))
            and "platform reachable" in text
        ),
        "status to show the platform reachable again",
        daemon,
    )

    assert daemon.stop() == 0
    assert re.search(
        rf"^daemon:     not running \(last seen pid {daemon.process.pid} at .*; stopped\)$",
        status(platform, tmp_path),
        re.M,
    ), "a stopped daemon is said to be, with its pid"
    assert all(re.match(r"<\d>\{", line) for line in daemon.raw), "every line prefixed"


STOP_WITHIN_SECONDS = REQUEST_DEADLINE_SECONDS / 2
"""SIGTERM ends the daemon sooner than a slow client could hold it: a stop that waited on one
would last until that request's deadline (a loaded 2-core box takes 2-3 s to stop anyway)."""
TRICKLE_SECONDS = 2.5
"""A slow client's pace: one byte every 2-3 s, each read alone far inside any read timeout."""


class Trickler:
    """Clients of the metrics port that each send a request one byte every TRICKLE_SECONDS,
    reconnecting whenever the server closes them, until `close`."""

    def __init__(self, url: str, count: int) -> None:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self._address = (host, int(port))
        self._done = threading.Event()
        self.connections = 0
        self._threads = [
            threading.Thread(target=self._trickle, name=f"trickler-{i}") for i in range(count)
        ]
        for thread in self._threads:
            thread.start()

    def _trickle(self) -> None:
        while not self._done.is_set():
            try:
                with socket.create_connection(self._address, timeout=10) as conn:
                    self.connections += 1
                    for byte in b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 10_000:
                        conn.sendall(bytes([byte]))
                        if self._done.wait(TRICKLE_SECONDS):
                            return
            except OSError:
                if self._done.wait(0.2):  # refused while the server moves: try again
                    return

    def close(self) -> None:
        self._done.set()
        for thread in self._threads:
            thread.join()


def test_slow_metrics_clients_stall_neither_a_reload_of_metrics_nor_sigterm(
    platform: LocalPlatform, tmp_path: Path
) -> None:
    root = tmp_path / "outputs"
    root.mkdir()
    config = tmp_path / "evalpush.toml"
    with socket.socket() as probe:  # a fixed port: the clients find the server again after a reload
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = (
        f'[watch]\nroots = ["{root}"]\nrescan_seconds = 1\n[metrics]\nlisten = "127.0.0.1:{port}"\n'
    )
    config.write_text(settings)
    daemon = Daemon(cli_environ(platform, tmp_path, INVOCATION_ID="0123456789abcdef"), config)
    trickler: Trickler | None = None
    try:
        _, serving = daemon.wait_for_event("serving /metrics, /livez and /readyz")
        trickler = Trickler(serving["url"], count=8)
        wait_for(lambda: trickler.connections >= 8, "the slow clients to connect", daemon)

        config.write_text(settings + "unhealthy_after_seconds = 30\n")  # [metrics] changed
        daemon.process.send_signal(signal.SIGHUP)
        daemon.wait_for_event("reload: rebuilding from the configuration")
        for n in range(3):
            write_run(root, run_id=f"1111111{n}-1111-4111-8111-111111111111")
        wait_for(
            lambda: len([e for _, e in list(daemon.lines) if e["event"] == "run finalized"]) == 3,
            "the 3 runs written after the reload to be uploaded",
            daemon,
        )
        wait_for(
            lambda: trickler.connections >= 16, "the slow clients to hold the new server", daemon
        )

        started = time.monotonic()
        daemon.process.send_signal(signal.SIGTERM)
        code = daemon.process.wait(SAFETY_SECONDS)
        stopped_in = time.monotonic() - started
    finally:
        if trickler is not None:
            trickler.close()
        daemon.stop()

    assert code == 0
    assert stopped_in < STOP_WITHIN_SECONDS, f"SIGTERM took {stopped_in:.1f} s"
    assert all(re.match(r"<\d>\{", line) for line in daemon.raw), "only JSON lines"
    assert not daemon.process.stderr or "Traceback" not in daemon.process.stderr.read()
