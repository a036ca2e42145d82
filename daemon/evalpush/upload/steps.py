"""The five steps of the exactly-once protocol (docs/ARCHITECTURE.md). Each takes the run's row
at its step, does the step's work, and returns the row at the next step; every non-replayable
request is bracketed by an intent written before it and the acknowledgement written after it."""

from __future__ import annotations

import contextlib
from typing import Any

import msgspec

from evalpush.client import UNUSABLE_ANSWER_ATTEMPTS
from evalpush.convert import RunTotals, convert_lines, scan, summary, tally
from evalpush.core.errors import (
    Ambiguous,
    BatchRefused,
    Conflict,
    Gone,
    Refused,
    RunError,
    UnusableAnswers,
)
from evalpush.core.ids import short_id
from evalpush.core.setaside import SetAside
from evalpush.core.states import HistoryOutcome, SetAsideKind, Step
from evalpush.core.words import counted
from evalpush.ledger import RunRecord, transitions
from evalpush.log import get_logger
from evalpush.runs import (
    FileIdentity,
    Producer,
    RangeDigest,
    Run,
    identity,
    read_lines,
    require_env_name,
)
from evalpush.upload import provenance
from evalpush.upload.batch import Batch, Prefetch, batches
from evalpush.upload.context import Context
from evalpush.upload.crash import crash_point
from evalpush.upload.files import FileWatch, Rewritten, check_bytes, fingerprint
from evalpush.upload.prescan import Prescan
from evalpush.upload.reconcile import Reconciler, intent, without_stored

HOLD_REASON = "{count} set aside: fix them, or `evalpush retry` uploads the rest"
NO_GOOD_LINE_YET = "followed: no line to send yet"
FOLLOWING_REASON = "following: {samples} sent so far"
MAX_REFUSALS_NOT_BORNE_OUT = 3
"""A request about an open evaluation answered 404/409 again and again (the read says it is open
each time) fails the run after this many: a platform contradicting itself is for a person."""
INLINE_CONVERT_BYTES = 256 * 1024
"""Traces this small (and within one batch's byte budget) are converted in the pushing thread:
a converting thread, one per run, overlaps nothing worth its start on a run of one small batch."""


