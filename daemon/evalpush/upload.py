"""The upload stage: one run's state machine, scan -> resolve -> create -> push -> finalize.

Exactly once, step by step (docs/ARCHITECTURE.md tells the whole protocol):
- scan: one cheap pass over the trace file fixes the byte range to upload, the totals the create
  carries and the bad lines it can see, all recorded before anything is sent (with
  `convert.on_bad_line = "hold"` the pass checks every line fully, so a run is held before
  anything is sent);
- resolve: replayable (get-or-create), so it is simply retried;
- create: the intent is recorded before the request and the evaluation id after it. After an
  ambiguous failure or a crash in between, the environment's evaluations are listed and one whose
  `metadata.run_id` matches (and is not an earlier, superseded evaluation of this run) is adopted
  instead of creating a second;
- push: each batch's byte range is recorded before it is sent and the acknowledged offset after;
  an ambiguous failure or a crash in between is reconciled by listing the evaluation's sample
  ids, and only samples not already stored are sent;
- finalize: intent first; after an ambiguous failure the evaluation's status decides, and a 409
  (already finalized) counts as done.
The ledger moves only on the platform's acknowledgement.
"""

from __future__ import annotations

import collections
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from evalpush.batch import BAD_LINE, REJECTED, Batch, Prefetch, batches
from evalpush.config import Config
from evalpush.convert import RunTotals, convert_lines, scan, summary, tally
from evalpush.errors import (
    Ambiguous,
    BatchRefused,
    Conflict,
    Gone,
    Interrupted,
    Refused,
    RunError,
)
from evalpush.ledger import Ledger, RunRecord, SetAsideRecord, State, Step
from evalpush.log import get_logger
from evalpush.platform import PlatformClient, is_finalized
from evalpush.read import Change, FileChangedError, FileIdentity, compare, identity, read_lines
from evalpush.retry import Retrier
from evalpush.runs import Run, RunKind, require_env_name

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
    _locks: dict[str, threading.Lock] = field(default_factory=dict)
    _locks_guard: threading.Lock = field(default_factory=threading.Lock)

    # ------------------------------------------------------------ entry point

    def upload(self, run: Run, *, retry_failed: bool = True) -> RunRecord:
        """Take `run` as far as it can go now; returns its ledger row afterwards."""
        with self._run_lock(str(run.path)):
            record = self._admit(run, retry_failed)
            if record.state != State.UPLOADING:
                return record
            log = get_logger(run=run.run_id, path=str(run.path))
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
            return record

    def _run_lock(self, key: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(key, threading.Lock())

    def _admit(self, run: Run, retry_failed: bool) -> RunRecord:
        record = self.ledger.get(str(run.path))
        if record is None:
            record = self.ledger.add(
                path=str(run.path), run_id=run.run_id, kind=run.kind, state=State.READY
            )
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

    def _skip_reason(self, run: Run) -> str:
        if run.kind == RunKind.DEBUG:
            return "debug run (config has script_path or command): never uploaded"
        if run.kind == RunKind.REPLAY and not self.config.runs.upload_replays:
            return "replay run: set runs.upload_replays = true to upload replays"
        return ""

    def _check_file(
        self, record: RunRecord, run: Run, *, restart_as: str = State.READY
    ) -> RunRecord:
        """Supersede a finalized run whose file changed; cancel an upload whose file was replaced
        (it starts over from scan in state `restart_as`) or deleted (it fails)."""
        if record.file_inode is None:
            return record
        known = FileIdentity(record.file_device, record.file_inode, record.file_size)
        change = compare(run.traces_path, known)
        if record.state == State.FINALIZED:
            if change in (Change.GROWN, Change.REPLACED):
                get_logger(run=run.run_id).info("run changed after finalize: new evaluation")
                return self.ledger.restart(record, outcome="superseded")
            return record
        if change == Change.GONE:
            message = f"{run.traces_path}: the run's trace file was deleted mid-upload"
            self._cancel(record, message)
            record = self.ledger.restart(record, outcome="cancelled")
            return self.ledger.update(record, state=State.FAILED, last_error=message)
        if change == Change.REPLACED:
            self._cancel(record, "the run's trace file was replaced (resumed eval)")
            return self.ledger.restart(record, outcome="cancelled", state=restart_as)
        return record

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
        except OSError as exc:  # FileChangedError, or the trace file gone or unreadable
            checked = self._check_file(record, run, restart_as=State.UPLOADING)
            if checked is record:
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
        lines = read_lines(run.traces_path, end=ident.size, max_line_bytes=max_line, expect=ident)
        # tally decodes only what the totals need: a line bad only where it does not look (a
        # broken graph, bad UTF-8 in a message) is set aside by conversion, and the finalize
        # carries conversion's exact totals. Hold must see every bad line before anything is sent.
        first_pass = scan if self.config.convert.on_bad_line == "hold" else tally
        found = first_pass(lines, max_line_bytes=max_line)
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
        if record.pending is not None or run.pushed_inline:
            found = self._find_evaluation(record, run)
            if found is not None:
                return self._adopt(record, found)
        body = self._create_body(record, run)
        record = self.ledger.update(record, pending=_intent(Step.CREATE))
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
                found = self._find_evaluation(record, run)
                if found is not None:
                    return self._adopt(record, found)
        return self.ledger.update(
            record,
            evaluation_id=evaluation_id,
            viewer_url=url or self.client.viewer_url(evaluation_id),
            pending=None,
            step=Step.PUSH,
        )

    def _find_evaluation(self, record: RunRecord, run: Run) -> dict[str, Any] | None:
        """This run's evaluation on the platform, if one exists that is not a superseded one."""
        earlier = {h.evaluation_id for h in self.ledger.history(record)}

        def find() -> dict[str, Any] | None:
            for evaluation in self.client.iter_evaluations(run.env_name):
                metadata = evaluation.get("metadata") or {}
                evaluation_id = _evaluation_id(evaluation)
                if metadata.get("run_id") == run.run_id and evaluation_id not in earlier:
                    return evaluation
            return None

        return self.retrier.call(find, replayable=True, what="list evaluations", run=run.run_id)

    def _adopt(self, record: RunRecord, evaluation: dict[str, Any]) -> RunRecord:
        evaluation_id = _evaluation_id(evaluation)
        url = evaluation.get("viewer_url") or self.client.viewer_url(evaluation_id)
        get_logger(run=record.run_id).info(
            "adopting the run's evaluation", evaluation=evaluation_id
        )
        if is_finalized(evaluation):
            held = evaluation.get("sample_count")
            return self.ledger.update(
                record,
                evaluation_id=evaluation_id,
                viewer_url=url,
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
            evaluation_id=evaluation_id,
            viewer_url=url,
            pending=_intent(Step.PUSH, start=0, end=record.upload_end),
            step=Step.PUSH,
        )

    # ------------------------------------------------------------ push

    def _push(self, record: RunRecord, run: Run) -> RunRecord:
        assert record.evaluation_id is not None and record.upload_end is not None
        stored = self._stored_ids(record) if record.pending else None
        reconcile_end = msgspec.json.decode(record.pending)["end"] if record.pending else 0
        known = FileIdentity(record.file_device, record.file_inode, record.file_size)
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
        with Prefetch(source, name=f"convert-{run.run_id[:8]}") as ahead:
            for batch in ahead:
                # The open file still reads the old inode: look at the path before every batch.
                if compare(run.traces_path, known) in (Change.REPLACED, Change.GONE):
                    raise FileChangedError(f"{run.traces_path}: replaced or deleted mid-upload")
                already = 0
                if stored is not None and batch.start < reconcile_end:
                    unsent = _without_stored(batch, stored)
                    already, batch = len(batch.samples) - len(unsent.samples), unsent
                record = self._send_batch(record, batch, already)
                self.progress(record)
        return self._pushed(record, run, totals)

    def _pushed(self, record: RunRecord, run: Run, totals: RunTotals) -> RunRecord:
        """Record conversion's exact totals (the finalize's metrics) with the step's end."""
        scanned = RunTotals.from_json(record.totals).traces
        if totals.traces != scanned:
            get_logger(run=run.run_id).warning(
                "lines the first pass counted were refused by conversion: the finalize metrics "
                "leave them out; the create's metadata counted them",
                counted=scanned,
                converted=totals.traces,
            )
        return self.ledger.update(
            record, step=Step.FINALIZE, totals=totals.to_json(), samples_seen=totals.traces
        )

    def _totals_before(self, record: RunRecord, run: Run, known: FileIdentity) -> RunTotals:
        """Conversion's running totals at the acknowledged offset (they number each task's
        rollouts and end as the finalize's metrics): nothing at the start; after a restart, one
        fully checked pass over the lines already sent."""
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
            lambda: collections.Counter(self.client.iter_sample_ids(evaluation_id)),
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


def _evaluation_id(evaluation: dict[str, Any]) -> str:
    return str(evaluation.get("evaluation_id") or evaluation.get("id"))


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
