"""The daemon's view of the runs under its roots: which are finished, which wait, and why.

Discover tells it where runs are (a scan's `RunDir`s, or one directory a hint points at); the
tracker decides what each one needs:

- a run whose trace file is as the ledger last saw it in a final state (finalized, skipped,
  failed, held) needs nothing: it is *settled* (`unsettled(paths)` leaves it out for the
  rescan, which then does not look inside its directory, and `settled(path)` says so to the
  watches, which drop its watch; the slow sweep, or a file event while it is still watched,
  shows it again with its facts now, compared with a dict lookup), no file opened, no row read;
- a run that is not finished yet is *waiting* (so is one whose config.toml cannot be read yet:
  the producer may still be writing it; config.toml is read again whenever its stat changes,
  and if it is still unreadable once the run settles or shows its marker, the uploader fails
  the run saying why): its complete lines are counted as they arrive
  (`runs.LineCounter`, reading only new bytes), `runs.readiness` decides, and the ledger keeps
  how far it is (`reason`) and when it settles (`settles_at`) for `status`. From its second
  look on, its new lines are also fed to a running scan (`feeder.Feeder`): when the run is
  ready, the scan's results go to the ledger with its queueing and its upload starts at
  resolve, reading the file once more, to push. A finalized run whose file grew or was
  replaced waits the same way (in memory only: the ledger keeps showing its
  finalized evaluation until the new one starts; its upload scans); a run whose trace file it
  may not read waits too, its reason naming the file (and one warning), until a rescan can read
  it;
- a run that is ready, or that the ledger has queued (`ready`: interrupted, or `evalpush
  retry`; `uploading` with its holder gone: a process killed mid-upload, whose claim the
  upload takes over), or that the uploader must look at first (a new path for a known run id: moved or
  copied; a config that cannot be read) is handed to `submit`, the scheduler's.

The tracker owns readiness: the maps of settled, waiting and in-flight runs, counting lines,
the settle/marker/expected-count rules, config.toml read again, the stand-in run id renamed when
the first line names the run. It hands the feeding to `feeder.Feeder` and the ledger writes of
a waiting run (found, progress, held, queued) to `progress.Progress`.

Threads: everything runs on the daemon's loop thread except `finished`, which upload workers
call; one lock guards the maps.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from pathlib import Path

import msgspec

from evalpush.config import Config
from evalpush.core import paths
from evalpush.core.errors import ClaimLost, LedgerRefused, RunError
from evalpush.core.ids import short_id
from evalpush.core.states import State
from evalpush.discover import Rescan, RunDir, look_at
from evalpush.ledger import Holder, Ledger, Process, RunRecord, holder_alive
from evalpush.log import get_logger
from evalpush.runs import (
    CONFIG_FILE,
    Line,
    LineCounter,
    ReadinessRules,
    Run,
    RunFacts,
    RunKind,
    config_file,
    derive_run_id,
    last_run_id,
    load_run,
    named_by_lines_later,
    readiness,
    traces_file,
)
from evalpush.service.feeder import Feeder
from evalpush.service.progress import ConfigFacts, Progress, Waiting
from evalpush.upload import still_there

FINAL_STATES = frozenset({State.FINALIZED, State.SKIPPED, State.FAILED, State.HELD})
QUEUED_STATES = frozenset({State.READY, State.UPLOADING})

Facts = int
"""A fingerprint of (device, inode, size, mtime_ns) of a trace file: what makes a rescan see a
change. One int (its 64-bit hash) in place of four, kept for every settled run."""


def _fingerprint(device: int, inode: int, size: int, mtime_ns: int) -> Facts:
    return hash((device, inode, size, mtime_ns))


def _facts(rundir: RunDir) -> Facts:
    return _fingerprint(rundir.device, rundir.inode, rundir.size, rundir.mtime_ns)


def _config_facts(directory: str) -> ConfigFacts | None:
    config = config_file(Path(directory))
    try:
        st = os.lstat(config if config is not None else os.path.join(directory, CONFIG_FILE))
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class Tracker:
    """What the daemon calls about the runs under its roots: `load` and `poll_ledger` from the
    ledger, `seen` and `look` from discover, `due` at settle times, `finished` from upload
    workers; ready and queued runs go to `submit`."""

    def __init__(
        self,
        ledger: Ledger,
        config: Config,
        submit: Callable[[str], object],
        *,
        alive: Callable[[Holder], bool] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._ledger = ledger
        self._config = config
        self._submit = submit
        self._clock = clock
        self._progress = Progress(
            ledger,
            config,
            alive=alive or (lambda holder: holder_alive(holder, Process.current(), clock())),
            clock=clock,
        )
        self._rules = ReadinessRules.from_config(config.runs)
        self._lock = threading.Lock()
        self._settled: dict[str, Facts] = {}  # path -> facts of a run that needs nothing now
        self._settled_changes = 0  # moves whenever a path comes into or leaves `_settled`
        self._waiting: dict[str, Waiting] = {}
        self._in_flight: set[str] = set()
        self._stretches: set[str] = set()  # followed runs whose next stretch is submitted
        self._log = get_logger(stage="tracker")

    # ------------------------------------------------------------ what the ledger knows

    def load(self) -> None:
        """Start from the ledger: runs in a final state are settled at the file facts it
        recorded (a page of them at a time, no row objects); queued ones are submitted."""
        settled: dict[str, Facts] = {}
        for page in self._ledger.file_facts(FINAL_STATES):
            for raw, device, inode, size, mtime_ns in page:
                settled[os.fsdecode(raw)] = _fingerprint(device, inode, size, mtime_ns)
        with self._lock:
            self._settled = settled
            self._settled_changes += 1
        self.poll_ledger()

    def poll_ledger(self) -> None:
        """Submit what the ledger has queued and nobody holds: a run interrupted by a stop or
        a crash, one `evalpush retry` put back."""
        for record in self._ledger.in_state(*QUEUED_STATES):
            # A shared ledger's path may be another host's mount of the tree: a run this host
            # sees elsewhere is handed over by its own look at it (a new path for the run id).
            if record.following and record.state == State.UPLOADING:
                continue  # a stretch's, its process gone: still written, the looks decide
            if not self._progress.held(record) and os.path.isdir(record.path_raw):
                self._hand_over(os.fsdecode(record.path_raw))

    # ------------------------------------------------------------ what discover found

    def seen(self, rundirs: dict[str, RunDir]) -> None:
        """Run directories found by a rescan or by a hint's look at a subtree."""
        for path, rundir in rundirs.items():
            self.look(path, rundir)

    def rescanned(self, rescan: Rescan, known: Callable[[str], bool]) -> None:
        """What (a part of) a rescan found: the run directories it looked at, and those gone
        since; once the first is `complete`, a run the scanner does not know (`known`) is gone."""
        for path in rescan.gone:
            self.look(path, None)
        if rescan.complete:
            with self._lock:
                for held in (self._waiting, self._settled):
                    for path in [p for p in held if not known(p)]:
                        del held[path]
                self._settled_changes += 1
        self.seen(rescan.runs)

    @property
    def settled_changes(self) -> int:
        """A count that moves whenever a run becomes or stops being settled (the scanner asks
        `unsettled` again only then)."""
        return self._settled_changes

    def unsettled(self, paths: AbstractSet[str]) -> AbstractSet[str]:
        """Of these run directories, those that are not settled (a rescan looks inside them):
        one set difference, however many are settled."""
        with self._lock:
            return paths - self._settled.keys()

    def _settle(self, path: str, facts: Facts) -> None:
        """`path` settled at `facts` (under the lock)."""
        if path not in self._settled:
            self._settled_changes += 1
        self._settled[path] = facts

    def _unsettle(self, path: str) -> None:
        """`path` not settled any more (under the lock)."""
        if path in self._settled:
            del self._settled[path]
            self._settled_changes += 1

    def settled(self, path: str) -> bool:
        """Whether the run at `path` needs nothing until its trace file changes (its directory
        need not be watched)."""
        # No lock: one dict lookup is atomic.
        return path in self._settled

    def look(self, path: str, rundir: RunDir | None) -> None:
        """One run directory, as it is now (None: gone, or not a run directory any more)."""
        with self._lock:
            if path in self._in_flight:
                return
            if rundir is None:
                gone = self._waiting.pop(path, None)
                self._unsettle(path)
                if gone is not None and gone.followed_to:
                    self._log.warning(
                        "followed run gone from its directory: no longer followed; its "
                        "evaluation stays open with the samples sent so far",
                        run=gone.run_id,
                        path=paths.display(path),
                    )
                return
            if self._settled.get(path) == _facts(rundir):
                # Keyed by the scanner's str from now on: the copy of the path read from the
                # ledger is let go, so a settled run's path is held once.
                self._settled[path] = self._settled.pop(path)
                return
            waiting = self._waiting.get(path)
        try:
            if waiting is not None:
                self._decide(path, waiting, rundir)
            else:
                self._first_look(path, rundir)
        except LedgerRefused as exc:
            self.refused(path, exc)

    def due(self) -> float:
        """Decide again for every waiting run whose settle time has come, or whose progress
        waits to be written; returns when the next one is due (infinity when none waits)."""
        now = self._clock()
        with self._lock:
            due = [(p, w) for p, w in self._waiting.items() if w.due_at() <= now]
        for path, waiting in due:
            try:
                self._decide(path, waiting, look_at(path, self._rules.marker))
            except LedgerRefused as exc:
                self.refused(path, exc)
        with self._lock:
            return min((w.due_at() for w in self._waiting.values()), default=float("inf"))

    # ------------------------------------------------------------ deciding

    def _first_look(self, path: str, rundir: RunDir) -> None:
        run_id = derive_run_id(Path(path), known=self._ledger.run_id_at)
        record = self._ledger.get_run(run_id) or self._renamed(path, run_id)
        if record is None:
            self._discovered(path, rundir)
        elif self._progress.held(record):
            return  # another process (or this one's worker) has it; the next look decides
        elif record.path_raw == paths.raw(path) and (
            record.state == State.WAITING or (record.following and record.state == State.UPLOADING)
        ):
            # Waiting, followed or not; a stretch whose process is gone waits too (the run is
            # still being written), and its next stretch takes the claim over.
            followed_to = record.acked_offset if record.following else 0
            self._start_waiting(path, rundir, in_ledger=True, followed_to=followed_to)
        elif self._moved_while_followed(path, record):
            self._start_waiting(path, rundir, in_ledger=True, followed_to=record.acked_offset)
        elif record.path_raw != paths.raw(path) or record.state in QUEUED_STATES:
            self._hand_over(path)  # moved, copied, interrupted or retried: the uploader decides
        elif record.state == State.FINALIZED and _changed(record, rundir):
            # At most one new evaluation per settle period while the file keeps changing.
            again_after = (record.finalized_at or 0.0) + self._rules.settle_seconds
            self._log.info(
                "finalized run changed: it uploads again once ready",
                run=record.run_id,
                path=paths.display(path),
                not_before_seconds=max(0, round(again_after - self._clock())),
            )
            self._start_waiting(path, rundir, in_ledger=False, again_after=again_after)
        else:
            with self._lock:
                self._settle(path, _facts(rundir))

    def _moved_while_followed(self, path: str, record: RunRecord) -> bool:
        """A followed run (waiting between stretches, its evaluation open) whose directory was
        moved to `path` while it is written: its row takes the new path and it is followed on
        from there. Handed over instead, it was uploaded as a finished run at once: finalized
        short of its lines, and a second evaluation of it made once it was finished."""
        if not (record.following and record.state == State.WAITING):
            return False
        if still_there(record, self._ledger):
            return False  # still where the ledger knows it: this is a copy (the uploader says)
        try:
            self._ledger.update(record, path=Path(path))
        except ClaimLost:
            return False  # another process took it on: the next look decides
        self._log.info(
            "followed run moved: followed on from its new path",
            run=record.run_id,
            was=record.path,
            path=paths.display(path),
        )
        return True

    def _renamed(self, path: str, run_id: str) -> RunRecord | None:
        """The run at `path` recorded waiting under a stand-in id before its first line named
        it (by a daemon stopped since), renamed to `run_id`; None if there is none."""
        stand_in = self._ledger.run_id_at(Path(path))
        record = self._ledger.get_run(stand_in) if stand_in and stand_in != run_id else None
        if record is None or record.state != State.WAITING or record.evaluation_id is not None:
            return None
        return self._ledger.rename(record, run_id)

    def _discovered(self, path: str, rundir: RunDir) -> None:
        """A run the ledger has never seen: one that is not an eval run goes to the uploader
        (which records why it is not uploaded); an eval run waits, and so does one whose
        config.toml cannot be read yet (the producer may be writing it)."""
        self._start_waiting(path, rundir, in_ledger=False, new=True)

    def _start_waiting(
        self,
        path: str,
        rundir: RunDir,
        *,
        in_ledger: bool,
        new: bool = False,
        again_after: float | None = None,
        followed_to: int = 0,
    ) -> None:
        config = _config_facts(path)
        run, problem = _load(path, self._ledger)
        if run is not None and run.kind != RunKind.EVAL:
            self._hand_over(path)  # a debug or replay run: the uploader records the skip
            return
        traces = run.traces_path if run is not None else traces_file(Path(path))
        if traces is None:
            return  # no longer a run directory
        counter = LineCounter(
            traces, clock=self._clock, max_line_bytes=self._config.read.max_line_bytes
        )
        run_id = (
            run.run_id
            if run is not None
            else derive_run_id(Path(path), known=self._ledger.run_id_at)
        )
        waiting = Waiting(
            run_id,
            run,
            problem,
            config,
            counter,
            in_ledger,
            again_after=again_after,
            followed_to=followed_to,
        )
        waiting.stand_in = named_by_lines_later(Path(path))
        with self._lock:
            self._waiting[path] = waiting
            # A finalized run that changed waits like any other: not settled meanwhile, so the
            # rescans look at it and its directory is watched again.
            self._unsettle(path)
        self._decide(path, waiting, rundir, new=new, first=True)

    def _read_config_again(self, path: str, waiting: Waiting) -> bool:
        """Read config.toml again if it changed since it was read (one lstat): a producer may
        have been writing it (not TOML yet, or still empty: no num_tasks). False when the run
        turned out not to be an eval run (it is handed to the uploader)."""
        config = _config_facts(path)
        if config == waiting.config:
            return True
        run, problem = _load(path, self._ledger)
        if run is not None and run.kind != RunKind.EVAL:
            self._forget(path)
            self._hand_over(path)
            return False
        waiting.run, waiting.problem, waiting.config = run, problem, config
        return True

    def _decide(
        self,
        path: str,
        waiting: Waiting,
        rundir: RunDir | None,
        *,
        new: bool = False,
        first: bool = False,
    ) -> None:
        """Count what arrived, ask readiness; hand over a ready run, record a waiting one.

        A run whose config.toml cannot be read is ready by the marker or the settle rule only
        (its expected count is unknown); the uploader then records why it cannot be uploaded.

        The first look only counts: a run found finished (the daemon's first scan, a run
        written while it was down) is scanned by its upload, on an upload worker. A run seen
        waiting gets a `Feeder` at its next look, fed by a counter of its own from byte 0."""
        try:
            # A followed run's lines go through a sink that keeps nothing, so that its counter
            # sees a rewrite in place (`LineCounter`): the stretch that finds it starts over.
            count = waiting.counter.update(_UNKEPT if self._follows(waiting) else None)
        except PermissionError:
            if not self._progress.unreadable(path, waiting, new=new):
                self._forget(path)
            return
        except OSError:
            rundir = None
        if rundir is None:  # gone, or no longer a run directory
            self._forget(path)
            return
        if not self._read_config_again(path, waiting):
            return
        if waiting.stand_in and count.lines and not self._named(path, waiting):
            return
        expected = waiting.run.expected_traces if waiting.run is not None else None
        facts = RunFacts(
            count.lines, expected, rundir.marker, count.mtime, count.grown_at, waiting.again_after
        )
        now = self._clock()
        decided = readiness(facts, now, self._rules)
        follows = self._follows(waiting)
        if not first and waiting.run is not None and not follows:
            if waiting.feeder is None:
                waiting.feeder = Feeder(waiting.counter.path, self._config, clock=self._clock)
            waiting.feeder.feed(count, ready=decided.ready)
        if decided.ready:  # short of its expected traces or not: its upload attempt decides
            self._forget(path)
            self._ready(path, waiting, decided.reason, new=new)
            return
        waiting.settles_at = decided.settles_at
        waiting.seen_to = count.offset
        progress = decided.progress
        if waiting.problem:
            progress = f"{progress}; {waiting.problem}"
        if not self._progress.waits(path, waiting, progress, now, new=new):
            self._forget(path)
        elif self._follows(waiting):  # a new run is in the ledger from here on
            self._follow(path, waiting, now)

    # ------------------------------------------------------------ following

    @property
    def follows_runs(self) -> bool:
        """Whether this daemon follows runs while they are written at all (`runs.follow`, and
        not `convert.on_bad_line = "hold"`, which sends nothing of a run before every line was
        checked)."""
        return self._config.runs.follow and self._config.convert.on_bad_line != "hold"

    def _follows(self, waiting: Waiting) -> bool:
        """Whether the waiting run is followed (`follows_runs`): an eval run with a
        readable config naming its environment, in the ledger, named (not a stand-in id), whose
        eval does not push it itself, and not a finalized run that changed (its row shows the
        evaluation the platform holds until the new upload starts)."""
        run = waiting.run
        return (
            self.follows_runs
            and run is not None
            and run.kind == RunKind.EVAL
            and bool(run.env_name)
            and not run.pushes_itself
            and waiting.in_ledger
            and not waiting.stand_in
            and waiting.again_after is None
        )

    def _follow(self, path: str, waiting: Waiting, now: float) -> None:
        """Ask for the followed run's next stretch once its lines not yet sent fill a batch
        (`upload.max_batch_bytes`) or the first of them is `runs.follow_batch_seconds` old;
        one stretch at a time. A file shorter than what the platform holds of it was replaced
        or truncated (a resumed eval): its stretch is asked for too (it closes the old evaluation
        out and follows the new file), not only once the new file outgrows the old one."""
        if waiting.seen_to == waiting.followed_to:
            waiting.unsent_since, waiting.stretch_due = None, float("inf")
            return
        if waiting.unsent_since is None:
            waiting.unsent_since = now
        if waiting.stretch:
            return
        waiting.stretch_due = waiting.unsent_since + self._config.runs.follow_batch_seconds
        full = waiting.seen_to - waiting.followed_to >= self._config.upload.max_batch_bytes
        if full or now >= waiting.stretch_due:
            waiting.stretch, waiting.stretch_due = True, float("inf")
            waiting.stretch_from = waiting.unsent_since
            with self._lock:
                self._stretches.add(path)
            self._submit(path)

    def job(self, path: str) -> bool:
        """What the scheduler's job for `path` is: True for a stretch of a followed run (asked
        for, and the run not handed over since: its upload takes in everything), False for its
        upload."""
        with self._lock:
            stretch = path in self._stretches
            self._stretches.discard(path)
            return stretch and path not in self._in_flight

    def followed(self, path: str, record: RunRecord | None) -> float | None:
        """A stretch of the run at `path` ended (upload workers call this) with its row as
        `record`: waiting and followed, it goes on from where the platform has its lines;
        anything else (another process moved it on, it failed) is looked at afresh. The caller
        has the run looked at next (lines came while it was sent). Returns how long ago the
        oldest line it sent was first seen, when it sent them."""
        with self._lock:
            waiting = self._waiting.get(path)
            if waiting is None:
                return None
            waiting.stretch = False
            followed = (
                record is not None
                and record.state == State.WAITING
                and record.following
                and record.path_raw == paths.raw(path)
            )
            if not followed:
                del self._waiting[path]
                return None
            assert record is not None
            sent = record.acked_offset > waiting.followed_to
            lag = self._clock() - waiting.stretch_from if sent and waiting.stretch_from else None
            # Lines written while it was sent are counted at the look the caller asks for:
            # their batch period starts then.
            waiting.followed_to = record.acked_offset
            waiting.unsent_since, waiting.stretch_due = None, float("inf")
            return lag

    @property
    def following(self) -> int:
        """How many runs are followed now (in the ledger with their evaluation open)."""
        with self._lock:
            return sum(1 for w in self._waiting.values() if w.followed_to)

    def _named(self, path: str, waiting: Waiting) -> bool:
        """The run's first line is in: the run takes the id it carries in place of the stand-in
        it was found under (and its row in the ledger with it). False when the row could not be
        renamed (another process holds it, or knows the run by that id): the next look decides
        afresh."""
        run_id = last_run_id(Path(path))
        if run_id is None or run_id == waiting.run_id:
            waiting.stand_in = run_id is None
            return True
        if waiting.in_ledger:
            record = self._ledger.get_run(waiting.run_id)
            if record is None or self._ledger.rename(record, run_id) is None:
                self._forget(path)
                return False
        self._log.info("run named by its first line", run=run_id, stand_in=short_id(waiting.run_id))
        waiting.run_id, waiting.stand_in = run_id, False
        if waiting.run is not None:
            waiting.run = msgspec.structs.replace(waiting.run, run_id=run_id)
        return True

    def _ready(self, path: str, waiting: Waiting, reason: str, *, new: bool) -> None:
        self._log.info("run is ready", run=waiting.run_id, path=paths.display(path), why=reason)
        if self._progress.queue(path, waiting, reason, new=new):
            self._hand_over(path)

    def _forget(self, path: str) -> None:
        """Drop a waiting run: its next look starts afresh (from its row, if it has one)."""
        with self._lock:
            self._waiting.pop(path, None)

    def _hand_over(self, path: str) -> None:
        with self._lock:
            if path in self._in_flight:
                return
            self._in_flight.add(path)
            self._waiting.pop(path, None)
            self._unsettle(path)
        self._submit(path)

    # ------------------------------------------------------------ what an upload came to

    def finished(self, path: str, record: RunRecord | None, *, leave_alone: bool = False) -> bool:
        """An upload job for `path` ended (upload workers call this). A run left in a final
        state is settled at the file facts the ledger recorded for it (or, for a copy or a run
        that never got that far, at its file as it is now), and so is one to `leave_alone`
        (the ledger cannot record it, or its run id is another run's) until its file changes;
        anything else is looked at again by the next rescan or ledger poll. True when the run's
        file changed while it uploaded: its file event was passed over, so the caller should
        have it looked at now."""
        settled: Facts | None = None
        changed = False
        if leave_alone:
            rundir = look_at(path, self._rules.marker)
            settled = _facts(rundir) if rundir is not None else None
        elif record is not None and record.state in FINAL_STATES:
            rundir = look_at(path, self._rules.marker)
            if record.path_raw == paths.raw(path) and record.file_inode is not None:
                settled = _fingerprint(
                    record.file_device or 0,
                    record.file_inode,
                    record.file_size or 0,
                    record.file_mtime_ns or 0,
                )
                if rundir is not None and _facts(rundir) != settled:
                    # Changed while it uploaded (its file event came while it was in flight):
                    # not settled, so the next rescan looks at it instead of skipping it.
                    settled, changed = None, True
            else:
                settled = _facts(rundir) if rundir is not None else None
        with self._lock:
            self._in_flight.discard(path)
            if settled is not None:
                self._settle(path, settled)
        return changed

    def refused(self, path: str, exc: LedgerRefused) -> None:
        """The ledger cannot record the run at `path` (a value its database cannot hold): it is
        said, and left alone until its trace file changes; the other runs go on."""
        self._log.error(
            "run cannot be uploaded: the ledger cannot record it; the other runs go on",
            path=paths.display(path),
            error=paths.printable(str(exc)),
        )
        rundir = look_at(path, self._rules.marker)
        with self._lock:
            self._waiting.pop(path, None)
            if rundir is not None:
                self._settle(path, _facts(rundir))

    @property
    def waiting(self) -> int:
        with self._lock:
            return len(self._waiting)


class _Unkept:
    """A `runs.LineSink` that keeps nothing."""

    def restart(self) -> None:
        pass

    def line(self, line: Line) -> None:
        pass


_UNKEPT = _Unkept()


def _load(path: str, ledger: Ledger) -> tuple[Run | None, str]:
    """The run at `path` (with the run id the ledger knows for it), or None and why its
    config.toml cannot be read."""
    try:
        return load_run(Path(path), known=ledger.run_id_at), ""
    except RunError as exc:
        return None, paths.printable(str(exc))


def _changed(record: RunRecord, rundir: RunDir) -> bool:
    recorded = (record.file_device, record.file_inode, record.file_size, record.file_mtime_ns)
    return recorded != (rundir.device, rundir.inode, rundir.size, rundir.mtime_ns)


__all__ = ["Tracker"]
