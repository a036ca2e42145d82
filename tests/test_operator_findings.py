"""What an operator (and an attacker) found running evalpush, each now the behaviour it should be.

- a ledger URL holding a password: refused without ever quoting the password, however the URL
  spells it (userinfo, a `password` query parameter, its key percent-encoded);
- secret files (the API key file, the ledger's password file, systemd's credentials): a FIFO or
  a device there is an error naming the file, never a read that blocks or never ends;
- `check` is the daemon's start-up, dry: every refusal `run` makes at start is a FAIL row of
  `check`, in `run`'s words;
- `migrate --to` refuses while this host's daemon runs; a refused login is said as such;
- a fleet daemon whose heartbeat stopped is shown as not heard from, at once.

Real parts: `evalpush` as a subprocess, real files, FIFOs and devices, real signals, the local
platform over loopback, real PostgreSQL where a shared ledger is needed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from evalpush.local_platform import LocalPlatform
from support.commands import COMMAND_SECONDS
from support.environ import cli_environ

LEDGER_PASSWORD = "fleet-secret-123"
SHORT_PASSWORD = "abc"  # under the scrubber's length: only the refusal's masking hides it


def run_evalpush(environ: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m evalpush ARGS` as a process, to its end (a hang fails the test)."""
    return subprocess.run(
        [sys.executable, "-m", "evalpush", *args],
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
