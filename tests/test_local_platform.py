"""The local platform: `evalpush local-platform` as a real process, and the in-process API."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from as_nobody import NOBODY, as_nobody
from browser import Page
from evalpush.cli import main
from evalpush.local_platform import MAX_BODY_BYTES, LocalPlatform

START_SECONDS = 15.0
STOP_SECONDS = 10.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(base_url: str) -> float:
    """When the port at `base_url` accepted a connection again (monotonic), polling for 5 s."""
    port = int(base_url.rsplit(":", 1)[1])
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port)):
                return time.monotonic()
        except ConnectionRefusedError:
            time.sleep(0.02)
    pytest.fail(f"port {port} did not reopen")


@dataclass
class Served:
    """A `evalpush local-platform` process and a client for it."""

    process: subprocess.Popen[bytes]
    base_url: str
    api_key: str
    http: httpx.Client

    def api(self, method: str, path: str, body: Any = None, **kwargs: Any) -> httpx.Response:
        if body is not None:
            kwargs["content"] = orjson.dumps(body)
        return self.http.request(method, f"{self.base_url}{path}", **kwargs)

    def create(self, run_id: str) -> str:
        env_id = self.api("POST", "/api/v1/environmentshub/resolve", {"name": "gsm8k"}).json()[
            "data"
        ]["id"]
        body = {
            "name": f"gsm8k--m--{run_id}",
            "environments": [{"id": env_id}],
            "metadata": {"run_id": run_id},
        }
        answer = self.api("POST", "/api/v1/evaluations/", body)
        assert answer.status_code == 200, answer.text
        return answer.json()["evaluation_id"]

    def summary(self) -> dict[str, Any]:
        return self.api("GET", "/_control/summary").json()

    def stop(self, signum: int = signal.SIGTERM) -> tuple[int, str]:
        self.http.close()
        self.process.send_signal(signum)
        out, _ = self.process.communicate(timeout=STOP_SECONDS)
        return self.process.returncode, out.decode()


def serve(port: int, key: str, *extra: str) -> subprocess.Popen[bytes]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("EVALPUSH_", "PRIME_"))}
    command = [
        sys.executable,
        "-m",
        "evalpush",
        "local-platform",
        "--port",
        str(port),
        "--api-key",
        key,
    ]
    return subprocess.Popen(
        [*command, *extra], env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )


def wait_until_serving(process: subprocess.Popen[bytes], base_url: str, key: str) -> httpx.Client:
    http = httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=10.0)
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            http.close()
            pytest.fail(
                f"local-platform exited {process.returncode}: {process.stdout.read().decode()}"
            )  # type: ignore[union-attr]
        try:
            http.get(f"{base_url}/_control/faults")
            return http
        except httpx.TransportError:
            time.sleep(0.05)
    http.close()
    process.kill()
    pytest.fail("local-platform did not start listening in time")


@pytest.fixture
def api(local_platform: LocalPlatform) -> Iterator[tuple[httpx.Client, str]]:
    """A plain httpx client on the in-process platform's API, and a resolved environment id."""
    headers = {"Authorization": f"Bearer {local_platform.api_key}"}
    with httpx.Client(base_url=f"{local_platform.base_url}/api/v1", headers=headers) as http:
        env_id = http.post("/environmentshub/resolve", json={"name": "gsm8k"}).json()["data"]["id"]
        yield http, env_id


@pytest.fixture
def start_served() -> Iterator[Callable[..., Served]]:
    started: list[Served] = []

    def start(*extra: str, port: int | None = None) -> Served:
        port = port or free_port()
        key = f"subprocess-key-{port}"
        process = serve(port, key, *extra)
        base_url = f"http://127.0.0.1:{port}"
        served = Served(process, base_url, key, wait_until_serving(process, base_url, key))
        started.append(served)
        return served

    yield start
    for served in started:
        served.http.close()
        if served.process.poll() is None:
            served.process.kill()
            served.process.communicate()


@pytest.fixture(scope="module")
def shared_served() -> Iterator[Served]:
    """One process for the tests that only need a fresh evaluation each."""
    port = free_port()
    key = f"subprocess-key-{port}"
    process = serve(port, key)
    base_url = f"http://127.0.0.1:{port}"
    served = Served(process, base_url, key, wait_until_serving(process, base_url, key))
    yield served
    assert served.stop()[0] == 0


