"""Faults the local platform injects on command, matched to requests by kind, in order."""

from __future__ import annotations

import threading
from typing import Any

import msgspec

REQUEST_KINDS = ("resolve", "create", "samples", "finalize", "read", "close")
"""What a request does: `read` is every GET under /api/v1, `close` the PUT that closes out."""

FAULTS = (
    "status",
    "reset",
    "stall",
    "malformed",
    "refuse",
    "endless",
    "trickle",
    "unread",
    "echo_key",
    "bad_id",
    "repeat_page",
    "twice",
    "endless_pages",
    "gzip_bomb",
    "late",
)
LISTING_FAULTS = frozenset({"repeat_page", "endless_pages"})
"""Faults that only listings (`GET .../samples`, `GET /evaluations/`) take; other reads pass."""


class Fault(msgspec.Struct, frozen=True):
    """One fault to inject.

    - `status`: answer `status` (with `Retry-After: retry_after` if given) instead of doing the
      work, or after doing it when `do_work` is true (a 502/504 the server acted on).
    - `reset`: do the work, then abort the connection without an answer.
    - `stall`: do the work, then hold the answer for `seconds` (past the client's timeout).
    - `malformed`: do the work, then answer 200 with a body that is not JSON.
    - `refuse`: close the listening socket (and open connections) for `seconds`, then reopen it
      on the same port. Not tied to a request: `on` and `count` do not apply.
    - `endless`: a chunked body that never ends (1 MiB after 1 MiB of JSON whitespace) until the
      client goes away: with `do_work`, a 200 after doing the work; without, a `status` answer
      (an error body that never ends) and the work is not done.
    - `trickle`: do the work, then send the answer one byte every `seconds` seconds.
    - `unread`: read nothing of the request (its body stays unread, so a big upload blocks) and
      answer nothing for `seconds`, then drop the connection. The work is not done.
    - `echo_key`: answer `status` with a body quoting the request's Authorization header, as
      sent and JSON-escaped. The work is not done.
    - `bad_id`: do the work, then answer a create (or resolve) with the id `value` instead of the
      real one, and a `javascript:` viewer URL.
    - `twice`: do the work, answer, then send the same answer again on the connection
      `seconds` later (a server or proxy answering twice: on a kept-alive connection the copy
      is read as the next request's answer if that request went out before it came).
    - `late`: read the whole request, answer nothing, and do the work `seconds` later, whatever
      became of the client (a request held up between a proxy and the backend, or one whose
      sender was killed or partitioned after sending it); the connection is dropped then.
    - `repeat_page`: a listing answers its first page whatever page or skip was asked, without
      any paging field (no page, skip or total).
    - `endless_pages`: a listing answers a full page of made-up items, with no total and no
      end, whatever is asked.
    - `gzip_bomb`: answer `status` with `Content-Encoding: encoding` (`gzip`, or stacked:
      `gzip, gzip`) and a body that inflates to 4 GiB of zeros (about 4 MiB once, about 10 KB
      stacked); the work is done first only with `do_work`.
    Each of the others applies to the next `count` requests of kind `on` (or of any kind); a
    listing fault only to listings.
    """

    fault: str
    on: str = "any"
    count: int = 1
    status: int = 503
    retry_after: str | None = None
    seconds: float = 30.0
    do_work: bool = False
    value: str = "../../../environmentshub/resolve?x="
    encoding: str = "gzip"

    def __post_init__(self) -> None:
        if self.fault not in FAULTS:
            raise ValueError(f"fault must be one of {', '.join(FAULTS)}, not {self.fault!r}")
        if self.on != "any" and self.on not in REQUEST_KINDS:
            raise ValueError(
                f"on must be 'any' or one of {', '.join(REQUEST_KINDS)}, not {self.on!r}"
            )
        if self.count < 1 or not 100 <= self.status <= 599 or self.seconds < 0:
            raise ValueError("count must be >= 1, status an HTTP status, seconds >= 0")

    @classmethod
    def from_json(cls, data: Any) -> Fault:
        """A fault from a control request's JSON object; ValueError or TypeError if not one."""
        if not isinstance(data, dict):
            raise TypeError("a fault is a JSON object")
        unknown = set(data) - set(cls.__struct_fields__)
        if unknown:
            raise ValueError(f"unknown fault keys: {', '.join(sorted(unknown))}")
        return cls(**data)

    def to_json(self) -> dict[str, Any]:
        return msgspec.structs.asdict(self)


class FaultPlan:
    """The queue of pending faults; safe to use from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: list[list[Any]] = []  # [fault, remaining count]

    def add(self, fault: Fault) -> None:
        with self._lock:
            self._pending.append([fault, fault.count])

    def clear(self) -> None:
        with self._lock:
            self._pending.clear()

    def take(self, kind: str, *, listing: bool = False) -> Fault | None:
        """The first pending fault for a request of `kind`, counted as used once."""
        with self._lock:
            for entry in self._pending:
                fault = entry[0]
                if fault.fault in LISTING_FAULTS and not listing:
                    continue
                if fault.on in ("any", kind):
                    entry[1] -= 1
                    if entry[1] == 0:
                        self._pending.remove(entry)
                    return fault
        return None

    def pending(self) -> list[dict[str, Any]]:
        with self._lock:
            return [{**fault.to_json(), "count": left} for fault, left in self._pending]
