"""`evalpush demo`: the daemon at work on an embedded default, no account needed.

Starts the local platform on loopback and the daemon (`evalpush run`'s, in this process) on a
scratch tree, then writes runs into that tree while the daemon watches, as evals would: one
finished before the daemon started, one that completes by its expected count, one by a marker
file, one by settling (the settle time is cut to seconds for the demo), one with a bad line, a
debug run, and one run in each later producer's format (verifiers 0.2's traces, 0.3's and 0.4's
episodes in their own layout: docs/TRACE_FORMATS.md). A live status view follows them until every run has settled, then the status table
shows each run's outcome and viewer URL. With `--keep`, the local platform keeps serving until
Ctrl-C, so the URLs can be opened. Under a minute.
"""

from __future__ import annotations

import random
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import msgspec

from evalpush.cli.report import status_rows, status_table
from evalpush.config import Config
from evalpush.core.errors import LedgerError, UsageError
from evalpush.core.states import State
from evalpush.ledger import Ledger, default_path
from evalpush.local_platform import LocalPlatform
from evalpush.service import Daemon, Request

DEMO_SEED = 7
TASKSET = "reverse-text"
MODEL = "openai/gpt-4.1-mini"
DEMO_KEY = "demo-key-not-secret"
MARKER = ".done"
SETTLE_SECONDS = 4.0
LINE_SECONDS = 0.2  # between two traces a demo eval writes
REFRESH_SECONDS = 1.0
DEMO_SECONDS = 60.0  # the demo gives up waiting after this long
SCRATCH_MARK = ".evalpush-demo"  # a --dir the demo made, which a later demo may clear


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


def _as_v2(trace: dict, run_id: str) -> dict:
    """A demo trace as verifiers 0.2 writes it: the row under `task.data`, usage in `calls`."""
    calls = []
    for i, node in enumerate(trace["nodes"]):
        usage, finish = node.pop("usage", None), node.pop("finish_reason", None)
        if node.get("sampled"):
            calls.append({"node": i, "model": MODEL, "finish_reason": finish, "usage": usage})
    return {
        **trace,
        "task": {"type": "ReverseTextTask", "data": trace["task"]},
        "version": 2,
        "run": {"type": "eval", "id": run_id},
        "calls": calls,
    }


def _as_episode(trace: dict, run_id: str, version: str) -> dict:
    """A demo trace as verifiers 0.3/0.4 write it: one agent's trace in an episode."""
    inner = _as_v2(trace, run_id)
    del inner["version"], inner["run"]
    inner["rewards"] = {k: {"score": v, "weight": 1.0} for k, v in trace["rewards"].items()}
    inner["verifiers"] = {"version": version}
    inner["agent"] = {"config": {}, "name": "agent", "trainable": True}
    return {
        "id": f"{trace['id'][:24]}{run_id[-8:]}",
        "env": {"id": TASKSET},
        "task": inner["task"],
        "run": {"type": "eval", "id": run_id},
        "ok": True,
        "errors": [],
        "traces": [{"version": 1, **inner}],
    }


class DemoRun(msgspec.Struct, frozen=True):
    """One run the demo writes: its kind (its parent directory says it), how many traces,
    whether its config says how many to expect, how it ends, which producer's format."""

    kind: str
    traces: int
    expected: bool = True  # config.toml has num_tasks: ready at the expected count
    marker: bool = False  # a marker file is written once its traces are
    bad_line: bool = False
    debug: bool = False
    producer: str = "0.1"  # 0.1 (the seed), 0.2, 0.3 or 0.4


DEMO_RUNS = [
    DemoRun("finished-before-start", 40),
    DemoRun("by-expected-count", 20),
    DemoRun("by-marker", 12, expected=False, marker=True),
    DemoRun("by-settle-time", 8, expected=False),
    DemoRun("with-a-bad-line", 12, bad_line=True),
    DemoRun("debug", 4, debug=True),
    DemoRun("verifiers-0.2", 8, producer="0.2"),
    DemoRun("verifiers-0.3", 8, producer="0.3"),
    DemoRun("verifiers-0.4", 8, producer="0.4"),
]