@pytest.fixture
def served(shared_served: Served) -> Served:
    shared_served.api("DELETE", "/_control/faults")
    return shared_served


class TestServeCommand:
    def test_it_requires_the_bearer_key_and_exits_0_on_sigterm(
        self, start_served: Callable[..., Served]
    ) -> None:
        served = start_served()
        path = f"{served.base_url}/api/v1/evaluations/"
        assert httpx.get(path).status_code == 401
        assert httpx.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert httpx.get(f"{served.base_url}/_control/summary").status_code == 401
        assert served.api("GET", "/api/v1/evaluations/").status_code == 200
        code, output = served.stop(signal.SIGTERM)
        assert code == 0
        assert "local platform serving" in output and served.base_url in output
        assert served.api_key not in output

    def test_sigint_stops_it_cleanly_too(self, start_served: Callable[..., Served]) -> None:
        assert start_served().stop(signal.SIGINT)[0] == 0

    def test_a_busy_port_is_a_clear_error_and_exit_2(
        self, start_served: Callable[..., Served]
    ) -> None:
        first = start_served()
        port = first.base_url.rsplit(":", 1)[1]
        second = serve(int(port), "another-key")
        out, _ = second.communicate(timeout=STOP_SECONDS)
        assert second.returncode == 2
        assert f"cannot listen on 127.0.0.1:{port}" in out.decode()

    @pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
    def test_with_a_db_file_what_was_sent_survives_a_restart(
        self, start_served: Callable[..., Served], tmp_path: Path, signum: int
    ) -> None:
        """Stopped or killed: a kill leaves the writes in the database's write-ahead log, which
        the next start reads."""
        db = tmp_path / "platform.db"
        served = start_served("--db", str(db))
        evaluation_id = served.create("run-persisted")
        served.api(
            "POST", f"/api/v1/evaluations/{evaluation_id}/samples", {"samples": [{"sample_id": 1}]}
        )
        port = int(served.base_url.rsplit(":", 1)[1])
        assert served.stop(signum)[0] == (-signum if signum == signal.SIGKILL else 0)
        again = start_served("--db", str(db), port=port)
        evaluation = again.summary()["evaluations"][evaluation_id]
        assert evaluation["sample_count"] == 1 and again.summary()["runs"] == {"run-persisted": 1}

    def test_a_db_whose_directory_holds_no_log_is_a_clear_error_and_exit_2(
        self, open_dir: Path
    ) -> None:
        """The database keeps a write-ahead log beside it: a file its user may write in a
        directory where it may not create the log is said in one line (exit 2) at start, not a
        traceback. Run as `nobody` (root creates files anywhere) in a forked child, which
        cannot start a subprocess of this interpreter: `main` is called in it."""
        from evalpush.local_platform._store import Store

        directory = open_dir / "read-only"
        directory.mkdir()
        db = directory / "platform.db"
        Store(db).close()  # an existing database: the start itself writes nothing to the file
        if os.geteuid() == 0:
            os.chown(db, NOBODY, NOBODY)
        directory.chmod(0o555)

        def start() -> tuple[int, str]:
            signal.alarm(10)  # a platform that starts serving is killed: the test fails
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                code = main(["local-platform", "--port", "0", "--db", str(db)])
            return code, err.getvalue()

        try:
            code, err = as_nobody(start)
        finally:
            directory.chmod(0o755)
        assert code == 2, err
        assert err.startswith(f"evalpush: local platform: cannot use {db}") and "\n" == err[-1]
        assert err.count("\n") == 1 and "Traceback" not in err


