"""The platform client: credentials, every endpoint, and how failures are classified.

Endpoints and faults run against the local platform over real loopback HTTP; response shapes the
local platform does not produce are fed through httpx's MockTransport.
"""

from __future__ import annotations

import io
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import structlog
from structlog.testing import capture_logs

from evalpush import log
from evalpush.client import (
    DEFAULT_API_BASE,
    DEFAULT_FRONTEND_URL,
    USER_AGENT,
    Gate,
    PlatformClient,
    Retrier,
    load_credentials,
)
from evalpush.config import PlatformConfig
from evalpush.core import errors
from evalpush.local_platform import MAX_BODY_BYTES, LocalPlatform
from support.canned import CannedTransport
from support.platform_view import stored

MakeClient = Callable[..., PlatformClient]
MakeRetrier = Callable[[PlatformClient], Retrier]


def write_prime_config(home: Path, **values: str) -> None:
    (home / ".prime").mkdir(parents=True, exist_ok=True)
    (home / ".prime" / "config.json").write_bytes(orjson.dumps(values))


def create_body(
    env_id: str, run_id: str = "run-1", name: str = "gsm8k--m--run-1"
) -> dict[str, Any]:
    return {
        "name": name,
        "environments": [{"id": env_id}],
        "model_name": "m",
        "dataset": "gsm8k",
        "framework": "verifiers",
        "metadata": {"framework": "verifiers", "run_id": run_id},
        "metrics": {"avg_reward": 0.5},
        "tags": [],
    }


def samples_body(*sample_ids: int) -> bytes:
    return orjson.dumps({"samples": [{"sample_id": i, "reward": 1.0} for i in sample_ids]})


def new_evaluation(client: PlatformClient, run_id: str = "run-1", env: str = "gsm8k") -> str:
    evaluation_id, _ = client.create_evaluation(
        create_body(client.resolve_environment(env), run_id)
    )
    return evaluation_id


