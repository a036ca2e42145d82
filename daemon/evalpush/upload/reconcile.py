"""Reconciliation: the reads that settle what an ambiguous failure or a crash left open, before
anything is sent again.

- create: is there already an evaluation of this run on the platform? (`find_evaluation`, then
  `adopt` it: a finalized one ends the upload, an open one is reconciled sample by sample);
- push: which of a batch's samples does the evaluation already hold? (`stored_ids`,
  `without_stored`);
- finalize: is the evaluation finalized? (`is_finalized`);
- a 404 or 409 about the evaluation (on a batch, on the finalize): is it gone, closed, or still
  open after all? (`read_after_refusal`).
"""

from __future__ import annotations

import collections

import msgspec

from evalpush.client import Evaluation, is_platform_id, most_samples_stored
from evalpush.core.errors import Ambiguous, Conflict, Gone
from evalpush.core.states import HistoryOutcome, State, Step
from evalpush.ledger import RunRecord, transitions
from evalpush.log import get_logger
from evalpush.runs import OFFLINE_RUN_PREFIX, Producer, Run
from evalpush.upload.batch import Batch
from evalpush.upload.context import Context


def intent(step: Step, **fields: int | str | None) -> str:
    """The `pending` column: what may have reached the platform if the process dies now."""
    return msgspec.json.encode({"step": step, **fields}).decode()


def create_pending(record: RunRecord) -> dict[str, object] | None:
    """The run's create intent, if a create may have reached the platform unacknowledged."""
    if record.pending is None or record.evaluation_id is not None:
        return None
    pending = msgspec.json.decode(record.pending)
    return pending if isinstance(pending, dict) and pending.get("step") == Step.CREATE else None


def created_in(record: RunRecord, run: Run) -> str:
    """The environment a create went to: the one its intent recorded (the config may name
    another since), else the run's."""
    pending = create_pending(record)
    env = pending.get("env") if pending is not None else None
    return env if isinstance(env, str) and env else run.env_name


