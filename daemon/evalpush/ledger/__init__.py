"""The ledger: durable per-run progress, claims on runs, and the run state transitions."""

from evalpush.ledger.claims import (
    LINGER_SECONDS,
    Claims,
    Holder,
    Process,
    alive_now,
    held_by,
    holder_alive,
    process_start,
    taken_over,
)
from evalpush.ledger.file import STATE_DIR_FIX, refuse_uncreatable
from evalpush.ledger.opening import open_ledger, where
from evalpush.ledger.store import SCHEMA_VERSION, Ledger, RunRecord, default_path
from evalpush.ledger.transitions import next_step

__all__ = [
    "Claims",
    "Holder",
    "LINGER_SECONDS",
    "Ledger",
    "Process",
    "RunRecord",
    "SCHEMA_VERSION",
    "STATE_DIR_FIX",
    "alive_now",
    "default_path",
    "held_by",
    "holder_alive",
    "next_step",
    "open_ledger",
    "process_start",
    "refuse_uncreatable",
    "taken_over",
    "where",
]
