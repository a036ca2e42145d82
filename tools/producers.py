"""Write tests/fixtures/producers/<version>/ with the later producers, verifiers 0.2.1, 0.3.1 and
0.4.0, each in a throwaway venv of its own (`make_fixtures.py` makes the venvs and runs this file
inside each with `--drive VERSION`). The fixtures are DATA produced by those versions; no
verifiers or prime-runs code is copied into this project.

Inside a version's venv this builds rollouts with that version's own models (no model calls),
writes the run directory with its own writer (0.2.1: `save_config` + `write_trace`, config.toml;
0.3.1 and 0.4.0: `save_config` + `write_episode`, `configs/resolved/eval.json`, and for 0.4.0 the
`logs/attempt_1` directory with its `logs/latest` symlink), reads it back with its own reader and
records what its own push sends for it to a recording HTTP server on 127.0.0.1:

- 0.2.1 and 0.3.1: `push_traces` at the end of the eval (resolve, create, samples, finalize);
- 0.4.0 online: the eval's own calls into prime-runs (`open_run` before the first episode,
  `log_episodes` after each, `finish_run`), with Prime Traces opted out so its samples go to
  the legacy `/evaluations/{id}/samples` endpoint: create, samples, a status-less
  `PUT /evaluations/{id}`, finalize. The run id is the evaluation id the recorder answers;
- 0.4.0 offline (`PRIME_RUNS_MODE=disabled`): nothing is sent, the run id is `disabled-<hex>`;
  what is recorded is prime-runs' own projection (`build_samples`) and aggregates
  (`metrics.from_episodes`) of the episodes read back.

Every run lands in `runs/<case>/<run dir>/` and its record in `recorded/<case>.json`.
Deterministic: ids, timestamps and the random draws of uuid4 are fixed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_fixtures import (  # noqa: E402
    T0,
    Recorder,
    fixed_uuid4,
    install_taskset,
    recording_platform,
)
from make_fixtures import Build as SeedBuild  # noqa: E402

VERSIONS = ("0.2.1", "0.3.1", "0.4.0")


# --- the recording platform -------------------------------------------------------------------


class _Recorder(Recorder):
    methods = True  # 0.4 sends a PUT too
    evaluation_id = "00000000-0000-4000-8000-000000000000"


@contextmanager
def producer_platform():
    """`make_fixtures.recording_platform`, with the settings the later producers read too."""
    with recording_platform(_Recorder):
        os.environ["PRIME_BASE_URL"] = os.environ["PRIME_API_BASE_URL"]
        os.environ["PRIME_FRONTEND_URL"] = "http://frontend.invalid"
        os.environ["PRIME_TRACES_OPT_OUT"] = "1"
        yield _Recorder


def fixed_randomness(seed: str) -> None:
    """uuid4 draws from a seeded generator: ids the producer mints itself come out the same."""
    rng = random.Random(seed)
    uuid.uuid4 = lambda: uuid.UUID(int=rng.getrandbits(128), version=4)


# --- rollouts, built with the producer's own models -------------------------------------------


class Build(SeedBuild):
    """The seed's constructors (`make_fixtures.Build`) where the models are the same, the
    version's own where they changed (calls, rewards, timing)."""

    def __init__(self, version: str) -> None:
        super().__init__()
        self.version = version

    def timing(self, at: float, generation: float = 6.25):
        t, start = self.t, T0 + at
        work = "generation" if self.version == "0.2.1" else "agent"
        spans = {
            "setup": t.TimeSpan(start=start, end=start + 1.5),
            work: getattr(t, "GenerationSpan", None) or t.AgentSpan,
            "scoring": t.TimeSpan(start=start + 1.5 + generation, end=start + 2.25 + generation),
        }
        spans[work] = spans[work](start=start + 1.5, end=start + 1.5 + generation)
        return t.Timing(start=start, **spans)

    def node(self, message, parent=None, *, tokens=0, base=100):
        ids = list(range(base, base + tokens))
        return self.g.MessageNode(
            parent=parent, message=message, token_ids=ids, mask=[False] * tokens, timestamp=T0
        )

    def sampled(self, message, parent, *, completion=0, base=500):
        return self.g.MessageNode(
            parent=parent,
            message=message,
            sampled=True,
            timestamp=T0 + 1.0,
            token_ids=list(range(base, base + completion)),
            mask=[True] * completion,
            logprobs=[round(-0.03125 * (i + 1), 5) for i in range(completion)],
        )

    def call(self, node, prompt, completion, *, finish="stop", at=0.0, error=None, **optional):
        usage = (
            self.ty.Usage(prompt_tokens=prompt, completion_tokens=completion, **optional)
            if prompt is not None
            else None
        )
        return self.t.ModelCall(
            node=node,
            model="openai/gpt-4.1-mini",
            finish_reason=finish,
            usage=usage,
            time=self.t.TimeSpan(start=T0 + at, end=T0 + at + 0.5),
            error=error,
        )

    def assistant(self, content=None, *, calls=(), reasoning=None):
        tool_calls = [self.ty.ToolCall(id=i, name=n, arguments=a) for i, n, a in calls] or None
        return self.ty.AssistantMessage(
            content=content, reasoning_content=reasoning, tool_calls=tool_calls
        )

    def reverse_tool(self):
        return self.ty.Tool(
            name="reverse",
            description="Reverse a text.",
            parameters={"type": "object", "properties": {"text": {"type": "string"}}},
        )

    def reward(self, score, weight=1.0):
        """A reward as the version records it: a float (0.2), `{score, weight}` (0.3, 0.4)."""
        return score if self.version == "0.2.1" else self.t.Reward(score=score, weight=weight)


