"""The shared ledger a fleet uses: PostgreSQL on a real server (tests/support/postgres.py).

What only a shared ledger has: several hosts claiming at once (`FOR UPDATE SKIP LOCKED`), the
schema created by hosts starting together, the database going away and coming back (an
outage, not a crash), the fleet's daemons in `status`, and a host's file moved into it
(`migrate --to`). Everything else the ledger does is proven on both stores by the parametrised
`ledger` fixture (tests/test_ledger.py, tests/test_claims.py, tests/test_upload.py).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from structlog.testing import capture_logs

from evalpush.core.errors import Busy, ClaimLost, LedgerError, LedgerUnavailable
from evalpush.core.states import HistoryOutcome, State
from evalpush.ledger import Claims, Ledger, Process, transitions
from evalpush.ledger.server import LedgerServer
from support.commands import evalpush
from support.environ import clean_environ
from support.postgres import PASSWORD, Cluster

RUN_ID = "5b0c1d2e-0000-4000-8000-00000000feed"


def shared(url: str, **options) -> Ledger:
    return Ledger.shared(url, password=PASSWORD, **options)


def host(name: str, pid: int = 4242) -> Process:
    """A process on another host: its pid means nothing here, only its lease does."""
    return Process(name, f"boot-{name}", pid, 7, f"pid:[{name}]")


def take(claims: Claims, run_id: str = RUN_ID):
    return claims.take(run_id=run_id, path=Path("/shared/runs") / run_id, kind="eval")


class TestClaimsAcrossHosts:
    def test_a_run_is_claimed_by_one_host_and_taken_over_by_another_once_its_lease_ran_out(
        self, pg_url: str
    ):
        with shared(pg_url) as a_ledger, shared(pg_url) as b_ledger:
            # Long enough that a loaded machine's stall does not run it out before `take(b)`.
            a = Claims(a_ledger, process=host("host-a"), lease_seconds=1.5)
            b = Claims(b_ledger, process=host("host-b"), lease_seconds=1.5)
            held, _ = take(a)
            a.close()  # host a stops renewing: killed, or its host gone

            with pytest.raises(Busy, match="host-a"):
                take(b)  # its lease still runs
            time.sleep(1.6)
            taken, gone = take(b)

            assert gone is not None and gone.host == "host-a"
            assert taken.claim_host == "host-b"
            with pytest.raises(ClaimLost):
                a_ledger.update(held, samples_seen=1)  # the old holder writes nothing more
            assert b_ledger.get_run(RUN_ID).samples_seen == 0
            b.release(taken)

    def test_a_row_another_host_is_claiming_is_skipped_not_waited_for(self, pg_url: str):
        with shared(pg_url) as ledger:
            ledger.add(path="/shared/runs/x", run_id=RUN_ID, kind="eval", state=State.READY)
            server = ledger.server
            assert isinstance(server, LedgerServer)
            import psycopg

            with psycopg.connect(pg_url, password=PASSWORD, autocommit=False) as other:
                other.execute("SELECT id FROM runs WHERE run_id = %s FOR UPDATE", (RUN_ID,))
                started = time.monotonic()
                with pytest.raises(Busy, match="being claimed by another process"):
                    take(Claims(ledger, process=host("host-b")))
                waited = time.monotonic() - started
                other.rollback()

            assert waited < 2.0, f"the claim waited {waited:.1f} s for a row lock"
            # Once the other transaction is gone, the run is there to claim.
            record, _ = take(mine := Claims(ledger, process=host("host-b")))
            mine.release(record)

    def test_hosts_claiming_a_new_run_together_leave_exactly_one_holder(self, pg_url: str):
        ledgers = [shared(pg_url) for _ in range(8)]
        start = threading.Barrier(len(ledgers))
        won: list[str] = []
        busy: list[str] = []

        def claim(n: int) -> None:
            claims = Claims(ledgers[n], process=host(f"host-{n}"))
            start.wait()
            try:
                record, _ = take(claims)
                won.append(record.claim_host)
            except Busy:
                busy.append(f"host-{n}")
            finally:
                claims.close()

        threads = [threading.Thread(target=claim, args=(n,)) for n in range(len(ledgers))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        try:
            assert len(won) == 1 and len(busy) == len(ledgers) - 1, (won, busy)
            (row,) = ledgers[0].all()
            assert row.claim_host == won[0]
        finally:
            for ledger in ledgers:
                ledger.close()


class TestSchema:
    def test_hosts_starting_together_on_an_empty_database_create_the_tables_once(self, pg_url: str):
        start = threading.Barrier(6)
        opened: list[Ledger] = []
        failed: list[BaseException] = []

        def open_one() -> None:
            start.wait()
            try:
                opened.append(shared(pg_url))
            except BaseException as exc:  # noqa: BLE001 - reported below
                failed.append(exc)

        threads = [threading.Thread(target=open_one) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        try:
            assert failed == [] and len(opened) == 6
            for table in ("alembic_version", "evalpush_schema"):  # created and stamped once
                assert opened[0]._query(sa.text(f"SELECT count(*) FROM {table}")) == [(1,)]
        finally:
            for ledger in opened:
                ledger.close()

    def test_a_database_with_a_newer_schema_is_refused_naming_it(self, pg_url: str):
        shared(pg_url).close()
        with shared(pg_url) as ledger, ledger._transaction() as db:
            db.execute(sa.text("UPDATE alembic_version SET version_num = '0099'"))

        with pytest.raises(LedgerError, match="schema version 0099 is newer"):
            shared(pg_url)

    def test_a_reader_of_an_empty_database_is_told_there_is_no_ledger_yet(self, pg_url: str):
        with pytest.raises(LedgerError, match="no evalpush ledger in this database yet"):
            shared(pg_url, read_only=True)


class TestOutage:
    """The server stopped and started again under an open ledger (the worker's own server)."""

    def test_writes_while_the_database_is_down_are_an_outage_and_resume_after(
        self, postgres: Cluster, pg_url: str
    ):
        ledger = shared(pg_url)
        record = ledger.add(path="/shared/runs/x", run_id=RUN_ID, kind="eval", state=State.READY)
        claims = Claims(ledger, process=host("host-a"))
        record, _ = take(claims)
        record = ledger.record_intent(record, '{"op": "create"}')
        stop = threading.Event()
        try:
            with capture_logs() as logs:
                postgres.stop()
                try:
                    with pytest.raises(LedgerUnavailable) as down:
                        ledger.update(record, samples_seen=5)
                    assert ledger.server is not None and ledger.server.down_seconds is not None
                    back = threading.Event()
                    waiter = threading.Thread(
                        target=lambda: ledger.server.wait_available(stop) and back.set()
                    )
                    waiter.start()
                    time.sleep(0.5)
                    assert not back.is_set(), "the database is still down"
                finally:
                    postgres.pg_ctl("start", "-w", "-l", str(postgres.root / "log"))
                waiter.join(30)
                assert back.is_set(), "the wait did not end when the database came back"

            assert "cannot be reached" in str(down.value)
            assert PASSWORD not in str(down.value) and PASSWORD not in repr(logs)
            said = [e for e in logs if e.get("stage") == "ledger"]
            assert (said[0]["log_level"], said[0]["event"]) == ("warning", OUTAGE_EVENT)
            # The end at info, as the platform's, with how long it lasted.
            assert (said[-1]["log_level"], said[-1]["event"]) == (
                "info",
                "shared ledger reachable again: uploads resume",
            )
            assert said[-1]["seconds"] >= 0.5 and said[-1]["attempts"] >= 2
            # The durable intent survived; the write refused while down did not happen.
            stored = ledger.get_run(RUN_ID)
            assert stored.pending == '{"op": "create"}' and stored.samples_seen == 0
            ledger.update(stored, samples_seen=5)
            assert ledger.get_run(RUN_ID).samples_seen == 5
        finally:
            stop.set()
            claims.close()
            ledger.close()

    def test_a_crash_restart_of_the_database_keeps_every_committed_write(
        self, postgres: Cluster, pg_url: str
    ):
        with shared(pg_url) as ledger:
            claims = Claims(ledger, process=host("host-a"))
            record, _ = take(claims)
            record = ledger.record_intent(record, '{"op": "samples"}', acked_line=3)
            record = ledger.acknowledge(record, acked_line=7)  # not synced: may be lost
            postgres.restart()  # pg_ctl restart -m immediate: a crash of the server

            with pytest.raises(LedgerUnavailable):
                ledger.get_run(RUN_ID)  # the old connection is gone: said once
            stored = ledger.get_run(RUN_ID)  # and the next call connects again

            assert stored.acked_line in (3, 7)
            assert stored.pending is None if stored.acked_line == 7 else stored.pending
            claims.close()


class TestFleetStatus:
    def test_status_shows_each_daemon_and_each_runs_holder_on_any_host(
        self, pg_url: str, tmp_path: Path
    ):
        with shared(pg_url) as ledger:
            now = time.time()
            ledger.daemon_seen(
                "host-a/b/1/1", host="host-a", pid=101, version="0.4.0", observer="inotify",
                started_at=now - 60, lease_seconds=120,
            )  # fmt: skip
            ledger.daemon_seen(
                "host-b/b/2/2", host="host-b", pid=202, version="0.4.0", observer="polling",
                started_at=now - 60, lease_seconds=120,
            )  # fmt: skip
            ledger.daemon_stopped("host-b/b/2/2")
            claims = Claims(ledger, process=host("host-a", pid=101))
            take(claims)
            password_file = tmp_path / "pw"
            password_file.write_text(PASSWORD + "\n")
            environ = clean_environ(
                EVALPUSH_STATE_DIR=str(tmp_path / "state"),
                EVALPUSH_LEDGER__URL=pg_url,
                EVALPUSH_LEDGER__PASSWORD_FILE=str(password_file),
            )

            shown = evalpush(environ, "status")
            claims.close()

        assert shown.returncode == 0, shown.stderr
        out = shown.stdout
        assert f"ledger:     {pg_url}: 1 run" in out
        assert "daemons:    1 running, 1 not (shared ledger)" in out
        assert "host-a pid 101 (0.4.0; inotify): running since" in out
        assert "host-b pid 202 (0.4.0; polling): stopped at" in out
        assert "pid 101 on host-a since" in out  # the run's holder, on another host
        assert PASSWORD not in out + shown.stderr


class TestMoveIntoShared:
    def test_migrate_to_moves_a_hosts_ledger_keeping_the_finalized_record_of_each_run(
        self, pg_url: str, tmp_path: Path
    ):
        state = tmp_path / "state"
        ids = {name: f"{n:08x}-0000-4000-8000-000000000000" for n, name in enumerate("abcd")}
        with Ledger(state / "state.db") as local:
            for name, run_id in ids.items():
                local.add(path=f"/runs/{name}", run_id=run_id, kind="eval", state=State.READY)
            a = local.get_run(ids["a"])  # finalized here, not there: this host's record wins
            transitions.finalize(local, a, at=time.time(), evaluation_id="eval-a-here")
            b = local.get_run(ids["b"])  # finalized there: theirs is kept
            transitions.finalize(local, b, at=time.time(), evaluation_id="eval-b-here")
            c = local.get_run(ids["c"])  # only here, with history
            local.update(c, evaluation_id="eval-c-old")
            local.restart(
                local.get_run(ids["c"]), outcome=HistoryOutcome.DELETED, state=State.READY
            )
            local.forget(local.get_run(ids["d"]))
        with shared(pg_url) as fleet:
            fleet.add(path="/mnt/runs/a", run_id=ids["a"], kind="eval", state=State.READY)
            fleet.update(fleet.get_run(ids["a"]), evaluation_id="eval-a-there")
            fleet.add(path="/mnt/runs/b", run_id=ids["b"], kind="eval", state=State.READY)
            b_there = fleet.get_run(ids["b"])
            transitions.finalize(fleet, b_there, at=time.time(), evaluation_id="eval-b-there")
        password_file = tmp_path / "pw"
        password_file.write_text(PASSWORD)
        environ = clean_environ(
            EVALPUSH_STATE_DIR=str(state), EVALPUSH_LEDGER__PASSWORD_FILE=str(password_file)
        )

        moved = evalpush(environ, "migrate", "--to", pg_url)

        assert moved.returncode == 0, moved.stderr
        assert "1 run added, 1 replaced by this host's finalized record, 1 kept" in moved.stdout
        with shared(pg_url) as fleet:
            runs = {r.run_id: r for r in fleet.all()}
            assert set(runs) == {ids["a"], ids["b"], ids["c"]}
            assert (runs[ids["a"]].state, runs[ids["a"]].evaluation_id) == (
                State.FINALIZED,
                "eval-a-here",
            )
            assert runs[ids["b"]].evaluation_id == "eval-b-there"
            assert [h.evaluation_id for h in fleet.history(runs[ids["c"]])] == ["eval-c-old"]
            # The evaluation the shared row had for run a is never adopted by a later upload.
            assert "eval-a-there" in fleet.earlier_evaluations(runs[ids["a"]])
            assert PASSWORD not in moved.stdout + moved.stderr

    def test_migrate_to_refuses_a_url_holding_a_password(self, tmp_path: Path):
        environ = clean_environ(EVALPUSH_STATE_DIR=str(tmp_path / "state"))
        url = "postgresql://evalpush:hunter2-secret@127.0.0.1:1/db"

        refused = evalpush(environ, "migrate", "--to", url)

        assert refused.returncode == 2
        assert "password_file" in refused.stderr and "hunter2-secret" not in refused.stderr


class TestDaemonThroughAnOutage:
    @pytest.mark.parametrize(
        "found_by",
        [
            # No rescan since it was finalized: the run still holds the watch it was uploaded
            # under, and the file event is what tells of the line.
            pytest.param({"EVALPUSH_WATCH__RESCAN_SECONDS": "600"}, id="its file event"),
            # Rescans since: a finalized run holds no watch, and the slow sweep finds the line.
            pytest.param(
                {"EVALPUSH_WATCH__RESCAN_SECONDS": "0.5", "EVALPUSH_WATCH__SWEEP_SECONDS": "2"},
                id="the slow sweep",
            ),
        ],
    )
    def test_a_line_appended_to_a_finalized_run_while_the_database_is_down_is_uploaded_after(
        self, postgres: Cluster, pg_url: str, local_platform, tmp_path: Path, found_by
    ):
        """The look at the run (a file event's, or the sweep's) comes while the database is
        down: it fails and is spent; the rescan after the database is back must look inside the
        finalized run (it passes finalized runs by otherwise) and upload it again."""
        from daemon_support import (
            RUN_FINALIZED,
            InProcessDaemon,
            RunDir,
            daemon_environ,
            evaluations_of,
        )

        root = tmp_path / "outputs"
        password_file = tmp_path / "pw"
        password_file.write_text(PASSWORD)
        environ = daemon_environ(
            local_platform,
            tmp_path,
            [root],
            EVALPUSH_WATCH__OBSERVER="inotify",
            EVALPUSH_LEDGER__URL=pg_url,
            EVALPUSH_LEDGER__PASSWORD_FILE=str(password_file),
            **found_by,
        )
        with InProcessDaemon(environ) as daemon:
            daemon.started()
            run = RunDir(root / "env--model--harness").config(num_tasks=2)
            run.write(run.lines(4))
            daemon.wait_for(RUN_FINALIZED, run=run.run_id)
            time.sleep(2.0)  # its claim released, the run settled: nothing left to write
            postgres.stop()
            try:
                run.write(run.lines(2, start=4))
                daemon.wait_for(OUTAGE_EVENT)
                time.sleep(1.0)  # the event's look fails meanwhile
            finally:
                postgres.pg_ctl("start", "-w", "-l", str(postgres.root / "log"))
            second = daemon.wait_for(RUN_FINALIZED, run=run.run_id, count=2)
            assert daemon.stop() == 0
        assert evaluations_of(local_platform, run.run_id)[second["evaluation"]]["sample_count"] == 6

    def test_the_daemon_pauses_while_the_database_is_down_readyz_503_and_resumes_after(
        self, postgres: Cluster, pg_url: str, local_platform, tmp_path: Path
    ):
        """A run written while the database is down is uploaded once it is back; meanwhile the
        daemon keeps turning and `/readyz` answers 503 naming the ledger."""
        import httpx

        from daemon_support import InProcessDaemon, RunDir, completed, daemon_environ, wait_until
        from pushing import assert_run_exactly_once

        root = tmp_path / "outputs"
        group = root / "gsm8k--model--harness"
        group.mkdir(parents=True)
        password_file = tmp_path / "pw"
        password_file.write_text(PASSWORD)
        environ = daemon_environ(
            local_platform,
            tmp_path,
            [root],
            EVALPUSH_LEDGER__URL=pg_url,
            EVALPUSH_LEDGER__PASSWORD_FILE=str(password_file),
            EVALPUSH_METRICS__LISTEN="127.0.0.1:0",
            EVALPUSH_WATCH__LEDGER_POLL_SECONDS="0.5",
        )
        first = RunDir(group).config(num_tasks=5)
        first.write(first.lines(10))
        with InProcessDaemon(environ) as daemon:
            url = daemon.wait_for("serving /metrics, /livez and /readyz")["url"]
            daemon.started()
            wait_until(lambda: completed(local_platform, first.run_id), "the first run uploaded")
            postgres.stop()
            try:
                second = RunDir(group).config(num_tasks=5)
                second.write(second.lines(10))
                ready = wait_until(
                    lambda: (r := httpx.get(f"{url}/readyz", timeout=5)).status_code == 503 and r,
                    "/readyz to answer 503 while the ledger is down",
                )
                assert "cannot be reached" in ready.text
                daemon.wait_for(OUTAGE_EVENT)
                assert completed(local_platform, second.run_id) is None, "sent without a ledger"
            finally:
                postgres.pg_ctl("start", "-w", "-l", str(postgres.root / "log"))
            wait_until(lambda: completed(local_platform, second.run_id), "the second run uploaded")
            wait_until(
                lambda: httpx.get(f"{url}/readyz", timeout=5).status_code == 200,
                "/readyz to answer 200 again",
            )
            assert daemon.stop() == 0

        assert_run_exactly_once(local_platform, first.path)
        assert_run_exactly_once(local_platform, second.path)
        assert PASSWORD not in daemon.text()


OUTAGE_EVENT = (
    "shared ledger unreachable: uploads pause (nothing is sent without its intent written) "
    "until it is back"
)


class TestPushesOnTwoHosts:
    def test_pushes_of_one_tree_from_two_hosts_upload_each_run_once(
        self, pg_url: str, local_platform, tmp_path: Path
    ):
        """Two `push` processes, each in a PID namespace of its own (another host, as far as
        their claims go), push the same runs at once through the shared ledger."""
        import shutil
        import subprocess
        import sys

        from daemon_support import RunDir
        from pushing import assert_exactly_once, push_environ

        if shutil.which("unshare") is None:
            pytest.skip("no unshare (util-linux)")
        root = tmp_path / "outputs"
        group = root / "gsm8k--model--harness"
        for n in range(6):
            run = RunDir(group).config(num_tasks=10)
            run.write(run.lines(20 + n))
        password_file = tmp_path / "pw"
        password_file.write_text(PASSWORD)
        local_platform.inject("stall", on="samples", count=6, seconds=0.2)
        pushes = [
            subprocess.Popen(
                ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]
                + [sys.executable, "-m", "evalpush", "push", str(root)],
                env=push_environ(
                    local_platform,
                    tmp_path,
                    EVALPUSH_STATE_DIR=str(tmp_path / f"state-{n}"),
                    EVALPUSH_LEDGER__URL=pg_url,
                    EVALPUSH_LEDGER__PASSWORD_FILE=str(password_file),
                ),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            for n in range(2)
        ]
        outputs = [p.communicate(timeout=120) for p in pushes]

        for push, (out, err) in zip(pushes, outputs, strict=True):
            assert push.returncode == 0, err.decode()
            assert PASSWORD.encode() not in out + err
        assert_exactly_once(local_platform, root)
        said = b"".join(out for out, _ in outputs).decode()
        assert said.count("finalized") >= 6, said  # each run: uploaded by one, seen by the other


def test_a_shared_ledger_without_the_postgres_extra_is_a_clear_error(tmp_path: Path):
    """`pip install evalpush` alone has no PostgreSQL driver: a url is an error naming the
    extra (exit 2), not a traceback."""
    import subprocess
    import sys

    environ = clean_environ(
        EVALPUSH_STATE_DIR=str(tmp_path / "state"),
        EVALPUSH_LEDGER__URL="postgresql://evalpush@127.0.0.1:1/evalpush",
    )
    without_driver = (
        "import sys; sys.modules['psycopg'] = None; from evalpush.cli import main; "
        "sys.exit(main(['status']))"
    )

    done = subprocess.run(
        [sys.executable, "-c", without_driver],
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert done.returncode == 2, done.stderr
    assert "pip install 'evalpush[postgres]'" in done.stderr
    assert "Traceback" not in done.stderr


class TestOneTreeTwoMounts:
    def test_daemons_seeing_the_tree_at_different_paths_upload_each_run_once(
        self, pg_url: str, local_platform, tmp_path: Path
    ):
        """Host a mounts the tree at one path, host b at another (a bind mount): a run is
        one run, known by its run id, uploaded once."""
        import subprocess

        from daemon_support import Daemon, RunDir, completed, daemon_environ, wait_until
        from pushing import assert_exactly_once

        tree = tmp_path / "tree"
        group = tree / "gsm8k--model--harness"
        group.mkdir(parents=True)
        mount_a, mount_b = tmp_path / "mnt-a", tmp_path / "mnt-b"
        mount_a.mkdir()
        mount_b.mkdir()
        for mount in (mount_a, mount_b):
            bound = subprocess.run(
                ["mount", "--bind", str(tree), str(mount)], capture_output=True, text=True
            )
            if bound.returncode != 0:
                pytest.skip(f"a bind mount needs root: {bound.stderr.strip()}")
        password_file = tmp_path / "pw"
        password_file.write_text(PASSWORD)
        daemons = []
        try:
            for name, mount in (("a", mount_a), ("b", mount_b)):
                environ = daemon_environ(
                    local_platform,
                    tmp_path,
                    [mount],
                    EVALPUSH_STATE_DIR=str(tmp_path / f"state-{name}"),
                    EVALPUSH_LEDGER__URL=pg_url,
                    EVALPUSH_LEDGER__PASSWORD_FILE=str(password_file),
                    EVALPUSH_LEDGER__LEASE_SECONDS="5",
                )
                prefix = ("unshare", "--pid", "--fork", "--mount-proc", "--kill-child")
                daemons.append(Daemon(environ, prefix=prefix).started())
            runs = []
            for n in range(6):
                run = RunDir(group).config(num_tasks=5)
                run.write(run.lines(10 + n))
                runs.append(run)
            wait_until(
                lambda: all(completed(local_platform, r.run_id) for r in runs),
                "every run COMPLETED",
                explain=lambda: "\n".join(d.text()[-8000:] for d in daemons),
            )
            with shared(pg_url, read_only=True) as ledger:
                rows = wait_until(
                    lambda: (
                        (found := ledger.all())
                        and all(r.state == State.FINALIZED for r in found)
                        and found
                    ),
                    "every run finalized in the ledger",
                )
        finally:
            for daemon in daemons:
                daemon.kill()
            for mount in (mount_a, mount_b):
                subprocess.run(["umount", "-l", str(mount)], capture_output=True)

        assert_exactly_once(local_platform, tree)
        assert len(rows) == len(runs)  # one row per run, whichever path it was seen at
        for daemon in daemons:
            assert not daemon.find("upload failed"), daemon.text()
            assert [e for e in daemon.events if e.get("level") in ("warning", "error")] == []
