"""Bad weather for the platform: faults at a set rate and outages that come and go.

Each tick queues one fault drawn from `FAULT_MENU` (the local platform's `POST /_control/faults`;
it applies to the next request of its kind), and from time to time an outage closes the
platform's port for a few seconds (`refuse`). Everything injected is counted by kind; at the end
the faults still pending (queued but never met by a request) are dropped and counted apart.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

REQUEST_KINDS = ("resolve", "create", "samples", "finalize", "read", "close", "any")
KIND_WEIGHTS = (1, 2, 6, 2, 2, 1, 2)  # most requests are samples


@dataclass(frozen=True)
class FaultKind:
    """One entry of the menu: a label for the table and the fault's fields."""

    label: str
    fields: dict[str, Any]
    weight: int = 1


def fault_menu(stall_seconds: float) -> list[FaultKind]:
    """Every fault kind the local platform has (refuse is the outage, scheduled apart)."""
    return [
        FaultKind("500", {"fault": "status", "status": 500}, 2),
        FaultKind("502 after work", {"fault": "status", "status": 502, "do_work": True}, 2),
        FaultKind("503", {"fault": "status", "status": 503}, 2),
        FaultKind("504 after work", {"fault": "status", "status": 504, "do_work": True}, 2),
        FaultKind("429 Retry-After", {"fault": "status", "status": 429, "retry_after": "1"}, 2),
        FaultKind("reset after work", {"fault": "reset"}, 3),
        FaultKind("stall after work", {"fault": "stall", "seconds": stall_seconds}, 1),
        FaultKind("malformed body", {"fault": "malformed"}, 2),
    ]


class Faultable(Protocol):
    def inject(self, fault: dict[str, Any]) -> None: ...
    def pending_faults(self) -> list[dict[str, Any]]: ...
    def clear_faults(self) -> None: ...


@dataclass
class ChaosParams:
    fault_interval_seconds: float = 0.5  # mean time between injected faults
    outage_interval_seconds: float = 20.0  # mean time between outages
    first_outage_seconds: float = 5.0  # after the start: even a short soak meets one
    outage_seconds: tuple[float, float] = (2.0, 6.0)
    stall_seconds: float = 4.0  # past the uploaders' read timeout


@dataclass
class Chaos:
    """Call `tick()` often; it injects what is due. `finish()` stops and counts what was left."""

    platform: Faultable
    params: ChaosParams
    rng: random.Random
    injected: Counter[str] = field(default_factory=Counter)
    outages: int = 0
    outage_seconds: float = 0.0
    left_pending: int = 0
    outage_until: float = 0.0  # monotonic; the platform's port is closed until then
    _next_fault: float = 0.0
    _next_outage: float = 0.0

    def __post_init__(self) -> None:
        now = time.monotonic()
        self._menu = fault_menu(self.params.stall_seconds)
        self._next_fault = now + self._gap(self.params.fault_interval_seconds)
        self._next_outage = now + self.params.first_outage_seconds

    def _gap(self, mean: float) -> float:
        return self.rng.expovariate(1.0 / mean) if mean > 0 else float("inf")

    def in_outage(self) -> bool:
        return time.monotonic() < self.outage_until

    def tick(self) -> None:
        """Inject what is due; nothing during an outage (faults wait for the port to open)."""
        now = time.monotonic()
        if now < self.outage_until:
            return
        if now >= self._next_fault:
            self._inject_fault()
            self._next_fault = now + self._gap(self.params.fault_interval_seconds)
        if now >= self._next_outage:
            seconds = self.rng.uniform(*self.params.outage_seconds)
            self.platform.inject({"fault": "refuse", "seconds": seconds})
            self.outages += 1
            self.outage_seconds += seconds
            self.outage_until = time.monotonic() + seconds
            self._next_outage = self.outage_until + self._gap(self.params.outage_interval_seconds)

    def _inject_fault(self) -> None:
        kind = self.rng.choices(self._menu, weights=[k.weight for k in self._menu])[0]
        on = self.rng.choices(REQUEST_KINDS, weights=KIND_WEIGHTS)[0]
        self.platform.inject({**kind.fields, "on": on})
        self.injected[kind.label] += 1

    def finish(self) -> None:
        """Drop the faults no request met (counted), and inject nothing more."""
        self.left_pending = sum(f["count"] for f in self.platform.pending_faults())
        self.platform.clear_faults()
        self._next_fault = self._next_outage = float("inf")