def tasks(b: Build) -> dict:
    from verifiers.v1.task import WireTaskData as Task

    return {
        0: Task(idx=0, name="hello", prompt="Reverse the text: hello", answer="olleh"),
        1: Task(idx=1, prompt="Reverse 'abc' using the reverse tool."),
        2: Task(idx=2, prompt=[b.user(b.image_prompt("Reverse the caption."))], answer="tac"),
    }


def rollout_fields(b: Build, case: str, n: int, shape: str) -> dict:
    """The fields of rollout `n` (its id, nodes, calls, rewards...) in one of a few shapes."""
    r = b.reward
    tid = fixed_uuid4(f"{case}/trace/{n}").hex
    at = 10.0 * n
    if shape == "linear":
        return dict(
            id=tid,
            nodes=[
                b.node(b.system("You reverse text."), tokens=5),
                b.node(b.user("Reverse the text: hello"), 0, tokens=8, base=105),
                b.sampled(b.assistant("olleh", reasoning="Backwards."), 1, completion=6),
            ],
            calls=[
                b.call(2, 10, 6, cached_input_tokens=3, reasoning_tokens=2, cost=0.000125, at=at)
            ],
            rewards={"correct": r(1.0), "format": r(0.5, 0.5)},
            metrics={"num_chars": 5.0},
            info={"note": "naïve → olléh 🐱"},
            is_completed=True,
            stop_condition="agent_completed",
            timing=b.timing(at),
        )
    if shape == "tools":
        return dict(
            id=tid,
            tools=[b.reverse_tool()],
            nodes=[
                b.node(b.user("Reverse 'abc' using the reverse tool.")),
                b.sampled(b.assistant(calls=[("c1", "reverse", '{"text": "abc"}')]), 0),
                b.node(b.tool("c1", "cba", name="reverse"), 1),
                b.sampled(b.assistant("cba"), 2),
            ],
            calls=[
                b.call(1, 40, 12, finish="tool_calls", at=at),
                b.call(3, 55, 5, cost=0.0002, at=at + 1),
            ],
            rewards={"correct": r(1.0)},
            metrics={"tool_calls": 1.0},
            is_completed=True,
            stop_condition="agent_completed",
            timing=b.timing(at),
        )
    if shape == "branching":
        return dict(
            id=tid,
            nodes=[
                b.node(b.user("Reverse the text: hello"), tokens=8),  # 0
                b.sampled(b.assistant("olleh"), 0, completion=4),  # 1: leaf
                b.sampled(b.assistant("subagent: checking"), 0, completion=3, base=700),  # 2: leaf
            ],
            calls=[b.call(1, 8, 4, at=at), b.call(2, 8, 3, cached_input_tokens=8, at=at + 1)],
            rewards={"correct": r(1.0), "format": r(0.0)},
            metrics={"branches": 2.0},
            is_completed=True,
            stop_condition="agent_completed",
            timing=b.timing(at),
        )
    if shape == "length":
        return dict(
            id=tid,
            nodes=[
                b.node(b.user(b.image_prompt("Reverse the caption."))),
                b.sampled(b.assistant("tac tac tac tac"), 0),
            ],
            calls=[
                b.call(1, 40, 16, finish="length", at=at),
                b.call(None, None, None, finish=None, at=at + 1, error=b.error("APIError", "502")),
            ],
            rewards={"correct": r(0.0)},
            metrics={"num_chars": 15.0},
            is_completed=False,
            timing=b.timing(at),
        )
    if shape == "error":
        return dict(
            id=tid,
            errors=[
                b.error("RateLimitError", "429 Too Many Requests", traceback=False),
                b.error("SandboxError", "container failed to start"),
            ],
            rewards={"correct": r(0.0)},
            is_completed=True,
            stop_condition="error",
            timing=b.timing(at, generation=0.0),
        )
    raise ValueError(shape)


