"""`evalpush run` as a real subprocess on a temporary tree, against a local platform.

Each test starts the daemon (`daemon_support.Daemon`), writes runs into the watched tree as the
producer does (line by line, half-written lines held for a while, directories made after the
daemon started), and asserts on what the platform stored: one COMPLETED evaluation per run,
finalized once, with every sample once and the metrics the producer's own push would send
(`pushing.assert_run_exactly_once`). Waits poll for a condition with a generous bound; no test
asserts a timing beyond "within a bound meant to catch a hang".
"""

from __future__ import annotations

import json
import shutil
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from daemon_support import (
    RUN_FINALIZED,
    Daemon,
    InProcessDaemon,
    NotifySocket,
    RunDir,
    completed,
    daemon_environ,
    evaluations_of,
    slow_run,
    status,
    upload_under_way,
    wait_until,
)
from evalpush.discover import inotify_watches_in_use
from evalpush.ledger import Ledger, default_path
from evalpush.local_platform import LocalPlatform
from inotify_limited import limited_namespaces_available
from pushing import assert_run_exactly_once, start_push

OFFLINE_0_4 = (
    Path(__file__).parent
    / "fixtures/producers/0.4.0/runs/episodes_v4_offline"
    / "reverse-text--openai--gpt-4.1-mini--default--278fa187"
)
LONG_SETTLE = "600"  # seconds: a test about another rule must not see runs settle
MARKER = ".done"
STOP_BOUND_SECONDS = 10.0
""""Exits within a few seconds" of SIGTERM, with room for a loaded CI box."""


def finalized(daemon: Daemon, run: RunDir) -> dict:
    return daemon.wait_for(RUN_FINALIZED, run=run.run_id)


def watches_come_to(daemon: Daemon, count: int, what: str) -> None:
    """Wait until the daemon process holds `count` inotify watches (`what` they are)."""
    wait_until(
        lambda: inotify_watches_in_use(daemon.pid) == count,
        what,
        explain=lambda: f"{inotify_watches_in_use(daemon.pid)} watches",
    )


