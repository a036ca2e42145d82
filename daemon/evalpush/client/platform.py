"""The platform stage: one synchronous client for the evaluations API, over the credentials
`evalpush.client.credentials` finds.

What it promises:
- Every endpoint method makes exactly ONE attempt and raises the class `evalpush.core.errors` gives
  the outcome; retrying is `evalpush.client.retry`'s job. A 2xx whose body cannot be read is
  `Ambiguous` for the steps that must not be replayed (create, push samples, finalize) and
  `Transient` for the rest.
- Answers are data, never trusted: every body is read as a stream under a byte cap (an error
  body's first `ERROR_BODY_BYTES`; a JSON answer `MAX_ANSWER_BYTES`; a listing page
  `MAX_PAGE_BYTES`, the page shrunk when one does not fit), and a body past its cap is a
  malformed answer. Ids are taken as the platform gives them: the environment id (only ever
  in JSON bodies) whatever it is; an evaluation id percent-encoded as one path segment, and
  refused only where no encoding keeps it one (`is_platform_id`). Only http(s) viewer URLs
  are kept. A listing ends on its own
  hints, and is a malformed answer (`Transient`) when a page repeats the previous one, when it
  holds more items than the caller's bound, or past `MAX_PAGES`.
- Every request ends by `platform.request_deadline_seconds`, and within a fraction of a second
  of the stop event being set (`evalpush.client.wire`); a request cut off by a stop raises
  `Interrupted` (its outcome unknown: the upload protocol reconciles it on the next start).
- HTTP is httpx's (`evalpush.client.wire`): redirects are not followed; every request goes on a
  connection of its own, closed after its answer (`Connection: close`). HTTP/1.1 pairs an
  answer with a request only by their order on a connection: an answer a server (or a proxy)
  sends twice on a kept-alive connection shifts every later answer on it by one request, and
  no check at reuse sees a copy that arrives after the next request went out. Shifted, a
  refused batch or finalize was taken for done, an old listing of samples for a new one (a
  batch stored twice), one environment's id for another's; reads decide writes, so reads go
  alone too.
- One `PlatformClient` is safe to share between threads: httpx's clients and their pools are,
  and the credentials are swapped as one immutable object.
"""

from __future__ import annotations

import functools
import math
import threading
import urllib.parse
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Self

import httpx
import msgspec

from evalpush.client.credentials import (
    USERINFO,
    Credentials,
    clean_text,
    http_url,
)
from evalpush.client.exchange import (
    Answer,
    Exchange,
    RequestObserver,
    TooLarge,
    decode,
    unexpected,
)
from evalpush.config import PlatformConfig
from evalpush.core import errors
from evalpush.log import holds_secret

__all__ = [
    "Evaluation",
    "PlatformClient",
    "is_closed",
    "is_finalized",
    "is_platform_id",
    "most_samples_stored",
]

SAMPLES_PAGE_SIZE = 500
EVALUATIONS_PAGE_SIZE = 100
_FINALIZED_STATUSES = frozenset(
    {"COMPLETED", "COMPLETE", "FINALIZED", "DONE", "FINISHED", "SUCCEEDED"}
)
_CLOSED_STATUSES = frozenset({"FAILED", "CANCELLED", "CANCELED", "ERROR", "ERRORED", "ABORTED"})
"""Statuses of an evaluation closed out without being finalized: it takes no more samples."""

MIB = 1024 * 1024
MAX_PAGE_BYTES = 32 * MIB
"""A listing page carries whole samples (each up to the platform's 25 MiB body limit) or whole
evaluations: a page past this is asked again with fewer items, down to one; one item past it
is malformed. Bounds the memory of a reconciling read, one page at a time."""
MAX_PAGES = 20_000
"""No listing reads more pages than this (10 million samples at the default page size)."""
MAX_EVALUATIONS_LISTED = 100_000
"""An environment listing holding more evaluations than this is read as never ending."""
MAX_ID_CHARS = 1024
"""An evaluation id longer than this is not put into a URL: no platform hands one out."""
_DOT_SEGMENTS = frozenset({".", ".."})
_URL_CHARS = 2048


def _status(evaluation: Mapping[str, Any]) -> tuple[Mapping[str, Any], str]:
    """The evaluation's own fields (unwrapped from `data`) and its status, upper case."""
    if isinstance(evaluation.get("data"), Mapping) and "status" not in evaluation:
        evaluation = evaluation["data"]
    status = evaluation.get("status")
    return evaluation, status.strip().upper() if isinstance(status, str) else ""


