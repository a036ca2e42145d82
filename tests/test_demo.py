"""`evalpush demo`, the README's first command, runs end to end with no account."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_the_demo_uploads_its_sample_runs_to_its_own_local_platform(tmp_path: Path) -> None:
    # A real key and base URL in the environment must not lead the demo to the real platform.
    env = {
        **os.environ,
        "PRIME_API_KEY": "a-real-looking-key-0123456789",
        "PRIME_API_BASE_URL": "https://api.example.invalid",
        "HOME": str(tmp_path),
    }

    done = subprocess.run(
        [sys.executable, "-m", "evalpush", "demo", "--dir", str(tmp_path / "demo")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    pushed = [line for line in lines if line.startswith(("finalized", "skipped"))]
    assert [line.split()[0] for line in pushed] == [
        "finalized",
        "finalized",
        "finalized",
        "skipped",
        "skipped",
    ]
    assert "1 set aside" in pushed[1]
    assert "debug run" in pushed[3] and "replay run" in pushed[4]
    assert "http://127.0.0.1:" in pushed[0]
    assert "a-real-looking-key-0123456789" not in done.stdout + done.stderr