class TestCredentials:
    def test_the_key_comes_from_prime_api_key_before_anything_else(self, tmp_path: Path) -> None:
        key_file = tmp_path / "key"
        key_file.write_text("from-file\n")
        (tmp_path / "creds").mkdir()
        (tmp_path / "creds" / "prime-api-key").write_text("from-systemd")
        write_prime_config(tmp_path, api_key="from-config-json")
        environ = {"PRIME_API_KEY": "from-env", "CREDENTIALS_DIRECTORY": str(tmp_path / "creds")}
        credentials = load_credentials(PlatformConfig(api_key_file=key_file), environ, tmp_path)
        assert credentials.api_key == "from-env" and credentials.key_source == "$PRIME_API_KEY"

    def test_then_from_the_configured_key_file(self, tmp_path: Path) -> None:
        key_file = tmp_path / "key"
        key_file.write_text("  from-file\n")
        (tmp_path / "creds").mkdir()
        (tmp_path / "creds" / "prime-api-key").write_text("from-systemd")
        write_prime_config(tmp_path, api_key="from-config-json")
        environ = {"CREDENTIALS_DIRECTORY": str(tmp_path / "creds")}
        credentials = load_credentials(PlatformConfig(api_key_file=key_file), environ, tmp_path)
        assert credentials.api_key == "from-file"

    def test_then_from_the_systemd_credentials_directory(self, tmp_path: Path) -> None:
        (tmp_path / "creds").mkdir()
        (tmp_path / "creds" / "prime-api-key").write_text("from-systemd\n")
        write_prime_config(tmp_path, api_key="from-config-json")
        environ = {"CREDENTIALS_DIRECTORY": str(tmp_path / "creds")}
        credentials = load_credentials(PlatformConfig(), environ, tmp_path)
        assert credentials.api_key == "from-systemd"
        assert credentials.key_source.startswith("systemd credential")

    def test_then_from_prime_config_json_with_its_addresses_and_team(self, tmp_path: Path) -> None:
        write_prime_config(
            tmp_path,
            api_key="from-config-json",
            base_url="https://api.example.test/api/v1/",
            frontend_url="https://app.example.test/",
            team_id="team-9",
        )
        credentials = load_credentials(PlatformConfig(), {}, tmp_path)
        assert credentials.api_key == "from-config-json"
        assert credentials.api_base == "https://api.example.test"
        assert credentials.frontend_url == "https://app.example.test"
        assert credentials.team_id == "team-9"

    def test_without_any_key_the_error_says_where_it_looked(self, tmp_path: Path) -> None:
        with pytest.raises(errors.AuthError) as caught:
            load_credentials(PlatformConfig(), {}, tmp_path)
        message = str(caught.value)
        for place in (
            "$PRIME_API_KEY",
            "platform.api_key_file",
            "CREDENTIALS_DIRECTORY",
            "config.json",
        ):
            assert place in message

    def test_a_configured_key_file_that_is_missing_is_an_auth_error_naming_it(
        self, tmp_path: Path
    ) -> None:
        config = PlatformConfig(api_key_file=tmp_path / "nope")
        with pytest.raises(errors.AuthError, match="platform.api_key_file"):
            load_credentials(config, {}, tmp_path)

    @pytest.mark.parametrize(
        "broken", [b"{not json", b"[" * 5000 + b"]" * 5000], ids=["not JSON", "nested too deeply"]
    )
    def test_a_broken_config_json_does_not_block_a_key_given_another_way(
        self, tmp_path: Path, broken: bytes
    ) -> None:
        (tmp_path / ".prime").mkdir()
        (tmp_path / ".prime" / "config.json").write_bytes(broken)
        assert (
            load_credentials(PlatformConfig(), {"PRIME_API_KEY": "k1234"}, tmp_path).api_key
            == "k1234"
        )

    @pytest.mark.parametrize(
        ("environ", "config_base", "expected"),
        [
            (
                {"PRIME_API_BASE_URL": "https://a.test", "PRIME_BASE_URL": "https://b.test"},
                "https://c.test",
                "https://a.test",
            ),
            ({"PRIME_BASE_URL": "https://b.test/"}, "https://c.test", "https://b.test"),
            ({}, "https://c.test/api/v1", "https://c.test"),
            ({}, None, "https://d.test"),
        ],
    )
    def test_the_api_base_follows_the_prime_cli_precedence_and_is_normalised(
        self, tmp_path: Path, environ: dict[str, str], config_base: str | None, expected: str
    ) -> None:
        write_prime_config(tmp_path, api_key="k1234", base_url="https://d.test")
        credentials = load_credentials(PlatformConfig(api_base_url=config_base), environ, tmp_path)
        assert credentials.api_base == expected

    def test_the_defaults_are_the_public_platform(self, tmp_path: Path) -> None:
        credentials = load_credentials(PlatformConfig(), {"PRIME_API_KEY": "k1234"}, tmp_path)
        assert (credentials.api_base, credentials.frontend_url) == (
            DEFAULT_API_BASE,
            DEFAULT_FRONTEND_URL,
        )
        assert credentials.team_id is None

    def test_viewer_and_team_prefer_the_environment_then_the_config(self, tmp_path: Path) -> None:
        write_prime_config(tmp_path, api_key="k1234", frontend_url="https://f3.test", team_id="t3")
        environ = {
            "PRIME_API_KEY": "k1234",
            "PRIME_FRONTEND_URL": "https://f1.test",
            "PRIME_TEAM_ID": "t1",
        }
        config = PlatformConfig(frontend_url="https://f2.test", team_id="t2")
        assert load_credentials(config, environ, tmp_path).frontend_url == "https://f1.test"
        assert load_credentials(config, environ, tmp_path).team_id == "t1"
        only_key = {"PRIME_API_KEY": "k1234"}
        assert load_credentials(config, only_key, tmp_path).frontend_url == "https://f2.test"
        assert load_credentials(config, only_key, tmp_path).team_id == "t2"

    @pytest.mark.parametrize(
        ("variable", "source"),
        [("PRIME_API_BASE_URL", "$PRIME_API_BASE_URL"), (None, "platform.api_base_url")],
    )
    def test_plain_http_to_a_remote_host_is_refused_naming_where_it_was_set(
        self, tmp_path: Path, variable: str | None, source: str
    ) -> None:
        environ = {"PRIME_API_KEY": "k1234"}
        config = PlatformConfig()
        if variable:
            environ[variable] = "http://api.example.test"
        else:
            config = PlatformConfig(api_base_url="http://api.example.test")
        with pytest.raises(errors.ConfigError, match=rf"^\{source}" if variable else rf"^{source}"):
            load_credentials(config, environ, tmp_path)

    def test_plain_http_to_a_remote_host_passes_when_explicitly_allowed(
        self, tmp_path: Path
    ) -> None:
        config = PlatformConfig(api_base_url="http://api.example.test", allow_insecure_http=True)
        assert (
            load_credentials(config, {"PRIME_API_KEY": "k1234"}, tmp_path).api_base
            == "http://api.example.test"
        )

    @pytest.mark.parametrize(
        "base",
        ["http://127.0.0.1:8700", "http://127.9.9.9", "http://[::1]:8700", "http://localhost:8700"],
    )
    def test_plain_http_to_loopback_is_always_allowed(self, tmp_path: Path, base: str) -> None:
        assert (
            load_credentials(
                PlatformConfig(api_base_url=base), {"PRIME_API_KEY": "k1234"}, tmp_path
            ).api_base
            == base
        )

    def test_a_base_that_is_not_an_http_url_is_a_config_error(self, tmp_path: Path) -> None:
        with pytest.raises(errors.ConfigError, match="platform.api_base_url"):
            load_credentials(
                PlatformConfig(api_base_url="ftp://x.test"), {"PRIME_API_KEY": "k1234"}, tmp_path
            )

    def test_the_key_is_hidden_from_repr_and_registered_for_redaction(self, tmp_path: Path) -> None:
        credentials = load_credentials(
            PlatformConfig(), {"PRIME_API_KEY": "sk-secret-repr-1"}, tmp_path
        )
        assert "sk-secret-repr-1" not in repr(credentials)
        assert log.scrub("key=sk-secret-repr-1") == f"key={log.REDACTED}"

    def test_reload_reports_whether_the_key_changed(self, tmp_path: Path) -> None:
        environ = {"PRIME_API_KEY": "first-key"}
        with PlatformClient(PlatformConfig(), environ=environ, home=tmp_path) as client:
            assert client.credentials.api_key == "first-key"  # read at first use
            assert client.reload_credentials() is False
            environ["PRIME_API_KEY"] = "second-key"
            assert client.reload_credentials() is True
            assert client.credentials.api_key == "second-key"


