"""Admission: what a request to upload a run comes to before any step runs.

The policy, in order: a directory holding a run id the ledger knows at another path is the run
moved (its path is updated), a copy of it (the same bytes: left alone while the original is
still there), or another run under the same id (other bytes: `RunIdTaken`, not uploaded); a
debug run, or a replay without `runs.upload_replays`, is skipped with why; a trace file that
changed since it was scanned supersedes a finalized evaluation, cancels an open one (the run
starts over) or, deleted, fails the upload; a finalized, held or (unless retried) failed run
stays as it is; a run about to start with fewer traces than its config expects is said at
warning, and held for a person when the policy in effect (`runs.on_incomplete`, or `push
--partial`) says "hold"; a `push` of a run a daemon follows while it is written leaves it to
the daemon (its last stretch less than a batch period old, or a running daemon following runs
under a root that holds it where the push finds it); anything else starts (or resumes) its upload,
its expected count recorded.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from evalpush.core import paths
from evalpush.core.errors import RunIdTaken
from evalpush.core.ids import short_id
from evalpush.core.states import HistoryOutcome, State, Step
from evalpush.ledger import Ledger, Process, RunRecord, alive_now, transitions
from evalpush.log import get_logger
from evalpush.runs import (
    Change,
    FileIdentity,
    LineCounter,
    Run,
    RunKind,
    derive_run_id,
    digest_of,
    identity,
    is_run_dir,
    verify,
    what_is_at,
)
from evalpush.upload.context import Context
from evalpush.upload.files import fingerprint
from evalpush.upload.reconcile import Reconciler

_DONE_BUT_NOT_FINALIZED = frozenset({State.FAILED, State.READY, State.UPLOADING})
"""States a row whose upload is done (step `done`: its evaluation was finalized) can only be in
by a write that raced or an older evalpush: failed by an old config error, queued again by the
daemon's tracker over a push's finalize. Such a row is finalized again before anything else
(a changed file then supersedes it as usual); without it the row stayed `uploading` at step
`done`, and the daemon took it up at every ledger poll."""
DEBUG_RUN = "debug run (config has script_path or command): never uploaded"
REPLAY_RUN = "replay run: set runs.upload_replays = true to upload replays"


class Admission:
    def __init__(self, context: Context, reconciler: Reconciler):
        self._ctx = context
        self._reconcile = reconciler

    def admit(
        self,
        record: RunRecord,
        run: Run,
        *,
        retry_failed: bool,
        on_incomplete: str,
        follow: bool = False,
        leave_followed: bool = False,
    ) -> RunRecord:
        """The run's row after the policy: `uploading` if its upload (or, `follow`, a stretch
        of it while it is written) goes ahead. `leave_followed`: a run another process follows
        is left as it is, waiting for that process to finalize it once it is finished."""
        ledger = self._ctx.ledger
        if follow:
            return self._admit_stretch(record, run)
        if leave_followed and self._left_to_follower(record, run):
            return record
        if record.path_raw != paths.raw(run.path):
            if still_there(record, ledger):
                self._check_copy(record, run)
                return record  # a copy of a run that is still where the ledger knows it
            get_logger(run=run.run_id).info(
                "run moved", was=record.path, now=paths.display(run.path)
            )
            record = ledger.update(record, path=run.path)
        if record.step == Step.DONE and record.state in _DONE_BUT_NOT_FINALIZED:
            record = transitions.restore_finalized(ledger, record)
        skip = self._skip_reason(run)
        if skip:
            return transitions.skip(ledger, record, skip)
        record = self.check_file(record, run)
        if record.state == State.FINALIZED:
            return record
        if record.state == State.HELD and not record.release_hold:
            return record
        if record.state == State.FAILED and not retry_failed:
            return record
        expected = {"expected_traces": run.expected_traces}
        short = self._short(record, run)
        hold = on_incomplete == "hold" and not record.release_hold
        if short:
            get_logger(run=run.run_id, path=paths.display(run.path)).warning(
                "run finished short of its expected traces: "
                + ("held for a person" if hold else "uploading it as a partial evaluation"),
                why=short,
                on_incomplete=on_incomplete,
            )
        if short and hold:
            reason = (
                f"incomplete: {short}; `evalpush retry {short_id(run.run_id)}` uploads it as it "
                f'is (runs.on_incomplete = "hold")'
            )
            return transitions.hold(ledger, record, reason, **expected)
        return transitions.start(ledger, record, **expected)

    def _admit_stretch(self, record: RunRecord, run: Run) -> RunRecord:
        """A stretch of a followed run goes ahead only for a row that waits at this path (or
        one a stretch of a process now gone left uploading), of a run evalpush uploads and
        whose eval does not push it itself; anything else waits for the run's upload once it
        is finished, which applies the whole policy."""
        waits = record.state == State.WAITING or (
            record.state == State.UPLOADING and record.following
        )
        if (
            not waits
            or record.path_raw != paths.raw(run.path)
            or self._skip_reason(run)
            or run.pushes_itself
            or self._followed_elsewhere(record)
        ):
            return record
        return transitions.start(
            self._ctx.ledger, record, following=1, expected_traces=run.expected_traces
        )

    def _followed_elsewhere(self, record: RunRecord) -> bool:
        """Whether another process follows the run: its last stretch, less than a batch
        period ago, was not this process's (a fleet's daemons all see the run; one follows it,
        and another takes over once that one has not sent a stretch for a batch period)."""
        if not record.following or record.followed_at is None:
            return False
        if self._ctx.follows.windows(record) is not None:
            return False  # this process extended it last
        period = self._ctx.config.runs.follow_batch_seconds
        return self._ctx.clock() - record.followed_at < period

    def _left_to_follower(self, record: RunRecord, run: Run) -> bool:
        """Whether a `push` leaves the run to the daemon that follows it while it is written:
        its row waits between stretches, and another process sent its last stretch less than a
        batch period ago, or a running daemon follows runs under a root holding it. A stretch
        goes only once lines came: an eval slower than a batch period between two lines leaves
        its last stretch older than that while its daemon follows it on (and ends it, by its
        count or the settle rule)."""
        if record.state != State.WAITING or not record.following:
            return False
        return self._followed_elsewhere(record) or self._follower_runs(record, run)

    def _follower_runs(self, record: RunRecord, run: Run) -> bool:
        """Whether a daemon of this ledger runs (heard from lately, its process not seen gone
        where this process can see it) that follows runs under a root holding the run where
        this push finds it: its follower, a fleet's daemon that takes over from it, or one
        started since over the same tree, which takes the run up at its first look. A daemon
        of this host sees the run where the push does; one of another host only if the row
        says the run is there too: a row naming another path is the run moved (out of the
        tree: nobody's to follow) or the tree as another host mounts it, and only this host's
        daemons can tell which. Only daemons that watch other roots (or follow nothing)
        running, the run is nobody's to follow."""
        now = self._ctx.clock()
        alive = alive_now(now)
        here, found_at = Process.current().host, paths.raw(run.path)
        return any(
            (daemon.host == here or record.path_raw == found_at)
            and daemon.follows_run_at(found_at)
            and daemon.running(now, alive)
            for daemon in self._ctx.ledger.daemons()
        )

    def _short(self, record: RunRecord, run: Run) -> str:
        """How a run about to start its upload falls short of the traces its config expects
        (`5 of 8 expected traces`), or empty. Only before anything is created (an upload under
        way goes on), or for a followed run, whose evaluation was made while it was written."""
        expected = run.expected_traces
        under_way = record.evaluation_id is not None or record.pending is not None
        if expected is None or (under_way and not record.following):
            return ""
        counter = LineCounter(run.traces_path, max_line_bytes=self._ctx.config.read.max_line_bytes)
        try:
            lines = counter.update().lines
        except OSError:
            return ""  # its scan says why it cannot be read
        return f"{lines} of {expected} expected traces" if lines < expected else ""

    def _check_copy(self, record: RunRecord, run: Run) -> None:
        """A directory with the run id of a run still at its own path is a copy of it only if
        it holds the bytes the run was scanned as; else it is another run under the same id
        (`RunIdTaken`: reported, never taken for a copy and dropped). A run not scanned yet
        has nothing to compare with: the copy waits until it is."""
        known = fingerprint(record)
        if known is None:
            return
        try:
            change, _ = verify(run.traces_path, known)
        except OSError as exc:
            raise RunIdTaken(
                f"{paths.display(run.path)}: holds run id {run.run_id}, as does the run at "
                f"{record.path}, and cannot be compared with it ({exc}): not uploaded"
            ) from None
        if change != Change.SAME:
            raise RunIdTaken(
                f"{paths.display(run.path)}: holds run id {run.run_id}, as does the run at "
                f"{record.path}, but not the same traces: not uploaded (a run id names one run: "
                "give one of the two directories another name)"
            )

    def _skip_reason(self, run: Run) -> str:
        if run.kind == RunKind.DEBUG:
            return DEBUG_RUN
        if run.kind == RunKind.REPLAY and not self._ctx.config.runs.upload_replays:
            return REPLAY_RUN
        return ""

    # ------------------------------------------------------------ the trace file changed

    def check_file(
        self, record: RunRecord, run: Run, *, restart_as: State = State.READY
    ) -> RunRecord:
        """Supersede a finalized run whose file changed; cancel an upload whose file was replaced
        or rewritten (it starts over from scan in state `restart_as`) or deleted (it fails). A
        file that only moved or was touched keeps its upload, with its new identity recorded."""
        known = fingerprint(record)
        if known is None:
            return record
        if record.following and record.state != State.FINALIZED:
            # A followed run's file grows all the time: its push extends the fingerprint and
            # checks the bytes as it does (`follow.Follows`). Only a file gone is seen here.
            try:
                identity(run.traces_path)
            except OSError:
                return self.file_replaced(record, run, Change.GONE, restart_as)
            return record
        change, now = verify(run.traces_path, known)
        if record.state == State.FINALIZED:
            if change in (Change.GROWN, Change.REPLACED):
                get_logger(run=run.run_id).info("run changed after finalize: new evaluation")
                return transitions.start_over(self._ctx.ledger, record, HistoryOutcome.SUPERSEDED)
        elif change in (Change.GONE, Change.REPLACED):
            return self.file_replaced(record, run, change, restart_as)
        if change == Change.GONE or now is None:
            return record
        return self._note_identity(record, run, now)

    def _note_identity(self, record: RunRecord, run: Run, now: FileIdentity) -> RunRecord:
        """Record where the same bytes are now (a move, a touch), so the next look is a stat;
        a row from before fingerprints gets its digest here, once. The size stays the scanned
        one: a file that grew since must still look grown."""
        known = fingerprint(record)
        assert known is not None
        if (
            msgspec.structs.replace(now, size=known.identity.size) == known.identity
            and known.digest
        ):
            return record
        digest = known.digest or digest_of(run.traces_path, known.end, expect=now)
        return self._ctx.ledger.update(
            record,
            file_device=now.device,
            file_inode=now.inode,
            file_mtime_ns=now.mtime_ns,
            file_ctime_ns=now.ctime_ns,
            file_digest=digest,
        )

    def file_replaced(
        self,
        record: RunRecord,
        run: Run,
        change: Change,
        restart_as: State,
        *,
        following: bool = False,
    ) -> RunRecord:
        """The file under an open upload is gone (the upload fails) or is another file now (the
        upload starts over, still followed if a stretch started it over): either way its open
        evaluation is closed out as cancelled."""
        ledger = self._ctx.ledger
        record = self._reconcile.settle_create(record, run)
        if change == Change.GONE:
            message = f"{run.traces_path}: the run's trace file {_gone_how(run.traces_path)}"
            self._reconcile.cancel(record, message)
            record = transitions.start_over(ledger, record, HistoryOutcome.CANCELLED)
            return transitions.fail(ledger, record, message)
        get_logger(run=run.run_id).warning(
            "trace file replaced or rewritten mid-upload: the open evaluation is cancelled and "
            "the run uploads again from the start"
        )
        self._reconcile.cancel(record, "the run's trace file was replaced (resumed eval)")
        return transitions.start_over(
            ledger, record, HistoryOutcome.CANCELLED, state=restart_as, following=following
        )


def _gone_how(path: Path) -> str:
    """How a trace file is gone: deleted, or something evalpush does not read in its place."""
    there = what_is_at(path)
    if there in (None, "nothing"):
        return "was deleted mid-upload"
    if there == "a symlink":
        return "was replaced by a symlink mid-upload (evalpush does not follow symlinks)"
    return f"was replaced by {there} mid-upload (evalpush reads only regular files)"


def still_there(record: RunRecord, ledger: Ledger) -> bool:
    """Whether the run is still at the path the ledger knows (then another directory with its
    run id is a copy, not the run moved)."""
    directory = record.directory
    return is_run_dir(directory) and derive_run_id(directory, ledger.run_id_at) == record.run_id
