"""`evalpush convert` reproduces what the real producer sends, run by run.

Each `tests/fixtures/recorded/<case>.json` holds the requests verifiers 0.1.15.dev437's own
`push_traces` made for the run directory beside it (`tools/make_fixtures.py` writes both). The
converter must turn that directory into the same samples, and its summary must carry the same
name, metadata and metrics as the create, finalize and resolve bodies.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
RECORDED = sorted((FIXTURES / "recorded").glob("*.json"))
FLOAT_RELATIVE_TOLERANCE = 1e-12
MAX_REPORTED_DIFFERENCES = 40


def differences(expected, actual, path: str = "") -> list[str]:
    """Every place `actual` differs from `expected`, as `path: expected ... got ...` lines.

    JSON types are kept apart (`0` is not `0.0`, `true` is not `1`); floats agree within a
    relative 1e-12, since a sum may be taken in another order."""
    if type(expected) is not type(actual):
        return [
            f"{path or '.'}: expected {expected!r} ({type(expected).__name__}), "
            f"got {actual!r} ({type(actual).__name__})"
        ]
    if isinstance(expected, dict):
        found = []
        for key in expected.keys() - actual.keys():
            found.append(f"{path}.{key}: missing (expected {expected[key]!r})")
        for key in actual.keys() - expected.keys():
            found.append(f"{path}.{key}: unexpected key (got {actual[key]!r})")
        for key in expected.keys() & actual.keys():
            found += differences(expected[key], actual[key], f"{path}.{key}")
        return found
    if isinstance(expected, list):
        if len(expected) != len(actual):
            return [f"{path}: expected {len(expected)} items, got {len(actual)}"]
        found = []
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            found += differences(e, a, f"{path}[{i}]")
        return found
    if isinstance(expected, float):
        if math.isclose(expected, actual, rel_tol=FLOAT_RELATIVE_TOLERANCE, abs_tol=0.0):
            return []
    elif expected == actual:
        return []
    return [f"{path or '.'}: expected {expected!r}, got {actual!r}"]


def convert(run_dir: Path) -> tuple[list[dict], dict]:
    """Run `evalpush convert` on a run directory: its samples and its summary line."""
    done = subprocess.run(
        [sys.executable, "-m", "evalpush", "convert", str(run_dir)],
        capture_output=True,
        timeout=60,
    )
    stderr = done.stderr.decode(errors="replace")
    assert done.returncode == 0, f"exit {done.returncode}; stderr:\n{stderr}"
    samples = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    summary = json.loads(stderr.strip().splitlines()[-1])
    return samples, summary


def bodies(record: dict) -> dict[str, dict]:
    """The recorded request bodies by step, checking the producer's order on the way."""
    steps = {}
    for request in record["requests"]:
        path = request["path"]
        step = (
            "resolve"
            if path.endswith("/environmentshub/resolve")
            else "create"
            if path.endswith("/evaluations/")
            else path.rsplit("/", 1)[-1]
        )
        steps[step] = request["body"]
    assert list(steps) == ["resolve", "create", "samples", "finalize"], list(steps)
    return steps


def assert_same(expected, actual, what: str) -> None:
    found = differences(expected, actual)
    shown = "\n".join(found[:MAX_REPORTED_DIFFERENCES])
    more = len(found) - MAX_REPORTED_DIFFERENCES
    assert not found, f"{what}:\n{shown}" + (f"\n... and {more} more" if more > 0 else "")


@pytest.fixture(params=RECORDED, ids=[p.stem for p in RECORDED], scope="module")
def case(request):
    record = json.loads(request.param.read_text())
    samples, summary = convert(FIXTURES / record["run_dir"])
    return bodies(record), samples, summary


def test_there_are_recorded_cases():
    """The fixtures exist (`python tools/make_fixtures.py` writes them)."""
    assert RECORDED


def test_every_recorded_sample_is_reproduced_exactly(case):
    """Each sample the producer pushed comes out of `convert`, equal, in file order."""
    steps, samples, _ = case
    expected = steps["samples"]["samples"]
    assert [s.get("sample_id") for s in samples] == [s["sample_id"] for s in expected]
    assert_same(expected, samples, "samples (by position in the file)")


def test_summary_matches_create_finalize_and_resolve(case):
    """The summary carries the name, metadata and metrics the producer sent."""
    steps, _, summary = case
    create = steps["create"]
    assert_same(create["name"], summary["name"], "name")
    assert_same(create["metadata"], summary["metadata"], "metadata (create)")
    assert_same(create["metrics"], summary["metrics"], "metrics (create)")
    assert_same(steps["finalize"]["metrics"], summary["metrics"], "metrics (finalize)")
    assert_same(steps["resolve"]["name"], summary["env_name"], "env_name (resolve)")
    assert_same(create["metadata"]["run_id"], summary["run_id"], "run_id")


def test_no_line_of_a_producer_run_is_set_aside(case):
    """Lines the producer wrote are all good lines."""
    _, _, summary = case
    assert not summary["set_aside"]