class TestEndpoints:
    def test_resolve_gets_or_creates_the_environment_by_name(
        self, platform_client: PlatformClient
    ) -> None:
        first = platform_client.resolve_environment("gsm8k")
        assert platform_client.resolve_environment("gsm8k") == first
        assert platform_client.resolve_environment("math") != first

    def test_create_returns_the_id_and_viewer_url_and_the_platform_keeps_the_body(
        self, platform_client: PlatformClient, local_platform: LocalPlatform
    ) -> None:
        env_id = platform_client.resolve_environment("gsm8k")
        evaluation_id, viewer_url = platform_client.create_evaluation(create_body(env_id, "run-42"))
        assert viewer_url and viewer_url.endswith(evaluation_id)
        read = platform_client.get_evaluation(evaluation_id)
        assert read.status == "RUNNING" and read.run_id == "run-42" and read.model == "m"
        assert stored(local_platform, evaluation_id)["environment_ids"] == [env_id]
        assert local_platform.summary()["runs"] == {"run-42": 1}

    def test_the_team_is_sent_when_set(
        self, make_platform_client: MakeClient, local_platform: LocalPlatform
    ) -> None:
        client = make_platform_client(
            environ={"PRIME_API_KEY": local_platform.api_key, "PRIME_TEAM_ID": "team-7"}
        )
        assert stored(local_platform, new_evaluation(client))["team_id"] == "team-7"

    def test_pushed_samples_are_listed_page_by_page_duplicates_included(
        self, platform_client: PlatformClient
    ) -> None:
        evaluation_id = new_evaluation(platform_client)
        platform_client.push_samples(evaluation_id, samples_body(*range(7)))
        platform_client.push_samples(evaluation_id, samples_body(3))
        ids = list(platform_client.iter_sample_ids(evaluation_id, page_size=3))
        assert ids == ["0", "1", "2", "3", "4", "5", "6", "3"]
        assert platform_client.get_evaluation(evaluation_id).sample_count == 8

    def test_an_evaluation_without_samples_lists_none(
        self, platform_client: PlatformClient
    ) -> None:
        assert list(platform_client.iter_sample_ids(new_evaluation(platform_client))) == []

    def test_finalize_completes_the_evaluation_once(
        self, platform_client: PlatformClient, local_platform: LocalPlatform
    ) -> None:
        evaluation_id = new_evaluation(platform_client)
        viewer_url = platform_client.finalize(evaluation_id, {"avg_reward": 0.75})
        assert viewer_url and viewer_url.endswith(evaluation_id)
        assert platform_client.get_evaluation(evaluation_id).finalized
        assert stored(local_platform, evaluation_id)["metrics"] == {"avg_reward": 0.75}
        with pytest.raises(errors.Conflict):
            platform_client.finalize(evaluation_id, {})
        with pytest.raises(errors.Conflict):
            platform_client.push_samples(evaluation_id, samples_body(1))

    def test_an_unknown_evaluation_is_gone(self, platform_client: PlatformClient) -> None:
        with pytest.raises(errors.Gone):
            platform_client.get_evaluation("no-such-evaluation")
        with pytest.raises(errors.Gone):
            platform_client.push_samples("no-such-evaluation", samples_body(1))

    def test_evaluations_are_listed_per_environment_across_pages(
        self, platform_client: PlatformClient
    ) -> None:
        runs = [f"run-{i}" for i in range(5)]
        for run_id in runs:
            new_evaluation(platform_client, run_id, env="gsm8k")
        new_evaluation(platform_client, "other-run", env="math")
        listed = list(platform_client.iter_evaluations("gsm8k", page_size=2))
        assert [e.run_id for e in listed] == runs

    def test_an_environment_name_of_any_characters_reaches_the_platform_as_it_is(
        self, platform_client: PlatformClient
    ) -> None:
        """The listing's query goes over the real transport without a URL parsed per request:
        spaces, `&`, `=`, `/`, `?`, `#`, `%`, `+` and non-ASCII arrive as they were."""
        name = "a b&c=d/e?f#g%20h+i é 数"
        new_evaluation(platform_client, "run-odd", env=name)
        new_evaluation(platform_client, "run-plain", env="a b")
        listed = list(platform_client.iter_evaluations(name))
        assert [e.run_id for e in listed] == ["run-odd"]

    def test_close_out_marks_the_evaluation_and_refuses_a_second_time(
        self, platform_client: PlatformClient, local_platform: LocalPlatform
    ) -> None:
        evaluation_id = new_evaluation(platform_client)
        platform_client.close_out(
            evaluation_id, "FAILED", error_message="superseded", metadata={"run_id": "run-1"}
        )
        evaluation = platform_client.get_evaluation(evaluation_id)
        assert evaluation.closed and not evaluation.finalized
        assert stored(local_platform, evaluation_id)["error_message"] == "superseded"
        with pytest.raises(errors.Conflict):
            platform_client.close_out(evaluation_id, "CANCELLED")

    def test_a_batch_over_25_mib_is_refused(self, platform_client: PlatformClient) -> None:
        evaluation_id = new_evaluation(platform_client)
        too_big = orjson.dumps({"samples": [{"sample_id": 1, "pad": "x" * MAX_BODY_BYTES}]})
        with pytest.raises(errors.BatchRefused) as caught:
            platform_client.push_samples(evaluation_id, too_big)
        assert caught.value.status == 413

    def test_a_batch_without_sample_ids_is_refused_as_unprocessable(
        self, platform_client: PlatformClient
    ) -> None:
        with pytest.raises(errors.BatchRefused) as caught:
            platform_client.push_samples(
                new_evaluation(platform_client), b'{"samples": [{"reward": 1}]}'
            )
        assert caught.value.status == 422

    def test_probe_answers_with_a_good_key_and_raises_auth_error_with_a_bad_one(
        self, make_platform_client: MakeClient
    ) -> None:
        make_platform_client().probe()
        with pytest.raises(errors.AuthError):
            make_platform_client(api_key="wrong-key-123").probe()

    def test_the_viewer_url_is_the_frontend_dashboard_page(self, tmp_path: Path) -> None:
        environ = {"PRIME_API_KEY": "k1234", "PRIME_FRONTEND_URL": "https://app.test/"}
        with PlatformClient(PlatformConfig(), environ=environ, home=tmp_path) as client:
            assert client.viewer_url("e1") == "https://app.test/dashboard/evaluations/e1"

    def test_every_request_carries_the_bearer_key_and_the_user_agent(self, tmp_path: Path) -> None:
        seen: list[httpx.Request] = []

        def answer(request: httpx.Request) -> httpx.Response:
            seen.append(request)
            return httpx.Response(200, json={"data": {"id": "env-1"}})

        transport = CannedTransport(answer)
        environ = {"PRIME_API_KEY": "k-header-1", "PRIME_API_BASE_URL": "https://api.test/"}
        with PlatformClient(
            PlatformConfig(), environ=environ, home=tmp_path, transport=transport
        ) as client:
            client.resolve_environment("gsm8k")
        (request,) = seen
        assert str(request.url) == "https://api.test/api/v1/environmentshub/resolve"
        assert request.headers["Authorization"] == "Bearer k-header-1"
        assert request.headers["User-Agent"] == USER_AGENT
        assert request.headers["Content-Type"] == "application/json"

    def test_requests_carry_the_host_the_timeouts_and_the_key_of_the_credentials_in_use(
        self, tmp_path: Path
    ) -> None:
        """Requests go to the transport with what an HTTP client adds (the Host, the timeouts,
        the query), and a reloaded key or base is used at once."""
        seen: list[httpx.Request] = []

        def answer(request: httpx.Request) -> httpx.Response:
            seen.append(request)
            return httpx.Response(200, json={"evaluations": [], "has_more": False})

        environ = {"PRIME_API_KEY": "k-first-1", "PRIME_API_BASE_URL": "https://api.test:8443"}
        config = PlatformConfig(connect_timeout_seconds=3.0, read_timeout_seconds=7.0)
        with PlatformClient(
            config, environ=environ, home=tmp_path, transport=CannedTransport(answer)
        ) as client:
            assert list(client.iter_evaluations("a b&c")) == []
            environ.update(PRIME_API_KEY="k-second-2", PRIME_API_BASE_URL="https://other.test")
            client.reload_credentials()
            client.probe()
        first, second = seen
        assert str(first.url) == (
            "https://api.test:8443/api/v1/evaluations/?environment_name=a+b%26c&skip=0&limit=100"
        )
        assert first.url.params["environment_name"] == "a b&c"
        assert first.headers["Host"] == "api.test:8443"
        assert first.headers["Authorization"] == "Bearer k-first-1"
        assert first.extensions["timeout"] == {
            "connect": 3.0,
            "read": 7.0,
            "write": 7.0,
            "pool": 3.0,
        }
        assert str(second.url) == "https://other.test/api/v1/evaluations/?limit=1"
        assert second.headers["Host"] == "other.test"
        assert second.headers["Authorization"] == "Bearer k-second-2"


