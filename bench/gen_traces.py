"""Generate a realistic eval run directory of a given size, fast, without verifiers.

Writes `<out>/<run id>/config.toml` + `traces.jsonl`, shaped like a verifiers 0.1.15.dev437 run:
multi-turn tool-calling rollouts, renderer token ids / mask / logprobs on sampled nodes, usage,
rewards, metrics, timing, info, a few errored and truncated rollouts, task idxs interleaved as
concurrent rollouts finish. Every line is valid input for the producer's own `Trace[WireTask]`
model (no unknown keys), so the seed's `read_traces` reads it too. About 3.6 KB per trace, like
a real run (20,000 traces in 72 MB).

Speed: a few hundred distinct rollouts are rendered once into byte templates; each line then
only fills in its id, task idx, rewards and timestamps. 1 GiB takes seconds, not minutes.

    python bench/gen_traces.py [--mb 72] [--out bench/.cache] [--seed 0]

MB here is 10**6 bytes. Deterministic for a given (size, seed): same run id, same bytes.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import uuid
from pathlib import Path

MB = 10**6
VARIANTS = 256
NUM_ROLLOUTS = 4
WINDOW_TASKS = 16  # tasks in flight at once: their rollouts finish in shuffled order
T0 = 1767225600.0
NAMESPACE = uuid.UUID("0d7f3f4e-3b35-4a56-8f0e-6b2d3c9a7e21")
MODEL = "openai/gpt-4.1-mini"
TASKSET = "reverse-text"

WORDS = (
    "the a of to and in is that for it as with was on be by this are or from at an which have "
    "file function value return error test output input string list number result check line "
    "python code run build path config data model token write read parse reverse text sort "
    "count first last next step answer because then update fix call tool shell command print "
    "naïve café résumé über 数据 テスト"
).split()
TOOLS = ("bash", "edit", "read_file", "search", "python")
_FIELD = re.compile(rb'"@@(\w+)@@"')


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def prompt_node(rng: random.Random, role: str, parent: int | None, words: int, **extra) -> dict:
    node = {
        "message": {"role": role, **extra, "content": text(rng, words)},
        "sampled": False,
        "token_ids": [],
        "mask": [],
        "is_content": [],
        "logprobs": [],
    }
    return {"parent": parent, **node} if parent is not None else node


def sampled_node(
    rng: random.Random, parent: int, prompt_tokens: int, message: dict, finish: str
) -> dict:
    scaffold, completion = 3, rng.randint(7, 16)
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion}
    if rng.random() < 0.5:
        usage["cached_input_tokens"] = (
            rng.randrange(0, prompt_tokens, 64) if prompt_tokens > 64 else 0
        )
    if rng.random() < 0.3:
        usage["reasoning_tokens"] = rng.randint(0, completion)
    if rng.random() < 0.6:
        usage["cost"] = round(prompt_tokens * 4e-7 + completion * 1.6e-6, 9)
    return {
        "parent": parent,
        "message": message,
        "sampled": True,
        "token_ids": [rng.randrange(151_000) for _ in range(scaffold + completion)],
        "mask": [False] * scaffold + [True] * completion,
        "is_content": [False] * scaffold + [True] * completion,
        "logprobs": [-rng.expovariate(8.0) for _ in range(completion)],
        "finish_reason": finish,
        "usage": usage,
    }


def nodes_for(rng: random.Random, prompt: str) -> tuple[list[dict], int]:
    """A tool-calling conversation: system, user, 1-2 (call, result) turns, a final answer."""
    nodes = [
        prompt_node(rng, "system", None, 12),
        {
            "parent": 0,
            "message": {"role": "user", "content": prompt},
            "sampled": False,
            "token_ids": [],
            "mask": [],
            "is_content": [],
            "logprobs": [],
        },
    ]
    turns, context = rng.randint(1, 2), 180
    for _ in range(turns):
        call_id = f"call_{rng.getrandbits(48):012x}"
        call = {
            "id": call_id,
            "name": rng.choice(TOOLS),
            "arguments": json.dumps({"cmd": text(rng, 6)}, ensure_ascii=False),
        }
        message = {
            "role": "assistant",
            "content": None if rng.random() < 0.5 else text(rng, 8),
            "tool_calls": [call],
        }
        if message["content"] is None:
            del message["content"]
        nodes.append(sampled_node(rng, len(nodes) - 1, context, message, "tool_calls"))
        context += 60
        nodes.append(
            prompt_node(rng, "tool", len(nodes) - 1, rng.randint(6, 18), tool_call_id=call_id)
        )
        context += 40
    finish = "length" if rng.random() < 0.04 else "stop"
    nodes.append(
        sampled_node(
            rng, len(nodes) - 1, context, {"role": "assistant", "content": text(rng, 12)}, finish
        )
    )
    return nodes, turns


def variant(rng: random.Random) -> dict:
    """One rollout with `@@name@@` placeholders where each line gets its own values."""
    prompt = f"Reverse the words of: {text(rng, 18)}"
    nodes, turns = nodes_for(rng, prompt)
    errored = rng.random() < 0.03
    trace = {
        "id": "@@id@@",
        "task": {
            "idx": "@@idx@@",
            "prompt": prompt,
            "timeout": {},
            "resources": {},
            "answer": text(rng, 5),
        },
        "nodes": nodes,
        "rewards": {"correct": "@@correct@@", "format": "@@format@@"},
        "metrics": {
            "num_turns": float(turns + 1),
            "num_tool_calls": float(turns),
            "response_chars": "@@chars@@",
        },
        "info": {"exit_code": 0, "stdout_tail": text(rng, 6)},
        "extra_usage": [],
        "is_completed": True,
        "stop_condition": "error" if errored else "agent_completed",
        "errors": [{"type": "TimeoutError", "message": "tool call timed out after 30s"}]
        if errored
        else [],
        "timing": {
            "start": "@@t0@@",
            "setup": {"start": "@@t0@@", "end": "@@t1@@"},
            "generation": {"start": "@@t1@@", "end": "@@t2@@"},
            "finalize": {"start": "@@t2@@", "end": "@@t3@@"},
            "scoring": {"start": "@@t3@@", "end": "@@t4@@"},
        },
    }
    return trace


def template(trace: dict) -> list:
    """The line as alternating literal bytes and placeholder names: [bytes, name, bytes, ...]."""
    raw = json.dumps(trace, ensure_ascii=False, separators=(",", ":")).encode()
    pieces = _FIELD.split(raw)
    return [p if i % 2 == 0 else p.decode() for i, p in enumerate(pieces)]


def fill(parts: list, values: dict[str, bytes]) -> bytes:
    out = [parts[0]]
    for i in range(1, len(parts), 2):
        out.append(values[parts[i]])
        out.append(parts[i + 1])
    out.append(b"\n")
    return b"".join(out)


def task_order(rng: random.Random, count: int) -> list[int]:
    """Task idxs in finishing order: each task's rollouts land interleaved with its neighbours'."""
    order: list[int] = []
    window = WINDOW_TASKS * NUM_ROLLOUTS
    for start in range(0, count, window):
        block = [(start + i) // NUM_ROLLOUTS for i in range(min(window, count - start))]
        rng.shuffle(block)
        order += block
    return order


def line_values(rng: random.Random, n: int, idx: int) -> dict[str, bytes]:
    t0 = T0 + n * 0.37
    marks = [t0, t0 + rng.uniform(0.5, 3), 0.0, 0.0, 0.0]
    marks[2] = marks[1] + rng.uniform(5, 90)
    marks[3] = marks[2] + rng.uniform(0.1, 2)
    marks[4] = marks[3] + rng.uniform(0.1, 1)
    values = {f"t{i}": repr(m).encode() for i, m in enumerate(marks)}
    values.update(
        id=b'"' + uuid.UUID(int=rng.getrandbits(128), version=4).hex.encode() + b'"',
        idx=str(idx).encode(),
        correct=b"1.0" if rng.random() < 0.6 else b"0.0",
        format=repr(rng.choice((0.0, 0.25, 0.5))).encode(),
        chars=repr(float(rng.randint(20, 900))).encode(),
    )
    return values


def config_toml(num_tasks: int) -> str:
    return (
        f'model = "{MODEL}"\nnum_tasks = {num_tasks}\nnum_rollouts = {NUM_ROLLOUTS}\n'
        f'max_concurrent = 128\nrich = false\npush = false\n\n[taskset]\nid = "{TASKSET}"\n'
        'judges = []\n\n[harness]\nid = "default"\n\n[harness.runtime]\ntype = "subprocess"\n\n'
        "[sampling]\ntemperature = 1.0\n"
    )


def run_dir_for(out: Path, size_bytes: int, seed: int = 0) -> Path:
    run_id = uuid.UUID(bytes=uuid.uuid5(NAMESPACE, f"{size_bytes}/{seed}").bytes, version=4)
    return out / str(run_id)


def generate(out: Path, size_bytes: int, seed: int = 0, *, reuse: bool = False) -> Path:
    """Write a run of about `size_bytes` under `out`; return its directory (leaf = run id).

    The directory appears whole (built beside it, then renamed), so an existing one is
    complete: `reuse=True` returns it as is."""
    run_dir = run_dir_for(out, size_bytes, seed)
    if reuse and run_dir.is_dir():
        return run_dir
    rng = random.Random(seed)
    templates = [template(variant(rng)) for _ in range(VARIANTS)]
    average = sum(len(fill(t, line_values(rng, 0, 0))) for t in templates) / VARIANTS
    count = max(NUM_ROLLOUTS, round(size_bytes / average / NUM_ROLLOUTS) * NUM_ROLLOUTS)
    partial = out / f".{run_dir.name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    (partial / "config.toml").write_text(config_toml(count // NUM_ROLLOUTS))
    with open(partial / "traces.jsonl", "wb") as f:
        chunk: list[bytes] = []
        for n, idx in enumerate(task_order(rng, count)):
            chunk.append(fill(templates[rng.randrange(VARIANTS)], line_values(rng, n, idx)))
            if len(chunk) == 2048:
                f.write(b"".join(chunk))
                chunk.clear()
        f.write(b"".join(chunk))
    shutil.rmtree(run_dir, ignore_errors=True)
    partial.rename(run_dir)
    return run_dir


# ---------------------------------------------------------------- the later producers' shapes


def _calls_of(trace: dict) -> list[dict]:
    """The seed's per-node usage and finish reasons as 0.2 on record them: one call a sampled
    node (taken off the nodes)."""
    calls = []
    for i, node in enumerate(trace.get("nodes", ())):
        usage, finish = node.pop("usage", None), node.pop("finish_reason", None)
        if node.get("sampled"):
            calls.append({"node": i, "finish_reason": finish, "usage": usage})
    return calls


def _compact(value: dict) -> bytes:
    """One line as pydantic writes it: compact, UTF-8."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def as_v2_line(line: bytes, run_id: str) -> bytes:
    """A seed trace line as verifiers 0.2 writes the same rollout (`version` 2, the task row
    under `task.data`, usage in `calls`)."""
    trace = json.loads(line)
    calls = _calls_of(trace)
    task = {"type": "Task", "data": trace.pop("task")}
    v2 = {"id": trace.pop("id"), "task": task, "version": 2, "run": {"type": "eval", "id": run_id}}
    return _compact({**v2, **trace, "calls": calls})


