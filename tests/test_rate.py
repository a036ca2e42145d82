"""What one run costs in requests and ledger writes, and that cutting
them kept the protocol: every intent is in the ledger file when its request arrives.

Real parts throughout: the local platform over loopback, a ledger file in tmp_path, run
directories on disk. The costs are counted (requests by the platform, writes and syncs by the
ledger), never timed.
"""

from __future__ import annotations

import os
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgspec
import pytest

from evalpush.app import App
from evalpush.client import Gate, PlatformClient
from evalpush.config import Config
from evalpush.core.states import State
from evalpush.ledger import Ledger, default_path
from evalpush.local_platform import LocalPlatform
from evalpush.push import push
from support.canned import ObservedTransport

ONE_TRACE = (
    msgspec.json.encode(
        {
            "id": "only",
            "task": {"idx": 0, "prompt": "2+2?"},
            "nodes": [
                {"message": {"role": "user", "content": "2+2?"}},
                {"parent": 0, "message": {"role": "assistant", "content": "4"}, "sampled": True},
            ],
            "rewards": {"correct": 1.0},
            "is_completed": True,
        }
    )
    + b"\n"
)


def one_trace_run(root: Path, env_name: str) -> Path:
    run_dir = root / str(uuid.uuid4())
    run_dir.mkdir(parents=True)
    (run_dir / "config.toml").write_text(
        f'model = "org/m"\nnum_rollouts = 1\npush = false\n[taskset]\nid = "{env_name}"\n'
    )
    (run_dir / "traces.jsonl").write_bytes(ONE_TRACE)
    return run_dir


def make_app(
    platform: LocalPlatform,
    tmp_path: Path,
    *,
    client: PlatformClient | None = None,
    runs_at_once: int = 4,
) -> App:
    config = Config.model_validate(
        {
            "state": {"dir": str(tmp_path / "state")},
            "platform": {"api_base_url": platform.base_url},
            "upload": {"max_concurrent_runs": runs_at_once},
        }
    )
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return App.from_config(
        config,
        client=client,
        gate=Gate(one_shot=True),
        wait_on_auth=False,
        environ={"PRIME_API_KEY": platform.api_key or "any-key"},
        home=home,
    )


@pytest.fixture
def runs_root(tmp_path: Path) -> Path:
    root = tmp_path / "outputs"
    root.mkdir()
    return root


class TestRequestsPerRun:
    def test_runs_of_one_environment_resolve_it_once_per_process(
        self, local_platform: LocalPlatform, runs_root: Path, tmp_path: Path
    ) -> None:
        for _ in range(6):
            one_trace_run(runs_root / "a", "env-a")
        for _ in range(3):
            one_trace_run(runs_root / "b", "env-b")

        with make_app(local_platform, tmp_path) as app:
            results = push(app, [runs_root])

        assert len(results) == 9 and all(r.ok for r in results), results
        requests = local_platform.summary()["requests"]
        assert requests["resolve"] == 2
        assert requests["create"] == requests["finalize"] == requests["samples"] == 9

    def test_a_refused_create_makes_the_next_run_resolve_its_environment_again(
        self, local_platform: LocalPlatform, runs_root: Path, tmp_path: Path
    ) -> None:
        """An environment id this process resolved may have been deleted on the platform since:
        a create it refuses drops the id, so the next run of that environment asks again."""
        first, second = one_trace_run(runs_root, "env-a"), one_trace_run(runs_root, "env-a")

        with make_app(local_platform, tmp_path) as app:
            local_platform.inject("status", on="create", status=404)
            failed = push(app, [first])
            after = push(app, [second])

        assert failed[0].error is not None and "404" in failed[0].error
        assert after[0].ok, after
        assert local_platform.summary()["requests"]["resolve"] == 2


