"""systemd/evalpush.service: systemd accepts it, rates its exposure at most 2.0, and it keeps
what the daemon relies on (notify socket, network, state directory, the credential's name)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from evalpush.client import SYSTEMD_CREDENTIAL_NAME

ROOT = Path(__file__).resolve().parents[1]
UNIT = ROOT / "systemd" / "evalpush.service"
MAX_EXPOSURE = 2.0
ANALYZE_TIMEOUT_SECONDS = 120
EXPOSURE = re.compile(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)")

needs_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None,
    reason="systemd-analyze is not installed (Debian: apt-get install systemd; .ci/run does)",
)


def directives(text: str) -> dict[str, list[str]]:
    """`Section.Key` -> every value given to it, in order (a key may repeat)."""
    found: dict[str, list[str]] = {}
    section = ""
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, _, value = line.partition("=")
        found.setdefault(f"{section}.{key.strip()}", []).append(value.strip())
    return found


def analyze(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["systemd-analyze", *args],
        capture_output=True,
        text=True,
        timeout=ANALYZE_TIMEOUT_SECONDS,
    )


@needs_analyze
def test_systemd_analyze_verify_accepts_the_unit(tmp_path):
    # verify checks that ExecStart's program exists: point a copy at this venv's evalpush.
    evalpush = Path(sys.executable).parent / "evalpush"
    assert evalpush.exists(), f"{evalpush} missing: install the package (pip install -e .)"
    unit = UNIT.read_text()
    copy = tmp_path / UNIT.name
    copy.write_text(unit.replace("ExecStart=/opt/evalpush/bin/evalpush", f"ExecStart={evalpush}"))
    assert copy.read_text() != unit

    result = analyze("verify", str(copy))

    assert (result.returncode, result.stderr, result.stdout) == (0, "", "")


@needs_analyze
def test_systemd_analyze_security_rates_the_exposure_at_most_2_0():
    result = analyze("security", "--offline=true", str(UNIT))

    match = EXPOSURE.search(result.stdout)
    assert match, f"no exposure level in:\n{result.stdout}\n{result.stderr}"
    assert float(match.group(1)) <= MAX_EXPOSURE, result.stdout


def test_the_unit_yields_to_the_eval_and_points_at_the_projects_own_pages():
    unit = directives(UNIT.read_text())
    service = {key.removeprefix("Service."): values for key, values in unit.items()}

    assert int(service["Nice"][0]) > 0
    assert int(service["CPUWeight"][0]) < 100 and int(service["IOWeight"][0]) < 100
    high, most = (int(service[k][0].removesuffix("M")) for k in ("MemoryHigh", "MemoryMax"))
    measured_mib, theoretical_mib = 93, 240  # bench/daemon_memory.py; 4 runs x 2 x 25 MiB + 40
    assert theoretical_mib < high < most and high >= 3 * measured_mib
    pages = unit["Unit.Documentation"][0].split()
    assert pages and all(page.startswith("file:/usr/share/doc/evalpush/") for page in pages)
    install = (ROOT / "systemd" / "README.md").read_text()
    assert "/usr/share/doc/evalpush/README.md" in install, "the install step puts them there"
    assert (
        "cuts off the request in flight" in UNIT.read_text()
        or "cut off the request" in UNIT.read_text()
    )
    assert "let the request in flight finish" not in UNIT.read_text()


def test_under_memory_pressure_the_kernel_kills_the_uploader_before_the_eval():
    unit = directives(UNIT.read_text())

    # An eval's processes keep the default 0: a positive score makes the uploader the
    # OOM killer's first choice (it restarts and resumes from the ledger).
    (adjust,) = unit["Service.OOMScoreAdjust"]
    assert 0 < int(adjust) <= 1000


def test_the_pages_run_commands_as_the_units_dynamic_user_not_a_user_that_does_not_exist():
    unit = directives(UNIT.read_text())
    assert unit["Service.DynamicUser"] == ["yes"]  # no permanent `evalpush` user to sudo to
    for page in (ROOT / "docs" / "FLEET.md", ROOT / "systemd" / "README.md"):
        text = page.read_text()
        assert "sudo -u evalpush evalpush" not in text, page
        for command in re.findall(r"systemd-run [^`]*?/opt/evalpush/bin/evalpush", text, re.S):
            assert "-p DynamicUser=yes" in command and "-p StateDirectory=evalpush" in command


def test_the_unit_keeps_what_the_daemon_relies_on():
    unit = directives(UNIT.read_text())
    service = {key.removeprefix("Service."): values for key, values in unit.items()}

    assert service["Type"] == ["notify"]
    [exec_start] = service["ExecStart"]
    assert exec_start.split() == [
        "/opt/evalpush/bin/evalpush",
        "--config",
        "/etc/evalpush/config.toml",
        "run",
    ]
    assert service["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert service["Restart"] == ["on-failure"]
    assert service["StateDirectory"] == ["evalpush"]
    assert service["DynamicUser"] == ["yes"]
    assert service["LoadCredential"] == [f"{SYSTEMD_CREDENTIAL_NAME}:/etc/evalpush/prime-api-key"]
    assert service["WatchdogSec"] and service["TimeoutStopSec"]
    # the notify socket and the platform stay reachable, whatever else is taken away
    assert set(service["RestrictAddressFamilies"][0].split()) == {"AF_UNIX", "AF_INET", "AF_INET6"}
    assert "PrivateNetwork" not in service and "IPAddressDeny" not in service
    assert service["ProtectSystem"] == ["strict"]
