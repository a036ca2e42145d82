"""Upgrading evalpush over an older ledger, through the real CLI and a real daemon: the read
commands leave the file's bytes as they are, `migrate` upgrades it after a backup, `push` and
the daemon do the same by themselves and say so; the version is one value everywhere."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import re
import sqlite3
from pathlib import Path

import ledger_v1
from daemon_support import InProcessDaemon, daemon_environ
from evalpush import __version__
from evalpush.ledger import SCHEMA_VERSION
from evalpush.local_platform import LocalPlatform
from support.commands import evalpush
from support.environ import cli_environ
from support.runs import write_run

ROOT = Path(__file__).resolve().parent.parent


def old_ledger(tmp_path: Path) -> Path:
    """A schema-1 ledger in `tmp_path/state` (the state dir `cli_environ` names)."""
    root = tmp_path / "runs"
    ledger_v1.copy_runs(root)
    return ledger_v1.build(tmp_path / "state", root)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def schema_and_rows(path: Path) -> tuple[int, int]:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return db.execute("PRAGMA user_version").fetchone()[0], db.execute(
            "SELECT count(*) FROM runs"
        ).fetchone()[0]
    finally:
        db.close()


def test_status_and_check_read_a_schema_1_ledger_and_leave_its_bytes_unchanged(
    platform: LocalPlatform, tmp_path: Path
) -> None:
    path = old_ledger(tmp_path)
    before = digest(path)
    env = cli_environ(platform, tmp_path)

    table = evalpush(env, "status")
    listed = evalpush(env, "status", "--json")
    daemon = evalpush(env, "status", "--daemon", "--json")
    one = evalpush(env, "status", ledger_v1.RUN_IDS["held"])
    check = evalpush(env, "check")

    assert digest(path) == before, "not one byte of the ledger changed"
    assert schema_and_rows(path) == (1, ledger_v1.ROWS)
    assert not list(path.parent.glob("*.bak-*")), "a reader makes no backup: it writes nothing"
    assert (table.returncode, listed.returncode, one.returncode) == (0, 0, 0), table.stderr
    assert f"{path}: {ledger_v1.RUNS} runs" in table.stdout
    assert "schema 1 from an older evalpush" in table.stdout
    assert "`evalpush migrate` upgrades it" in table.stdout
    assert json.loads(daemon.stdout)["schema"] == 1
    assert {row["run_id"] for row in json.loads(listed.stdout)} >= set(ledger_v1.RUN_IDS.values())
    assert "held" in one.stdout
    assert re.search(r"^ledger\s+OK\s+.*schema 1 from an older evalpush", check.stdout, re.M)


def test_migrate_keeps_a_backup_of_the_old_file_and_upgrades_it_once(
    platform: LocalPlatform, tmp_path: Path
) -> None:
    path = old_ledger(tmp_path)
    env = cli_environ(platform, tmp_path)

    first = evalpush(env, "migrate")
    second = evalpush(env, "migrate")

    backup = path.with_name("state.db.bak-v1")
    assert first.returncode == 0, first.stderr
    assert first.stdout == f"ledger upgraded 1 -> {SCHEMA_VERSION} (backup: {backup})\n"
    assert schema_and_rows(backup) == (1, ledger_v1.ROWS), "the old file, as it was"
    assert oct(backup.stat().st_mode & 0o777) == "0o600"
    assert schema_and_rows(path) == (SCHEMA_VERSION, ledger_v1.RUNS)
    assert second.stdout == (
        f"ledger {path} is at schema {SCHEMA_VERSION}, this evalpush's: nothing to do\n"
    )
    assert [p.name for p in path.parent.glob("*.bak-*")] == ["state.db.bak-v1"]
    status = evalpush(env, "status")
    assert "evalpush migrate" not in status.stdout


def test_migrate_without_a_ledger_creates_none(platform: LocalPlatform, tmp_path: Path) -> None:
    done = evalpush(cli_environ(platform, tmp_path), "migrate")

    assert done.returncode == 0
    assert "nothing to upgrade" in done.stdout
    assert not (tmp_path / "state").exists()


def test_push_upgrades_an_old_ledger_by_itself_after_a_backup_and_says_so(
    platform: LocalPlatform, tmp_path: Path
) -> None:
    path = old_ledger(tmp_path)
    run = write_run(tmp_path / "new", run_id="99999999-9999-4999-8999-999999999999")

    done = evalpush(cli_environ(platform, tmp_path), "push", str(run))

    backup = path.with_name("state.db.bak-v1")
    assert f"ledger upgraded 1 -> {SCHEMA_VERSION} (backup: {backup})" in done.stderr
    assert schema_and_rows(backup) == (1, ledger_v1.ROWS)
    assert schema_and_rows(path)[0] == SCHEMA_VERSION
    assert done.returncode == 0 and done.stdout.startswith("finalized"), done.stdout


def test_the_daemon_upgrades_an_old_ledger_by_itself_after_a_backup_and_logs_it(
    platform: LocalPlatform, tmp_path: Path
) -> None:
    path = old_ledger(tmp_path)
    root = tmp_path / "watched"
    root.mkdir()

    with InProcessDaemon(daemon_environ(platform, tmp_path, [root])) as daemon:
        daemon.started()
        line = daemon.wait_for(f"ledger upgraded 1 -> {SCHEMA_VERSION} (backup: {path}.bak-v1)")
        assert daemon.stop() == 0

    assert line["level"] == "warning" and line["from_version"] == 1
    assert schema_and_rows(path.with_name("state.db.bak-v1")) == (1, ledger_v1.ROWS)


def test_the_version_is_one_value_for_the_cli_the_package_metadata_and_the_changelog(
    platform: LocalPlatform, tmp_path: Path
) -> None:
    shown = evalpush(cli_environ(platform, tmp_path), "--version")
    changelog = (ROOT / "CHANGELOG.md").read_text()
    # changes not released yet sit above the released entries, under "## Unreleased"
    first_entry = re.search(r"^## (?!Unreleased$)(\S+)", changelog, re.M)

    assert shown.stdout == f"evalpush {__version__}\n"
    assert importlib.metadata.version("evalpush") == __version__
    assert first_entry is not None and first_entry[1] == __version__
