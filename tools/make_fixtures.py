"""Write tests/fixtures/ with the real producer, verifiers 0.1.15.dev437.

The fixtures are DATA produced by verifiers; no verifiers code is copied into this project.
This script has two halves:

- outside (any Python 3.11+): make or reuse a throwaway venv (default `.venv-producer/`,
  gitignored) holding the pinned producer, then run this same file inside it with `--drive`;
- inside (`--drive`, runs in that venv): build traces with the producer's own v1 models, write
  each run directory with its own `save_config` + `write_trace`, read them back with its own
  `read_traces` (what a daemon sees on disk), and upload them with its own `push_traces` to a
  recording HTTP server on 127.0.0.1. Every run lands in `tests/fixtures/runs/<case>/<run id>/`
  and the requests it caused in `tests/fixtures/recorded/<case>.json`.

Deterministic: run ids, trace ids and timestamps are fixed, so a re-run rewrites the same files.

    python tools/make_fixtures.py [--venv .venv-producer] [--fixtures tests/fixtures] [--only V]

The later producers (0.2.1, 0.3.1, 0.4.0) are driven by `producers.py`, each in its own venv
(`<venv>-<version>`, its whole dependency tree installed there and nowhere else), into
`tests/fixtures/producers/<version>/`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import uuid
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PRODUCER_VERSION = "0.1.15.dev437"
# verifiers pins little; pydantic renders every line and httpx encodes every body, so they are
# pinned too, to the versions the committed fixtures were made with.
PRODUCER_REQUIREMENTS = [f"verifiers=={PRODUCER_VERSION}", "pydantic==2.14.4", "httpx==0.28.1"]
NAMESPACE = uuid.UUID("5f0c6a52-2d4e-4c47-9a43-0b1e4f6d2c11")
T0 = 1767225600.0  # 2026-01-01T00:00:00Z: every timestamp is an offset from it


# --- outside: the producer venv ---------------------------------------------------------------


LATER_PRODUCERS = {
    # version: what its venv holds (the version's whole dependency tree, as pip resolves it)
    "0.2.1": ["verifiers==0.2.1"],
    "0.3.1": ["verifiers==0.3.1"],
    "0.4.0": ["verifiers==0.4.0", "prime-runs==0.1.4"],
}
"""The later producers `producers.py` drives, each in a venv of its own."""


def producer_python(
    venv: Path, version: str = PRODUCER_VERSION, requirements: list[str] = PRODUCER_REQUIREMENTS
) -> Path:
    """The venv's interpreter, after creating the venv and installing the producer if needed."""
    python = venv / "bin" / "python"
    check = f"import importlib.metadata as m; assert m.version('verifiers') == '{version}'"
    if (
        python.exists()
        and subprocess.run([python, "-c", check], capture_output=True).returncode == 0
    ):
        return python
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([python, "-m", "pip", "install", "-q", *requirements], check=True)
    return python


def scratch_environ(home: str) -> dict[str, str]:
    """The environment a producer runs in: a scratch HOME keeps an operator's
    ~/.prime/config.json (team id, key) out of the data, and no PRIME_* variable gets in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIME_")}
    env["HOME"] = home
    return env


def run_later_producer(venv_prefix: Path, fixtures: Path, version: str) -> None:
    """`producers.py` in the later version's venv, into `fixtures/producers/<version>/`."""
    python = producer_python(Path(f"{venv_prefix}-{version}"), version, LATER_PRODUCERS[version])
    driver = Path(__file__).with_name("producers.py")
    with tempfile.TemporaryDirectory(prefix="make-fixtures-") as home:
        subprocess.run(
            [python, driver, "--drive", version, "--fixtures", fixtures / "producers" / version],
            check=True,
            env=scratch_environ(home),
        )


def run_driver(venv: Path, fixtures: Path) -> None:
    python = producer_python(venv)
    with tempfile.TemporaryDirectory(prefix="make-fixtures-") as home:
        subprocess.run(
            [python, __file__, "--drive", "--fixtures", str(fixtures)],
            check=True,
            env=scratch_environ(home),
        )


# --- inside: the recording platform -----------------------------------------------------------


