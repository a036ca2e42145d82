"""The platform client against a hostile platform: answers that never end, trickle, repeat
pages, carry ids that are paths; a stop that must end whatever the socket does.

Each runs over real loopback HTTP against the local platform's faults (canned answers only
for answer shapes the local platform does not produce). Time bounds are generous safety bounds;
the figures measured are in bench/hostile.py.
"""

from __future__ import annotations

import socket
import threading
import time
import tracemalloc
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import msgspec
import orjson
import pytest

from evalpush import log
from evalpush.client import EvaluationIndex, PlatformClient, Retrier, is_platform_id, platform
from evalpush.config import PlatformConfig
from evalpush.core import errors
from evalpush.local_platform import LocalPlatform
from support.canned import CannedTransport
from support.waiting import POLL_SECONDS, WAIT_SECONDS

MakeClient = Callable[..., PlatformClient]
SAFETY_SECONDS = 10.0
"""No call here may take longer than this (each is meant to end within a second or two)."""
STOP_AFTER_SECONDS = 0.5
MEMORY_BOUND_BYTES = 64 * 1024 * 1024


def create_body(env_id: str, run_id: str = "run-h") -> dict[str, Any]:
    return {
        "name": f"gsm8k--m--{run_id}",
        "environments": [{"id": env_id}],
        "model_name": "m",
        "metadata": {"run_id": run_id},
        "metrics": {},
    }


def samples_body(*sample_ids: int, pad: int = 0) -> bytes:
    return orjson.dumps({"samples": [{"sample_id": i, "pad": "x" * pad} for i in sample_ids]})


@pytest.fixture
def evaluation(platform_client: PlatformClient) -> str:
    env_id = platform_client.resolve_environment("gsm8k")
    return platform_client.create_evaluation(create_body(env_id))[0]


@pytest.fixture
def stop(stop_event: threading.Event) -> threading.Event:
    return stop_event


def timed(call: Callable[[], Any]) -> tuple[BaseException | None, float]:
    """What `call` raised (None if nothing) and how long it took."""
    started = time.monotonic()
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - handed to the test, which asserts its class
        return exc, time.monotonic() - started
    return None, time.monotonic() - started


def stop_later(stop: threading.Event, seconds: float = STOP_AFTER_SECONDS) -> threading.Timer:
    timer = threading.Timer(seconds, stop.set)
    timer.start()
    return timer


WRITES: dict[str, Callable[[PlatformClient, str, str], Any]] = {
    "create": lambda c, env, ev: c.create_evaluation(create_body(env, "run-w")),
    "samples": lambda c, env, ev: c.push_samples(ev, samples_body(1, 2)),
    "finalize": lambda c, env, ev: c.finalize(ev, {}),
}
READS: dict[str, Callable[[PlatformClient, str, str], Any]] = {
    "get": lambda c, env, ev: c.get_evaluation(ev),
    "list samples": lambda c, env, ev: list(c.iter_sample_ids(ev)),
    "list evaluations": lambda c, env, ev: list(c.iter_evaluations("gsm8k")),
    "resolve": lambda c, env, ev: c.resolve_environment("gsm8k"),
}
KIND = {"create": "create", "samples": "samples", "finalize": "finalize", "resolve": "resolve"}


