"""A local platform filled the way an operator fills one: `evalpush push` of the demo's runs."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from evalpush.cli.demo import write_sample_runs
from evalpush.local_platform import LocalPlatform
from support.environ import cli_environ

PUSH_SECONDS = 120


@dataclass
class Pushed:
    """What `evalpush push` of the runs under `outputs` printed: each run's viewer URL."""

    platform: LocalPlatform
    outputs: Path
    urls: dict[str, str]  # the part of a run's parent directory after `--` -> its viewer URL

    def evaluation_id(self, kind: str) -> str:
        return self.urls[kind].rsplit("/", 1)[1]


def push_demo_runs(platform: LocalPlatform, scratch: Path) -> Pushed:
    """Write the demo's runs under `scratch/outputs` and push every run there (a test may have
    put more) to `platform` with `python -m evalpush push`, as an operator would."""
    outputs = scratch / "outputs"
    write_sample_runs(outputs)
    done = subprocess.run(
        [sys.executable, "-m", "evalpush", "push", str(outputs)],
        env=cli_environ(platform, scratch),
        capture_output=True,
        text=True,
        timeout=PUSH_SECONDS,
    )
    assert done.returncode == 1, done.stderr  # the demo's run with a bad line sets one aside
    urls = {
        Path(match[1]).parent.name.split("--", 1)[1]: match[2]
        for match in re.finditer(r"^finalized\s+(\S+): .* -> (\S+)$", done.stdout, re.M)
    }
    return Pushed(platform, outputs, urls)
