"""The one-shot push: every eval run found under the given directories, uploaded now.

Runs go through the same scheduler the daemon uses (at most `upload.max_concurrent_runs` at
once, one job per run directory). Other processes may push from the same state directory at the
same time: a run one of them holds is not touched. `push` first uploads every run nobody holds,
then waits for the held ones (polling the ledger, stop-aware) and reports the outcome their
holder reached, or takes a run over if its holder went away before finishing it. With
`wait=False` it reports them as busy.

`on_result` hears of each run's final result as it comes (the CLI prints it, and counts it in
the progress bar). A refused key (or none) stops the whole push: every run in flight is
interrupted with its progress kept, and `push` raises the `AuthError` once all have stopped.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import msgspec

from evalpush.app import App, Scheduler
from evalpush.core import paths
from evalpush.core.errors import (
    AuthError,
    Busy,
    ClaimLost,
    Interrupted,
    LedgerRefused,
    RunError,
    RunIdTaken,
)
from evalpush.core.states import State
from evalpush.ledger import RunRecord
from evalpush.log import get_logger
from evalpush.runs import find_run_dirs
from evalpush.upload import upload_ended, upload_started

__all__ = ["PushResult", "find_runs", "push", "push_one", "push_runs"]

WAIT_POLL_SECONDS = 0.25
"""How often `push` looks at the ledger while another process uploads a run it was given."""


class PushResult(msgspec.Struct, frozen=True):
    """What `push` did with one run directory."""

    path: Path
    record: RunRecord | None
    set_aside: int
    error: str | None = None
    already: bool = False  # finalized before this push: nothing was sent
    busy: Busy | None = None  # another live process holds the run (not waited for)
    uploaded_by: int | None = None  # the pid of the process whose outcome this is, if not ours
    copy_of: str | None = None  # the run's directory, when this one is a copy of it

    @property
    def ok(self) -> bool:
        return (
            self.error is None
            and self.busy is None
            and self.record is not None
            and self.record.state in (State.FINALIZED, State.SKIPPED)
            and self.set_aside == 0
        )


OnResult = Callable[[PushResult], object]


def find_runs(directories: Sequence[Path]) -> list[Path]:
    """Every run directory in `directories` (each a run directory or a root holding them), once
    each, in the order found: overlapping arguments (`push ROOT ROOT/RUN`) name a run twice."""
    found = (run_dir for directory in directories for run_dir in find_run_dirs(directory))
    return list(dict.fromkeys(found))


def push(
    app: App,
    directories: Sequence[Path],
    *,
    wait: bool = True,
    on_result: OnResult | None = None,
) -> list[PushResult]:
    """Upload every eval run found in `directories`, as finished now, one result per run
    directory in the order first found. Runs other processes hold are waited for (or, with
    `wait=False`, reported busy)."""
    return push_runs(app, find_runs(directories), wait=wait, on_result=on_result)


def push_runs(
    app: App,
    found: list[Path],
    *,
    wait: bool = True,
    on_result: OnResult | None = None,
) -> list[PushResult]:
    """`push` of run directories already found (`find_runs`)."""
    # An older evalpush stored what servers echoed as it was: scrub it of the key in use.
    app.ledger.scrub_secrets()
    return _Push(app, on_result).run(found, wait=wait)


class _Push:
    def __init__(self, app: App, on_result: OnResult | None = None):
        self._app = app
        self._on_result = on_result
        self._results: dict[Path, PushResult] = {}
        self._told: set[Path] = set()
        self._waited_for: dict[Path, int] = {}
        self._failures: list[BaseException] = []
        self._refused: AuthError | None = None
        self._wait = True
        self._lock = threading.Lock()

    def run(self, found: list[Path], *, wait: bool) -> list[PushResult]:
        if not found:
            return []
        self._wait = wait
        workers = min(self._app.config.upload.max_concurrent_runs, len(found))
        with Scheduler(self._job, workers=workers, on_error=self._failed) as scheduler:
            self._all(scheduler, found)
            while wait and not self._app.stop.is_set():
                busy = {p: r.busy.pid for p, r in self._results.items() if r.busy is not None}
                if not busy:
                    break
                released = self._wait_for_release(list(busy))
                self._waited_for.update({path: busy[path] for path in released})
                self._all(scheduler, released)
        if self._refused is not None:
            raise self._refused
        results = [self._interrupted_if_busy(self._results[path]) for path in found]
        for result in results:
            if result.path not in self._told:
                self._tell(result)
        return results

    def _tell(self, result: PushResult) -> None:
        self._told.add(result.path)
        if self._on_result is not None:
            self._on_result(result)

    def _all(self, scheduler: Scheduler[Path], directories: list[Path]) -> None:
        for directory in directories:
            scheduler.submit(directory)
        scheduler.wait_idle()
        if self._failures:
            raise self._failures[0]  # not a run's outcome: the push cannot go on (the ledger)

    def _failed(self, _directory: Path, exc: BaseException) -> None:
        with self._lock:
            self._failures.append(exc)

    def _job(self, directory: Path) -> None:
        result, refused = push_one(self._app, directory, self._waited_for.get(directory))
        if refused is not None:
            self._refuse(refused)
        with self._lock:
            self._results[directory] = result
            final = result.busy is None or not self._wait
            if final and self._refused is None:
                self._tell(result)

    def _wait_for_release(self, busy: list[Path]) -> list[Path]:
        """Poll the ledger until at least one of the `busy` runs is held by nobody alive;
        returns those. Returns early (nothing) once a stop is requested."""
        ledger, claims = self._app.ledger, self._app.claims
        while not self._app.stop.wait(WAIT_POLL_SECONDS):
            released = []
            for directory in busy:
                record = ledger.get_run(self._app.run_id_of(directory))
                holder = record.holder if record is not None else None
                if holder is None or not claims.alive(holder):
                    released.append(directory)
            if released:
                return released
        return []

    def _interrupted_if_busy(self, result: PushResult) -> PushResult:
        if result.busy is None or not self._app.stop.is_set():
            return result
        return msgspec.structs.replace(result, busy=None, error="interrupted while waiting for it")

    def _refuse(self, exc: AuthError) -> None:
        """The platform refused the key (or there is none): nothing else can be sent, so the
        push stops; every run in flight keeps its progress."""
        with self._lock:
            if self._refused is None:
                self._refused = exc
        self._app.request_stop()


def push_one(
    app: App, directory: Path, waited_for: int | None = None
) -> tuple[PushResult, AuthError | None]:
    """Upload the run in `directory` and say what became of it; with the `AuthError` if the platform refused the key (the whole push
    stops). `waited_for`: the pid of another process that held the run until now; its outcome
    is reported as is (a failed run is not retried), unless it left the run unfinished. A run
    the ledger cannot record (`LedgerRefused`) fails alone, with the reason."""
    try:
        return _push_one(app, directory, waited_for)
    except LedgerRefused as exc:
        message = f"the ledger cannot record this run: {exc}"
        get_logger(path=paths.display(directory)).error("run cannot be uploaded", error=message)
        return PushResult(directory, None, 0, message), None


def _push_one(
    app: App, directory: Path, waited_for: int | None
) -> tuple[PushResult, AuthError | None]:
    if app.stop.is_set():
        return PushResult(directory, _row(app, directory), 0, "interrupted"), None
    try:
        run = app.load_run(directory)
    except RunError as exc:
        return _unloadable(app, directory, exc), None
    before = app.ledger.get_run(run.run_id)
    log = get_logger(run=run.run_id, path=paths.display(directory))
    upload_started(log)
    started = time.monotonic()
    try:
        record = app.uploader.upload(run, retry_failed=waited_for is None)
    except Busy as exc:
        return PushResult(directory, _row(app, directory), 0, busy=exc), None
    except Interrupted:
        return PushResult(
            directory, _row(app, directory), 0, "interrupted; push again to resume"
        ), None
    except RunIdTaken as exc:
        return PushResult(directory, None, 0, str(exc)), None
    except AuthError as exc:
        return PushResult(directory, _row(app, directory), 0, str(exc)), exc
    except (ClaimLost, RunError) as exc:
        # RunError: the run stays as it was (finalized); only this attempt failed.
        return PushResult(directory, _row(app, directory), 0, str(exc)), None
    result = _result(app, directory, before, record, waited_for)
    if not result.already and result.uploaded_by is None:
        upload_ended(
            log,
            record,
            time.monotonic() - started,
            set_aside=app.ledger.set_aside_count(record),
            expected=run.expected_traces,
        )
    return result, None


def _result(
    app: App,
    directory: Path,
    before: RunRecord | None,
    record: RunRecord,
    waited_for: int | None,
) -> PushResult:
    """What the upload of `directory` came to (`before`: its row before it)."""
    set_aside = len(app.ledger.set_aside(record))
    error = record.last_error if record.state == State.FAILED else None
    if record.state == State.HELD:
        error = record.reason
    # The outcome is the other process's unless this one went on to upload (a new attempt).
    theirs = waited_for is not None and before is not None and record.attempts == before.attempts
    already = (
        not theirs
        and before is not None
        and before.state == State.FINALIZED
        and (before.evaluation_id, before.finalized_at)
        == (record.evaluation_id, record.finalized_at)
    )
    copy_of = record.path if record.path_raw != paths.raw(directory) else None
    uploaded_by = waited_for if theirs else None
    return PushResult(
        directory, record, set_aside, error, already, uploaded_by=uploaded_by, copy_of=copy_of
    )


def _row(app: App, directory: Path) -> RunRecord | None:
    return app.ledger.get_run(app.run_id_of(directory))


def _unloadable(app: App, directory: Path, exc: RunError) -> PushResult:
    """A run whose config cannot be read still shows in `status`, failed, with why."""
    get_logger(path=paths.display(directory)).warning("run cannot be uploaded", error=str(exc))
    try:
        record = app.uploader.fail(directory, exc)
    except Busy as busy:
        return PushResult(directory, _row(app, directory), 0, str(exc), busy=busy)
    return PushResult(directory, record, 0, str(exc))
