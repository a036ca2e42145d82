"""`evalpush demo`, the README's first command: the daemon at work on its own local platform,
with runs written while it watches, and no account."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

DEMO_SECONDS = 120
REAL_LOOKING_KEY = "a-real-looking-key-0123456789"


def run_demo(tmp_path: Path, directory: Path) -> subprocess.CompletedProcess[str]:
    # A real key and base URL in the environment must not lead the demo to the real platform.
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("EVALPUSH_")},
        "PRIME_API_KEY": REAL_LOOKING_KEY,
        "PRIME_API_BASE_URL": "https://api.example.invalid",
        "HOME": str(tmp_path),
    }
    return subprocess.run(
        [sys.executable, "-m", "evalpush", "demo", "--dir", str(directory)],
        env=env,
        capture_output=True,
        text=True,
        timeout=DEMO_SECONDS,
    )


def final_table(stdout: str) -> dict[str, list[str]]:
    """The status table the demo ends with: each run's kind (its parent directory) -> its row."""
    lines = stdout.splitlines()
    header = max(i for i, line in enumerate(lines) if line.startswith("RUN "))
    rows: dict[str, list[str]] = {}
    for line in lines[header + 1 :]:
        kind = line.split("/reverse-text--")[1].split("/")[0]
        assert kind not in rows, f"two ledger rows for the {kind} run:\n{stdout}"
        rows[kind] = line.split()
    return rows


def test_the_daemon_demo_settles_every_kind_of_run_on_its_own_local_platform(
    tmp_path: Path,
) -> None:
    done = run_demo(tmp_path, tmp_path / "demo")

    assert done.returncode == 0, done.stderr
    rows = final_table(done.stdout)
    assert {kind: row[1] for kind, row in rows.items()} == {
        "finished-before-start": "finalized",
        "by-expected-count": "finalized",
        "by-marker": "finalized",
        "by-settle-time": "finalized",
        "with-a-bad-line": "finalized",
        "debug": "skipped",
        "verifiers-0.2": "finalized",
        "verifiers-0.3": "finalized",
        "verifiers-0.4": "finalized",
    }
    for producer in ("verifiers-0.2", "verifiers-0.3", "verifiers-0.4"):
        assert rows[producer][2] == "8/8", rows[producer]
    assert rows["finished-before-start"][2] == "40/40"
    # 11 sent of the 12 its config expects: the bad line is set aside (not missing: not partial)
    assert rows["with-a-bad-line"][2:4] == ["11/12", "1"], "the bad line is set aside"
    assert all("http://127.0.0.1:" in " ".join(rows[kind]) for kind in rows if kind != "debug")
    assert "debug run" in " ".join(rows["debug"])
    assert REAL_LOOKING_KEY not in done.stdout + done.stderr


def test_the_demo_runs_again_in_the_same_directory(tmp_path: Path) -> None:
    first = run_demo(tmp_path, tmp_path / "demo")
    again = run_demo(tmp_path, tmp_path / "demo")

    assert (first.returncode, again.returncode) == (0, 0), again.stderr
    assert len(final_table(again.stdout)) == 9


def test_the_demo_refuses_a_directory_it_did_not_make(tmp_path: Path) -> None:
    occupied = tmp_path / "mine"
    occupied.mkdir()
    (occupied / "notes.txt").write_text("keep me")

    done = run_demo(tmp_path, occupied)

    assert done.returncode == 2
    assert "not empty" in done.stderr
    assert (occupied / "notes.txt").read_text() == "keep me"
