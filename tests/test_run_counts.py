"""The daemon's runs by state (`RunCounts`): the few counted each time, the many every 5 minutes."""

from __future__ import annotations

from evalpush.core.states import State
from evalpush.ledger import Ledger
from evalpush.service.counts import MANY_SECONDS, RunCounts


def test_the_states_runs_pass_through_are_counted_each_time_and_the_finished_every_few_minutes(
    ledger: Ledger,
):
    now = [0.0]
    counts = RunCounts(ledger, clock=lambda: now[0])
    for n, state in enumerate([State.FINALIZED, State.FINALIZED, State.WAITING, State.FAILED]):
        ledger.add(path=f"/runs/{n}", run_id=f"run-{n}", kind="eval", state=state)
    assert counts.now() == {"finalized": 2, "waiting": 1, "failed": 1}

    for n, state in enumerate([State.FINALIZED, State.UPLOADING, State.SKIPPED], start=4):
        ledger.add(path=f"/runs/{n}", run_id=f"run-{n}", kind="eval", state=state)
    now[0] = MANY_SECONDS - 1
    assert counts.now() == {"finalized": 2, "waiting": 1, "failed": 1, "uploading": 1}

    now[0] = MANY_SECONDS
    assert counts.now() == {"finalized": 3, "skipped": 1, "waiting": 1, "failed": 1, "uploading": 1}


def test_the_finished_are_counted_again_after_this_daemon_ended_an_upload(ledger: Ledger):
    counts = RunCounts(ledger, clock=lambda: 0.0)
    ledger.add(path="/runs/a", run_id="run-a", kind="eval", state=State.FINALIZED)
    assert counts.now() == {"finalized": 1}

    ledger.add(path="/runs/b", run_id="run-b", kind="eval", state=State.FINALIZED)
    assert counts.now() == {"finalized": 1}
    counts.changed()
    assert counts.now() == {"finalized": 2}
