"""Runs whose identity is hostile to a database: a run id holding a NUL byte, a run id of
5,000 characters, a run directory whose path is about 3.5 KB. The ledger stores them whole on
both stores (keyed by a digest, the value kept unindexed), and a run the ledger could not
record would fail alone: the run beside it is uploaded, and the daemon goes on.

Each poison run is a verifiers 0.4 run (its run id comes from its lines, `run.id`), written
beside a good one, pushed by `evalpush push` and watched by `evalpush run` (real subprocesses),
on the SQLite file and on a shared ledger in a real PostgreSQL.
"""

from __future__ import annotations

import json
import secrets
import shutil
from pathlib import Path

import pytest

from daemon_support import Daemon, RunDir, completed, daemon_environ, wait_until
from pushing import PUSH_TIMEOUT_SECONDS, push_environ, start_push
from support.postgres import PASSWORD

OFFLINE_0_4 = (
    Path(__file__).parent
    / "fixtures/producers/0.4.0/runs/episodes_v4_offline"
    / "reverse-text--openai--gpt-4.1-mini--default--278fa187"
)

LONG_RUN_ID = "disabled-" + secrets.token_urlsafe(3750)[:4991]  # 5,000 characters, incompressible
NUL_RUN_ID = "disabled-nul\x00byte"


