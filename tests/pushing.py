"""Test helpers for `evalpush push` as real subprocesses against a local platform.

- `generated_run(out, size_bytes, seed)`: a realistic run directory from bench/gen_traces.py
  (`support.producer`).
- `outputs(tmp_path, sources, group=...)`: copies of run directories under `tmp_path/outputs/<group>/`.
- `push_environ(platform, tmp_path, **extra)`: `support.environ.cli_environ` (pointed at
  `platform`, with a state dir and home under `tmp_path`) with 20-sample batches, a 5 s read
  timeout and warning-level logs.
- `start_push(roots, environ, *flags)`: `python -m evalpush push ROOTS... FLAGS...`, started.
- `push_until_done(root, environ)`: pushes until one exits 0 (at most 3).
- `assert_exactly_once(platform, root)`: every run directory under `root/*/*` passes
  `assert_run_exactly_once(platform, run_dir)`, and the platform holds no other evaluation:
  one evaluation on the platform, COMPLETED, finalized once, holding each of its samples once,
  with the name, metadata and metrics the producer's own push would send.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from evalpush.config import Config
from evalpush.convert import scan, summary
from evalpush.local_platform import LocalPlatform
from evalpush.runs import load_run, read_lines
from support.environ import cli_environ
from support.producer import generated_run

__all__ = ["generated_run"]  # re-exported: the tests of push import it from here

ROOT = Path(__file__).resolve().parents[1]
"""The repository's root (kept for the tests that import it from here)."""
PUSH_TIMEOUT_SECONDS = 60


def outputs(tmp_path: Path, sources: list[Path], *, group: str = "env--model--harness") -> Path:
    """Copies of the run directories `sources` (whatever their layout) under
    `tmp_path/outputs/<group>/`."""
    root = tmp_path / "outputs"
    for run in sources:
        shutil.copytree(run, root / group / run.name, symlinks=True)
    return root


def push_environ(platform: LocalPlatform, tmp_path: Path, **extra: str) -> dict[str, str]:
    settings = {
        "EVALPUSH_UPLOAD__MAX_BATCH_SAMPLES": "20",
        "EVALPUSH_PLATFORM__READ_TIMEOUT_SECONDS": "5",
        "EVALPUSH_LOG__LEVEL": "warning",
    }
    return cli_environ(platform, tmp_path, **{**settings, **extra})


def start_push(
    roots: Path | list[Path], environ: dict[str, str], *flags: str
) -> subprocess.Popen[bytes]:
    roots = roots if isinstance(roots, list) else [roots]
    return subprocess.Popen(
        [sys.executable, "-m", "evalpush", "push", *map(str, roots), *flags],
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def push_until_done(root: Path, environ: dict[str, str]) -> None:
    for _ in range(3):
        process = start_push(root, environ)
        out, err = process.communicate(timeout=PUSH_TIMEOUT_SECONDS)
        if process.returncode == 0:
            return
    pytest.fail(f"push did not finish: exit {process.returncode}\n{out.decode()}\n{err.decode()}")


def expected(run_dir: Path, *, max_line_bytes: int | None = None) -> tuple[list[str], dict]:
    """The sample ids in file order (of the lines conversion accepts, under `max_line_bytes`,
    the default unless given) and the create summary the producer's push would send."""
    run = load_run(run_dir)
    limit = max_line_bytes or Config().read.max_line_bytes
    found = scan(read_lines(run.traces_path, max_line_bytes=limit), max_line_bytes=limit)
    refused = {aside.line for aside in found.set_aside}
    ids = [
        json.loads(line.data)["id"]  # json, not orjson: it reads NaN as the converter does
        for line in read_lines(run.traces_path, max_line_bytes=limit)
        if line.data and line.number not in refused
    ]
    return ids, summary(run, found.totals)


def _as_sent(value: Any) -> Any:
    """`value` as JSON carries it: a value that is not finite (NaN) is sent as null."""
    return orjson.loads(orjson.dumps(value))


def assert_exactly_once(platform: LocalPlatform, root: Path) -> None:
    run_dirs = sorted(p for p in root.glob("*/*") if p.is_dir())
    assert len(platform.summary()["evaluations"]) == len(run_dirs)
    for run_dir in run_dirs:
        assert_run_exactly_once(platform, run_dir)


def as_the_eval_sends(metadata: dict) -> dict:
    """An evaluation's metadata without the one key evalpush adds (`evalpush`): what the
    eval's own push would have sent."""
    return {k: v for k, v in metadata.items() if k != "evalpush"}


def assert_run_exactly_once(
    platform: LocalPlatform, run_dir: Path, *, max_line_bytes: int | None = None
) -> None:
    """`run_dir` has exactly one evaluation on the platform, COMPLETED, finalized once, holding
    each of its samples once, with the name, metadata and metrics the producer's push sends
    (lines over `max_line_bytes`, the default unless given, left out)."""
    state = platform.summary()
    ids, expected_summary = expected(run_dir, max_line_bytes=max_line_bytes)
    assert state["runs"][expected_summary["run_id"]] == 1, "one evaluation per run"
    evaluation_id, evaluation = next(
        (k, e)
        for k, e in state["evaluations"].items()
        if e["metadata"]["run_id"] == expected_summary["run_id"]
    )
    assert evaluation["status"] == "COMPLETED"
    assert evaluation["finalize_count"] == 1
    assert evaluation["duplicates"] == 0
    assert evaluation["sample_count"] == len(ids)
    stored = [s["sample_id"] for s in platform.samples(evaluation_id)]
    assert sorted(stored) == sorted(ids), "every sample exactly once"
    assert as_the_eval_sends(evaluation["metadata"]) == _as_sent(expected_summary["metadata"])
    assert evaluation["metrics"] == _as_sent(expected_summary["metrics"])
    assert evaluation["name"] == expected_summary["name"]
