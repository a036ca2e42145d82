"""`push` of many runs over helper processes (`evalpush.helper`), as real subprocesses against
the local platform over HTTP: every run exactly once whoever uploads it, and a helper never
outlives its push or takes a run down with it (SIGKILL of the helper, SIGKILL and SIGTERM of
the push), nor hangs it (SIGSTOP of the helper) or interrupts them (SIGTERM of the helper); a Ctrl-C as a helper starts does not end it
with a traceback; text naming a path that is not UTF-8 crosses the pipes as it is."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import NamedTuple

import pytest

from evalpush import helper
from evalpush.app import App
from evalpush.config import Config, PlatformConfig, StateConfig, UploadConfig
from evalpush.local_platform import LocalPlatform
from evalpush.push import push
from pushing import PUSH_TIMEOUT_SECONDS, assert_exactly_once, push_environ, start_push
from support.runs import GROUP, config_toml, trace_line, write_run
from support.waiting import wait_until

RUNS = helper.HELPER_MIN_RUNS + 6
GONE_SECONDS = 10.0
"""A helper ends this soon after its push does (generous: a loaded 2-core box)."""

needs_two_cpus = pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="a push starts helpers only with two CPUs or more"
)


def many_runs(tmp_path: Path, count: int = RUNS) -> Path:
    root = tmp_path / "outputs"
    for n in range(count):
        write_run(
            root,
            [trace_line(n, idx=0)],
            run_id=str(uuid.UUID(int=n + 1)),
            config=config_toml(num_rollouts=1, num_tasks=1),
        )
    return root


def helpers_of(pid: int) -> list[int]:
    """The helper processes whose parent is `pid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue  # gone meanwhile
        parent = int(stat.rpartition(")")[2].split()[1])
        if parent == pid and b"evalpush.helper" in command:
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


class HeldPush(NamedTuple):
    root: Path
    environ: dict[str, str]
    process: subprocess.Popen[bytes]
    helpers: list[int]


def push_held_at_samples(
    platform: LocalPlatform, tmp_path: Path, *flags: str, seconds: float = 600, **settings: str
) -> HeldPush:
    """`push` of `many_runs` started, once its helper is up and the runs in flight (4) are each
    held at their samples by the platform for `seconds` (stored, the answer held back)."""
    root = many_runs(tmp_path)
    platform.inject("stall", on="samples", seconds=seconds, count=4)
    environ = helped_environ(platform, tmp_path, **settings)
    process = start_push(root, environ, *flags)
    helpers = wait_until(lambda: helpers_of(process.pid), "a helper")
    wait_until(lambda: platform.summary()["requests"]["samples"] >= 4, "runs at their samples")
    return HeldPush(root, environ, process, helpers)


def assert_the_next_push_ends_the_job(platform: LocalPlatform, held: HeldPush) -> None:
    again = start_push(held.root, held.environ)
    _, err = again.communicate(timeout=PUSH_TIMEOUT_SECONDS)
    assert again.returncode == 0, err.decode()
    assert_exactly_once(platform, held.root)


def helped_environ(platform: LocalPlatform, tmp_path: Path, **settings: str) -> dict[str, str]:
    """`push_environ` with a helper process (`upload.push_processes = 2`; the default is 1)."""
    return push_environ(platform, tmp_path, EVALPUSH_UPLOAD__PUSH_PROCESSES="2", **settings)


def open_pipes() -> int:
    """How many pipes this process has open."""
    links = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            continue  # the listing's own descriptor, closed by now
    return sum(1 for link in links if link.startswith("pipe:"))


def threading_names() -> set[str]:
    return {thread.name for thread in threading.enumerate()}


def log_lines(stderr: bytes) -> list[dict]:
    return [json.loads(line) for line in stderr.decode().splitlines() if line.startswith("{")]


class TestHowManyHelpers:
    def test_a_push_of_many_runs_on_several_cpus_starts_one_less_than_push_processes(
        self, monkeypatch
    ):
        monkeypatch.setattr(helper.os, "sched_getaffinity", lambda _pid: {0, 1, 2, 3})
        config = Config(upload=UploadConfig(push_processes=3))
        assert helper.helper_count(config, helper.HELPER_MIN_RUNS, workers=4) == 2

    def test_none_for_few_runs_one_cpu_one_process_or_one_thread(self, monkeypatch):
        monkeypatch.setattr(helper.os, "sched_getaffinity", lambda _pid: {0, 1})
        many, two = helper.HELPER_MIN_RUNS, Config(upload=UploadConfig(push_processes=2))
        assert helper.helper_count(two, many, workers=4) == 1
        assert helper.helper_count(two, many - 1, workers=4) == 0
        assert helper.helper_count(two, many, workers=1) == 0
        assert helper.helper_count(Config(), many, workers=4) == 0  # the default: one process
        monkeypatch.setattr(helper.os, "sched_getaffinity", lambda _pid: {3})
        assert helper.helper_count(two, many, workers=4) == 0


@needs_two_cpus
class TestPushWithHelpers:
    def test_many_runs_upload_exactly_once_part_of_them_in_a_helper(
        self, platform: LocalPlatform, tmp_path
    ):
        root = many_runs(tmp_path)
        environ = helped_environ(platform, tmp_path, EVALPUSH_LOG__LEVEL="info")
        process = start_push(root, environ, "--json")
        out, err = process.communicate(timeout=PUSH_TIMEOUT_SECONDS)
        assert process.returncode == 0, err.decode()
        results = json.loads(out)["results"]
        assert len(results) == RUNS
        assert {r["state"] for r in results} == {"finalized"}
        assert_exactly_once(platform, root)
        lines = log_lines(err)
        started = [line for line in lines if line["event"] == "helper process ready"]
        assert len(started) == 1 and started[0]["pid"] != process.pid
        # The helper's own lifecycle lines: it uploaded some of the runs, the push the others.
        finalized = [line for line in lines if line["event"] == "run finalized"]
        assert len(finalized) == RUNS
        assert 0 < sum(1 for line in finalized if line.get("helper") == started[0]["pid"]) < RUNS

    def test_by_default_no_helper_starts(self, platform: LocalPlatform, tmp_path):
        root = many_runs(tmp_path)
        environ = push_environ(platform, tmp_path, EVALPUSH_LOG__LEVEL="info")
        process = start_push(root, environ)
        _, err = process.communicate(timeout=PUSH_TIMEOUT_SECONDS)
        assert process.returncode == 0, err.decode()
        assert not [line for line in log_lines(err) if line["event"] == "helper process ready"]
        assert_exactly_once(platform, root)

    def test_a_helper_killed_mid_upload_leaves_its_runs_to_the_push(
        self, platform: LocalPlatform, tmp_path
    ):
        # The helper is killed with runs half done, which the push takes over and reconciles.
        held = push_held_at_samples(platform, tmp_path)
        os.kill(held.helpers[0], signal.SIGKILL)
        _, err = held.process.communicate(timeout=PUSH_TIMEOUT_SECONDS)
        assert held.process.returncode == 0, err.decode()
        assert "a helper process ended: its runs go on in this process" in err.decode()
        assert_exactly_once(platform, held.root)

    @pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
    def test_a_push_stopped_mid_upload_leaves_no_helper_and_the_next_push_ends_the_job(
        self, platform: LocalPlatform, tmp_path, signum
    ):
        held = push_held_at_samples(platform, tmp_path)
        held.process.send_signal(signum)
        held.process.communicate(timeout=PUSH_TIMEOUT_SECONDS)
        assert held.process.returncode == (-9 if signum == signal.SIGKILL else 143)
        if signum == signal.SIGTERM:  # the push waits for its helper, which the stop reached
            assert not any(alive(pid) for pid in held.helpers)
        wait_until(
            lambda: not any(alive(pid) for pid in held.helpers),
            "the helper to end",
            timeout=GONE_SECONDS,
        )
        assert_the_next_push_ends_the_job(platform, held)

    def test_a_helper_stopped_on_its_own_leaves_its_runs_to_the_push(
        self, platform: LocalPlatform, tmp_path
    ):
        # SIGTERM to the helper alone (not its push): it stops as asked, its runs in flight
        # interrupted. Before, it went on answering "interrupted" at once to every run it was
        # handed, and the push ended with exit 1, nearly every run interrupted, saying nothing.
        held = push_held_at_samples(platform, tmp_path, "--json", seconds=3)
        os.kill(held.helpers[0], signal.SIGTERM)
        out, err = held.process.communicate(timeout=PUSH_TIMEOUT_SECONDS)
        assert held.process.returncode == 0, err.decode()
        assert {r["state"] for r in json.loads(out)["results"]} == {"finalized"}
        assert "a helper process ended: its runs go on in this process" in err.decode()
        assert not alive(held.helpers[0])
        assert_exactly_once(platform, held.root)

    def test_a_helper_that_hangs_is_killed_once_the_push_is_stopped_and_the_push_ends(
        self, platform: LocalPlatform, tmp_path
    ):
        # A helper stopped (SIGSTOP) with runs in hand answers nothing: before, the push's
        # upload threads waited on it for good, and `--timeout` never ended the push.
        held = push_held_at_samples(platform, tmp_path, "--timeout", "2s")
        helper_pid = held.helpers[0]
        os.kill(helper_pid, signal.SIGSTOP)
        try:
            _, err = held.process.communicate(timeout=helper.EXIT_SECONDS + GONE_SECONDS)
        finally:
            if alive(helper_pid):
                os.kill(helper_pid, signal.SIGCONT)
        assert held.process.returncode == 124, err.decode()
        assert not alive(helper_pid)
        assert "a run not answered" in err.decode()
        assert_the_next_push_ends_the_job(platform, held)

    def test_a_stop_cuts_off_a_helpers_request_in_flight_as_soon_as_the_push_s_own(
        self, platform: LocalPlatform, tmp_path
    ):
        # The answers held past `--timeout` (and far under the read timeout): the helper's
        # uploads end at once, and it is not taken for one that hangs.
        root = many_runs(tmp_path)
        platform.inject("stall", on="samples", seconds=600, count=4)
        environ = helped_environ(platform, tmp_path, EVALPUSH_PLATFORM__READ_TIMEOUT_SECONDS="60")
        process = start_push(root, environ, "--timeout", "2s")
        helpers = wait_until(lambda: helpers_of(process.pid), "a helper")
        started = time.monotonic()
        _, err = process.communicate(timeout=PUSH_TIMEOUT_SECONDS)
        assert process.returncode == 124, err.decode()
        assert time.monotonic() - started < helper.EXIT_SECONDS
        assert "a helper process ended" not in err.decode()
        assert not any(alive(pid) for pid in helpers)

    def test_a_run_whose_path_is_not_utf8_fails_in_a_helper_as_in_the_push(
        self, platform: LocalPlatform, tmp_path
    ):
        # Its error names the path, with a lone surrogate for each byte that is not UTF-8,
        # which msgpack cannot carry: before, the helper's answer failed, it stopped its
        # other uploads and was killed.
        results = {}
        for processes in ("1", "2"):
            root = many_runs(tmp_path / processes)
            group = os.fsencode(root / GROUP)
            for n in range(3, RUNS, 7):
                run = group + b"/" + str(uuid.UUID(int=n + 1)).encode()
                with open(run + b"/config.toml", "w") as config:
                    config.write("not = toml [[[")
                os.rename(run, group + b"/run-\xff" + str(n).encode())
            environ = push_environ(
                platform, tmp_path / processes, EVALPUSH_UPLOAD__PUSH_PROCESSES=processes
            )
            process = start_push(root, environ)
            out, err = process.communicate(timeout=PUSH_TIMEOUT_SECONDS)
            assert process.returncode == 1, err.decode()
            assert "a helper process ended" not in err.decode()
            results[processes] = sorted(
                line.replace(str(tmp_path / processes), "")
                for line in out.decode().splitlines()
                if line.startswith("failed")
            )
        assert len(results["1"]) == len(range(3, RUNS, 7))
        assert results["2"] == results["1"]


class TestHelperStart:
    def test_a_ctrl_c_while_a_helper_starts_does_not_end_it(self, tmp_path):
        # A Ctrl-C reaches the whole process group, the helper too, maybe before it could
        # ignore SIGINT: before, its Python ended with a KeyboardInterrupt traceback.
        config = Config(state=StateConfig(dir=tmp_path / "state"))
        started = helper.Helper(config, "warning", "json", lanes=1, stop=threading.Event())
        os.kill(started.process.pid, signal.SIGINT)
        started.close()
        assert started.process.returncode == 0

    def test_a_helper_that_cannot_be_started_leaves_its_runs_to_the_push(
        self, platform: LocalPlatform, tmp_path, monkeypatch
    ):
        # No process to be had (here: no Python where it was; else EAGAIN, EMFILE): before,
        # the push failed with the OSError before uploading anything.
        monkeypatch.setattr(helper.os, "sched_getaffinity", lambda _pid: {0, 1})
        monkeypatch.setattr(helper.sys, "executable", str(tmp_path / "no-python"))
        root = many_runs(tmp_path)
        config = Config(
            state=StateConfig(dir=tmp_path / "state"),
            platform=PlatformConfig(api_base_url=platform.base_url),
            upload=UploadConfig(push_processes=2),
        )
        environ = {"PRIME_API_KEY": platform.api_key or "any-key"}
        with App.from_config(config, environ=environ, home=tmp_path, wait_on_auth=False) as app:
            before = open_pipes()
            results = push(app, [root])
            assert open_pipes() == before, "the helper's pipes are closed"
        assert len(results) == RUNS and all(result.ok for result in results)
        assert_exactly_once(platform, root)

    def test_a_push_without_helpers_starts_no_thread_for_them(
        self, platform: LocalPlatform, tmp_path, monkeypatch
    ):
        monkeypatch.setattr(helper.os, "sched_getaffinity", lambda _pid: {0, 1})
        root = many_runs(tmp_path)
        config = Config(
            state=StateConfig(dir=tmp_path / "state"),
            platform=PlatformConfig(api_base_url=platform.base_url),
        )
        environ = {"PRIME_API_KEY": platform.api_key or "any-key"}
        seen: set[str] = set()
        with App.from_config(config, environ=environ, home=tmp_path, wait_on_auth=False) as app:
            results = push(app, [root], on_result=lambda _r: seen.update(threading_names()))
        assert len(results) == RUNS and all(result.ok for result in results)
        assert "helper-stop" not in seen and any(name.startswith("upload") for name in seen)