class TestServedEndpoints:
    def test_a_body_over_25_mib_is_refused_with_413_declared_length_or_not(
        self, served: Served
    ) -> None:
        evaluation_id = served.create("run-413")
        path = f"/api/v1/evaluations/{evaluation_id}/samples"
        too_big = b'{"samples":[{"sample_id":1,"pad":"' + b"x" * MAX_BODY_BYTES + b'"}]}'
        assert served.api("POST", path, content=too_big).status_code == 413

        def chunks() -> Iterator[bytes]:
            for start in range(0, len(too_big), 1 << 20):
                yield too_big[start : start + (1 << 20)]

        assert served.api("POST", path, content=chunks()).status_code == 413
        assert served.summary()["evaluations"][evaluation_id]["sample_count"] == 0

    def test_a_body_of_exactly_25_mib_is_taken(self, served: Served) -> None:
        evaluation_id = served.create("run-25mib")
        head, tail = b'{"samples":[{"sample_id":1,"pad":"', b'"}]}'
        exact = head + b"x" * (MAX_BODY_BYTES - len(head) - len(tail)) + tail
        answer = served.api("POST", f"/api/v1/evaluations/{evaluation_id}/samples", content=exact)
        assert answer.status_code == 200 and answer.json()["accepted"] == 1

    @pytest.mark.parametrize(
        "body",
        [
            b'{"samples":[{"sample_id":1}',
            b'{"samples":[{"sample_id":"\xff"}]}',
            b"[" * 5000 + b"]" * 5000,
        ],
        ids=["truncated", "not UTF-8", "nested too deeply"],
    )
    def test_a_body_that_is_not_json_is_refused_with_422(self, served: Served, body: bytes) -> None:
        evaluation_id = served.create(f"run-422-{len(body)}")
        answer = served.api("POST", f"/api/v1/evaluations/{evaluation_id}/samples", content=body)
        assert answer.status_code == 422 and "not JSON" in answer.json()["detail"]
        assert served.summary()["evaluations"][evaluation_id]["sample_count"] == 0

    def test_duplicate_samples_are_stored_as_duplicates_and_counted(self, served: Served) -> None:
        evaluation_id = served.create("run-dups")
        path = f"/api/v1/evaluations/{evaluation_id}/samples"
        served.api("POST", path, {"samples": [{"sample_id": i} for i in (1, 2, 3)]})
        served.api("POST", path, {"samples": [{"sample_id": 3}]})
        evaluation = served.summary()["evaluations"][evaluation_id]
        assert (
            evaluation["sample_count"],
            evaluation["distinct_sample_ids"],
            evaluation["duplicates"],
        ) == (4, 3, 1)
        page = served.api("GET", path, params={"page": 1, "limit": 10}).json()
        assert [s["sample_id"] for s in page["samples"]] == [1, 2, 3, 3]
        assert (page["total"], page["total_pages"]) == (4, 1)

    def test_samples_and_a_second_finalize_after_finalize_get_409(self, served: Served) -> None:
        evaluation_id = served.create("run-409")
        path = f"/api/v1/evaluations/{evaluation_id}"
        assert (
            served.api("POST", f"{path}/finalize", {"metrics": {"avg_reward": 1}}).status_code
            == 200
        )
        assert served.api("POST", f"{path}/finalize", {"metrics": {}}).status_code == 409
        assert (
            served.api("POST", f"{path}/samples", {"samples": [{"sample_id": 1}]}).status_code
            == 409
        )
        assert served.api("PUT", path, {"status": "FAILED"}).status_code == 409
        evaluation = served.summary()["evaluations"][evaluation_id]
        assert (evaluation["status"], evaluation["finalize_count"], evaluation["sample_count"]) == (
            "COMPLETED",
            2,
            0,
        )

    def test_a_put_with_no_status_updates_metadata_and_metrics_and_leaves_the_status(
        self, served: Served
    ) -> None:
        evaluation_id = served.create("run-update")
        path = f"/api/v1/evaluations/{evaluation_id}"
        update = {"metadata": {"model": "m", "num_examples": 3}, "metrics": {"avg_reward": 0.5}}

        assert served.api("PUT", path, update).status_code == 200

        evaluation = served.summary()["evaluations"][evaluation_id]
        assert evaluation["status"] == "RUNNING"
        assert (evaluation["metadata"], evaluation["metrics"]) == (
            update["metadata"],
            update["metrics"],
        )
        assert served.api("POST", f"{path}/finalize", {"metrics": {}}).status_code == 200
        marked = {"metadata": {**update["metadata"], "evalpush": {"superseded_by": "e2"}}}
        assert served.api("PUT", path, marked).status_code == 200  # in any state: a mark
        evaluation = served.summary()["evaluations"][evaluation_id]
        assert (evaluation["status"], evaluation["metadata"]) == ("COMPLETED", marked["metadata"])
        assert served.api("PUT", path, ["not", "an", "object"]).status_code == 422
        assert served.api("PUT", path, {"status": "DONE"}).status_code == 422

    def test_a_fault_queued_through_the_control_endpoint_hits_the_next_request_of_its_kind(
        self, served: Served
    ) -> None:
        fault = {"fault": "status", "on": "read", "status": 503, "retry_after": "2", "count": 1}
        assert served.api("POST", "/_control/faults", fault).status_code == 200
        assert served.api("GET", "/_control/faults").json()["pending"][0]["status"] == 503
        assert (
            served.api("POST", "/api/v1/environmentshub/resolve", {"name": "x"}).status_code == 200
        )
        refused = served.api("GET", "/api/v1/evaluations/")
        assert (refused.status_code, refused.headers["Retry-After"]) == (503, "2")
        assert served.api("GET", "/api/v1/evaluations/").status_code == 200

    def test_a_refuse_fault_closes_the_port_for_a_while(self, served: Served) -> None:
        fault = {"fault": "refuse", "seconds": 1.0}
        asked_at = time.monotonic()  # the port closes after this, for a second
        assert served.api("POST", "/_control/faults", fault).status_code == 200
        with pytest.raises(httpx.ConnectError):
            served.api("GET", "/api/v1/evaluations/")
        assert wait_for_port(served.base_url) - asked_at >= 0.9
        assert served.api("GET", "/api/v1/evaluations/").status_code == 200

    @pytest.mark.parametrize(
        "fault",
        [
            {"fault": "explode"},
            {"fault": "status", "on": "everything"},
            {"fault": "status", "count": 0},
            [1],
        ],
    )
    def test_a_malformed_fault_is_refused_with_422(self, served: Served, fault: Any) -> None:
        assert served.api("POST", "/_control/faults", fault).status_code == 422


