"""Start-up: time from `evalpush push` process start to its first request on the wire.

Target: `evalpush push` sends its first request within 400 ms of start on a warm cache.

Each repeat starts `python -m evalpush push RUN_DIR` (a 4-trace run, fresh HOME, fresh state dir)
with its platform URL pointing at a loopback listener in this process, configured three ways:
- "no config": no config file and no `EVALPUSH_*` setting (the state dir is the default under
  HOME), the usual `push` from a shell: nothing to validate, so no pydantic is imported;
- "EVALPUSH_STATE_DIR": the state dir from the environment, taken as it is (no pydantic either);
- "a setting variable": `EVALPUSH_UPLOAD__MAX_BATCH_SAMPLES` at its default: validated by
  pydantic (the models generated from the settings' dataclasses);
- "a config file": `EVALPUSH_CONFIG` naming the repo's config.example.toml (every key, at its
  default), validated the same way.
The clock starts just before the child is spawned and stops when the listener has read the head of the child's first
request (the one-shot gate's probe, `GET .../evaluations/?limit=1`); the child is then killed (nothing more is needed
of it). "Warm cache": the daemon's modules are byte-compiled first (`compileall`; this machine
sets PYTHONDONTWRITEBYTECODE, which would otherwise recompile every module on every start) and
one untimed start runs before the measured ones, so the page cache holds every file.

Also printed, for scale: a bare `python -c pass`, and the whole push of the same run against a
real `evalpush local-platform` (start to exit, fresh state dir each time). `--importtime` adds
the push's heaviest imports (`python -X importtime`, cumulative, first start-up only).

`--at REV` measures the daemon as committed at REV as well, in the same rounds (as
bench/push.py's `--at`), for a before/after side by side.

    python bench/startup.py [--repeat 15] [--importtime] [--at REV]
"""

from __future__ import annotations

import argparse
import compileall
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from enum import StrEnum
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))

from gen_traces import generate  # noqa: E402
from push import PLATFORM_KEY, Platform, checkout  # noqa: E402

TARGET_MS = 400.0
RUN_BYTES = 15_000  # the smallest run gen_traces writes: 4 traces
HEAD_END = b"\r\n\r\n"
FIRST_REQUESTS = (b"GET /api/v1/evaluations/?limit=1 ", b"POST /api/v1/environmentshub/resolve ")
"""The one-shot gate's probe (the key is checked before anything is sent), or,
without it, the first run's resolve."""
CHILD_TIMEOUT_SECONDS = 30.0
IMPORTS_SHOWN = 15


class FirstRequest:
    """A loopback listener that notes when the head of its first request has arrived."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self.arrived = threading.Event()
        self.at = 0.0
        self.request_line = b""
        self._thread = threading.Thread(target=self._serve, name="first-request", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        connection, _ = self._server.accept()
        with connection:
            head = b""
            while HEAD_END not in head:
                chunk = connection.recv(65536)
                if not chunk:
                    break
                head += chunk
            self.at = time.perf_counter()
            self.request_line = head.split(b"\r\n", 1)[0]
            self.arrived.set()

    def close(self) -> None:
        self._server.close()


class Case(StrEnum):
    """How the push is configured (see the module docstring)."""

    NO_CONFIG = "no config"
    STATE_DIR = "EVALPUSH_STATE_DIR"
    SETTING = "a setting variable"
    FILE = "a config file"


SETTING_VARIABLE = ("EVALPUSH_UPLOAD__MAX_BATCH_SAMPLES", "1000")  # the default: nothing changes


def child_env(
    base_url: str, work: Path, *, case: Case = Case.STATE_DIR, daemon: str | None = None
) -> dict[str, str]:
    """The push's environment, configured as `case` says (the state dir is under `work`
    except with no config); `daemon`: a checkout of the daemon to run instead of the working
    tree."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EVALPUSH_", "PRIME_"))}
    if daemon:
        env["PYTHONPATH"] = daemon
    for name in ("XDG_STATE_HOME", "STATE_DIRECTORY"):
        env.pop(name, None)
    env.update(PRIME_API_KEY=PLATFORM_KEY, PRIME_API_BASE_URL=base_url, HOME=str(work / "home"))
    if case != Case.NO_CONFIG:
        env["EVALPUSH_STATE_DIR"] = str(work / "state")
    if case == Case.SETTING:
        name, value = SETTING_VARIABLE
        env[name] = value
    if case == Case.FILE:
        env["EVALPUSH_CONFIG"] = str(REPO / "config.example.toml")
    return env