class Recorder(BaseHTTPRequestHandler):
    """Records each request (its path and JSON body; with `methods`, its method too) and
    answers as the platform would: an environment id, an evaluation id, else `{}`."""

    requests: list[dict] = []
    evaluation_id = "eval-1"
    methods = False

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        method = {"method": self.command} if self.methods else {}
        self.requests.append({**method, "path": self.path, "body": body})
        if self.path.endswith("/environmentshub/resolve"):
            answer = {"data": {"id": "env-1"}}
        elif self.path.endswith("/evaluations/"):
            answer = {"evaluation_id": self.evaluation_id}
        else:
            answer = {}
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_PUT = do_GET = do_POST  # noqa: N815

    def log_message(self, *args) -> None:
        pass


@contextmanager
def recording_platform(recorder: type[Recorder] = Recorder):
    """A platform stand-in on loopback; yields the list every request is appended to."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    os.environ["PRIME_API_KEY"] = "fixture-key"
    os.environ["PRIME_API_BASE_URL"] = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield recorder.requests
    finally:
        server.shutdown()
        thread.join()
        server.server_close()


# --- inside: a local taskset, so `[taskset] id` resolves without the hub ----------------------

TASKSET_MODULE = """
from typing import Any

from verifiers.v1.task import Task
from verifiers.v1.taskset import Taskset, TasksetConfig


class ReverseTextTask(Task):
    answer: str | None = None
    metadata: dict[str, Any] | None = None


class ReverseTextTaskset(Taskset[ReverseTextTask, TasksetConfig]):
    def load_tasks(self):
        return []


__all__ = ["ReverseTextTaskset"]
"""


def install_taskset(scratch: Path) -> None:
    (scratch / "reverse_text.py").write_text(TASKSET_MODULE)
    sys.path.insert(0, str(scratch))


# --- inside: the traces -----------------------------------------------------------------------


class Build:
    """Terse constructors over the producer's models (imported lazily: only inside the venv)."""

    def __init__(self) -> None:
        from verifiers.v1 import graph, trace, types

        self.t, self.g, self.ty = trace, graph, types

    def timing(self, at: float, *, setup=1.5, generation=6.25, finalize=0.5, scoring=0.75):
        span, start = self.t.TimeSpan, T0 + at
        marks = [start]
        for seconds in (setup, generation, finalize, scoring):
            marks.append(marks[-1] + seconds if seconds is not None else marks[-1])
        spans = [
            span(start=marks[i], end=marks[i + 1]) if seconds is not None else span()
            for i, seconds in enumerate((setup, generation, finalize, scoring))
        ]
        return self.t.Timing(
            start=start, setup=spans[0], generation=spans[1], finalize=spans[2], scoring=spans[3]
        )

    def node(self, message, parent=None, *, tokens=0, base=100):
        """A prompt-supplied node; `tokens` > 0 gives it renderer token ids (all unmasked)."""
        ids = list(range(base, base + tokens))
        return self.g.MessageNode(
            parent=parent,
            message=message,
            token_ids=ids,
            mask=[False] * tokens,
            is_content=[i > 0 for i in range(tokens)],
        )

    def sampled(
        self, message, parent, *, finish="stop", usage=None, scaffold=0, completion=0, base=500
    ):
        """A model response; `scaffold` + `completion` > 0 gives it token ids, mask and logprobs."""
        count = scaffold + completion
        return self.g.MessageNode(
            parent=parent,
            message=message,
            sampled=True,
            token_ids=list(range(base, base + count)),
            mask=[False] * scaffold + [True] * completion,
            is_content=[False] * scaffold + [True] * completion,
            logprobs=[round(-0.03125 * (i + 1), 5) for i in range(completion)],
            finish_reason=finish,
            usage=usage,
        )

    def usage(self, prompt, completion, **optional):
        return self.ty.Usage(prompt_tokens=prompt, completion_tokens=completion, **optional)

    def system(self, text):
        return self.ty.SystemMessage(content=text)

    def user(self, content):
        return self.ty.UserMessage(content=content)

    def assistant(self, content=None, *, calls=(), reasoning=None, provider_state=None):
        tool_calls = [self.ty.ToolCall(id=i, name=n, arguments=a) for i, n, a in calls] or None
        return self.ty.AssistantMessage(
            content=content,
            reasoning_content=reasoning,
            tool_calls=tool_calls,
            provider_state=provider_state,
        )

    def tool(self, call_id, content, name=None):
        return self.ty.ToolMessage(tool_call_id=call_id, content=content, name=name)

    def image_prompt(self, text):
        ty = self.ty
        return [
            ty.TextContentPart(text=text),
            ty.ImageUrlContentPart(image_url=ty.ImageUrlSource(url=TINY_PNG)),
        ]

    def error(self, kind, message, *, traceback=True):
        text = traceback_text(kind, message) if traceback else None
        return self.t.Error(type=kind, message=message, traceback=text)