def is_finalized(evaluation: Mapping[str, Any]) -> bool:
    """Whether an evaluation as read from the platform is finalized, whatever its spelling."""
    evaluation, status = _status(evaluation)
    if evaluation.get("finalized") is True or evaluation.get("is_finalized") is True:
        return True
    return status in _FINALIZED_STATUSES


def is_closed(evaluation: Mapping[str, Any]) -> bool:
    """Whether an evaluation takes no more samples: finalized, or closed out (failed,
    cancelled)."""
    return is_finalized(evaluation) or _status(evaluation)[1] in _CLOSED_STATUSES


MAX_SAMPLE_COUNT = 2**63 - 1
"""The largest sample count taken from an answer (SQLite's integer); a larger one is no count."""


class Evaluation(msgspec.Struct, frozen=True):
    """What the upload reads of an evaluation the platform holds (from `get_evaluation` or a
    listing), whatever the answer's spelling: its id, whether it is finalized, the run it
    belongs to (`metadata.run_id`), what it says it is (name, environment, model), how many
    samples it holds, and its viewer URL (http(s) only)."""

    id: str
    finalized: bool
    closed: bool = False  # finalized, or closed out (failed, cancelled): takes no more samples
    run_id: str | None = None
    sample_count: int | None = None
    viewer_url: str | None = None
    name: str | None = None
    environment: str | None = None  # environment_name, environment_names[0], or dataset
    model: str | None = None  # model_name

    @property
    def usable(self) -> bool:
        """Whether its id is one evalpush may put into a URL (`is_platform_id`): a listed
        evaluation without such an id (another tool's, a legacy one) is never adopted."""
        return is_platform_id(self.id)

    @classmethod
    def from_answer(cls, data: Mapping[str, Any], *, id: str | None = None) -> Evaluation:
        """`data` as read; `id` where the answer need not carry it (a read by id)."""
        metadata = data.get("metadata")
        run_id = metadata.get("run_id") if isinstance(metadata, Mapping) else None
        count = _int(data, "sample_count")
        return cls(
            id=_first_id(data, ("evaluation_id", "id")) or id or "",
            finalized=is_finalized(data),
            closed=is_closed(data),
            run_id=run_id if isinstance(run_id, str) else None,
            sample_count=count if count is not None and 0 <= count <= MAX_SAMPLE_COUNT else None,
            viewer_url=_viewer_url_in(data),
            name=_text(data.get("name")),
            environment=_environment_of(data),
            model=_text(data.get("model_name")),
        )


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _environment_of(data: Mapping[str, Any]) -> str | None:
    """The environment an evaluation names, in whichever spelling the answer has."""
    names = data.get("environment_names")
    first = names[0] if isinstance(names, list) and names else None
    for value in (data.get("environment_name"), first, data.get("dataset")):
        if isinstance(value, str):
            return value
    return None


def most_samples_stored(samples_in_run: int) -> int:
    """The most sample ids a run's evaluation can hold: every sample twice (a duplicate
    pushed by someone else) plus a page. A listing past this is one that never ends."""
    return 2 * samples_in_run + SAMPLES_PAGE_SIZE


def is_platform_id(value: str) -> bool:
    """Whether `value` can be put into a URL path as one segment (percent-encoded: a `/`, `?`,
    a space, anything not ASCII stays inside it): anything but empty, `.` and `..` (which no
    encoding keeps one segment), at most `MAX_ID_CHARS` characters, and nothing of the API key
    in it."""
    return 0 < len(value) <= MAX_ID_CHARS and value not in _DOT_SEGMENTS and not holds_secret(value)


def _id_value(value: Any) -> str | None:
    """An id as the platform wrote it: a string exactly as it is (never stripped: ids are
    compared with what was sent, spaces and all) or an integer; anything else is no id."""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


def _first_id(data: Any, keys: tuple[str, ...]) -> str | None:
    """The id under the first of `keys` present, at the top level or under `data`."""
    for holder in (data, data.get("data") if isinstance(data, dict) else None):
        if isinstance(holder, dict):
            for key in keys:
                found = _id_value(holder.get(key))
                if found:
                    return found
    return None


