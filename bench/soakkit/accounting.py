"""Exact accounting from the platform's stored state against what the writers wrote.

Trusted: the writers' manifest (each run's final file hash, its good sample ids) and the
platform's stored state (`/_control/summary`, every stored sample of an evaluation). Not
trusted: evalpush's ledger, logs or exit codes. The expected metrics come from a fresh
`evalpush convert` of each final file, a separate process that shares only the converter.

Per run, what must hold:
- an uploading run (no flaw, or bad lines): exactly one COMPLETED evaluation, any other
  CANCELLED; the COMPLETED one holds every good sample id once (none lost, none duplicated, none
  that was not written), each stored sample equal to the converted one, one finalize request,
  and the name, metadata and metrics `evalpush convert` gives for the final file;
- a run that cannot upload (no environment name, unparsable config.toml): no evaluation;
- the final file is still the bytes the writer recorded, and `convert` agrees with the writer
  about which lines are good.
And no evaluation on the platform belongs to no planned run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from soakkit.plan import RunPlan
from soakkit.platform import clean_environ
from soakkit.writers import file_digest

CONVERT_TIMEOUT_SECONDS = 300.0
CONVERT_WORKERS = 2


class StoredState(Protocol):
    """The platform as the accounting reads it (a PlatformProcess, or an in-process
    LocalPlatform in tests)."""

    def summary(self) -> dict[str, Any]: ...
    def samples(self, evaluation_id: str) -> list[dict[str, Any]]: ...


@dataclass(frozen=True)
class Converted:
    """A fresh `evalpush convert` of a run: its samples by id and its summary."""

    samples: dict[str, dict[str, Any]]
    ids: list[str]  # file order
    report: dict[str, Any]


def convert(directory: Path) -> Converted:
    """`python -m evalpush convert DIR`, in a process of its own."""
    done = subprocess.run(
        [sys.executable, "-m", "evalpush", "convert", str(directory)],
        capture_output=True,
        env=clean_environ(),
        timeout=CONVERT_TIMEOUT_SECONDS,
        check=False,
    )
    if done.returncode not in (0, 1):
        raise RuntimeError(f"evalpush convert {directory}: exit {done.returncode}: {done.stderr!r}")
    samples = [json.loads(line) for line in done.stdout.splitlines() if line]
    report = json.loads(done.stderr.splitlines()[-1])
    return Converted(
        {s["sample_id"]: s for s in samples}, [s["sample_id"] for s in samples], report
    )


@dataclass
class RunAccount:
    """What the platform holds for one planned run, against what was written."""

    plan: RunPlan
    samples_written: int = 0
    statuses: Counter[str] = field(default_factory=Counter)  # of its evaluations
    lost: int = 0
    duplicated: int = 0
    unexpected: int = 0
    finalize_calls: list[int] = field(default_factory=list)  # per evaluation
    metrics_equal: bool | None = None  # None: a run that uploads nothing
    samples_equal: bool | None = None
    problems: list[str] = field(default_factory=list)

    def problem(self, text: str) -> None:
        self.problems.append(f"run {self.plan.run_id} ({self.plan.flaw}): {text}")

    @property
    def shape(self) -> str:
        """Its evaluations in a few words, for the table: `1 COMPLETED + 1 CANCELLED`."""
        if not self.statuses:
            return "none"
        return " + ".join(f"{n} {status}" for status, n in sorted(self.statuses.items()))


@dataclass
class Accounting:
    runs: list[RunAccount]
    strays: list[str]  # evaluations that belong to no planned run

    @property
    def problems(self) -> list[str]:
        found = [p for run in self.runs for p in run.problems]
        return found + [f"evaluation {e}: belongs to no planned run" for e in self.strays]

    def total(self, name: str) -> int:
        return sum(getattr(run, name) for run in self.runs)


def account(
    platform: StoredState,
    plans: list[RunPlan],
    manifest: dict[str, dict],
    tree: Path,
    converter: Callable[[Path], Converted] = convert,
) -> Accounting:
    """Every planned run accounted for, a few at once; each run's converted samples are
    dropped once it is checked (all of them at once would be gigabytes at 200,000 samples)."""
    by_run, strays = _evaluations_by_run(platform.summary(), {p.run_id for p in plans})

    def one(plan: RunPlan) -> RunAccount:
        written = manifest.get(plan.run_id)
        uploads = plan.flaw.uploads and written is not None
        converted = converter(tree / plan.relpath) if uploads else None
        evaluations = by_run.get(plan.run_id, [])
        return account_run(plan, written, evaluations, converted, platform, tree)

    with ThreadPoolExecutor(CONVERT_WORKERS) as pool:
        return Accounting(list(pool.map(one, plans)), strays)


def _evaluations_by_run(
    summary: dict[str, Any], planned: set[str]
) -> tuple[dict[str, list[tuple[str, dict]]], list[str]]:
    """The platform's evaluations grouped by `metadata.run_id`, and those of no planned run."""
    by_run: dict[str, list[tuple[str, dict]]] = {}
    strays: list[str] = []
    for evaluation_id, evaluation in summary["evaluations"].items():
        run_id = (evaluation.get("metadata") or {}).get("run_id")
        if run_id in planned:
            by_run.setdefault(run_id, []).append((evaluation_id, evaluation))
        else:
            strays.append(evaluation_id)
    return by_run, strays


