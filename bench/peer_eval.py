"""A verifiers 0.4.0 eval without the model: `bench/peer.py`'s stand-in for `uv run eval`, run
inside the producer venv `tools/make_fixtures.py --only 0.4.0` makes (`.venv-producer-0.4.0`).

It does what 0.4.0's eval runner does around each rollout, with the version's own code: writes
the resolved config (`save_config`), opens the run (`open_run`: prime-runs creates the platform's
evaluation when the push is on, or mints a `disabled-` id when it is off), then, at `rate`
episodes a second, stamps each episode with the run (`record_run`), appends it to
`traces.jsonl` (`write_episode`) and hands it to the push (`log_episodes`), and at the end
closes the run out (`finish_run`: drain, metrics, finalize). The rollouts are built with the
version's own models (the fixtures' shapes, `tools/producers.py`); no model is called.

Writes `--report` (JSON): the run directory, the run id, when each episode's line was on disk
(`time.time()`), and the process's CPU seconds from opening the run to closing it out (every
thread: the push's upload thread too; the imports before are left out).

    .venv-producer-0.4.0/bin/python bench/peer_eval.py --out DIR --report FILE \
        [--seconds 600] [--rate 20] [--push | --no-push]

The platform comes from the environment, as for the eval: PRIME_API_BASE_URL / PRIME_BASE_URL,
PRIME_API_KEY, and PRIME_TRACES_OPT_OUT=1 (the local platform has the legacy samples endpoint,
not Prime Traces).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

TOOLS = Path(__file__).resolve().parent.parent / "tools"
sys.path.insert(0, str(TOOLS))
from make_fixtures import fixed_uuid4, install_taskset  # noqa: E402
from producers import Build, rollout_fields, tasks  # noqa: E402

SHAPES = ("linear", "tools", "branching", "length")
TASKS = 3


def episode(b: Build, task: dict, n: int, run_info):
    from verifiers.v1.configs.agent import WireAgentConfig
    from verifiers.v1.episode import EnvInfo, Episode
    from verifiers.v1.trace import AgentInfo, TraceTask, WireTrace

    idx = n % TASKS
    fields = rollout_fields(b, "peer", n, SHAPES[n % len(SHAPES)])
    trace = WireTrace(
        task=TraceTask(type="ReverseTextTask", data=task[idx]),
        agent=AgentInfo(config=WireAgentConfig()),
        **fields,
    )
    made = Episode(
        id=fixed_uuid4(f"peer/episode/{n}").hex,
        env=EnvInfo(id="reverse-text"),
        task=TraceTask(type="ReverseTextTask", data=task[idx]),
        ok=True,
        traces=[trace],
    )
    made.record_run(run_info)
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the eval's output_dir")
    parser.add_argument("--report", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--rate", type=float, default=20)
    parser.add_argument("--push", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()
    count = int(args.seconds * args.rate) // TASKS * TASKS

    from verifiers.v1.cli.output import create_attempt_log_dir, output_path, save_config
    from verifiers.v1.configs.cli.eval import EvalConfig
    from verifiers.v1.episode import EvalRunInfo
    from verifiers.v1.utils.platform import PushState, finish_run, log_episodes, open_run
    from verifiers.v1.utils.trace_store import write_episode

    with tempfile.TemporaryDirectory(prefix="taskset-") as scratch:
        install_taskset(Path(scratch))
        b = Build("0.4.0")
        task = tasks(b)
        name = f"reverse-text--openai--gpt-4.1-mini--peer-{int(time.time())}"
        config = EvalConfig.model_validate(
            {
                "env": {"taskset": {"id": "reverse-text"}},
                "model": "openai/gpt-4.1-mini",
                "num_rollouts": count // TASKS,
                "select": {"limit": TASKS},
                "run": {"name": name, "dir": name},
                "output_dir": str(args.out),
                "push": args.push,
            }
        )
        out = output_path(config)
        save_config(config, out)
        create_attempt_log_dir(out)
        state = PushState()
        cpu_at_start = time.process_time()  # the imports and the config are behind
        run = open_run(config, state, num_examples=TASKS)
        run_info = EvalRunInfo(id=config.run.id, name=config.run.name)
        made, written_at = [], []
        start = time.monotonic()
        for n in range(count):
            wait = start + n / args.rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            item = episode(b, task, n, run_info)
            write_episode(out, item)
            written_at.append(time.time())
            log_episodes(run, [item])
            made.append(item)
        finish_run(run, made, state)
        finished_at = time.time()
    args.report.write_text(
        json.dumps(
            {
                "run_dir": str(out),
                "run_id": config.run.id,
                "written_at": written_at,
                "finished_at": finished_at,
                "cpu_seconds": time.process_time() - cpu_at_start,
                "push_error": state.incomplete or state.error,
            }
        )
    )


if __name__ == "__main__":
    main()