# --- 0.2.1: one trace a line, config.toml -----------------------------------------------------


def drive_traces(b: Build, fixtures: Path, recorder) -> None:
    from verifiers.v1.cli.output import read_traces, save_config, write_trace
    from verifiers.v1.configs.eval import EvalConfig
    from verifiers.v1.push import push_traces, trace_to_sample
    from verifiers.v1.trace import EvalRunInfo, TraceTask, WireTrace

    case = "traces_v2"
    run_id = str(fixed_uuid4(f"{b.version}/{case}/run"))
    config = EvalConfig(
        uuid=run_id,
        taskset={"id": "reverse-text"},
        model="openai/gpt-4.1-mini",
        num_tasks=3,
        num_rollouts=2,
        push=False,
    )
    run_dir = fixtures / "runs" / case / run_id
    save_config(config, run_dir)
    task = tasks(b)
    order = [
        (0, "linear"),
        (1, "tools"),
        (0, "branching"),
        (2, "length"),
        (1, "error"),
        (2, "linear"),
    ]
    made = []
    for n, (idx, shape) in enumerate(order):
        fields = rollout_fields(b, case, n, shape)
        trace = WireTrace(
            task=TraceTask(type="ReverseTextTask", data=task[idx]),
            run=EvalRunInfo(id=run_id),
            **fields,
        )
        made.append(trace)
        write_trace(run_dir, trace)
    read = read_traces(run_dir, WireTrace)
    assert [trace_to_sample(t) for t in read] == [trace_to_sample(t) for t in made], case
    recorder.requests.clear()
    assert push_traces(read, config), f"{case}: push_traces failed"
    record(fixtures, case, run_dir, b.version, "push_traces", recorder.requests)


# --- 0.3.1 and 0.4.0: one episode a line, configs/resolved/eval.json --------------------------


def episodes(b: Build, case: str, run_info):
    """Five episodes: single-agent ones of each shape, one with a judge beside the solver (not
    trainable) and a null reward, and one that failed before any trace."""
    from verifiers.v1.configs.agent import WireAgentConfig
    from verifiers.v1.episode import EnvInfo, Episode
    from verifiers.v1.trace import AgentInfo, TraceTask, WireTrace

    task = tasks(b)

    def trace(n, idx, shape, **agent):
        fields = rollout_fields(b, case, n, shape)
        return WireTrace(
            task=TraceTask(type="ReverseTextTask", data=task[idx]),
            agent=AgentInfo(config=WireAgentConfig(), **agent),
            **fields,
        )

    def episode(n, idx, traces, ok=True, errors=()):
        return Episode(
            id=fixed_uuid4(f"{case}/episode/{n}").hex,
            env=EnvInfo(id="reverse-text"),
            task=TraceTask(type="ReverseTextTask", data=task[idx]),
            ok=ok,
            errors=list(errors),
            traces=traces,
        )

    judged = trace(4, 1, "tools")
    judged.rewards["judge"] = None  # the judge gave no score: a null reward
    judge = trace(5, 1, "linear", name="judge", trainable=False)
    made = [
        episode(0, 0, [trace(0, 0, "linear")]),
        episode(1, 2, [trace(1, 2, "length")], ok=False),
        episode(2, 0, [trace(2, 0, "branching")]),
        episode(3, 1, [judge, judged]),
        episode(4, 2, [], ok=False, errors=[b.error("SandboxError", "container failed to start")]),
    ]
    for item in made:
        item.record_run(run_info)
    return made


