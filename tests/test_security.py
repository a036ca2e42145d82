"""Security checks as tests, on real processes: what evalpush never reads, never writes, never
sends, and what it refuses.

- A `traces.jsonl` symlinked to a file outside the watched root is never read, by the daemon
  or by `push` (a marker trace in the target never reaches the platform; a FIFO as the target
  never blocks either).
- The API key appears in no line the daemon printed, no `status` output (table, `--json`, one
  run in full), no byte of the ledger (`state.db` and its `-wal`, read as bytes while the daemon
  runs and after), and no field the platform stored (evaluations and samples), after a daemon
  run in which the platform echoed the key in a 500, in a 422 on samples (set aside as rejected),
  and in the 400 that failed a run.
- Under `umask 000`, the state directory is made 0700 and the ledger (and its -wal/-shm) 0600.
- An `http://` base URL to a host that is not loopback is refused (exit 2, a message saying
  why) by `run` and `push` before anything is sent; `check` is tested in tests/test_cli_push.py.
- A key file others may read draws a warning naming the file (never the key).

Covered elsewhere, not repeated here: the scrubber itself (tests/test_secrets.py); a push whose
refusals echo the key, a malformed key (tests/test_hostile_push.py `TestTheKeyNeverLeaves`); the
daemon's state dir after a 503 echoing the key (tests/test_daemon.py `TestSecrets`); a
symlinked run directory or trace file left out of the daemon's uploads (tests/test_daemon_hostile
.py `TestOddFiles`); a symlinked or non-regular `state.db` refused (tests/test_ledger.py); the
systemd unit's sandbox, `systemd-analyze security` exposure at most 2.0 and `verify`
(tests/test_systemd_unit.py).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from daemon_support import (
    RUN_FINALIZED,
    Daemon,
    RunDir,
    daemon_environ,
    evaluations_of,
    status,
    trace_line,
    wait_until,
)
from evalpush.local_platform import LocalPlatform
from pushing import assert_run_exactly_once

KEY = 'sk-live-Wq7/Zp3+Lm9="Xr5\\Tb2Nv8Kc4Hd6'
"""A key whose JSON, repr and URL spellings each differ from it."""
PART = 8
"""Any run of this many characters of the key counts as the key (as the scrubber's rule)."""
GROUP = "gsm8k--org--model--default"
RUN_TIMEOUT_SECONDS = 60


def key_parts(key: str = KEY) -> set[str]:
    return {key[i : i + PART] for i in range(len(key) - PART + 1)}


def spellings(key: str = KEY) -> set[bytes]:
    """The key's parts as bytes, raw and as JSON and repr would escape them."""
    found: set[bytes] = set()
    for part in key_parts(key):
        found |= {part.encode(), json.dumps(part)[1:-1].encode(), repr(part)[1:-1].encode()}
    return found


def assert_no_key(data: bytes, where: str) -> None:
    found = sorted(part for part in spellings() if part in data)
    assert not found, f"{where} holds parts of the key: {found}"


def evalpush(environ: dict[str, str], *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "evalpush", *args],
        env=environ,
        capture_output=True,
        timeout=RUN_TIMEOUT_SECONDS,
        check=False,
    )


@pytest.fixture
def platform() -> Iterator[LocalPlatform]:
    with LocalPlatform(api_key=KEY) as local:
        yield local


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "outputs"
    root.mkdir()
    return root


# ------------------------------------------------------------------ symlinks out of the root


def _secret_traces(outside: Path) -> Path:
    """A trace file outside the root whose traces carry a marker id."""
    outside.mkdir()
    target = outside / "secret.jsonl"
    lines = [orjson.loads(trace_line(i, i)) | {"id": f"secret-{i}"} for i in range(4)]
    target.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    return target


def _stored_ids(platform: LocalPlatform) -> set[str]:
    return {
        sample["sample_id"]
        for evaluation_id in platform.summary()["evaluations"]
        for sample in platform.samples(evaluation_id)
    }


