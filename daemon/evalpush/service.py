"""The service: wires the stages together and owns every thread and the stop signal.

`Service` opens the ledger, builds the one platform client, the shared connectivity gate and
retry policy, and the uploader; `push` uploads a set of run directories with up to
`upload.max_concurrent_runs` at once. SIGTERM/SIGINT set `stop`: waiting retries end with
`Interrupted`, the request in flight is cut off within a fraction of a second (its outcome is
then unknown: the ledger's intent makes the next start reconcile it), the ledger keeps the
progress, and the next start resumes there.

Other processes may push from the same state directory at the same time. A run one of them
holds is not touched: `push` first uploads every run nobody holds, then waits for the held ones
(polling the ledger, stop-aware) and reports the outcome their holder reached, or takes the run
over if its holder went away before finishing it. With `wait=False` it reports them as busy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from evalpush import paths
from evalpush.config import Config
from evalpush.errors import AuthError, Busy, ClaimLost, Interrupted, RunError
from evalpush.ledger import Ledger, RunRecord, State, default_path
from evalpush.platform import PlatformClient
from evalpush.retry import Gate, Retrier
from evalpush.runs import derive_run_id, find_run_dirs, load_run
from evalpush.upload import Progress, Uploader


@dataclass(frozen=True, slots=True)
class PushResult:
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


WAIT_POLL_SECONDS = 0.25
"""How often `push` looks at the ledger while another process uploads a run it was given."""

GIL_SWITCH_SECONDS = 0.001
"""While one thread converts the next batch, the thread sending the current one needs the GIL
back after every socket and SQLite call; the default 5 ms hand-over made each batch's
bookkeeping wait behind the converter (measured: the 72 MB push's push step 1.5 s -> 1.3 s)."""


class Service:
    """The wired pipeline. Use as a context manager; it closes what it opened."""

    def __init__(
        self,
        config: Config,
        *,
        progress: Progress | None = None,
        wait_on_auth: bool = True,
        environ: Mapping[str, str] | None = None,
        home: Path | None = None,
    ):
        """`environ` and `home` replace the process environment and home directory as the
        places credentials are read from (the demo isolates itself with them)."""
        self.config = config
        self.stop = threading.Event()
        sys.setswitchinterval(GIL_SWITCH_SECONDS)
        self.ledger = Ledger(default_path(config.state_dir))
        try:
            self.client = PlatformClient(
                config.platform, environ=environ, home=home, stop=self.stop
            )
        except BaseException:
            self.ledger.close()
            raise
        self.gate = Gate()
        self.retrier = Retrier(self.client, self.gate, self.stop, wait_on_auth=wait_on_auth)
        self.uploader = Uploader(
            config, self.ledger, self.client, self.retrier, progress=progress or _no_progress
        )

    def close(self) -> None:
        assert self.uploader.claims is not None
        self.uploader.claims.close()
        self.client.close()
        self.ledger.close()

    def __enter__(self) -> Service:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def stop_on_signals(self) -> Iterator[None]:
        """SIGTERM and SIGINT request a clean stop while the block runs (main thread only)."""

        def request_stop(signum: int, _frame: FrameType | None) -> None:
            self.stop.set()
            self.gate.wake()

        previous = {s: signal.signal(s, request_stop) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def push(self, directories: Sequence[Path], *, wait: bool = True) -> list[PushResult]:
        """Upload every eval run found in `directories`, as finished now. Runs other processes
        hold are waited for (or, with `wait=False`, reported busy)."""
        found = [run_dir for directory in directories for run_dir in find_run_dirs(directory)]
        results = dict(zip(found, self._push_all({d: None for d in found}), strict=True))
        while wait and not self.stop.is_set():
            busy = {path: r.busy.pid for path, r in results.items() if r.busy is not None}
            if not busy:
                break
            released = {path: busy[path] for path in self._wait_for_release(list(busy))}
            results.update(zip(released, self._push_all(released), strict=True))
        return [self._interrupted_if_busy(result) for result in results.values()]

    def _push_all(self, directories: dict[Path, int | None]) -> list[PushResult]:
        """Push each directory; its value is the pid of the process this push waited for."""
        workers = min(self.config.upload.max_concurrent_runs, max(len(directories), 1))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="upload") as pool:
            return list(pool.map(self._push_one, directories, directories.values()))

    def _wait_for_release(self, busy: list[Path]) -> list[Path]:
        """Poll the ledger until at least one of the `busy` runs is held by nobody alive;
        returns those. Returns early (nothing) once a stop is requested."""
        assert self.uploader.claims is not None
        while not self.stop.wait(WAIT_POLL_SECONDS):
            released = []
            for directory in busy:
                record = self.ledger.get_run(derive_run_id(directory))
                holder = record.holder if record is not None else None
                if holder is None or not self.uploader.claims.alive(holder):
                    released.append(directory)
            if released:
                return released
        return []

    def _interrupted_if_busy(self, result: PushResult) -> PushResult:
        if result.busy is None or not self.stop.is_set():
            return result
        return dataclasses.replace(result, busy=None, error="interrupted while waiting for it")

    def _push_one(self, directory: Path, waited_for: int | None = None) -> PushResult:
        """`waited_for`: the pid of another process that held the run until now; its outcome
        is reported as is (a failed run is not retried), unless it left the run unfinished."""
        if self.stop.is_set():
            return PushResult(directory, self._row(directory), 0, "interrupted")
        try:
            run = load_run(directory)
        except RunError as exc:
            return self._unloadable(directory, exc)
        before = self.ledger.get_run(run.run_id)
        try:
            record = self.uploader.upload(run, retry_failed=waited_for is None)
        except Busy as exc:
            return PushResult(directory, self._row(directory), 0, busy=exc)
        except Interrupted:
            return PushResult(
                directory, self._row(directory), 0, "interrupted; push again to resume"
            )
        except (AuthError, ClaimLost) as exc:
            return PushResult(directory, self._row(directory), 0, str(exc))
        return self._result(directory, before, record, waited_for)

    def _result(
        self,
        directory: Path,
        before: RunRecord | None,
        record: RunRecord,
        waited_for: int | None,
    ) -> PushResult:
        """What the upload of `directory` came to (`before`: its row before it)."""
        set_aside = len(self.ledger.set_aside(record))
        error = record.last_error if record.state == State.FAILED else None
        if record.state == State.HELD:
            error = record.reason
        # The outcome is the other process's unless this one went on to upload (a new attempt).
        theirs = (
            waited_for is not None and before is not None and record.attempts == before.attempts
        )
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

    def _row(self, directory: Path) -> RunRecord | None:
        return self.ledger.get_run(derive_run_id(directory))

    def _unloadable(self, directory: Path, exc: RunError) -> PushResult:
        """A run whose config cannot be read still shows in `status`, failed, with why."""
        try:
            record = self.uploader.fail(directory, exc)
        except Busy as busy:
            return PushResult(directory, self._row(directory), 0, str(exc), busy=busy)
        return PushResult(directory, record, 0, str(exc))


def _no_progress(_record: RunRecord) -> None:
    pass


__all__ = ["PushResult", "Service"]
