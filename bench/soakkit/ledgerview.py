"""evalpush's own view at the end of the soak, held against the platform's stored state.

The accounting never trusts the ledger; this checks the other way round: once the uploader has
stopped, `evalpush status --json` (a process of its own, reading the shared state dir) must say
what the platform holds. Every run that uploads is `finalized` with the id of its one COMPLETED
evaluation; every run that cannot upload is `failed`; no run is left `waiting`, `ready` or
`uploading` (a run the ledger calls unfinished is one a daemon would take up again, for ever).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from soakkit.accounting import Accounting

STATUS_TIMEOUT_SECONDS = 120.0


def ledger_status(environ: dict[str, str]) -> list[dict[str, Any]]:
    """`python -m evalpush status --json`'s runs: one object per run."""
    done = subprocess.run(
        [sys.executable, "-m", "evalpush", "status", "--json"],
        env=environ,
        capture_output=True,
        timeout=STATUS_TIMEOUT_SECONDS,
        check=False,
    )
    if done.returncode not in (0, 1):
        raise RuntimeError(f"evalpush status: exit {done.returncode}: {done.stderr!r}")
    return json.loads(done.stdout)


@dataclass
class LedgerView:
    states: Counter[str] = field(default_factory=Counter)  # of the planned runs' rows
    problems: list[str] = field(default_factory=list)


def compare(rows: list[dict[str, Any]], accounting: Accounting, summary: dict) -> LedgerView:
    """What the ledger says of each planned run against what the platform holds."""
    current = {row["run_id"]: row for row in rows if row["state"] != "superseded"}
    view = LedgerView()
    for run in accounting.runs:
        plan = run.plan
        row = current.get(plan.run_id)
        state = row["state"] if row else "absent"
        view.states[state] += 1
        if plan.flaw.uploads:
            completed = [
                evaluation_id
                for evaluation_id, e in summary["evaluations"].items()
                if e["status"] == "COMPLETED" and e["metadata"].get("run_id") == plan.run_id
            ]
            if state != "finalized":
                view.problems.append(f"run {plan.run_id}: the ledger says {state}, not finalized")
            elif row is not None and [row["evaluation_id"]] != completed:
                view.problems.append(
                    f"run {plan.run_id}: the ledger names evaluation {row['evaluation_id']}, "
                    f"the platform holds {completed} COMPLETED"
                )
        elif state != "failed":
            view.problems.append(f"run {plan.run_id} ({plan.flaw}): the ledger says {state}")
    return view