def mock_client(
    tmp_path: Path, answers: list[httpx.Response] | Callable[[httpx.Request], httpx.Response]
) -> PlatformClient:
    """A client whose requests get `answers` in turn (or whatever the function answers)."""
    queue = list(answers) if isinstance(answers, list) else None

    def answer(request: httpx.Request) -> httpx.Response:
        return queue.pop(0) if queue is not None else answers(request)  # type: ignore[operator]

    environ = {"PRIME_API_KEY": "k-mock-1", "PRIME_API_BASE_URL": "https://api.test"}
    return PlatformClient(
        PlatformConfig(), environ=environ, home=tmp_path, transport=CannedTransport(answer)
    )


class TestTolerantShapes:
    def test_resolve_accepts_the_id_at_the_top_level(self, tmp_path: Path) -> None:
        assert (
            mock_client(tmp_path, [httpx.Response(200, json={"id": "env-2"})]).resolve_environment(
                "x"
            )
            == "env-2"
        )

    @pytest.mark.parametrize(
        "answer",
        [
            {"evaluation_id": "e1"},
            {"id": "e1"},
            {"data": {"id": "e1"}},
            {"data": {"evaluation_id": "e1"}},
        ],
    )
    def test_create_finds_the_evaluation_id_under_any_known_key(
        self, tmp_path: Path, answer: dict[str, Any]
    ) -> None:
        assert mock_client(tmp_path, [httpx.Response(201, json=answer)]).create_evaluation({}) == (
            "e1",
            None,
        )

    def test_sample_pages_may_be_lists_or_objects_and_end_on_an_empty_page(
        self, tmp_path: Path
    ) -> None:
        pages = [
            httpx.Response(200, json=[{"sample_id": 1}, {"sample_id": 2}]),
            httpx.Response(200, json={"data": [{"sample_id": "3"}]}),
            httpx.Response(200, json={"samples": []}),
        ]
        assert list(mock_client(tmp_path, pages).iter_sample_ids("e1", page_size=2)) == [
            "1",
            "2",
            "3",
        ]

    def test_a_short_page_without_hints_does_not_end_the_listing(self, tmp_path: Path) -> None:
        pages = [
            httpx.Response(200, json={"samples": [{"sample_id": i} for i in range(100)]}),
            httpx.Response(200, json={"samples": [{"sample_id": 100}]}),
            httpx.Response(200, json={"samples": []}),
        ]
        assert len(list(mock_client(tmp_path, pages).iter_sample_ids("e1", page_size=500))) == 101

    def test_evaluation_pages_advance_by_what_came_back(self, tmp_path: Path) -> None:
        skips: list[str] = []

        def answer(request: httpx.Request) -> httpx.Response:
            skips.append(request.url.params["skip"])
            skip = int(request.url.params["skip"])
            return httpx.Response(200, json=[{"id": f"e{skip}"}] if skip < 2 else [])

        assert [e.id for e in mock_client(tmp_path, answer).iter_evaluations("gsm8k")] == [
            "e0",
            "e1",
        ]
        assert skips == ["0", "1", "2"]

    def test_get_evaluation_unwraps_a_data_envelope(self, tmp_path: Path) -> None:
        answer = httpx.Response(200, json={"data": {"id": "e1", "status": "COMPLETED"}})
        assert mock_client(tmp_path, [answer]).get_evaluation("e1").finalized

    @pytest.mark.parametrize(
        "answer",
        [{"status": "COMPLETED"}, {"status": "completed"}, {"data": {"status": " Completed "}}],
    )
    def test_a_read_evaluation_is_finalized_when_its_status_is_completed_in_any_case(
        self, tmp_path: Path, answer: dict[str, Any]
    ) -> None:
        read = mock_client(tmp_path, [httpx.Response(200, json=answer)]).get_evaluation("e1")
        assert read.finalized and read.closed

    @pytest.mark.parametrize(
        "answer",
        [{"status": "RUNNING"}, {"status": "FAILED"}, {}, {"status": None}, {"status": "DONE"}],
    )
    def test_a_read_evaluation_with_another_status_or_none_is_not_finalized(
        self, tmp_path: Path, answer: dict[str, Any]
    ) -> None:
        read = mock_client(tmp_path, [httpx.Response(200, json=answer)]).get_evaluation("e1")
        assert not read.finalized
        assert read.closed == (answer.get("status") == "FAILED")

    @pytest.mark.parametrize(
        ("step", "answer", "field"),
        [
            ("finalize", {"evaluation_id": "e1", "status": 3}, "$.status"),
            ("samples", {"accepted": "3"}, "$.accepted"),
            ("create", {"evaluation_id": True}, "$.evaluation_id"),
        ],
    )
    def test_a_write_answered_with_a_field_of_another_type_is_ambiguous_naming_the_field(
        self, tmp_path: Path, step: str, answer: dict[str, Any], field: str
    ) -> None:
        client = mock_client(tmp_path, [httpx.Response(200, json=answer)])
        call = {
            "finalize": lambda: client.finalize("e1", {}),
            "samples": lambda: client.push_samples("e1", b'{"samples": [1, 2, 3]}', count=3),
            "create": lambda: client.create_evaluation({}),
        }[step]
        with pytest.raises(errors.Ambiguous, match=re.escape(field)):
            call()

    @pytest.mark.parametrize(
        ("step", "answer", "field"),
        [
            ("get", {"id": "e1", "sample_count": -1}, "$.sample_count"),
            ("get", {"id": "e1", "metadata": ["run-1"]}, "$.metadata"),
            ("list samples", {"samples": [{"sample_id": "a"}, {"id": "b"}]}, "$.samples[1]"),
            ("list samples", {"samples": [], "has_more": "no"}, "$.has_more"),
            ("list evaluations", {"evaluations": [{"id": "e1", "status": 1}]}, "$.evaluations"),
        ],
    )
    def test_a_read_answered_with_a_field_of_another_type_is_transient_naming_the_field(
        self, tmp_path: Path, step: str, answer: dict[str, Any], field: str
    ) -> None:
        client = mock_client(tmp_path, lambda request: httpx.Response(200, json=answer))
        call = {
            "get": lambda: client.get_evaluation("e1"),
            "list samples": lambda: list(client.iter_sample_ids("e1")),
            "list evaluations": lambda: list(client.iter_evaluations("gsm8k")),
        }[step]
        with pytest.raises(errors.Transient, match=re.escape(field)) as caught:
            call()
        assert not isinstance(caught.value, errors.Ambiguous) and caught.value.unusable

    @pytest.mark.parametrize(
        "step",
        [
            lambda c: c.create_evaluation({}),
            lambda c: c.push_samples("e1", b'{"samples":[]}'),
            lambda c: c.finalize("e1", {}),
        ],
        ids=["create", "push samples", "finalize"],
    )
    def test_an_unreadable_2xx_on_a_non_replayable_step_is_ambiguous(
        self, tmp_path: Path, step: Callable[[PlatformClient], Any]
    ) -> None:
        with pytest.raises(errors.Ambiguous):
            step(mock_client(tmp_path, [httpx.Response(200, text="<html>gateway</html>")]))

    def test_a_2xx_nested_too_deeply_to_parse_is_unreadable_not_a_crash(
        self, tmp_path: Path
    ) -> None:
        deep = b'{"evaluation_id": "e1", "metadata": {"a": ' + b"[" * 5000 + b"]" * 5000 + b"}}"
        with pytest.raises(errors.Ambiguous, match="not JSON"):
            mock_client(tmp_path, [httpx.Response(200, content=deep)]).create_evaluation({})

    def test_a_create_answer_without_an_id_is_ambiguous(self, tmp_path: Path) -> None:
        with pytest.raises(errors.Ambiguous, match="no evaluation id"):
            mock_client(tmp_path, [httpx.Response(200, json={"ok": True})]).create_evaluation({})

    @pytest.mark.parametrize(
        "step",
        [
            lambda c: c.get_evaluation("e1"),
            lambda c: list(c.iter_sample_ids("e1")),
            lambda c: list(c.iter_evaluations("x")),
            lambda c: c.resolve_environment("x"),
        ],
        ids=["get", "list samples", "list evaluations", "resolve"],
    )
    def test_an_unreadable_2xx_on_a_read_is_merely_transient(
        self, tmp_path: Path, step: Callable[[PlatformClient], Any]
    ) -> None:
        with pytest.raises(errors.Transient) as caught:
            step(mock_client(tmp_path, [httpx.Response(200, text="not json")]))
        assert not isinstance(caught.value, errors.Ambiguous)

    def test_an_empty_2xx_to_push_samples_or_finalize_is_success(self, tmp_path: Path) -> None:
        client = mock_client(tmp_path, [httpx.Response(204), httpx.Response(200)])
        client.push_samples("e1", b'{"samples":[]}')
        assert client.finalize("e1", {}) is None


