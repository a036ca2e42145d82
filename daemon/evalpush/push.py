"""The one-shot push: every eval run found under the given directories, uploaded now.

Runs go through the same scheduler the daemon uses (at most `upload.max_concurrent_runs` at
once, one job per run directory). Other processes may push from the same state directory at the
same time: a run one of them holds is not touched. `push` first uploads every run nobody holds,
then waits for the held ones (polling the ledger, stop-aware) and reports the outcome their
holder reached, or takes a run over if its holder went away before finishing it. With
`wait=False` it reports them as busy.

Each run is one upload attempt (`evalpush.app.attempt`, the daemon's too), the run finished
now: `on_incomplete` ("upload" or "hold"; None: `runs.on_incomplete`) decides a run short of
its expected traces. `on_result` hears of each run's final result as it comes (the CLI prints
it, and counts it in the progress bar). A refused key (or none) stops the whole push: every run
in flight is interrupted with its progress kept, and `push` raises the `AuthError` once all
have stopped.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import msgspec

from evalpush.app import App, Attempt, Outcome, Scheduler, attempt
from evalpush.core.errors import AuthError
from evalpush.runs import find_run_dirs

__all__ = ["find_runs", "push", "push_runs"]

WAIT_POLL_SECONDS = 0.25
"""How often `push` looks at the ledger while another process uploads a run it was given."""


OnResult = Callable[[Attempt], object]


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
    on_incomplete: str | None = None,
) -> list[Attempt]:
    """Upload every eval run found in `directories`, as finished now, one result per run
    directory in the order first found. Runs other processes hold are waited for (or, with
    `wait=False`, reported busy)."""
    found = find_runs(directories)
    return push_runs(app, found, wait=wait, on_result=on_result, on_incomplete=on_incomplete)


def push_runs(
    app: App,
    found: list[Path],
    *,
    wait: bool = True,
    on_result: OnResult | None = None,
    on_incomplete: str | None = None,
) -> list[Attempt]:
    """`push` of run directories already found (`find_runs`)."""
    # An older evalpush stored what servers echoed as it was: scrub it of the key in use.
    app.ledger.scrub_secrets()
    return _Push(app, on_result, on_incomplete).run(found, wait=wait)


class _Push:
    def __init__(self, app: App, on_result: OnResult | None, on_incomplete: str | None):
        self._app = app
        self._on_result = on_result
        self._on_incomplete = on_incomplete
        self._results: dict[Path, Attempt] = {}
        self._told: set[Path] = set()
        self._waited_for: dict[Path, int] = {}
        self._failures: list[BaseException] = []
        self._refused: AuthError | None = None
        self._wait = True
        self._lock = threading.Lock()

    def run(self, found: list[Path], *, wait: bool) -> list[Attempt]:
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

    def _tell(self, result: Attempt) -> None:
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
        result = attempt(
            self._app,
            directory,
            waited_for=self._waited_for.get(directory),
            on_incomplete=self._on_incomplete,
            leave_followed=True,  # a daemon following it finalizes it once it is finished
        )
        if result.outcome == Outcome.KEY_REFUSED:
            self._refuse(AuthError(result.error or "no API key"))
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

    def _interrupted_if_busy(self, result: Attempt) -> Attempt:
        if result.busy is None or not self._app.stop.is_set():
            return result
        return msgspec.structs.replace(
            result, outcome=Outcome.INTERRUPTED, busy=None, error="interrupted while waiting for it"
        )

    def _refuse(self, exc: AuthError) -> None:
        """The platform refused the key (or there is none): nothing else can be sent, so the
        push stops; every run in flight keeps its progress."""
        with self._lock:
            if self._refused is None:
                self._refused = exc
        self._app.request_stop()