def account_run(
    plan: RunPlan,
    written: dict | None,
    evaluations: list[tuple[str, dict]],
    converted: Converted | None,
    platform: StoredState,
    tree: Path,
) -> RunAccount:
    run = RunAccount(plan)
    for _, evaluation in evaluations:
        run.statuses[evaluation["status"]] += 1
        run.finalize_calls.append(evaluation["finalize_count"])
    if written is None:
        run.problem("its writer never finished it (no manifest entry)")
        return run
    run.samples_written = len(written["good_ids"])
    _check_file(run, written, tree)
    if not plan.flaw.uploads:
        if evaluations:
            run.problem(f"a run that cannot upload has evaluations: {run.shape}")
        return run
    assert converted is not None
    _check_convert_agrees(run, written, converted)
    completed = [(i, e) for i, e in evaluations if e["status"] == "COMPLETED"]
    others = [e["status"] for _, e in evaluations if e["status"] not in ("COMPLETED", "CANCELLED")]
    if others:
        run.problem(f"evaluations neither COMPLETED nor CANCELLED: {others}")
    # What a person sees is every COMPLETED evaluation: samples count across all of them.
    stored = [s for evaluation_id, _ in completed for s in platform.samples(evaluation_id)]
    _check_samples(run, written, converted, stored)
    if len(completed) != 1:
        run.problem(f"{len(completed)} COMPLETED evaluations, not 1 ({run.shape})")
        return run
    evaluation = completed[0][1]
    if evaluation["finalize_count"] != 1:
        run.problem(f"{evaluation['finalize_count']} finalize requests, not 1")
    report = converted.report
    run.metrics_equal = (
        evaluation["metrics"] == report["metrics"]
        # the metadata the eval's own push sends, and evalpush's one key beside it
        and {k: v for k, v in evaluation["metadata"].items() if k != "evalpush"}
        == report["metadata"]
        and evaluation["name"] == report["name"]
    )
    if not run.metrics_equal:
        run.problem(
            f"name/metadata/metrics differ from `evalpush convert`: stored "
            f"{evaluation['metrics']}, convert {report['metrics']}"
        )
    return run


def _check_file(run: RunAccount, written: dict, tree: Path) -> None:
    sha256, size = file_digest(tree / run.plan.relpath / "traces.jsonl")
    if (sha256, size) != (written["sha256"], written["bytes"]):
        run.problem("the trace file changed after its writer finished")


def _check_convert_agrees(run: RunAccount, written: dict, converted: Converted) -> None:
    if converted.ids != written["good_ids"]:
        run.problem("`evalpush convert` gives other sample ids than the writer wrote")
    set_aside = len(converted.report["set_aside"])
    if set_aside != written["bad_lines"]:
        run.problem(
            f"`evalpush convert` set aside {set_aside} lines, the writer wrote "
            f"{written['bad_lines']} bad ones"
        )


def _check_samples(
    run: RunAccount, written: dict, converted: Converted, stored: list[dict[str, Any]]
) -> None:
    ids = [sample["sample_id"] for sample in stored]
    distinct, good = set(ids), set(written["good_ids"])
    run.lost = len(good - distinct)
    run.duplicated = len(ids) - len(distinct)
    run.unexpected = len(distinct - good)
    run.samples_equal = all(converted.samples.get(s["sample_id"]) == s for s in stored)
    if run.lost or run.duplicated or run.unexpected:
        run.problem(
            f"{run.lost} samples lost, {run.duplicated} duplicated, {run.unexpected} never written"
        )
    if not run.samples_equal:
        run.problem("stored samples differ from `evalpush convert`'s")