NON_REPLAYABLE_STEPS = ["create", "samples", "finalize"]


def run_step(
    step: str, client: PlatformClient, env_id: str, evaluation_id: str
) -> Callable[[], Any]:
    """The single platform call for a non-replayable step, ready for `Retrier.call`."""
    if step == "create":
        return lambda: client.create_evaluation(create_body(env_id, "run-ambiguous"))
    if step == "samples":
        return lambda: client.push_samples(evaluation_id, samples_body(1, 2, 3))
    return lambda: client.finalize(evaluation_id, {"avg_reward": 1.0})


def assert_done_once(
    step: str, platform: LocalPlatform, evaluation_id: str, sent_before: int
) -> None:
    """The platform did `step`'s work once, from exactly one request since `sent_before`."""
    summary = platform.summary()
    assert summary["requests"][step] == sent_before + 1, "the client must not replay the step"
    if step == "create":
        assert summary["runs"]["run-ambiguous"] == 1
    elif step == "samples":
        evaluation = summary["evaluations"][evaluation_id]
        assert (evaluation["sample_count"], evaluation["duplicates"]) == (3, 0)
    else:
        evaluation = summary["evaluations"][evaluation_id]
        assert (evaluation["status"], evaluation["finalize_count"]) == ("COMPLETED", 1)


