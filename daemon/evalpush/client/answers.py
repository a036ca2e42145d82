"""The platform's answers, typed: one `msgspec.Struct` per kind of answer, decoded in one place
(`read`), and what "finalized" looks like said once (`Evaluation.finalized`: status COMPLETED).

| endpoint | answer |
| --- | --- |
| resolve environment | `Environment` |
| create, finalize, read one evaluation, each listed evaluation | `Evaluation` |
| push samples | `SamplesAck` (or an empty body) |
| list samples / list evaluations | `SamplesPage` / `EvaluationsPage` (or a bare list) |

Tolerant where the platform's answers vary: an id under `evaluation_id` or `id`, a string or
an integer; one evaluation at the top level or in a `data` envelope; a page a bare list or an
object holding it under one of its keys; a status in any case; unknown keys. Strict where a
misread would risk exactly-once: a field of another type, a sample without its `sample_id` or a
paging hint that is not a number makes the answer malformed (`unexpected`: `Ambiguous` on a
step that must not be replayed, `Transient` on the rest), its message naming the request and
the field (`at $.samples[3]`). Viewer URLs are kept only if http(s), with no password or secret.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, ClassVar, TypeVar

import msgspec

from evalpush.client.credentials import USERINFO, clean_text, http_url
from evalpush.client.exchange import Answer
from evalpush.core import errors
from evalpush.log import holds_secret, scrub

MAX_ID_CHARS = 1024
"""An evaluation id longer than this is not put into a URL: no platform hands one out."""
_DOT_SEGMENTS = frozenset({".", ".."})
_URL_CHARS = 2048
MAX_SAMPLE_COUNT = 2**63 - 1
"""The largest sample count an answer may give (SQLite's integer)."""
FINALIZED = "COMPLETED"
CLOSED = frozenset({FINALIZED, "FAILED", "CANCELLED"})
"""Statuses of an evaluation that takes no more samples: finalized, or closed out."""

Id = str | int
Enveloped = TypeVar("Enveloped", "Evaluation", "SamplesAck")
Page = TypeVar("Page", "SamplesPage", "EvaluationsPage")


def is_platform_id(value: str) -> bool:
    """Whether `value` can be put into a URL path as one segment (percent-encoded: a `/`, `?`,
    a space, anything not ASCII stays inside it): anything but empty, `.` and `..` (which no
    encoding keeps one segment), at most `MAX_ID_CHARS` characters, nothing of the API key
    in it, and no NUL (`holds_nul`)."""
    return (
        0 < len(value) <= MAX_ID_CHARS
        and value not in _DOT_SEGMENTS
        and not holds_secret(value)
        and not holds_nul(value)
    )


def holds_nul(value: str) -> bool:
    """Whether an id holds a NUL, which no ledger keeps as it is (PostgreSQL text cannot hold
    one; both stores write it as `\\x00`): read back, it would name another evaluation or
    environment."""
    return "\0" in value


def _text(value: Id | None) -> str | None:
    """An id as the platform wrote it (a string exactly as it is: never stripped, ids are
    compared with what was sent), an integer as its text; empty is none."""
    return None if value is None or value == "" else str(value)


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


class _Names(msgspec.Struct, frozen=True):
    """An answer about one evaluation, naming it (or not), with its status (or not)."""

    evaluation_id: Id | None = None
    plain_id: Id | None = msgspec.field(default=None, name="id")
    status: str | None = None

    @property
    def named(self) -> str | None:
        """The evaluation the answer names: its `evaluation_id`, else its `id`."""
        return _text(self.evaluation_id) or _text(self.plain_id)

    @property
    def finalized(self) -> bool:
        """What finalized looks like, said once: the status COMPLETED, in any case."""
        return (self.status or "").strip().upper() == FINALIZED

    @property
    def closed(self) -> bool:
        """Whether it takes no more samples: finalized, or closed out (failed, cancelled)."""
        return (self.status or "").strip().upper() in CLOSED


class Environment(msgspec.Struct, frozen=True):
    """The answer to resolve: `{"data": {"id"}}`, or the id at the top level."""

    plain_id: Id | None = msgspec.field(default=None, name="id")
    data: Environment | None = None

    @property
    def id(self) -> str | None:
        return _text(self.plain_id) or (self.data.id if self.data is not None else None)


class Evaluation(_Names, frozen=True):
    """An evaluation as the platform answers it (a read, a listing's item, the answer to a
    create or a finalize): what the upload reads of it, whatever the spelling."""

    given_url: str | None = msgspec.field(default=None, name="viewer_url")
    metadata: dict[str, Any] | None = None
    name: str | None = None
    model: str | None = msgspec.field(default=None, name="model_name")
    environment_name: str | None = None
    environment_names: list[str] | None = None
    dataset: str | None = None
    sample_count: Annotated[int, msgspec.Meta(ge=0, le=MAX_SAMPLE_COUNT)] | None = None
    data: Evaluation | None = None

    @property
    def id(self) -> str:
        """Its id ("" if the answer names none: never usable)."""
        return self.named or ""

    @property
    def usable(self) -> bool:
        """Whether its id is one evalpush may put into a URL (`is_platform_id`): a listed
        evaluation without such an id (another tool's, a legacy one) is never adopted."""
        return is_platform_id(self.id)

    @property
    def run_id(self) -> str | None:
        """The run it belongs to (`metadata.run_id`), if a string."""
        run_id = (self.metadata or {}).get("run_id")
        return run_id if isinstance(run_id, str) else None

    @property
    def environment(self) -> str | None:
        """The environment it names, in whichever spelling the answer has."""
        first = self.environment_names[0] if self.environment_names else None
        return next(
            (n for n in (self.environment_name, first, self.dataset) if n is not None), None
        )

    @property
    def viewer_url(self) -> str | None:
        """Its viewer URL if it is http(s), fit to print and store (no `user:password@`, no
        secret), else None."""
        text = clean_text(self.given_url)
        if text is None or not _url_shape(text):
            return None
        return None if holds_secret(text) else text


class SamplesAck(_Names, frozen=True):
    """The answer to a samples batch: how many samples it took, where it says."""

    accepted: int | None = None
    data: SamplesAck | None = None


def unwrapped(answer: Enveloped) -> Enveloped:
    """An answer's object, out of a `data` envelope when the answer says nothing of its own
    (no id, no status)."""
    if answer.data is None or answer.named is not None or answer.status is not None:
        return answer
    return answer.data


class _Hints(msgspec.Struct, frozen=True):
    """What a listing's page may say of the listing: the page or skip it answers, and hints of
    its end (prime-evals reads `total`, `has_more`; the local platform adds `total_pages`)."""

    page: int | None = None
    skip: int | None = None
    has_more: bool | None = None
    total_pages: int | None = None
    total: int | None = None

    def last(self, *, page: int | None, seen: int) -> bool:
        """Whether the page's own hints (has_more, total_pages, total) say nothing follows it.

        Without hints only an empty page ends the listing: a server may cap `limit` below what
        was asked, so a short page does not prove the end, and a missed sample id would be sent
        twice."""
        return (
            self.has_more is False
            or (self.total_pages is not None and page is not None and page >= self.total_pages)
            or (self.total is not None and seen >= self.total)
        )


class Sample(msgspec.Struct, frozen=True):
    sample_id: Id


class SamplesPage(_Hints, frozen=True):
    """A page of an evaluation's samples, under `samples` or `data`."""

    ITEM: ClassVar[type] = Sample
    samples: list[Sample] | None = None
    data: list[Sample] | None = None

    @property
    def sample_ids(self) -> list[str] | None:
        found = self.samples if self.samples is not None else self.data
        return None if found is None else [str(s.sample_id) for s in found]


class EvaluationsPage(_Hints, frozen=True):
    """A page of an environment's evaluations, under `evaluations` or `data`."""

    ITEM: ClassVar[type] = Evaluation
    evaluations: list[Evaluation] | None = None
    data: list[Evaluation] | None = None

    @property
    def listed(self) -> list[Evaluation] | None:
        return self.evaluations if self.evaluations is not None else self.data


@functools.cache
def _decoder(shape: Any) -> msgspec.json.Decoder[Any]:
    return msgspec.json.Decoder(shape)


def read(answer: Answer, shape: Any, *, what: str, replayable: bool) -> Any:
    """`answer`'s body as `shape`; a body that is not JSON or not of that shape is a malformed
    answer (`unexpected`)."""
    try:
        return _decoder(shape).decode(answer.body)
    except msgspec.ValidationError as exc:
        why = f"an answer of another shape ({exc})"
        raise unexpected(answer, what=what, replayable=replayable, why=why) from None
    except (msgspec.DecodeError, RecursionError):  # RecursionError: nested too deeply
        raise unexpected(answer, what=what, replayable=replayable) from None


def read_page(answer: Answer, shape: type[Page], *, what: str) -> Page:
    """A listing's page: an object of `shape`, or a bare list of its items."""
    item = shape.ITEM
    page = read(answer, list[item] | shape, what=what, replayable=True)  # type: ignore[valid-type]
    return shape(data=page) if isinstance(page, list) else page


def unexpected(
    answer: Answer, *, what: str, replayable: bool, why: str = "a body that is not JSON"
) -> errors.Transient:
    """A 2xx we cannot use: the work may be done, so a non-replayable step is ambiguous."""
    cls = errors.Transient if replayable else errors.Ambiguous
    snippet = bytes(answer.body[:120]).decode("utf-8", "replace")
    return cls(
        scrub(f"{what}: HTTP {answer.status} with {why}: {snippet!r}"),
        status=answer.status,
        unusable=True,
    )
