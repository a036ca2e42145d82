"""No secret in any output: every command, through its error paths, with secrets given in every
place they can be, and each secret searched for in what it printed, logged and stored.

The places: `PRIME_API_KEY`, `platform.api_key_file`, `~/.prime/config.json`, systemd's
`$CREDENTIALS_DIRECTORY/prime-api-key`; the ledger URL's userinfo and query, `ledger.password_file`
and the `ledger-password` credential. The error paths: a ledger URL holding a password, a
platform that cannot be reached, a platform refusing the key, a database that cannot be reached,
a database refusing the login. The commands: check, status, status --json, push, run (until it
refuses, or briefly), migrate, retry, forget, convert; each case starts them all at once (real
processes), so a case takes a few seconds.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from evalpush.local_platform import LocalPlatform
from support.commands import COMMAND_SECONDS
from support.environ import cli_environ
from support.runs import RUN_ID, traces, write_run

SECRETS = {
    "PRIME_API_KEY": "sk-env-Q7w8E9r0T1y2U3i4",
    "api_key_file": "sk-file-A1s2D3f4G5h6J7k8",
    "prime config.json": "sk-prime-Z9x8C7v6B5n4M3m2",
    "credential prime-api-key": "sk-cred-P0o9I8u7Y6t5R4e3",
    "ledger url userinfo": "pg-userinfo-L1k2J3h4G5f6",
    "ledger url query": "pg-query-W2e3R4t5Y6u7I8",
    "ledger password_file": "pg-file-N1b2V3c4X5z6A7",
    "ledger-password credential": "pg-cred-M9n8B7v6C5x4Z3",
}
PART = 10
"""Any run of this many characters of a secret counts as the secret (the scrubber blanks 8)."""
UNREACHABLE = "postgresql://evalpush@127.0.0.1:9/evalpush"  # nothing listens on port 9
CASES = {
    # every key place given at once (PRIME_API_KEY wins); the URL's password refused
    "ledger url with userinfo password, every key place": (
        ["PRIME_API_KEY", "api_key_file", "prime config.json", "credential prime-api-key"],
        f"postgresql://evalpush:{SECRETS['ledger url userinfo']}@127.0.0.1:9/evalpush",
        [],
    ),
    "ledger url with a query password, key in config.json": (
        ["prime config.json"],
        f"postgresql://evalpush@127.0.0.1:9/evalpush?%70assword={SECRETS['ledger url query']}",
        [],
    ),
    "key file refused by the platform, database unreachable with password_file": (
        ["api_key_file"],
        UNREACHABLE,
        ["ledger password_file"],
    ),
    "credential key, platform unreachable, database unreachable with the credential": (
        ["credential prime-api-key"],
        UNREACHABLE,
        ["ledger-password credential"],
    ),
    "key in the environment refused, database refusing the login": (
        ["PRIME_API_KEY"],
        "refusing",
        ["ledger password_file"],
    ),
    "key in config.json refused, the SQLite ledger": (["prime config.json"], "", []),
}
COMMANDS = [
    ["check"],
    ["status"],
    ["status", "--json"],
    ["push", "--no-wait", "{outputs}"],
    ["migrate", "--to", "{url}"],
    ["retry", RUN_ID],
    ["forget", "--yes", RUN_ID],
    ["convert", "{run}"],
]


def _environ(
    platform: LocalPlatform, tmp_path: Path, keys: list[str], url: str, passwords: list[str]
) -> dict[str, str]:
    home = tmp_path / "home"
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    extra: dict[str, str | None] = {"PRIME_API_KEY": None, "PGPASSWORD": None}
    if "PRIME_API_KEY" in keys:
        extra["PRIME_API_KEY"] = SECRETS["PRIME_API_KEY"]
    if "api_key_file" in keys:
        key_file = tmp_path / "key"
        key_file.write_text(SECRETS["api_key_file"])
        key_file.chmod(0o600)
        extra["EVALPUSH_PLATFORM__API_KEY_FILE"] = str(key_file)
    if "credential prime-api-key" in keys:
        (credentials / "prime-api-key").write_text(SECRETS["credential prime-api-key"])
    if "ledger-password credential" in passwords:
        (credentials / "ledger-password").write_text(SECRETS["ledger-password credential"])
    if "ledger password_file" in passwords:
        password_file = tmp_path / "ledger-password"
        password_file.write_text(SECRETS["ledger password_file"])
        extra["EVALPUSH_LEDGER__PASSWORD_FILE"] = str(password_file)
    extra["CREDENTIALS_DIRECTORY"] = str(credentials)
    if url:
        extra["EVALPUSH_LEDGER__URL"] = url
    environ = cli_environ(platform, tmp_path, **extra)
    if "prime config.json" in keys:
        (home / ".prime").mkdir(parents=True)
        (home / ".prime" / "config.json").write_text(
            json.dumps({"api_key": SECRETS["prime config.json"]})
        )
    return environ


def _start(environ: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "evalpush", *args],
        env=environ,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


@pytest.mark.parametrize("case", list(CASES))
def test_no_secret_reaches_any_output_log_or_ledger_of_any_command(
    platform: LocalPlatform, tmp_path: Path, request: pytest.FixtureRequest, case: str
) -> None:
    keys, url, passwords = CASES[case]
    if url == "refusing":
        url = request.getfixturevalue("pg_url")  # the server wants another password
    environ = _environ(platform, tmp_path, keys, url, passwords)
    if "platform unreachable" in case:
        environ["PRIME_API_BASE_URL"] = "http://127.0.0.1:9"
    outputs = tmp_path / "outputs"
    run = write_run(outputs, traces(4))
    (tmp_path / "state").mkdir()
    roots = {"EVALPUSH_WATCH__ROOTS": json.dumps([str(outputs)])}
    shown = {"outputs": str(outputs), "url": url or UNREACHABLE, "run": str(run)}

    daemon = _start({**environ, **roots}, "run")
    started = {
        " ".join(args): _start(environ, *(arg.format(**shown) for arg in args)) for args in COMMANDS
    }
    said = {name: process.communicate(timeout=COMMAND_SECONDS) for name, process in started.items()}
    if daemon.poll() is None:
        daemon.send_signal(signal.SIGTERM)
    said["run"] = daemon.communicate(timeout=COMMAND_SECONDS)

    stored = b"".join(
        path.read_bytes() for path in (tmp_path / "state").rglob("*") if path.is_file()
    )
    for name, secret in SECRETS.items():
        parts = {secret[i : i + PART].encode() for i in range(len(secret) - PART + 1)}
        for command, (out, err) in said.items():
            found = [part for part in parts if part in out + err]
            assert not found, (name, command, found, (out + err).decode())
        assert not [part for part in parts if part in stored], (name, "the state dir")
    assert any(out + err for out, err in said.values())
