"""A fleet: three `evalpush run` daemons over one output tree, sharing a ledger in a real
PostgreSQL, each in a PID namespace of its own (`unshare --pid --fork --mount-proc`): to one
another they are other hosts, whose pids mean nothing, so a claim's holder is judged gone by
its lease alone. Runs are written while they watch; daemons are SIGKILLed and started again,
and PostgreSQL is crash-restarted (`pg_ctl restart -m immediate`) mid-upload. What counts is
the platform's stored state: one COMPLETED evaluation per run, finalized once, every sample
once; and the shared ledger agreeing with it.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from daemon_support import Daemon, RunDir, completed, daemon_environ, wait_until
from evalpush.core.states import State
from evalpush.ledger import Ledger
from evalpush.local_platform import LocalPlatform
from pushing import assert_exactly_once
from support.postgres import PASSWORD, Cluster

RUNS = 12
TRACES = 30
LEASE_SECONDS = 5
SEED = 20261204
FLEET_SECONDS = 120.0
TOOK_OVER = (
    "took over the claim of a process that is gone: resuming from the ledger, reconciling "
    "with the platform"
)
OUTAGE = (
    "shared ledger unreachable: uploads pause (nothing is sent without its intent written) "
    "until it is back"
)


def _namespaces_usable() -> str | None:
    """Why a PID namespace cannot be had here (None: it can)."""
    if shutil.which("unshare") is None:
        return "no unshare (util-linux)"
    probe = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "true"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return None if probe.returncode == 0 else f"unshare --pid: {probe.stderr.strip()}"


class Host:
    """One daemon of the fleet, in its own PID namespace with its own state dir."""

    PREFIX = ("unshare", "--pid", "--fork", "--mount-proc", "--kill-child")

    def __init__(self, name: str, environ: dict[str, str]):
        self.name = name
        self.environ = environ
        self.lives: list[Daemon] = []

    def start(self) -> Daemon:
        daemon = Daemon(self.environ, prefix=self.PREFIX)
        self.lives.append(daemon)
        return daemon.started()

    def kill(self) -> None:
        """SIGKILL: unshare dies, and the daemon with it (`--kill-child`)."""
        self.lives[-1].process.send_signal(signal.SIGKILL)
        self.lives[-1].kill()

    def pid_namespace(self) -> str | None:
        """The PID namespace of its current daemon (the child unshare forked), as claims name it."""
        unshare = self.lives[-1].process.pid
        try:
            child = Path(f"/proc/{unshare}/task/{unshare}/children").read_text().split()[0]
            return os.readlink(f"/proc/{child}/ns/pid")
        except (OSError, IndexError):
            return None

    def took_over(self) -> list[str]:
        return [e["run"] for d in self.lives for e in d.find(TOOK_OVER)]

    def finalized(self) -> list[str]:
        return [e["run"] for d in self.lives for e in d.find("run finalized")]

    def text(self) -> str:
        return "\n".join(d.text() for d in self.lives)

    def close(self) -> None:
        for daemon in self.lives:
            daemon.__exit__()


@pytest.fixture
def fleet_ok() -> None:
    why = _namespaces_usable()
    if why is not None:
        pytest.skip(why)


def host_environ(
    platform: LocalPlatform, tmp_path: Path, root: Path, url: str, name: str, **extra: str
) -> dict[str, str]:
    """The environment of the fleet's host `name`: a state dir of its own, the shared ledger at
    `url` (its password in a file, as a host keeps it), `root` watched."""
    password_file = tmp_path / "ledger-password"
    password_file.write_text(PASSWORD)
    return daemon_environ(
        platform,
        tmp_path,
        [root],
        EVALPUSH_STATE_DIR=str(tmp_path / f"state-{name}"),
        EVALPUSH_LEDGER__URL=url,
        EVALPUSH_LEDGER__PASSWORD_FILE=str(password_file),
        **extra,
    )


def test_a_fleet_over_one_tree_uploads_each_run_once_through_kills_and_a_database_restart(
    fleet_ok: None, postgres: Cluster, pg_url: str, local_platform: LocalPlatform, tmp_path: Path
):
    rng = random.Random(SEED)
    root = tmp_path / "outputs"
    group = root / "gsm8k--model--harness"
    group.mkdir(parents=True)
    hosts = [
        Host(
            name,
            host_environ(
                local_platform,
                tmp_path,
                root,
                pg_url,
                name,
                EVALPUSH_LEDGER__LEASE_SECONDS=str(LEASE_SECONDS),
                EVALPUSH_UPLOAD__MAX_CONCURRENT_RUNS="2",
                EVALPUSH_WATCH__LEDGER_POLL_SECONDS="0.5",
            ),
        )
        for name in ("host-a", "host-b", "host-c")
    ]
    # Every samples request held a while: uploads are under way when the kills come.
    local_platform.inject("stall", on="samples", count=RUNS * 2, seconds=0.3)
    local_platform.inject("status", on="samples", count=4, status=503)
    try:
        for host in hosts:
            host.start()
        runs = []
        for n in range(RUNS):
            run = RunDir(group).config(num_tasks=TRACES // 2)
            run.write(run.lines(TRACES))
            runs.append(run)
            if n == RUNS // 3:
                # A host mid-upload, killed: its run waits out the lease, then one takes it over.
                victim, held = wait_until(
                    lambda: _holding(hosts, pg_url), "a daemon holding a run's claim"
                )
                victim.kill()
                victim.start()
            if n == RUNS // 2:
                postgres.restart()  # a crash of the database, uploads in flight
        rng.choice(hosts).kill()

        wait_until(
            lambda: all(completed(local_platform, r.run_id) for r in runs),
            "every run COMPLETED on the platform",
            timeout=FLEET_SECONDS,
        )
        ledger_rows = _wait_all_finalized(pg_url, len(runs))
    except BaseException:
        for host in hosts:
            print(f"===== {host.name}\n{host.text()[-6000:]}")
        raise
    finally:
        for host in hosts:
            host.close()

    assert_exactly_once(local_platform, root)
    evaluations = local_platform.summary()["evaluations"]
    for row in ledger_rows:
        assert evaluations[row.evaluation_id]["metadata"]["run_id"] == row.run_id
        assert evaluations[row.evaluation_id]["finalize_count"] == 1
    taken_over = {run for host in hosts for run in host.took_over()}
    assert held & taken_over, f"a run the killed daemon held ({held}) was taken over"
    assert any(h.find(OUTAGE) for host in hosts for h in host.lives), "the restart was an outage"
    by_host = {host.name: len(host.finalized()) for host in hosts}
    # Each run finalized by one daemon, once. (How the runs spread over the daemons is the
    # soak's figure: with a dozen runs one daemon may well claim them all.)
    assert sum(by_host.values()) == RUNS, by_host


def _holding(hosts: list[Host], url: str) -> tuple[Host, set[str]] | None:
    """A host whose daemon holds a claim now, with the runs it holds (from the shared ledger)."""
    with Ledger.shared(url, password=PASSWORD, read_only=True) as ledger:
        claimed = [r for r in ledger.all() if r.claim_owner is not None]
    for host in hosts:
        namespace = host.pid_namespace()
        held = {r.run_id for r in claimed if namespace and r.claim_pidns == namespace}
        if held:
            return host, held
    return None


def _wait_all_finalized(url: str, count: int) -> list:
    """The shared ledger's rows once every run is finalized there (the last release may follow
    the platform's COMPLETED by a moment)."""
    with Ledger.shared(url, password=PASSWORD, read_only=True) as ledger:
        return wait_until(
            lambda: (
                (rows := ledger.all())
                and len(rows) == count
                and all(r.state == State.FINALIZED for r in rows)
                and rows
            ),
            "every run finalized in the shared ledger",
        )


