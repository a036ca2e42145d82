"""`evalpush convert DIR`, run as the user runs it: samples on stdout, summary last on stderr."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson

from as_nobody import without_read_access
from evalpush import cli
from support.environ import clean_environ
from support.runs import config_toml, write_run

RUN_UUID = "3b8e1f20-7c4d-4e5a-9f6b-1a2c3d4e5f60"
CONFIG = config_toml(push=None)


def trace(id: str, idx: int = 0, **fields: Any) -> bytes:
    return orjson.dumps({"id": id, "task": {"idx": idx}, **fields})


def make_run(parent: Path, lines: list[bytes], config: str = CONFIG) -> Path:
    """`parent/RUN_UUID` with `config` and `lines` as traces.jsonl."""
    return write_run(parent, lines, run_id=RUN_UUID, group="", config=config)


def evalpush_convert(directory: Path, *args: str, **env: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "evalpush", *args, "convert", str(directory)],
        check=False,
        capture_output=True,
        env=clean_environ(**env),
        cwd=directory.parent,
        timeout=60,
    )


def samples(result: subprocess.CompletedProcess[bytes]) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in result.stdout.splitlines()]


def summary(result: subprocess.CompletedProcess[bytes]) -> dict[str, Any]:
    return orjson.loads(result.stderr.splitlines()[-1])


class TestConvertCommand:
    def test_a_good_run_prints_its_samples_in_file_order_and_exits_0(self, tmp_path):
        directory = make_run(
            tmp_path,
            [
                trace("a", 1, rewards={"correct": 1.0}),
                trace("b", 0, rewards={"correct": 0.0}),
                trace("c", 1, rewards={"correct": 0.5}),
            ],
        )

        result = evalpush_convert(directory)

        assert result.returncode == 0, result.stderr
        assert [(s["sample_id"], s["rollout_number"]) for s in samples(result)] == [
            ("a", 1),
            ("b", 1),
            ("c", 2),
        ]
        assert len(result.stderr.splitlines()) == 1
        metrics = {"avg_reward": 0.5, "avg_metrics": {"correct": 0.5}, "avg_error": 0.0}
        assert summary(result) == {
            "name": "gsm8k--org/model--3b8e1f20",
            "run_id": RUN_UUID,
            "env_name": "gsm8k",
            "metadata": {
                "framework": "verifiers",
                "run_id": RUN_UUID,
                "model": "org/model",
                "num_examples": 2,
                "rollouts_per_example": 2,
                **metrics,
            },
            "metrics": metrics,
            "set_aside": [],
        }

    def test_a_bad_line_is_named_on_stderr_set_aside_and_exits_1(self, tmp_path):
        good, bad = trace("a"), b'{"id": "b", "task": {"idx": "zero"}}'
        directory = make_run(tmp_path, [good, bad, trace("c")])

        result = evalpush_convert(directory)

        assert result.returncode == 1
        assert [s["sample_id"] for s in samples(result)] == ["a", "c"]
        first_err = result.stderr.splitlines()[0].decode()
        assert first_err.startswith(f"{directory / 'traces.jsonl'}: line 2: 'task.idx'")
        assert summary(result)["set_aside"] == [
            {
                "line": 2,
                "offset": len(good) + 1,
                "reason": "'task.idx' must be an integer, got 'zero'",
                "size": len(bad) + 1,
            }
        ]

    def test_nan_is_accepted_and_sent_as_null(self, tmp_path):
        directory = make_run(tmp_path, [b'{"id": "a", "task": {"idx": 0}, "rewards": {"r": NaN}}'])

        result = evalpush_convert(directory)

        assert result.returncode == 0, result.stderr
        assert (samples(result)[0]["reward"], samples(result)[0]["r"]) == (None, None)
        assert summary(result)["metrics"]["avg_reward"] is None

    def test_an_empty_traces_file_prints_no_samples_and_exits_0(self, tmp_path):
        result = evalpush_convert(make_run(tmp_path, []))

        assert result.returncode == 0, result.stderr
        assert result.stdout == b""
        assert summary(result)["metrics"] == {
            "avg_reward": 0.0,
            "avg_metrics": {},
            "avg_error": 0.0,
        }

    def test_a_run_without_an_environment_name_converts_and_exits_1(self, tmp_path):
        directory = make_run(tmp_path, [trace("a")], config='model = "m"\n')

        result = evalpush_convert(directory)

        assert result.returncode == 1
        assert [s["sample_id"] for s in samples(result)] == ["a"]
        assert b"no environment name" in result.stderr
        assert summary(result)["env_name"] == ""

    def test_a_directory_that_is_not_a_run_exits_2(self, tmp_path):
        result = evalpush_convert(tmp_path)

        assert result.returncode == 2
        assert result.stdout == b""
        assert f"evalpush: {tmp_path}: no traces.jsonl".encode() in result.stderr
        assert b"Traceback" not in result.stderr

    def test_a_bad_config_value_in_the_environment_exits_2(self, tmp_path):
        directory = make_run(tmp_path, [trace("a")])

        result = evalpush_convert(directory, EVALPUSH_READ__MAX_LINE_BYTES="abc")

        assert result.returncode == 2
        assert result.stdout == b""
        assert b"key 'read.max_line_bytes'" in result.stderr
        assert b"Traceback" not in result.stderr

    def test_an_unknown_key_in_the_config_file_exits_2_naming_key_and_file(self, tmp_path):
        directory = make_run(tmp_path, [trace("a")])
        config = tmp_path / "evalpush.toml"
        config.write_text("[read]\nmax_line_byte = 10\n")

        result = evalpush_convert(directory, "--config", str(config))

        assert result.returncode == 2
        assert b"unknown key 'read.max_line_byte'" in result.stderr
        assert str(config).encode() in result.stderr

    def test_max_line_bytes_from_the_environment_sets_a_long_line_aside(self, tmp_path):
        long_line = trace("long", info={"blob": "x" * 500})
        directory = make_run(tmp_path, [long_line, trace("short")])

        result = evalpush_convert(directory, EVALPUSH_READ__MAX_LINE_BYTES="200")

        assert result.returncode == 1
        assert [s["sample_id"] for s in samples(result)] == ["short"]
        assert summary(result)["set_aside"] == [
            {
                "line": 1,
                "offset": 0,
                "reason": "line longer than read.max_line_bytes (200 bytes)",
                "size": len(long_line) + 1,
            }
        ]


def convert_without_read_access(directory: Path) -> Any:
    """`evalpush convert DIR` in-process by a user who may not read its traces.jsonl."""
    return without_read_access(directory / "traces.jsonl", lambda: _main_outcome(directory))


def _main_outcome(directory: Path) -> tuple[Any, bytes, bytes]:
    """(exit code or the escaping exception, stdout, stderr) of `evalpush convert DIR`."""
    saved = sys.stdout, sys.stderr
    out, err = io.TextIOWrapper(io.BytesIO()), io.TextIOWrapper(io.BytesIO())
    sys.stdout, sys.stderr = out, err
    try:
        code: Any = cli.main(["convert", str(directory)])
    except BaseException as exc:  # noqa: BLE001 - an escaping exception is what the test checks
        code = f"{type(exc).__name__}: {exc}"
    finally:
        sys.stdout, sys.stderr = saved
    out.flush()
    err.flush()
    return code, out.buffer.getvalue(), err.buffer.getvalue()


def test_an_unreadable_traces_file_is_one_clear_error_and_exit_2(open_dir, monkeypatch):
    for name in [k for k in os.environ if k.startswith("EVALPUSH_")]:
        monkeypatch.delenv(name)
    directory = make_run(open_dir, [trace("a")])
    directory.chmod(0o755)

    code, out, err = convert_without_read_access(directory)

    assert code == 2
    assert out == b""
    assert (
        err.decode()
        == f"evalpush: {directory / 'traces.jsonl'}: not readable (permission denied)\n"
    )
