"""Bad weather for the platform: faults at a set share of requests, outages that come and go.

Faults are a share of the requests the platform received (`fault_share`): each time the soak
reads the platform's request counts (`observe`), it queues about that share of the new requests
of each kind as faults of that kind, drawn from `fault_menu` (`POST /_control/faults`; a queued
fault applies to the next request of its kind). A share, not a rate in time: a client backing
off sends few requests and so meets few faults, as with a real flaky server; a rate in time
would queue faults faster than a backing-off client consumes them and starve it. Outages close
the platform's port for a few seconds (`refuse`) at random times (`tick`). Everything injected
is counted by kind; at the end the faults still queued are dropped and counted apart.

Refused connections come two ways: as a fault of the menu (the port closed for under a second,
every open connection dropped: whatever request is in flight at that moment meets it) and as the
outages (the port closed for several seconds, counted apart).
"""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class FaultKind:
    """One entry of the menu: a label for the table and the fault's fields."""

    label: str
    fields: dict[str, Any]
    weight: int = 1


def fault_menu(
    stall_seconds: float,
    refused_seconds: float,
    stall_weight: int = 1,
    twice_weight: int = 0,
    twice_seconds: float = 0.05,
    late_weight: int = 2,
    late_seconds: float = 1.5,
) -> list[FaultKind]:
    """Every fault kind of the issue: statuses (some after the work was done: a proxy's 503
    while the backend commits, a 500 raised after the commit), 429 with Retry-After, resets and
    stalls after the work, malformed bodies, requests whose work lands `late_seconds` after they
    came in, unanswered, and a short refusal (`refuse` is not tied to a request kind); with a
    `twice_weight`, answers sent again `twice_seconds` later on their connection."""
    twice = {"fault": "twice", "seconds": twice_seconds}
    late = {"fault": "late", "seconds": late_seconds}
    return [
        FaultKind("500", {"fault": "status", "status": 500}, 2),
        FaultKind("500 after work", {"fault": "status", "status": 500, "do_work": True}, 2),
        FaultKind("502 after work", {"fault": "status", "status": 502, "do_work": True}, 2),
        FaultKind("503", {"fault": "status", "status": 503}, 2),
        FaultKind("503 after work", {"fault": "status", "status": 503, "do_work": True}, 2),
        FaultKind("504 after work", {"fault": "status", "status": 504, "do_work": True}, 2),
        *([FaultKind("landed late", late, late_weight)] if late_weight else []),
        FaultKind("429 Retry-After", {"fault": "status", "status": 429, "retry_after": "1"}, 2),
        FaultKind("reset after work", {"fault": "reset"}, 3),
        FaultKind("stall after work", {"fault": "stall", "seconds": stall_seconds}, stall_weight),
        FaultKind("malformed body", {"fault": "malformed"}, 2),
        FaultKind("refused connection", {"fault": "refuse", "seconds": refused_seconds}, 1),
        *([FaultKind("answered twice", twice, twice_weight)] if twice_weight else []),
    ]


class Faultable(Protocol):
    def inject(self, fault: dict[str, Any]) -> None: ...
    def pending_faults(self) -> list[dict[str, Any]]: ...
    def clear_faults(self) -> None: ...


@dataclass
class ChaosParams:
    fault_share: float = 0.08  # of the requests of each kind, about
    outage_interval_seconds: float = 20.0  # mean time between outages
    first_outage_seconds: float = 5.0  # after the start: even a short soak meets one
    outage_seconds: tuple[float, float] = (2.0, 6.0)
    stall_seconds: float = 4.0  # past the uploaders' read timeout
    stall_weight: int = 1  # of the menu's 23 (at 1): stalls are rare among the faults
    twice_weight: int = 0  # answers sent twice (a server or proxy out of turn); none by default
    twice_seconds: float = 0.05  # how late the second copy comes
    refused_seconds: float = 0.5  # a refused-connection fault: far shorter than an outage
    late_weight: int = 2  # requests whose work lands late, unanswered
    late_seconds: float = 1.5  # how late: within the uploaders' platform.late_write_seconds


@dataclass
class Chaos:
    """`tick()` often (outages), `observe(request_counts)` on each read of the platform's
    summary (faults); `finish()` stops and counts what was left."""

    platform: Faultable
    params: ChaosParams
    rng: random.Random
    injected: Counter[str] = field(default_factory=Counter)
    outages: int = 0
    outage_seconds: float = 0.0
    left_pending: int = 0
    outage_until: float = 0.0  # monotonic; the platform's port is closed until then
    _seen: dict[str, int] = field(default_factory=dict)
    _next_outage: float = 0.0
    _stopped: bool = False

    def __post_init__(self) -> None:
        self._menu = fault_menu(
            self.params.stall_seconds,
            self.params.refused_seconds,
            self.params.stall_weight,
            self.params.twice_weight,
            self.params.twice_seconds,
            self.params.late_weight,
            self.params.late_seconds,
        )
        self._next_outage = time.monotonic() + self.params.first_outage_seconds

    def in_outage(self) -> bool:
        return time.monotonic() < self.outage_until

    def tick(self) -> None:
        """Start an outage when one is due."""
        now = time.monotonic()
        if self._stopped or now < self._next_outage:
            return
        seconds = self.rng.uniform(*self.params.outage_seconds)
        self.platform.inject({"fault": "refuse", "seconds": seconds})
        self.outages += 1
        self.outage_seconds += seconds
        self.outage_until = time.monotonic() + seconds
        gap = self.rng.expovariate(1.0 / self.params.outage_interval_seconds)
        self._next_outage = self.outage_until + gap

    def observe(self, request_counts: dict[str, int]) -> None:
        """Queue faults for about `fault_share` of the requests received since the last call."""
        for kind, count in request_counts.items():
            new = count - self._seen.get(kind, 0)
            self._seen[kind] = count
            if self._stopped:
                continue
            for _ in range(sum(self.rng.random() < self.params.fault_share for _ in range(new))):
                self._inject_fault(kind)

    def _inject_fault(self, on: str) -> None:
        kind = self.rng.choices(self._menu, weights=[k.weight for k in self._menu])[0]
        on_kind = {} if kind.fields["fault"] == "refuse" else {"on": on}
        self.platform.inject({**kind.fields, **on_kind})
        self.injected[kind.label] += 1

    def finish(self) -> None:
        """Drop the faults no request met (counted), and inject nothing more."""
        self._stopped = True
        self.left_pending = sum(f["count"] for f in self.platform.pending_faults())
        self.platform.clear_faults()
