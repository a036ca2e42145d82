"""The ledger side of the runs the tracker watches: what it shows of a waiting run, and the
writes that move one on.

A run the ledger has never seen is added waiting (`transitions.discover`); while it waits, its
progress and settle time go to its row (`transitions.wait`) for `status`, at most every
`WAIT_WRITE_SECONDS`; a run that cannot be read says so there; a ready run is queued
(`transitions.queue`; one short of its expected traces too: its upload attempt holds it or
uploads it as partial, as `push`'s does), with its running scan's results when its `Feeder` has them. None of
these writes holds a claim: a row another process holds (a push uploading it) is written once it
lets go, and one another process moved on (finalized, queued) keeps its state, and the tracker
looks at it afresh.

`Waiting` is the tracker's state of one waiting run, shared by the tracker (which counts and
decides), its `Feeder` and `Progress`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from evalpush.config import Config
from evalpush.core import paths
from evalpush.core.errors import ClaimLost, LedgerError
from evalpush.core.states import State
from evalpush.ledger import Holder, Ledger, RunRecord, transitions
from evalpush.log import get_logger
from evalpush.runs import LineCounter, Run, RunKind
from evalpush.service.feeder import Feeder
from evalpush.upload import Prescan

WAIT_WRITE_SECONDS = 1.0
"""A waiting run's progress goes to the ledger at most this often (its reason changes with every
line a run writes; `status` shows it, and a second behind is near enough)."""

UNSETTLED = float("inf")
"""The settle time of a run whose trace file cannot be read: none (the ledger shows none)."""

ConfigFacts = tuple[int, int, int]
"""(inode, size, mtime_ns) of a run's config.toml: a change means it is read again."""


class Waiting(msgspec.Struct):
    """One waiting run, as the tracker last saw it and as the ledger shows it."""

    run_id: str
    run: Run | None  # None while config.toml cannot be read (`problem` says why)
    problem: str
    config: ConfigFacts | None  # config.toml as it was when `run` (or `problem`) was read
    counter: LineCounter
    in_ledger: bool  # the ledger shows it waiting (a finalized run that changed does not)
    progress: str = ""  # as the ledger shows it
    settles_at: float = 0.0
    written_at: float = float("-inf")
    unwritten: bool = False  # progress changed within WAIT_WRITE_SECONDS of the last write
    feeder: Feeder | None = None  # its running scan, once the run was seen waiting
    stand_in: bool = False  # `run_id` is a stand-in until a line names the run
    again_after: float | None = None  # a finalized run that changed: no new upload before this
    # A followed run (`runs.follow`): the offset its evaluation holds the lines up to, the end
    # of the lines seen, when lines past the first were first seen (the batch period counts
    # from then), when its next stretch is due for that, and whether one is asked for.
    followed_to: int = 0
    seen_to: int = 0
    unsent_since: float | None = None
    stretch_due: float = float("inf")
    stretch: bool = False
    stretch_from: float | None = None  # `unsent_since` when the stretch was asked for

    def due_at(self) -> float:
        """When the tracker must look again: at the settle time, when a followed run's next
        stretch is due, or to write its progress."""
        due = min(self.settles_at, self.stretch_due)
        if self.unwritten:
            return min(due, self.written_at + WAIT_WRITE_SECONDS)
        return due


