"""Run a `Watcher` in a user namespace whose inotify limits are lowered (a real kernel refusal).

The limits in /proc/sys/user/ belong to a user namespace, and its owner may lower them for
itself without touching the host's. As a test helper:

    result = run_limited(tmp_path, kind="auto", max_watches=50)   # or max_instances=0

runs this file as `python inotify_limited.py ROOT KIND` under
`unshare --user --map-root-user`, after writing the limit, and returns what the child printed:
{"watching": {root: kind}, "watched": directories watched besides the root, "events": [log
 events], "error": "..." | None, "found": [run dirs found after start, by the rescans],
 "threads": [names left after stop()]}.
`limited_namespaces_available()` says whether this machine allows it (tests skip otherwise).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

CHILD_TIMEOUT_SECONDS = 60
HINT_WAIT_SECONDS = 10.0


def limited_namespaces_available() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        [
            "unshare",
            "--user",
            "--map-root-user",
            "sh",
            "-c",
            "echo 1 > /proc/sys/user/max_inotify_watches",
        ],
        capture_output=True,
        timeout=CHILD_TIMEOUT_SECONDS,
    )
    return probe.returncode == 0


def run_limited(
    root: Path, *, kind: str, max_watches: int | None = None, max_instances: int | None = None
) -> dict[str, Any]:
    limits = []
    if max_watches is not None:
        limits.append(f"echo {max_watches} > /proc/sys/user/max_inotify_watches")
    if max_instances is not None:
        limits.append(f"echo {max_instances} > /proc/sys/user/max_inotify_instances")
    script = " && ".join([*limits, 'exec "$0" "$1" "$2" "$3"'])
    completed = subprocess.run(
        ["unshare", "--user", "--map-root-user", "sh", "-c", script]
        + [sys.executable, __file__, str(root), kind],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_SECONDS,
        check=True,
    )
    return json.loads(completed.stdout)


def _child(root: Path, kind: str) -> dict[str, Any]:
    from structlog.testing import capture_logs

    from evalpush.core.errors import ConfigError
    from evalpush.discover import HintQueue, Scanner, Watcher

    hints = HintQueue()
    watcher = Watcher([root], hints, kind=kind, poll_seconds=0.1)
    scanner = Scanner([root])
    result: dict[str, Any] = {"error": None, "found": []}
    with capture_logs() as logs:
        try:
            watcher.start()
            directories: list[str] = []  # the daemon's first scan watches these
            scanner.scan_subtree(root, directories)
            watcher.watch(directories)
            result["watching"] = watcher.watching
            result["watched"] = len(watcher.directories)
            run = root / "late" / "run"  # created after start, deep under the root
            run.mkdir(parents=True)
            (run / "config.toml").write_text("")
            (run / "traces.jsonl").write_text("")
            deadline = time.monotonic() + HINT_WAIT_SECONDS
            while not result["found"] and time.monotonic() < deadline:
                # a polled root, or directories past the limit: the daemon's rescans find it
                result["found"].extend(scanner.scan())
                hints.get(timeout=0.1)
        except ConfigError as exc:
            result["error"] = str(exc)
        finally:
            watcher.stop()
    result["events"] = [
        {k: v for k, v in event.items() if k in ("event", "reason", "log_level")} for event in logs
    ]
    result["threads"] = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    return result


if __name__ == "__main__":
    print(json.dumps(_child(Path(sys.argv[1]), sys.argv[2]), default=str))
