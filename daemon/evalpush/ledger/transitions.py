"""Run state transitions: the only writer of a run's `state`.

Each function is one named change of state with what goes with it (reason, error, attempts),
written in one fenced ledger transaction (the caller holds the run's claim, except where a
function says otherwise; `start` and `finalized` go with the run's next write),
and returns the run's new row. The upload steps write their own
progress (`step`, offsets, intents) with the ledger's named writes (`record_intent`,
`acknowledge`, `record_progress`), which refuse `state`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from evalpush.core.ids import short_id
from evalpush.core.states import HistoryOutcome, State, Step
from evalpush.ledger.store import Ledger, RunRecord

WAITING_FOR_KEY = "waiting for a working API key"
QUEUED_BY_RETRY = "queued by `evalpush retry`"


def start(ledger: Ledger, record: RunRecord, **facts: Any) -> RunRecord:
    """An upload begins (or resumes at its step): a new attempt, the last error cleared,
    `facts` of the run recorded with it (its expected count). Written with the run's next write
    (deferred: the claim says the run is being worked on)."""
    return ledger.record_state(
        record,
        State.UPLOADING,
        reason="",
        attempts=record.attempts + 1,
        last_error=None,
        **facts,
    )


def discover(
    ledger: Ledger, *, path: Path, run_id: str, kind: str, reason: str, settles_at: float | None
) -> RunRecord:
    """A run the daemon found that is not finished yet: added to the ledger, waiting."""
    record = ledger.add(path=path, run_id=run_id, kind=kind, state=State.WAITING, reason=reason)
    return ledger.update(record, settles_at=settles_at)


def wait(ledger: Ledger, record: RunRecord, reason: str, *, settles_at: float | None) -> RunRecord:
    """The run is not finished yet: `reason` says how far it is (which traces, which marker),
    `settles_at` when the settle rule makes it ready if its file does not grow again."""
    return ledger.set_state(record, State.WAITING, reason=reason, settles_at=settles_at)


def queue(ledger: Ledger, record: RunRecord, reason: str, **scanned: Any) -> RunRecord:
    """The run is ready: queued for upload (with `scanned`, what its scan step records: the
    daemon scanned it while watching it being written, and the upload starts at resolve)."""
    return ledger.set_state(record, State.READY, reason=reason, settles_at=None, **scanned)


def followed(ledger: Ledger, record: RunRecord, reason: str, *, at: float) -> RunRecord:
    """A followed run's lines so far are on the platform, in its open evaluation (acknowledged
    `at`): it waits for more (its row waits, `following`, until the run is finished and its
    upload finalizes it). Durable now: it is also the last batch's acknowledgement."""
    return ledger.set_state(record, State.WAITING, following=1, reason=reason, followed_at=at)


def interrupt(ledger: Ledger, record: RunRecord) -> RunRecord:
    """A stop ended the upload: it resumes at its step next time."""
    return ledger.set_state(record, State.READY, reason=f"interrupted; resumes at {record.step}")


def await_key(ledger: Ledger, record: RunRecord, error: str) -> RunRecord:
    """The platform refused the key (or there is none): ready again once a key works."""
    return ledger.set_state(record, State.READY, reason=WAITING_FOR_KEY, last_error=error)


def fail(ledger: Ledger, record: RunRecord, error: str) -> RunRecord:
    """An error retrying cannot fix; `evalpush retry` (or the next push) tries again. The
    error kept ends with what to do about it (`next_step`)."""
    return ledger.set_state(record, State.FAILED, last_error=next_step(error, record.run_id))


NEXT_STEP = ", then `evalpush retry "
"""How every failure's message goes on: what to fix, then the command that tries again."""


def next_step(error: str, run_id: str) -> str:
    """`error` ending with what a person does next: fix what it names, then retry the run."""
    if NEXT_STEP in error:
        return error
    if "config.toml" in error:
        fix = "fix config.toml"
    elif "traces.jsonl" in error or "trace file" in error or "results.jsonl" in error:
        fix = "fix or restore the trace file"
    elif "HTTP " in error or "platform" in error:
        fix = "check what the platform said"
    else:
        fix = "fix the cause"
    return f"{error}; {fix}{NEXT_STEP}{short_id(run_id)}`"


def hold(ledger: Ledger, record: RunRecord, reason: str, **progress: Any) -> RunRecord:
    """Bad lines were set aside, or traces are missing, and the configuration wants a person to
    decide; `progress` is what the scan recorded (or the run's expected count), written with
    it."""
    return ledger.set_state(record, State.HELD, reason=reason, **progress)


def skip(ledger: Ledger, record: RunRecord, reason: str) -> RunRecord:
    """A run that is not uploaded (debug, or a replay), with why."""
    return ledger.set_state(record, State.SKIPPED, reason=reason)


def finalize(ledger: Ledger, record: RunRecord, *, at: float, **fields: Any) -> RunRecord:
    """The platform holds the run's evaluation, finalized: adopted as found (durable now)."""
    return ledger.set_state(record, State.FINALIZED, **_finalized(at, fields))


def finalized(ledger: Ledger, record: RunRecord, *, at: float, **fields: Any) -> RunRecord:
    """The platform confirmed this upload's finalize: written with the run's release (the
    finalize intent is on disk; lost to a crash, the run goes back to it and a read of the
    evaluation's status settles it)."""
    return ledger.record_state(record, State.FINALIZED, **_finalized(at, fields))


def _finalized(at: float, fields: dict[str, Any]) -> dict[str, Any]:
    return {"step": Step.DONE, "pending": None, "finalized_at": at, "following": 0, **fields}


def note_change(ledger: Ledger, record: RunRecord, reason: str) -> RunRecord:
    """A finalized run whose file changed and is not finished again yet: it stays finalized
    (the platform holds that evaluation), `reason` saying what it waits for."""
    return ledger.set_state(record, State.FINALIZED, reason=reason)


def restore_finalized(ledger: Ledger, record: RunRecord) -> RunRecord:
    """A run whose upload is done (step `done`) but marked otherwise: finalized again. (An older
    evalpush marked a finalized run failed when its config failed to load once; the run then
    went nowhere, and every push reported it failed. A write under no claim that raced a
    finalize, the daemon's tracker queueing the run, left it ready.)"""
    return ledger.set_state(record, State.FINALIZED, reason="", last_error=None)


def requeue(ledger: Ledger, record: RunRecord) -> RunRecord:
    """`evalpush retry`: a failed or held run back in the queue (a held run then uploads
    without its bad lines). Written only while nobody holds the run."""
    return ledger.set_state(
        record,
        State.READY,
        release_hold=int(record.state == State.HELD),
        reason=QUEUED_BY_RETRY,
        last_error=None,
    )


def start_over(
    ledger: Ledger,
    record: RunRecord,
    outcome: HistoryOutcome,
    *,
    state: State = State.READY,
    same_file: bool = False,
    following: bool = False,
) -> RunRecord:
    """The upload begins again from scan, in `state`: the current evaluation (if any) goes to
    the history as `outcome` (superseded, cancelled, deleted, closed). `following`: a stretch
    of a followed run starts it over, and the row stays followed (left `uploading` by a crash,
    it is not taken for a finished run's upload)."""
    return ledger.restart(
        record, outcome=outcome, state=state, same_file=same_file, following=following
    )


__all__ = [
    "QUEUED_BY_RETRY",
    "WAITING_FOR_KEY",
    "await_key",
    "discover",
    "fail",
    "finalize",
    "finalized",
    "followed",
    "hold",
    "interrupt",
    "queue",
    "requeue",
    "restore_finalized",
    "skip",
    "start",
    "start_over",
    "wait",
]