class TestSymlinkOutOfTheRoot:
    def test_push_never_reads_a_trace_file_symlinked_out_of_the_root(
        self, platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        target = _secret_traces(tmp_path / "private")
        linked = RunDir(tree / GROUP).config(num_tasks=2)
        linked.traces.symlink_to(target)
        good = RunDir(tree / GROUP).config(num_tasks=2)
        good.write(good.lines(4))
        environ = daemon_environ(platform, tmp_path, [tree])

        by_root = evalpush(environ, "push", str(tree))
        by_dir = evalpush(environ, "push", str(linked.path))

        assert by_root.returncode == 0, by_root.stderr.decode()
        assert by_dir.returncode == 3, by_dir.stderr.decode()  # no run directory there
        assert f"{linked.traces} is a symlink" in by_dir.stderr.decode()
        assert not any(i.startswith("secret-") for i in _stored_ids(platform))
        assert evaluations_of(platform, linked.run_id) == {}
        assert_run_exactly_once(platform, good.path)

    def test_the_daemon_never_opens_a_fifo_a_trace_file_links_to_out_of_the_root(
        self, platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        """A reader that opened the FIFO would block on it (or hold it open, which the probe
        sees: opening a FIFO to write without blocking succeeds only while a reader has it)."""
        (tmp_path / "private").mkdir()
        fifo = tmp_path / "private" / "traces.fifo"
        os.mkfifo(fifo)
        linked = RunDir(tree / GROUP).config(num_tasks=2)
        linked.traces.symlink_to(fifo)
        environ = daemon_environ(platform, tmp_path, [tree])
        with Daemon(environ) as daemon:
            daemon.started()
            opened = 0
            deadline = time.monotonic() + 3 * float(environ["EVALPUSH_WATCH__RESCAN_SECONDS"])
            while time.monotonic() < deadline:  # three rescans, probed every few ms
                try:
                    os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
                    opened += 1
                except OSError:  # ENXIO: no reader has it open
                    pass
                time.sleep(0.005)
            good = RunDir(tree / GROUP).config(num_tasks=2)
            good.write(good.lines(4))
            daemon.wait_for(RUN_FINALIZED, run=good.run_id)
            assert daemon.stop() == 0
        assert opened == 0
        assert linked.run_id not in status(environ)
        assert_run_exactly_once(platform, good.path)


# ------------------------------------------------------------------ the key on every path


class TestTheKeyNeverLeavesTheDaemon:
    def test_no_log_line_status_output_ledger_byte_or_stored_field_holds_the_key(
        self, platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        environ = daemon_environ(platform, tmp_path, [tree], EVALPUSH_LOG__LEVEL="debug")
        state = Path(environ["EVALPUSH_STATE_DIR"])
        failing = RunDir(tree / GROUP).config(num_tasks=2)
        refused = RunDir(tree / GROUP).config(num_tasks=5)
        with Daemon(environ) as daemon:
            daemon.started()
            platform.inject("echo_key", on="resolve", status=500, count=2)  # retried, logged
            platform.inject("echo_key", on="create", status=400, count=1)  # fails the run
            failing.write(failing.lines(4))
            wait_until(
                lambda: status(environ).get(failing.run_id, {}).get("state") == "failed",
                "the run the 400 refused to fail",
            )
            platform.inject("echo_key", on="samples", status=422, count=3)  # set aside
            refused.write(refused.lines(10))
            daemon.wait_for(RUN_FINALIZED, run=refused.run_id)
            while_running = {
                name: (state / name).read_bytes()
                for name in ("state.db", "state.db-wal")
                if (state / name).exists()
            }
            assert "state.db-wal" in while_running, "the WAL is read while it holds the writes"
            assert daemon.stop() == 0

        rows = status(environ)
        assert rows[failing.run_id]["state"] == "failed"
        assert "400" in rows[failing.run_id]["last_error"], "the refusal was recorded"
        assert rows[refused.run_id]["set_aside"] > 0, "the 422s set samples aside"
        assert daemon.find("platform call failed; retrying"), "the echo was logged"

        for line in daemon.raw:
            assert_no_key(line, "a line the daemon printed")
        outputs = {
            "status": evalpush(environ, "status"),
            "status --json": evalpush(environ, "status", "--json"),
            "status RUN (failed)": evalpush(environ, "status", failing.run_id),
            "status RUN --json (failed)": evalpush(environ, "status", failing.run_id, "--json"),
            "status RUN (set aside)": evalpush(environ, "status", refused.run_id),
        }
        for name, done in outputs.items():
            assert done.returncode == 0, (name, done.stderr)
            assert_no_key(done.stdout + done.stderr, name)
        for name, data in while_running.items():
            assert_no_key(data, f"{name} while the daemon ran")
        files = [path for path in state.rglob("*") if path.is_file()]
        assert any(path.name == "state.db" for path in files)
        for path in files:
            assert_no_key(path.read_bytes(), str(path))
        stored = platform.summary()
        assert_no_key(orjson.dumps(stored), "the platform's stored evaluations")
        for evaluation_id in stored["evaluations"]:
            assert_no_key(orjson.dumps(platform.samples(evaluation_id)), "stored samples")


# ------------------------------------------------------------------ file modes


class TestFileModes:
    def test_under_umask_000_the_state_dir_is_0700_and_the_ledger_0600(
        self, platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        run = RunDir(tree / GROUP).config(num_tasks=2)
        run.write(run.lines(4))
        environ = daemon_environ(platform, tmp_path, [tree])
        state = Path(environ["EVALPUSH_STATE_DIR"])
        with Daemon(environ, prefix=["sh", "-c", 'umask 000 && exec "$@"', "umask-000"]) as daemon:
            daemon.wait_for(RUN_FINALIZED, run=run.run_id)
            modes = {
                path.name: stat.S_IMODE(path.stat().st_mode) for path in [state, *state.iterdir()]
            }
            assert daemon.stop() == 0
        assert modes[state.name] == 0o700, modes
        assert modes["state.db"] == 0o600, modes
        for name in ("state.db-wal", "state.db-shm"):
            if name in modes:
                assert modes[name] == 0o600, modes


# ------------------------------------------------------------------ what is refused


class TestRefused:
    @pytest.mark.parametrize("command", ["run", "push"])
    def test_plain_http_to_a_host_that_is_not_loopback_is_refused_with_exit_2(
        self, command: str, platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        run = RunDir(tree / GROUP).config(num_tasks=2)
        run.write(run.lines(4))
        environ = daemon_environ(
            platform, tmp_path, [tree], PRIME_API_BASE_URL="http://platform.example.com"
        )
        args = [command] + ([str(tree)] if command == "push" else [])

        done = evalpush(environ, *args)

        assert done.returncode == 2, done.stderr.decode()
        said = done.stdout + done.stderr
        assert b"http://platform.example.com" in said
        assert b"plain http to a non-loopback host" in said
        assert b"allow_insecure_http" in said
        assert sum(platform.summary()["requests"].values()) == 0
        assert_no_key(said, f"{command} output")

    @pytest.mark.parametrize("command", ["check", "push"])
    @pytest.mark.parametrize("variable", ["PRIME_API_BASE_URL", "PRIME_FRONTEND_URL"])
    def test_a_url_holding_a_password_is_refused_without_printing_it(
        self, command: str, variable: str, platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        """The API key is evalpush's one credential: a `user:password@` in a platform URL would
        be printed by `check`, and the frontend's would go into every viewer URL stored."""
        password = "hunter2-not-a-key"
        run = RunDir(tree / GROUP).config(num_tasks=2)
        run.write(run.lines(4))
        environ = daemon_environ(platform, tmp_path, [tree])
        url = (
            environ["PRIME_API_BASE_URL"]
            if variable == "PRIME_API_BASE_URL"
            else "https://app.example"
        )
        environ[variable] = url.replace("://", f"://operator:{password}@", 1)
        args = [command] + ([str(tree)] if command == "push" else [])

        done = evalpush(environ, *args)

        said = done.stdout + done.stderr
        assert done.returncode == 2, said.decode()
        assert variable.encode() in said and b"user name or password" in said
        assert password.encode() not in said
        assert b"prime login" not in said  # the key is not what is wrong
        assert sum(platform.summary()["requests"].values()) == 0
        assert_no_key(said, f"{command} output")

    def test_a_key_file_others_may_read_draws_a_warning_naming_it_not_the_key(
        self, platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        key_file = tmp_path / "prime-api-key"
        key_file.write_text(KEY + "\n")
        key_file.chmod(0o644)
        run = RunDir(tree / GROUP).config(num_tasks=2)
        run.write(run.lines(4))
        environ = daemon_environ(
            platform,
            tmp_path,
            [tree],
            PRIME_API_KEY=None,
            EVALPUSH_PLATFORM__API_KEY_FILE=str(key_file),
            EVALPUSH_LOG__LEVEL="warning",
        )

        loose = evalpush(environ, "push", str(tree))
        key_file.chmod(0o600)
        tight = evalpush(environ, "check")

        assert loose.returncode == 0, loose.stderr.decode()
        said = (loose.stdout + loose.stderr).decode()
        assert "the API key file is readable by other users: chmod 600 it" in said, said
        assert str(key_file) in said and "0644" in said
        assert_no_key(loose.stdout + loose.stderr, "push output")
        assert tight.returncode == 0, tight.stdout + tight.stderr
        assert "readable by other users" not in (tight.stdout + tight.stderr).decode()
        assert_run_exactly_once(platform, run.path)
