"""An answer that comes twice: a platform, or a proxy in front of it, sends an answer a second
time a little later on the kept-alive connection. Every later answer on that connection then
belongs to the request before it. A non-replayable request (create, a batch of samples,
finalize) must never take such an answer for its own: a batch the platform refused would be
taken as stored and the next one, stored, sent again; a finalize the platform refused would be
recorded as done while the evaluation stays open.

`evalpush push` runs as a real subprocess against the local platform through `LateAnswers`, a
small proxy on loopback that forwards every request as it comes and sends chosen answers again
just before the next answer on their connection (the late copy always arrives before the answer
it displaces: no timing in the test). The platform refuses one request with a 503 (a fault that
does no work), so a shifted answer shows as a sample lost and one stored twice, or as a
finalize recorded that the platform never did. Whatever the HTTP client underneath, the push
must end with the platform holding each sample once in one COMPLETED evaluation, finalized
once, and the ledger agreeing.
"""

from __future__ import annotations

import functools
import http.client
import socketserver
import subprocess
import sys
import threading
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from evalpush.local_platform import LocalPlatform
from support.commands import evalpush, status_json
from support.environ import cli_environ
from support.runs import OTHER_RUN_ID, RUN_ID, config_toml, trace_line, write_run

TRACES = 9
BATCH = 3  # three batches
PUSH_SECONDS = 120
HOP_BY_HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"host"}


class LateAnswers:
    """A forwarding proxy on loopback in front of `upstream`. An answer to a request that
    `repeat(method, path)` picks is sent again, late: just before the next answer on the same
    connection, which is itself held back until the request after (the connection stays one
    answer behind from then on). `before_forward(method, path)` is called as each request
    arrives, before it is forwarded (to queue a fault for it). A request that says
    `Connection: close` has its connection closed after its answer."""

    def __init__(
        self,
        upstream: str,
        repeat: Callable[[str, str], bool],
        before_forward: Callable[[str, str], None] = lambda method, path: None,
    ) -> None:
        target = urllib.parse.urlsplit(upstream)
        self._upstream = (target.hostname or "127.0.0.1", target.port or 80)
        self._repeat = repeat
        self._before_forward = before_forward
        self.late_copies_sent = 0
        self._lock = threading.Lock()
        proxy = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                proxy._serve(self.rfile, self.wfile)

        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> LateAnswers:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def _serve(self, rfile, wfile) -> None:  # noqa: ANN001 - socketserver's buffered files
        upstream = http.client.HTTPConnection(*self._upstream, timeout=PUSH_SECONDS)
        held: bytes | None = None  # an answer waiting for the next request on this connection
        try:
            while (request := _read_request(rfile)) is not None:
                method, path, headers, body = request
                self._before_forward(method, path)
                answer = _forward(upstream, method, path, headers, body)
                if held is not None:
                    wfile.write(held)  # the late copy, or the answer one request behind
                    held = answer
                    with self._lock:
                        self.late_copies_sent += 1
                else:
                    wfile.write(answer)
                    if self._repeat(method, path):
                        held = answer
                wfile.flush()
                if headers.get(b"connection", b"").lower() == b"close":
                    return
        finally:
            upstream.close()


