"""The producer's runs at full size: bench/gen_traces.py, the realistic run generator (runs shaped
like a verifiers 0.1.15 run: multi-turn tool calls, token ids, usage, errored rollouts), loaded
once from the bench directory (not a package).

- `gen_traces()`: the generator module; `gen_traces().generate(out, size_bytes, seed=...)`.
- `generated_run(out, size_bytes, seed)`: one generated run directory under `out`.
- `generated_run_of(producer, out, size_bytes, seed)`: the same rollouts as verifiers 0.2 or
  0.4 write them (`gen_traces.rewrite_as`).
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench"


@functools.cache
def gen_traces() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_traces", BENCH / "gen_traces.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def generated_run(out: Path, size_bytes: int, seed: int) -> Path:
    return gen_traces().generate(out, size_bytes, seed=seed)


def generated_run_of(producer: str, out: Path, size_bytes: int, seed: int) -> Path:
    seed_run = generated_run(out / "seed", size_bytes, seed=seed)
    return gen_traces().rewrite_as(seed_run, out / producer, producer)