class TestInProcess:
    def test_refuse_closes_the_listening_socket_and_reopens_it_on_the_same_port(
        self, local_platform: LocalPlatform
    ) -> None:
        local_platform.inject("refuse", seconds=1.0)
        refused_at = time.monotonic()
        port = int(local_platform.base_url.rsplit(":", 1)[1])
        with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port)):
            pass
        assert wait_for_port(local_platform.base_url) - refused_at >= 0.9

    def test_the_port_stays_the_platforms_while_it_refuses(
        self, local_platform: LocalPlatform
    ) -> None:
        # Another server on the machine must not get the port meanwhile (clients would then talk
        # to it): a plain bind to it fails, and the platform listens on it again.
        local_platform.inject("refuse", seconds=1.0)
        port = int(local_platform.base_url.rsplit(":", 1)[1])
        with socket.socket() as other, pytest.raises(OSError) as taken:
            other.bind(("127.0.0.1", port))
        assert taken.value.errno == errno.EADDRINUSE
        wait_for_port(local_platform.base_url)  # and it listens on it again

    def test_faults_wait_for_a_request_of_their_kind_and_run_out_after_count(
        self, local_platform: LocalPlatform
    ) -> None:
        headers = {"Authorization": f"Bearer {local_platform.api_key}"}
        local_platform.inject("status", on="resolve", status=500, count=2)
        with httpx.Client(base_url=f"{local_platform.base_url}/api/v1", headers=headers) as http:
            assert http.get("/evaluations/").status_code == 200
            statuses = [
                http.post("/environmentshub/resolve", json={"name": "x"}).status_code
                for _ in range(3)
            ]
        assert statuses == [500, 500, 200]
        assert local_platform.summary()["requests"]["resolve"] == 3

    def test_a_listing_fault_passes_other_reads_by_and_waits_for_a_listing(
        self, local_platform: LocalPlatform
    ) -> None:
        headers = {"Authorization": f"Bearer {local_platform.api_key}"}
        control = f"{local_platform.base_url}/_control/faults"

        def pending() -> list[Any]:
            return httpx.get(control, headers=headers).json()["pending"]

        local_platform.inject("repeat_page", on="read", count=1)
        with httpx.Client(base_url=f"{local_platform.base_url}/api/v1", headers=headers) as http:
            env_id = http.post("/environmentshub/resolve", json={"name": "x"}).json()["data"]["id"]
            created = http.post(
                "/evaluations/", json={"name": "n", "environments": [{"id": env_id}]}
            )
            evaluation_id = created.json()["evaluation_id"]
            assert http.get(f"/evaluations/{evaluation_id}").json()["id"] == evaluation_id
            assert len(pending()) == 1, "a plain read did not take it"
            page = http.get("/evaluations/", params={"environment_name": "x", "skip": 5}).json()
        assert "skip" not in page and "total" not in page and len(page["evaluations"]) == 1
        assert pending() == []

    def test_the_fault_value_rides_on_a_queued_fault(self, served: Served) -> None:
        queued = served.api("POST", "/_control/faults", {"fault": "bad_id", "value": "x/y"})
        assert queued.status_code == 200 and queued.json()["injected"]["value"] == "x/y"

    def test_cleared_faults_no_longer_apply(self, local_platform: LocalPlatform) -> None:
        local_platform.inject("status", status=503, count=5)
        local_platform.clear_faults()
        headers = {"Authorization": f"Bearer {local_platform.api_key}"}
        assert (
            httpx.get(f"{local_platform.base_url}/api/v1/evaluations/", headers=headers).status_code
            == 200
        )

    def test_a_twice_fault_sends_the_answer_again_on_the_same_connection(
        self, local_platform: LocalPlatform
    ) -> None:
        local_platform.inject("twice", on="resolve", seconds=0)
        body = b'{"name": "env-twice"}'
        request = (
            b"POST /api/v1/environmentshub/resolve HTTP/1.1\r\nHost: x\r\n"
            b"Authorization: Bearer %s\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (local_platform.api_key.encode(), len(body), body)
        )
        host, port = local_platform.base_url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(request)
            received = b""
            while received.count(b"HTTP/1.1 200") < 2 or not received.endswith(b"}}"):
                chunk = sock.recv(65536)
                assert chunk, f"closed after {received!r}"
                received += chunk
        first, second = (part.split(b"\r\n\r\n")[1] for part in received.split(b"HTTP/1.1 ")[1:])
        assert first == second and b'"name":"env-twice"' in first  # the resolve's answer, twice

    def test_without_auth_any_key_or_none_is_accepted(self) -> None:
        with LocalPlatform(require_auth=False) as platform:
            assert platform.api_key is None
            assert httpx.get(f"{platform.base_url}/api/v1/evaluations/").status_code == 200

    def test_samples_returns_what_was_stored_in_arrival_order(
        self, local_platform: LocalPlatform, api: tuple[httpx.Client, str]
    ) -> None:
        http, env_id = api
        body = {"name": "n", "environments": [{"id": env_id}], "metadata": {"run_id": "r"}}
        evaluation_id = http.post("/evaluations/", json=body).json()["evaluation_id"]
        samples = f"/evaluations/{evaluation_id}/samples"
        http.post(samples, json={"samples": [{"sample_id": "b"}, {"sample_id": "a"}]})
        http.post(samples, json={"samples": [{"sample_id": "b"}]})
        assert [s["sample_id"] for s in local_platform.samples(evaluation_id)] == ["b", "a", "b"]

    def test_small_requests_go_on_while_big_batches_are_stored_and_every_one_is_kept(
        self, local_platform: LocalPlatform, api: tuple[httpx.Client, str]
    ) -> None:
        """Small calls run on the platform's event loop, big ones on its storage thread: both at
        once, from several clients, every request is answered and every sample kept once."""
        http, env_id = api
        headers = dict(http.headers)
        base = str(http.base_url)

        def create(run_id: str, client: httpx.Client) -> str:
            body = {"name": "n", "environments": [{"id": env_id}], "metadata": {"run_id": run_id}}
            return client.post("/evaluations/", json=body).json()["evaluation_id"]

        big = create("big", http)
        padding = "x" * 4000
        big_body = orjson.dumps(
            {"samples": [{"sample_id": f"s{i}", "pad": padding} for i in range(1000)]}
        )
        assert len(big_body) > 1024 * 1024  # stored on the storage thread

        def push_big(_: int) -> list[int]:
            with httpx.Client(base_url=base, headers=headers, timeout=60) as client:
                url = f"/evaluations/{big}/samples"
                return [client.post(url, content=big_body).status_code for _ in range(3)]

        def small_runs(worker: int) -> list[int]:
            statuses = []
            with httpx.Client(base_url=base, headers=headers, timeout=60) as client:
                for n in range(40):
                    evaluation = create(f"small-{worker}-{n}", client)
                    url = f"/evaluations/{evaluation}"
                    sample = {"samples": [{"sample_id": f"{worker}-{n}"}]}
                    statuses.append(client.post(f"{url}/samples", json=sample).status_code)
                    statuses.append(client.get(url).status_code)
                    statuses.append(
                        client.post(f"{url}/finalize", json={"metrics": {}}).status_code
                    )
            return statuses

        with ThreadPoolExecutor(max_workers=6) as pool:
            bigs = pool.map(push_big, range(2))
            smalls = pool.map(small_runs, range(4))
            statuses = [status for each in (*bigs, *smalls) for status in each]

        assert set(statuses) == {200} and len(statuses) == 2 * 3 + 4 * 40 * 3
        big_ids = [sample["sample_id"] for sample in local_platform.samples(big)]
        assert sorted(big_ids) == sorted(f"s{i}" for i in range(1000) for _ in range(6))
        completed = http.get("/evaluations/", params={"limit": 1000}).json()["evaluations"]
        small = [e for e in completed if e["metadata"]["run_id"].startswith("small-")]
        assert len(small) == 160 and {e["status"] for e in small} == {"COMPLETED"}

    def test_a_batch_with_one_bad_sample_is_refused_whole(
        self, local_platform: LocalPlatform, api: tuple[httpx.Client, str]
    ) -> None:
        http, env_id = api
        body = {"name": "n", "environments": [{"id": env_id}]}
        evaluation_id = http.post("/evaluations/", json=body).json()["evaluation_id"]
        batch = {"samples": [{"sample_id": 1}, {"reward": 0.5}]}
        answer = http.post(f"/evaluations/{evaluation_id}/samples", json=batch)
        assert answer.status_code == 422 and "samples[1]" in answer.json()["detail"]
        assert local_platform.samples(evaluation_id) == []
        assert local_platform.summary()["evaluations"][evaluation_id]["sample_count"] == 0

    def test_the_viewer_url_leads_to_the_evaluation(self, api: tuple[httpx.Client, str]) -> None:
        http, env_id = api
        body = {"name": "n", "environments": [{"id": env_id}]}
        viewer_url = http.post("/evaluations/", json=body).json()["viewer_url"]
        page = httpx.get(viewer_url)  # no key: a browser opens it
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert Page(page.text).find("h1")[0].content == "n RUNNING"

    def test_stop_twice_is_harmless(self) -> None:
        platform = LocalPlatform().start()
        platform.stop()
        platform.stop()