class Progress:
    """Writes what the tracker decided about a waiting run to the ledger. A method returning
    False means the row is not the tracker's to write any more (another process added, took or
    moved it on): the tracker forgets the run and its next look starts from the row."""

    def __init__(
        self,
        ledger: Ledger,
        config: Config,
        *,
        alive: Callable[[Holder], bool],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._ledger = ledger
        self._config = config
        self._alive = alive
        self._clock = clock
        self._log = get_logger(stage="tracker")

    def held(self, record: RunRecord) -> bool:
        """Whether a live process holds the run's claim. A claim left by a process that is gone
        (SIGKILL, a crash) is nobody's: the upload takes it over and reconciles."""
        holder = record.holder
        return holder is not None and self._alive(holder)

    def waits(self, path: str, waiting: Waiting, progress: str, now: float, *, new: bool) -> bool:
        """The run waits, `progress` saying how far it is: a new run is added to the ledger; a
        known one's progress is written, or left for `due_at` within WAIT_WRITE_SECONDS of the
        last write."""
        if new:
            if not self._discover(path, waiting, progress):
                return False
            self._log.info(
                "run found: waiting until it is finished",
                run=waiting.run_id,
                path=paths.display(path),
                **({"problem": waiting.problem} if waiting.problem else {}),
            )
        elif progress != waiting.progress and (waiting.in_ledger or waiting.again_after):
            if now - waiting.written_at < WAIT_WRITE_SECONDS:
                waiting.unwritten = True
            elif waiting.in_ledger:
                return self._write(path, waiting, progress, now)
            else:
                return self._note_change(path, waiting, progress, now)
        return True

    def _note_change(self, path: str, waiting: Waiting, progress: str, now: float) -> bool:
        """A finalized run whose file keeps changing: its row stays finalized (the platform holds
        that evaluation) and says so in its reason, for `status`."""
        record = self._ledger.get_run(waiting.run_id)
        if record is not None and self.held(record):
            return self._after_holder(waiting, now)
        if record is None or record.state != State.FINALIZED:
            return False
        try:
            transitions.note_change(self._ledger, record, progress)
        except ClaimLost:
            return True
        waiting.progress, waiting.written_at, waiting.unwritten = progress, now, False
        return True

    def unreadable(self, path: str, waiting: Waiting, *, new: bool) -> bool:
        """A trace file the daemon may not read: the run waits, saying so in the ledger (for
        `status`) and in one warning; every rescan tries again, so fixing the permissions is
        enough. Nothing settles it: no line of it was seen."""
        problem = (
            f"{paths.display(waiting.counter.path)}: not readable (permission denied); "
            "make it readable to the daemon's user"
        )
        waiting.settles_at = UNSETTLED
        if problem == waiting.progress:
            return True
        self._log.warning(
            "trace file not readable: the run waits",
            run=waiting.run_id,
            path=paths.display(path),
            why=problem,
        )
        if new:
            return self._discover(path, waiting, problem)
        if waiting.in_ledger:
            return self._write(path, waiting, problem, self._clock())
        waiting.progress = (
            problem  # a finalized run's changed file: the ledger shows its evaluation
        )
        return True

    def _discover(self, path: str, waiting: Waiting, progress: str) -> bool:
        """Add the run to the ledger, waiting (a run found ready is queued right after); False
        if another process added it first."""
        try:
            transitions.discover(
                self._ledger,
                path=Path(path),
                run_id=waiting.run_id,
                kind=RunKind.EVAL,  # only eval runs wait (or runs whose config is unreadable)
                reason=progress,
                settles_at=_settle_time(waiting),
            )
        except LedgerError:
            if self._ledger.get_run(waiting.run_id) is None:
                raise
            return False
        waiting.in_ledger, waiting.progress, waiting.written_at = True, progress, self._clock()
        return True

    @staticmethod
    def _after_holder(waiting: Waiting, now: float) -> bool:
        """The row is held by another process (a push, a fleet's daemon uploading the run): the
        run stays waiting, its progress written at a later look, once the holder lets go."""
        waiting.written_at, waiting.unwritten = now, True
        return True

    def _write(self, path: str, waiting: Waiting, progress: str, now: float) -> bool:
        record = self._ledger.get_run(waiting.run_id)
        if record is None:
            return False  # forgotten (`evalpush forget`): look again afresh
        if self.held(record):
            return self._after_holder(waiting, now)
        if record.state != State.WAITING and not _stretch_left(record):
            # a push finished it, or `retry` queued it
            self._log.info(
                "run moved on by another process while it waited: looked at afresh",
                run=record.run_id,
                path=paths.display(path),
                state=record.state,
            )
            return False
        try:
            transitions.wait(self._ledger, record, progress, settles_at=_settle_time(waiting))
        except ClaimLost:
            return True
        waiting.progress, waiting.written_at, waiting.unwritten = progress, now, False
        self._log.debug("run still waiting", run=record.run_id, path=path, why=progress)
        return True

    def queue(self, path: str, waiting: Waiting, reason: str, *, new: bool) -> bool:
        """Queue a ready run, with its running scan's results when they can stand for the scan
        step; False when another process added it first (it is not handed over then)."""
        if new and not self._discover(path, waiting, ""):
            return False
        if not waiting.in_ledger:
            return True
        record = self._ledger.get_run(waiting.run_id)
        # Only a row still waiting is queued: one another process moved on while this one
        # waited (a push finalized, failed or held it) keeps its state, and the uploader
        # judges it as it is (queueing a finalized row left it `uploading` at step done,
        # taken up again at every ledger poll; a failed or held one was tried again as
        # if `evalpush retry` had queued it).
        if record is None or record.state != State.WAITING or self.held(record):
            return True
        scanned = _prescan(waiting, record)
        try:
            if scanned is not None:  # as the scan step records it, in its order
                self._ledger.add_set_aside(record, scanned.found.set_aside)
            columns = scanned.columns() if scanned is not None else {}
            transitions.queue(self._ledger, record, f"ready: {reason}", **columns)
        except ClaimLost:
            return True  # another process took it: the upload's claim sorts it out
        if scanned is not None:
            self._log.debug(
                "run scanned while it was written: its upload starts at resolve",
                run=record.run_id,
                traces=scanned.found.totals.traces,
                set_aside=len(scanned.found.set_aside),
            )
        return True


def _stretch_left(record: RunRecord) -> bool:
    """A followed run left uploading by a stretch whose process is gone (a live holder's row
    is not written): it waits again, its next stretch taking the claim over."""
    return bool(record.following) and record.state == State.UPLOADING


def _prescan(waiting: Waiting, record: RunRecord) -> Prescan | None:
    """The running scan's results, if the run was fed (not found ready at its first look)."""
    if waiting.feeder is None or waiting.run is None:
        return None
    return waiting.feeder.prescan(waiting.run, record)


def _settle_time(waiting: Waiting) -> float | None:
    return None if waiting.settles_at == UNSETTLED else waiting.settles_at


__all__ = ["UNSETTLED", "WAIT_WRITE_SECONDS", "ConfigFacts", "Progress", "Waiting"]