def poison_run(kind: str, root: Path) -> tuple[Path, str]:
    """A 0.4 run under `root` whose identity is hostile (`kind`); its directory and run id."""
    group = root / "reverse-text--openai--gpt-4.1-mini--default"
    if kind == "long_path":
        for _ in range(14):  # 14 levels of 250 random bytes: a path of about 3.5 KB
            group = group / secrets.token_urlsafe(200)[:250]
    target = group / OFFLINE_0_4.name
    shutil.copytree(OFFLINE_0_4, target, symlinks=True)
    run_id = {"nul": NUL_RUN_ID, "long_id": LONG_RUN_ID}.get(kind)
    lines = []
    for line in (target / "traces.jsonl").read_bytes().splitlines():
        episode = json.loads(line)
        if run_id is None:
            run_id = episode["run"]["id"]
        episode["run"]["id"] = run_id
        lines.append(json.dumps(episode).encode())
    (target / "traces.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    assert run_id is not None
    return target, run_id


def good_run(root: Path) -> RunDir:
    run = RunDir(root / "gsm8k--model--harness").config(num_tasks=5)
    run.write(run.lines(10))
    return run


def on_store(store: str, request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    """The settings that put the ledger on `store`."""
    if store == "sqlite":
        return {}
    password_file = tmp_path / "pw"
    password_file.write_text(PASSWORD)
    return {
        "EVALPUSH_LEDGER__URL": request.getfixturevalue("pg_url"),
        "EVALPUSH_LEDGER__PASSWORD_FILE": str(password_file),
    }


POISONS = ["nul", "long_id", "long_path"]
STORES = ["sqlite", "postgresql"]


@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("kind", POISONS)
def test_push_uploads_a_run_with_a_hostile_identity_and_the_good_run_beside_it(
    kind: str, store: str, local_platform, tmp_path: Path, request: pytest.FixtureRequest
):
    root = tmp_path / "outputs"
    good = good_run(root)
    _, poison_id = poison_run(kind, root)
    environ = push_environ(local_platform, tmp_path, **on_store(store, request, tmp_path))

    push = start_push(root, environ)
    out, err = push.communicate(timeout=PUSH_TIMEOUT_SECONDS)

    said = (out + err).decode("utf-8", "replace")
    assert completed(local_platform, good.run_id), said
    assert completed(local_platform, poison_id), said
    # The producer's run holds 4 of the 6 traces its config expects: uploaded, partial (exit 4).
    assert push.returncode == 4, said
    assert "Traceback" not in said


@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("kind", POISONS)
def test_the_daemon_uploads_a_run_with_a_hostile_identity_and_the_good_run_and_lives_on(
    kind: str, store: str, local_platform, tmp_path: Path, request: pytest.FixtureRequest
):
    root = tmp_path / "outputs"
    root.mkdir()
    environ = daemon_environ(local_platform, tmp_path, [root], **on_store(store, request, tmp_path))
    with Daemon(environ) as daemon:
        daemon.started()
        _, poison_id = poison_run(kind, root)
        good = good_run(root)

        wait_until(lambda: completed(local_platform, good.run_id), "the good run uploaded")
        wait_until(lambda: completed(local_platform, poison_id), "the poison run uploaded")

        assert daemon.process.poll() is None, daemon.text()
        assert daemon.stop() == 0, daemon.text()
    assert "Traceback" not in daemon.text()


# ---------------------------------------------------------------- a run the ledger cannot record

REFUSED_MARK = "refused-by-the-database"
REFUSING_TRIGGER = """
CREATE FUNCTION refuse_marked_runs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.path LIKE '%{mark}%' AND ({when}) THEN
        RAISE EXCEPTION 'index row size 5016 exceeds btree version 4 maximum 2704'
            USING ERRCODE = '54000';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER refuse_marked_runs BEFORE INSERT OR UPDATE ON runs
    FOR EACH ROW EXECUTE FUNCTION refuse_marked_runs();
"""
"""The database refuses a row of a run under a `REFUSED_MARK` directory (`when`: which), as
PostgreSQL refuses a value past one of its limits (SQLSTATE 54000, program limit exceeded)."""


def refusing_database(url: str, when: str = "true") -> None:
    """The shared ledger's tables made at `url`, with `REFUSING_TRIGGER` on its runs."""
    import psycopg

    from evalpush.ledger import Ledger

    Ledger.shared(url, password=PASSWORD).close()
    with psycopg.connect(url, password=PASSWORD, autocommit=True) as connection:
        connection.execute(REFUSING_TRIGGER.format(mark=REFUSED_MARK, when=when))


def refused_run(root: Path) -> RunDir:
    run = RunDir(root / REFUSED_MARK).config(num_tasks=5)
    run.write(run.lines(10))
    return run


def test_push_fails_a_run_the_ledger_cannot_record_alone_with_its_reason_and_uploads_the_rest(
    local_platform, tmp_path: Path, request: pytest.FixtureRequest
):
    settings = on_store("postgresql", request, tmp_path)
    refusing_database(settings["EVALPUSH_LEDGER__URL"])
    root = tmp_path / "outputs"
    refused = refused_run(root)
    good = good_run(root)
    environ = push_environ(local_platform, tmp_path, **settings)

    push = start_push(root, environ)
    out, err = push.communicate(timeout=PUSH_TIMEOUT_SECONDS)

    said = (out + err).decode("utf-8", "replace")
    assert completed(local_platform, good.run_id), said
    assert completed(local_platform, refused.run_id) is None, said
    assert push.returncode == 1, said
    (line,) = [line for line in out.decode().splitlines() if str(refused.path) in line]
    assert "the ledger cannot record this run" in line and "exceeds btree" in line, said
    assert "Traceback" not in said


@pytest.mark.parametrize(
    "when",
    ["true", "NEW.claim_owner IS NOT NULL"],
    ids=["every-write", "its-claim"],  # found by the daemon's look; taken by an upload job
)
def test_the_daemon_leaves_a_run_the_ledger_cannot_record_saying_why_and_uploads_the_rest(
    when: str, local_platform, tmp_path: Path, request: pytest.FixtureRequest
):
    settings = on_store("postgresql", request, tmp_path)
    refusing_database(settings["EVALPUSH_LEDGER__URL"], when)
    root = tmp_path / "outputs"
    root.mkdir()
    environ = daemon_environ(local_platform, tmp_path, [root], **settings)
    with Daemon(environ) as daemon:
        daemon.started()
        refused = refused_run(root)
        good = good_run(root)

        said = daemon.wait_for(
            "run cannot be uploaded: the ledger cannot record it; the other runs go on"
        )
        wait_until(lambda: completed(local_platform, good.run_id), "the good run uploaded")

        assert said["path"] == str(refused.path) and "exceeds btree" in said["error"]
        assert completed(local_platform, refused.run_id) is None
        assert daemon.process.poll() is None, daemon.text()
        assert daemon.stop() == 0, daemon.text()
    assert "Traceback" not in daemon.text()


@pytest.mark.parametrize("store", STORES)
def test_push_fails_a_run_expecting_more_traces_than_the_ledger_counts_alone_on_either_store(
    store: str, local_platform, tmp_path: Path, request: pytest.FixtureRequest
):
    root = tmp_path / "outputs"
    huge = RunDir(root / "huge").config(num_tasks=2**62)  # 2 rollouts each: 2**63 traces
    huge.write(huge.lines(10))
    good = good_run(root)
    environ = push_environ(local_platform, tmp_path, **on_store(store, request, tmp_path))

    push = start_push(root, environ)
    out, err = push.communicate(timeout=PUSH_TIMEOUT_SECONDS)

    said = (out + err).decode("utf-8", "replace")
    assert completed(local_platform, good.run_id), said
    assert completed(local_platform, huge.run_id) is None, said
    assert push.returncode == 1, said
    (line,) = [line for line in out.decode().splitlines() if str(huge.path) in line]
    assert "the ledger cannot record this run" in line, said
    assert "Traceback" not in said
