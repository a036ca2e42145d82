"""One upload attempt: what `push` and the daemon both do with a run directory, and the one place
that says what it came to.

`attempt(app, directory)` loads the run and uploads it under its claim (its admission holds a
run short of its expected traces when the policy in effect says "hold"), catches what the
upload itself raises, logs its start and its end once (one wording for both), and returns one
`Attempt`, its `outcome` one of `Outcome`. `push` prints it; the daemon hands it to its tracker.
Neither interprets the upload's exceptions: a rule added here (or below, in admission) holds for
both. What is not the run's (an unusable ledger, a bug) is not caught: the caller's scheduler
reports it.
"""

from __future__ import annotations

import enum
import time
from pathlib import Path
from typing import Any

import msgspec

from evalpush.app.root import App
from evalpush.core import paths
from evalpush.core.errors import (
    AuthError,
    Busy,
    ClaimLost,
    Interrupted,
    LedgerRefused,
    LedgerUnavailable,
    RunError,
    RunIdTaken,
)
from evalpush.core.states import State
from evalpush.ledger import RunRecord, next_step
from evalpush.log import get_logger

__all__ = ["Attempt", "Outcome", "attempt"]


class Outcome(enum.StrEnum):
    """What an upload attempt came to."""

    FINALIZED = "finalized"  # uploaded now, with every trace its config expects (or names none)
    PARTIAL = "partial"  # uploaded now, short of the traces its config expects
    ALREADY = "already finalized"  # finalized before (by this process or another): none sent
    HELD = "held"  # held for a person: bad lines, or traces missing ("hold")
    SKIPPED = "skipped"  # never uploaded (a debug run, a replay)
    FOLLOWING = "following"  # its lines so far are in its open evaluation; it is still written
    NOTHING = "nothing to do"  # not ready for this attempt (a copy of a run not finished)
    BUSY = "busy"  # another live process holds its claim (`busy`)
    INTERRUPTED = "interrupted"  # a stop came first: it resumes at its step
    TAKEN_OVER = "taken over"  # its claim was taken over mid-upload: the new holder goes on
    KEY_REFUSED = "key refused"  # no API key, or the platform refused it
    LEDGER_REFUSED = "ledger refused"  # the ledger cannot hold one of its values: it alone fails
    LEDGER_UNAVAILABLE = "ledger unavailable"  # a shared ledger went away: it resumes after
    RUN_ID_TAKEN = "run id taken"  # another run at another path has its run id: not uploaded
    FAILED = "failed"  # an error retrying cannot fix (`error`, ending with what to do)


DONE = frozenset({Outcome.FINALIZED, Outcome.ALREADY, Outcome.SKIPPED})
"""Outcomes that need nothing more (a partial run's does: its missing traces)."""


class Attempt(msgspec.Struct, frozen=True):
    """One attempt's result: the outcome, the run's row afterwards (None: no row is this run's),
    why (`error`: a failure's message, a hold's reason), the count of its records set aside,
    who held it (`busy`), whose outcome it is when another process finished it while this one
    waited (`uploaded_by`), and the run it is a copy of (`copy_of`)."""

    path: Path
    outcome: Outcome
    record: RunRecord | None = None
    error: str | None = None
    set_aside: int = 0
    busy: Busy | None = None
    uploaded_by: int | None = None
    copy_of: str | None = None

    @property
    def ok(self) -> bool:
        """Nothing needs a person: done, with nothing set aside."""
        return self.outcome in DONE and self.set_aside == 0

    @property
    def missing(self) -> int:
        """The expected traces its evaluation lacks (over 0: partial)."""
        return 0 if self.record is None else self.record.missing_traces(self.set_aside)