class TestLedgerWritesPerRun:
    def test_a_one_trace_run_takes_five_ledger_writes_of_which_two_are_synced(
        self, local_platform: LocalPlatform, runs_root: Path, tmp_path: Path
    ) -> None:
        """Claim, create intent, batch intent, finalize intent, release: the writes that are
        not intents (start, scan, resolve, the acknowledgements) go with the next of these,
        and only the create and finalize intents wait for the disk (the first batch's is
        covered by the create's: see the test below)."""
        runs = [one_trace_run(runs_root, "env-a") for _ in range(3)]
        # One run at a time: no sync is shared between runs.
        with make_app(local_platform, tmp_path, runs_at_once=1) as app:
            writes, syncs = app.ledger.writes, app.ledger.syncs
            results = push(app, runs)
            assert all(r.ok for r in results), results
            assert app.ledger.writes - writes == 5 * len(runs)
            assert app.ledger.syncs - syncs == 2 * len(runs)

    def test_the_finished_rows_are_in_the_file_when_the_push_returns(
        self, local_platform: LocalPlatform, runs_root: Path, tmp_path: Path
    ) -> None:
        runs = [one_trace_run(runs_root, "env-a") for _ in range(4)]
        with make_app(local_platform, tmp_path) as app:
            push(app, runs)
            with Ledger(default_path(tmp_path / "state")) as other:
                rows = other.all()
        assert [r.state for r in rows] == [State.FINALIZED] * 4
        assert all(r.pending is None and r.holder is None for r in rows)
        assert all(r.samples_sent == 1 and r.acked_offset == len(ONE_TRACE) for r in rows)


class IntentChecking(ObservedTransport):
    """The real transport; before it sends a create, a batch or a finalize, it reads the run's
    row from the ledger FILE over a connection of its own, as another process would after a
    crash, and notes the intent it finds there."""

    def __init__(self, ledger_path: Path) -> None:
        super().__init__()
        self._ledger_path = ledger_path
        self.seen: list[tuple[str, str | None, str | None]] = []
        self._synced: str | None = None  # the intent in the file as of the last sync

    def pending(self) -> str | None:
        """The intent of the run being uploaded, as the ledger file has it now."""
        db = sqlite3.connect(self._ledger_path)
        try:
            rows = db.execute("SELECT pending FROM runs WHERE claim_owner IS NOT NULL").fetchall()
        finally:
            db.close()
        assert len(rows) <= 1
        pending = rows[0][0] if rows else None
        return msgspec.json.decode(pending)["step"] if pending else None

    def synced(self) -> None:
        """Called after each sync of the ledger's log: what power loss from now on leaves."""
        self._synced = self.pending()

    def observe(self, method: str, path: str, headers: httpx.Headers) -> None:
        kind = (
            "create"
            if path.endswith("/evaluations/")
            else "push"
            if path.endswith("/samples")
            else "finalize"
            if path.endswith("/finalize")
            else None
        )
        if method != "POST" or kind is None:
            return
        self.seen.append((kind, self.pending(), self._synced))


@pytest.fixture
def intent_checking_client(
    local_platform: LocalPlatform, tmp_path: Path
) -> Iterator[tuple[PlatformClient, IntentChecking]]:
    from evalpush.config import PlatformConfig

    transport = IntentChecking(default_path(tmp_path / "state"))
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    config = PlatformConfig(api_base_url=local_platform.base_url)
    environ = {"PRIME_API_KEY": local_platform.api_key or "any-key"}
    with PlatformClient(config, environ=environ, home=home, transport=transport) as client:
        yield client, transport


class TestIntentsStillComeFirst:
    def test_every_intent_is_in_the_ledger_file_when_its_request_is_sent(
        self,
        local_platform: LocalPlatform,
        runs_root: Path,
        tmp_path: Path,
        intent_checking_client: tuple[PlatformClient, IntentChecking],
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """In the file, each request's own intent; as of the last sync of the file (what power
        loss leaves), an intent covering the request: the create's covers the first batch
        (after power loss it is reconciled by adopting the evaluation the create made and
        listing its samples from the first line)."""
        client, transport = intent_checking_client
        runs = [one_trace_run(runs_root, "env-a") for _ in range(3)]
        real_fsync = os.fsync

        def fsync(fd: int) -> None:
            real_fsync(fd)
            if os.readlink(f"/proc/self/fd/{fd}").endswith("-wal"):
                transport.synced()

        monkeypatch.setattr(os, "fsync", fsync)
        # One run at a time holds a claim: the transport reads that one's row.
        with make_app(local_platform, tmp_path, client=client, runs_at_once=1) as app:
            results = push(app, runs)
        assert all(r.ok for r in results), results
        assert (
            transport.seen
            == [
                ("create", "create", "create"),
                ("push", "push", "create"),
                ("finalize", "finalize", "finalize"),
            ]
            * 3
        )
