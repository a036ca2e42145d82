"""Canned answers for the platform client: `CannedTransport(answer)` is httpx's own
`MockTransport`, handing each request the client sends to `answer` as an `httpx.Request`, so a
test can answer what the local platform never would (odd shapes, malformed bodies) and see
every request as it left (URL, headers, timeouts). `ObservedTransport` is a real httpx
transport over real sockets with a hook that hears of each request first."""

from __future__ import annotations

import httpx

CannedTransport = httpx.MockTransport


class ObservedTransport(httpx.HTTPTransport):
    """httpx's transport over real sockets; `observe` hears of each request before it is sent
    (its method, its path without the query, its headers): tests note or check what went out."""

    def observe(self, method: str, path: str, headers: httpx.Headers) -> None:
        raise NotImplementedError

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.observe(request.method, request.url.path, request.headers)
        return super().handle_request(request)
