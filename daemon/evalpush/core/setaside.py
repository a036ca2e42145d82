"""A record of a run's trace file that was not uploaded: one type from the converter that
refuses a line, through the batch that carries it, to the ledger that keeps it for `status`."""

from __future__ import annotations

import msgspec

from evalpush.core.states import SetAsideKind


class SetAside(msgspec.Struct, frozen=True, gc=False):
    """Where the record is (1-based line number, byte offset, size in bytes), why, and whether
    the converter refused it (`bad_line`) or it can never be sent (`rejected`)."""

    line: int
    offset: int
    size: int
    kind: SetAsideKind
    reason: str

    def as_json(self) -> dict[str, object]:
        """The record as `status --json` and `push --json` show it."""
        return {
            "line": self.line,
            "offset": self.offset,
            "size": self.size,
            "kind": self.kind,
            "reason": self.reason,
        }


__all__ = ["SetAside", "SetAsideKind"]
