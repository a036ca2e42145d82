"""`evalpush push` against a hostile platform: seconds from SIGTERM to exit, and peak memory.

Each scenario starts a fresh local platform (in this process) with one fault queued, runs
`python -m evalpush push` on a small generated run as a child process, waits until the fault's
request has arrived and another half second, sends SIGTERM and times the exit. Repeated
`--repeat` times; prints min / median / max. Then peak RSS (the child's VmHWM, read from /proc
just before SIGTERM) while every answer the push gets is an endless body, next to a plain push's.

    .venv/bin/python bench/hostile.py [--repeat 5] [--endless-seconds 5]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from evalpush.local_platform import LocalPlatform

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from test_cli_push import trace_line, write_run  # noqa: E402 - the tests' run writer

TRACES = 60
WAIT_SECONDS = 30.0

# (name, faults to queue, request kind whose arrival means the push is held)
SCENARIOS: list[tuple[str, list[dict], str]] = [
    ("trickle on samples (1 byte/s)", [dict(fault="trickle", on="samples", seconds=1)], "samples"),
    ("stall on create (never answers)", [dict(fault="stall", on="create", seconds=600)], "create"),
    ("stall on samples", [dict(fault="stall", on="samples", seconds=600)], "samples"),
    ("unread samples body", [dict(fault="unread", on="samples", seconds=600)], "samples"),
    (
        "repeat_page while reconciling",
        [dict(fault="reset", on="samples"), dict(fault="repeat_page", on="read", count=10**6)],
        "read",
    ),
    (
        "endless_pages while reconciling",
        [dict(fault="reset", on="samples"), dict(fault="endless_pages", on="read", count=10**6)],
        "read",
    ),
]


def environ(platform: LocalPlatform, scratch: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PRIME_", "EVALPUSH_"))}
    (scratch / "home").mkdir(exist_ok=True)
    env.update(
        PRIME_API_KEY=platform.api_key,
        PRIME_API_BASE_URL=platform.base_url,
        HOME=str(scratch / "home"),
        EVALPUSH_STATE_DIR=str(scratch / "state"),
        EVALPUSH_UPLOAD__MAX_BATCH_SAMPLES="5",
        EVALPUSH_LOG__LEVEL="error",
    )
    return env


def wait_for(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit("the push never reached the fault")
        time.sleep(0.01)


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise SystemExit("no VmHWM")


def one_push(
    faults: list[dict], held_on: str, settle: float
) -> tuple[float, float, subprocess.Popen[bytes]]:
    """Seconds from SIGTERM to exit, and peak RSS (MiB) just before the SIGTERM."""
    with tempfile.TemporaryDirectory() as tmp, LocalPlatform() as platform:
        scratch = Path(tmp)
        root = scratch / "outputs"
        write_run(root, lines=[trace_line(i, i // 2) for i in range(TRACES)])
        for fault in faults:
            platform.inject(**fault)
        before = platform.summary()["requests"][held_on]
        process = subprocess.Popen(
            [sys.executable, "-m", "evalpush", "push", str(root)],
            env=environ(platform, scratch),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_for(lambda: platform.summary()["requests"][held_on] > before)
            time.sleep(settle)
            rss = peak_rss_mib(process.pid)
            sent = time.monotonic()
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)
            return time.monotonic() - sent, rss, process
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()


def plain_push_rss() -> float:
    with tempfile.TemporaryDirectory() as tmp, LocalPlatform() as platform:
        scratch = Path(tmp)
        root = scratch / "outputs"
        write_run(root, lines=[trace_line(i, i // 2) for i in range(TRACES)])
        hook = scratch / "hook"
        hook.mkdir()
        (hook / "sitecustomize.py").write_text(
            "import atexit, sys\n"
            "def _peak():\n"
            "    for line in open('/proc/self/status'):\n"
            "        if line.startswith('VmHWM:'):\n"
            "            sys.stderr.write('VMHWM ' + line.split()[1] + '\\n')\n"
            "atexit.register(_peak)\n"
        )
        env = environ(platform, scratch)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(hook), env.get("PYTHONPATH")]))
        done = subprocess.run(
            [sys.executable, "-m", "evalpush", "push", str(root)],
            env=env,
            capture_output=True,
            timeout=120,
        )
        line = next(x for x in done.stderr.decode().splitlines() if x.startswith("VMHWM "))
        return int(line.split()[1]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--endless-seconds", type=float, default=5.0)
    args = parser.parse_args()
    print(f"SIGTERM to exit, seconds, {args.repeat} runs each (min / median / max):")
    for name, faults, held_on in SCENARIOS:
        times = []
        for _ in range(args.repeat):
            took, _, process = one_push(faults, held_on, 0.5)
            if process.returncode != 1:
                raise SystemExit(f"{name}: exit {process.returncode}, expected 1 (interrupted)")
            times.append(took)
        print(
            f"  {name:34s} {min(times):5.2f} / {statistics.median(times):5.2f} / {max(times):5.2f}"
        )
    endless = [dict(fault="endless", on="create", do_work=True)] + [
        dict(fault="endless", on="read", do_work=True, count=10**6)
    ]
    took, rss, _ = one_push(endless, "read", args.endless_seconds)
    print(
        f"endless bodies on create and every listing for {args.endless_seconds:.0f} s: "
        f"peak RSS {rss:.0f} MiB, SIGTERM to exit {took:.2f} s"
    )
    print(f"a plain push of the same run: peak RSS {plain_push_rss():.0f} MiB")


if __name__ == "__main__":
    main()
