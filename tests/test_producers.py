"""The later producers, verifiers 0.2.1, 0.3.1 and 0.4.0: their run directories, written by
their own writers, convert to the samples and aggregates their own pushes sent.

`tests/fixtures/producers/<version>/` is made by `tools/make_fixtures.py` (`tools/producers.py`
inside each version's own venv): `runs/<case>/<run dir>/` as the version wrote it, and
`recorded/<case>.json` with the requests its push made (0.4.0 online: prime-runs with the legacy
samples endpoint; offline: prime-runs' own projection, nothing being sent).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from evalpush.convert import Converted, RunTotals, convert_lines, scan, tally
from evalpush.read import read_lines
from test_fixtures import differences

PRODUCERS = Path(__file__).parent / "fixtures" / "producers"
RECORDED = sorted(PRODUCERS.glob("*/recorded/*.json"))
MIB = 1024 * 1024


def case_id(path: Path) -> str:
    return f"{path.parents[1].name}-{path.stem}"


def recording(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def run_dir(path: Path) -> Path:
    return path.parents[1] / recording(path)["run_dir"]


def sent(record: dict[str, Any]) -> tuple[list[dict], dict[str, Any] | None]:
    """The samples the producer sent, in order, and the metrics its finalize carried."""
    if "projected" in record:
        return record["projected"]["samples"], record["projected"]["metrics"]
    samples, metrics = [], None
    for request in record["requests"]:
        if request["path"].endswith("/samples"):
            samples += request["body"]["samples"]
        elif request["path"].endswith("/finalize"):
            metrics = request["body"]["metrics"]
    return samples, metrics


def converted(directory: Path) -> tuple[list[dict], RunTotals]:
    totals = RunTotals()
    lines = read_lines(directory / "traces.jsonl", max_line_bytes=MIB)
    items = list(convert_lines(lines, totals, max_line_bytes=MIB))
    refused = [item for item in items if not isinstance(item, Converted)]
    assert refused == [], refused
    return [json.loads(item.sample) for item in items], totals


def test_every_later_producer_has_its_fixtures():
    assert sorted({p.parents[1].name for p in RECORDED}) == ["0.2.1", "0.3.1", "0.4.0"]


@pytest.mark.parametrize("path", RECORDED, ids=case_id)
def test_the_samples_are_those_the_producers_own_push_sent(path: Path) -> None:
    want, _metrics = sent(recording(path))
    assert want, "the recording holds samples"

    got, _totals = converted(run_dir(path))

    assert [s["sample_id"] for s in got] == [s["sample_id"] for s in want]
    found = differences(want, got)
    assert not found, "\n".join(found[:40])


@pytest.mark.parametrize("path", RECORDED, ids=case_id)
def test_the_run_metrics_are_those_the_producers_own_push_sent(path: Path) -> None:
    _samples, want = sent(recording(path))
    assert want is not None

    _got, totals = converted(run_dir(path))

    metrics = totals.metrics()
    want = {k: v for k, v in want.items() if k != "prime_runs"}  # prime-runs' own bookkeeping
    found = differences(want, metrics)
    assert not found, "\n".join(found)


@pytest.mark.parametrize("path", RECORDED, ids=case_id)
def test_the_first_passes_total_the_run_as_conversion_does(path: Path) -> None:
    traces = run_dir(path) / "traces.jsonl"
    _got, totals = converted(run_dir(path))

    for first_pass in (tally, scan):
        found = first_pass(read_lines(traces, max_line_bytes=MIB), max_line_bytes=MIB)
        assert found.set_aside == []
        assert found.totals.to_json() == totals.to_json()
        assert RunTotals.from_json(found.totals.to_json()).metrics() == totals.metrics()
