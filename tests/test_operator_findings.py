"""What an operator (and an attacker) found running evalpush, each now the behaviour it should be.

- a ledger URL holding a password: refused without ever quoting the password, however the URL
  spells it (userinfo, a `password` query parameter, its key percent-encoded);
- secret files (the API key file, the ledger's password file, systemd's credentials): a FIFO or
  a device there is an error naming the file, never a read that blocks or never ends;
- `check` is the daemon's start-up, dry: every refusal `run` makes at start is a FAIL row of
  `check`, in `run`'s words;
- `migrate --to` refuses while this host's daemon runs; a refused login is said as such;
- a fleet daemon whose heartbeat stopped is shown as not heard from, at once.

Real parts: `evalpush` as an operator runs it (`support.commands.evalpush`: in this process, or
as a process where only a process shows it, always when it runs under a prefix), real files, FIFOs and devices, real signals, the local
platform over loopback, real PostgreSQL where a shared ledger is needed.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from daemon_support import (
    RUN_STARTED,
    Daemon,
    daemon_environ,
    slow_run,
    upload_under_way,
    wait_until,
)
from evalpush.core.smallfile import SECRET_FILE_BYTES
from evalpush.ledger import Ledger, default_path
from evalpush.ledger.records import HEARTBEAT_SECONDS
from evalpush.local_platform import LocalPlatform
from inotify_limited import limited_namespaces_available
from support import commands
from support.commands import COMMAND_SECONDS, check_rows
from support.environ import cli_environ
from support.postgres import PASSWORD as PG_PASSWORD

LEDGER_PASSWORD = "fleet-secret-123"
SHORT_PASSWORD = "abc"  # under the scrubber's length: only the refusal's masking hides it


def run_evalpush(
    environ: dict[str, str], *args: str, prefix: Sequence[str] = ()
) -> subprocess.CompletedProcess[str]:
    """`evalpush ARGS` to its end (a hang fails the test): `[PREFIX...] python -m evalpush ARGS`
    as a process under a prefix, else as `support.commands.evalpush` runs it."""
    if not prefix:
        return commands.evalpush(environ, *args)
    return subprocess.run(
        [*prefix, sys.executable, "-m", "evalpush", *args],
        env=environ,
        capture_output=True,
        text=True,
        timeout=COMMAND_SECONDS,
    )


# -- a ledger URL holding a password ----------------------------------------------------------

URLS_WITH_PASSWORDS = {
    "userinfo": f"postgresql://evalpush:{LEDGER_PASSWORD}@127.0.0.1:55432/evalpush",
    "short userinfo": f"postgresql://evalpush:{SHORT_PASSWORD}@127.0.0.1:55432/evalpush",
    "query": f"postgresql://evalpush@127.0.0.1:55432/evalpush?password={LEDGER_PASSWORD}",
    "percent-encoded query key": (
        f"postgresql://evalpush@127.0.0.1:55432/evalpush?sslmode=disable&%70assword={LEDGER_PASSWORD}"
    ),
    "upper-case query key": f"postgres://evalpush@127.0.0.1:55432/evalpush?PASSWORD={SHORT_PASSWORD}",
    "wrong scheme": f"mysql://evalpush:{LEDGER_PASSWORD}@127.0.0.1:55432/evalpush",
    "libpq keyword form": f"host=127.0.0.1 user=evalpush password={LEDGER_PASSWORD}",
    "libpq keyword form, quoted": f"host=127.0.0.1 password = '{SHORT_PASSWORD} x' user=e",
}


@pytest.mark.parametrize("command", ["check", "run", "status"])
@pytest.mark.parametrize("url", list(URLS_WITH_PASSWORDS.values()), ids=list(URLS_WITH_PASSWORDS))
def test_a_ledger_url_holding_a_password_is_refused_without_quoting_the_password(
    platform: LocalPlatform, tmp_path: Path, command: str, url: str
) -> None:
    environ = cli_environ(platform, tmp_path, EVALPUSH_LEDGER__URL=url)
    result = run_evalpush(environ, command)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "ledger.url" in output
    password = LEDGER_PASSWORD if LEDGER_PASSWORD in url else SHORT_PASSWORD
    assert f":{password}@" not in output and f"={password}" not in output, output
    assert LEDGER_PASSWORD not in output, output
    assert "***" in output, output  # the URL is shown, its password masked


def test_migrate_to_a_url_holding_a_password_in_its_query_is_refused_without_quoting_it(
    platform: LocalPlatform, tmp_path: Path
) -> None:
    environ = cli_environ(platform, tmp_path)
    url = URLS_WITH_PASSWORDS["percent-encoded query key"]
    result = run_evalpush(environ, "migrate", "--to", url)
    assert result.returncode == 2, result.stderr
    assert "holds a password" in result.stderr
    assert LEDGER_PASSWORD not in result.stdout + result.stderr


# -- secret files that are not regular files -------------------------------------------------


def _fifo(path: Path) -> Path:
    os.mkfifo(path, 0o600)
    return path


def _hostile(kind: str, tmp_path: Path, name: str) -> Path:
    """A FIFO (no writer: an open that waits blocks forever), `/dev/zero` (endless), or a
    regular file over the cap, at `tmp_path/name` (or as `/dev/zero` itself)."""
    path = tmp_path / name
    if kind == "fifo":
        return _fifo(path)
    if kind == "/dev/zero":
        path.symlink_to("/dev/zero")
        return path
    path.write_bytes(b"k" * (SECRET_FILE_BYTES + 1))
    path.chmod(0o600)
    return path


HOSTILE = ["fifo", "/dev/zero", "too large"]
HOSTILE_WORDS = {
    "fifo": "not a regular file (a FIFO)",
    "/dev/zero": "not a regular file (a device)",
    "too large": "larger than 64 KiB",
}


@pytest.mark.parametrize("where", ["api_key_file", "systemd credential"])
@pytest.mark.parametrize("kind", HOSTILE)
def test_a_daemon_whose_key_file_is_no_regular_file_says_so_and_stops_on_sigterm(
    platform: LocalPlatform, tmp_path: Path, tree: Path, kind: str, where: str
) -> None:
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    if where == "api_key_file":
        key = _hostile(kind, tmp_path, "key")
        extra = {"EVALPUSH_PLATFORM__API_KEY_FILE": str(key)}
    else:
        key = _hostile(kind, credentials, "prime-api-key")
        extra = {"CREDENTIALS_DIRECTORY": str(credentials)}
    environ = daemon_environ(platform, tmp_path, [tree], PRIME_API_KEY=None, **extra)
    with Daemon(environ) as daemon:
        daemon.started()
        wait_until(lambda: HOSTILE_WORDS[kind] in daemon.text(), "the key file's refusal")
        assert str(key) in daemon.text()
        assert daemon.stop() == 0
    assert "MemoryError" not in daemon.text() and "Traceback" not in daemon.text()


def test_a_key_file_swapped_for_a_fifo_before_sighup_leaves_the_daemon_stoppable(
    platform: LocalPlatform, tmp_path: Path, tree: Path
) -> None:
    key = tmp_path / "key"
    key.write_text(platform.api_key or "any-key")
    key.chmod(0o600)
    environ = daemon_environ(
        platform, tmp_path, [tree], PRIME_API_KEY=None, EVALPUSH_PLATFORM__API_KEY_FILE=str(key)
    )
    with Daemon(environ) as daemon:
        daemon.started()
        key.unlink()
        _fifo(key)
        daemon.signal(signal.SIGHUP)
        wait_until(
            lambda: len(daemon.find(RUN_STARTED)) >= 1 and "(a FIFO)" in daemon.text(), "the reload"
        )
        assert daemon.stop() == 0


@pytest.mark.parametrize("command", ["status", "check"])
@pytest.mark.parametrize("where", ["password_file", "systemd credential"])
@pytest.mark.parametrize("kind", HOSTILE)
def test_a_ledger_password_file_that_is_no_regular_file_is_an_error_naming_it(
    platform: LocalPlatform, tmp_path: Path, kind: str, where: str, command: str
) -> None:
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    if where == "password_file":
        secret = _hostile(kind, tmp_path, "ledger-password")
        extra = {"EVALPUSH_LEDGER__PASSWORD_FILE": str(secret)}
    else:
        secret = _hostile(kind, credentials, "ledger-password")
        extra = {"CREDENTIALS_DIRECTORY": str(credentials)}
    environ = cli_environ(
        platform,
        tmp_path,
        EVALPUSH_LEDGER__URL="postgresql://evalpush@127.0.0.1:9/evalpush",
        **extra,
    )
    result = run_evalpush(environ, command)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert f"{secret}" in output and HOSTILE_WORDS[kind] in output, output
    assert "Traceback" not in output


# -- check is the daemon's start-up, dry ------------------------------------------------------


@pytest.fixture
def port_in_use() -> Iterator[int]:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


def _refusal(case: str, tmp_path: Path, tree: Path, port: int) -> tuple[dict[str, str], list[str]]:
    """The variables (and the command prefix) that make `run` refuse to start, by case."""
    if case == "relative root":
        return {"EVALPUSH_WATCH__ROOTS": '["outputs"]'}, []
    if case == "the default root given":
        return {"EVALPUSH_WATCH__ROOTS": '["./outputs"]'}, []
    if case == "metrics address in use":
        return {"EVALPUSH_METRICS__LISTEN": f"127.0.0.1:{port}"}, []
    if case == "state dir under a file":
        (tmp_path / "a-file").write_text("")
        return {"EVALPUSH_STATE_DIR": str(tmp_path / "a-file" / "state")}, []
    if case == "ledger password file a FIFO":
        return {
            "EVALPUSH_LEDGER__URL": "postgresql://evalpush@127.0.0.1:9/evalpush",
            "EVALPUSH_LEDGER__PASSWORD_FILE": str(_fifo(tmp_path / "ledger-password")),
        }, []
    if case == "plain http to a remote platform":
        return {"PRIME_API_BASE_URL": "http://platform.example:8000"}, []
    assert case == "inotify forced over the watch limit"
    if not limited_namespaces_available():
        pytest.skip("no user namespace here to lower the inotify limit in")
    # Not one watch left for the root (the directories under it are watched later, each one
    # refused past the limit logged, not a refusal to start)
    limit = 'echo 0 > /proc/sys/user/max_inotify_watches && exec "$@"'
    return {"EVALPUSH_WATCH__OBSERVER": "inotify"}, [
        "unshare", "--user", "--map-root-user", "sh", "-c", limit, "sh",
    ]  # fmt: skip


STARTUP_REFUSALS = [
    "relative root",
    "the default root given",
    "metrics address in use",
    "state dir under a file",
    "ledger password file a FIFO",
    "plain http to a remote platform",
    "inotify forced over the watch limit",
]


@pytest.mark.parametrize("case", STARTUP_REFUSALS)
def test_check_fails_every_start_up_refusal_of_run_in_runs_own_words(
    platform: LocalPlatform, tmp_path: Path, tree: Path, port_in_use: int, case: str
) -> None:
    settings, prefix = _refusal(case, tmp_path, tree, port_in_use)
    environ = daemon_environ(platform, tmp_path, [tree], **settings)

    checked = run_evalpush(environ, "check", prefix=prefix)
    ran = run_evalpush(environ, "run", prefix=prefix)

    refusals = [line for line in ran.stderr.splitlines() if line.startswith("evalpush: ")]
    assert ran.returncode != 0 and refusals, ran.stdout + ran.stderr
    words = refusals[-1].removeprefix("evalpush: ")
    failed = [detail for result, detail in check_rows(checked.stdout).values() if result == "FAIL"]
    assert any(words in detail for detail in failed), (words, checked.stdout)
    assert checked.returncode == ran.returncode, checked.stdout + checked.stderr


def test_check_warns_of_a_key_file_other_users_may_read_in_its_credentials_row(
    platform: LocalPlatform, tmp_path: Path, tree: Path
) -> None:
    key = tmp_path / "key"
    key.write_text(platform.api_key or "any-key")
    key.chmod(0o644)
    environ = daemon_environ(
        platform, tmp_path, [tree], PRIME_API_KEY=None, EVALPUSH_PLATFORM__API_KEY_FILE=str(key)
    )
    checked = run_evalpush(environ, "check")
    result, detail = check_rows(checked.stdout)["credentials"]
    assert result == "WARN", checked.stdout
    assert f"{key} is readable by other users (mode 0644): chmod 600 it" in detail
    assert checked.returncode == 0, checked.stdout + checked.stderr


# -- migrate --to while the daemon runs; a refused login --------------------------------------


def test_migrate_to_a_shared_ledger_refuses_while_this_hosts_daemon_runs(
    platform: LocalPlatform, tmp_path: Path, tree: Path, pg_url: str
) -> None:
    password_file = tmp_path / "pw"
    password_file.write_text(PG_PASSWORD)
    environ = daemon_environ(
        platform, tmp_path, [tree], EVALPUSH_LEDGER__PASSWORD_FILE=str(password_file)
    )
    with Daemon(environ) as daemon:
        daemon.started()
        wait_until(
            lambda: (
                f"daemon:     pid {daemon.pid}"
                in run_evalpush(environ, "status", "--daemon").stdout
            ),
            "status to see the daemon running",
        )
        moved = run_evalpush(environ, "migrate", "--to", pg_url)
        assert daemon.stop() == 0
    assert moved.returncode != 0, moved.stdout + moved.stderr
    assert f"the daemon (pid {daemon.pid}) runs on this state dir" in moved.stderr
    assert "stop it first" in moved.stderr
    assert "moved" not in moved.stdout
    # Stopped, the same move goes through.
    again = run_evalpush(environ, "migrate", "--to", pg_url)
    assert again.returncode == 0, again.stdout + again.stderr


@pytest.mark.parametrize("command", ["migrate", "check", "run"])
def test_a_shared_ledger_login_refused_for_want_of_a_password_is_said_so_with_how_to_give_one(
    platform: LocalPlatform, tmp_path: Path, tree: Path, pg_url: str, command: str
) -> None:
    environ = daemon_environ(platform, tmp_path, [tree], PGPASSWORD=None, PGPASSFILE=None)
    (tmp_path / "state").mkdir()
    if command == "migrate":
        Ledger(default_path(tmp_path / "state")).close()
        result = run_evalpush(environ, "migrate", "--to", pg_url)
    else:
        result = run_evalpush({**environ, "EVALPUSH_LEDGER__URL": pg_url}, command)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "the database refused the login" in output, output
    assert "cannot be reached" not in output, output
    assert "password_file" in output and "ledger-password" in output and "PGPASSWORD" in output


# -- a fleet daemon that stopped beating ------------------------------------------------------


def _fleet_line(status_text: str, pid: int) -> str:
    return next(line for line in status_text.splitlines() if f" pid {pid} (" in line)


def test_a_killed_fleet_daemon_is_shown_not_heard_from_at_the_next_status(
    platform: LocalPlatform, tmp_path: Path, tree: Path, pg_url: str
) -> None:
    password_file = tmp_path / "pw"
    password_file.write_text(PG_PASSWORD)
    environ = daemon_environ(
        platform,
        tmp_path,
        [tree],
        EVALPUSH_LEDGER__URL=pg_url,
        EVALPUSH_LEDGER__PASSWORD_FILE=str(password_file),
    )
    with Daemon(environ) as daemon:
        daemon.started()
        wait_until(
            lambda: "1 running" in run_evalpush(environ, "status").stdout, "its heartbeat row"
        )
        daemon.kill()
    shown = run_evalpush(environ, "status")
    document = json.loads(run_evalpush(environ, "status", "--daemon", "--json").stdout)

    assert "daemons:    0 running, 1 not" in shown.stdout, shown.stdout
    assert "not heard from since" in _fleet_line(shown.stdout, daemon.pid)
    (row,) = [d for d in document["daemons"] if d["pid"] == daemon.pid]
    assert (row["running"], row["state"]) == (False, "silent")


def test_a_daemon_of_another_host_three_heartbeats_late_is_shown_not_heard_from(
    platform: LocalPlatform, tmp_path: Path, pg_url: str
) -> None:
    late = time.time() - 3 * HEARTBEAT_SECONDS - 1
    with Ledger.shared(pg_url, password=PG_PASSWORD, clock=lambda: late) as ledger:
        ledger.daemon_seen(
            "elsewhere/boot/pidns/4242/99",
            host="elsewhere",
            pid=4242,
            version="0.4.0",
            observer="polling",
            started_at=late - 60,
            lease_seconds=120,
        )
    password_file = tmp_path / "pw"
    password_file.write_text(PG_PASSWORD)
    environ = cli_environ(
        platform,
        tmp_path,
        EVALPUSH_LEDGER__URL=pg_url,
        EVALPUSH_LEDGER__PASSWORD_FILE=str(password_file),
    )
    shown = run_evalpush(environ, "status")
    document = json.loads(run_evalpush(environ, "status", "--daemon", "--json").stdout)

    assert "not heard from since" in _fleet_line(shown.stdout, 4242), shown.stdout
    assert [(d["running"], d["state"]) for d in document["daemons"]] == [(False, "silent")]


def test_status_says_which_fleet_daemon_holds_a_run_and_no_run_is_held_by_one_shown_gone(
    platform: LocalPlatform, tmp_path: Path, tree: Path, pg_url: str
) -> None:
    password_file = tmp_path / "pw"
    password_file.write_text(PG_PASSWORD)
    environ = daemon_environ(
        platform,
        tmp_path,
        [tree],
        EVALPUSH_LEDGER__URL=pg_url,
        EVALPUSH_LEDGER__PASSWORD_FILE=str(password_file),
        EVALPUSH_UPLOAD__MAX_BATCH_SAMPLES="1",
    )
    slow_run(platform, tree / "group", stalls=1000, seconds=1.0)
    with Daemon(environ) as daemon:
        daemon.started()
        upload_under_way(platform)
        held = run_evalpush(environ, "status")
        (run,) = json.loads(run_evalpush(environ, "status", "--json").stdout)
        daemon.kill()
    after = run_evalpush(environ, "status")
    (run_after,) = json.loads(run_evalpush(environ, "status", "--json").stdout)

    assert "holds 1 run" in _fleet_line(held.stdout, daemon.pid), held.stdout
    assert run["holder"]["pid"] == daemon.pid
    assert "not heard from since" in _fleet_line(after.stdout, daemon.pid), after.stdout
    assert run_after["holder"] is None, run_after