class Reconciler:
    def __init__(self, context: Context):
        self._ctx = context

    def find_evaluation(self, record: RunRecord, run: Run, *, fresh: bool) -> Evaluation | None:
        """This run's evaluation on the platform, if one exists that is not an earlier one of
        this run (`evalpush.client.lookup` says when a listing made now is needed)."""
        return self._ctx.evaluations.find(
            created_in(record, run),
            run.run_id,
            exclude=lambda: self._ctx.ledger.earlier_evaluations(record),
            fresh=fresh,
        )

    def settle_create(self, record: RunRecord, run: Run) -> RunRecord:
        """Before the run's upload is dropped (its file replaced or deleted): a create intent it
        leaves may have made an evaluation; if the platform holds one, it becomes the run's
        evaluation (to be closed out), not an orphan left open for ever."""
        if create_pending(record) is None:
            return record
        self._ctx.wait_for_late_writes(what="an earlier create to land, if it will")
        found = self.find_evaluation(record, run, fresh=True)
        if found is None:
            return record
        get_logger(run=record.run_id).info(
            "an unacknowledged create made an evaluation", evaluation=found.id
        )
        return self._ctx.ledger.update(
            record,
            evaluation_id=found.id,
            viewer_url=found.viewer_url or self._ctx.client.viewer_url(found.id),
            pending=None,
        )

    def producer_evaluation(self, record: RunRecord, run: Run) -> Evaluation | None:
        """A 0.4 run's own evaluation: its eval created it before the first rollout and took its
        id as the run id, so it is read by that id (`GET /evaluations/{run id}`). None for an
        offline run (`disabled-...`: nothing was created), a run id that is no platform id, one
        of this run's earlier evaluations (superseded, cancelled, forgotten), an evaluation the
        platform does not hold, and one closed without being finalized (the eval failed): the
        run then uploads as a new evaluation."""
        run_id = run.run_id
        if (
            run.producer != Producer.EPISODES_0_4
            or run_id.startswith(OFFLINE_RUN_PREFIX)
            or not is_platform_id(run_id)
            or run_id in self._ctx.ledger.earlier_evaluations(record)
        ):
            return None
        client = self._ctx.client
        try:
            found = self._ctx.replayable(
                lambda: client.get_evaluation(run_id), what="read evaluation", run=run_id
            )
        except Gone:
            return None
        if found.id != run_id or (found.closed and not found.finalized):
            return None
        why = not_the_runs(found, run)
        if why is not None:
            # Someone else's evaluation (another run's, another team's): never written into,
            # updated or finalized; the run uploads as a new evaluation, and this one stays in
            # its history so that it is not read again.
            get_logger(run=run_id).warning(
                "the evaluation the run's lines name is not the run's own: uploading it as a new "
                "evaluation",
                evaluation=found.id,
                why=why,
            )
            self._ctx.ledger.note_foreign(record, found.id, found.viewer_url)
            return None
        return found

    def adopt(
        self, record: RunRecord, evaluation: Evaluation, *, by_producer: bool = False
    ) -> RunRecord:
        """Make `evaluation` the run's: finalized, the upload is done; open, its samples are
        reconciled over the whole range before any is sent. `by_producer`: the evaluation a 0.4
        eval created for itself, whose samples may live in Prime Traces: a low sample count on
        the platform is no reason to upload it again."""
        ctx = self._ctx
        url = evaluation.viewer_url or ctx.client.viewer_url(evaluation.id)
        get_logger(run=record.run_id).info(
            "adopting the run's evaluation", evaluation=evaluation.id
        )
        if evaluation.finalized:
            held = evaluation.sample_count
            if held is not None and held < record.samples_seen and not by_producer:
                return self._supersede(record, evaluation, url)
            reason = (
                "already on the platform: adopted the evaluation its eval pushed"
                if by_producer
                else "already on the platform: adopted its finalized evaluation"
            )
            return transitions.finalize(
                ctx.ledger,
                record,
                at=ctx.clock(),
                evaluation_id=evaluation.id,
                viewer_url=url,
                looked_up=1,
                reason=reason,
                samples_sent=record.samples_seen if held is None or by_producer else held,
            )
        return ctx.ledger.record_intent(
            record,
            intent(Step.PUSH, start=0, end=record.upload_end),
            evaluation_id=evaluation.id,
            viewer_url=url,
            looked_up=1,
            step=Step.PUSH,
        )

    def _supersede(self, record: RunRecord, evaluation: Evaluation, url: str) -> RunRecord:
        """A finalized evaluation of this run holding fewer samples than the trace file has
        traces (the file grew after it was finalized, then the ledger was moved aside): it
        cannot be appended to, so it is superseded, as if the ledger had seen the file grow,
        and the whole file uploads as a new evaluation."""
        get_logger(run=record.run_id).warning(
            "the run's finalized evaluation holds fewer samples than its trace file has traces: "
            "it is superseded by a new evaluation of the whole file",
            evaluation=evaluation.id,
            held=evaluation.sample_count,
            traces=record.samples_seen,
        )
        ledger = self._ctx.ledger
        record = ledger.update(record, evaluation_id=evaluation.id, viewer_url=url, looked_up=1)
        return transitions.start_over(
            ledger, record, HistoryOutcome.SUPERSEDED, state=State.UPLOADING, same_file=True
        )

    def cancel(self, record: RunRecord, message: str) -> None:
        """Close out the run's open evaluation as cancelled (`message` says why): it takes no
        more samples. Already closed or deleted is as good."""
        if record.evaluation_id is None or record.step == Step.DONE:
            return
        client, evaluation = self._ctx.client, record.evaluation_id
        try:
            self._ctx.replayable(
                lambda: client.close_out(evaluation, "CANCELLED", error_message=message),
                what="close out",
                run=record.run_id,
            )
        except (Conflict, Gone):
            pass  # already closed, or deleted: either way it takes no more samples

    def stored_ids(self, record: RunRecord) -> collections.Counter[str]:
        """How many times the evaluation holds each sample id."""
        client, evaluation = self._ctx.client, record.evaluation_id
        assert evaluation is not None
        bound = most_samples_stored(record.samples_seen or 0)
        return self._ctx.replayable(
            lambda: collections.Counter(client.iter_sample_ids(evaluation, max_items=bound)),
            what="list samples",
            run=record.run_id,
        )

    def confirm_created(self, evaluation_id: str, run: Run) -> None:
        """A create's answer is trusted only once a read of the evaluation it names says it is
        this run's (`metadata.run_id`): a platform answering with another run's evaluation would
        otherwise get this run's samples and finalize. `Ambiguous` if the read says otherwise
        (or that there is no such evaluation), so the create is reconciled by listing, like any
        create whose answer is unusable. A read without a run id cannot say: it is trusted."""
        try:
            found = self._read(evaluation_id, run.run_id)
        except Gone:
            raise Ambiguous(
                f"create evaluation: answered with {evaluation_id}, which the platform does not "
                "hold"
            ) from None
        if found.run_id is not None and found.run_id != run.run_id:
            raise Ambiguous(
                f"create evaluation: answered with {evaluation_id}, the evaluation of another "
                f"run ({found.run_id[:40]!r})"
            )

    def _read(self, evaluation_id: str, run_id: str) -> Evaluation:
        client = self._ctx.client
        return self._ctx.replayable(
            lambda: client.get_evaluation(evaluation_id), what="read evaluation", run=run_id
        )

    def read_after_refusal(self, record: RunRecord, refusal: Gone | Conflict) -> Evaluation:
        """The run's evaluation, read after the platform answered a request about it with 404
        or 409. Such an answer is believed only when the read bears it out: `Gone` when the
        read finds no evaluation either; else the caller weighs what the read says (closed, or
        still open: then the refusal says nothing of the evaluation, and the request's outcome
        is unknown, as after an ambiguous failure)."""
        assert record.evaluation_id is not None
        found = self._read(record.evaluation_id, record.run_id)
        get_logger(run=record.run_id).warning(
            "the platform refused a request about the run's evaluation; read it to see why",
            refusal=str(refusal),
            finalized=found.finalized,
            closed=found.closed,
        )
        return found

    def is_finalized(self, record: RunRecord) -> bool:
        assert record.evaluation_id is not None
        return self._read(record.evaluation_id, record.run_id).finalized


