"""`evalpush local-platform` as its own process, so it outlives every uploader the soak kills.

Reached only over HTTP on loopback (its control API: faults, summary, stored samples). While an
outage (`refuse`) is on, the platform's port is closed to the soak too, so every control call
retries a refused connection until a deadline.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

START_TIMEOUT_SECONDS = 30.0
CONTROL_TIMEOUT_SECONDS = 120.0  # a summary of a large store, or an outage, can take a while
CONTROL_RETRY_SECONDS = 0.1
STOP_TIMEOUT_SECONDS = 30.0
PLATFORM_LOG = "platform.log"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_environ(**values: str) -> dict[str, str]:
    """This process's environment without PRIME_* / EVALPUSH_* settings, plus `values`."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("PRIME_", "EVALPUSH_"))}
    environ.update(values)
    return environ


class PlatformProcess:
    """The local platform with a SQLite `--db` in `workdir`, on a free loopback port."""

    def __init__(self, workdir: Path, api_key: str) -> None:
        self.api_key = api_key
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.db = workdir / "platform.db"
        self.log_path = workdir / "logs" / PLATFORM_LOG
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        command = [sys.executable, "-m", "evalpush", "local-platform", "--host", "127.0.0.1"]
        command += ["--port", str(self.port), "--api-key", api_key, "--db", str(self.db)]
        self.proc = subprocess.Popen(
            command, stdout=self._log, stderr=subprocess.STDOUT, env=clean_environ()
        )
        try:
            self.request("GET", "/_control/summary", timeout=START_TIMEOUT_SECONDS)
        except BaseException:
            self.stop()
            raise

    def request(
        self, method: str, path: str, body: Any = None, *, timeout: float = CONTROL_TIMEOUT_SECONDS
    ) -> Any:
        """One control or API call; a refused or dropped connection is retried until `timeout`."""
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"Bearer {self.api_key}", "Content-Type": "application/json"}
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"the local platform exited with {self.proc.returncode}; see {self.log_path}"
                )
            request = urllib.request.Request(
                self.base_url + path, data=data, headers=headers, method=method
            )
            try:
                with urllib.request.urlopen(request, timeout=timeout) as response:
                    return json.loads(response.read())
            except urllib.error.HTTPError:
                raise
            except OSError:  # refused during an outage, or dropped as it began
                if time.monotonic() > deadline:
                    raise
                time.sleep(CONTROL_RETRY_SECONDS)

    def summary(self) -> dict[str, Any]:
        return self.request("GET", "/_control/summary")

    def samples(self, evaluation_id: str) -> list[dict[str, Any]]:
        return self.request("GET", f"/_control/evaluations/{evaluation_id}/samples")["samples"]

    def inject(self, fault: dict[str, Any]) -> None:
        self.request("POST", "/_control/faults", fault)

    def pending_faults(self) -> list[dict[str, Any]]:
        return self.request("GET", "/_control/faults")["pending"]

    def clear_faults(self) -> None:
        self.request("DELETE", "/_control/faults")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