def first_request_seconds(
    run_dir: Path, *, case: Case, daemon: str | None = None, python_flags: tuple[str, ...] = ()
) -> float:
    """Spawn a push, wait for its first request, kill it; seconds from spawn to request."""
    listener = FirstRequest()
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        base_url = f"http://127.0.0.1:{listener.port}"
        env = child_env(base_url, Path(tmp), case=case, daemon=daemon)
        stderr = open(Path(tmp) / "stderr", "w+b")  # noqa: SIM115 - closed below
        started = time.perf_counter()
        child = subprocess.Popen(
            [sys.executable, *python_flags, "-m", "evalpush", "push", str(run_dir)],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env=env,
            cwd=REPO,
        )
        try:
            if not listener.arrived.wait(CHILD_TIMEOUT_SECONDS):
                stderr.seek(0)
                raise SystemExit(f"no request within {CHILD_TIMEOUT_SECONDS} s:\n{stderr.read()}")
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
            listener.close()
        if not listener.request_line.startswith(FIRST_REQUESTS):
            raise SystemExit(f"unexpected first request: {listener.request_line!r}")
        if python_flags:
            stderr.seek(0)
            report_imports(stderr.read().decode(errors="replace"))
        stderr.close()
    return listener.at - started


def bare_python_seconds() -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.perf_counter() - started


def whole_push_seconds(run_dir: Path) -> float:
    """`evalpush push` of the run against a fresh local platform, start to exit."""
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        work = Path(tmp)
        platform = Platform(work)
        try:
            started = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "evalpush", "push", str(run_dir)],
                check=True,
                stdout=subprocess.DEVNULL,
                env=child_env(platform.base, work),
                cwd=REPO,
                timeout=CHILD_TIMEOUT_SECONDS,
            )
            return time.perf_counter() - started
        finally:
            platform.stop()


def report_imports(importtime: str) -> None:
    """The heaviest imports of one start-up, by cumulative time (top level ones marked)."""
    rows = []
    for line in importtime.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        head, cumulative_us, name = line.split("|", 2)
        depth = (len(name) - len(name.lstrip()) - 1) // 2
        rows.append((int(cumulative_us), int(head.split(":")[1]), depth, name.strip()))
    print(f"heaviest imports (cumulative ms, self ms, depth), top {IMPORTS_SHOWN}:")
    for cumulative_us, self_us, depth, name in sorted(rows, reverse=True)[:IMPORTS_SHOWN]:
        print(f"  {cumulative_us / 1000:7.1f} {self_us / 1000:7.1f}  {depth}  {name}")


def summary(name: str, seconds: list[float]) -> str:
    ms = sorted(s * 1000 for s in seconds)
    return (
        f"{name:<48} best {ms[0]:6.1f} ms  median {statistics.median(ms):6.1f} ms  "
        f"worst {ms[-1]:6.1f} ms  (n={len(ms)})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15, help="starts per figure (best shown)")
    parser.add_argument("--importtime", action="store_true", help="show the heaviest imports")
    parser.add_argument("--at", metavar="REV", help="also measure the daemon as committed at REV")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-startup-src-") as src:
        daemon = checkout(args.at, Path(src)) if args.at else None
        for tree in filter(None, [str(REPO / "daemon"), daemon]):
            compileall.compile_dir(tree, quiet=1)
        measure_all(args, daemon)


def measure_all(args: argparse.Namespace, daemon: str | None) -> None:
    run_dir = generate(BENCH / ".cache" / "startup", RUN_BYTES, reuse=True)
    trees = {"ours": None, f"at {args.at}": daemon} if daemon else {"ours": None}
    for tree in trees.values():  # warm-up: page cache, bytecode
        for case in Case:
            first_request_seconds(run_dir, case=case, daemon=tree)
    if args.importtime:
        first_request_seconds(run_dir, case=Case.NO_CONFIG, python_flags=("-X", "importtime"))

    rows: dict[str, list[float]] = {"python -c pass": []}
    for _ in range(args.repeat):  # interleaved, so a load swing hits every figure alike
        rows["python -c pass"].append(bare_python_seconds())
        for name, tree in trees.items():
            for case in Case:
                label = f"{name}: first request, {case}"
                seconds = first_request_seconds(run_dir, case=case, daemon=tree)
                rows.setdefault(label, []).append(seconds)
    rows["ours: whole push to exit (4 samples)"] = [
        whole_push_seconds(run_dir) for _ in range(max(3, args.repeat // 3))
    ]
    print(f"run: {run_dir} (4 traces); {args.repeat} rounds")
    for label, seconds in rows.items():
        print(summary(label, seconds))
    for label, seconds in rows.items():
        if label.startswith("ours: first request"):
            best = min(seconds) * 1000
            print(
                f"{label}: {best:.0f} ms (best); target <= {TARGET_MS:.0f} ms: "
                f"{'meets' if best <= TARGET_MS else 'MISSES'}"
            )


if __name__ == "__main__":
    main()