class TestFailuresAgainstTheLocalPlatform:
    @pytest.fixture
    def setup(self, platform_client: PlatformClient) -> tuple[str, str]:
        env_id = platform_client.resolve_environment("gsm8k")
        evaluation_id, _ = platform_client.create_evaluation(create_body(env_id, "run-setup"))
        return env_id, evaluation_id

    def test_a_burst_of_503s_on_a_replayable_step_is_retried_until_the_platform_answers(
        self,
        retrier: Retrier,
        platform_client: PlatformClient,
        local_platform: LocalPlatform,
        setup: tuple[str, str],
    ) -> None:
        sent_before = local_platform.summary()["requests"]["resolve"]
        local_platform.inject("status", on="resolve", status=503, count=3)
        env_id = retrier.call(
            lambda: platform_client.resolve_environment("gsm8k"), replayable=True, what="resolve"
        )
        assert env_id == setup[0]
        assert local_platform.summary()["requests"]["resolve"] == sent_before + 4

    @pytest.mark.parametrize("status", [408, 429, 500, 503])
    @pytest.mark.parametrize("step", ["create", "samples", "finalize"])
    def test_a_retryable_status_on_a_step_that_must_not_be_replayed_is_ambiguous(
        self,
        retrier: Retrier,
        platform_client: PlatformClient,
        local_platform: LocalPlatform,
        setup: tuple[str, str],
        step: str,
        status: int,
    ) -> None:
        """The server may have done the work before it answered: the step is not sent again
        blind (the upload reconciles it with a read first)."""
        local_platform.inject("status", on=step, status=status, do_work=True)
        with pytest.raises(errors.Ambiguous, match=f"HTTP {status}"):
            retrier.call(run_step(step, platform_client, *setup), replayable=False, what=step)

    def test_a_429_with_retry_after_waits_that_long_then_succeeds(
        self,
        retrier: Retrier,
        platform_client: PlatformClient,
        local_platform: LocalPlatform,
        setup: tuple[str, str],
    ) -> None:
        local_platform.inject("status", on="read", status=429, retry_after="0.3")
        started = time.monotonic()
        evaluation = retrier.call(
            lambda: platform_client.get_evaluation(setup[1]), replayable=True, what="read"
        )
        assert time.monotonic() - started >= 0.3
        assert local_platform.summary()["requests"]["read"] >= 2
        assert evaluation.status == "RUNNING"

    def test_a_short_refused_connection_outage_is_ridden_out_with_one_probe_at_a_time(
        self,
        retrier: Retrier,
        platform_client: PlatformClient,
        local_platform: LocalPlatform,
        setup: tuple[str, str],
        fast_gate: Gate,
    ) -> None:
        sent_before = local_platform.summary()["requests"]["finalize"]
        local_platform.inject("refuse", seconds=0.8)
        with capture_logs() as logs:
            retrier.call(
                run_step("finalize", platform_client, *setup), replayable=False, what="finalize"
            )
        events = [e["event"] for e in logs]
        assert "platform unreachable: uploads wait while one probe checks it" in events
        assert events[-1] == "platform answers again: uploads resume"
        assert fast_gate.mode == "open"
        assert_done_once("finalize", local_platform, setup[1], sent_before)

    @pytest.mark.parametrize("step", NON_REPLAYABLE_STEPS)
    def test_a_reset_after_the_work_is_ambiguous_and_not_replayed(
        self,
        step: str,
        retrier: Retrier,
        platform_client: PlatformClient,
        local_platform: LocalPlatform,
        setup: tuple[str, str],
    ) -> None:
        sent_before = local_platform.summary()["requests"][step]
        local_platform.inject("reset", on=step)
        with pytest.raises(errors.Ambiguous):
            retrier.call(run_step(step, platform_client, *setup), replayable=False, what=step)
        assert_done_once(step, local_platform, setup[1], sent_before)

    @pytest.mark.parametrize("step", NON_REPLAYABLE_STEPS)
    def test_a_stall_past_the_read_timeout_is_ambiguous_and_not_replayed(
        self,
        step: str,
        make_platform_client: MakeClient,
        local_platform: LocalPlatform,
        make_retrier: MakeRetrier,
    ) -> None:
        client = make_platform_client(read_timeout_seconds=0.25)
        env_id = client.resolve_environment("gsm8k")
        evaluation_id, _ = client.create_evaluation(create_body(env_id, "run-setup"))
        sent_before = local_platform.summary()["requests"][step]
        local_platform.inject("stall", on=step, seconds=1.0)
        retrier = make_retrier(client)
        with pytest.raises(errors.Ambiguous, match="ReadTimeout"):
            retrier.call(run_step(step, client, env_id, evaluation_id), replayable=False, what=step)
        assert_done_once(step, local_platform, evaluation_id, sent_before)

    @pytest.mark.parametrize("step", NON_REPLAYABLE_STEPS)
    def test_a_malformed_2xx_is_ambiguous_and_the_work_was_done(
        self,
        step: str,
        platform_client: PlatformClient,
        local_platform: LocalPlatform,
        setup: tuple[str, str],
    ) -> None:
        sent_before = local_platform.summary()["requests"][step]
        local_platform.inject("malformed", on=step)
        with pytest.raises(errors.Ambiguous):
            run_step(step, platform_client, *setup)()
        assert_done_once(step, local_platform, setup[1], sent_before)

    def test_a_502_after_the_work_is_ambiguous_and_the_work_was_done(
        self, platform_client: PlatformClient, local_platform: LocalPlatform, setup: tuple[str, str]
    ) -> None:
        sent_before = local_platform.summary()["requests"]["samples"]
        local_platform.inject("status", on="samples", status=502, do_work=True)
        with pytest.raises(errors.Ambiguous):
            run_step("samples", platform_client, *setup)()
        assert_done_once("samples", local_platform, setup[1], sent_before)

    def test_reads_are_retried_through_resets_and_malformed_answers(
        self,
        retrier: Retrier,
        platform_client: PlatformClient,
        local_platform: LocalPlatform,
        setup: tuple[str, str],
    ) -> None:
        local_platform.inject("reset", on="read")
        local_platform.inject("malformed", on="read")
        evaluation = retrier.call(
            lambda: platform_client.get_evaluation(setup[1]), replayable=True, what="read"
        )
        assert evaluation.id == setup[1]

    def test_a_401_closes_the_gate_until_the_key_is_fixed(
        self,
        make_platform_client: MakeClient,
        local_platform: LocalPlatform,
        fast_gate: Gate,
        make_retrier: MakeRetrier,
    ) -> None:
        environ = {"PRIME_API_KEY": "wrong-key-401"}
        client = make_platform_client(environ=environ)
        retrier = make_retrier(client)
        outcome: list[Any] = []
        worker = threading.Thread(
            target=lambda: outcome.append(
                retrier.call(
                    lambda: client.resolve_environment("gsm8k"), replayable=True, what="resolve"
                )
            ),
        )
        with capture_logs() as logs:
            worker.start()
            deadline = time.monotonic() + 5
            while fast_gate.mode != "auth" and time.monotonic() < deadline:
                time.sleep(0.01)
            assert fast_gate.state.startswith("auth refused since ")
            environ["PRIME_API_KEY"] = local_platform.api_key
            worker.join(5)
        assert outcome and outcome[0].startswith("env_")
        paused = [e for e in logs if e["event"].startswith("uploads paused")]
        assert len(paused) == 1


