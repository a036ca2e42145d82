"""Canned answers for the platform client: `CannedTransport(answer)` hands each request the
client sends to `answer` as an `httpx.Request` and gives its `httpx.Response` back as the
transport's own `Response`, so a test can answer what the local platform never would (odd
shapes, malformed bodies) and see every request as it left (URL, headers, timeouts).
`ObservedTransport` is the real transport with a hook that hears of each request first."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import httpx

from evalpush.transport import Headers, Origin, Response, StoppableTransport, Timeouts

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


class ObservedTransport(StoppableTransport):
    """The real transport over real sockets; `observe` hears of each request before it is sent
    (its method, its path without the query, its headers): tests note or check what went out."""

    def __init__(self) -> None:
        super().__init__(threading.Event())

    def observe(self, method: str, path: str, headers: dict[bytes, bytes]) -> None:
        raise NotImplementedError

    def send(
        self,
        method: bytes,
        origin: Origin,
        path: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes | None,
        timeouts: Timeouts,
    ) -> Response:
        self.observe(method.decode(), path.decode().partition("?")[0], dict(headers))
        return super().send(method, origin, path, headers, body, timeouts)
