"""What each run of the soak will be: how it becomes ready, what is wrong with it, where it lives.

A plan is pure data, made from a seed (the same seed gives the same runs, paths and ids) and
written to `plans.json` so writer processes and the accounting read one truth.
"""

from __future__ import annotations

import enum
import json
import random
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

NUM_ROLLOUTS = 4  # gen_traces' rollouts per task
MIN_LINES = 8
MIN_RUNS_FOR_EVERY_TRAIT = 8

# Intermediate directories of the tree: deep, some with spaces and non-ASCII names.
GROUPS = ("box-a/2026-01", "box-b/nightly runs", "team ü/sweeps/lr 3e-4", "box-c/a/b/c/d")
ENVIRONMENTS = ("soak-env-alpha", "soak-env-beta", "soak-env-gamma")
MODEL = "openai/gpt-4.1-mini"


class Readiness(enum.StrEnum):
    """How the run tells a watcher it is finished (docs/ARCHITECTURE.md, "Readiness")."""

    COUNT = "count"  # exactly num_tasks * num_rollouts lines
    MARKER = "marker"  # fewer lines, then the marker file
    SETTLE = "settle"  # fewer lines, then nothing: it stops growing


class Flaw(enum.StrEnum):
    """What is wrong with the run, and so what the platform must end up holding for it."""

    NONE = "none"  # one COMPLETED evaluation with every line
    BAD_LINES = "bad_lines"  # one COMPLETED evaluation with every good line
    NO_ENV = "no_env"  # config.toml names no environment: no evaluation at all
    BAD_CONFIG = "bad_config"  # config.toml is not TOML: no evaluation at all

    @property
    def uploads(self) -> bool:
        return self in (Flaw.NONE, Flaw.BAD_LINES)


class BadLine(enum.StrEnum):
    """The kinds of bad line a BAD_LINES run holds; each is set aside, the rest uploads."""

    TRUNCATED_JSON = "truncated_json"
    NOT_UTF8 = "not_utf8"
    ARRAY = "array"
    NO_TASK_IDX = "no_task_idx"


@dataclass(frozen=True, slots=True)
class RunPlan:
    """One run: its directory (relative to the tree), its lines and what happens to it."""

    index: int
    run_id: str
    relpath: str
    environment: str
    lines: int
    num_tasks: int
    readiness: Readiness
    flaw: Flaw
    bad_lines: dict[int, BadLine]  # line index -> kind
    rewrite_at: int | None  # after this many lines the file is replaced (`--resume`-style)
    seed: int

    @property
    def expected_traces(self) -> int:
        return self.num_tasks * NUM_ROLLOUTS

    def to_json(self) -> dict:
        data = asdict(self)
        data["bad_lines"] = {str(k): v.value for k, v in self.bad_lines.items()}
        return data

    @classmethod
    def from_json(cls, data: dict) -> RunPlan:
        return cls(
            **{
                **data,
                "readiness": Readiness(data["readiness"]),
                "flaw": Flaw(data["flaw"]),
                "bad_lines": {int(k): BadLine(v) for k, v in data["bad_lines"].items()},
            }
        )


@dataclass(frozen=True, slots=True)
class Mix:
    """Shares of the runs, each drawn independently per run."""

    bad_lines: float = 0.10
    no_env: float = 0.04
    bad_config: float = 0.04
    rewritten: float = 0.10


def _lines_per_run(rng: random.Random, runs: int, samples: int) -> list[int]:
    """Run sizes around samples / runs (half to one and a half times it), summing near samples."""
    mean = max(MIN_LINES, samples / runs)
    return [max(MIN_LINES, round(rng.uniform(0.5, 1.5) * mean)) for _ in range(runs)]


def _quota(share: float, runs: int) -> int:
    """How many runs get a trait: its share, rounded, but at least one once there are enough
    runs for every trait (so a small soak still meets each kind of run)."""
    return max(1 if runs >= MIN_RUNS_FOR_EVERY_TRAIT else 0, round(share * runs))


def _flaws(rng: random.Random, runs: int, mix: Mix) -> list[Flaw]:
    flaws = [Flaw.BAD_LINES] * _quota(mix.bad_lines, runs)
    flaws += [Flaw.NO_ENV] * _quota(mix.no_env, runs)
    flaws += [Flaw.BAD_CONFIG] * _quota(mix.bad_config, runs)
    flaws += [Flaw.NONE] * max(0, runs - len(flaws))
    rng.shuffle(flaws)
    return flaws[:runs]


def _rewritten(rng: random.Random, runs: int, mix: Mix) -> list[bool]:
    rewritten = [i < _quota(mix.rewritten, runs) for i in range(runs)]
    rng.shuffle(rewritten)
    return rewritten


def _readiness(rng: random.Random, runs: int) -> list[Readiness]:
    kinds = [list(Readiness)[i % len(Readiness)] for i in range(runs)]
    rng.shuffle(kinds)
    return kinds


def plan_one(
    rng: random.Random,
    index: int,
    lines: int,
    readiness: Readiness,
    flaw: Flaw,
    rewritten: bool,
) -> RunPlan:
    if readiness == Readiness.COUNT:
        lines = max(MIN_LINES, lines - lines % NUM_ROLLOUTS)
        num_tasks = lines // NUM_ROLLOUTS
    else:  # never reaches the expected count: ready only by its marker or by settling
        num_tasks = lines // NUM_ROLLOUTS + rng.randint(2, 10)
    bad: dict[int, BadLine] = {}
    if flaw == Flaw.BAD_LINES:
        kinds = list(BadLine)
        rng.shuffle(kinds)
        positions = rng.sample(range(lines), k=min(lines // 4, rng.randint(1, len(kinds))))
        bad = dict(zip(positions, kinds, strict=False))
    run_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
    environment = rng.choice(ENVIRONMENTS)
    relpath = f"{rng.choice(GROUPS)}/{environment}--{MODEL.replace('/', '--')}--default/{run_id}"
    return RunPlan(
        index=index,
        run_id=run_id,
        relpath=relpath,
        environment=environment,
        lines=lines,
        num_tasks=num_tasks,
        readiness=readiness,
        flaw=flaw,
        bad_lines=bad,
        rewrite_at=rng.randint(lines // 3, lines - 1) if rewritten else None,
        seed=rng.getrandbits(32),
    )


def plan_runs(seed: int, runs: int, samples: int, mix: Mix = Mix()) -> list[RunPlan]:
    rng = random.Random(seed)
    sizes = _lines_per_run(rng, runs, samples)
    traits = zip(
        _readiness(rng, runs), _flaws(rng, runs, mix), _rewritten(rng, runs, mix), strict=True
    )
    return [
        plan_one(rng, i, size, *t) for i, (size, t) in enumerate(zip(sizes, traits, strict=True))
    ]


def save_plans(plans: list[RunPlan], path: Path) -> None:
    path.write_text(json.dumps([p.to_json() for p in plans]))


def load_plans(path: Path) -> list[RunPlan]:
    return [RunPlan.from_json(data) for data in json.loads(path.read_text())]