def _safe_url(value: Any) -> str | None:
    """`value` if it is an http(s) URL fit to print and store (no `user:password@` in it, no
    secret), else None."""
    text = clean_text(value)
    if text is None or not _url_shape(text):
        return None
    return None if holds_secret(text) else text


@functools.lru_cache(maxsize=64)
def _url_shape(text: str) -> bool:
    """Whether `text` is an http(s) URL with no `user:password@`, printable, of sane length.
    Kept per text (a run's viewer URL comes back in 3 answers); the secret check is not: a key
    may be registered later."""
    if len(text) > _URL_CHARS or not text.isprintable() or " " in text:
        return False
    try:
        http_url(text)
    except ValueError:
        return False
    return USERINFO.match(text) is None


def _viewer_url_in(data: Any) -> str | None:
    if isinstance(data, dict):
        return _safe_url(data.get("viewer_url")) or _viewer_url_in(data.get("data"))
    return None


def _segment(value: str, what: str, *, any_length: bool = False) -> str:
    """`value` as one percent-encoded path segment; a value that cannot be one is never sent.
    `any_length`: one over `MAX_ID_CHARS` is sent too (to close out the evaluation it names)."""
    if any_length and len(value) > MAX_ID_CHARS:
        value_ok = value not in _DOT_SEGMENTS and not holds_secret(value)
    else:
        value_ok = is_platform_id(value)
    if not value_ok:
        raise errors.Unsendable(
            f"{what}: {value[:40]!r} is not a platform id (empty, a dot segment, over "
            f"{MAX_ID_CHARS} characters, or holding the key); not sent"
        )
    return urllib.parse.quote(value, safe="")


def _unwrapped(data: Any) -> Any:
    """An answer's object, taken out of a `data` wrapper when it has one."""
    if isinstance(data, dict) and isinstance(data.get("data"), dict) and "status" not in data:
        return data["data"]
    return data


def _environment_ids(body: Mapping[str, Any]) -> set[str]:
    """The environment ids a create body names."""
    environments = body.get("environments")
    if not isinstance(environments, list):
        return set()
    return {
        found
        for item in environments
        if isinstance(item, Mapping) and (found := _id_value(item.get("id"))) is not None
    }


def _page_items(data: Any, keys: tuple[str, ...]) -> list[Any] | None:
    """The items of a page that is either a list or an object holding the list under a key."""
    if isinstance(data, list):
        return data
    if isinstance(data, dict):
        for key in keys:
            if isinstance(data.get(key), list):
                return data[key]
    return None


def _int(data: Any, *keys: str) -> int | None:
    if isinstance(data, dict):
        for key in keys:
            value = data.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    return None


def _is_last_page(data: Any, *, page: int | None, seen: int) -> bool:
    """Whether a page's own hints (has_more, total_pages, total) say nothing follows it.

    Without hints only an empty page ends the listing: a server may cap `limit` below what was
    asked, so a short page does not prove the end, and a missed sample id would be sent twice.
    """
    if isinstance(data, dict) and data.get("has_more") is False:
        return True
    total_pages = _int(data, "total_pages", "pages")
    if total_pages is not None and page is not None and page >= total_pages:
        return True
    total = _int(data, "total", "total_count", "count")
    return total is not None and seen >= total


def _smaller_page(limit: int, seen: int) -> int:
    """A smaller page size after a page ran past its cap: a proper divisor of `limit` that
    also divides `seen`, so the next page starts exactly where the last one ended."""
    smaller = 1
    for factor in range(2, int(limit**0.5) + 1):
        if limit % factor == 0:
            smaller = limit // factor
            break
    return math.gcd(seen, smaller)


class _Listing:
    """The guards every paged listing runs under: page count, item bound, repeated pages."""

    def __init__(self, what: str, max_items: int | None) -> None:
        self.what = what
        self.max_items = max_items
        self.pages = 0
        self.seen = 0
        self._previous: list[Any] | None = None

    def asking(self) -> None:
        self.pages += 1
        if self.pages > MAX_PAGES:
            raise errors.Transient(
                f"{self.what}: more than {MAX_PAGES} pages; the listing never ends"
            )

    def took(self, keys: list[Any], *, asked: int, echoed: int | None, where: str) -> None:
        """Count a page's items (`keys` identify them), or raise: the answer is malformed."""
        if echoed is not None and echoed != asked:
            raise errors.Transient(
                f"{self.what}: asked for {where}={asked}, the platform answered {where}={echoed}"
            )
        if keys and keys == self._previous and echoed is None:
            raise errors.Transient(
                f"{self.what}: the page at {where}={asked} repeats the previous one; "
                "the platform ignores the paging"
            )
        self._previous = keys
        self.seen += len(keys)
        if self.max_items is not None and self.seen > self.max_items:
            raise errors.Transient(
                f"{self.what}: more than {self.max_items} items listed, more than it can hold"
            )