def _read_request(rfile) -> tuple[str, str, dict[bytes, bytes], bytes] | None:  # noqa: ANN001
    line = rfile.readline()
    if not line:
        return None
    method, path, _ = line.decode("ascii").split(" ", 2)
    headers: dict[bytes, bytes] = {}
    while (field := rfile.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = field.partition(b":")
        headers[name.strip().lower()] = value.strip()
    body = rfile.read(int(headers.get(b"content-length", b"0")))
    return method, path, headers, body


def _forward(
    upstream: http.client.HTTPConnection,
    method: str,
    path: str,
    headers: dict[bytes, bytes],
    body: bytes,
) -> bytes:
    """The upstream's answer to the request, as bytes to send on (Content-Length framed)."""
    sent = {k.decode(): v.decode() for k, v in headers.items() if k not in HOP_BY_HOP}
    upstream.request(method, path, body=body or None, headers=sent)
    response = upstream.getresponse()
    content = response.read()
    head = [f"HTTP/1.1 {response.status} {response.reason}".encode()]
    head += [
        f"{k}: {v}".encode()
        for k, v in response.getheaders()
        if k.lower().encode() not in HOP_BY_HOP
    ]
    head.append(b"Content-Length: %d" % len(content))
    return b"\r\n".join(head) + b"\r\n\r\n" + content


def is_batch(method: str, path: str) -> bool:
    return method == "POST" and path.endswith("/samples")


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    root = tmp_path / "outputs"
    write_run(root, lines=[trace_line(i, i // 2) for i in range(TRACES)])
    return root


def push_through(
    proxy: LateAnswers, platform: LocalPlatform, tmp_path: Path, runs: Path, **settings: str
) -> list[str]:
    """`evalpush push` of the runs through the proxy; their ledger states as `status` shows."""
    environ = cli_environ(
        platform,
        tmp_path,
        PRIME_API_BASE_URL=proxy.base_url,
        EVALPUSH_UPLOAD__MAX_BATCH_SAMPLES=str(BATCH),
        EVALPUSH_LOG__LEVEL="warning",
        **settings,
    )
    done = subprocess.run(
        [sys.executable, "-m", "evalpush", "push", str(runs)],
        env=environ,
        capture_output=True,
        timeout=PUSH_SECONDS,
    )
    assert done.returncode == 0, done.stderr.decode()
    return [row["state"] for row in status_json(functools.partial(evalpush, environ))]


def assert_stored_once(platform: LocalPlatform) -> None:
    (evaluation_id, evaluation), *others = platform.summary()["evaluations"].items()
    assert not others, "one evaluation"
    stored = Counter(s["sample_id"] for s in platform.samples(evaluation_id))
    assert {k: n for k, n in stored.items() if n > 1} == {}, "no sample stored twice"
    assert len(stored) == TRACES, f"{TRACES - len(stored)} samples never stored"
    assert evaluation["status"] == "COMPLETED", "the finalize reached the platform"
    assert evaluation["finalize_count"] == 1


@pytest.fixture
def refuse_second_batch(platform: LocalPlatform) -> Iterator[Callable[[str, str], None]]:
    batches = 0

    def before_forward(method: str, path: str) -> None:
        nonlocal batches
        if is_batch(method, path):
            batches += 1
            if batches == 2:
                platform.inject("status", on="samples", status=503)

    yield before_forward


class TestAnAnswerSentAgainLate:
    def test_a_batch_refused_after_a_late_answer_is_sent_again_and_none_is_stored_twice(
        self,
        platform: LocalPlatform,
        tmp_path: Path,
        runs: Path,
        refuse_second_batch: Callable[[str, str], None],
    ) -> None:
        """The first batch's answer comes again, late; the second batch is refused (503, no
        work done). Taken for the second batch's answer, the late copy made it look stored (it
        was lost) and the refusal, taken for the third's, had the stored third batch sent
        again (stored twice)."""
        with LateAnswers(platform.base_url, is_batch, refuse_second_batch) as proxy:
            states = push_through(proxy, platform, tmp_path, runs)
        assert_stored_once(platform)
        assert states == ["finalized"]

    def test_a_finalize_refused_after_a_late_answer_is_sent_again_and_the_evaluation_completes(
        self, platform: LocalPlatform, tmp_path: Path, runs: Path
    ) -> None:
        """Every batch's answer comes again, late; the finalize is refused (503, no work done).
        Taken for the finalize's answer, the last batch's late copy had the ledger say
        finalized while the evaluation stayed RUNNING on the platform for good (a later push:
        "already finalized, nothing sent")."""
        platform.inject("status", on="finalize", status=503)
        with LateAnswers(platform.base_url, is_batch) as proxy:
            states = push_through(proxy, platform, tmp_path, runs)
        assert_stored_once(platform)
        assert states == ["finalized"]


def is_sample_listing(method: str, path: str) -> bool:
    return method == "GET" and urllib.parse.urlsplit(path).path.endswith("/samples")


class TestAReadAnsweredLateAgain:
    def test_a_listing_answered_again_late_is_not_taken_for_the_next_reconciling_listing(
        self, platform: LocalPlatform, tmp_path: Path, runs: Path
    ) -> None:
        """The first two batches are stored and answered 502 (ambiguous): each is reconciled
        by listing the evaluation's samples. The first listing's answer comes again, late:
        taken for the second listing's, it said the second batch was not stored, and the
        second batch was sent again (stored twice)."""
        platform.inject("status", on="samples", status=502, do_work=True, count=2)
        with LateAnswers(platform.base_url, is_sample_listing) as proxy:
            states = push_through(proxy, platform, tmp_path, runs)
        assert_stored_once(platform)
        assert states == ["finalized"]


def is_resolve(method: str, path: str) -> bool:
    return method == "POST" and path.endswith("/environmentshub/resolve")


class TestAResolveAnsweredLateAgain:
    def test_a_resolve_answered_again_late_is_not_taken_for_the_next_environment(
        self, platform: LocalPlatform, tmp_path: Path
    ) -> None:
        """Two runs of two environments, one after the other; the first environment's resolve
        answer comes again, late. Taken for the second environment's, it put the second run's
        evaluation in the first environment."""
        root = tmp_path / "outputs"
        lines = [trace_line(i, i // 2) for i in range(TRACES + 1)]  # whole: 5 tasks of 2
        write_run(root, lines, run_id=RUN_ID, config=config_toml(env="gsm8k", num_tasks=5))
        write_run(root, lines, run_id=OTHER_RUN_ID, config=config_toml(env="math", num_tasks=5))
        with LateAnswers(platform.base_url, is_resolve) as proxy:
            push_through(proxy, platform, tmp_path, root, EVALPUSH_UPLOAD__MAX_CONCURRENT_RUNS="1")
        environments = {
            e["metadata"]["run_id"]: e["environment"]
            for e in platform.summary()["evaluations"].values()
        }
        assert environments == {RUN_ID: "gsm8k", OTHER_RUN_ID: "math"}
