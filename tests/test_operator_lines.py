"""What an operator reads first, through the real CLI and a real daemon: the one start-up line
(never the key), a failed upload at ERROR ending with what to do, the daemon refusing a
relative root, and `check`'s `watch` row."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from daemon_support import Daemon, InProcessDaemon, RunDir, daemon_environ, status, wait_until
from evalpush import __version__
from evalpush.local_platform import LocalPlatform
from support.commands import COMMAND_SECONDS, check_rows, evalpush
from support.environ import cli_environ


def test_the_start_up_line_names_version_config_platform_key_source_roots_and_metrics(
    local_platform: LocalPlatform, tmp_path: Path
) -> None:
    tree, later = tmp_path / "outputs", tmp_path / "not-yet"
    tree.mkdir()
    config = tmp_path / "evalpush.toml"
    config.write_text('[metrics]\nlisten = "127.0.0.1:0"\n[upload]\npush_processes = 1\n')
    environ = daemon_environ(local_platform, tmp_path, [tree, later], EVALPUSH_CONFIG=str(config))
    with Daemon(environ) as daemon:
        line = daemon.started().wait_for("evalpush daemon running")
        serving = daemon.wait_for("serving /metrics, /livez and /readyz")
        assert daemon.stop() == 0

    assert line["version"] == __version__
    assert line["config"] == str(config)
    assert line["platform"] == local_platform.base_url
    assert line["key_source"] == "$PRIME_API_KEY"
    assert line["roots"] == {str(tree): "inotify", str(later): "not there yet: waited for"}
    assert line["metrics"] == serving["url"]
    assert line["ignored_retired_keys"] == [
        f"{config}: upload.push_processes (a push uploads every run in its own process)"
    ]
    assert local_platform.api_key not in daemon.text()


def test_a_failed_upload_is_an_error_ending_with_the_fix_and_the_retry_command(
    local_platform: LocalPlatform, tmp_path: Path
) -> None:
    tree = tmp_path / "outputs"
    environ = daemon_environ(local_platform, tmp_path, [tree])
    run = RunDir(tree).config(num_tasks=1)
    (run.path / "config.toml").write_text(
        'model = "m"\nnum_examples = 1\nrollouts_per_example = 2\n'
    )
    with InProcessDaemon(environ) as daemon:
        daemon.started()
        run.write(run.lines(2))
        failed = daemon.wait_for("upload failed", run=run.run_id)
        row = wait_until(lambda: status(environ).get(run.run_id), "the run's row")
        assert daemon.stop() == 0

    assert failed["level"] == "error"
    suffix = f"; fix config.toml, then `evalpush retry {run.run_id[:8]}`"
    assert failed["error"].endswith(suffix), failed["error"]
    assert row["state"] == "failed" and row["last_error"].endswith(suffix)


def test_the_daemon_refuses_a_relative_root_naming_it(
    local_platform: LocalPlatform, tmp_path: Path
) -> None:
    environ = cli_environ(local_platform, tmp_path, EVALPUSH_WATCH__ROOTS='["./outputs"]')

    done = subprocess.run(
        [sys.executable, "-m", "evalpush", "run"],
        env=environ,
        capture_output=True,
        text=True,
        timeout=COMMAND_SECONDS,
        cwd=tmp_path,
    )

    assert done.returncode == 2
    assert "watch.roots: 'outputs' is relative" in done.stderr
    assert "give absolute paths" in done.stderr


def test_check_has_a_watch_row_failing_a_relative_or_missing_root_with_the_fix(
    local_platform: LocalPlatform, tmp_path: Path
) -> None:
    there = tmp_path / "outputs"
    there.mkdir()
    base = cli_environ(local_platform, tmp_path)

    good = evalpush(base, "check", EVALPUSH_WATCH__ROOTS=json.dumps([str(there)]))
    missing = evalpush(base, "check", EVALPUSH_WATCH__ROOTS=json.dumps([str(tmp_path / "no")]))
    relative = evalpush(base, "check", EVALPUSH_WATCH__ROOTS='["./runs"]')
    unset = evalpush(base, "check")

    result, detail = check_rows(good.stdout)["watch"]
    assert (good.returncode, result) == (0, "OK"), good.stdout
    assert re.fullmatch(
        rf"{re.escape(str(there))}: absolute, exists, readable, \w+, (inotify|polling); "
        r"inotify watches left [\d,]+ of [\d,]+",
        detail,
    ), detail
    result, detail = check_rows(missing.stdout)["watch"]
    assert (missing.returncode, result) == (1, "FAIL")
    assert "does not exist" in detail and "fix: create it, or correct watch.roots" in detail
    result, detail = check_rows(relative.stdout)["watch"]
    assert (relative.returncode, result) == (2, "FAIL")
    assert "relative" in detail and "it would be /runs" in detail
    assert check_rows(unset.stdout)["watch"][0] == "SKIP"


def test_an_unterminated_string_is_said_at_its_column_with_one_at(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text('env_id = "gsm8k"\nmodel = "m"\n')
    (run / "traces.jsonl").write_bytes(b'{"id": "x", "a": "unterminated\n')

    done = subprocess.run(
        [sys.executable, "-m", "evalpush", "convert", str(run)],
        capture_output=True,
        text=True,
        timeout=COMMAND_SECONDS,
    )

    assert "line 1: invalid JSON: Unterminated string starting at column 18" in done.stderr
    assert "at at" not in done.stderr
