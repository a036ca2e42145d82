"""The platform stage: one synchronous client for the evaluations API, over the credentials
`evalpush.client.credentials` finds.

What it promises:
- Every endpoint method makes exactly ONE attempt and raises the class `evalpush.core.errors` gives
  the outcome; retrying is `evalpush.client.retry`'s job. A 2xx whose body cannot be read is
  `Ambiguous` for the steps that must not be replayed (create, push samples, finalize) and
  `Transient` for the rest.
- Answers are data, never trusted: every body is read as a stream under a byte cap (an error
  body's first `ERROR_BODY_BYTES`; a JSON answer `MAX_ANSWER_BYTES`; a listing page
  `MAX_PAGE_BYTES`, the page shrunk when one does not fit), then decoded as its endpoint's
  type (`evalpush.client.answers`); a body past its cap or of another shape is a malformed
  answer. An answer that does not fit its request (naming another evaluation, the
  environment, a status that is not final, another number of samples) is one too. An
  evaluation id goes into a path percent-encoded as one segment, and is refused only where
  no encoding keeps it one (`is_platform_id`). A listing ends on its own hints, and is
  malformed (`Transient`) when a page repeats the previous one, when it holds more items
  than the caller's bound, or past `MAX_PAGES`.
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

import math
import threading
import urllib.parse
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Self

import httpx
import msgspec

from evalpush.client.answers import (
    MAX_ID_CHARS,
    Environment,
    Evaluation,
    EvaluationsPage,
    Page,
    SamplesAck,
    SamplesPage,
    holds_nul,
    is_platform_id,
    read,
    read_page,
    unexpected,
    unwrapped,
)
from evalpush.client.credentials import Credentials
from evalpush.client.exchange import Answer, Exchange, RequestObserver, TooLarge
from evalpush.config import PlatformConfig
from evalpush.core import errors
from evalpush.log import holds_secret

__all__ = ["Evaluation", "PlatformClient", "is_platform_id", "most_samples_stored"]

SAMPLES_PAGE_SIZE = 500
EVALUATIONS_PAGE_SIZE = 100
MIB = 1024 * 1024
MAX_PAGE_BYTES = 32 * MIB
"""A listing page carries whole samples (each up to the platform's 25 MiB body limit) or whole
evaluations: a page past this is asked again with fewer items, down to one; one item past it
is malformed. Bounds the memory of a reconciling read, one page at a time."""
MAX_PAGES = 20_000
"""No listing reads more pages than this (10 million samples at the default page size)."""
MAX_EVALUATIONS_LISTED = 100_000
"""An environment listing holding more evaluations than this is read as never ending."""


def most_samples_stored(samples_in_run: int) -> int:
    """The most sample ids a run's evaluation can hold: every sample twice (a duplicate
    pushed by someone else) plus a page. A listing past this is one that never ends."""
    return 2 * samples_in_run + SAMPLES_PAGE_SIZE


def _segment(value: str, what: str, *, any_length: bool = False) -> str:
    """`value` as one percent-encoded path segment; a value that cannot be one is never sent.
    `any_length`: one over `MAX_ID_CHARS` is sent too (to close out the evaluation it names)."""
    if any_length and len(value) > MAX_ID_CHARS:
        value_ok = value not in (".", "..") and not holds_secret(value)
    else:
        value_ok = is_platform_id(value)
    if not value_ok:
        raise errors.Unsendable(
            f"{what}: {value[:40]!r} is not a platform id (empty, a dot segment, over "
            f"{MAX_ID_CHARS} characters, holding the key or a NUL); not sent"
        )
    return urllib.parse.quote(value, safe="")


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
        """The environment's id, created on the platform if new (get-or-create: replayable).
        Used as given: it only travels inside JSON bodies."""
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
        env_id = read(answer, Environment, what=what, replayable=True).id
        if env_id is None:
            raise unexpected(answer, what=what, replayable=True, why="no environment id")
        if holds_nul(env_id):
            raise unexpected(answer, what=what, replayable=True, why="an id holding a NUL")
        return env_id

    def create_evaluation(self, body: dict[str, Any]) -> tuple[str, str | None]:
        """Create an evaluation; its id and viewer URL (if the platform gave a usable one).
        NOT replayable: an answer without a well-formed id, or naming the environment or a
        closed evaluation (another request's answer?), is `Ambiguous` (it may exist)."""
        what = "create evaluation"
        answer = self._send(
            "POST",
            "/evaluations/",
            endpoint="create_evaluation",
            what=what,
            body=msgspec.json.encode(self._with_team(body)),
            replayable=False,
        )
        created = unwrapped(read(answer, Evaluation, what=what, replayable=False))
        environments = body.get("environments") or ()
        why = None
        if not created.id:
            why = "no evaluation id"
        elif not created.usable:
            why = "a malformed id"
        elif created.id in {str(e.get("id")) for e in environments if isinstance(e, dict)}:
            why = "the environment's id, not a new evaluation's (another request's answer?)"
        elif created.closed:
            why = "an evaluation already closed, not a new one (another request's answer?)"
        if why is not None:
            raise unexpected(answer, what=what, replayable=False, why=why)
        return created.id, created.viewer_url

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
        ack = unwrapped(read(answer, SamplesAck, what=what, replayable=False))
        _check_names(answer, ack.named, evaluation_id, what=what, replayable=False)
        if count is not None and ack.accepted is not None and ack.accepted != count:
            why = f"{ack.accepted} samples accepted of the batch's {count}"
            raise unexpected(answer, what=what, replayable=False, why=why)

    def finalize(self, evaluation_id: str, metrics: dict[str, Any]) -> str | None:
        """Finalize with the run's metrics; the viewer URL if given. NOT replayable: an answer
        naming another evaluation, or a status that is not final, is `Ambiguous`."""
        what = f"finalize {evaluation_id}"
        body = msgspec.json.encode({"metrics": metrics})
        path = f"/evaluations/{_segment(evaluation_id, what)}/finalize"
        answer = self._send(
            "POST", path, endpoint="finalize", what=what, body=body, replayable=False
        )
        if not answer.body.strip():
            return None
        done = unwrapped(read(answer, Evaluation, what=what, replayable=False))
        _check_names(answer, done.named, evaluation_id, what=what, replayable=False)
        if done.status and not done.finalized:
            why = f"the status {done.status.strip()[:20]!r}, not a final one"
            raise unexpected(answer, what=what, replayable=False, why=why)
        return done.viewer_url

    def get_evaluation(self, evaluation_id: str) -> Evaluation:
        """The evaluation, its id the one asked for (an answer naming another is `Transient`)."""
        what = f"read evaluation {evaluation_id}"
        path = f"/evaluations/{_segment(evaluation_id, what)}"
        answer = self._send("GET", path, endpoint="get_evaluation", what=what, replayable=True)
        found = unwrapped(read(answer, Evaluation, what=what, replayable=True))
        _check_names(answer, found.named, evaluation_id, what=what, replayable=True)
        return msgspec.structs.replace(found, evaluation_id=evaluation_id)

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
            params = {"page": page, "limit": limit}
            try:
                data = self._page(SamplesPage, path, "list_samples", what, params)
            except TooLarge:
                if limit == 1:
                    raise
                limit = _smaller_page(limit, listing.seen)
                page = listing.seen // limit + 1
                continue
            ids = data.sample_ids
            if ids is None:
                raise errors.Transient(
                    f"{what}: page {page} holds no list of samples", unusable=True
                )
            listing.took(ids, asked=page, echoed=data.page, where="page")
            yield from ids
            if not ids or data.last(page=page, seen=listing.seen):
                return
            page += 1  # by number, not by what came back: a server may cap `limit` lower

    def iter_evaluations(
        self, environment_name: str, page_size: int = EVALUATIONS_PAGE_SIZE
    ) -> Iterator[Evaluation]:
        """Every evaluation of an environment, skip/limit paged, as listed: its id possibly
        not a platform id (see `Evaluation.usable`). A repeated page, more than
        `MAX_EVALUATIONS_LISTED` evaluations, or more than `MAX_PAGES` pages make the listing
        malformed (`Transient`); an item whose id is no platform id does not.
        """
        what = f"list evaluations of {environment_name!r}"
        listing, limit = _Listing(what, MAX_EVALUATIONS_LISTED), page_size
        while True:
            listing.asking()
            skip = listing.seen
            params = {"environment_name": environment_name, "skip": skip, "limit": limit}
            try:
                data = self._page(
                    EvaluationsPage, "/evaluations/", "list_evaluations", what, params
                )
            except TooLarge:
                if limit == 1:
                    raise
                limit = _smaller_page(limit, 0)
                continue
            evaluations = data.listed
            if evaluations is None:
                raise errors.Transient(
                    f"{what}: the page at skip={skip} holds no list of evaluations", unusable=True
                )
            listing.took([e.id for e in evaluations], asked=skip, echoed=data.skip, where="skip")
            yield from evaluations
            # Advance by what came back, not by what was asked: the server may cap `limit`.
            if not evaluations or data.last(page=None, seen=listing.seen):
                return

    def _page(
        self, shape: type[Page], path: str, endpoint: str, what: str, params: dict[str, Any]
    ) -> Page:
        """One page of a listing, read under `MAX_PAGE_BYTES` (`TooLarge` past it)."""
        answer = self._send(
            "GET",
            path,
            endpoint=endpoint,
            what=what,
            params=params,
            replayable=True,
            cap=MAX_PAGE_BYTES,
        )
        return read_page(answer, shape, what=what)

    def close_out(
        self,
        evaluation_id: str,
        status: str,
        error_message: str | None = None,
        metadata: dict[str, Any] | None = None,
        metrics: dict[str, Any] | None = None,
    ) -> None:
        """Mark an evaluation FAILED or CANCELLED (409 `Conflict` when already closed)."""
        what = f"close out {evaluation_id[:80]} as {status}"
        fields = {"error_message": error_message, "metadata": metadata, "metrics": metrics}
        self._put(evaluation_id, {"status": status, **fields}, "close_out", what, any_length=True)

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
        self._put(evaluation_id, {"metadata": metadata, "metrics": metrics}, "update", what)

    def _put(
        self, evaluation_id: str, fields: dict[str, Any], endpoint: str, what: str, **segment: bool
    ) -> None:
        """`PUT /evaluations/{id}` with those of `fields` that are not None (replayable)."""
        path = f"/evaluations/{_segment(evaluation_id, what, **segment)}"
        body = msgspec.json.encode({k: v for k, v in fields.items() if v is not None})
        self._send("PUT", path, endpoint=endpoint, what=what, body=body, replayable=True)

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


def _check_names(
    answer: Answer, named: str | None, evaluation_id: str, *, what: str, replayable: bool
) -> None:
    """An answer about an evaluation that names another one answers another request."""
    if named is not None and named != evaluation_id:
        why = f"another evaluation named ({named[:40]!r})"
        raise unexpected(answer, what=what, replayable=replayable, why=why)
