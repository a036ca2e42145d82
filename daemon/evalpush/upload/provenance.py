"""What evalpush says about an evaluation it made, on the platform itself: the one `evalpush`
key of the create body's metadata (nothing else in the body differs from what the eval's own
push sends), and the mark it leaves on an evaluation a newer one of the same run replaces.

The `evalpush` key: `version` (of evalpush), `host`, `expected_traces` (`num_tasks *
num_rollouts` from config.toml; null when unknown), `seen_traces` (the lines of the trace file
the upload covers), `set_aside` (of those, the lines set aside as bad before the create; a
sample the platform refuses later is not counted: the metadata was sent before), `complete`
(every expected trace seen and none set aside) and `supersedes` (the evaluation of the same run
this one replaces, or null).

The mark: once the new evaluation is finalized, the one it supersedes is read and its metadata
sent back with `evalpush.superseded_by` (the new evaluation's id) by `PUT /evaluations/{id}`
without a status, the update the platform API offers (it changes neither status nor samples).
It is best effort: a platform that refuses it, or a stop before it, leaves the mark in the
ledger only (`status` shows it), and a warning says so.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Any

from evalpush import __version__
from evalpush.core.errors import EvalpushError, Interrupted
from evalpush.core.states import HistoryOutcome
from evalpush.ledger import RunRecord
from evalpush.log import get_logger

if TYPE_CHECKING:
    from evalpush.convert import RunTotals
    from evalpush.runs import Run
    from evalpush.upload.context import Context

KEY = "evalpush"


def supersedes(ctx: Context, record: RunRecord) -> str | None:
    """The evaluation this run's current one replaces: the last one its history superseded (a
    finalized evaluation; one cancelled mid-upload since replaced nothing)."""
    for earlier in reversed(ctx.ledger.history(record)):
        if earlier.outcome == HistoryOutcome.SUPERSEDED:
            return earlier.evaluation_id
    return None


def metadata(ctx: Context, record: RunRecord, run: Run, totals: RunTotals) -> dict[str, Any]:
    """The `evalpush` key of the create body's metadata (see the module docstring)."""
    set_aside = ctx.ledger.set_aside_count(record)
    # A line is a trace (the seed's, 0.2's) or an episode (0.3/0.4; one without a trace sends
    # no sample but is a line the expected count counts).
    seen = (totals.episodes or totals.traces) + set_aside
    expected = run.expected_traces
    return {
        "version": __version__,
        "host": socket.gethostname(),
        "expected_traces": expected,
        "seen_traces": seen,
        "set_aside": set_aside,
        "complete": set_aside == 0 and (expected is None or seen >= expected),
        "supersedes": supersedes(ctx, record),
    }


def mark_superseded(ctx: Context, record: RunRecord) -> None:
    """After `record`'s evaluation was finalized: mark the one it supersedes on the platform."""
    old, new = supersedes(ctx, record), record.evaluation_id
    if old is None or new is None:
        return
    log = get_logger(run=record.run_id, evaluation=old, superseded_by=new)
    try:
        found = ctx.replayable(
            lambda: ctx.client.get_evaluation(old), what=f"read {old}", run=record.run_id
        )
        meta = found.metadata or {}
        ours = meta.get(KEY) if isinstance(meta.get(KEY), dict) else {}
        marked = {**meta, KEY: {**ours, "superseded_by": new}}
        ctx.replayable(
            lambda: ctx.client.update_evaluation(old, metadata=marked),
            what=f"mark {old} superseded",
            run=record.run_id,
        )
    except Interrupted:
        raise
    except EvalpushError as exc:
        log.warning(
            "the superseded evaluation could not be marked on the platform; the ledger "
            "keeps the mark (`evalpush status` shows it)",
            error=str(exc),
        )
        return
    log.info("superseded evaluation marked on the platform")


__all__ = ["KEY", "mark_superseded", "metadata", "supersedes"]
