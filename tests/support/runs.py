"""Run directories as the producer writes them: trace lines, config.toml, the directory itself,
and the ways a producer (or `--resume`) changes a trace file afterwards.

- `trace_line(i, idx=None, ...)`: a small valid trace line (`trace-{i}`, a two-message
  conversation, a `correct` reward of `i % 2`); `traces(count, start=0)`: `count` of them, two
  rollouts a task.
- `config_toml(...)`: a config.toml's text (`model`, `num_rollouts`, `num_tasks`, `push`, the
  taskset id), in the order the producer writes them.
- `write_run(root, lines=None, run_id=..., group=..., config=...)`: `root/group/run_id` with its
  config.toml and `lines` as traces.jsonl (the run as `push` finds it under an outputs root).
- `make_run(directory, config=..., traces=..., data=...)`: a run directory from raw parts (no
  config.toml or no trace file when None), for tests of what a run directory is.
- `append_lines(run, *lines)`: the producer appending; `rewrite_in_place(run, lines)`: the trace
  file truncated and written again (the same inode).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import orjson

RUN_ID = "5b0c7f3e-1d2a-4c3b-9e8f-7a6b5c4d3e2f"
OTHER_RUN_ID = "9d8c7b6a-5f4e-4d3c-8b2a-1f0e9d8c7b6a"
GROUP = "gsm8k--org--model--default"
"""The run's parent directory under an outputs root: `<env>--<org>--<model>--<harness>`."""
MINIMAL_CONFIG = '[taskset]\nid = "gsm8k"\n'
ROLLOUTS = 2


def trace_line(
    i: int,
    idx: int | None = None,
    *,
    sample_id: str | None = None,
    prompt: str = "2+2?",
    answer: str = "4",
    reward: float | None = None,
) -> bytes:
    """Trace `i` of task `idx` (`i // 2` unless given): the user's `prompt`, the sampled
    `answer`, reward `correct` = `i % 2` unless `reward` is given."""
    return orjson.dumps(
        {
            "id": f"trace-{i}" if sample_id is None else sample_id,
            "task": {
                "idx": i // ROLLOUTS if idx is None else idx,
                "prompt": prompt,
                "answer": answer,
            },
            "nodes": [
                {"message": {"role": "user", "content": prompt}},
                {"parent": 0, "message": {"role": "assistant", "content": answer}, "sampled": True},
            ],
            "rewards": {"correct": float(i % 2) if reward is None else reward},
            "is_completed": True,
        }
    )


def traces(count: int, *, start: int = 0) -> list[bytes]:
    """`trace_line(i)` for `count` traces from `start`: two rollouts a task."""
    return [trace_line(i) for i in range(start, start + count)]


def config_toml(
    *,
    env: str = "gsm8k",
    model: str = "org/model",
    num_rollouts: int = ROLLOUTS,
    num_tasks: int | None = None,
    push: bool | None = False,
    extra: str = "",
) -> str:
    """A config.toml: `num_tasks` and `push` lines only when not None, `extra` lines before
    the `[taskset]` table."""
    tasks = "" if num_tasks is None else f"num_tasks = {num_tasks}\n"
    pushed = "" if push is None else f"push = {'true' if push else 'false'}\n"
    return (
        f'model = "{model}"\nnum_rollouts = {num_rollouts}\n{tasks}{pushed}{extra}'
        f'[taskset]\nid = "{env}"\n'
    )


def jsonl(lines: Iterable[bytes]) -> bytes:
    """The lines as a trace file holds them, each ended by `\\n`."""
    return b"".join(line + b"\n" for line in lines)


def write_run(
    root: Path,
    lines: list[bytes] | None = None,
    *,
    run_id: str = RUN_ID,
    group: str = GROUP,
    config: str | None = None,
) -> Path:
    """`root/group/run_id` (`group=""`: `root/run_id`) with `config` (by default two tasks of
    two rollouts, env `gsm8k`) as config.toml and `lines` (by default `traces(4)`) as
    traces.jsonl."""
    run = root / group / run_id
    run.mkdir(parents=True)
    (run / "config.toml").write_text(config if config is not None else config_toml(num_tasks=2))
    (run / "traces.jsonl").write_bytes(jsonl(lines if lines is not None else traces(4)))
    return run


def make_run(
    directory: Path,
    config: str | None = MINIMAL_CONFIG,
    traces: str | None = "traces.jsonl",
    data: bytes = b"",
) -> Path:
    """`directory` (made if missing) with `config` as config.toml and `data` as its trace file
    named `traces`; either left out when None."""
    directory.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (directory / "config.toml").write_text(config)
    if traces is not None:
        (directory / traces).write_bytes(data)
    return directory


def append_lines(run: Path, *lines: bytes) -> None:
    """Append `lines` to the run's traces.jsonl, as the producer does."""
    with (run / "traces.jsonl").open("ab") as f:
        f.write(jsonl(lines))


def rewrite_in_place(run: Path, lines: list[bytes]) -> None:
    """Truncate traces.jsonl and write `lines` into the same file (same inode)."""
    with (run / "traces.jsonl").open("r+b") as f:
        f.truncate(0)
        f.write(jsonl(lines))
