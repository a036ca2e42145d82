"""The local platform: a stand-in for the platform's evaluations API, over real HTTP.

`evalpush local-platform` serves it (`serve`); tests start one in a background thread
(`LocalPlatform`). It speaks every endpoint of docs/PLATFORM_API.md, keeps what it is sent (in memory,
or in a SQLite file with `db`), enforces bearer auth (when a key is set) and the 25 MiB body
limit, stores duplicate samples as duplicates, and injects faults on command.

Endpoints (under `/api/v1`; errors answer `{"detail": "..."}`):

| request | answer |
| --- | --- |
| `POST /environmentshub/resolve` `{"name", "team_id"?}` | `{"data": {"id", "name"}}`, get-or-create by name |
| `POST /evaluations/` (create body) | `{"evaluation_id", "viewer_url", "status": "RUNNING"}`; 422 without name or a known environment id |
| `POST /evaluations/{id}/samples` `{"samples": [...]}` | `{"accepted", "sample_count"}`; each sample needs a `sample_id`; 409 once closed; 413 over 25 MiB; 422 malformed |
| `POST /evaluations/{id}/finalize` `{"metrics"?}` | `{"evaluation_id", "status": "COMPLETED", "viewer_url"}`; 409 when already finalized or closed |
| `GET /evaluations/{id}` | the evaluation: `id`, `evaluation_id`, `name`, `status`, `environment_ids`, `environment_name`, `environment_names`, `is_hosted` (false), the create body's other keys (`model_name`, `dataset`, `framework`, `tags`, `team_id`...), `metadata`, `metrics`, `error_message`, `sample_count` and `total_samples` (duplicates included), `created_at`, `updated_at`, `viewer_url` |
| `GET /evaluations/{id}/samples?page=1&limit=100` | `{"samples": [...], "page", "limit", "total", "total_pages", "has_more"}`, 1-based pages, arrival order |
| `GET /evaluations/?environment_name=&skip=0&limit=50` | `{"evaluations": [evaluation, ...], "total", "skip", "limit"}`, creation order |
| `PUT /evaluations/{id}` `{"status": "FAILED"/"CANCELLED", "error_message"?, "metadata"?, "metrics"?}` | the evaluation; 409 when already closed |

A samples body must be UTF-8 JSON shaped `{"samples": [...]}` (other keys ignored), each sample
an object whose `sample_id` is a string or a number; otherwise 422 and nothing of the batch is
stored. A numeric id counts as its text (`1` and `"1"` are one id in `distinct_sample_ids`).
Samples are stored, and listed, as the bytes they were sent as, not decoded and encoded again:
whitespace, key order, duplicate keys and number spelling (`1.50`) stay as sent. One thing a
full decode would refuse is taken: a number beyond a float's range (`1e400`) in a sample, other
than its `sample_id`, is stored as sent (`LocalPlatform.samples` cannot decode that sample).

The `prime` CLI reads these answers as it reads the platform's: `prime eval list` shows
`environment_names[0]` and `is_hosted` (its Environment and Type columns), prime_evals' models
declare `total_samples` and `has_more` (tests/test_prime_cli.py runs the real CLI against it).

Viewer pages (HTML, see `_dashboard`). They ask for no key, as a browser sends none: whoever
reaches the port reads every sample, so serve on loopback unless that is meant.

| page | shows |
| --- | --- |
| `GET /dashboard/evaluations?page=1` | every evaluation, newest first, 50 a page: name, environment, model, status, sample count, mean reward of its stored samples, created |
| `GET /dashboard/evaluations/{id}?page=1` | the page the viewer URLs lead to: name, model, environment, status, metrics, metadata, a histogram of every stored sample's reward, and the samples 100 a page, each with its completion as a transcript that opens on click (`#sample-N` opens sample N's); one still RUNNING (a run followed while it is written) says how many samples it holds so far and reloads itself every 5 s |
| `GET /`, `/dashboard` | a redirect to the list |

Control (same bearer auth), for tests and for trying the daemon against bad weather:

| request | effect |
| --- | --- |
| `POST /_control/faults` `{"fault", "on"?, "count"?, "status"?, "retry_after"?, "seconds"?, "do_work"?, "value"?, "encoding"?}` | queue a fault (see `Fault` and the table below); `refuse` acts at once |
| `GET /_control/faults` / `DELETE /_control/faults` | list / drop the pending faults |
| `GET /_control/summary` | `{"evaluations": {id: {"name", "environment", "status", "metadata", "metrics", "sample_count", "distinct_sample_ids", "duplicates", "finalize_count"}}, "runs": {run_id: evaluations}, "requests": {kind: count}}`; `finalize_count` counts finalize requests received, refused ones included |
| `GET /_control/evaluations/{id}/samples` | `{"samples": [...]}`: every stored sample, duplicates included |

Request kinds (for `on` and `requests`): resolve, create, samples, finalize, read (any GET
under /api/v1), close (the PUT).

Faults (each hits the next `count` requests of kind `on`; `refuse` is not tied to a request):

| fault | what the client sees | the work |
| --- | --- | --- |
| `status` | HTTP `status` (with `Retry-After: retry_after` if given) | done only with `do_work` |
| `reset` | the connection aborted, no answer | done |
| `stall` | no answer for `seconds` (a server that accepts and never answers), then the answer | done |
| `malformed` | 200 with an HTML body | done |
| `refuse` | connections refused for `seconds`, open ones closed | - |
| `endless` | a chunked body of JSON whitespace that never ends, 1 MiB after 1 MiB: 200 with `do_work`, else HTTP `status` | done only with `do_work` |
| `trickle` | the answer, one byte every `seconds` seconds | done |
| `unread` | nothing: the request body is never read (a big upload blocks), then after `seconds` the connection is dropped | not done |
| `late` | nothing: the request is read whole and never answered; `seconds` later the work is done (whatever became of the client) and the connection dropped | done, `seconds` late |
| `echo_key` | HTTP `status` whose body quotes the Authorization header, raw and escaped | not done |
| `bad_id` | a create (or resolve) answer whose id is `value` (default `../../../environmentshub/resolve?x=`) and whose viewer URL is `javascript:` | done |
| `twice` | the answer, then `seconds` later the same answer again on the connection (read by the next request on it if that went out first) | done |
| `repeat_page` | a listing's first page, whatever page or skip was asked, with no paging field (`page`, `skip`, `total`...) | - |
| `endless_pages` | a listing page full of made-up items, no total, no end | - |
| `gzip_bomb` | HTTP `status` with `Content-Encoding: encoding` (`gzip`, or stacked `gzip, gzip`) and a body inflating to 4 GiB of zeros (about 4 MiB, or 10 KB stacked) | done only with `do_work` |

`repeat_page` and `endless_pages` hit listings only (`GET .../samples`, `GET /evaluations/`);
other reads pass them by.
"""

