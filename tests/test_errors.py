"""The one place that decides what a platform answer or a failed exchange means."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import pytest

from evalpush import log
from evalpush.core import errors
from evalpush.core.errors import from_status, from_transport_error, parse_retry_after

NOW = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)


class TestFromStatus:
    @pytest.mark.parametrize(
        ("status", "cls"),
        [
            (401, errors.AuthError),
            (403, errors.AuthError),
            (404, errors.Gone),
            (409, errors.Conflict),
            (413, errors.BatchRefused),
            (422, errors.BatchRefused),
            (502, errors.Ambiguous),
            (504, errors.Ambiguous),
            (408, errors.Transient),
            (429, errors.Transient),
            (500, errors.Transient),
            (503, errors.Transient),
            (501, errors.Transient),
            (599, errors.Transient),
            (400, errors.Refused),
            (405, errors.Refused),
            (301, errors.Refused),
        ],
    )
    def test_each_status_maps_to_exactly_its_class(self, status: int, cls: type) -> None:
        error = from_status(status, what="create evaluation")
        assert type(error) is cls
        assert "create evaluation" in str(error) and str(status) in str(error)

    def test_ambiguous_statuses_are_transient_so_replayable_steps_retry_them(self) -> None:
        assert isinstance(from_status(502, what="x"), errors.Transient)

    def test_refusals_carry_the_status(self) -> None:
        assert from_status(422, what="push samples").status == 422
        assert from_status(503, what="push samples").status == 503

    def test_retry_after_seconds_ride_on_the_transient_error(self) -> None:
        assert from_status(429, what="x", retry_after="7").retry_after == 7.0
        assert from_status(503, what="x", retry_after="1.5").retry_after == 1.5
        assert from_status(500, what="x").retry_after is None

    def test_the_message_quotes_at_most_200_characters_of_the_body(self) -> None:
        error = from_status(500, what="finalize", body="x" * 1000)
        assert "x" * 200 in str(error) and "x" * 201 not in str(error)


class TestSecretsInMessages:
    KEY = "sk-errors-echo-7f3a9c2e41b8d6"

    @pytest.fixture(autouse=True)
    def registered(self) -> None:
        log.register_secret(self.KEY)

    def test_a_body_that_echoes_the_key_is_scrubbed_from_the_error(self) -> None:
        body = f'{{"detail": "bad token {self.KEY}", "auth": "Bearer {self.KEY}"}}'
        message = str(from_status(422, what="push samples", body=body))
        assert self.KEY not in message and self.KEY[:8] not in message
        assert log.REDACTED in message

    def test_a_transport_error_quoting_the_header_is_scrubbed(self) -> None:
        exc = httpx.LocalProtocolError(f"Illegal header value b'Bearer {self.KEY}\\n'")
        message = str(from_transport_error(exc, what="probe"))
        assert self.KEY not in message and self.KEY[-10:] not in message


class TestFromTransportError:
    @pytest.mark.parametrize(
        ("exc", "cls"),
        [
            (httpx.ConnectError("[Errno 111] Connection refused"), errors.Unreachable),
            (httpx.ConnectError("[Errno -2] Name or service not known"), errors.Unreachable),
            (httpx.ConnectTimeout("timed out"), errors.Unreachable),
            (httpx.ProxyError("the proxy refused a tunnel: HTTP 407"), errors.Unreachable),
            (httpx.ReadTimeout("timed out"), errors.Ambiguous),
            (httpx.WriteTimeout("timed out"), errors.Ambiguous),
            (httpx.ReadError("[Errno 104] Connection reset by peer"), errors.Ambiguous),
            (httpx.WriteError("[Errno 32] Broken pipe"), errors.Ambiguous),
            (
                httpx.RemoteProtocolError("Server disconnected without sending a response."),
                errors.Ambiguous,
            ),
            # Nothing went out, and the same request fails the same way: no retry loop.
            (httpx.LocalProtocolError("Illegal header value b'Bearer x'"), errors.Unsendable),
            (
                httpx.UnsupportedProtocol("Request URL has an unsupported protocol"),
                errors.Unsendable,
            ),
        ],
    )
    def test_each_transport_error_maps_to_exactly_its_class(
        self, exc: httpx.TransportError, cls: type
    ) -> None:
        error = from_transport_error(exc, what="push samples to e1")
        assert type(error) is cls
        assert str(error).startswith("push samples to e1: ")

    def test_an_unsendable_request_is_a_refusal_so_it_is_never_retried(self) -> None:
        error = from_transport_error(httpx.LocalProtocolError("bad"), what="x")
        assert isinstance(error, errors.Refused) and not isinstance(error, errors.Transient)

    def test_a_transport_failure_has_no_status_so_the_gate_knows_nothing_answered(self) -> None:
        assert from_transport_error(httpx.ReadTimeout("t"), what="x").status is None


class TestParseRetryAfter:
    @pytest.mark.parametrize(
        ("value", "seconds"),
        [("120", 120.0), ("0", 0.0), (" 3 ", 3.0), ("0.25", 0.25), ("-5", 0.0), ("999999", 3600.0)],
    )
    def test_delta_seconds(self, value: str, seconds: float) -> None:
        assert parse_retry_after(value, now=NOW) == seconds

    def test_an_http_date_is_seconds_from_the_injected_now(self) -> None:
        header = format_datetime(NOW + timedelta(seconds=90), usegmt=True)
        assert parse_retry_after(header, now=NOW) == 90.0

    def test_an_http_date_in_the_past_means_now(self) -> None:
        header = format_datetime(NOW - timedelta(minutes=5), usegmt=True)
        assert parse_retry_after(header, now=NOW) == 0.0

    def test_a_far_future_date_is_capped(self) -> None:
        header = format_datetime(NOW + timedelta(days=3), usegmt=True)
        assert parse_retry_after(header, now=NOW) == errors.RETRY_AFTER_CAP_SECONDS

    @pytest.mark.parametrize("value", [None, "", "soon", "nan", "inf", "Mon, 99 Foo 2025"])
    def test_absent_or_unparsable_is_none(self, value: str | None) -> None:
        assert parse_retry_after(value, now=NOW) is None
