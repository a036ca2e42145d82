"""`evalpush demo`: the main job on an embedded default, no account needed.

Starts the local platform on loopback, writes sample eval runs into a scratch directory (a
finished run, a run with a bad line, a legacy `results.jsonl` run, a debug run and a replay run),
uploads them with the same machinery as `evalpush push` (ledger, exactly-once protocol, retries),
and prints the status table with each evaluation's viewer URL. With `--keep`, the local platform
keeps serving until Ctrl-C, so the URLs can be opened.
"""

from __future__ import annotations

import random
import signal
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import msgspec

from evalpush.app import App
from evalpush.config import Config
from evalpush.local_platform import LocalPlatform
from evalpush.push import push
from evalpush.report import push_line, status_rows, status_table

DEMO_SEED = 7
TASKSET = "reverse-text"
MODEL = "openai/gpt-4.1-mini"


def _trace(rng: random.Random, n: int, idx: int) -> dict:
    words = rng.sample(["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa"], 4)
    prompt = " ".join(words)
    answer = " ".join(reversed(words))
    correct = rng.random() < 0.7
    completion = answer if correct else prompt
    return {
        "id": uuid.UUID(int=rng.getrandbits(128), version=4).hex,
        "task": {"idx": idx, "prompt": f"Reverse: {prompt}", "answer": answer},
        "nodes": [
            {
                "message": {"role": "user", "content": f"Reverse: {prompt}"},
                "token_ids": [1] * 6,
                "mask": [False] * 6,
            },
            {
                "parent": 0,
                "message": {"role": "assistant", "content": completion},
                "sampled": True,
                "token_ids": [2] * 4,
                "mask": [True] * 4,
                "finish_reason": "stop",
                "usage": {"prompt_tokens": 6, "completion_tokens": 4},
            },
        ],
        "rewards": {"correct": 1.0 if correct else 0.0},
        "metrics": {"num_words": 4.0},
        "is_completed": True,
        "stop_condition": "completed",
        "timing": {
            "start": 1767225600.0 + n,
            "generation": {"start": 1767225600.0 + n, "end": 1767225601.5 + n},
        },
    }


def _write_run(
    root: Path,
    kind: str,
    *,
    traces: int,
    extra_config: str = "",
    bad_line: bool = False,
    file_name: str = "traces.jsonl",
) -> Path:
    rng = random.Random(f"{DEMO_SEED}/{kind}")
    run = root / f"{TASKSET}--{kind}" / str(uuid.UUID(int=rng.getrandbits(128), version=4))
    run.mkdir(parents=True)
    model = "" if kind == "replay" else f'model = "{MODEL}"\n'  # a replay config has none
    (run / "config.toml").write_text(
        f"{model}num_rollouts = 2\nnum_tasks = {traces // 2}\npush = false\n"
        f'{extra_config}\n[taskset]\nid = "{TASKSET}"\n'
    )
    lines = [msgspec.json.encode(_trace(rng, n, n // 2)) for n in range(traces)]
    if bad_line:
        lines.insert(2, b'{"id": "broken", "task": {"idx": "three"}}')
    (run / file_name).write_bytes(b"".join(line + b"\n" for line in lines))
    return run


def write_sample_runs(root: Path) -> list[Path]:
    """The demo's runs under `root`: what an outputs directory of a busy eval box holds."""
    return [
        _write_run(root, "finished", traces=40),
        _write_run(root, "with-a-bad-line", traces=20, bad_line=True),
        _write_run(root, "legacy-results", traces=10, file_name="results.jsonl"),
        _write_run(root, "debug", traces=4, extra_config='command = "pytest -x"'),
        _write_run(root, "replay", traces=4, extra_config="num_rescores = 1"),
    ]


@contextmanager
def _scratch(directory: Path | None) -> Iterator[Path]:
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
        yield directory
        return
    with tempfile.TemporaryDirectory(prefix="evalpush-demo-") as scratch:
        yield Path(scratch)


def run_demo(out: IO[str], *, directory: Path | None = None, keep: bool = False) -> int:
    with _scratch(directory) as scratch, LocalPlatform(api_key="demo-key-not-secret") as platform:
        outputs = scratch / "outputs"
        runs = write_sample_runs(outputs)
        out.write(f"local platform: {platform.base_url}\nsample runs:    {outputs}\n\n")
        config = Config.model_validate(
            {
                "platform": {"api_base_url": platform.base_url, "frontend_url": platform.base_url},
                "state": {"dir": str(scratch / "state")},
            }
        )
        # Only the demo's own platform: neither the caller's PRIME_* variables nor their
        # ~/.prime/config.json may point it at the real one.
        isolated = {"PRIME_API_KEY": platform.api_key}
        with App.from_config(config, wait_on_auth=False, environ=isolated, home=scratch) as app:
            results = push(app, runs)
            rows = status_rows(app.ledger)
        for result in results:
            out.write(push_line(result) + "\n")
        out.write("\n" + status_table(rows) + "\n")
        if keep:
            out.write(f"\nserving {platform.base_url} until Ctrl-C\n")
            out.flush()
            try:
                while True:
                    signal.pause()
            except KeyboardInterrupt:
                pass
    return 0
