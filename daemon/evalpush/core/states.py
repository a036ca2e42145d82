"""The closed sets of the pipeline: where a run is, what its upload does next, what became of
an earlier evaluation, and why a record was set aside.

`evalpush.ledger.transitions` is the only module that changes a run's `State`; the upload steps move
its `Step`.
"""

from __future__ import annotations

import enum


class State(enum.StrEnum):
    """A run's state, as `status` shows it."""

    WAITING = "waiting"  # not finished yet; the reason says which rule it waits on
    READY = "ready"  # queued for upload (or interrupted: resumes at its step)
    UPLOADING = "uploading"  # an upload is at `step`
    FINALIZED = "finalized"
    FAILED = "failed"  # an error retrying cannot fix; `last_error` says
    HELD = "held"  # bad lines set aside with `convert.on_bad_line = "hold"`: a person decides
    SKIPPED = "skipped"  # a debug run, or a replay without `runs.upload_replays`
    SUPERSEDED = "superseded"  # (shown per earlier evaluation) replaced by a newer upload


FOLLOWING = "following"
"""How `status` shows a followed run (its row `waiting`, or `uploading` while a stretch of it is
sent): its evaluation is open on the platform and filled as the run is written. Not a `State`:
the row waits like any run not finished."""


class Step(enum.StrEnum):
    """Where an upload is: the next thing to do."""

    SCAN = "scan"
    RESOLVE = "resolve"
    CREATE = "create"
    PUSH = "push"
    FINALIZE = "finalize"
    DONE = "done"


class HistoryOutcome(enum.StrEnum):
    """What became of an evaluation a run had before its current one (the `history` table)."""

    SUPERSEDED = "superseded"  # the run changed after this evaluation was finalized
    CANCELLED = "cancelled"  # the trace file was replaced or deleted mid-upload
    DELETED = "deleted"  # 404: deleted on the platform mid-upload
    CLOSED = "closed"  # 409: closed on the platform mid-upload
    DUPLICATE = "duplicate"  # a second ledger row of the run, merged by the schema-2 upgrade
    NOT_THE_RUNS = "not the run's"  # named by the run's lines, but another run's or someone else's


class SetAsideKind(enum.StrEnum):
    """Why a record of a run's trace file was set aside instead of uploaded."""

    BAD_LINE = "bad_line"  # the converter refused the line
    REJECTED = "rejected"  # the sample can never be sent (too large), or the platform refused it


__all__ = ["FOLLOWING", "HistoryOutcome", "SetAsideKind", "State", "Step"]