def as_episode_line(line: bytes, n: int, run_id: str) -> bytes:
    """A seed trace line as verifiers 0.4 writes the same rollout: an episode of one agent's
    trace, the task row under `task.data`, usage in `calls`, rewards as `{score, weight}`."""
    trace = json.loads(line)
    calls = _calls_of(trace)
    task = {"type": "Task", "data": trace.pop("task")}
    rewards = {k: {"score": v, "weight": 1.0} for k, v in trace.pop("rewards", {}).items()}
    inner = {
        "version": 1,
        **trace,
        "verifiers": {"version": "0.4.0"},
        "task": task,
        "agent": {"config": {}, "name": "agent", "trainable": True},
        "calls": calls,
        "rewards": rewards,
    }
    episode = {
        "id": f"episode-{n}-{run_id[-8:]}",
        "env": {"id": TASKSET},
        "task": task,
        "run": {"type": "eval", "id": run_id},
        "ok": not trace.get("errors"),
        "errors": [],
        "traces": [inner],
    }
    return _compact(episode)


def rewrite_as(run_dir: Path, out: Path, producer: str) -> Path:
    """The seed run `run_dir`'s rollouts as a `producer` ("0.2" or "0.4") run under `out`: 0.2 in
    the seed's layout (same config.toml, same run id), 0.4 in its own (configs/resolved/eval.json,
    a `<env>--<model>--<harness>--<8 hex>` directory, an offline `disabled-` run id). Made once."""
    if producer == "0.2":
        target, run_id = out / run_dir.name, run_dir.name
    else:
        target = out / f"{TASKSET}--{MODEL.replace('/', '--')}--default--{run_dir.name[:8]}"
        run_id = f"disabled-{run_dir.name.replace('-', '')[:16]}"
    if (target / "traces.jsonl").exists():
        return target
    target.mkdir(parents=True, exist_ok=True)
    if producer == "0.2":
        shutil.copyfile(run_dir / "config.toml", target / "config.toml")
    else:
        tasks = len(set(re.findall(rb'"idx": ?(\d+)', (run_dir / "traces.jsonl").read_bytes())))
        config = {
            "env": {"taskset": {"id": TASKSET}},
            "run": {"name": target.name, "dir": target.name},
            "model": MODEL,
            "select": {"limit": tasks},
            "num_rollouts": NUM_ROLLOUTS,
            "push": False,
        }
        (target / "configs" / "resolved").mkdir(parents=True)
        (target / "configs" / "resolved" / "eval.json").write_text(json.dumps(config))
    partial = target / "traces.jsonl.part"
    with open(run_dir / "traces.jsonl", "rb") as lines, open(partial, "wb") as written:
        for n, line in enumerate(lines):
            written.write(
                as_v2_line(line, run_id) if producer == "0.2" else as_episode_line(line, n, run_id)
            )
    partial.rename(target / "traces.jsonl")
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=72.0, help="target size, 10**6 bytes")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / ".cache")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    run_dir = generate(args.out, int(args.mb * MB), args.seed)
    size = (run_dir / "traces.jsonl").stat().st_size
    print(f"{run_dir}  {size / MB:.1f} MB")


if __name__ == "__main__":
    main()
