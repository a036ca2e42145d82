"""Reconciliation: the reads that settle what an ambiguous failure or a crash left open, before
anything is sent again.

- create: is there already an evaluation of this run on the platform? (`find_evaluation`, then
  `adopt` it: a finalized one ends the upload, an open one is reconciled sample by sample);
- push: which of a batch's samples does the evaluation already hold? (`stored_ids`,
  `without_stored`);
- finalize: is the evaluation finalized? (`is_finalized`).
"""

from __future__ import annotations

import collections

import msgspec

from evalpush import transitions
from evalpush.batch import Batch
from evalpush.ledger import RunRecord
from evalpush.log import get_logger
from evalpush.platform import Evaluation, most_samples_stored
from evalpush.runs import Run
from evalpush.states import Step
from evalpush.upload.context import Context


def intent(step: Step, **fields: int | None) -> str:
    """The `pending` column: what may have reached the platform if the process dies now."""
    return msgspec.json.encode({"step": step, **fields}).decode()


class Reconciler:
    def __init__(self, context: Context):
        self._ctx = context

    def find_evaluation(self, record: RunRecord, run: Run, *, fresh: bool) -> Evaluation | None:
        """This run's evaluation on the platform, if one exists that is not an earlier one of
        this run (`evalpush.lookup` says when a listing made now is needed)."""
        return self._ctx.evaluations.find(
            run.env_name,
            run.run_id,
            exclude=self._ctx.ledger.earlier_evaluations(record),
            fresh=fresh,
        )

    def adopt(self, record: RunRecord, evaluation: Evaluation) -> RunRecord:
        """Make `evaluation` the run's: finalized, the upload is done; open, its samples are
        reconciled over the whole range before any is sent."""
        ctx = self._ctx
        url = evaluation.viewer_url or ctx.client.viewer_url(evaluation.id)
        get_logger(run=record.run_id).info(
            "adopting the run's evaluation", evaluation=evaluation.id
        )
        if evaluation.finalized:
            held = evaluation.sample_count
            return transitions.finalize(
                ctx.ledger,
                record,
                at=ctx.clock(),
                evaluation_id=evaluation.id,
                viewer_url=url,
                looked_up=1,
                reason="already on the platform: adopted its finalized evaluation",
                samples_sent=record.samples_seen if held is None else held,
            )
        return ctx.ledger.update(
            record,
            evaluation_id=evaluation.id,
            viewer_url=url,
            looked_up=1,
            pending=intent(Step.PUSH, start=0, end=record.upload_end),
            step=Step.PUSH,
        )

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

    def is_finalized(self, record: RunRecord) -> bool:
        client, evaluation = self._ctx.client, record.evaluation_id
        assert evaluation is not None
        found = self._ctx.replayable(
            lambda: client.get_evaluation(evaluation), what="read evaluation", run=record.run_id
        )
        return Evaluation.from_answer(found, id=evaluation).finalized


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
