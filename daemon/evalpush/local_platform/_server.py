"""The local platform's HTTP side: aiohttp routes, bearer auth, the body cap, fault injection.

Runs on one event loop; storage calls go to one worker thread so a 25 MiB batch being parsed
and stored does not hold up other connections (probes, control requests).
"""

from __future__ import annotations

import asyncio
import hmac
import socket
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec
from aiohttp import web

from evalpush.local_platform._bomb import bomb
from evalpush.local_platform._dashboard import add_routes as add_dashboard_routes
from evalpush.local_platform._faults import REQUEST_KINDS, Fault, FaultPlan
from evalpush.local_platform._store import Refusal, Store, decode_json
from evalpush.log import get_logger

MAX_BODY_BYTES = 25 * 1024 * 1024
MAX_PAGE_LIMIT = 1000
SMALL_BODY_BYTES = 64 * 1024
"""A request body up to this size is stored on the event loop (`_in_db`), not handed over."""
SHUTDOWN_SECONDS = 2.0
DROP_SECONDS = 1.0
MALFORMED_BODY = b"<html><body>502 Bad Gateway (not JSON)</body></html>"
ENDLESS_CHUNK = b" " * (1024 * 1024)
BAD_VIEWER_URL = "javascript:alert(document.cookie)"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(
        body=msgspec.json.encode(data), status=status, content_type="application/json"
    )


def _error(status: int, detail: str, headers: dict[str, str] | None = None) -> web.Response:
    response = _json({"detail": detail}, status)
    response.headers.update(headers or {})
    return response