TINY_PNG = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQ"
    "DwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


def traceback_text(kind: str, message: str) -> str:
    return f'Traceback (most recent call last):\n  File "rollout.py", line 1, in run\n{kind}: {message}\n'


def fixed_uuid4(name: str) -> uuid.UUID:
    """A version-4-shaped UUID (what the producer draws at random), derived from `name`."""
    return uuid.UUID(bytes=uuid.uuid5(NAMESPACE, name).bytes, version=4)


def trace_id(case: str, n: int) -> str:
    return fixed_uuid4(f"{case}/trace/{n}").hex


def reverse_text_tasks(b: Build) -> dict:
    from reverse_text import ReverseTextTask as Task

    return {
        0: Task(
            idx=0,
            name="hello",
            prompt="Reverse the text: hello",
            system_prompt="You reverse text.",
            answer="olleh",
        ),
        1: Task(idx=1, prompt="Reverse 'abc' using the reverse tool."),
        2: Task(
            idx=2,
            prompt=[b.user(b.image_prompt("Reverse the caption of this image."))],
            answer="tac",
        ),
        # nulls inside a free-form dict stay: the producer drops only null-valued fields
        3: Task(
            idx=3,
            name=None,
            description=None,
            prompt="Reverse: stressed",
            answer="desserts",
            metadata={"source": None, "tags": ["palindrome-ish", None], "nested": {"k": None}},
        ),
    }


