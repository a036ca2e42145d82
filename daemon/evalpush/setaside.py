"""A record of a run's trace file that was not uploaded: one type from the converter that
refuses a line, through the batch that carries it, to the ledger that keeps it for `status`."""

from __future__ import annotations

from dataclasses import dataclass

from evalpush.states import SetAsideKind


@dataclass(frozen=True, slots=True)
class SetAside:
    """Where the record is (1-based line number, byte offset, size in bytes), why, and whether
    the converter refused it (`bad_line`) or it can never be sent (`rejected`)."""

    line: int
    offset: int
    size: int
    kind: SetAsideKind
    reason: str


__all__ = ["SetAside", "SetAsideKind"]
