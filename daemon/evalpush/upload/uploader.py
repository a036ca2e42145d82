"""The uploader: the entry point of the upload stage, shared by every worker thread.

`upload(run)` claims the run, admits it (`admission`), drives its steps (`steps`) until it is
finalized or cannot go on, records the outcome through `evalpush.ledger.transitions`, and releases the
claim on every way out Python sees. One job per run at a time in this process is the scheduler's
promise; the claim keeps every other process (and a copy of the run in this one) off it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from evalpush.client import PlatformClient
from evalpush.core.errors import (
    AuthError,
    Conflict,
    Gone,
    Interrupted,
    LedgerError,
    Refused,
    RunError,
)
from evalpush.core.states import HistoryOutcome, State, Step
from evalpush.ledger import Claims, RunRecord, taken_over, transitions
from evalpush.log import get_logger
from evalpush.runs import Change, FileChangedError, Run, RunKind, derive_run_id
from evalpush.upload.admission import Admission
from evalpush.upload.context import Context, Progress
from evalpush.upload.files import Rewritten
from evalpush.upload.reconcile import Reconciler
from evalpush.upload.steps import Steps

__all__ = ["Progress", "Uploader"]


class Uploader:
    def __init__(self, context: Context, claims: Claims):
        self.context = context
        self.claims = claims
        reconciler = Reconciler(context)
        self._admission = Admission(context, reconciler)
        self._steps = Steps(context, reconciler)

    @property
    def progress(self) -> Progress:
        return self.context.progress

    @progress.setter
    def progress(self, progress: Progress) -> None:
        self.context.progress = progress

    @property
    def client(self) -> PlatformClient:
        return self.context.client

    def upload(
        self,
        run: Run,
        *,
        retry_failed: bool = True,
        on_incomplete: str | None = None,
        claimed_as: Callable[[RunRecord], object] | None = None,
        follow: bool = False,
        leave_followed: bool = False,
    ) -> RunRecord:
        """Take `run` as far as it can go now, under its claim; returns its ledger row
        afterwards (held by nobody). `Busy` if another live process holds the run.
        `on_incomplete` ("upload" or "hold"; None: `runs.on_incomplete`) is what becomes of a
        run short of its expected traces. `claimed_as` hears the row as the claim found it (a
        run another process finalized is told from one finalized now). `follow`: the run is
        still being written; its lines so far go to its open evaluation (made now if it has
        none), and the row waits for more. `leave_followed`: a run another process follows
        while it is written is left to it (a person's `push` beside a daemon)."""
        policy = on_incomplete or self.context.config.runs.on_incomplete
        claimed = self._claim(run.run_id, run.path, run.kind)
        if claimed_as is not None:
            claimed_as(claimed)
        record = self._release_after(
            claimed,
            lambda: self._work(claimed, run, retry_failed, policy, follow, leave_followed),
        )
        if record.state != State.WAITING:  # not followed any more (or never was)
            self.context.follows.forget(run.run_id)
        return record

    def fail(self, directory: Path, error: RunError) -> RunRecord:
        """Record a run directory that cannot even be loaded as failed, with why (under its
        claim, like any write to a run). A finalized run stays finalized: what the platform
        holds has not changed, and a config that fails to load once (an editor mid-save) must
        not undo it; the caller reports the error."""
        run_id = derive_run_id(directory, known=self.context.ledger.run_id_at)
        claimed = self._claim(run_id, directory, RunKind.EVAL)
        ledger = self.context.ledger

        def record_failure() -> RunRecord:
            if claimed.state == State.FINALIZED:
                return claimed
            return transitions.fail(ledger, claimed, str(error))

        return self._release_after(claimed, record_failure)

    # ------------------------------------------------------------ the claim

    def _claim(self, run_id: str, path: Path, kind: str) -> RunRecord:
        claimed, gone = self.claims.take(run_id=run_id, path=path, kind=kind)
        if gone is not None and self.claims.process.same_process(gone):
            # Its own claim, left when a write failed (a shared ledger's database went away
            # mid-upload): taken back, and the run resumes from the ledger all the same.
            get_logger(run=run_id).info(
                "took back this process's own claim, left by a failed write: resuming from "
                "the ledger, reconciling with the platform",
                step=claimed.step,
                pending=claimed.pending,
            )
        elif gone is not None:
            get_logger(run=run_id).warning(
                "took over the claim of a process that is gone: resuming from the ledger, "
                "reconciling with the platform",
                pid=gone.pid,
                host=gone.host,
                step=claimed.step,
                pending=claimed.pending,
            )
        return claimed

    def _release_after(self, claimed: RunRecord, work: Callable[[], RunRecord]) -> RunRecord:
        try:
            record = work()
        except BaseException:
            self._release_after_failure(claimed)
            raise
        return self.claims.release(record)

    def _release_after_failure(self, claimed: RunRecord) -> None:
        """Release on the way out of a failure, without hiding the failure."""
        try:
            self.claims.release(claimed)
        except LedgerError as exc:
            get_logger(run=claimed.run_id).warning(
                "could not release the run's claim: it is taken over once its holder is seen "
                "gone (this process takes it back at its next attempt)",
                error=str(exc),
            )

    # ------------------------------------------------------------ the steps

    def _work(
        self,
        record: RunRecord,
        run: Run,
        retry_failed: bool,
        on_incomplete: str,
        follow: bool,
        leave_followed: bool,
    ) -> RunRecord:
        """Admit the run, then drive its steps; the outcome is recorded whatever goes wrong
        where (in admission too: a close-out refused, a file unreadable)."""
        ledger = self.context.ledger
        try:
            record = self._admission.admit(
                record,
                run,
                retry_failed=retry_failed,
                on_incomplete=on_incomplete,
                follow=follow,
                leave_followed=leave_followed,
            )
            if record.state != State.UPLOADING:
                return record
            if record.step == Step.CREATE and record.pending is None:
                # Resolved by an earlier attempt: the config may name another environment by
                # now, and the create (and the environment its intent records) must agree.
                record = ledger.update(record, step=Step.RESOLVE)
            while record.step != Step.DONE and record.state == State.UPLOADING:
                record = self._advance(record, run, follow)
        except (
            RunError,
            Refused,
            OSError,
        ) as exc:  # its driver logs the outcome (evalpush.app.attempt)
            return self._failed(record, run, exc)
        except Interrupted:
            self._interrupted(record, follow)
            raise
        except AuthError as exc:
            current = self._current(record)
            if follow and current.state == State.UPLOADING:
                # Still being written: it waits (the next stretch tries the key again), never
                # queued, which would finish it.
                transitions.wait(
                    ledger, current, f"{transitions.WAITING_FOR_KEY}: {exc}", settles_at=None
                )
            elif current.state != State.FINALIZED:
                transitions.await_key(ledger, current, str(exc))
            raise
        return record

    def _current(self, record: RunRecord) -> RunRecord:
        """The run's row as the ledger holds it now (a failed step may have written since),
        while this upload still holds it. A row another process took over meanwhile is that
        process's (`ClaimLost`): read afresh, it names the new holder's claim, which a write
        made through it would pass the fence of (the failure written over the new holder's
        upload, and its claim released)."""
        current = self.context.ledger.get_run(record.run_id)
        if current is None:
            return record
        if current.claim_owner != record.claim_owner:
            raise taken_over(record.run_id)
        return current

    def _failed(self, record: RunRecord, run: Run, exc: Exception) -> RunRecord:
        """Record an error retrying cannot fix. A finalized run stays finalized (its evaluation
        on the platform is what it was): the error is this attempt's, raised as `RunError`."""
        message = str(exc)
        if isinstance(exc, OSError) and not isinstance(exc, FileChangedError):
            message = f"{run.traces_path}: cannot read: {exc.strerror or exc}"
        current = self._current(record)
        if current.state == State.FINALIZED:
            raise RunError(message) from None
        return transitions.fail(self.context.ledger, current, message)

    def _interrupted(self, record: RunRecord, follow: bool) -> None:
        """A stop ended the upload: say so in the ledger if it can be said in time (another
        process holding the write lock must not hold up the stop; a run left `uploading` that
        nobody holds shows as interrupted anyway). A stretch of a followed run waits again: it
        is not finished."""
        current = self._current(record)
        if current.state == State.FINALIZED:
            return
        try:
            if follow and current.state == State.UPLOADING:
                reason = f"following: interrupted; goes on from {current.step}"
                transitions.wait(self.context.ledger, current, reason, settles_at=None)
                return
            transitions.interrupt(self.context.ledger, current)
        except LedgerError as exc:
            get_logger(run=record.run_id).warning(
                "stopped; could not record it in the ledger (the run resumes all the same)",
                error=str(exc),
            )

    def _advance(self, record: RunRecord, run: Run, follow: bool) -> RunRecord:
        """One step, with what the world did meanwhile: the evaluation deleted or closed on the
        platform (a new one is started), the trace file replaced, rewritten or gone."""
        try:
            return self._steps.advance(record, run, follow=follow)
        except (Gone, Conflict) as exc:
            if record.evaluation_id is None:
                raise
            outcome = HistoryOutcome.DELETED if isinstance(exc, Gone) else HistoryOutcome.CLOSED
            get_logger(run=run.run_id).warning(
                "evaluation gone from the platform: starting a new one",
                evaluation=record.evaluation_id,
                error=str(exc),
            )
            return transitions.start_over(
                self.context.ledger,
                record,
                outcome,
                state=State.UPLOADING,
                same_file=True,
                following=follow,
            )
        except Rewritten:
            return self._admission.file_replaced(
                record, run, Change.REPLACED, State.UPLOADING, following=follow
            )
        except OSError as exc:  # FileChangedError, or the trace file gone or unreadable
            checked = self._admission.check_file(record, run, restart_as=State.UPLOADING)
            if checked.state == record.state and checked.step == record.step:
                raise RunError(f"{run.traces_path}: cannot read: {exc}") from None
            return checked