def taskset_traces(b: Build, case: str) -> list:
    """Eight rollouts of four tasks, two each, finishing in interleaved task order."""
    from reverse_text import ReverseTextTask
    from verifiers.v1.trace import Trace

    tasks, T = reverse_text_tasks(b), Trace[ReverseTextTask]
    u = b.usage
    linear = T(
        id=trace_id(case, 0),
        task=tasks[0],
        nodes=[
            b.node(b.system("You reverse text."), tokens=5),
            b.node(b.user("Reverse the text: hello"), 0, tokens=8, base=105),
            b.sampled(
                b.assistant("olleh", reasoning="Read it backwards."),
                1,
                scaffold=3,
                completion=6,
                usage=u(10, 6, cached_input_tokens=3, reasoning_tokens=2, cost=0.000125),
            ),
        ],
        rewards={"correct": 1.0, "format": 0.25},
        metrics={"num_chars": 5.0},
        info={"source": "fixture", "attempt": 1, "note": "naïve → olléh 🐱"},
        is_completed=True,
        stop_condition="agent_completed",
        timing=b.timing(0.0),
    )
    tool_calls = T(
        id=trace_id(case, 1),
        task=tasks[1],
        nodes=[
            b.node(b.user("Reverse 'abc' using the reverse tool.")),
            b.sampled(
                b.assistant(calls=[("call_1", "reverse", '{"text": "abc"}')]),
                0,
                finish="tool_calls",
                usage=u(40, 12),
            ),
            b.node(b.tool("call_1", "cba", name="reverse"), 1),
            b.sampled(
                b.assistant(
                    "cba",
                    reasoning="The tool answered.",
                    provider_state=[
                        {
                            "type": "reasoning",
                            "id": "rs_1",
                            "encrypted_content": None,
                            "summary": [{"text": None}],
                        }
                    ],
                ),
                2,
                usage=u(60, 5, cost=0.0002),
            ),
        ],
        rewards={"correct": 1.0},
        metrics={"correct": 0.0, "tool_calls": 1.0},
        info={"judge": [{"verdict": "yes", "score": 1.0}]},
        extra_usage=[u(100, 20, cost=0.001), u(90, 10)],
        is_completed=True,
        stop_condition="agent_completed",
        timing=b.timing(1.25),
    )
    branching = T(
        id=trace_id(case, 2),
        task=tasks[0],
        nodes=[
            b.node(b.system("You reverse text."), tokens=5),  # 0
            b.node(b.user("Reverse the text: hello"), 0, tokens=8, base=105),  # 1
            b.sampled(
                b.assistant(calls=[("c1", "reverse", '{"text":"hello"}')]),
                1,  # 2
                finish="tool_calls",
                scaffold=3,
                completion=9,
                usage=u(13, 9, cached_input_tokens=0),
            ),
            b.node(b.tool("c1", "olleh"), 2, tokens=6, base=200),  # 3
            b.sampled(
                b.assistant("olleh"),
                3,
                scaffold=3,
                completion=4,
                base=600,  # 4: leaf
                usage=u(31, 4, cached_input_tokens=25, cost=0.00005),
            ),
            b.sampled(
                b.assistant("subagent: checking"),
                1,
                scaffold=2,
                completion=3,  # 5: leaf
                base=700,
                usage=u(13, 3, reasoning_tokens=1),
            ),
            b.node(
                b.user("Summary so far: the tool reversed 'hello' to 'olleh'."), tokens=12, base=300
            ),  # 6
            b.sampled(
                b.assistant(calls=[("c2", "check", '{"text":"olleh"}')]),
                6,  # 7
                finish="tool_calls",
                scaffold=3,
                completion=7,
                base=800,
                usage=u(12, 7),
            ),
            b.node(
                b.tool("c2", [b.ty.TextContentPart(text="ok")], name="check"), 7, tokens=4, base=900
            ),  # 8
            b.sampled(
                b.assistant("Final answer: olleh"),
                8,
                scaffold=3,
                completion=5,  # 9: leaf
                base=950,
                usage=u(26, 5, cost=0.00004),
            ),
        ],
        rewards={"correct": 1.0, "format": 0.5},
        metrics={"compactions": 1.0, "num_chars": 5.0},
        info={"compacted_at_turn": 2},
        is_completed=True,
        stop_condition="agent_completed",
        timing=b.timing(2.5, generation=12.125),
    )
    multimodal_errors = T(
        id=trace_id(case, 3),
        task=tasks[2],
        nodes=[
            b.node(b.user(b.image_prompt("Reverse the caption of this image."))),
            b.sampled(b.assistant("The caption says 'cat', reversed"), 0, finish=None),
        ],
        errors=[
            b.error("RateLimitError", "429 Too Many Requests", traceback=False),
            b.error("TimeoutError", "harness timed out after 30s"),
        ],
        rewards={"correct": 0.0, "format": 0.0},
        is_completed=True,
        stop_condition="error",
        timing=b.timing(3.0, finalize=None, scoring=None),
    )
    max_turns = T(
        id=trace_id(case, 4),
        task=tasks[3],
        nodes=[
            b.node(b.user("Reverse: stressed")),
            b.sampled(
                b.assistant(calls=[("c1", "reverse", '{"text":"stressed"}')]),
                0,
                finish="tool_calls",
                usage=u(20, 9, cached_input_tokens=4),
            ),
            b.node(b.tool("c1", "desserts"), 1),
            b.sampled(
                b.assistant(calls=[("c2", "reverse", '{"text":"desserts"}')]),
                2,
                finish="tool_calls",
                usage=u(35, 9, cached_input_tokens=20, reasoning_tokens=3),
            ),
        ],
        # reward names that are also sample keys: a core key is never overwritten by them
        rewards={"correct": 0.0, "reward": 0.5, "info": 0.25, "task": 0.125},
        metrics={"reward": 2.0, "tool_calls": 2.0},
        info={"turns": 2},
        is_completed=True,
        stop_condition="max_turns",
        timing=b.timing(4.0),
    )
    finish_length = T(
        id=trace_id(case, 5),
        task=tasks[2],
        nodes=[
            b.node(b.user(b.image_prompt("Reverse the caption of this image.")), tokens=40),
            b.sampled(
                b.assistant("tac tac tac tac"),
                0,
                finish="length",
                scaffold=2,
                completion=16,
                base=400,
                usage=u(40, 16),
            ),
            b.node(b.user("Please keep it short."), 1, tokens=7, base=450),
        ],
        rewards={"correct": 0.0, "format": 1.0},
        metrics={"num_chars": 15.0},
        info={},
        is_completed=False,
        timing=b.timing(5.0),
    )
    no_nodes = T(
        id=trace_id(case, 6),
        task=tasks[1],
        errors=[b.error("SandboxError", "container failed to start")],
        is_completed=True,
        stop_condition="error",
        timing=b.timing(6.0, generation=None, finalize=None, scoring=None),
    )
    nulls = T(
        id=trace_id(case, 7),
        task=tasks[3],
        nodes=[
            b.node(b.user("Reverse: stressed")),
            b.sampled(
                b.assistant("desserts", reasoning=None),
                0,
                finish=None,
                usage=u(18, 3, cached_input_tokens=None, reasoning_tokens=None, cost=None),
            ),
        ],
        rewards={"correct": 1.0, "format": 1.0},
        metrics={"num_chars": 8.0},
        # nested nulls inside free-form JSON survive the producer's dump (only model fields drop)
        info={"notes": None, "meta": {"grader": None, "ok": True}},
        is_completed=True,
        stop_condition=None,
        timing=b.timing(7.0),
    )
    return [
        linear,
        tool_calls,
        branching,
        multimodal_errors,
        max_turns,
        finish_length,
        no_nodes,
        nulls,
    ]


