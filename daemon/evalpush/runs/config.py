"""What a run is, read from its config: the `Run` the upload needs, its kind and its producer.

Eval runs are uploaded; debug runs (config has `script_path` or `command`) never are; replay
runs (config has `num_rescores` and no `model`) only when `runs.upload_replays` is set.
`load_run` reads `config.toml` (verifiers 0.1, 0.2) or the resolved JSON (0.3, 0.4); a
`RunError` names what is wrong.
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Any

import msgspec

from evalpush.config import read_toml
from evalpush.core.errors import RunError
from evalpush.core.ids import OFFLINE_RUN_PREFIX, short_id
from evalpush.runs.identity import KnownRunId, derive_run_id
from evalpush.runs.layout import (
    CONFIG_FILE,
    CONFIGS_DIR,
    RESOLVED_DIR,
    config_file,
    traces_file,
)

DEFAULT_MODEL = "deepseek/deepseek-v4-flash"


class RunKind(enum.StrEnum):
    EVAL = "eval"
    DEBUG = "debug"
    REPLAY = "replay"


class Producer(enum.StrEnum):
    """Which producer's layout and push a run follows (docs/TRACE_FORMATS.md)."""

    TRACES = "traces"  # config.toml: verifiers 0.1 (the seed) and 0.2
    EPISODES_0_3 = "0.3"  # configs/resolved/<command>.json with num_tasks
    EPISODES_0_4 = "0.4"  # configs/resolved/<command>.json with select (prime-runs pushes)


class Run(msgspec.Struct, frozen=True):
    """One run directory and the fields of its config the upload needs."""

    path: Path
    run_id: str
    kind: RunKind
    traces_path: Path
    env_name: str
    model: str
    num_rollouts: int
    num_tasks: int | None
    pushed_inline: bool
    producer: Producer = Producer.TRACES
    name: str = ""  # the run's own name (0.3/0.4 `run.name`), its evaluation's name

    @property
    def evaluation_name(self) -> str:
        return self.name or f"{self.env_name}--{self.model}--{short_id(self.run_id)}"

    @property
    def config_path(self) -> Path:
        return config_file(self.path) or self.path / CONFIG_FILE

    @property
    def pushes_itself(self) -> bool:
        """Whether its eval uploads it itself (its config's `push`, on unless switched off): at
        its end (0.1 to 0.3), or while it runs (0.4, unless it ran offline: a `disabled-` run
        id). Such a run is not followed: its own push makes its evaluation."""
        return self.pushed_inline and not self.run_id.startswith(OFFLINE_RUN_PREFIX)

    @property
    def expected_traces(self) -> int | None:
        """How many trace lines a finished run has, when the config says."""
        return self.num_tasks * self.num_rollouts if self.num_tasks is not None else None


def _kind(config: dict[str, Any]) -> RunKind:
    if "script_path" in config or "command" in config:
        return RunKind.DEBUG
    if "num_rescores" in config and "model" not in config:
        return RunKind.REPLAY
    return RunKind.EVAL


def _int_key(config: dict[str, Any], key: str, default: int | None, path: Path) -> int | None:
    value = config.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise RunError(f"{path}: key {key!r} must be a non-negative integer, got {value!r}")
    return value


def load_run(directory: Path, known: KnownRunId | None = None) -> Run:
    """Read a run directory's identity (`derive_run_id`, with `known`) and config; `RunError`
    names what is wrong."""
    directory = Path(directory)
    traces = traces_file(directory)
    if traces is None:
        raise RunError(f"{directory}: no traces.jsonl (or results.jsonl): not a run directory")
    config_path = config_file(directory)
    if config_path is None:
        raise RunError(
            f"{directory / CONFIG_FILE}: no config.toml (nor {CONFIGS_DIR}/{RESOLVED_DIR}/"
            "eval.json): not a run directory"
        )
    if config_path.name == CONFIG_FILE:
        config = read_toml(config_path, RunError, "config.toml")
        fields = _toml_fields(config, config_path)
    else:
        config = _read_json(config_path)
        fields = _resolved_fields(config, config_path)
    return Run(
        path=directory,
        run_id=derive_run_id(directory, known),
        traces_path=traces,
        num_rollouts=_int_key(config, "num_rollouts", 1, config_path) or 0,
        pushed_inline=bool(config.get("push", True)),
        **fields,
    )


def _toml_fields(config: dict[str, Any], config_path: Path) -> dict[str, Any]:
    """A 0.1/0.2 run's `config.toml`: `[taskset] id` (or `id`), `model`, `num_tasks`."""
    taskset = config.get("taskset")
    taskset_id = taskset.get("id") if isinstance(taskset, dict) else None
    env_name = taskset_id or config.get("id") or ""
    model = config.get("model") or DEFAULT_MODEL
    if not isinstance(env_name, str) or not isinstance(model, str):
        raise RunError(f"{config_path}: 'taskset.id', 'id' and 'model' must be strings")
    num_tasks = _int_key(config, "num_tasks", None, config_path)
    return {"kind": _kind(config), "env_name": env_name, "model": model, "num_tasks": num_tasks}


def _read_json(config_path: Path) -> dict[str, Any]:
    try:
        config = msgspec.json.decode(config_path.read_bytes())
    except OSError as exc:
        raise RunError(f"{config_path}: cannot be read: {exc.strerror or exc}") from None
    except msgspec.DecodeError as exc:
        raise RunError(f"{config_path}: not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise RunError(f"{config_path}: not a JSON object")
    return config


def _resolved_fields(config: dict[str, Any], config_path: Path) -> dict[str, Any]:
    """A 0.3/0.4 run's resolved JSON config (`env.taskset.id`, `model`, `run.name`; the task
    count `num_tasks` in 0.3, `select.limit` in 0.4); its name says its kind."""
    env, run, select = (_section(config, key, config_path) for key in ("env", "run", "select"))
    taskset = _section(env, "taskset", config_path, "env.")
    env_name, model, name = taskset.get("id") or "", config.get("model"), run.get("name") or ""
    if not isinstance(env_name, str) or not isinstance(name, str):
        raise RunError(f"{config_path}: 'env.taskset.id' and 'run.name' must be strings")
    if not isinstance(model, str) or not model:
        raise RunError(f"{config_path}: 'model' must be a non-empty string, got {model!r}")
    producer = Producer.EPISODES_0_4 if "select" in config else Producer.EPISODES_0_3
    tasks = (select, "limit") if producer == Producer.EPISODES_0_4 else (config, "num_tasks")
    return {
        "kind": RunKind(config_path.stem),  # eval.json, debug.json, replay.json
        "env_name": env_name,
        "model": model,
        "name": name,
        "producer": producer,
        "num_tasks": _int_key(*tasks, None, config_path),
    }


def _section(config: dict[str, Any], key: str, path: Path, at: str = "") -> dict[str, Any]:
    value = config.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RunError(f"{path}: '{at}{key}' must be an object, got {type(value).__name__}")
    return value


def require_env_name(run: Run) -> str:
    if not run.env_name:
        keys = (
            "'[taskset] id' and 'id' are both empty"
            if run.producer == Producer.TRACES
            else "'env.taskset.id' is empty"
        )
        raise RunError(f"{run.config_path}: no environment name ({keys}): nothing to upload to")
    return run.env_name