def not_the_runs(found: Evaluation, run: Run) -> str | None:
    """Why `found` is provably not `run`'s own evaluation, or None when what it says of itself
    matches what the producer's own push writes: the run id in its metadata (evalpush's own
    addition), its name, environment and model, each where the answer carries it. An answer
    naming neither the run nor its name proves nothing, and is not the run's either."""
    expected = (
        ("metadata.run_id", found.run_id, run.run_id),
        ("name", found.name, run.evaluation_name),
        ("environment", found.environment, run.env_name),
        ("model", found.model, run.model),
    )
    for key, theirs, ours in expected:
        if theirs is not None and theirs != ours:
            return f"its {key} is {theirs[:80]!r}, the run's is {ours[:80]!r}"
    if found.run_id is None and found.name is None:
        return "it names neither the run nor the run's evaluation name"
    return None


class _SampleId(msgspec.Struct):
    sample_id: str


_SAMPLE_ID = msgspec.json.Decoder(_SampleId)


def without_stored(batch: Batch, stored: collections.Counter[str]) -> Batch:
    """`batch` less the samples the platform already holds (each stored id used up once)."""
    keep = []
    for i, sample in enumerate(batch.samples):
        sample_id = _SAMPLE_ID.decode(sample).sample_id
        if stored[sample_id] > 0:
            stored[sample_id] -= 1
        else:
            keep.append(i)
    return batch if len(keep) == len(batch.samples) else batch.only(keep)