class Steps:
    def __init__(self, context: Context, reconciler: Reconciler):
        self._ctx = context
        self._reconcile = reconciler

    def advance(self, record: RunRecord, run: Run, *, follow: bool = False) -> RunRecord:
        """Do the step the run is at. `follow`: a stretch of a followed run, which ends once
        the lines written so far are pushed (the row then waits, `following`)."""
        if record.step == Step.SCAN:
            return self.scan(record, run, follow=follow)
        if record.step == Step.PUSH:
            return self.push(record, run, follow=follow)
        step = {
            Step.RESOLVE: self.resolve,
            Step.CREATE: self.create,
            Step.FINALIZE: self.finalize,
        }[Step(record.step)]
        return step(record, run)

    # ------------------------------------------------------------ scan

    def scan(self, record: RunRecord, run: Run, *, follow: bool = False) -> RunRecord:
        """One cheap pass fixes what the upload covers: the byte range, its fingerprint, its
        totals and its bad lines (held for a person with `convert.on_bad_line = "hold"`). A run
        the daemon watched while it was written comes queued at resolve instead: its tracker
        kept this step's results as the lines arrived (`evalpush.upload.prescan`)."""
        ctx = self._ctx
        require_env_name(run)
        try:
            ident = identity(run.traces_path)
        except OSError as exc:
            raise RunError(f"{run.traces_path}: cannot read: {exc}") from None
        max_line = ctx.config.read.max_line_bytes
        digest = RangeDigest()
        lines = read_lines(
            run.traces_path, end=ident.size, max_line_bytes=max_line, expect=ident, digest=digest
        )
        # tally decodes only what the totals need: a line bad only where it does not look (a
        # broken graph, bad UTF-8 in a message) is set aside by conversion, and the finalize
        # carries conversion's exact totals. Hold must see every bad line before anything is sent.
        first_pass = scan if ctx.config.convert.on_bad_line == "hold" else tally
        found = first_pass(lines, max_line_bytes=max_line)
        totals = found.totals
        bad = found.set_aside
        ctx.ledger.add_set_aside(record, bad)
        if totals.traces == 0 and follow:  # nothing to create an evaluation for yet
            return transitions.wait(ctx.ledger, record, NO_GOOD_LINE_YET, settles_at=None)
        if totals.traces == 0:
            raise RunError(nothing_to_upload(run, bad))
        # The same columns the daemon's tracker writes for a run it scanned while watching it.
        scanned = Prescan(ident, digest.digest(), found).columns()
        if bad and ctx.config.convert.on_bad_line == "hold" and not record.release_hold:
            return transitions.hold(
                ctx.ledger,
                record,
                HOLD_REASON.format(count=counted(len(bad), "bad line")),
                **scanned,
            )
        return ctx.ledger.record_progress(record, **scanned)  # goes with the create intent

    # ------------------------------------------------------------ resolve and create

    def resolve(self, record: RunRecord, run: Run) -> RunRecord:
        env_id = self._ctx.environments.id_of(require_env_name(run), run.run_id)
        return self._ctx.ledger.record_progress(record, env_id=env_id, step=Step.CREATE)

    def _create_body(self, record: RunRecord, run: Run) -> dict[str, Any]:
        totals = RunTotals.from_json(record.totals)
        report = summary(run, totals)
        metadata = self._metadata(record, run, report, totals)
        if run.producer == Producer.EPISODES_0_4:
            # prime-runs' create: no metrics (they go with the update before the finalize)
            return {
                "name": report["name"],
                "environments": [{"id": record.env_id}],
                "tags": [],
                "model_name": run.model,
                "dataset": run.env_name,
                "framework": "verifiers",
                "metadata": metadata,
            }
        return {
            "name": report["name"],
            "environments": [{"id": record.env_id}],
            "model_name": run.model,
            "dataset": run.env_name,
            "framework": "verifiers",
            "metadata": metadata,
            "metrics": report["metrics"],
            "tags": [],
        }

    def _metadata(
        self, record: RunRecord, run: Run, report: dict[str, Any], totals: RunTotals
    ) -> dict[str, Any]:
        """The eval's own push's metadata and one key more: what evalpush knows of the run."""
        return {
            **report["metadata"],
            provenance.KEY: provenance.metadata(self._ctx, record, run, totals),
        }

    def create(self, record: RunRecord, run: Run) -> RunRecord:
        """Create the run's evaluation, unless the platform already has one to adopt."""
        ctx = self._ctx
        fresh = record.pending is not None or run.pushed_inline
        if record.pending is not None:  # a create a process (this one, or one gone) sent
            ctx.wait_for_late_writes(what="an earlier create to land, if it will")
        if record.pending is None:
            own = self._reconcile.producer_evaluation(record, run)
            if own is not None:
                return self._reconcile.adopt(record, own, by_producer=True)
        if fresh or not record.looked_up:
            found = self._reconcile.find_evaluation(record, run, fresh=fresh)
            if found is not None:
                return self._reconcile.adopt(record, found)
        body = self._create_body(record, run)
        # The intent names the environment: a lookup after a crash must list the one the create
        # went to, whatever the config says by then.
        record = ctx.ledger.record_intent(
            record, intent(Step.CREATE, env=run.env_name), looked_up=1
        )
        unusable = 0  # create answers in a row that could not be used
        while True:
            try:
                evaluation_id, url = ctx.once(
                    lambda: ctx.client.create_evaluation(body),
                    what="create evaluation",
                    record=record,
                )
                crash_point("create-sent")
                self._reconcile.confirm_created(evaluation_id, run)
                break
            except Ambiguous as exc:
                ctx.wait_for_late_writes(what="the create to land, if it will")
                found = self._reconcile.find_evaluation(record, run, fresh=True)
                if found is not None:
                    return self._reconcile.adopt(record, found)
                unusable = unusable + 1 if exc.unusable else 0
                if unusable >= UNUSABLE_ANSWER_ATTEMPTS:
                    raise UnusableAnswers(
                        f"{exc} (the same kind of answer {unusable} times in a row, and no "
                        "evaluation of the run listed)",
                        status=exc.status,
                    ) from exc
                ctx.retrier.pause_after(unusable - 1, what="create evaluation")
            except Refused:
                # The environment id is this process's since its first resolve: it may be gone.
                ctx.environments.forget(run.env_name)
                raise
        # The acknowledgement goes with the next intent (the first batch's): until then nothing
        # is sent, and a crash before it leaves the create intent, reconciled by a lookup.
        return ctx.ledger.record_progress(
            record,
            evaluation_id=evaluation_id,
            viewer_url=url or ctx.client.viewer_url(evaluation_id),
            pending=None,
            step=Step.PUSH,
        )

    # ------------------------------------------------------------ push

    def push(self, record: RunRecord, run: Run, *, follow: bool = False) -> RunRecord:
        """Batch after batch from the acknowledged offset; after a crash or an adoption (an
        intent is pending), the samples already stored are left out of the batches it covers.
        A followed run's push first extends its fingerprint to the file's last complete line
        (`follow.Follows`), and a stretch (`follow`) ends with the row waiting for more."""
        ctx = self._ctx
        assert record.evaluation_id is not None
        if fingerprint(record) is None:
            # Nothing says which bytes the evaluation's samples came from, nor where to go on:
            # it is closed out and the run starts over (as for a rewritten file), never pushed
            # blind nor tried again in a loop.
            get_logger(run=run.run_id).warning(
                "the ledger holds no fingerprint of the run's file at its push step: its "
                "evaluation is closed out and the run starts over",
                evaluation=record.evaluation_id,
            )
            raise Rewritten(f"{run.traces_path}: no fingerprint of the bytes already sent")
        followed = follow or bool(record.following)
        if followed:  # the run's end (not a stretch) checks every byte of the prefix again
            record = self._extend(record, run, whole=not follow)
        elif record.acked_offset or record.pending:
            check_bytes(record, run)
        known = fingerprint(record)
        assert known is not None
        stored = None
        if record.pending:  # a batch a process (this one, or one gone) sent, or an adoption
            ctx.wait_for_late_writes(what="an earlier batch to land, if it will")
            stored = self._reconcile.stored_ids(record)
        reconcile_end = msgspec.json.decode(record.pending)["end"] if record.pending else 0
        max_line = ctx.config.read.max_line_bytes
        totals = self._totals_before(record, run, known.identity)
        lines = read_lines(
            run.traces_path,
            offset=record.acked_offset,
            number=record.acked_line,
            end=record.upload_end,
            max_line_bytes=max_line,
            expect=known.identity,
        )
        source = batches(
            convert_lines(lines, totals, max_line_bytes=max_line),
            start=record.acked_offset,
            start_line=record.acked_line,
            end=record.upload_end,
            max_batch_bytes=ctx.config.upload.max_batch_bytes,
            max_batch_samples=ctx.config.upload.max_batch_samples,
        )
        inline = min(INLINE_CONVERT_BYTES, ctx.config.upload.max_batch_bytes)
        small = record.upload_end - record.acked_offset <= inline
        kept = ctx.follows.windows(record) if followed else None
        with (
            FileWatch(run.traces_path, known, kept) as watch,
            (
                contextlib.closing(source)
                if small
                else Prefetch(source, name=f"convert-{short_id(run.run_id)}")
            ) as ahead,
        ):
            for batch in ahead:
                watch.check()  # the batch was read before this look: it holds the scanned bytes
                already = 0
                if stored is not None and batch.start < reconcile_end:
                    unsent = without_stored(batch, stored)
                    already, batch = len(batch.samples) - len(unsent.samples), unsent
                record = self._send_batch(record, batch, already)
                ctx.progress(record)
        if not followed:
            return self._pushed(record, run, totals)
        ctx.follows.converted(record, totals)
        if follow:  # the stretch ends: its last acknowledgement goes with the row's wait
            record = transitions.followed(
                ctx.ledger,
                ctx.ledger.record_progress(record, samples_seen=totals.traces),
                FOLLOWING_REASON.format(samples=counted(record.samples_sent, "sample")),
                at=ctx.clock(),
            )
            crash_point("followed")
            return record
        return self._pushed(record, run, totals, followed=True)

    def _extend(self, record: RunRecord, run: Run, *, whole: bool = False) -> RunRecord:
        """A followed run's fingerprint taken on to the file's last complete line, recorded with
        the next write (the next batch's intent: a crash before it leaves the fingerprint as it
        was, and its bytes are still there)."""
        extension = self._ctx.follows.extend(record, run.traces_path, whole=whole)
        if extension is None:
            return record
        file = extension.file
        return self._ctx.ledger.record_progress(
            record,
            file_size=file.size,
            file_mtime_ns=file.mtime_ns,
            file_ctime_ns=file.ctime_ns,
            file_digest=extension.digest,
            upload_end=extension.end,
        )

    def _pushed(
        self, record: RunRecord, run: Run, totals: RunTotals, *, followed: bool = False
    ) -> RunRecord:
        """Record conversion's exact totals (the finalize's metrics) with the step's end. When
        conversion refused every line the first pass counted, the evaluation holds nothing: it
        is closed out as cancelled and the run fails, never finalized empty."""
        if totals.traces == 0 and record.samples_sent == 0:
            ledger = self._ctx.ledger
            set_aside = ledger.set_aside(record)
            message = nothing_to_upload(run, set_aside)
            self._reconcile.cancel(record, message)
            record = transitions.start_over(ledger, record, HistoryOutcome.CANCELLED)
            ledger.add_set_aside(record, set_aside)  # what `status RUN` lists as the reasons
            raise RunError(message)
        scanned = RunTotals.from_json(record.totals).traces
        # A followed run's first pass saw only its first stretch: nothing to compare.
        if totals.traces != scanned and not followed:
            get_logger(run=run.run_id).warning(
                "lines the first pass counted were refused by conversion: the finalize metrics "
                "leave them out; the create's metadata counted them",
                counted=scanned,
                converted=totals.traces,
            )
        return self._ctx.ledger.record_progress(
            record,
            step=Step.FINALIZE,
            totals=totals.to_json(),
            samples_seen=totals.traces,
        )

    def _totals_before(self, record: RunRecord, run: Run, known: FileIdentity) -> RunTotals:
        """Conversion's running totals at the acknowledged offset (they number each task's
        rollouts and end as the finalize's metrics): nothing at the start; after a restart, one
        fully checked pass over the lines already sent."""
        if record.acked_offset == 0:
            return RunTotals()
        kept = self._ctx.follows.totals(record)
        if kept is not None:  # a followed run this process pushed up to here
            return kept
        max_line = self._ctx.config.read.max_line_bytes
        lines = read_lines(
            run.traces_path, end=record.acked_offset, max_line_bytes=max_line, expect=known
        )
        return scan(lines, max_line_bytes=max_line).totals

    def _send_batch(self, record: RunRecord, batch: Batch, already: int = 0) -> RunRecord:
        """Send `batch`; `already` more of its range's samples were found stored on the platform."""
        ledger = self._ctx.ledger
        delivered = already
        set_aside = list(batch.set_aside)
        if batch.samples:
            record = ledger.record_intent(
                record, intent(Step.PUSH, start=batch.start, end=batch.end)
            )
            crash_point("batch-intent")
            delivered += self._deliver(record, batch, set_aside)
            crash_point("batch-sent")
        ledger.add_set_aside(record, set_aside)
        # The last batch's acknowledgement goes with the finalize intent, which follows with no
        # request between; another's is written now, so the file shows the progress while the
        # next batch is read.
        acknowledge = (
            ledger.record_progress if batch.end == record.upload_end else ledger.acknowledge
        )
        acked = acknowledge(
            record,
            pending=None,
            acked_offset=batch.end,
            acked_line=batch.end_line,
            samples_sent=record.samples_sent + delivered,
            bytes_sent=record.bytes_sent + batch.body_bytes,
        )
        crash_point("batch-acked")
        get_logger(run=record.run_id).debug(
            "batch acknowledged",
            samples=delivered,
            set_aside=len(set_aside),
            bytes=batch.body_bytes,
            lines=f"{record.acked_line + 1}-{batch.end_line}",
            offset=batch.end,
        )
        return acked

    def _deliver(
        self, record: RunRecord, batch: Batch, set_aside: list[SetAside], refusals: int = 0
    ) -> int:
        """Send `batch` until the platform holds each of its samples once; returns how many.
        `refusals`: how many 404/409 answers to it a read of the evaluation did not bear out."""
        client, evaluation = self._ctx.client, record.evaluation_id
        assert evaluation is not None
        try:
            self._ctx.once(
                lambda: client.push_samples(evaluation, batch.body(), count=len(batch.samples)),
                what="push samples",
                record=record,
            )
            return len(batch.samples)
        except (Gone, Conflict) as exc:
            # Believed only if the evaluation is gone or closed: a refusal the evaluation does not
            # bear out leaves the batch's outcome unknown (the samples may be stored).
            now = self._reconcile.read_after_refusal(record, exc)
            if now.closed:
                raise Conflict(
                    f"{exc} (the evaluation reads as closed)", status=exc.status
                ) from None
            refusals = _count_refusal(refusals, exc, evaluation)
        except BatchRefused as exc:
            if len(batch.samples) == 1:
                size = len(batch.samples[0])
                set_aside.append(
                    SetAside(
                        batch.numbers[0], batch.offsets[0], size, SetAsideKind.REJECTED, str(exc)
                    )
                )
                return 0
            first, second = batch.split()
            return self._deliver(record, first, set_aside) + self._deliver(
                record, second, set_aside
            )
        except Ambiguous:
            self._ctx.wait_for_late_writes(what="the batch to land, if it will")
        missing = without_stored(batch, self._reconcile.stored_ids(record))
        already = len(batch.samples) - len(missing.samples)
        if not missing.samples:
            return already
        return already + self._deliver(record, missing, set_aside, refusals)

    # ------------------------------------------------------------ finalize

    def finalize(self, record: RunRecord, run: Run) -> RunRecord:
        """Finalize with conversion's exact metrics. A 0.4 run first gets prime-runs' update
        (`PUT` of its metadata and metrics, no status: replayable, so it needs no intent), and so
        does a followed run: its evaluation was created with the metadata of its first stretch
        (its counts, `evalpush.seen_traces`, `complete`), which the whole file's replace."""
        ctx = self._ctx
        assert record.evaluation_id is not None
        totals = RunTotals.from_json(record.totals)
        report = summary(run, totals)
        metrics = report["metrics"]
        if record.pending is not None:  # a finalize a process (this one, or one gone) sent
            ctx.wait_for_late_writes(what="an earlier finalize to land, if it will")
        if record.pending is None or not self._reconcile.is_finalized(record):
            if run.producer == Producer.EPISODES_0_4 or record.following:
                self._update(record, self._metadata(record, run, report, totals), metrics)
            record = ctx.ledger.record_intent(record, intent(Step.FINALIZE))
            url = self._send_finalize(record, metrics)
            crash_point("finalize-sent")
        else:
            url = None
        record = transitions.finalized(  # written with the release
            ctx.ledger,
            record,
            at=ctx.clock(),
            viewer_url=url or record.viewer_url or ctx.client.viewer_url(record.evaluation_id),
        )
        provenance.mark_superseded(ctx, record)
        return record

    def _update(self, record: RunRecord, metadata: dict[str, Any], metrics: dict[str, Any]) -> None:
        client, evaluation = self._ctx.client, record.evaluation_id
        assert evaluation is not None
        self._ctx.replayable(
            lambda: client.update_evaluation(evaluation, metadata=metadata, metrics=metrics),
            what="update evaluation",
            run=record.run_id,
        )

    def _send_finalize(self, record: RunRecord, metrics: dict[str, Any]) -> str | None:
        client, evaluation = self._ctx.client, record.evaluation_id
        assert evaluation is not None
        refusals = 0
        while True:
            try:
                return self._ctx.once(
                    lambda: client.finalize(evaluation, metrics),
                    what="finalize",
                    record=record,
                )
            except (Gone, Conflict) as exc:
                now = self._reconcile.read_after_refusal(record, exc)
                if now.finalized:
                    return None
                if now.closed:
                    raise Conflict(
                        f"{exc} (the evaluation reads as closed)", status=exc.status
                    ) from None
                refusals = _count_refusal(refusals, exc, evaluation)
            except Ambiguous:
                self._ctx.wait_for_late_writes(what="the finalize to land, if it will")
                if self._reconcile.is_finalized(record):
                    return None


def nothing_to_upload(run: Run, set_aside: list[SetAside]) -> str:
    """Why a run with no line to send fails: an empty file, or every line set aside (the first
    one's reason given; `status RUN` lists them all)."""
    if not set_aside:
        return f"{run.traces_path}: no traces in the file: nothing to upload"
    first = set_aside[0]
    return (
        f"{run.traces_path}: {len(set_aside)} lines, every one set aside (line {first.line}: "
        f"{first.reason}): nothing to upload, no evaluation made"
    )


def _count_refusal(refusals: int, refusal: Gone | Conflict, evaluation: str) -> int:
    """One more 404/409 the evaluation (open, when read) did not bear out; past
    `MAX_REFUSALS_NOT_BORNE_OUT` the run fails: the platform contradicts itself."""
    refusals += 1
    if refusals > MAX_REFUSALS_NOT_BORNE_OUT:
        raise RunError(
            f"{refusal}; but evaluation {evaluation} reads as open, {refusals} times: the platform "
            "contradicts itself; `evalpush retry` tries again"
        )
    return refusals