def attempt(
    app: App,
    directory: Path,
    *,
    retry_failed: bool = True,
    waited_for: int | None = None,
    on_incomplete: str | None = None,
    follow: bool = False,
    leave_followed: bool = False,
) -> Attempt:
    """Upload the run in `directory` as far as it goes now. `retry_failed`: a failed run is
    tried again; `waited_for`: the pid of another process that held the run until now (its
    outcome is reported as its own, unless it left the run unfinished; a failed run is not
    tried again); `on_incomplete`: "upload" or "hold" a run short of its expected traces
    (None: `runs.on_incomplete`); `follow`: the run is still being written, and this attempt
    is a stretch of it (`Uploader.upload`), said at debug; `leave_followed`: a run another
    process follows while it is written is left to it (`Outcome.FOLLOWING`)."""
    log = get_logger(run=app.run_id_of(directory), path=paths.display(directory))
    try:
        if app.stop.is_set():
            return Attempt(directory, Outcome.INTERRUPTED, _row(app, directory), "interrupted")
        try:
            run = app.load_run(directory)
        except RunError as exc:
            return _unloadable(app, directory, exc, log)
        if follow:
            log.debug("upload started", following=True)
        else:
            log.info("upload started")
        started = time.monotonic()
        claimed: list[RunRecord] = []
        record = app.uploader.upload(
            run,
            retry_failed=retry_failed and waited_for is None,
            on_incomplete=on_incomplete,
            claimed_as=claimed.append,
            follow=follow,
            leave_followed=leave_followed,
        )
        result = _result(app, directory, claimed[0], record, waited_for)
        if result.outcome == Outcome.FOLLOWING and not follow:
            log.info("run followed by another process while it is written: left to it")
        else:
            _ended(log, result, time.monotonic() - started)
        return result
    except Exception as exc:  # noqa: BLE001 - the upload's own failures, each told apart
        result = _failure(app, directory, exc)
        _said(log, result)
        return result


def _failure(app: App, directory: Path, exc: Exception) -> Attempt:
    """What an exception of the upload comes to (anything else is raised again)."""
    outcomes: list[tuple[type[Exception], Outcome, str]] = [
        (Busy, Outcome.BUSY, ""),
        (Interrupted, Outcome.INTERRUPTED, "interrupted; push again to resume"),
        (RunIdTaken, Outcome.RUN_ID_TAKEN, ""),
        (AuthError, Outcome.KEY_REFUSED, ""),
        (ClaimLost, Outcome.TAKEN_OVER, ""),
        (LedgerRefused, Outcome.LEDGER_REFUSED, "the ledger cannot record this run: "),
        (LedgerUnavailable, Outcome.LEDGER_UNAVAILABLE, ""),
        # The run stays as it was (finalized): only this attempt failed.
        (RunError, Outcome.FAILED, ""),
    ]
    found = next((o for o in outcomes if isinstance(exc, o[0])), None)
    if found is None:
        raise exc
    _, outcome, prefix = found
    # A clash names another run's row, and a ledger refusing or gone may not be read.
    keep_row = outcome not in (
        Outcome.RUN_ID_TAKEN,
        Outcome.LEDGER_REFUSED,
        Outcome.LEDGER_UNAVAILABLE,
    )
    record = _row(app, directory) if keep_row else None
    error = None if outcome == Outcome.BUSY else prefix + str(exc)
    return Attempt(directory, outcome, record, error, busy=exc if isinstance(exc, Busy) else None)


def _result(
    app: App,
    directory: Path,
    claimed: RunRecord,
    record: RunRecord,
    waited_for: int | None,
) -> Attempt:
    """What the upload of `directory` came to (`claimed`: its row as its claim found it)."""
    set_aside = app.ledger.set_aside_count(record)
    # The outcome is the other process's unless this one went on to upload (a new attempt).
    theirs = waited_for is not None and record.attempts == claimed.attempts
    already = (
        not theirs
        and claimed.state == State.FINALIZED
        and (claimed.evaluation_id, claimed.finalized_at)
        == (record.evaluation_id, record.finalized_at)
    )
    error = {State.FAILED: record.last_error, State.HELD: record.reason}.get(State(record.state))
    outcome = {
        State.FINALIZED: Outcome.FINALIZED,
        State.FAILED: Outcome.FAILED,
        State.HELD: Outcome.HELD,
        State.SKIPPED: Outcome.SKIPPED,
    }.get(State(record.state), Outcome.NOTHING)
    if record.state == State.WAITING and record.following:
        outcome = Outcome.FOLLOWING
    if already:
        outcome = Outcome.ALREADY
    elif outcome == Outcome.FINALIZED and record.missing_traces(set_aside):
        outcome = Outcome.PARTIAL
    return Attempt(
        directory,
        outcome,
        record,
        error,
        set_aside,
        uploaded_by=waited_for if theirs else None,
        copy_of=record.path if record.path_raw != paths.raw(directory) else None,
    )