from __future__ import annotations

import asyncio
import secrets
import signal
import threading
from pathlib import Path
from typing import Any, Self

from evalpush.core.errors import ConfigError
from evalpush.local_platform._faults import REQUEST_KINDS, Fault
from evalpush.local_platform._server import MAX_BODY_BYTES, PlatformServer
from evalpush.local_platform._store import Store
from evalpush.log import get_logger

__all__ = ["MAX_BODY_BYTES", "REQUEST_KINDS", "Fault", "LocalPlatform", "serve"]

START_TIMEOUT_SECONDS = 10.0


class LocalPlatform:
    """A local platform on its own event-loop thread, for tests and the demo.

    `LocalPlatform().start()` listens on an ephemeral loopback port with a fresh random key
    (`api_key=None, require_auth=False` accepts any key); use it as a context manager or call
    `stop()`, which ends its threads.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
        require_auth: bool = True,
        db: Path | None = None,
    ) -> None:
        self.api_key = api_key or (secrets.token_urlsafe(24) if require_auth else None)
        self._host, self._port, self._db = host, port, db
        self._store: Store | None = None
        self._server: PlatformServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None

    @property
    def base_url(self) -> str:
        return self._running_server().base_url

    def start(self) -> LocalPlatform:
        self._thread = threading.Thread(target=self._run, name="evalpush-local-platform")
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_SECONDS):
            raise RuntimeError("the local platform did not start in time")
        if self._failure is not None:
            self._thread.join()
            raise self._failure
        return self

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # noqa: BLE001 - handed to start(), raised in the caller
            self._failure = exc
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self._store = Store(self._db)
        try:
            self._server = PlatformServer(
                self._store, host=self._host, port=self._port, api_key=self.api_key
            )
            try:
                await self._server.start()
                self._ready.set()
                await self._stopping.wait()
            finally:
                await self._server.stop()
        finally:
            self._store.close()

    def stop(self) -> None:
        """Stop serving and join the thread; idempotent."""
        if self._thread is None:
            return
        if self._loop is not None and self._stopping is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join()
        self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _running_server(self) -> PlatformServer:
        if self._server is None or self._thread is None:
            raise RuntimeError("the local platform is not running")
        return self._server

    def inject(
        self,
        fault: str,
        *,
        on: str = "any",
        count: int = 1,
        status: int = 503,
        retry_after: str | None = None,
        seconds: float = 30.0,
        do_work: bool = False,
        value: str | None = None,
        encoding: str = "gzip",
    ) -> None:
        """Queue a fault (see `Fault`); `refuse` takes effect before this returns."""
        spec = Fault(
            fault,
            on=on,
            count=count,
            status=status,
            retry_after=retry_after,
            seconds=seconds,
            do_work=do_work,
            encoding=encoding,
            **({} if value is None else {"value": value}),
        )
        server = self._running_server()
        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(server.inject(spec), self._loop).result(
            START_TIMEOUT_SECONDS
        )

    def clear_faults(self) -> None:
        self._running_server().faults.clear()

    def pending_faults(self) -> list[dict[str, Any]]:
        """The faults not used up yet (what `GET /_control/faults` answers)."""
        return self._running_server().faults.pending()

    def summary(self) -> dict[str, Any]:
        """What `GET /_control/summary` answers."""
        return self._running_server().summary()

    def samples(self, evaluation_id: str) -> list[dict[str, Any]]:
        """Every stored sample of an evaluation, duplicates included, in arrival order."""
        self._running_server()
        assert self._store is not None
        return self._store.samples(evaluation_id)


def serve(
    *, host: str = "127.0.0.1", port: int = 8700, api_key: str | None = None, db: Path | None = None
) -> None:
    """Serve the local platform until SIGTERM or SIGINT (what `evalpush local-platform` runs)."""
    asyncio.run(_serve(host, port, api_key, db))


async def _serve(host: str, port: int, api_key: str | None, db: Path | None) -> None:
    log = get_logger()
    store = Store(db)
    server = PlatformServer(store, host=host, port=port, api_key=api_key)
    try:
        try:
            await server.start()
        except OSError as exc:
            raise ConfigError(
                f"local platform: cannot listen on {host}:{port}: {exc.strerror}"
            ) from None
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        log.info(
            "local platform serving",
            url=server.base_url,
            auth="bearer key required" if api_key else "any key accepted",
            storage=str(db) if db else "memory",
        )
        await stop.wait()
        log.info("local platform stopping")
    finally:
        await server.stop()
        store.close()
