"""Writer processes: the planned runs written line by line into the watched tree, as evals do.

`python -m soakkit.writers --plans plans.json --tree DIR --writer I --writers N --manifest FILE`
(with `bench/` on the path) writes every plan whose index is I modulo N. It keeps a few runs open
at once and, between short random pauses, appends a burst of lines to one of them; sometimes
the last line of a burst is left half-written for a while; planned bad lines go in where
planned; a run planned for a rewrite has its file replaced mid-way by an atomic rename of a new
file holding a prefix of its lines (as `--resume` does), then goes on; a MARKER run ends with the
marker file. Each run's `config.toml` is complete (written beside it and renamed) before its
`traces.jsonl` exists.

When a run is finished the writer appends one JSON line to its manifest (flushed and fsynced):
the run id and path, the lines in the final file, the ids of its good lines in file order, the
number of bad lines, and the SHA-256 and size of the final file as read back from disk. The
accounting trusts this and the platform, never evalpush.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from gen_traces import (  # bench/ is on the path: the suite's one trace generator
    config_toml,
    fill,
    line_values,
    task_order,
    template,
    variant,
)

from soakkit.plan import MODEL, BadLine, Flaw, Readiness, RunPlan, load_plans

MARKER = ".done"
TEMPLATES = 64  # distinct rollout shapes per writer; lines differ in ids, idxs, rewards, times
OPEN_RUNS = 3  # runs a writer appends to at once
MAX_BURST_LINES = 6
HALF_LINE_SHARE = 0.15  # bursts whose last line is left half-written for a while
HALF_LINE_HOLD_SECONDS = (0.2, 1.2)


def run_config(plan: RunPlan) -> str:
    """The run's config.toml: gen_traces' shape with the planned environment and task count."""
    text = config_toml(plan.num_tasks).replace('id = "reverse-text"', f'id = "{plan.environment}"')
    if plan.flaw == Flaw.NO_ENV:
        return text.replace(f'id = "{plan.environment}"\n', "")
    if plan.flaw == Flaw.BAD_CONFIG:
        return text.replace(f'model = "{MODEL}"', f'model = "{MODEL}\n[taskset')
    return text


def bad_line(kind: BadLine, good: bytes, rng: random.Random) -> bytes:
    """A line the converter must set aside, made from a good one."""
    if kind == BadLine.TRUNCATED_JSON:
        return good[: len(good) // 2] + b"\n"
    if kind == BadLine.NOT_UTF8:
        return good[:20] + b"\xff\xfe" + good[20:]  # inside the id string
    if kind == BadLine.ARRAY:
        return b"[" + good[:-1] + b"]\n"
    # NO_TASK_IDX: valid JSON, a fresh id, no task.idx
    trace = json.loads(good)
    del trace["task"]["idx"]
    trace["id"] = f"bad-{rng.getrandbits(64):016x}"
    return json.dumps(trace, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def write_atomically(path: Path, data: bytes) -> None:
    partial = path.with_name(f".{path.name}.partial")
    partial.write_bytes(data)
    os.replace(partial, path)


def file_digest(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


@dataclass
class OpenRun:
    """A run being written: its lines so far and where the next one goes."""

    plan: RunPlan
    directory: Path
    rng: random.Random
    order: list[int]
    file: BinaryIO | None = None  # open for appending while the run is written
    written: list[tuple[bytes, str | None]] = field(default_factory=list)  # (line, good id)
    tail: bytes = b""  # the rest of a half-written line
    tail_after: float = 0.0  # monotonic time the tail may be written
    rewritten: bool = False

    @property
    def traces(self) -> Path:
        return self.directory / "traces.jsonl"

    @property
    def done(self) -> bool:
        return len(self.written) >= self.plan.lines and not self.tail


class Writer:
    """Writes its share of the plans, a few at once, and records each finished run."""

    def __init__(self, tree: Path, manifest: Path, seed: int, pause_seconds: float) -> None:
        self.tree = tree
        self.manifest = manifest
        self.rng = random.Random(seed)
        self.templates = [template(variant(self.rng)) for _ in range(TEMPLATES)]
        self.pause_seconds = pause_seconds

    def run(self, plans: list[RunPlan]) -> None:
        waiting = list(plans)
        open_runs: list[OpenRun] = []
        while waiting or open_runs:
            while waiting and len(open_runs) < OPEN_RUNS:
                open_runs.append(self.open(waiting.pop(0)))
            ready = [r for r in open_runs if time.monotonic() >= r.tail_after]
            if ready:
                run = self.rng.choice(ready)
                self.step(run)
                if run.done:
                    self.finish(run)
                    open_runs.remove(run)
            time.sleep(self.rng.uniform(0, self.pause_seconds))

    def open(self, plan: RunPlan) -> OpenRun:
        directory = self.tree / plan.relpath
        directory.mkdir(parents=True, exist_ok=True)
        write_atomically(directory / "config.toml", run_config(plan).encode())
        rng = random.Random(plan.seed)
        run = OpenRun(plan, directory, rng, task_order(rng, plan.lines))
        run.file = open(run.traces, "ab", buffering=0)  # noqa: SIM115 - closed in finish()
        return run

    def step(self, run: OpenRun) -> None:
        """Write the held tail, or a burst of lines (its last one maybe half-written)."""
        if run.tail:
            run.file.write(run.tail)
            run.tail = b""
            return
        if run.plan.rewrite_at is not None and not run.rewritten:
            if len(run.written) >= run.plan.rewrite_at:
                self.rewrite(run)
                return
        burst = self.rng.randint(1, MAX_BURST_LINES)
        lines = [self.line(run) for _ in range(min(burst, run.plan.lines - len(run.written)))]
        data = b"".join(lines)
        if self.rng.random() < HALF_LINE_SHARE:
            cut = len(data) - self.rng.randint(1, len(lines[-1]) - 1)
            data, run.tail = data[:cut], data[cut:]
            run.tail_after = time.monotonic() + self.rng.uniform(*HALF_LINE_HOLD_SECONDS)
        run.file.write(data)

    def line(self, run: OpenRun) -> bytes:
        """The next line of the run (recorded as written)."""
        n = len(run.written)
        values = line_values(run.rng, n, run.order[n])
        good = fill(self.templates[run.rng.randrange(TEMPLATES)], values)
        kind = run.plan.bad_lines.get(n)
        if kind is not None:
            entry = (bad_line(kind, good, run.rng), None)
        else:
            entry = (good, values["id"].decode().strip('"'))
        run.written.append(entry)
        return entry[0]

    def rewrite(self, run: OpenRun) -> None:
        """Replace the file by a new one holding a prefix of its lines, by rename (`--resume`)."""
        keep = self.rng.randint(len(run.written) // 2, len(run.written))
        run.written = run.written[:keep]
        run.file.close()
        write_atomically(run.traces, b"".join(line for line, _ in run.written))
        run.file = open(run.traces, "ab", buffering=0)  # noqa: SIM115 - closed in finish()
        run.rewritten = True

    def finish(self, run: OpenRun) -> None:
        run.file.close()
        if run.plan.readiness == Readiness.MARKER:
            (run.directory / MARKER).touch()
        sha256, size = file_digest(run.traces)
        entry = {
            "run_id": run.plan.run_id,
            "index": run.plan.index,
            "path": str(run.directory),
            "lines": len(run.written),
            "good_ids": [sample_id for _, sample_id in run.written if sample_id is not None],
            "bad_lines": sum(1 for _, sample_id in run.written if sample_id is None),
            "rewritten": run.rewritten,
            "sha256": sha256,
            "bytes": size,
            "finished_at": time.time(),
        }
        with open(self.manifest, "a") as f:
            f.write(json.dumps(entry) + "\n")
            f.flush()
            os.fsync(f.fileno())


class ManifestReader:
    """The writers' manifests, read on as they grow: each call parses only the new records."""

    def __init__(self, paths: list[Path]) -> None:
        self._offsets = dict.fromkeys(paths, 0)
        self.finished: dict[str, dict] = {}  # run id -> its record

    def read(self) -> dict[str, dict]:
        for path, offset in self._offsets.items():
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    data = f.read()
            except FileNotFoundError:
                continue
            complete = data[: data.rfind(b"\n") + 1]  # a torn last line is not yet a record
            for line in complete.splitlines():
                entry = json.loads(line)
                self.finished[entry["run_id"]] = entry
            self._offsets[path] = offset + len(complete)
        return self.finished


def read_manifests(paths: list[Path]) -> dict[str, dict]:
    """Every finished run recorded, by run id."""
    return ManifestReader(paths).read()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one soak writer process")
    parser.add_argument("--plans", type=Path, required=True)
    parser.add_argument("--tree", type=Path, required=True)
    parser.add_argument("--writer", type=int, required=True)
    parser.add_argument("--writers", type=int, required=True)
    parser.add_argument("--manifest", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pause-seconds", type=float, default=0.05)
    args = parser.parse_args(argv)
    plans = [p for p in load_plans(args.plans) if p.index % args.writers == args.writer]
    writer = Writer(args.tree, args.manifest, args.seed * 1000 + args.writer, args.pause_seconds)
    writer.run(plans)
    return 0


if __name__ == "__main__":
    sys.exit(main())