class TestReadiness:
    def test_runs_written_line_by_line_deep_under_a_root_after_start_are_each_finalized_once_by_their_rule(
        self, local_platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        environ = daemon_environ(local_platform, tmp_path, [tree], EVALPUSH_RUNS__MARKER=MARKER)
        deep = tree / "gsm8k--org--model--default" / "a" / "b" / "c"
        by_count = RunDir(deep / "count")
        by_marker = RunDir(deep / "marker")
        by_settle = RunDir(deep / "settle")
        with InProcessDaemon(environ) as daemon:
            daemon.started()

            def count() -> None:
                by_count.config(num_tasks=3)  # mkdir -p of the whole chain, in one go
                by_count.write(by_count.lines(6), half_pause=0.3)

            def marker() -> None:
                by_marker.config()
                by_marker.write(by_marker.lines(5), half_pause=0.3)
                (by_marker.path / MARKER).touch()

            def settle() -> None:
                by_settle.config()
                by_settle.write(by_settle.lines(4), half_pause=0.3)

            with ThreadPoolExecutor(3) as writers:
                for done in [writers.submit(f) for f in (count, marker, settle)]:
                    done.result()

            rules = {
                run.run_id: daemon.wait_for("run is ready", run=run.run_id)["why"]
                for run in (by_count, by_marker, by_settle)
            }
            for run in (by_count, by_marker, by_settle):
                finalized(daemon, run)
            assert daemon.stop() == 0

        assert rules[by_count.run_id] == "6/6 traces: the expected count"
        assert rules[by_marker.run_id] == f"marker {MARKER} present (5 traces)"
        assert rules[by_settle.run_id].startswith("no growth for ")
        assert rules[by_settle.run_id].endswith("(4 traces)")
        assert len(local_platform.summary()["evaluations"]) == 3
        for run in (by_count, by_marker, by_settle):
            assert_run_exactly_once(local_platform, run.path)
            assert len(daemon.find(RUN_FINALIZED, run=run.run_id)) == 1

    def test_a_run_finished_before_the_daemon_starts_is_uploaded_and_never_said_to_wait(
        self, local_platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        environ = daemon_environ(
            local_platform, tmp_path, [tree], EVALPUSH_RUNS__SETTLE_SECONDS=LONG_SETTLE
        )
        run = RunDir(tree / "env--model--harness").config(num_tasks=2)
        run.write(run.lines(4))
        with InProcessDaemon(environ) as daemon:
            finalized(daemon, run)
            assert daemon.stop() == 0
        said = [e["event"] for e in daemon.events if e.get("run") == run.run_id]
        assert said[:3] == ["run is ready", "upload started", RUN_FINALIZED], said
        assert_run_exactly_once(local_platform, run.path)

    def test_a_half_written_last_line_is_not_counted_towards_the_expected_count(
        self, local_platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        environ = daemon_environ(
            local_platform, tmp_path, [tree], EVALPUSH_RUNS__SETTLE_SECONDS=LONG_SETTLE
        )
        run = RunDir(tree / "env--model--harness").config(num_tasks=2)
        four = run.lines(4)
        run.write(four[:3])
        with InProcessDaemon(environ) as daemon:
            daemon.started()
            with open(run.traces, "ab") as f:
                f.write(four[3][:20])  # the fourth line, half-written
            wait_until(
                lambda: "3/4 traces" in status(environ).get(run.run_id, {}).get("reason", ""),
                "the run to wait at 3/4 traces",
            )
            assert evaluations_of(local_platform, run.run_id) == {}
            with open(run.traces, "ab") as f:
                f.write(four[3][20:] + b"\n")
            finalized(daemon, run)
            assert daemon.stop() == 0
        assert_run_exactly_once(local_platform, run.path)

    def test_status_shows_a_waiting_runs_progress_and_its_settle_countdown(
        self, local_platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        environ = daemon_environ(
            local_platform,
            tmp_path,
            [tree],
            EVALPUSH_RUNS__SETTLE_SECONDS="300",
            EVALPUSH_RUNS__MARKER=MARKER,
        )
        run = RunDir(tree / "env--model--harness").config(num_tasks=4)
        with InProcessDaemon(environ) as daemon:
            daemon.started()
            run.write(run.lines(3), half_pause=0.1)

            row = wait_until(
                lambda: (r := status(environ).get(run.run_id)) and "3/8" in r["reason"] and r,
                "status to show the run at 3/8 traces",
            )
            assert row["state"] == "waiting"
            progress, _, countdown = row["reason"].rpartition(", ")
            assert progress == f"3/8 traces, no marker {MARKER} yet"
            assert countdown.startswith("settles in 4m") or countdown == "settles in 5m00s"

            run.write(run.lines(5, start=3))
            finalized(daemon, run)
            assert status(environ)[run.run_id]["state"] == "finalized"
            assert daemon.stop() == 0
        assert_run_exactly_once(local_platform, run.path)


class TestWhatIsNotUploaded:
    def test_a_debug_run_is_skipped_with_its_reason_and_a_bad_line_is_set_aside(
        self, local_platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        environ = daemon_environ(local_platform, tmp_path, [tree])
        group = tree / "env--model--harness"
        debug = RunDir(group).config(num_tasks=1, extra='script_path = "debug.py"\n')
        bad = RunDir(group).config(num_tasks=2)
        with InProcessDaemon(environ) as daemon:
            daemon.started()
            debug.write(debug.lines(2))
            lines = bad.lines(4)
            bad.write([lines[0], b'{"id": "broken", "task": ', *lines[1:]])
            finalized(daemon, bad)
            rows = wait_until(
                lambda: (
                    (r := status(environ)).get(debug.run_id, {}).get("state") == "skipped" and r
                ),
                "the debug run to be skipped",
            )
            assert daemon.stop() == 0

        assert rows[debug.run_id]["reason"].startswith("debug run")
        assert evaluations_of(local_platform, debug.run_id) == {}
        row = rows[bad.run_id]
        assert (row["state"], row["samples_sent"], row["set_aside"]) == ("finalized", 4, 1)
        with Ledger.for_reading(default_path(tmp_path / "state")) as ledger:
            (aside,) = ledger.set_aside(ledger.get_run(bad.run_id))
        assert aside.line == 2
        assert aside.kind == "bad_line"
        assert "JSON" in aside.reason or "json" in aside.reason
        assert_run_exactly_once(local_platform, bad.path)


class TestBesidePush:
    def test_a_run_pushed_before_the_daemon_starts_is_not_sent_again(
        self, local_platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        environ = daemon_environ(local_platform, tmp_path, [tree])
        group = tree / "env--model--harness"
        pushed = RunDir(group).config(num_tasks=2)
        pushed.write(pushed.lines(4))
        push = start_push(tree, environ)
        assert push.wait(60) == 0, push.communicate()
        before = local_platform.summary()["requests"]

        with InProcessDaemon(environ) as daemon:
            daemon.started()
            later = RunDir(group).config(num_tasks=1)
            later.write(later.lines(2))
            finalized(daemon, later)  # the first scan, which saw the pushed run, came before
            assert daemon.stop() == 0

        after = local_platform.summary()["requests"]
        one_run = {"resolve": 1, "create": 1, "finalize": 1}
        assert {k: after[k] - before.get(k, 0) for k in one_run} == one_run
        assert daemon.find("upload started", run=pushed.run_id) == []
        assert_run_exactly_once(local_platform, pushed.path)
        assert_run_exactly_once(local_platform, later.path)

    def test_a_push_beside_the_running_daemon_shares_the_work_one_evaluation_per_run(
        self, local_platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        environ = daemon_environ(
            local_platform, tmp_path, [tree], EVALPUSH_UPLOAD__MAX_BATCH_SAMPLES="2"
        )
        runs = [RunDir(tree / "env--model--harness").config(num_tasks=10) for _ in range(6)]
        for run in runs:
            run.write(run.lines(20))
        with InProcessDaemon(environ) as daemon:
            push = start_push(tree, environ)  # both start on the same finished runs at once
            out, err = push.communicate(timeout=120)
            assert push.returncode == 0, (out, err)
            for run in runs:
                wait_until(lambda run=run: completed(local_platform, run.run_id), "every run")
            # On a loaded machine the push can finish before the daemon is through its start-up;
            # a SIGTERM before its handlers are set would end it by the signal.
            daemon.started()
            assert daemon.stop() == 0

        for run in runs:
            assert_run_exactly_once(local_platform, run.path)
        by_daemon = {e["run"] for e in daemon.events if e.get("event") == RUN_FINALIZED}
        assert by_daemon <= {run.run_id for run in runs}


class TestSignals:
    def test_sigterm_mid_upload_exits_0_within_seconds_and_a_restart_finishes_the_run_once(
        self, local_platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        environ = daemon_environ(local_platform, tmp_path, [tree])
        run = RunDir(tree / "env--model--harness").config(num_tasks=20)
        run.write(run.lines(40))
        local_platform.inject("stall", on="samples", seconds=60)  # the first batch hangs
        with Daemon(environ) as daemon:
            wait_until(
                lambda: local_platform.summary()["requests"].get("samples"),
                "the first batch to be in flight",
            )
            stopped_at = time.monotonic()
            code = daemon.stop(timeout=30)
            took = time.monotonic() - stopped_at
        assert code == 0
        assert took < STOP_BOUND_SECONDS, f"the daemon took {took:.1f} s to stop"
        assert completed(local_platform, run.run_id) is None
        row = status(environ)[run.run_id]
        assert row["state"] == "ready" and "interrupted" in row["reason"]

        local_platform.clear_faults()
        with Daemon(environ) as again:
            finalized(again, run)
            assert again.stop() == 0
        assert_run_exactly_once(local_platform, run.path)

    def test_a_restart_after_kill_9_mid_upload_takes_the_run_over_and_finishes_it_once(
        self, local_platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        environ = daemon_environ(local_platform, tmp_path, [tree])
        run = RunDir(tree / "env--model--harness").config(num_tasks=20)
        run.write(run.lines(40))
        local_platform.inject("stall", on="samples", seconds=60)  # the first batch hangs
        with Daemon(environ) as daemon:
            wait_until(
                lambda: local_platform.summary()["requests"].get("samples"),
                "the first batch to be in flight",
            )
            daemon.kill()
        local_platform.clear_faults()

        with Daemon(environ) as again:
            finalized(again, run)
            assert again.stop() == 0
        assert again.find(
            "took over the claim of a process that is gone: resuming from the "
            "ledger, reconciling with the platform",
            run=run.run_id,
        )
        assert_run_exactly_once(local_platform, run.path)

    def test_sighup_picks_up_a_new_root_and_a_new_marker_without_a_restart(
        self, local_platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        other = tmp_path / "other-outputs"
        other.mkdir()
        config = tmp_path / "evalpush.toml"
        config.write_text(_config(roots=[tree], marker=".done"))
        environ = daemon_environ(
            local_platform,
            tmp_path,
            [],
            EVALPUSH_WATCH__ROOTS=None,
            EVALPUSH_RUNS__SETTLE_SECONDS=None,
        )
        waits = RunDir(tree / "env--model--harness").config()
        elsewhere = RunDir(other / "env--model--harness").config(num_tasks=1)
        with Daemon(environ, "--config", str(config)) as daemon:
            daemon.started()
            waits.write(waits.lines(3))
            (waits.path / ".finished").touch()
            elsewhere.write(elsewhere.lines(2))
            wait_until(
                lambda: status(environ).get(waits.run_id, {}).get("state") == "waiting",
                "the run to wait for its marker",
            )

            config.write_text(_config(roots=[tree, other], marker=".finished"))
            daemon.signal(signal.SIGHUP)
            reload = daemon.wait_for("reload: rebuilding from the configuration")
            finalized(daemon, waits)
            finalized(daemon, elsewhere)
            assert daemon.stop() == 0

        assert reload["changed"]["runs.marker"] == [".done", ".finished"]
        assert reload["changed"]["watch.roots"] == [[str(tree)], [str(tree), str(other)]]
        assert daemon.find("run is ready", run=waits.run_id)[0]["why"].startswith(
            "marker .finished present"
        )
        assert len(daemon.find("evalpush daemon running")) == 1, "no restart"
        assert_run_exactly_once(local_platform, waits.path)
        assert_run_exactly_once(local_platform, elsewhere.path)

    def test_a_bad_configuration_on_sighup_is_logged_and_the_old_one_kept(
        self, local_platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        config = tmp_path / "evalpush.toml"
        config.write_text(_config(roots=[tree], marker=".done"))
        environ = daemon_environ(
            local_platform,
            tmp_path,
            [],
            EVALPUSH_WATCH__ROOTS=None,
            EVALPUSH_RUNS__SETTLE_SECONDS=None,
        )
        with Daemon(environ, "--config", str(config)) as daemon:
            daemon.started()
            config.write_text("[watch]\nrescan_seconds = -1\nroots = [\n")
            daemon.signal(signal.SIGHUP)
            refused = daemon.wait_for(
                "reload: the new configuration is not valid; keeping the old one"
            )
            run = RunDir(tree / "env--model--harness").config()
            run.write(run.lines(3))
            (run.path / ".done").touch()  # the old configuration's marker
            finalized(daemon, run)
            assert daemon.stop() == 0
        assert str(config) in refused["error"]
        assert_run_exactly_once(local_platform, run.path)


def _config(*, roots: list[Path], marker: str) -> str:
    listed = ", ".join(f'"{root}"' for root in roots)
    return (
        f"[watch]\nroots = [{listed}]\nrescan_seconds = 2\n\n"
        f'[runs]\nsettle_seconds = 600\nmarker = "{marker}"\n'
    )


class TestCredentials:
    @pytest.mark.parametrize("where", ["api_key_file", "systemd credential"])
    def test_with_no_key_at_start_the_daemon_waits_says_so_once_and_uploads_once_a_key_appears(
        self, where: str, local_platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        credentials = tmp_path / "credentials"
        credentials.mkdir()
        if where == "api_key_file":
            key_file = credentials / "key"
            extra = {"EVALPUSH_PLATFORM__API_KEY_FILE": str(key_file)}
        else:
            key_file = credentials / "prime-api-key"
            extra = {"CREDENTIALS_DIRECTORY": str(credentials)}
        environ = daemon_environ(local_platform, tmp_path, [tree], PRIME_API_KEY=None, **extra)
        run = RunDir(tree / "env--model--harness").config(num_tasks=1)
        with Daemon(environ) as daemon:
            daemon.started()
            run.write(run.lines(2))
            daemon.wait_for("upload started", run=run.run_id)
            time.sleep(2.5)  # two looks at the credentials and probes: still none, not said again
            assert daemon.process.poll() is None
            assert not local_platform.summary()["requests"].get("create")

            _write_key(key_file, local_platform.api_key)
            finalized(daemon, run)
            assert daemon.stop() == 0
        assert len(_key_complaints(daemon)) == 1, _key_complaints(daemon)
        assert_run_exactly_once(local_platform, run.path)

    def test_a_wrong_key_is_said_once_and_uploads_resume_once_it_is_corrected(
        self, local_platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        key_file = tmp_path / "key"
        _write_key(key_file, "not-the-platforms-key-0123456789")
        environ = daemon_environ(
            local_platform,
            tmp_path,
            [tree],
            PRIME_API_KEY=None,
            EVALPUSH_PLATFORM__API_KEY_FILE=str(key_file),
        )
        run = RunDir(tree / "env--model--harness").config(num_tasks=1)
        with Daemon(environ) as daemon:
            daemon.started()
            run.write(run.lines(2))
            wait_until(lambda: _key_complaints(daemon), "the refused key to be reported")
            time.sleep(2.5)  # two credential looks and probes: still refused, not said again

            _write_key(key_file, local_platform.api_key)
            finalized(daemon, run)
            assert daemon.stop() == 0
        assert len(_key_complaints(daemon)) == 1, _key_complaints(daemon)
        assert_run_exactly_once(local_platform, run.path)


def _write_key(path: Path, key: str | None) -> None:
    assert key is not None
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(key + "\n")
    partial.chmod(0o600)
    partial.rename(path)  # as a credential store writes: all of the key or nothing


def _key_complaints(daemon: Daemon) -> list[dict]:
    return [e for e in daemon.events if e.get("level") == "error" and "key" in e.get("event", "")]


class TestPlatformTrouble:
    def test_an_outage_of_several_seconds_mid_upload_is_ridden_out(
        self, local_platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        environ = daemon_environ(
            local_platform, tmp_path, [tree], EVALPUSH_UPLOAD__MAX_BATCH_SAMPLES="1"
        )
        group = tree / "env--model--harness"
        run = slow_run(local_platform, group, traces=60, stalls=3, seconds=0.2)
        with InProcessDaemon(environ) as daemon:
            upload_under_way(local_platform)
            local_platform.inject("refuse", seconds=4)
            daemon.wait_for("platform unreachable: uploads wait while one probe checks it")
            finalized(daemon, run)
            assert daemon.stop() == 0
        assert daemon.find("platform answers again: uploads resume")
        assert_run_exactly_once(local_platform, run.path)


class TestSystemd:
    def test_ready_status_watchdog_and_stopping_arrive_in_order_on_the_notify_socket(
        self, local_platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        with NotifySocket() as notify:
            environ = daemon_environ(
                local_platform,
                tmp_path,
                [tree],
                NOTIFY_SOCKET=notify.address,
                WATCHDOG_USEC="2000000",
            )
            with Daemon(environ) as daemon:
                notify.wait_for("READY=1")
                notify.wait_for("STATUS=")
                for _ in range(3):
                    notify.wait_for("WATCHDOG=1")
                daemon.signal(signal.SIGHUP)
                notify.wait_for("RELOADING=1")
                notify.wait_for("READY=1")
                notify.wait_for("WATCHDOG=1")
                daemon.signal(signal.SIGTERM)
                notify.wait_for("STOPPING=1")
                assert daemon.stop() == 0
        kinds = [message.split("=", 1)[0] for message in notify.received]
        assert kinds[0] == "READY"
        assert kinds[-1] == "STOPPING"
        reloading = kinds.index("RELOADING")
        assert kinds.count("READY") == 2 and "READY" in kinds[reloading:]
        assert kinds[1:reloading].count("WATCHDOG") >= 3, "pings before the reload"
        assert "WATCHDOG" in kinds[reloading:], "and after it"
        assert "STOPPING" not in kinds[:-1]
        status_line = next(m for m in notify.received if m.startswith("STATUS="))
        assert "finalized" in status_line and "platform" in status_line


class TestSecrets:
    def test_the_key_is_in_no_line_the_daemon_printed_and_nowhere_in_its_state_dir(
        self, local_platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        environ = daemon_environ(local_platform, tmp_path, [tree], EVALPUSH_LOG__LEVEL="debug")
        run = RunDir(tree / "env--model--harness").config(num_tasks=2)
        local_platform.inject("echo_key", on="create", status=503)  # an answer quoting the key
        with Daemon(environ) as daemon:
            daemon.started()
            run.write(run.lines(4))
            finalized(daemon, run)
            assert daemon.stop() == 0

        key = local_platform.api_key
        assert key is not None
        assert daemon.raw, "the daemon printed something"
        for line in daemon.raw:
            assert key.encode() not in line
            assert key[:12].encode() not in line
        for path in (tmp_path / "state").rglob("*"):
            if path.is_file():
                assert key.encode() not in path.read_bytes(), path
        assert_run_exactly_once(local_platform, run.path)


class TestDiscovery:
    def test_a_rescan_finds_a_run_the_watcher_never_told_of(
        self, local_platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        environ = daemon_environ(
            local_platform,
            tmp_path,
            [tree],
            EVALPUSH_WATCH__OBSERVER="polling",
            EVALPUSH_WATCH__POLL_SECONDS="3600",  # the poller looks once, at start
            EVALPUSH_WATCH__RESCAN_SECONDS="1",
        )
        with InProcessDaemon(environ) as daemon:
            daemon.started()
            run = RunDir(tree / "env--model--harness").config(num_tasks=2)
            run.write(run.lines(4))
            finalized(daemon, run)
            assert daemon.stop() == 0
        assert_run_exactly_once(local_platform, run.path)

    def test_a_line_appended_to_a_finalized_run_no_event_tells_of_is_found_by_the_sweep(
        self, local_platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        # A polled root gives no file events, and an append moves no directory's mtime: the
        # rescans skip the finalized run, and only the sweep looks inside it again.
        environ = daemon_environ(
            local_platform,
            tmp_path,
            [tree],
            EVALPUSH_WATCH__OBSERVER="polling",
            EVALPUSH_WATCH__POLL_SECONDS="0.5",
            EVALPUSH_WATCH__SWEEP_SECONDS="3",
        )
        with InProcessDaemon(environ) as daemon:
            daemon.started()
            run = RunDir(tree / "env--model--harness").config(num_tasks=2)
            run.write(run.lines(4))
            first = finalized(daemon, run)["evaluation"]
            run.write(run.lines(2, start=4))
            second = daemon.wait_for(RUN_FINALIZED, run=run.run_id, count=2)["evaluation"]
            assert daemon.stop() == 0
        assert daemon.find("finalized run changed: it uploads again once ready", run=run.run_id)
        evaluations = evaluations_of(local_platform, run.run_id)
        assert set(evaluations) == {first, second}
        assert evaluations[second]["sample_count"] == 6

    def test_it_watches_where_runs_appear_and_the_runs_being_written_not_the_finalized_ones(
        self, local_platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        # A tree of a million finished runs must fit inotify's limits: a finalized run's
        # directory holds no watch (the sweep looks inside it), a run still being written does.
        environ = daemon_environ(
            local_platform, tmp_path, [tree], EVALPUSH_WATCH__RESCAN_SECONDS="0.5"
        )
        group = tree / "env--model--harness"
        done = [RunDir(group).config(num_tasks=2) for _ in range(3)]
        with Daemon(environ) as daemon:
            daemon.started()
            for run in done:
                run.write(run.lines(4))
                finalized(daemon, run)
            watches_come_to(daemon, 2, "the root and the group watched, not the finalized runs")
            writing = RunDir(group).config(num_tasks=2)
            writing.write(writing.lines(2))  # two of its four lines: it waits
            watches_come_to(daemon, 3, "the run being written watched too")
            writing.write(writing.lines(2, start=2))
            finalized(daemon, writing)
            watches_come_to(daemon, 2, "its watch dropped once finalized")
            assert daemon.stop() == 0
        for run in [*done, writing]:
            assert_run_exactly_once(local_platform, run.path)

    def test_a_finalized_run_that_changed_is_watched_again_while_it_waits(
        self, local_platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        # Its watch went once it was finalized; the sweep finds the line appended (a resumed
        # eval), and while it waits to upload again its events must be heard (its marker).
        environ = daemon_environ(
            local_platform,
            tmp_path,
            [tree],
            EVALPUSH_WATCH__RESCAN_SECONDS="0.5",
            EVALPUSH_WATCH__SWEEP_SECONDS="2",
            EVALPUSH_RUNS__SETTLE_SECONDS=LONG_SETTLE,
        )
        run = RunDir(tree / "env--model--harness").config(num_tasks=2)
        with Daemon(environ) as daemon:
            daemon.started()
            run.write(run.lines(4))
            finalized(daemon, run)
            watches_come_to(daemon, 2, "the root and the group, not the finalized run")
            run.write(run.lines(2, start=4))
            daemon.wait_for("finalized run changed: it uploads again once ready", run=run.run_id)
            watches_come_to(daemon, 3, "the changed run watched again while it waits")
            assert daemon.stop() == 0

    def test_a_04_runs_own_directories_watched_while_it_was_written_are_let_go_once_finalized(
        self, local_platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        # verifiers 0.4 makes configs/resolved/ and logs/attempt_1/ before its first line: the
        # directory is not a run yet, so what is made in it is watched (its first line is what
        # must be seen); once the run is finalized, none of its directories holds a watch.
        environ = daemon_environ(
            local_platform, tmp_path, [tree], EVALPUSH_WATCH__RESCAN_SECONDS="0.5"
        )
        run = tree / "reverse-text--openai--gpt-4.1-mini--default" / OFFLINE_0_4.name
        with Daemon(environ) as daemon:
            daemon.started()
            for made in ("configs/resolved/eval.json", "logs/attempt_1/eval.log"):
                (run / made).parent.mkdir(parents=True)
                shutil.copy(OFFLINE_0_4 / made, run / made)
            # and its group and the root
            watches_come_to(daemon, 7, "the run's directory and the four below it, no run yet")
            lines = (OFFLINE_0_4 / "traces.jsonl").read_bytes()
            (run / "traces.jsonl").write_bytes(lines)
            run_id = json.loads(lines.splitlines()[0])["run"]["id"]
            daemon.wait_for(RUN_FINALIZED, run=run_id)
            watches_come_to(daemon, 2, "only the root and the group once it is finalized")
            assert daemon.stop() == 0
        [evaluation] = evaluations_of(local_platform, run_id).values()
        assert (evaluation["status"], evaluation["finalize_count"]) == ("COMPLETED", 1)

    def test_a_line_appended_while_a_run_uploads_is_looked_at_when_the_upload_ends(
        self, local_platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        # Its file event came while the run was in flight and was passed over: the run must
        # not wait for the next rescan (ten minutes here) to upload again.
        environ = daemon_environ(
            local_platform,
            tmp_path,
            [tree],
            EVALPUSH_UPLOAD__MAX_BATCH_SAMPLES="1",
            EVALPUSH_WATCH__RESCAN_SECONDS="600",
        )
        with InProcessDaemon(environ) as daemon:
            daemon.started()
            run = slow_run(local_platform, tree / "env--model--harness", traces=20, stalls=3)
            upload_under_way(local_platform)
            run.write(run.lines(2, start=20))  # a resumed eval appends while it uploads
            first = finalized(daemon, run)
            again = daemon.wait_for(RUN_FINALIZED, run=run.run_id, count=2)
            assert daemon.stop() == 0
        assert again["evaluation"] != first["evaluation"]
        assert daemon.find("finalized run changed: it uploads again once ready", run=run.run_id)

    @pytest.mark.skipif(
        not limited_namespaces_available(),
        reason="unshare --user cannot lower inotify limits on this machine",
    )
    def test_forced_inotify_past_its_watch_limit_goes_on_when_a_root_appears_and_uploads_its_runs(
        self, local_platform: LocalPlatform, tmp_path: Path, tree: Path
    ) -> None:
        # The groups under the first root take every watch the (lowered) limit allows; a root
        # that appears later cannot be watched: said once, and the rescans cover it.
        for i in range(30):
            (tree / f"env{i:02d}--model--harness").mkdir()
        later = tmp_path / "later"
        environ = daemon_environ(
            local_platform, tmp_path, [tree, later], EVALPUSH_WATCH__OBSERVER="inotify"
        )
        limited = [
            *("unshare", "--user", "--map-root-user", "sh", "-c"),
            'echo 20 > /proc/sys/user/max_inotify_watches && exec "$@"',
            "sh",
        ]
        with Daemon(environ, prefix=limited) as daemon:
            daemon.started()
            daemon.wait_for(
                "inotify limit reached: some directories are not watched; every rescan still "
                "finds their runs"
            )
            run = RunDir(later / "env--model--harness").config(num_tasks=2)
            run.write(run.lines(4))
            finalized(daemon, run)
            assert daemon.stop() == 0
        assert_run_exactly_once(local_platform, run.path)

    def test_a_root_that_does_not_exist_at_start_is_watched_once_it_is_created(
        self, local_platform: LocalPlatform, tmp_path: Path
    ) -> None:
        later = tmp_path / "not" / "yet" / "outputs"
        environ = daemon_environ(
            local_platform, tmp_path, [later], EVALPUSH_WATCH__RESCAN_SECONDS="600"
        )
        with InProcessDaemon(environ) as daemon:
            daemon.started()
            run = RunDir(later / "env--model--harness").config(num_tasks=2)  # mkdir -p
            run.write(run.lines(4), pause=0.1)
            finalized(daemon, run)
            assert daemon.stop() == 0
        assert daemon.find("watching root", root=str(later)), daemon.text()
        assert_run_exactly_once(local_platform, run.path)