class PlatformClient:
    """One attempt per call to each endpoint of docs/PLATFORM_API.md, errors already classified."""

    def __init__(
        self,
        config: PlatformConfig,
        *,
        environ: Mapping[str, str] | None = None,
        home: Path | None = None,
        transport: httpx.BaseTransport | None = None,
        stop: threading.Event | None = None,
        observer: RequestObserver | None = None,
    ) -> None:
        """The arguments are the `Exchange`'s, which makes every attempt (see there)."""
        self._wire = Exchange(
            config,
            environ=environ,
            home=home,
            transport=transport,
            stop=stop,
            observer=observer,
        )
        self._send = self._wire.send
        self._get_json = self._wire.get_json

    @property
    def credentials(self) -> Credentials:
        """The credentials in use, read at first use: a client can be built before a key
        exists. Raises like `load_credentials` while none could be read."""
        return self._wire.credentials

    def reload_credentials(self) -> bool:
        """Read the credentials again (SIGHUP, each probe); True if the key or the base changed
        (or none had been read before). Raises like `load_credentials`; the credentials in use
        stay as they were then."""
        return self._wire.reload_credentials()

    def close(self) -> None:
        self._wire.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def viewer_url(self, evaluation_id: str) -> str:
        segment = _segment(evaluation_id, "viewer URL")
        return f"{self.credentials.frontend_url}/dashboard/evaluations/{segment}"

    # -- the endpoints ----------------------------------------------------------------------

    def _with_team(self, body: dict[str, Any]) -> dict[str, Any]:
        team_id = self.credentials.team_id
        return {**body, "team_id": team_id} if team_id and "team_id" not in body else body

    def resolve_environment(self, name: str) -> str:
        """The environment's id, created on the platform if new (get-or-create: replayable)."""
        what = f"resolve environment {name!r}"
        body = msgspec.json.encode(self._with_team({"name": name}))
        answer = self._send(
            "POST",
            "/environmentshub/resolve",
            endpoint="resolve_environment",
            what=what,
            body=body,
            replayable=True,
        )
        # Used as given: it only travels inside JSON bodies.
        env_id = _first_id(decode(answer, what=what, replayable=True), ("id",))
        if env_id is None:
            raise unexpected(answer, what=what, replayable=True, why="no environment id")
        return env_id

    def create_evaluation(self, body: dict[str, Any]) -> tuple[str, str | None]:
        """Create an evaluation; its id and viewer URL (if the platform gave a usable one).
        NOT replayable: an answer without a well-formed id is `Ambiguous` (it may exist)."""
        what = "create evaluation"
        answer = self._send(
            "POST",
            "/evaluations/",
            endpoint="create_evaluation",
            what=what,
            body=msgspec.json.encode(self._with_team(body)),
            replayable=False,
        )
        data = decode(answer, what=what, replayable=False)
        evaluation_id = _first_id(data, ("evaluation_id", "id"))
        if evaluation_id is None:
            raise unexpected(answer, what=what, replayable=False, why="no evaluation id")
        if not is_platform_id(evaluation_id):
            raise unexpected(answer, what=what, replayable=False, why="a malformed id")
        if evaluation_id in _environment_ids(body):
            why = "the environment's id, not a new evaluation's (another request's answer?)"
            raise unexpected(answer, what=what, replayable=False, why=why)
        if is_closed(data if isinstance(data, dict) else {}):
            why = "an evaluation already closed, not a new one (another request's answer?)"
            raise unexpected(answer, what=what, replayable=False, why=why)
        return evaluation_id, _viewer_url_in(data)

    def push_samples(self, evaluation_id: str, body: bytes, *, count: int | None = None) -> None:
        """Append one encoded `{"samples": [...]}` batch of `count` samples. NOT replayable: an
        answer naming another evaluation, or accepting another number of samples than `count`,
        is `Ambiguous` (it answers another request, or the batch was not taken whole)."""
        what = f"push samples to {evaluation_id}"
        path = f"/evaluations/{_segment(evaluation_id, what)}/samples"
        answer = self._send(
            "POST", path, endpoint="push_samples", what=what, body=body, replayable=False
        )
        if not answer.body.strip():
            return
        data = _unwrapped(decode(answer, what=what, replayable=False))
        self._check_names(answer, data, evaluation_id, what=what)
        accepted = _int(data, "accepted")
        if count is not None and accepted is not None and accepted != count:
            why = f"{accepted} samples accepted of the batch's {count}"
            raise unexpected(answer, what=what, replayable=False, why=why)

    def _check_names(self, answer: Answer, data: Any, evaluation_id: str, *, what: str) -> None:
        """An answer about an evaluation that names another one answers another request."""
        named = _first_id(data, ("evaluation_id", "id"))
        if named is not None and named != evaluation_id:
            why = f"another evaluation named ({named[:40]!r})"
            raise unexpected(answer, what=what, replayable=False, why=why)

    def finalize(self, evaluation_id: str, metrics: dict[str, Any]) -> str | None:
        """Finalize with the run's metrics; the viewer URL if given. NOT replayable."""
        what = f"finalize {evaluation_id}"
        body = msgspec.json.encode({"metrics": metrics})
        path = f"/evaluations/{_segment(evaluation_id, what)}/finalize"
        answer = self._send(
            "POST", path, endpoint="finalize", what=what, body=body, replayable=False
        )
        if not answer.body.strip():
            return None
        data = _unwrapped(decode(answer, what=what, replayable=False))
        self._check_names(answer, data, evaluation_id, what=what)
        if isinstance(data, dict) and _status(data)[1] and not is_finalized(data):
            why = f"the status {_status(data)[1][:20]!r}, not a final one"
            raise unexpected(answer, what=what, replayable=False, why=why)
        return _viewer_url_in(data)

    def get_evaluation(self, evaluation_id: str) -> dict[str, Any]:
        what = f"read evaluation {evaluation_id}"
        path = f"/evaluations/{_segment(evaluation_id, what)}"
        answer = self._send("GET", path, endpoint="get_evaluation", what=what, replayable=True)
        data = _unwrapped(decode(answer, what=what, replayable=True))
        if not isinstance(data, dict):
            raise unexpected(answer, what=what, replayable=True, why="no evaluation object")
        named = _first_id(data, ("evaluation_id", "id"))
        if named is not None and named != evaluation_id:
            why = f"another evaluation ({named[:40]!r})"
            raise unexpected(answer, what=what, replayable=True, why=why)
        return data

    def iter_sample_ids(
        self,
        evaluation_id: str,
        page_size: int = SAMPLES_PAGE_SIZE,
        *,
        max_items: int | None = None,
    ) -> Iterator[str]:
        """Every stored sample id exactly as stored (a string, never stripped; duplicates
        included), page by page.

        `max_items`: more ids than this is a malformed listing (`Transient`), as are a page that
        repeats the previous one and more than `MAX_PAGES` pages.
        """
        what = f"list samples of {evaluation_id}"
        path = f"/evaluations/{_segment(evaluation_id, what)}/samples"
        listing, limit, page = _Listing(what, max_items), page_size, 1
        while True:
            listing.asking()
            try:
                data = self._get_json(
                    path,
                    endpoint="list_samples",
                    what=what,
                    params={"page": page, "limit": limit},
                    cap=MAX_PAGE_BYTES,
                )
            except TooLarge:
                if limit == 1:
                    raise
                limit = _smaller_page(limit, listing.seen)
                page = listing.seen // limit + 1
                continue
            items = _page_items(data, ("samples", "data", "items"))
            if items is None:
                raise errors.Transient(
                    f"{what}: page {page} holds no list of samples", unusable=True
                )
            ids = []
            for item in items:
                sample_id = _id_value(item.get("sample_id")) if isinstance(item, dict) else None
                if sample_id is None:
                    raise errors.Transient(
                        f"{what}: page {page} has a sample without sample_id", unusable=True
                    )
                ids.append(sample_id)
            listing.took(ids, asked=page, echoed=_int(data, "page"), where="page")
            yield from ids
            if not items or _is_last_page(data, page=page, seen=listing.seen):
                return
            page += 1  # by number, not by what came back: a server may cap `limit` lower

    def iter_evaluations(
        self, environment_name: str, page_size: int = EVALUATIONS_PAGE_SIZE
    ) -> Iterator[dict[str, Any]]:
        """Every evaluation of an environment (each with its `metadata`), skip/limit paged.

        Each has its id under `evaluation_id` (wherever the platform put it; None if it has
        none, and possibly not a platform id: see `Evaluation.usable`) and a `viewer_url` only
        if it is http(s). A repeated page, more than `MAX_EVALUATIONS_LISTED` evaluations, or
        more than `MAX_PAGES` pages make the listing malformed (`Transient`). One odd item does
        not: the other evaluations of the environment are still listed.
        """
        what = f"list evaluations of {environment_name!r}"
        listing, limit = _Listing(what, MAX_EVALUATIONS_LISTED), page_size
        while True:
            listing.asking()
            skip = listing.seen
            params = {"environment_name": environment_name, "skip": skip, "limit": limit}
            try:
                data = self._get_json(
                    "/evaluations/",
                    endpoint="list_evaluations",
                    what=what,
                    params=params,
                    cap=MAX_PAGE_BYTES,
                )
            except TooLarge:
                if limit == 1:
                    raise
                limit = _smaller_page(limit, 0)
                continue
            items = _page_items(data, ("evaluations", "data", "items"))
            if items is None or not all(isinstance(item, dict) for item in items):
                raise errors.Transient(
                    f"{what}: the page at skip={skip} holds no list of evaluations", unusable=True
                )
            evaluations = [_checked_evaluation(item) for item in items]
            listing.took(
                [_first_id(e, ("evaluation_id", "id")) for e in evaluations],
                asked=skip,
                echoed=_int(data, "skip"),
                where="skip",
            )
            yield from evaluations
            # Advance by what came back, not by what was asked: the server may cap `limit`.
            if not items or _is_last_page(data, page=None, seen=listing.seen):
                return

    def close_out(
        self,
        evaluation_id: str,
        status: str,
        error_message: str | None = None,
        metadata: dict[str, Any] | None = None,
        metrics: dict[str, Any] | None = None,
    ) -> None:
        """Mark an evaluation FAILED or CANCELLED (409 `Conflict` when already closed)."""
        body: dict[str, Any] = {"status": status}
        for key, value in (
            ("error_message", error_message),
            ("metadata", metadata),
            ("metrics", metrics),
        ):
            if value is not None:
                body[key] = value
        what = f"close out {evaluation_id[:80]} as {status}"
        path = f"/evaluations/{_segment(evaluation_id, what, any_length=True)}"
        self._send(
            "PUT",
            path,
            endpoint="close_out",
            what=what,
            body=msgspec.json.encode(body),
            replayable=True,
        )

    def update_evaluation(
        self,
        evaluation_id: str,
        *,
        metadata: dict[str, Any],
        metrics: dict[str, Any] | None = None,
    ) -> None:
        """`PUT /evaluations/{id}` with metadata (and metrics) and no status: neither its status
        nor its samples change. What verifiers 0.4 (prime-runs) sends before its finalize, and
        how a superseded evaluation is marked."""
        what = f"update {evaluation_id[:80]}"
        path = f"/evaluations/{_segment(evaluation_id, what)}"
        body: dict[str, Any] = {"metadata": metadata}
        if metrics is not None:
            body["metrics"] = metrics
        self._send(
            "PUT",
            path,
            endpoint="update",
            what=what,
            body=msgspec.json.encode(body),
            replayable=True,
        )

    def probe(self) -> None:
        """A cheap authenticated read: returns if the platform answers and accepts the key."""
        self._send(
            "GET",
            "/evaluations/",
            endpoint="probe",
            what="probe the platform",
            params={"limit": 1},
            replayable=True,
        )


def _checked_evaluation(item: dict[str, Any]) -> dict[str, Any]:
    """A listed evaluation with its id under `evaluation_id` (what the caller reads first) and
    its viewer URL only if it is http(s). An id that is not a platform id is kept as data: the
    caller (`Evaluation.usable`) never adopts it, and no URL is ever built of it."""
    checked = {**item, "evaluation_id": _first_id(item, ("evaluation_id", "id"))}
    url = _safe_url(item.get("viewer_url"))
    if url is None:
        checked.pop("viewer_url", None)
    else:
        checked["viewer_url"] = url
    return checked