class TestBodiesAreReadUnderACap:
    @pytest.mark.parametrize("step", WRITES)
    def test_an_endless_2xx_body_on_a_write_is_ambiguous_and_memory_stays_small(
        self, step: str, platform_client: PlatformClient, local_platform: LocalPlatform
    ) -> None:
        env_id = platform_client.resolve_environment("gsm8k")
        evaluation_id = platform_client.create_evaluation(create_body(env_id))[0]
        local_platform.inject("endless", on=step, do_work=True)
        tracemalloc.start()
        try:
            raised, took = timed(lambda: WRITES[step](platform_client, env_id, evaluation_id))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert isinstance(raised, errors.Ambiguous), raised
        assert "body over" in str(raised)
        assert peak < MEMORY_BOUND_BYTES and took < SAFETY_SECONDS

    @pytest.mark.parametrize("step", READS)
    def test_an_endless_2xx_body_on_a_read_is_merely_transient(
        self, step: str, platform_client: PlatformClient, local_platform: LocalPlatform
    ) -> None:
        env_id = platform_client.resolve_environment("gsm8k")
        evaluation_id = platform_client.create_evaluation(create_body(env_id))[0]
        # Every answer endless: a listing shrinks its page down to one item, then gives up.
        local_platform.inject("endless", on=KIND.get(step, "read"), do_work=True, count=100)
        raised, took = timed(lambda: READS[step](platform_client, env_id, evaluation_id))
        assert isinstance(raised, errors.Transient) and not isinstance(raised, errors.Ambiguous)
        assert took < SAFETY_SECONDS

    def test_an_endless_error_body_is_read_only_at_its_start(
        self, platform_client: PlatformClient, local_platform: LocalPlatform, evaluation: str
    ) -> None:
        local_platform.inject("endless", on="samples", status=422)
        tracemalloc.start()
        try:
            raised, took = timed(lambda: platform_client.push_samples(evaluation, samples_body(1)))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert isinstance(raised, errors.BatchRefused) and raised.status == 422
        assert peak < MEMORY_BOUND_BYTES and took < SAFETY_SECONDS

    def test_a_listing_page_over_its_cap_is_asked_again_smaller_and_nothing_is_missed(
        self,
        platform_client: PlatformClient,
        local_platform: LocalPlatform,
        evaluation: str,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        platform_client.push_samples(evaluation, samples_body(*range(12), pad=1000))
        monkeypatch.setattr(platform, "MAX_PAGE_BYTES", 4000)  # three samples fit, four do not
        reads_before = local_platform.summary()["requests"]["read"]
        ids = list(platform_client.iter_sample_ids(evaluation, page_size=12))
        assert ids == [str(i) for i in range(12)]
        assert local_platform.summary()["requests"]["read"] - reads_before > 4

    def test_a_single_item_over_the_page_cap_is_a_malformed_answer(
        self,
        platform_client: PlatformClient,
        evaluation: str,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        platform_client.push_samples(evaluation, samples_body(1, pad=5000))
        monkeypatch.setattr(platform, "MAX_PAGE_BYTES", 4000)
        with pytest.raises(errors.Transient, match="body over 4000 bytes"):
            list(platform_client.iter_sample_ids(evaluation, page_size=4))


class TestEveryRequestEnds:
    def test_a_body_that_trickles_ends_at_the_request_deadline(
        self, make_platform_client: MakeClient, local_platform: LocalPlatform
    ) -> None:
        client = make_platform_client(request_deadline_seconds=1.5)
        env_id = client.resolve_environment("gsm8k")
        evaluation_id = client.create_evaluation(create_body(env_id))[0]
        local_platform.inject("trickle", on="finalize", seconds=0.2)
        raised, took = timed(lambda: client.finalize(evaluation_id, {}))
        assert isinstance(raised, errors.Ambiguous) and "deadline" in str(raised)
        assert 1.0 < took < SAFETY_SECONDS

    @pytest.mark.parametrize(
        ("fault", "step"),
        [("trickle", "finalize"), ("stall", "finalize"), ("stall", "create"), ("stall", "read")],
    )
    def test_a_stop_ends_a_request_the_server_holds_and_raises_interrupted(
        self,
        fault: str,
        step: str,
        make_platform_client: MakeClient,
        local_platform: LocalPlatform,
        stop: threading.Event,
    ) -> None:
        client = make_platform_client(read_timeout_seconds=60, stop=stop)
        env_id = client.resolve_environment("gsm8k")
        evaluation_id = client.create_evaluation(create_body(env_id))[0]
        local_platform.inject(fault, on=step, seconds=1 if fault == "trickle" else 60)
        call = {
            "finalize": lambda: client.finalize(evaluation_id, {}),
            "create": lambda: client.create_evaluation(create_body(env_id, "run-2")),
            "read": lambda: client.get_evaluation(evaluation_id),
        }[step]
        stop_later(stop)
        raised, took = timed(call)
        assert isinstance(raised, errors.Interrupted), raised
        assert took < STOP_AFTER_SECONDS + 2.0

    def test_a_stop_ends_an_upload_the_server_never_reads(
        self,
        make_platform_client: MakeClient,
        local_platform: LocalPlatform,
        evaluation: str,
        stop: threading.Event,
    ) -> None:
        client = make_platform_client(read_timeout_seconds=60, stop=stop)
        local_platform.inject("unread", on="samples", seconds=60)
        big = samples_body(*range(20), pad=1024 * 1024)  # far more than the socket buffers hold
        stop_later(stop)
        raised, took = timed(lambda: client.push_samples(evaluation, big))
        assert isinstance(raised, errors.Interrupted), raised
        assert took < STOP_AFTER_SECONDS + 2.0
        assert local_platform.summary()["evaluations"][evaluation]["sample_count"] == 0

    def test_an_upload_the_server_never_reads_ends_at_the_deadline_as_ambiguous(
        self, make_platform_client: MakeClient, local_platform: LocalPlatform, evaluation: str
    ) -> None:
        client = make_platform_client(read_timeout_seconds=60, request_deadline_seconds=1.0)
        local_platform.inject("unread", on="samples", seconds=60)
        big = samples_body(*range(20), pad=1024 * 1024)
        raised, took = timed(lambda: client.push_samples(evaluation, big))
        assert isinstance(raised, errors.Ambiguous) and "WriteTimeout" in str(raised)
        assert took < SAFETY_SECONDS

    def test_a_stop_ends_a_connect_that_never_completes(
        self, tmp_path: Path, stop: threading.Event
    ) -> None:
        # A listener that never accepts, its backlog full: the kernel drops further SYNs, so a
        # connect hangs as it does to a host behind a dropping firewall.
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        fillers = []
        try:
            for _ in range(8):
                filler = socket.socket()
                filler.setblocking(False)
                filler.connect_ex(listener.getsockname())
                fillers.append(filler)
            base = f"http://127.0.0.1:{listener.getsockname()[1]}"
            client = PlatformClient(
                PlatformConfig(api_base_url=base, connect_timeout_seconds=60),
                environ={"PRIME_API_KEY": "k-connect-1"},
                home=tmp_path,
                stop=stop,
            )
            with client:
                stop_later(stop)
                raised, took = timed(client.probe)
        finally:
            for filler in fillers:
                filler.close()
            listener.close()
        assert isinstance(raised, errors.Interrupted), raised
        assert isinstance(raised.__cause__, httpx.ConnectError), "it hung in connect"
        assert took < STOP_AFTER_SECONDS + 2.0

    def test_nothing_is_sent_once_the_stop_is_set(
        self,
        make_platform_client: MakeClient,
        local_platform: LocalPlatform,
        stop: threading.Event,
    ) -> None:
        client = make_platform_client(stop=stop)
        before = local_platform.summary()["requests"]["read"]
        stop.set()
        with pytest.raises(errors.Interrupted):
            client.probe()
        assert local_platform.summary()["requests"]["read"] == before

    def test_the_retrier_does_not_retry_an_interrupted_request(
        self,
        make_platform_client: MakeClient,
        local_platform: LocalPlatform,
        make_retrier: Callable[[PlatformClient], Retrier],
        stop: threading.Event,
    ) -> None:
        client = make_platform_client(read_timeout_seconds=60, stop=stop)
        local_platform.inject("stall", on="read", seconds=60, count=100)
        before = local_platform.summary()["requests"]["read"]

        def stop_once_it_stalls() -> None:  # the request is in: the stop interrupts it
            deadline = time.monotonic() + WAIT_SECONDS
            while local_platform.summary()["requests"]["read"] == before:
                if time.monotonic() > deadline:
                    break  # stopped anyway: the count below says the probe never arrived
                time.sleep(POLL_SECONDS)
            stop.set()

        stopper = threading.Thread(target=stop_once_it_stalls, name="stopper")
        stopper.start()
        with pytest.raises(errors.Interrupted):
            make_retrier(client).call(client.probe, replayable=True, what="probe")
        stopper.join()
        assert local_platform.summary()["requests"]["read"] == before + 1


class TestListingsEnd:
    @pytest.mark.parametrize("listing", ["samples", "evaluations"])
    def test_a_platform_answering_the_same_page_whatever_is_asked_is_malformed(
        self,
        listing: str,
        platform_client: PlatformClient,
        local_platform: LocalPlatform,
        evaluation: str,
    ) -> None:
        platform_client.push_samples(evaluation, samples_body(*range(5)))
        for run in ("run-a", "run-b", "run-c"):
            env_id = platform_client.resolve_environment("gsm8k")
            platform_client.create_evaluation(create_body(env_id, run))
        local_platform.inject("repeat_page", on="read", count=1_000_000)
        before = local_platform.summary()["requests"]["read"]
        listed = (
            (lambda: list(platform_client.iter_sample_ids(evaluation, page_size=2)))
            if listing == "samples"
            else (lambda: list(platform_client.iter_evaluations("gsm8k", page_size=2)))
        )
        raised, took = timed(listed)
        assert isinstance(raised, errors.Transient) and "repeats" in str(raised)
        assert local_platform.summary()["requests"]["read"] - before == 2
        assert took < SAFETY_SECONDS

    def test_sample_pages_that_never_end_stop_at_the_callers_bound(
        self, platform_client: PlatformClient, local_platform: LocalPlatform, evaluation: str
    ) -> None:
        local_platform.inject("endless_pages", on="read", count=1_000_000)
        before = local_platform.summary()["requests"]["read"]
        with pytest.raises(errors.Transient, match="more than 1000 items"):
            list(platform_client.iter_sample_ids(evaluation, page_size=100, max_items=1000))
        assert local_platform.summary()["requests"]["read"] - before == 11

    def test_evaluation_pages_that_never_end_stop_at_the_listing_bound(
        self,
        platform_client: PlatformClient,
        local_platform: LocalPlatform,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        monkeypatch.setattr(platform, "MAX_EVALUATIONS_LISTED", 10_000)
        local_platform.inject("endless_pages", on="read", count=1_000_000)
        before = local_platform.summary()["requests"]["read"]
        with pytest.raises(errors.Transient, match="more than"):
            list(platform_client.iter_evaluations("gsm8k", page_size=1000))
        requests = local_platform.summary()["requests"]["read"] - before
        assert requests == platform.MAX_EVALUATIONS_LISTED // 1000 + 1

    def test_a_listing_stops_at_the_first_page_after_a_stop(
        self,
        make_platform_client: MakeClient,
        local_platform: LocalPlatform,
        stop: threading.Event,
    ) -> None:
        client = make_platform_client(stop=stop)
        local_platform.inject("endless_pages", on="read", count=1_000_000)
        ids = client.iter_sample_ids("e1", page_size=10)
        assert [next(ids) for _ in range(25)]  # three pages read
        stop.set()
        with pytest.raises(errors.Interrupted):
            list(ids)

    def test_pages_that_repeat_because_samples_were_stored_twice_are_still_read(
        self, platform_client: PlatformClient, evaluation: str
    ) -> None:
        # The local platform echoes the page asked, so two equal pages are two real pages.
        platform_client.push_samples(evaluation, samples_body(1, 2, 3))
        platform_client.push_samples(evaluation, samples_body(1, 2, 3))
        ids = list(platform_client.iter_sample_ids(evaluation, page_size=3))
        assert ids == ["1", "2", "3", "1", "2", "3"]

    def test_a_server_capping_the_page_size_is_still_read_page_after_page(
        self, tmp_path: Path
    ) -> None:
        stored = [{"sample_id": str(i)} for i in range(5)]

        def answer(request: httpx.Request) -> httpx.Response:
            page = int(request.url.params["page"])  # the server's own limit: 2 a page
            return httpx.Response(
                200, json={"samples": stored[2 * page - 2 : 2 * page], "page": page}
            )

        with mock_client(tmp_path, answer) as client:
            assert list(client.iter_sample_ids("e1", page_size=500)) == [str(i) for i in range(5)]

    def test_a_page_answering_another_page_than_asked_is_malformed(self, tmp_path: Path) -> None:
        def answer(request: httpx.Request) -> httpx.Response:
            return httpx.Response(200, json={"samples": [{"sample_id": "a"}], "page": 1})

        with mock_client(tmp_path, answer) as client:
            with pytest.raises(errors.Transient, match="answered page=1"):
                list(client.iter_sample_ids("e1", page_size=1))


def mock_client(
    tmp_path: Path, answer: Callable[[httpx.Request], httpx.Response]
) -> PlatformClient:
    environ = {"PRIME_API_KEY": "k-mock-hostile-1", "PRIME_API_BASE_URL": "https://api.test"}
    return PlatformClient(
        PlatformConfig(), environ=environ, home=tmp_path, transport=CannedTransport(answer)
    )


PATH_LIKE_ID = "../../../environmentshub/resolve?x="
SECRET_LIKE_KEY = "sk-Qm4Zt8Wx2Lk9PjIds"


class TestIdsAreData:
    @pytest.mark.parametrize(
        "value",
        ["", ".", "..", "a" * 1025, "e-" + SECRET_LIKE_KEY, "e\0f"],
        ids=["empty", "dot", "dot dot", "over 1024", "holding the key", "holding a NUL"],
    )
    def test_what_cannot_be_one_path_segment_is_not_an_evaluation_id(self, value: str) -> None:
        log.register_secret(SECRET_LIKE_KEY)
        assert not is_platform_id(value)

    @pytest.mark.parametrize(
        "value",
        [
            "e1",
            "0b5f7b6e-1c4e-4c1e-9d8a-2f7f0f5a6b7c",
            PATH_LIKE_ID,
            "a/b",
            "e 1",
            "e1:x@y",
            "é1",
            "e1\n",
            "%2e%2e",
            "...",
            "a" * 1024,
        ],
    )
    def test_what_the_platform_hands_out_is_an_id(self, value: str) -> None:
        assert is_platform_id(value)

    @pytest.mark.parametrize(
        "value", ["..", "a" * 1025, "e\0f"], ids=["dot dot", "over 1024", "holding a NUL"]
    )
    def test_a_create_answer_with_an_id_that_cannot_be_a_segment_is_ambiguous(
        self, value: str, platform_client: PlatformClient, local_platform: LocalPlatform
    ) -> None:
        env_id = platform_client.resolve_environment("gsm8k")
        local_platform.inject("bad_id", on="create", value=value)
        with pytest.raises(errors.Ambiguous, match="malformed id"):
            platform_client.create_evaluation(create_body(env_id))
        assert local_platform.summary()["runs"] == {"run-h": 1}, "the work was done"

    @pytest.mark.parametrize("value", [PATH_LIKE_ID, "env:1@x y", "ｅｎｖ-é", "e" * 300])
    def test_an_environment_id_is_used_as_the_platform_gives_it(
        self, value: str, platform_client: PlatformClient, local_platform: LocalPlatform
    ) -> None:
        local_platform.inject("bad_id", on="resolve", value=value)
        assert platform_client.resolve_environment("gsm8k") == value

    def test_an_environment_id_holding_a_nul_is_not_used_as_no_ledger_keeps_it(
        self, platform_client: PlatformClient, local_platform: LocalPlatform
    ) -> None:
        local_platform.inject("bad_id", on="resolve", value="env\0x")
        with pytest.raises(errors.Transient, match="NUL"):
            platform_client.resolve_environment("gsm8k")

    def test_an_environment_id_given_as_an_integer_is_used(self, tmp_path: Path) -> None:
        answer = httpx.Response(200, json={"data": {"id": 42}})
        client = PlatformClient(
            PlatformConfig(),
            environ={"PRIME_API_KEY": "k-int-1", "PRIME_API_BASE_URL": "https://api.test"},
            home=tmp_path,
            transport=CannedTransport(lambda request: answer),
        )
        assert client.resolve_environment("gsm8k") == "42"

    def test_an_evaluation_id_is_sent_as_one_percent_encoded_segment(self, tmp_path: Path) -> None:
        seen: list[httpx.Request] = []

        def answer(request: httpx.Request) -> httpx.Response:
            seen.append(request)
            return httpx.Response(200, json={"id": "a/b c?é#", "status": "RUNNING"})

        client = PlatformClient(
            PlatformConfig(),
            environ={"PRIME_API_KEY": "k-seg-1", "PRIME_API_BASE_URL": "https://api.test"},
            home=tmp_path,
            transport=CannedTransport(answer),
        )
        client.get_evaluation("a/b c?é#")
        assert seen[0].url.raw_path == b"/api/v1/evaluations/a%2Fb%20c%3F%C3%A9%23"

    def test_a_viewer_url_that_is_not_http_is_dropped(
        self, platform_client: PlatformClient, local_platform: LocalPlatform
    ) -> None:
        env_id = platform_client.resolve_environment("gsm8k")
        local_platform.inject("bad_id", on="create", value="e-good-1")
        assert platform_client.create_evaluation(create_body(env_id)) == ("e-good-1", None)

    @pytest.mark.parametrize(
        "call",
        [
            lambda c: c.get_evaluation(".."),
            lambda c: c.push_samples(".", b'{"samples": []}'),
            lambda c: c.finalize("", {}),
            lambda c: list(c.iter_sample_ids("a" * 1025)),
            lambda c: c.close_out("..", "CANCELLED"),
            lambda c: c.viewer_url("."),
        ],
        ids=["get", "samples", "finalize", "list", "close", "viewer"],
    )
    def test_an_id_that_cannot_be_one_segment_is_never_put_into_a_url(
        self, call: Callable[[PlatformClient], Any], platform_client: PlatformClient
    ) -> None:
        with pytest.raises(errors.Unsendable, match="not a platform id"):
            call(platform_client)

    def test_listed_evaluations_keep_only_http_viewer_urls_without_a_password(
        self, tmp_path: Path
    ) -> None:
        items = [
            {"id": "e1", "viewer_url": "javascript:alert(1)", "metadata": {}},
            {"id": "e2", "viewer_url": "https://app.test/dashboard/evaluations/e2"},
            {"id": "e3", "viewer_url": "https://someone:pw@app.test/dashboard/evaluations/e3"},
        ]

        def answer(request: httpx.Request) -> httpx.Response:
            skip = int(request.url.params["skip"])
            return httpx.Response(200, json={"evaluations": items if skip == 0 else []})

        with mock_client(tmp_path, answer) as client:
            listed = list(client.iter_evaluations("gsm8k"))
        assert listed[0].viewer_url is None
        assert listed[1].viewer_url == "https://app.test/dashboard/evaluations/e2"
        assert listed[2].viewer_url is None, "a URL holding a password is not kept to print"

    def test_a_viewer_url_seen_before_a_key_is_known_is_refused_once_it_holds_the_key(
        self,
    ) -> None:
        # A URL's shape is judged once per text (a run's viewer URL comes in three answers);
        # whether it holds a secret is judged every time, since a key may be learnt later.
        key = f"sk-viewer-{uuid.uuid4().hex}"
        url = f"https://app.test/dashboard/evaluations/e1?token={key}"
        evaluation = msgspec.convert({"id": "e1", "viewer_url": url}, platform.Evaluation)
        assert evaluation.viewer_url == url
        log.register_secret(key)
        assert evaluation.viewer_url is None

    def test_a_listed_evaluation_whose_id_cannot_be_a_segment_is_listed_as_unusable_beside_others(
        self, tmp_path: Path
    ) -> None:
        items = [{"id": "..", "metadata": {"run_id": "x"}}, {"id": "e2", "metadata": {}}]

        def answer(request: httpx.Request) -> httpx.Response:
            skip = int(request.url.params["skip"])
            return httpx.Response(200, json={"evaluations": items if skip == 0 else []})

        with mock_client(tmp_path, answer) as client:
            listed = list(client.iter_evaluations("gsm8k"))

        assert [(e.id, e.usable) for e in listed] == [("..", False), ("e2", True)]

    def test_a_runs_own_evaluation_listed_with_an_unusable_id_fails_the_lookup_not_silently(
        self, tmp_path: Path
    ) -> None:
        """Taking it for "not found" would create another evaluation (and again, every time)."""
        items = [
            {"id": "e1", "metadata": {"run_id": "r"}},
            {"id": ".", "metadata": {"run_id": "r"}},
        ]

        def answer(request: httpx.Request) -> httpx.Response:
            skip = int(request.url.params["skip"])
            return httpx.Response(200, json={"evaluations": items if skip == 0 else []})

        with mock_client(tmp_path, answer) as client:
            index = EvaluationIndex(client, lambda fn, _what, _run: fn())
            with pytest.raises(errors.RunError, match="whose id evalpush cannot put into a URL"):
                index.find("gsm8k", "r", exclude=set, fresh=True)
            assert index.find("gsm8k", "r", exclude=lambda: {"."}, fresh=True).id == "e1"


class TestWhatRetryingCannotFix:
    @pytest.mark.parametrize(
        "exc",
        [
            httpx.LocalProtocolError("illegal header value in Authorization"),
            httpx.UnsupportedProtocol("proxy ftp://proxy: the scheme ftp is not http"),
        ],
    )
    def test_a_request_that_cannot_be_sent_fails_once_without_a_retry_loop(
        self, tmp_path: Path, exc: Exception, make_retrier: Callable[[PlatformClient], Retrier]
    ) -> None:
        attempts = []

        def answer(request: httpx.Request) -> httpx.Response:
            attempts.append(request)
            raise exc

        with mock_client(tmp_path, answer) as client:
            with pytest.raises(errors.Unsendable):
                make_retrier(client).call(client.probe, replayable=True, what="probe")
        assert len(attempts) == 1

    @pytest.mark.parametrize(
        ("key", "kind"),
        [
            ("sk-Qm4Zt8\nWx2Lk9Pj", "control character"),
            ("sk-Qm4Zt8 Wx2Lk9Pj", "a space"),
            ("sk-Qm4Zt8\tWx2Lk9Pj", "control character"),
            ("sk-Qm4Zt8\x7fWx2Lk9Pj", "not ASCII"),
            ("sk-Qm4Zt8éWx2Lk9Pj", "not ASCII"),
        ],
    )
    def test_a_key_that_is_not_printable_ascii_is_refused_when_loaded_without_quoting_it(
        self, tmp_path: Path, key: str, kind: str
    ) -> None:
        client = PlatformClient(PlatformConfig(), environ={"PRIME_API_KEY": key}, home=tmp_path)
        with client, pytest.raises(errors.AuthError) as caught:
            client.probe()  # the key is read at first use
        message = str(caught.value)
        assert "$PRIME_API_KEY" in message and kind in message
        assert "Qm4Zt8" not in message and "Wx2Lk9" not in message

    def test_a_key_file_with_a_newline_inside_names_the_file(self, tmp_path: Path) -> None:
        key_file = tmp_path / "key"
        key_file.write_text("sk-first-half\nsk-second-half\n")
        client = PlatformClient(PlatformConfig(api_key_file=key_file), environ={}, home=tmp_path)
        with client, pytest.raises(errors.AuthError, match=str(key_file)) as caught:
            client.probe()
        assert "half" not in str(caught.value)


class TestAnUnusableEvaluationIsClosedOut:
    @pytest.mark.parametrize(
        ("evaluation_id", "closed"), [("e" * 1100, True), ("..", False)], ids=["long", "dots"]
    )
    def test_a_runs_own_evaluation_with_an_unusable_id_fails_the_run_and_is_closed_out(
        self, tmp_path: Path, evaluation_id: str, closed: bool
    ) -> None:
        """Where its id can still be sent (a long one), it is closed out as FAILED, so nothing
        is left RUNNING; where none can (`..`), the failure says to delete it."""
        puts: list[httpx.Request] = []

        def answer(request: httpx.Request) -> httpx.Response:
            if request.method == "PUT":
                puts.append(request)
                return httpx.Response(200, json={"status": "FAILED"})
            skip = int(request.url.params["skip"])
            items = [{"id": evaluation_id, "metadata": {"run_id": "r"}}]
            return httpx.Response(200, json={"evaluations": items if skip == 0 else []})

        with mock_client(tmp_path, answer) as client:
            index = EvaluationIndex(client, lambda fn, _what, _run: fn())
            with pytest.raises(errors.RunError, match="cannot put into a URL") as raised:
                index.find("gsm8k", "r", exclude=set, fresh=True)
        if closed:
            assert "closed out as FAILED" in str(raised.value)
            (put,) = puts
            assert put.url.raw_path.endswith(b"/evaluations/" + evaluation_id.encode())
            assert orjson.loads(put.content)["status"] == "FAILED"
        else:
            assert "could not be closed out" in str(raised.value) and puts == []


def test_a_sent_body_is_let_go_of_without_waiting_for_the_garbage_collector(
    platform_client: PlatformClient, evaluation: str
) -> None:
    """httpx's request and answer objects form reference cycles: a body they held would stay
    until a full collection (a push freezes its start-up objects and seldom runs one), one
    25 MiB batch after another."""
    import gc

    gc.disable()
    tracemalloc.start()
    try:
        for first in (0, 10, 20):
            platform_client.push_samples(
                evaluation, samples_body(*range(first, first + 10), pad=500_000), count=10
            )
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        gc.enable()
    assert held < 5 * 1024 * 1024, f"{held} bytes still held after three 5 MB batches"