def episode_config(b: Build, fixtures: Path, case: str, **fields):
    from verifiers.v1.configs.cli.eval import EvalConfig

    name = f"reverse-text--openai--gpt-4.1-mini--default--{fixed_uuid4(case).hex[:8]}"
    return EvalConfig.model_validate(
        {
            "env": {"taskset": {"id": "reverse-text"}},
            "model": "openai/gpt-4.1-mini",
            "num_rollouts": 2,
            "run": {"name": name, "dir": name},
            "output_dir": str(fixtures / "runs" / case),
            "push": True,
            **fields,
        }
    )


def drive_episodes_v3(b: Build, fixtures: Path, recorder) -> None:
    from verifiers.v1.cli.output import output_path, read_episodes, save_config, write_episode
    from verifiers.v1.episode import EvalRunInfo
    from verifiers.v1.trace import WireTrace
    from verifiers.v1.utils.platform import build_samples, push_traces

    case = "episodes_v3"
    config = episode_config(b, fixtures, case, num_tasks=3)
    config.run._id = str(fixed_uuid4(f"{b.version}/{case}/run"))
    out = output_path(config)
    save_config(config, out)
    made = episodes(b, case, EvalRunInfo(id=config.run.id, name=config.run.name))
    for item in made:
        write_episode(out, item)
    read = read_episodes(out, WireTrace)
    assert build_samples(read) == build_samples(made), case
    recorder.requests.clear()
    assert push_traces(read, config), f"{case}: push_traces failed"
    record(fixtures, case, out, b.version, "push_traces", recorder.requests)


def drive_episodes_v4(b: Build, fixtures: Path, recorder) -> None:
    import prime_runs as pr
    from verifiers.v1.cli.output import create_attempt_log_dir, output_path, save_config
    from verifiers.v1.episode import EvalRunInfo
    from verifiers.v1.trace import WireTrace
    from verifiers.v1.utils.platform import PushState, finish_run, log_episodes, open_run
    from verifiers.v1.utils.trace_store import read_episodes, write_episode

    for case, mode in (("episodes_v4_online", "online"), ("episodes_v4_offline", "disabled")):
        os.environ[pr.MODE_ENV] = "" if mode == "online" else "disabled"
        recorder.evaluation_id = str(fixed_uuid4(f"{b.version}/{case}/evaluation"))
        recorder.requests.clear()
        config = episode_config(b, fixtures, case, select={"limit": 3})
        out = output_path(config)
        save_config(config, out)
        create_attempt_log_dir(out)
        (out / "logs" / "latest" / "eval.log").write_text("eval log\n")
        state = PushState()
        run = open_run(config, state, num_examples=3)
        made = episodes(b, case, EvalRunInfo(id=config.run.id, name=config.run.name))
        for item in made:
            write_episode(out, item)
            log_episodes(run, [item])
        finish_run(run, made, state)
        read = read_episodes(out, WireTrace)
        if mode == "online":
            assert config.run.id == recorder.evaluation_id, case
            record(fixtures, case, out, b.version, "prime-runs", recorder.requests)
        else:
            assert config.run.id.startswith("disabled-") and not recorder.requests, case
            from prime_runs.projection import build_samples

            projected = {
                "samples": build_samples(read),
                "metrics": dict(pr.metrics.from_episodes(read)),
                "metadata": {
                    "model": config.model,
                    "num_examples": 3,
                    "rollouts_per_example": config.num_rollouts,
                },
            }
            record(fixtures, case, out, b.version, "prime-runs projection", [], projected)


# --- the record -------------------------------------------------------------------------------


def record(fixtures, case, run_dir, version, how, requests, projected=None) -> None:
    data = {
        "producer": f"verifiers=={version}",
        "recorded": how,
        "run_dir": str(run_dir.relative_to(fixtures)),
        "requests": [dict(r) for r in requests],
    }
    if projected is not None:
        data["projected"] = projected
    out = fixtures / "recorded" / f"{case}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    print(f"{version} {case}: {len(requests)} requests -> {out}")


def drive(version: str, fixtures: Path) -> None:
    fixed_randomness(version)
    for generated in ("runs", "recorded"):
        shutil.rmtree(fixtures / generated, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix="taskset-") as scratch, producer_platform() as rec:
        install_taskset(Path(scratch))
        b = Build(version)
        {"0.2.1": drive_traces, "0.3.1": drive_episodes_v3, "0.4.0": drive_episodes_v4}[version](
            b, fixtures, rec
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drive", choices=VERSIONS, required=True)
    parser.add_argument("--fixtures", type=Path, required=True)
    args = parser.parse_args()
    drive(args.drive, args.fixtures.resolve())


if __name__ == "__main__":
    main()