def test_daemons_sharing_a_ledger_share_the_slow_sweep_of_their_tree(
    pg_url: str, local_platform: LocalPlatform, tmp_path: Path
):
    """Each daemon sweeps the part of the tree its place among the running daemons gives it,
    so the fleet looks inside each directory once a period, not once a host."""
    root = tmp_path / "outputs"
    group = root / "gsm8k--model--harness"
    group.mkdir(parents=True)
    runs = []
    for _ in range(8):
        run = RunDir(group).config(num_tasks=2)
        run.write(run.lines(4))
        runs.append(run)
    daemons = [
        Daemon(
            host_environ(
                local_platform, tmp_path, root, pg_url, name, EVALPUSH_WATCH__SWEEP_SECONDS="2"
            )
        )
        for name in ("a", "b")
    ]
    try:
        for daemon in daemons:
            daemon.started()
        wait_until(
            lambda: all(completed(local_platform, r.run_id) for r in runs), "every run COMPLETED"
        )

        def shared_sweeps() -> list[dict] | None:
            found = []
            for daemon in daemons:
                sweeps = [e for e in daemon.find("slow sweep begins") if e["parts"] == 2]
                if not sweeps:
                    return None
                found.append(sweeps[-1])
            return found

        sweeps = wait_until(shared_sweeps, "a sweep of both daemons in two parts", timeout=60)
    finally:
        for daemon in daemons:
            daemon.__exit__()

    assert sorted(s["part"] for s in sweeps) == [1, 2]
    assert sweeps[0]["remembered"] == sweeps[1]["remembered"] == len(runs) + 2  # + root, group
    assert sum(s["directories"] for s in sweeps) == len(runs) + 2, "every directory, once"
    assert_exactly_once(local_platform, root)