def _unloadable(app: App, directory: Path, exc: RunError, log: Any) -> Attempt:
    """A run whose config cannot be read still shows in `status`, failed, with why (a
    finalized one stays finalized)."""
    try:
        record = app.uploader.fail(directory, exc)
    except Busy as busy:
        return Attempt(directory, Outcome.BUSY, _row(app, directory), str(exc), busy=busy)
    error = record.last_error if record.state == State.FAILED else None
    result = Attempt(directory, Outcome.FAILED, record, error or next_step(str(exc), record.run_id))
    log.error("run cannot be uploaded", error=paths.printable(result.error or ""))
    return result


def _row(app: App, directory: Path) -> RunRecord | None:
    return app.ledger.get_run(app.run_id_of(directory))


def _ended(log: Any, result: Attempt, seconds: float) -> None:
    """The end of an upload: at info when it is finalized with samples, bytes, seconds, the
    viewer URL and the count set aside, at warning when records were set aside or expected
    traces are missing (partial is said loudly), at error when it failed."""
    record = result.record
    assert record is not None
    if result.uploaded_by is not None:
        return  # its holder said how it ended
    if result.outcome in (Outcome.FINALIZED, Outcome.PARTIAL):
        fields = {
            "evaluation": record.evaluation_id,
            "url": record.viewer_url,
            "samples": record.samples_sent,
            "bytes": record.bytes_sent,
            "seconds": round(seconds, 3),
            "set_aside": result.set_aside,
        }
        if result.missing:
            seen = record.samples_seen + result.set_aside
            fields |= {"seen_traces": seen, "expected_traces": record.expected_traces}
        if result.set_aside or result.missing:
            log.warning("run finalized", complete=False, **fields)
        else:
            log.info("run finalized", **fields)
    elif result.outcome == Outcome.ALREADY:
        log.info("run already finalized: nothing sent", evaluation=record.evaluation_id)
    elif result.outcome == Outcome.FOLLOWING:
        log.debug(
            "followed run's lines so far sent",
            evaluation=record.evaluation_id,
            samples=record.samples_sent,
            seconds=round(seconds, 3),
        )
    elif result.outcome == Outcome.FAILED:
        log.error("upload failed", error=result.error)
    else:
        log.info("upload ended", state=record.state, reason=record.reason)


def _said(log: Any, result: Attempt) -> None:
    """An attempt the upload cut short, said once (a stop, and a refused key the gate tells,
    are said elsewhere)."""
    error = paths.printable(result.error or "")
    if result.outcome == Outcome.BUSY and result.busy is not None:
        log.info("another process is uploading the run: leaving it to it", holder=result.busy.pid)
    elif result.outcome == Outcome.TAKEN_OVER:
        log.warning(
            "the run's claim was taken over: leaving the run to its new holder", error=error
        )
    elif result.outcome == Outcome.LEDGER_REFUSED:  # the daemon's tracker says it so too
        log.error(
            "run cannot be uploaded: the ledger cannot record it; the other runs go on", error=error
        )
    elif result.outcome == Outcome.RUN_ID_TAKEN:
        log.error("run cannot be uploaded", error=error)
    elif result.outcome == Outcome.FAILED:
        log.error("upload failed", error=error)