def _run_dir(root: Path, kind: str, rng: random.Random) -> Path:
    return root / f"{TASKSET}--{kind}" / str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _demo_lines(run: DemoRun, rng: random.Random, run_id: str) -> list[bytes]:
    traces = [_trace(rng, n, n // 2) for n in range(run.traces)]
    if run.producer == "0.2":
        traces = [_as_v2(trace, run_id) for trace in traces]
    elif run.producer in ("0.3", "0.4"):
        version = f"{run.producer}.0"
        traces = [_as_episode(trace, run_id, version) for trace in traces]
    lines = [msgspec.json.encode(trace) for trace in traces]
    if run.bad_line:
        lines[2] = b'{"id": "broken", "task": {"idx": "three"}}'
    return [line + b"\n" for line in lines]


def _start_run(root: Path, run: DemoRun) -> tuple[Path, list[bytes]]:
    """Create the run directory as an eval does (its config, an empty traces.jsonl)."""
    rng = random.Random(f"{DEMO_SEED}/{run.kind}")
    directory = _run_dir(root, run.kind, rng)
    if run.producer in ("0.3", "0.4"):
        return _start_episode_run(root, run, rng, directory.name)
    directory.mkdir(parents=True)
    tasks = f"num_tasks = {run.traces // 2}\n" if run.expected else ""
    debug = 'command = "pytest -x"\n' if run.debug else ""
    (directory / "config.toml").write_text(
        f'model = "{MODEL}"\nnum_rollouts = 2\n{tasks}push = false\n{debug}'
        f'\n[taskset]\nid = "{TASKSET}"\n'
    )
    (directory / "traces.jsonl").touch()
    return directory, _demo_lines(run, rng, directory.name)


def _start_episode_run(
    root: Path, run: DemoRun, rng: random.Random, run_id: str
) -> tuple[Path, list[bytes]]:
    """A 0.3/0.4 run directory: `<env>--<model>--<harness>--<8 hex>` with its resolved config,
    an empty traces.jsonl and its logs; a 0.4 eval that ran offline has a `disabled-` run id."""
    name = f"{TASKSET}--{MODEL.replace('/', '--')}--default--{run_id[:8]}"
    directory = root / f"{TASKSET}--{run.kind}" / name
    (directory / "configs" / "resolved").mkdir(parents=True)
    tasks = run.traces // 2
    config: dict = {
        "env": {"taskset": {"id": TASKSET}},
        "run": {"name": name, "dir": name},
        "model": MODEL,
        "num_rollouts": 2,
        "push": False,
    }
    if run.producer == "0.4":
        config["select"] = {"limit": tasks}
        run_id = f"disabled-{run_id.replace('-', '')[:16]}"
    else:
        config["num_tasks"] = tasks
    (directory / "configs" / "resolved" / "eval.json").write_bytes(msgspec.json.encode(config))
    (directory / "logs" / "attempt_1").mkdir(parents=True)
    (directory / "logs" / "latest").symlink_to("attempt_1")
    (directory / "traces.jsonl").touch()
    return directory, _demo_lines(run, rng, run_id)


def _write_slowly(directory: Path, lines: list[bytes], run: DemoRun, stop: threading.Event) -> None:
    """Append one trace at a time, each first half-written, as a running eval does."""
    with (directory / "traces.jsonl").open("ab", buffering=0) as traces:
        for line in lines:
            half = len(line) // 2
            traces.write(line[:half])
            if stop.wait(LINE_SECONDS / 2):
                return
            traces.write(line[half:])
            if stop.wait(LINE_SECONDS / 2):
                return
    if run.marker:
        (directory / MARKER).touch()


class DemoWriters:
    """The demo's evals: each run written by its own thread while the daemon watches."""

    def __init__(self, root: Path):
        self.root = root
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def write_finished(self) -> None:
        """The runs that finished before the daemon started."""
        for run in DEMO_RUNS[:1]:
            directory, lines = _start_run(self.root, run)
            (directory / "traces.jsonl").write_bytes(b"".join(lines))

    def start(self) -> None:
        for run in DEMO_RUNS[1:]:
            directory, lines = _start_run(self.root, run)
            thread = threading.Thread(
                target=_write_slowly, args=(directory, lines, run, self._stop), name="demo-eval"
            )
            thread.start()
            self._threads.append(thread)

    @property
    def writing(self) -> bool:
        return any(thread.is_alive() for thread in self._threads)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()


def write_sample_runs(root: Path) -> list[Path]:
    """Finished runs of every kind the demo shows (for a platform filled by `evalpush push`)."""
    return [
        _write_run(root, "finished", traces=40),
        _write_run(root, "with-a-bad-line", traces=20, bad_line=True),
        _write_run(root, "legacy-results", traces=10, file_name="results.jsonl"),
        _write_run(root, "debug", traces=4, extra_config='command = "pytest -x"'),
        _write_run(root, "replay", traces=4, extra_config="num_rescores = 1"),
    ]


@contextmanager
def _scratch(directory: Path | None) -> Iterator[Path]:
    """The demo's scratch directory: a temporary one, or `directory` (made for the demo, or
    cleared if an earlier demo made it; anything else there is refused)."""
    if directory is None:
        with tempfile.TemporaryDirectory(prefix="evalpush-demo-") as scratch:
            yield Path(scratch)
        return
    if directory.exists() and any(directory.iterdir()):
        if not (directory / SCRATCH_MARK).exists():
            raise UsageError(f"{directory}: not empty and not an earlier demo's: give a new --dir")
        _clear(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / SCRATCH_MARK).touch()
    yield directory


def _clear(directory: Path) -> None:
    import shutil

    for child in directory.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def _config(scratch: Path, platform: LocalPlatform) -> Config:
    return Config.model_validate(
        {
            "watch": {"roots": [str(scratch / "outputs")], "rescan_seconds": 5},
            "runs": {"settle_seconds": SETTLE_SECONDS, "marker": MARKER},
            "platform": {"api_base_url": platform.base_url, "frontend_url": platform.base_url},
            "state": {"dir": str(scratch / "state")},
        }
    )


class LiveView:
    """What the demo writes on `out`: the live view, and (on a terminal) the log's lines. The
    view is drawn again in place; a log line is written where the view starts and the view
    drawn again below it, so a warning never lands inside the table. `log_stream` is the stream
    for the log (`log.configure`)."""

    def __init__(self, out: IO[str]) -> None:
        self._out = out
        self._lock = threading.Lock()
        self._view = ""  # the view as last drawn, ending with the cursor where it starts
        self.redraw = out.isatty()

    def draw(self, view: str) -> None:
        with self._lock:
            self._out.write(view)
            self._out.flush()
            self._view = view if self.redraw else ""

    def finish(self, text: str) -> None:
        """The last of the view: `text` in its place, and no view drawn again after a line."""
        with self._lock:
            self._view = ""
            self._out.write((CLEAR_BELOW if self.redraw else "\n") + text)
            self._out.flush()

    def write(self, line: str) -> int:
        """A log line (structlog writes each in one call), above the view."""
        with self._lock:
            self._out.write(f"{CLEAR_BELOW}{line}{self._view}" if self._view else line)
            self._out.flush()
        return len(line)

    def flush(self) -> None:
        self._out.flush()

    def isatty(self) -> bool:
        return self._out.isatty()

    def fileno(self) -> int:
        return self._out.fileno()


def run_demo(
    out: IO[str],
    *,
    directory: Path | None = None,
    keep: bool = False,
    log_format: str = "auto",
    log_stream: IO[str] | None = None,
) -> int:
    """The demo, its view on `out`. The log (at warning: the view says what becomes of each
    run) goes to `log_stream`; when both are a terminal, above the live view instead."""
    from evalpush import log

    view = LiveView(out)
    log_stream = log_stream or sys.stderr
    above = view.redraw and log_stream.isatty()
    log.configure("warning", log_format, stream=view if above else log_stream)
    log.capture_warnings()  # a library's warning is a log line too: above the view, not in it
    with _scratch(directory) as scratch, LocalPlatform(api_key=DEMO_KEY) as platform:
        config = _config(scratch, platform)
        writers = DemoWriters(scratch / "outputs")
        writers.write_finished()
        out.write(
            f"local platform: {platform.base_url}\nwatching:       {scratch / 'outputs'}\n"
            f"(settle time cut to {SETTLE_SECONDS:g} s, marker file {MARKER})\n\n"
        )
        # Only the demo's own platform: neither the caller's PRIME_* variables nor their
        # ~/.prime/config.json may point it at the real one.
        daemon = Daemon(
            lambda: config, environ={"PRIME_API_KEY": platform.api_key or DEMO_KEY}, home=scratch
        )
        running = threading.Thread(target=daemon.run, args=(config,), name="demo-daemon")
        running.start()
        try:
            writers.start()
            rows, settled = _follow(view, default_path(config.state_dir), writers)
        finally:
            writers.stop()
            daemon.request(Request.STOP)
            running.join()
        view.finish(status_table(rows, wide=True) + "\n")
        if not settled:
            out.write(
                f"\nnot every demo run settled within {DEMO_SECONDS:g} s "
                f"({len(DEMO_RUNS)} runs): the rows above say where each one stands\n"
            )
            return 1
        if keep:
            out.write(f"\nserving {platform.base_url} until Ctrl-C\n")
            out.flush()
            try:
                while True:
                    signal.pause()
            except KeyboardInterrupt:
                pass
    return 0


SETTLED = frozenset({State.FINALIZED, State.SKIPPED, State.FAILED, State.HELD})


def _follow(view: LiveView, ledger_path: Path, writers: DemoWriters) -> tuple[list[dict], bool]:
    """The live status view, until every demo run has settled (or the demo's time is up: then
    the second value is False)."""
    deadline = time.monotonic() + DEMO_SECONDS
    rows: list[dict] = []
    shown = ""
    while time.monotonic() < deadline:
        rows = _rows(ledger_path)
        current = [row for row in rows if row["state"] != State.SUPERSEDED]
        done = len(current) == len(DEMO_RUNS) and all(r["state"] in SETTLED for r in current)
        drawn = _live_view(rows, redraw=view.redraw)
        if drawn != shown:
            view.draw(drawn)
            shown = drawn
        if done and not writers.writing:
            return rows, True
        time.sleep(REFRESH_SECONDS)
    return rows, False


def _rows(ledger_path: Path) -> list[dict]:
    try:
        with Ledger(ledger_path, read_only=True) as ledger:
            return status_rows(ledger)
    except LedgerError:
        return []  # not created yet


def _live_view(rows: list[dict], *, redraw: bool) -> str:
    """On a terminal, the status table drawn again in place; elsewhere a line of counts."""
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["state"]] = counts.get(row["state"], 0) + 1
    summary = ", ".join(f"{count} {state}" for state, count in sorted(counts.items()))
    line = f"[{time.strftime('%H:%M:%S')}] {summary or 'starting'}\n"
    if not redraw:
        return line
    width = shutil.get_terminal_size().columns - 1
    table = [f"{'RUN':<24} {'STATE':<10} {'SENT/SEEN':<10} WHY"]
    for row in rows:
        kind = Path(row["path"]).parent.name.removeprefix(f"{TASKSET}--")
        sent = "" if row["samples_sent"] is None else f"{row['samples_sent']}/{row['samples_seen']}"
        why = row["last_error"] or row["reason"] or ""
        table.append(f"{kind:<24} {row['state']:<10} {sent:<10} {why}")
    drawn = "".join(f"{text[:width]}\n" for text in table)  # one screen line each: no wrapping
    return f"{CLEAR_BELOW}{line}{drawn}{UP * (len(table) + 1)}"


CLEAR_BELOW, UP = "\x1b[J", "\x1b[F"  # erase to the end of the screen; cursor up one line