def legacy_traces(b: Build, case: str) -> list:
    """A v0 environment bridged to v1 traces: plain chat, no token ids, sparse task idxs."""
    from verifiers.v1.task import WireTask
    from verifiers.v1.trace import WireTrace

    q = {
        5: ("Natalia sold 48 clips in April and half as many in May. How many in total?", "72"),
        7: ("Weng earns $12 an hour. How much did she earn for 50 minutes?", "10"),
    }
    order = [
        (5, "72", {"correct_answer": 1.0, "format_reward": 0.2}),
        (7, "12", {"correct_answer": 0.0, "format_reward": 0.2}),
        (5, "The answer is 72.", {}),
        (5, "72", {"correct_answer": 1.0, "format_reward": 0.0}),
        (7, "10", {"correct_answer": 1.0, "format_reward": 0.2}),
    ]
    traces = []
    for n, (idx, reply, rewards) in enumerate(order):
        question, answer = q[idx]
        traces.append(
            WireTrace(
                id=trace_id(case, n),
                # a null extra key is dropped, a null inside an extra's value is not
                task=WireTask(
                    idx=idx,
                    prompt=[b.user(question)],
                    answer=answer,
                    hint=None,
                    info={"split": "test", "source": None},
                ),
                nodes=[
                    b.node(b.user(question)),
                    b.sampled(b.assistant(reply), 0, usage=b.usage(60 + n, 3 + n)),
                ],
                rewards=rewards,
                metrics={"num_turns": 1.0} if rewards else {},
                is_completed=True,
                stop_condition="agent_completed",
                timing=b.timing(10.0 + n),
            )
        )
    return traces


def results_traces(b: Build, case: str) -> list:
    """An older run whose trace file still carries the pre-dev437 name."""
    from verifiers.v1.task import WireTask
    from verifiers.v1.trace import WireTrace

    traces = []
    for n, idx in enumerate([0, 1, 1, 0]):
        task = WireTask(
            idx=idx,
            name=f"hello-world-{idx}",
            prompt=f"Create hello{idx}.txt",
            image="ghcr.io/harbor/hello-world:latest",
            workdir="/app",
        )
        traces.append(
            WireTrace(
                id=trace_id(case, n),
                task=task,
                nodes=[
                    b.node(b.user(task.prompt)),
                    b.sampled(
                        b.assistant(calls=[("c", "bash", f'{{"cmd":"echo hi > hello{idx}.txt"}}')]),
                        0,
                        finish="tool_calls",
                        usage=b.usage(900, 30, cached_input_tokens=800),
                    ),
                    b.node(b.tool("c", "", name="bash"), 1),
                    b.sampled(
                        b.assistant("Done."), 2, usage=b.usage(950, 4, cached_input_tokens=900)
                    ),
                ],
                rewards={"harbor": float(n % 2)},
                metrics={"exit_code": 0.0},
                info={"verifier_stdout": "1 passed"},
                is_completed=True,
                stop_condition="agent_completed",
                timing=b.timing(20.0 + n),
            )
        )
    return traces


def prompt_null_traces(b: Build, case: str) -> list:
    """A user-simulator taskset: tasks carry `prompt = None`, the simulator opens the chat."""
    from reverse_text import ReverseTextTask
    from verifiers.v1.trace import Trace

    traces = []
    for n in range(2):
        task = ReverseTextTask(idx=n, prompt=None, answer="olleh")
        traces.append(
            Trace[ReverseTextTask](
                id=trace_id(case, n),
                task=task,
                nodes=[
                    b.node(b.user("Hi! Please reverse 'hello' for me.")),
                    b.sampled(b.assistant("olleh"), 0, usage=b.usage(30, 3)),
                ],
                rewards={"correct": 1.0},
                is_completed=True,
                stop_condition="agent_completed",
                timing=b.timing(30.0 + n),
            )
        )
    return traces


