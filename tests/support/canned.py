"""Canned answers for the platform client: `CannedTransport(answer)` hands each request the
client sends to `answer` as an `httpx.Request` and gives its `httpx.Response` back as the
transport's own `Response`, so a test can answer what the local platform never would (odd
shapes, malformed bodies) and see every request as it left (URL, headers, timeouts)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx

from evalpush.transport import Headers, Origin, Response, Timeouts

Answer = Callable[[httpx.Request], httpx.Response]


class _Canned:
    def __init__(self, content: bytes) -> None:
        self._content: bytes | None = content

    def chunks(self) -> Iterator[bytes]:
        content, self._content = self._content, None
        if content:
            yield content

    def close(self) -> None:
        self._content = None


class CannedTransport:
    """The `evalpush.transport.Transport` interface over an `httpx.Request -> httpx.Response`
    function. The request carries the timeouts as httpx's `timeout` extension (pool: none)."""

    def __init__(self, answer: Answer) -> None:
        self._answer = answer

    def send(
        self,
        method: bytes,
        origin: Origin,
        path: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes | None,
        timeouts: Timeouts,
    ) -> Response:
        url = f"{origin.scheme}://{origin.host_header.decode()}{path.decode('ascii')}"
        request = httpx.Request(
            method.decode("ascii"),
            url,
            headers=headers,
            content=body or b"",
            extensions={
                "timeout": {
                    "connect": timeouts.connect,
                    "read": timeouts.read,
                    "write": timeouts.write,
                }
            },
        )
        answered = self._answer(request)
        fields = {name.lower(): value for name, value in answered.headers.items()}
        return Response(answered.status_code, Headers(fields), _Canned(answered.read()))

    def close(self) -> None:
        pass
