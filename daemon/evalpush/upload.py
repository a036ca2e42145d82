"""The upload stage: one run's state machine, scan -> resolve -> create -> push -> finalize.

A run is uploaded only under its claim (`evalpush.claims`): taken before anything is read or
sent, released on every way out Python sees; every ledger write is fenced by it. A run another
live process holds is left alone (`Busy`); one whose holder is gone is taken over and resumed
exactly as after a crash, from what its row records (an intent is reconciled with a read).

Exactly once, step by step (docs/ARCHITECTURE.md tells the whole protocol):
- scan: one cheap pass over the trace file fixes the byte range to upload, its fingerprint
  (a SHA-256 of that range), its totals (the create and finalize metrics) and the bad lines,
  all recorded before anything is sent; the file is checked against the fingerprint before each
  batch and when an upload resumes, so an evaluation never holds samples of two files;
- resolve: replayable (get-or-create), so it is simply retried;
- create: the intent is recorded before the request and the evaluation id after it. Before it,
  for a run id the ledger never saw, after an ambiguous failure or a crash in between, or when
  the eval may have pushed itself, the platform is searched for one whose `metadata.run_id`
  matches (and is not an earlier evaluation of this run), which is adopted instead of creating
  a second (`evalpush.lookup`);
- push: each batch's byte range is recorded before it is sent and the acknowledged offset after;
  an ambiguous failure or a crash in between is reconciled by listing the evaluation's sample
  ids, and only samples not already stored are sent;
- finalize: intent first; after an ambiguous failure the evaluation's status decides, and a 409
  (already finalized) counts as done.
The ledger moves only on the platform's acknowledgement.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from evalpush import paths
from evalpush.batch import BAD_LINE, REJECTED, Batch, Prefetch, batches
from evalpush.claims import Claims
from evalpush.config import Config
from evalpush.convert import RunTotals, convert_lines, scan, summary
from evalpush.errors import (
    Ambiguous,
    AuthError,
    BatchRefused,
    Conflict,
    Gone,
    Interrupted,
    LedgerError,
    Refused,
    RunError,
)
from evalpush.ledger import Ledger, RunRecord, SetAsideRecord, State, Step
from evalpush.log import get_logger
from evalpush.lookup import EvaluationIndex, evaluation_id
from evalpush.platform import PlatformClient, is_finalized, most_samples_stored
from evalpush.read import (
    Change,
    FileChangedError,
    FileIdentity,
    Fingerprint,
    RangeDigest,
    digest_of,
    identity,
    read_lines,
    verify,
)
from evalpush.retry import Retrier
from evalpush.runs import Run, RunKind, derive_run_id, is_run_dir, require_env_name

Progress = Callable[[RunRecord], None]

CRASH_ENV = "EVALPUSH_CRASH_AT"
"""Crash-test hook: `<point>` or `<point>:<n>` makes the process SIGKILL itself the n-th time it
passes that point (points: create-sent, batch-intent, batch-sent, batch-acked, finalize-sent).
Lets the crash tests die exactly between a request and the ledger write that records it."""


def _crash_point(point: str) -> None:
    wanted = os.environ.get(CRASH_ENV)
    if not wanted:
        return
    name, _, count = wanted.partition(":")
    if name != point:
        return
    _crash_counts[point] = seen = _crash_counts.get(point, 0) + 1
    if seen >= int(count or 1):
        os.kill(os.getpid(), signal.SIGKILL)


_crash_counts: dict[str, int] = {}


@dataclass
class Uploader:
    """Uploads runs; shared by every worker thread (the ledger and client are thread-safe)."""

    config: Config
    ledger: Ledger
    client: PlatformClient
    retrier: Retrier
    progress: Progress = lambda record: None
    clock: Callable[[], float] = time.time
    claims: Claims | None = None
    evaluations: EvaluationIndex | None = None
    _locks: dict[str, threading.Lock] = field(default_factory=dict)
    _locks_guard: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.claims is None:
            self.claims = Claims(self.ledger)
        if self.evaluations is None:
            self.evaluations = EvaluationIndex(self.client, self._replayable)

    # ------------------------------------------------------------ entry points

    def upload(self, run: Run, *, retry_failed: bool = True) -> RunRecord:
        """Take `run` as far as it can go now, under its claim; returns its ledger row
        afterwards (held by nobody). `Busy` if another live process holds the run."""
        return self._under_claim(
            run.run_id, run.path, run.kind, lambda claimed: self._work(claimed, run, retry_failed)
        )

    def fail(self, directory: Path, error: RunError) -> RunRecord:
        """Record a run directory that cannot even be loaded as failed, with why (under its
        claim, like any write to a run)."""
        return self._under_claim(
            derive_run_id(directory),
            directory,
            RunKind.EVAL,
            lambda claimed: self.ledger.update(claimed, state=State.FAILED, last_error=str(error)),
        )

    def _under_claim(
        self, run_id: str, path: Path, kind: str, work: Callable[[RunRecord], RunRecord]
    ) -> RunRecord:
        """`work(run)` while this process holds the run's claim, released on every way out;
        the per-run lock keeps this process's own threads to one claim of a run at a time."""
        assert self.claims is not None
        with self._run_lock(run_id):
            claimed, gone = self.claims.take(run_id=run_id, path=path, kind=kind)
            if gone is not None:
                get_logger(run=run_id).warning(
                    "took over the claim of a process that is gone: resuming from the ledger, "
                    "reconciling with the platform",
                    pid=gone.pid,
                    host=gone.host,
                    step=claimed.step,
                    pending=claimed.pending,
                )
            try:
                record = work(claimed)
            except BaseException:
                self._release_after_failure(claimed)
                raise
            return self.claims.release(record)

    def _release_after_failure(self, claimed: RunRecord) -> None:
        """Release on the way out of a failure, without hiding the failure."""
        assert self.claims is not None
        try:
            self.claims.release(claimed)
        except LedgerError as exc:
            get_logger(run=claimed.run_id).warning(
                "could not release the run's claim: it is taken over once this process exits",
                error=str(exc),
            )

    def _run_lock(self, key: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(key, threading.Lock())

    def _work(self, record: RunRecord, run: Run, retry_failed: bool) -> RunRecord:
        record = self._admit(record, run, retry_failed)
        if record.state != State.UPLOADING:
            return record
        log = get_logger(run=run.run_id, path=paths.display(run.path))
        try:
            while record.step != Step.DONE and record.state == State.UPLOADING:
                record = self._advance(record, run)
        except (RunError, Refused) as exc:
            log.warning("upload failed", error=str(exc))
            record = self.ledger.update(record, state=State.FAILED, last_error=str(exc))
        except Interrupted:
            self.ledger.update(
                record, state=State.READY, reason=f"interrupted; resumes at {record.step}"
            )
            raise
        except AuthError as exc:
            self.ledger.update(
                record,
                state=State.READY,
                reason="waiting for a working API key",
                last_error=str(exc),
            )
            raise
        return record

    def _admit(self, record: RunRecord, run: Run, retry_failed: bool) -> RunRecord:
        if record.path_raw != paths.raw(run.path):
            if self._still_there(record):
                return record  # a copy of a run that is still where the ledger knows it
            get_logger(run=run.run_id).info(
                "run moved", was=record.path, now=paths.display(run.path)
            )
            record = self.ledger.update(record, path=run.path)
        skip = self._skip_reason(run)
        if skip:
            return self.ledger.update(record, state=State.SKIPPED, reason=skip)
        record = self._check_file(record, run)
        if record.state == State.FINALIZED:
            return record
        if record.state == State.HELD and not record.release_hold:
            return record
        if record.state == State.FAILED and not retry_failed:
            return record
        return self.ledger.update(
            record, state=State.UPLOADING, reason="", attempts=record.attempts + 1, last_error=None
        )

    @staticmethod
    def _still_there(record: RunRecord) -> bool:
        """Whether the run is still at the path the ledger knows (then another directory with
        its run id is a copy, not the run moved)."""
        directory = record.directory
        return is_run_dir(directory) and derive_run_id(directory) == record.run_id

    def _skip_reason(self, run: Run) -> str:
        if run.kind == RunKind.DEBUG:
            return "debug run (config has script_path or command): never uploaded"
        if run.kind == RunKind.REPLAY and not self.config.runs.upload_replays:
            return "replay run: set runs.upload_replays = true to upload replays"
        return ""

    # ------------------------------------------------------------ the trace file changes

    def _check_file(
        self, record: RunRecord, run: Run, *, restart_as: str = State.READY
    ) -> RunRecord:
        """Supersede a finalized run whose file changed; cancel an upload whose file was replaced
        or rewritten (it starts over from scan in state `restart_as`) or deleted (it fails). A
        file that only moved or was touched keeps its upload, with its new identity recorded."""
        known = _fingerprint(record)
        if known is None:
            return record
        change, now = verify(run.traces_path, known)
        if record.state == State.FINALIZED:
            if change in (Change.GROWN, Change.REPLACED):
                get_logger(run=run.run_id).info("run changed after finalize: new evaluation")
                return self.ledger.restart(record, outcome="superseded")
        elif change in (Change.GONE, Change.REPLACED):
            return self._file_replaced(record, run, change, restart_as)
        if change == Change.GONE or now is None:
            return record
        return self._note_identity(record, run, now)

    def _note_identity(self, record: RunRecord, run: Run, now: FileIdentity) -> RunRecord:
        """Record where the same bytes are now (a move, a touch), so the next look is a stat;
        a row from before fingerprints gets its digest here, once. The size stays the scanned
        one: a file that grew since must still look grown."""
        known = _fingerprint(record)
        assert known is not None
        if dataclasses.replace(now, size=known.identity.size) == known.identity and known.digest:
            return record
        digest = known.digest or digest_of(run.traces_path, known.end, expect=now)
        return self.ledger.update(
            record,
            file_device=now.device,
            file_inode=now.inode,
            file_mtime_ns=now.mtime_ns,
            file_ctime_ns=now.ctime_ns,
            file_digest=digest,
        )

    def _file_replaced(
        self, record: RunRecord, run: Run, change: Change, restart_as: str
    ) -> RunRecord:
        if change == Change.GONE:
            message = f"{run.traces_path}: the run's trace file was deleted mid-upload"
            self._cancel(record, message)
            record = self.ledger.restart(record, outcome="cancelled")
            return self.ledger.update(record, state=State.FAILED, last_error=message)
        get_logger(run=run.run_id).warning(
            "trace file replaced or rewritten mid-upload: the open evaluation is cancelled and "
            "the run uploads again from the start"
        )
        self._cancel(record, "the run's trace file was replaced (resumed eval)")
        return self.ledger.restart(record, outcome="cancelled", state=restart_as)

    def _cancel(self, record: RunRecord, message: str) -> None:
        if record.evaluation_id is None or record.step == Step.DONE:
            return
        try:
            self.retrier.call(
                lambda: self.client.close_out(
                    record.evaluation_id, "CANCELLED", error_message=message
                ),
                replayable=True,
                what="close out",
                run=record.run_id,
            )
        except (Conflict, Gone):
            pass  # already closed, or deleted: either way it takes no more samples

    def _advance(self, record: RunRecord, run: Run) -> RunRecord:
        step = {
            Step.SCAN: self._scan,
            Step.RESOLVE: self._resolve,
            Step.CREATE: self._create,
            Step.PUSH: self._push,
            Step.FINALIZE: self._finalize,
        }[record.step]
        try:
            return step(record, run)
        except (Gone, Conflict) as exc:
            if record.evaluation_id is None:
                raise
            outcome = "deleted" if isinstance(exc, Gone) else "closed"
            get_logger(run=run.run_id).warning(
                "evaluation gone from the platform: starting a new one",
                evaluation=record.evaluation_id,
                error=str(exc),
            )
            return self.ledger.restart(
                record, outcome=outcome, state=State.UPLOADING, same_file=True
            )
        except _Rewritten:
            return self._file_replaced(record, run, Change.REPLACED, State.UPLOADING)
        except OSError as exc:  # FileChangedError, or the trace file gone or unreadable
            checked = self._check_file(record, run, restart_as=State.UPLOADING)
            if checked.state == record.state and checked.step == record.step:
                raise RunError(f"{run.traces_path}: cannot read: {exc}") from None
            return checked

    # ------------------------------------------------------------ scan

    def _scan(self, record: RunRecord, run: Run) -> RunRecord:
        require_env_name(run)
        try:
            ident = identity(run.traces_path)
        except OSError as exc:
            raise RunError(f"{run.traces_path}: cannot read: {exc}") from None
        max_line = self.config.read.max_line_bytes
        digest = RangeDigest()
        lines = read_lines(
            run.traces_path, end=ident.size, max_line_bytes=max_line, expect=ident, digest=digest
        )
        found = scan(lines, max_line_bytes=max_line)
        totals = found.totals
        bad = [
            SetAsideRecord(i.line, i.offset, i.size, BAD_LINE, i.reason) for i in found.set_aside
        ]
        if totals.traces == 0 and not bad:
            raise RunError(f"{run.traces_path}: no traces in the file: nothing to upload")
        self.ledger.add_set_aside(record, bad)
        hold = bad and self.config.convert.on_bad_line == "hold" and not record.release_hold
        return self.ledger.update(
            record,
            step=Step.RESOLVE,
            state=State.HELD if hold else State.UPLOADING,
            reason=f"{len(bad)} bad lines set aside: fix them, or `evalpush retry` uploads the rest"
            if hold
            else "",
            file_device=ident.device,
            file_inode=ident.inode,
            file_size=ident.size,
            file_mtime_ns=ident.mtime_ns,
            file_ctime_ns=ident.ctime_ns,
            file_digest=digest.digest(),
            upload_end=found.end,
            totals=totals.to_json(),
            samples_seen=totals.traces,
        )

    # ------------------------------------------------------------ resolve and create

    def _resolve(self, record: RunRecord, run: Run) -> RunRecord:
        env_name = require_env_name(run)
        env_id = self.retrier.call(
            lambda: self.client.resolve_environment(env_name),
            replayable=True,
            what="resolve environment",
            run=run.run_id,
        )
        return self.ledger.update(record, env_id=env_id, step=Step.CREATE)

    def _create_body(self, record: RunRecord, run: Run) -> dict[str, Any]:
        report = summary(run, RunTotals.from_json(record.totals))
        return {
            "name": report["name"],
            "environments": [{"id": record.env_id}],
            "model_name": run.model,
            "dataset": run.env_name,
            "framework": "verifiers",
            "metadata": report["metadata"],
            "metrics": report["metrics"],
            "tags": [],
        }

    def _create(self, record: RunRecord, run: Run) -> RunRecord:
        fresh = record.pending is not None or run.pushed_inline
        if fresh or not record.looked_up:
            found = self._find_evaluation(record, run, fresh=fresh)
            if found is not None:
                return self._adopt(record, found)
        body = self._create_body(record, run)
        record = self.ledger.update(record, pending=_intent(Step.CREATE), looked_up=1)
        while True:
            try:
                evaluation_id, url = self.retrier.call(
                    lambda: self.client.create_evaluation(body),
                    replayable=False,
                    what="create evaluation",
                    run=run.run_id,
                )
                _crash_point("create-sent")
                break
            except Ambiguous:
                found = self._find_evaluation(record, run, fresh=True)
                if found is not None:
                    return self._adopt(record, found)
        return self.ledger.update(
            record,
            evaluation_id=evaluation_id,
            viewer_url=url or self.client.viewer_url(evaluation_id),
            pending=None,
            step=Step.PUSH,
        )

    def _find_evaluation(
        self, record: RunRecord, run: Run, *, fresh: bool
    ) -> dict[str, Any] | None:
        """This run's evaluation on the platform, if one exists that is not an earlier one of
        this run (`evalpush.lookup` says when a listing made now is needed)."""
        assert self.evaluations is not None
        return self.evaluations.find(
            run.env_name,
            run.run_id,
            exclude=self.ledger.earlier_evaluations(record),
            fresh=fresh,
        )

    def _replayable(self, fn: Callable[[], Any], what: str, run_id: str) -> Any:
        return self.retrier.call(fn, replayable=True, what=what, run=run_id)

    def _adopt(self, record: RunRecord, evaluation: dict[str, Any]) -> RunRecord:
        adopted = evaluation_id(evaluation)
        url = evaluation.get("viewer_url") or self.client.viewer_url(adopted)
        get_logger(run=record.run_id).info("adopting the run's evaluation", evaluation=adopted)
        if is_finalized(evaluation):
            held = evaluation.get("sample_count")
            return self.ledger.update(
                record,
                evaluation_id=adopted,
                viewer_url=url,
                looked_up=1,
                pending=None,
                step=Step.DONE,
                state=State.FINALIZED,
                reason="already on the platform: adopted its finalized evaluation",
                samples_sent=held if isinstance(held, int) else record.samples_seen,
                finalized_at=self.clock(),
            )
        # Samples may be stored already: reconcile the whole range before sending any.
        return self.ledger.update(
            record,
            evaluation_id=adopted,
            viewer_url=url,
            looked_up=1,
            pending=_intent(Step.PUSH, start=0, end=record.upload_end),
            step=Step.PUSH,
        )

    # ------------------------------------------------------------ push

    def _push(self, record: RunRecord, run: Run) -> RunRecord:
        assert record.evaluation_id is not None and record.upload_end is not None
        fingerprint = _fingerprint(record)
        assert fingerprint is not None
        if record.acked_offset or record.pending:
            self._check_bytes(record, run)
        known = fingerprint.identity
        stored = self._stored_ids(record) if record.pending else None
        reconcile_end = msgspec.json.decode(record.pending)["end"] if record.pending else 0
        max_line = self.config.read.max_line_bytes
        totals = self._totals_before(record, run, known)
        lines = read_lines(
            run.traces_path,
            offset=record.acked_offset,
            number=record.acked_line,
            end=record.upload_end,
            max_line_bytes=max_line,
            expect=known,
        )
        source = batches(
            convert_lines(lines, totals, max_line_bytes=max_line),
            start=record.acked_offset,
            start_line=record.acked_line,
            end=record.upload_end,
            max_batch_bytes=self.config.upload.max_batch_bytes,
            max_batch_samples=self.config.upload.max_batch_samples,
        )
        watch = _FileWatch(run.traces_path, fingerprint)
        with Prefetch(source, name=f"convert-{run.run_id[:8]}") as ahead:
            for batch in ahead:
                watch.check()  # the batch was read before this look: it holds the scanned bytes
                already = 0
                if stored is not None and batch.start < reconcile_end:
                    unsent = _without_stored(batch, stored)
                    already, batch = len(batch.samples) - len(unsent.samples), unsent
                record = self._send_batch(record, batch, already)
                self.progress(record)
        return self.ledger.update(record, step=Step.FINALIZE)

    @staticmethod
    def _check_bytes(record: RunRecord, run: Run) -> None:
        """On resuming an upload (after a crash, a stop, a takeover): the file's bytes must still
        be the ones scanned, read whole, whatever its identity says (a file rewritten in place
        within the clock's granularity keeps its mtime)."""
        assert record.upload_end is not None
        if digest_of(run.traces_path, record.upload_end) != record.file_digest:
            raise _Rewritten(f"{run.traces_path}: rewritten since the upload began")

    def _totals_before(self, record: RunRecord, run: Run, known: FileIdentity) -> RunTotals:
        """The running totals at the acknowledged offset (they number each task's rollouts):
        nothing at the start; after a restart, one cheap pass over the lines already sent."""
        if record.acked_offset == 0:
            return RunTotals()
        max_line = self.config.read.max_line_bytes
        lines = read_lines(
            run.traces_path, end=record.acked_offset, max_line_bytes=max_line, expect=known
        )
        return scan(lines, max_line_bytes=max_line).totals

    def _stored_ids(self, record: RunRecord) -> collections.Counter[str]:
        evaluation_id = record.evaluation_id
        return self.retrier.call(
            lambda: collections.Counter(
                self.client.iter_sample_ids(
                    evaluation_id, max_items=most_samples_stored(record.samples_seen or 0)
                )
            ),
            replayable=True,
            what="list samples",
            run=record.run_id,
        )

    def _send_batch(self, record: RunRecord, batch: Batch, already: int = 0) -> RunRecord:
        """Send `batch`; `already` more of its range's samples were found stored on the platform."""
        delivered = already
        set_aside = [
            SetAsideRecord(item.line, item.offset, item.size, kind, item.reason)
            for kind, item in batch.set_aside
        ]
        if batch.samples:
            record = self.ledger.update(
                record, pending=_intent(Step.PUSH, start=batch.start, end=batch.end)
            )
            _crash_point("batch-intent")
            delivered += self._deliver(record, batch, set_aside)
            _crash_point("batch-sent")
        self.ledger.add_set_aside(record, set_aside)
        acked = self.ledger.update(
            record,
            pending=None,
            acked_offset=batch.end,
            acked_line=batch.end_line,
            samples_sent=record.samples_sent + delivered,
            bytes_sent=record.bytes_sent + batch.body_bytes,
        )
        _crash_point("batch-acked")
        return acked

    def _deliver(self, record: RunRecord, batch: Batch, set_aside: list[SetAsideRecord]) -> int:
        """Send `batch` until the platform holds each of its samples once; returns how many."""
        evaluation_id = record.evaluation_id
        try:
            self.retrier.call(
                lambda: self.client.push_samples(evaluation_id, batch.body()),
                replayable=False,
                what="push samples",
                run=record.run_id,
            )
            return len(batch.samples)
        except BatchRefused as exc:
            if len(batch.samples) == 1:
                size = len(batch.samples[0])
                set_aside.append(
                    SetAsideRecord(batch.numbers[0], batch.offsets[0], size, REJECTED, str(exc))
                )
                return 0
            first, second = batch.split()
            return self._deliver(record, first, set_aside) + self._deliver(
                record, second, set_aside
            )
        except Ambiguous:
            stored = self._stored_ids(record)
            missing = _without_stored(batch, stored)
            already = len(batch.samples) - len(missing.samples)
            return already + (self._deliver(record, missing, set_aside) if missing.samples else 0)

    # ------------------------------------------------------------ finalize

    def _finalize(self, record: RunRecord, run: Run) -> RunRecord:
        evaluation_id = record.evaluation_id
        metrics = RunTotals.from_json(record.totals).metrics()
        if record.pending is None or not self._is_finalized(record):
            record = self.ledger.update(record, pending=_intent(Step.FINALIZE))
            url = self._send_finalize(record, metrics)
            _crash_point("finalize-sent")
        else:
            url = None
        return self.ledger.update(
            record,
            pending=None,
            step=Step.DONE,
            state=State.FINALIZED,
            viewer_url=url or record.viewer_url or self.client.viewer_url(evaluation_id),
            finalized_at=self.clock(),
        )

    def _send_finalize(self, record: RunRecord, metrics: dict[str, Any]) -> str | None:
        evaluation_id = record.evaluation_id
        while True:
            try:
                return self.retrier.call(
                    lambda: self.client.finalize(evaluation_id, metrics),
                    replayable=False,
                    what="finalize",
                    run=record.run_id,
                )
            except Conflict:
                if self._is_finalized(record):
                    return None
                raise
            except Ambiguous:
                if self._is_finalized(record):
                    return None

    def _is_finalized(self, record: RunRecord) -> bool:
        evaluation_id = record.evaluation_id
        evaluation = self.retrier.call(
            lambda: self.client.get_evaluation(evaluation_id),
            replayable=True,
            what="read evaluation",
            run=record.run_id,
        )
        return is_finalized(evaluation)


def _intent(step: str, **fields: int | None) -> str:
    return msgspec.json.encode({"step": step, **fields}).decode()


def _fingerprint(record: RunRecord) -> Fingerprint | None:
    """What the ledger knows of the run's trace file, once scanned."""
    if record.file_device is None or record.file_inode is None or record.upload_end is None:
        return None
    scanned = FileIdentity(
        record.file_device,
        record.file_inode,
        record.file_size or 0,
        record.file_mtime_ns or 0,
        record.file_ctime_ns or 0,
    )
    return Fingerprint(scanned, record.upload_end, record.file_digest)


class _Rewritten(FileChangedError):
    """The trace file's scanned bytes changed (replaced, or rewritten in place)."""


class _FileWatch:
    """Looks at the trace file before each batch: a stat while it is unchanged, its bytes when
    the stat changed (an append, a touch, or a rewrite: only the bytes can tell)."""

    def __init__(self, path: Path, known: Fingerprint):
        self._path = path
        self._known = known
        self._seen = known.identity

    def check(self) -> None:
        try:
            now = identity(self._path)
        except OSError:
            raise FileChangedError(f"{self._path}: deleted mid-upload") from None
        if now == self._seen:
            return
        change, now = verify(self._path, self._known)
        if change == Change.GONE or now is None:
            raise FileChangedError(f"{self._path}: deleted mid-upload")
        if change == Change.REPLACED:
            raise _Rewritten(f"{self._path}: replaced or rewritten mid-upload")
        self._seen = now


def _without_stored(batch: Batch, stored: collections.Counter[str]) -> Batch:
    """`batch` less the samples the platform already holds (each stored id used up once)."""
    keep = []
    for i, sample in enumerate(batch.samples):
        sample_id = _SAMPLE_ID.decode(sample).sample_id
        if stored[sample_id] > 0:
            stored[sample_id] -= 1
        else:
            keep.append(i)
    return batch if len(keep) == len(batch.samples) else batch.only(keep)


class _SampleId(msgspec.Struct):
    sample_id: str


_SAMPLE_ID = msgspec.json.Decoder(_SampleId)