# (case, config fields, traces, file name, where push_traces gets its traces)
CASES = [
    (
        "taskset",
        dict(
            taskset={"id": "reverse-text"},
            model="openai/gpt-4.1-mini",
            num_tasks=4,
            num_rollouts=2,
            push=False,
        ),
        taskset_traces,
        "traces.jsonl",
        "disk",
    ),
    (
        "legacy_id",
        dict(id="primeintellect/gsm8k", model="Qwen/Qwen3-8B", num_rollouts=3, push=False),
        legacy_traces,
        "traces.jsonl",
        "disk",
    ),
    (
        "results_jsonl",
        dict(
            taskset={"id": "harbor"},
            model="anthropic/claude-sonnet-4.5",
            num_tasks=2,
            num_rollouts=2,
        ),
        results_traces,
        "results.jsonl",
        "disk",
    ),
    # dev437 drops `prompt: null` when writing, then its own reader requires it: these lines
    # cannot be read back, so the recording is what the eval's inline push sends.
    (
        "prompt_null",
        dict(
            taskset={"id": "reverse-text"},
            model="openai/gpt-4.1-mini",
            num_tasks=2,
            num_rollouts=1,
            push=False,
        ),
        prompt_null_traces,
        "traces.jsonl",
        "inline",
    ),
    (
        "empty",
        dict(
            taskset={"id": "reverse-text"},
            model="openai/gpt-4.1-mini",
            num_tasks=2,
            num_rollouts=1,
            push=False,
        ),
        lambda b, case: [],
        "traces.jsonl",
        "disk",
    ),
]


def write_case(
    b: Build, fixtures: Path, requests: list, case, fields, make, file_name, source
) -> None:
    from verifiers.v1.cli.output import TRACES_FILE, read_traces, save_config, write_trace
    from verifiers.v1.configs.eval import EvalConfig
    from verifiers.v1.push import push_traces, trace_to_sample
    from verifiers.v1.trace import WireTrace

    run_id = str(fixed_uuid4(f"{case}/run"))
    config = EvalConfig(uuid=run_id, **fields)
    run_dir = fixtures / "runs" / case / run_id
    save_config(config, run_dir)
    made = make(b, case)
    for trace in made:
        write_trace(run_dir, trace)
    if source == "disk":
        traces = read_traces(run_dir, WireTrace)
        same = [trace_to_sample(t) for t in traces] == [trace_to_sample(t) for t in made]
        assert same, f"{case}: the producer's disk round trip changed a sample"
    else:
        try:
            read_traces(run_dir, WireTrace)
        except Exception as exc:  # the producer's own reader refuses its own lines
            print(f"{case}: read_traces refuses the lines it wrote ({type(exc).__name__})")
        traces = made
    if file_name != TRACES_FILE:
        (run_dir / TRACES_FILE).rename(run_dir / file_name)
    requests.clear()
    url = push_traces(traces, config)
    assert url, f"{case}: push_traces failed (see its warning above)"
    record = {
        "producer": f"verifiers=={PRODUCER_VERSION}",
        "source": source,
        "run_dir": str(run_dir.relative_to(fixtures)),
        "requests": list(requests),
    }
    out = fixtures / "recorded" / f"{case}.json"
    out.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    print(f"{case}: {len(traces)} traces -> {out.relative_to(fixtures)}")


def drive(fixtures: Path) -> None:
    for generated in ("runs", "recorded"):
        shutil.rmtree(fixtures / generated, ignore_errors=True)
    (fixtures / "recorded").mkdir(parents=True)
    with (
        tempfile.TemporaryDirectory(prefix="taskset-") as scratch,
        recording_platform() as requests,
    ):
        install_taskset(Path(scratch))
        b = Build()
        for case in CASES:
            write_case(b, fixtures, requests, *case)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=REPO / ".venv-producer")
    parser.add_argument("--fixtures", type=Path, default=REPO / "tests" / "fixtures")
    parser.add_argument(
        "--only",
        choices=["seed", *LATER_PRODUCERS],
        action="append",
        help="regenerate only these producers' fixtures (default: all)",
    )
    parser.add_argument("--drive", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.drive:
        drive(args.fixtures.resolve())
        return
    only = set(args.only or ["seed", *LATER_PRODUCERS])
    if "seed" in only:
        run_driver(args.venv, args.fixtures.resolve())
    for version in LATER_PRODUCERS:
        if version in only:
            run_later_producer(args.venv, args.fixtures.resolve(), version)


if __name__ == "__main__":
    main()