def _query_int(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query.get(name)
    try:
        value = default if raw is None else int(raw)
    except ValueError:
        raise Refusal(422, f"{name} must be an integer") from None
    if not low <= value <= high:
        raise Refusal(422, f"{name} must be between {low} and {high}")
    return value


_BODY_READ = web.RequestKey("evalpush_body", bytes)
"""Where a body read ahead of its work is kept on the request (the `late` fault)."""


async def _read_body(request: web.Request) -> bytes | bytearray:
    """The request body, refused with 413 past MAX_BODY_BYTES without reading the rest."""
    read_ahead = request.get(_BODY_READ)
    if read_ahead is not None:
        return read_ahead
    length = request.content_length
    if length is not None:
        if length > MAX_BODY_BYTES:
            raise Refusal(
                413, f"request body of {length} bytes is over the {MAX_BODY_BYTES}-byte limit"
            )
        # aiohttp's empty payload raises on readexactly(0): an empty body was a 500, not a 422.
        return await request.content.readexactly(length) if length else b""
    body = bytearray()
    async for chunk in request.content.iter_any():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise Refusal(413, f"request body is over the {MAX_BODY_BYTES}-byte limit")
    return body


class PlatformServer:
    """The aiohttp application and its listening socket; start, refuse, stop on the loop."""

    def __init__(self, store: Store, *, host: str, port: int, api_key: str | None) -> None:
        self.store = store
        self.faults = FaultPlan()
        self.request_counts = dict.fromkeys(REQUEST_KINDS, 0)
        self._host = host
        self._port = port
        self._api_key = api_key
        self._db = ThreadPoolExecutor(max_workers=1, thread_name_prefix="local-platform-db")
        self._handed_over = 0  # store calls given to the storage thread and not yet answered
        self._runner = web.AppRunner(
            self._build_app(),
            access_log=None,
            handle_signals=False,
            shutdown_timeout=SHUTDOWN_SECONDS,
        )
        self._site: web.TCPSite | None = None
        self._reopen: asyncio.TimerHandle | None = None
        self._held: socket.socket | None = None  # the port, bound but not listening, while refusing
        self._background: set[asyncio.Task[None]] = set()
        self._closing = asyncio.Event()

    @property
    def base_url(self) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self._port}"

    # -- lifecycle (on the loop) ------------------------------------------------------------

    async def start(self) -> None:
        await self._runner.setup()
        await self._listen()

    async def _listen(self) -> None:
        site = web.TCPSite(self._runner, self._host, self._port, reuse_address=True)
        await site.start()
        self._site = site
        self._port = self._runner.addresses[0][1]  # the real port when 0 was asked

    async def refuse(self, seconds: float, *, asked_by: web.BaseRequest | None = None) -> None:
        """Close the listening socket and every connection; listen again after `seconds`.

        Everything is closed before this returns, except the connection of `asked_by` (a control
        request), which closes once its answer is written.
        """
        if self._site is not None:
            await self._site.stop()
            self._site = None
            self._hold_port()
        if self._reopen is not None:
            self._reopen.cancel()
        self._reopen = asyncio.get_running_loop().call_later(seconds, self._reopen_now)
        connections = self._runner.server.connections if self._runner.server else []
        for conn in connections:
            conn.close()  # wakes idle keep-alive connections, as aiohttp's own shutdown does
        asker = asked_by.protocol if asked_by is not None else None
        await asyncio.gather(
            *(conn.shutdown(DROP_SECONDS) for conn in connections if conn is not asker)
        )

    def _hold_port(self) -> None:
        """Keep the port bound, not listening, while refusing: connections to it are refused,
        and the kernel gives it to no one else (neither another server asking for port 0 nor an
        outgoing connection), so the platform can listen on it again."""
        held = socket.socket(socket.AF_INET6 if ":" in self._host else socket.AF_INET)
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            held.bind((self._host, self._port))
        except OSError:
            held.close()  # taken in the instant between: _listen_again says so
            return
        self._held = held

    def _release_port(self) -> None:
        if self._held is not None:
            self._held.close()
            self._held = None

    def _reopen_now(self) -> None:
        self._reopen = None
        self._release_port()
        task = asyncio.ensure_future(self._listen_again())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _listen_again(self) -> None:
        try:
            await self._listen()
        except OSError as exc:  # someone took the port meanwhile: say so, stay down
            get_logger().error(
                "local platform cannot listen again", url=self.base_url, error=str(exc)
            )

    async def stop(self) -> None:
        self._closing.set()
        if self._reopen is not None:
            self._reopen.cancel()
        self._release_port()
        await self._runner.cleanup()
        self._db.shutdown(wait=True)

    # -- the application --------------------------------------------------------------------

    def _build_app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth])
        api, route = "/api/v1", app.router
        route.add_post(f"{api}/environmentshub/resolve", self._api("resolve", self._resolve))
        for path in (f"{api}/evaluations/", f"{api}/evaluations"):
            route.add_post(path, self._api("create", self._create))
            route.add_get(path, self._api("read", self._list_evaluations, listing=True))
        route.add_get(f"{api}/evaluations/{{id}}", self._api("read", self._get))
        route.add_put(f"{api}/evaluations/{{id}}", self._api("close", self._close_out))
        route.add_post(
            f"{api}/evaluations/{{id}}/samples", self._api("samples", self._push_samples)
        )
        route.add_get(
            f"{api}/evaluations/{{id}}/samples",
            self._api("read", self._list_samples, listing=True),
        )
        route.add_post(f"{api}/evaluations/{{id}}/finalize", self._api("finalize", self._finalize))
        add_dashboard_routes(route, self.store, self._in_db)
        route.add_post("/_control/faults", self._answering(self._control_inject))
        route.add_get("/_control/faults", self._answering(self._control_faults))
        route.add_delete("/_control/faults", self._answering(self._control_clear))
        route.add_get("/_control/summary", self._answering(self._control_summary))
        route.add_get("/_control/evaluations/{id}/samples", self._answering(self._control_samples))
        return app

    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self._api_key is not None and request.path.startswith(("/api/", "/_control/")):
            given = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(given, f"Bearer {self._api_key}".encode()):
                return _error(401, "missing or wrong bearer API key")
        return await handler(request)

    def _answering(self, work: Callable[[web.Request], Awaitable[Any]]) -> Handler:
        """A handler answering `work`'s result as JSON, or its `Refusal` as an error."""

        async def handler(request: web.Request) -> web.StreamResponse:
            try:
                result = await work(request)
            except Refusal as refusal:
                return _error(refusal.status, refusal.detail)
            return result if isinstance(result, web.StreamResponse) else _json(result)

        return handler

    def _api(
        self, kind: str, work: Callable[[web.Request], Awaitable[Any]], *, listing: bool = False
    ) -> Handler:
        """An API handler: counted by kind, and subject to the faults pending for that kind."""
        answer = self._answering(work)

        async def handler(request: web.Request) -> web.StreamResponse:
            self.request_counts[kind] += 1
            fault = self.faults.take(kind, listing=listing)
            return (
                await answer(request)
                if fault is None
                else await self._with_fault(fault, request, answer)
            )

        return handler

    async def _with_fault(
        self, fault: Fault, request: web.Request, answer: Handler
    ) -> web.StreamResponse:
        if fault.fault == "status" and not fault.do_work:
            return self._fault_status(fault)
        if fault.fault == "echo_key":
            return self._echo_key(fault, request)
        if fault.fault == "unread":
            return await self._unread(fault, request)
        if fault.fault == "endless" and not fault.do_work:
            return await self._endless(request, fault.status)
        if fault.fault in ("repeat_page", "endless_pages"):
            return await self._answering(self._hostile_page(fault))(request)
        if fault.fault == "gzip_bomb" and not fault.do_work:
            return await self._bomb(fault)
        if fault.fault == "late":
            return await self._late(fault, request, answer)
        response = await answer(request)
        if fault.fault == "gzip_bomb":
            return await self._bomb(fault)
        if fault.fault == "status":
            return self._fault_status(fault)
        if fault.fault == "reset":
            if request.transport is not None:
                request.transport.abort()  # the work is done; the client never hears of it
            return response
        if fault.fault == "stall":
            await self._hold(fault.seconds)
            return response
        if fault.fault == "endless":
            return await self._endless(request, 200)
        if fault.fault == "trickle":
            return await self._trickle(fault, request, response)
        if fault.fault == "bad_id":
            return self._bad_id(fault, response)
        if fault.fault == "twice":
            return self._twice(fault, request, response)
        return web.Response(status=200, body=MALFORMED_BODY, content_type="text/html")

    @staticmethod
    async def _bomb(fault: Fault) -> web.Response:
        body = await asyncio.get_running_loop().run_in_executor(None, bomb, fault.encoding)
        return web.Response(
            status=fault.status,
            body=body,
            headers={"Content-Type": "application/json", "Content-Encoding": fault.encoding},
        )

    async def _hold(self, seconds: float) -> None:
        """Wait `seconds`, or until the server stops."""
        try:
            await asyncio.wait_for(self._closing.wait(), timeout=seconds)
        except TimeoutError:
            pass

    async def _endless(self, request: web.Request, status: int) -> web.StreamResponse:
        response = web.StreamResponse(status=status, headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        try:
            while not self._closing.is_set():
                await response.write(ENDLESS_CHUNK)
        except (ConnectionError, RuntimeError):
            pass  # the client went away (aiohttp says so either way)
        return response

    async def _trickle(
        self, fault: Fault, request: web.Request, answer: web.StreamResponse
    ) -> web.StreamResponse:
        body = answer.body if isinstance(answer, web.Response) else b""
        assert isinstance(body, bytes)
        response = web.StreamResponse(
            status=answer.status,
            headers={"Content-Type": "application/json", "Content-Length": str(len(body))},
        )
        await response.prepare(request)
        try:
            for i in range(len(body)):
                await response.write(body[i : i + 1])
                await self._hold(fault.seconds)
                if self._closing.is_set():
                    break
        except (ConnectionError, RuntimeError):
            pass
        return response

    def _twice(
        self, fault: Fault, request: web.Request, response: web.StreamResponse
    ) -> web.StreamResponse:
        """`response`, and `fault.seconds` later the same answer written again, as raw bytes on
        the connection, whatever it carries by then."""
        transport = request.transport
        if transport is None or not isinstance(response, web.Response):
            return response
        body = response.body if isinstance(response.body, bytes) else b""
        head = f"HTTP/1.1 {response.status} {response.reason}\r\n"
        head += f"Content-Type: {response.content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
        copy = head.encode("latin-1") + body

        def write_again() -> None:
            if not transport.is_closing():
                transport.write(copy)

        asyncio.get_running_loop().call_later(fault.seconds, write_again)
        return response

    async def _late(
        self, fault: Fault, request: web.Request, answer: Handler
    ) -> web.StreamResponse:
        """The work done `fault.seconds` after the request came in, on a task of its own (the
        client may be gone by then); no answer, the connection dropped once it is done."""
        try:
            request[_BODY_READ] = await _read_body(request)  # all here, kept for the work
        except Refusal as refusal:
            return _error(refusal.status, refusal.detail)
        landed = asyncio.Event()

        async def land() -> None:
            await self._hold(fault.seconds)
            try:
                if not self._closing.is_set():
                    await answer(request)
            finally:
                landed.set()

        task = asyncio.get_running_loop().create_task(land())
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        await landed.wait()
        if request.transport is not None:
            request.transport.abort()
        return web.Response(status=503)

    async def _unread(self, fault: Fault, request: web.Request) -> web.StreamResponse:
        await self._hold(fault.seconds)
        if request.transport is not None:
            request.transport.abort()
        return web.Response(status=503)

    @staticmethod
    def _echo_key(fault: Fault, request: web.Request) -> web.Response:
        sent = request.headers.get("Authorization", "")
        detail = f"refused: you sent Authorization: {sent!r} ({sent})"
        return _json({"detail": detail, "headers": {"authorization": sent}}, fault.status)

    @staticmethod
    def _bad_id(fault: Fault, response: web.StreamResponse) -> web.StreamResponse:
        if not isinstance(response, web.Response) or response.status >= 300:
            return response
        assert isinstance(response.body, bytes)
        data = msgspec.json.decode(response.body)
        if "evaluation_id" in data:  # a create answer
            data.update(evaluation_id=fault.value, viewer_url=BAD_VIEWER_URL)
        elif isinstance(data.get("data"), dict):  # a resolve answer
            data["data"]["id"] = fault.value
        return _json(data, response.status)

    def _hostile_page(self, fault: Fault) -> Callable[[web.Request], Awaitable[Any]]:
        async def page(request: web.Request) -> Any:
            limit = _query_int(request, "limit", 50, 1, MAX_PAGE_LIMIT)
            evaluation_id = request.match_info.get("id")
            if fault.fault == "repeat_page":
                if evaluation_id is not None:
                    first = await self._in_db(self.store.list_samples, evaluation_id, 1, limit)
                    return {"samples": first["samples"]}
                first = await self._in_db(
                    self.store.list_evaluations, request.query.get("environment_name"), 0, limit
                )
                return {"evaluations": [self._viewer(e) for e in first["evaluations"]]}
            start = _query_int(request, "skip", 0, 0, 1 << 31) + 1000 * _query_int(
                request, "page", 1, 1, 1 << 31
            )
            made_up = [f"phantom_{start + i}" for i in range(limit)]
            if evaluation_id is not None:
                return {"samples": [{"sample_id": i} for i in made_up]}
            return {"evaluations": [{"id": i, "metadata": {}} for i in made_up]}

        return page

    @staticmethod
    def _fault_status(fault: Fault) -> web.Response:
        headers = {"Retry-After": fault.retry_after} if fault.retry_after is not None else None
        return _error(fault.status, f"injected fault: HTTP {fault.status}", headers)

    async def _in_db(self, fn: Callable[..., Any], *args: Any, small: bool = False) -> Any:
        """`fn(*args)`, a call of the store, on the storage thread, so the loop goes on answering
        while a batch of samples is stored or a page is listed. A `small` call (one row, a small
        body) runs here on the loop instead when no call is with the storage thread: handing it
        over cost more than the call (a quarter of the platform's CPU on one-trace runs). The
        store's own lock keeps the two apart whatever this count says."""
        if small and not self._handed_over:
            return fn(*args)
        self._handed_over += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._db, fn, *args)
        finally:
            self._handed_over -= 1

    async def _body_then(self, request: web.Request, fn: Callable[..., Any], *args: Any) -> Any:
        """Read the body, then parse it and call `fn(*args, body)` on the store (`_in_db`)."""
        raw = await _read_body(request)
        small = len(raw) <= SMALL_BODY_BYTES
        return await self._in_db(lambda: fn(*args, decode_json(raw)), small=small)

    def _viewer(self, evaluation: dict[str, Any]) -> dict[str, Any]:
        return {
            **evaluation,
            "viewer_url": f"{self.base_url}/dashboard/evaluations/{evaluation['id']}",
        }

    # -- API work ---------------------------------------------------------------------------

    async def _resolve(self, request: web.Request) -> Any:
        return {"data": await self._body_then(request, self.store.resolve)}

    async def _create(self, request: web.Request) -> Any:
        evaluation = self._viewer(await self._body_then(request, self.store.create))
        return {
            "evaluation_id": evaluation["id"],
            "viewer_url": evaluation["viewer_url"],
            "status": evaluation["status"],
        }

    async def _push_samples(self, request: web.Request) -> Any:
        # The body goes to the store as bytes: it checks and splits it without decoding samples.
        body = await _read_body(request)
        return await self._in_db(
            self.store.add_samples,
            request.match_info["id"],
            body,
            small=len(body) <= SMALL_BODY_BYTES,
        )

    async def _finalize(self, request: web.Request) -> Any:
        evaluation = self._viewer(
            await self._body_then(request, self.store.finalize, request.match_info["id"])
        )
        return {
            "evaluation_id": evaluation["id"],
            "status": evaluation["status"],
            "viewer_url": evaluation["viewer_url"],
        }

    async def _close_out(self, request: web.Request) -> Any:
        return self._viewer(
            await self._body_then(request, self.store.close_out, request.match_info["id"])
        )

    async def _get(self, request: web.Request) -> Any:
        return self._viewer(await self._in_db(self.store.get, request.match_info["id"], small=True))

    async def _list_samples(self, request: web.Request) -> Any:
        page = _query_int(request, "page", 1, 1, 1 << 31)
        limit = _query_int(request, "limit", 100, 1, MAX_PAGE_LIMIT)
        return await self._in_db(self.store.list_samples, request.match_info["id"], page, limit)

    async def _list_evaluations(self, request: web.Request) -> Any:
        skip = _query_int(request, "skip", 0, 0, 1 << 31)
        limit = _query_int(request, "limit", 50, 1, MAX_PAGE_LIMIT)
        page = await self._in_db(
            self.store.list_evaluations, request.query.get("environment_name"), skip, limit
        )
        return {**page, "evaluations": [self._viewer(e) for e in page["evaluations"]]}

    # -- control ----------------------------------------------------------------------------

    async def inject(self, fault: Fault, *, asked_by: web.BaseRequest | None = None) -> None:
        if fault.fault == "refuse":
            await self.refuse(fault.seconds, asked_by=asked_by)
        else:
            self.faults.add(fault)

    async def _control_inject(self, request: web.Request) -> Any:
        try:
            fault = Fault.from_json(decode_json(await _read_body(request)))
        except (ValueError, TypeError) as exc:
            raise Refusal(422, str(exc)) from None
        await self.inject(fault, asked_by=request)
        response = _json({"injected": fault.to_json()})
        if fault.fault == "refuse":
            response.force_close()  # says `Connection: close`, so no client reuses it
        return response

    async def _control_faults(self, request: web.Request) -> Any:
        return {"pending": self.faults.pending()}

    async def _control_clear(self, request: web.Request) -> Any:
        self.faults.clear()
        return {"pending": []}

    def summary(self) -> dict[str, Any]:
        return {**self.store.summary(), "requests": dict(self.request_counts)}

    async def _control_summary(self, request: web.Request) -> Any:
        return await self._in_db(self.summary)

    async def _control_samples(self, request: web.Request) -> Any:
        evaluation_id = request.match_info["id"]
        await self._in_db(self.store.get, evaluation_id)  # 404 for an unknown evaluation
        return {"samples": await self._in_db(self.store.raw_samples, evaluation_id)}