class TestSecrets:
    def test_the_key_never_appears_in_a_log_event(
        self,
        make_platform_client: MakeClient,
        local_platform: LocalPlatform,
        fast_gate: Gate,
        make_retrier: MakeRetrier,
    ) -> None:
        bad_key = "sk-wrong-never-logged-1"
        environ = {"PRIME_API_KEY": bad_key}
        client = make_platform_client(environ=environ)
        retrier = make_retrier(client)
        local_platform.inject("status", on="resolve", status=503, count=2)
        with capture_logs() as logs:
            worker = threading.Thread(
                target=lambda: retrier.call(
                    lambda: client.resolve_environment("gsm8k"),
                    replayable=True,
                    what="resolve",
                    run="run-s",
                )
            )
            worker.start()
            while fast_gate.mode != "auth" and worker.is_alive():
                time.sleep(0.01)
            environ["PRIME_API_KEY"] = local_platform.api_key
            worker.join(5)
        assert logs, "the scenario should have logged"
        for event in logs:
            assert bad_key not in repr(event) and local_platform.api_key not in repr(event)

    def test_the_configured_processors_redact_the_key_from_rendered_lines(
        self,
        make_platform_client: MakeClient,
        local_platform: LocalPlatform,
        make_retrier: MakeRetrier,
    ) -> None:
        saved = structlog.get_config()
        out = io.StringIO()
        try:
            log.configure(level="debug", fmt="json", stream=out)
            key = local_platform.api_key
            client = make_platform_client()
            local_platform.inject("status", on="resolve", status=503, count=1)
            make_retrier(client).call(
                lambda: client.resolve_environment("gsm8k"),
                replayable=True,
                what="resolve",
                run="run-r",
            )
            logger = log.get_logger(run="run-r")
            logger.error("a careless line", detail=f"sent Authorization: Bearer {key}", api_key=key)
            try:
                raise errors.AuthError(f"the server echoed {key}")
            except errors.AuthError:
                logger.exception("a careless exception")
        finally:
            structlog.configure(**saved)
        rendered = out.getvalue()
        assert "platform call failed; retrying" in rendered and "a careless exception" in rendered
        assert key not in rendered
        assert rendered.count(log.REDACTED) >= 3


