"""The daemon's peak memory at the defaults, for the unit's MemoryHigh=/MemoryMax=.

Generates RUNS runs of SIZE_MIB each (bench/gen_traces.py), starts a local platform and
`evalpush run` at the default settings (4 runs at once, batches up to 25 MiB), lets it upload
all of them at once, and prints the daemon's peak RSS (VmHWM from /proc, read just before it
is stopped) and the wall time. Usage: `.venv/bin/python bench/daemon_memory.py [RUNS]
[SIZE_MIB]` (default 4 runs of 120 MiB: every upload worker holds full batches)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_traces  # noqa: E402

from evalpush.local_platform import LocalPlatform  # noqa: E402


def vm_hwm_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM")


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    size_mib = int(sys.argv[2]) if len(sys.argv) > 2 else 120
    with (
        tempfile.TemporaryDirectory(prefix="evalpush-mem-") as scratch,
        LocalPlatform() as platform,
    ):
        root = Path(scratch) / "outputs"
        for seed in range(runs):
            gen_traces.generate(root / f"set{seed}", size_mib << 20, seed=seed)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PRIME_", "EVALPUSH_"))}
        env |= {
            "PRIME_API_BASE_URL": platform.base_url,
            "PRIME_API_KEY": platform.api_key or "bench-key",
            "EVALPUSH_STATE_DIR": str(Path(scratch) / "state"),
            "EVALPUSH_WATCH__ROOTS": json.dumps([str(root)]),
            "EVALPUSH_LOG__FORMAT": "json",
            "HOME": scratch,
        }
        started = time.monotonic()
        daemon = subprocess.Popen(
            [sys.executable, "-m", "evalpush", "run"], env=env, stdout=subprocess.PIPE, text=True
        )
        finalized = 0
        assert daemon.stdout is not None
        for line in daemon.stdout:
            if '"run finalized"' in line:
                finalized += 1
                if finalized == runs:
                    break
        peak = vm_hwm_kib(daemon.pid)
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(60)
        print(
            f"{runs} runs x {size_mib} MiB at the defaults: peak RSS {peak / 1024:.0f} MiB, "
            f"{time.monotonic() - started:.0f} s"
        )


if __name__ == "__main__":
    main()