class TestSamplesIngest:
    """The samples endpoint stores each sample's bytes as sent, after checking what decoding did."""

    @pytest.fixture
    def push(self, api: tuple[httpx.Client, str]) -> Callable[..., httpx.Response]:
        """`push(body, evaluation_id=None)`: POST raw bytes (or chunks) as a samples body."""
        http, env_id = api

        def push(body: bytes | Iterator[bytes], evaluation_id: str | None = None) -> Any:
            if evaluation_id is None:
                new = {"name": "n", "environments": [{"id": env_id}]}
                evaluation_id = http.post("/evaluations/", json=new).json()["evaluation_id"]
            answer = http.post(f"/evaluations/{evaluation_id}/samples", content=body)
            answer.evaluation_id = evaluation_id  # type: ignore[attr-defined]
            return answer

        push.http = http  # type: ignore[attr-defined]
        return push

    @staticmethod
    def assert_refused_and_nothing_stored(
        local_platform: LocalPlatform, answer: httpx.Response, detail: str
    ) -> None:
        assert answer.status_code == 422, answer.text
        assert detail in answer.json()["detail"]
        evaluation_id = answer.evaluation_id  # type: ignore[attr-defined]
        assert local_platform.samples(evaluation_id) == []
        assert local_platform.summary()["evaluations"][evaluation_id]["sample_count"] == 0

    @pytest.mark.parametrize(
        "bad",
        [b"\xff", b"caf\xe9", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82"],
        ids=["0xff", "latin-1", "overlong", "surrogate", "past U+10FFFF", "cut short"],
    )
    def test_invalid_utf8_anywhere_in_a_sample_refuses_the_whole_batch(
        self, local_platform: LocalPlatform, push: Callable[..., httpx.Response], bad: bytes
    ) -> None:
        body = b'{"samples":[{"sample_id":"a"},{"sample_id":"b","message":"x' + bad + b'y"}]}'
        self.assert_refused_and_nothing_stored(local_platform, push(body), "not JSON")

    def test_utf8_is_checked_across_the_whole_body_and_its_chunk_boundaries(
        self, local_platform: LocalPlatform, push: Callable[..., httpx.Response]
    ) -> None:
        head = b'{"samples":[{"sample_id":"a","pad":"'
        # "€" (3 bytes) straddling every 64 KiB boundary of a multi-chunk body is fine...
        fill = b"".join(
            b"x" * (65536 - 1 - (len(head) if i == 0 else 2)) + "€".encode() for i in range(4)
        )
        good = push(head + fill + b'"}]}')
        assert good.status_code == 200, good.text
        stored = local_platform.samples(good.evaluation_id)  # type: ignore[attr-defined]
        assert stored[0]["pad"].count("€") == 4
        # ...and a bad byte far past the first chunk is still found.
        bad = push(head + fill + b"\xff" + b'"}]}')
        self.assert_refused_and_nothing_stored(local_platform, bad, "invalid UTF-8")

    @pytest.mark.parametrize(
        ("sample", "detail"),
        [
            (b'{"reward":1}', "samples[1] has no usable sample_id"),
            (b'{"sample_id":null}', "samples[1] has no usable sample_id"),
            (b'{"sample_id":true}', "samples[1] has no usable sample_id"),
            (b'{"sample_id":{"id":"a"}}', "samples[1] has no usable sample_id"),
            (b'{"sample_id":["a"]}', "samples[1] has no usable sample_id"),
            (b'{"sample_id":1e400}', "not JSON"),
            (b'"a"', "samples[1] is not an object"),
            (b"[]", "samples[1] is not an object"),
            (b"null", "samples[1] is not an object"),
        ],
    )
    def test_a_sample_without_a_usable_sample_id_refuses_the_whole_batch(
        self,
        local_platform: LocalPlatform,
        push: Callable[..., httpx.Response],
        sample: bytes,
        detail: str,
    ) -> None:
        body = b'{"samples":[{"sample_id":"a"},' + sample + b"]}"
        self.assert_refused_and_nothing_stored(local_platform, push(body), detail)

    @pytest.mark.parametrize(
        "body",
        [b"", b"[]", b"{}", b'{"samples":null}', b'{"samples":{"sample_id":"a"}}', b'"samples"'],
    )
    def test_json_of_another_shape_is_refused(
        self, local_platform: LocalPlatform, push: Callable[..., httpx.Response], body: bytes
    ) -> None:
        answer = push(body)
        self.assert_refused_and_nothing_stored(local_platform, answer, '{"samples": [...]}')
        assert "not JSON" not in answer.json()["detail"]

    @pytest.mark.parametrize(
        "body",
        [
            b'{"samples":[{"sample_id":"a","x":tru}]}',
            b'{"samples":[{"sample_id":"a","x":"\\q"}]}',
            b'{"samples":[{"sample_id":"a","x":NaN}]}',
            b'{"samples":[{"sample_id":"a"}]} trailing',
            b'{"samples":5,' + b"[" * 3000,
            b'{"samples":[{"sample_id":"a","x":' + b"[" * 3000 + b"]" * 3000 + b"}]}",
        ],
        ids=["bad literal", "bad escape", "NaN", "trailing", "shape then garbage", "too deep"],
    )
    def test_a_sample_that_is_not_json_refuses_the_whole_batch(
        self, local_platform: LocalPlatform, push: Callable[..., httpx.Response], body: bytes
    ) -> None:
        self.assert_refused_and_nothing_stored(local_platform, push(body), "not JSON")

    def test_a_bad_sample_after_finalize_still_gets_409(
        self, local_platform: LocalPlatform, push: Callable[..., httpx.Response]
    ) -> None:
        evaluation_id = push(b'{"samples":[]}').evaluation_id  # type: ignore[attr-defined]
        http: httpx.Client = push.http  # type: ignore[attr-defined]
        assert http.post(f"/evaluations/{evaluation_id}/finalize", json={}).status_code == 200
        assert push(b'{"samples":[{"reward":1}]}', evaluation_id).status_code == 409

    def test_duplicates_are_stored_and_counted_and_numbers_count_as_their_text(
        self, local_platform: LocalPlatform, push: Callable[..., httpx.Response]
    ) -> None:
        first = push(b'{"samples":[{"sample_id":"a"},{"sample_id":"b"},{"sample_id":1}]}')
        evaluation_id = first.evaluation_id  # type: ignore[attr-defined]
        assert first.json() == {"accepted": 3, "sample_count": 3}
        second = push(b'{"samples":[{"sample_id":"a"},{"sample_id":"1"}]}', evaluation_id)
        assert second.json() == {"accepted": 2, "sample_count": 5}
        evaluation = local_platform.summary()["evaluations"][evaluation_id]
        assert (
            evaluation["sample_count"],
            evaluation["distinct_sample_ids"],
            evaluation["duplicates"],
        ) == (5, 3, 2)
        ids = [s["sample_id"] for s in local_platform.samples(evaluation_id)]
        assert ids == ["a", "b", 1, "a", "1"]

    def test_each_sample_is_stored_and_listed_as_the_bytes_it_was_sent_as(
        self, local_platform: LocalPlatform, push: Callable[..., httpx.Response]
    ) -> None:
        samples = [
            '{ "sample_id" : "é-1", "reward": 1.50, "info": {"b": 2, "a": [1, 2]} }',
            '{"sample_id":"2","x":"\\u00e9\\n","sample_id":"3"}',
            '{"sample_id":4,"big":123456789012345678901234567890}',
        ]
        body = ('{"extra": 1, "samples": [\n' + ",\n".join(samples) + "\n]}").encode()
        answer = push(body)
        assert answer.status_code == 200, answer.text
        evaluation_id = answer.evaluation_id  # type: ignore[attr-defined]
        http: httpx.Client = push.http  # type: ignore[attr-defined]
        listed = http.get(f"/evaluations/{evaluation_id}/samples", params={"limit": 10})
        for sample in samples:
            assert sample.encode() in listed.content
        assert [s["sample_id"] for s in listed.json()["samples"]] == ["é-1", "3", 4]
        assert local_platform.samples(evaluation_id)[0] == {
            "sample_id": "é-1",
            "reward": 1.5,
            "info": {"b": 2, "a": [1, 2]},
        }
        evaluation = local_platform.summary()["evaluations"][evaluation_id]
        assert (evaluation["sample_count"], evaluation["distinct_sample_ids"]) == (3, 3)
        control = httpx.get(
            f"{local_platform.base_url}/_control/evaluations/{evaluation_id}/samples",
            headers={"Authorization": f"Bearer {local_platform.api_key}"},
        )
        assert [s["sample_id"] for s in control.json()["samples"]] == ["é-1", "3", 4]

    def test_a_number_beyond_a_float_s_range_is_stored_as_sent_not_refused(
        self, local_platform: LocalPlatform, push: Callable[..., httpx.Response]
    ) -> None:
        # The one documented difference from decoding every sample: msgspec skips numbers unread.
        answer = push(b'{"samples":[{"sample_id":"a","x":1e400}]}')
        assert answer.status_code == 200, answer.text
        http: httpx.Client = push.http  # type: ignore[attr-defined]
        evaluation_id = answer.evaluation_id  # type: ignore[attr-defined]
        listed = http.get(f"/evaluations/{evaluation_id}/samples")
        assert b'{"sample_id":"a","x":1e400}' in listed.content

    def test_a_body_sent_in_chunks_without_a_length_is_taken_too(
        self, local_platform: LocalPlatform, push: Callable[..., httpx.Response]
    ) -> None:
        samples = [{"sample_id": str(i), "pad": "ü" * 1000} for i in range(300)]
        body = orjson.dumps({"samples": samples})

        def chunks() -> Iterator[bytes]:
            for start in range(0, len(body), 4096):
                yield body[start : start + 4096]

        answer = push(chunks())
        assert answer.status_code == 200 and answer.json()["accepted"] == 300
        stored = local_platform.samples(answer.evaluation_id)  # type: ignore[attr-defined]
        assert [s["sample_id"] for s in stored] == [str(i) for i in range(300)]