class TestAnswersAreCheckedAgainstWhatWasAsked:
    """An answer that does not fit its request may answer another one (a repeated answer on a
    connection): for a step that must not be replayed it is ambiguous, and the run reconciles
    by reading the platform."""

    @pytest.mark.parametrize(
        ("step", "answer"),
        [
            ("finalize", {"evaluation_id": "e-other", "status": "COMPLETED"}),
            ("finalize", {"data": {"id": "e-other"}}),
            ("finalize", {"evaluation_id": "e1", "status": "RUNNING"}),
            ("samples", {"accepted": 2, "sample_count": 2}),
            ("samples", {"evaluation_id": "e-other", "accepted": 3}),
            ("create", {"data": {"id": "env-1"}}),
            ("create", {"evaluation_id": "e1", "status": "COMPLETED"}),
        ],
        ids=[
            "finalize naming another evaluation",
            "finalize naming another evaluation under data",
            "finalize with a status that is not final",
            "samples accepting fewer than the batch",
            "samples naming another evaluation",
            "create answered with the environment",
            "create answered with a finalized evaluation",
        ],
    )
    def test_an_answer_that_does_not_fit_its_request_is_ambiguous(
        self, tmp_path: Path, step: str, answer: dict[str, Any]
    ) -> None:
        client = mock_client(tmp_path, [httpx.Response(200, json=answer)])
        call = {
            "finalize": lambda: client.finalize("e1", {}),
            "samples": lambda: client.push_samples("e1", b'{"samples": [1, 2, 3]}', count=3),
            "create": lambda: client.create_evaluation({"environments": [{"id": "env-1"}]}),
        }[step]
        with pytest.raises(errors.Ambiguous):
            call()

    @pytest.mark.parametrize(
        ("step", "answer"),
        [
            ("finalize", {"evaluation_id": "e1", "status": "COMPLETED", "viewer_url": None}),
            ("finalize", {}),
            ("samples", {"accepted": 3, "sample_count": 9}),
            ("samples", {}),
        ],
    )
    def test_an_answer_that_fits_its_request_is_taken(
        self, tmp_path: Path, step: str, answer: dict[str, Any]
    ) -> None:
        client = mock_client(tmp_path, [httpx.Response(200, json=answer)])
        if step == "finalize":
            assert client.finalize("e1", {}) is None
        else:
            client.push_samples("e1", b'{"samples": [1, 2, 3]}', count=3)

    def test_a_read_of_one_evaluation_answered_with_another_is_transient(
        self, tmp_path: Path
    ) -> None:
        answer = httpx.Response(200, json={"id": "e-other", "status": "RUNNING"})
        with pytest.raises(errors.Transient, match="another evaluation"):
            mock_client(tmp_path, [answer]).get_evaluation("e1")
