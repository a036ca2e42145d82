"""The daemon and push attacked as a hostile world would: what broke, each finding now guarded.

Each test is one finding (its number in the docstring), the smallest deterministic reproduction
found, written as the behaviour evalpush should have. Each was a strict xfail until its fix
landed; now each guards its fix. Severity, worst first: exactly-once violation > data loss >
stuck run > bad message (the sections below).

Real parts throughout: `evalpush` run as a subprocess (the command is the surface the lead's
refactor keeps), the local platform over loopback with its own faults, a real SQLite ledger,
real files, real signals and a real UTS namespace. Where the local platform has no fault for an
answer (a listing with an odd item, a huge number), `Hop`, a loopback HTTP hop in front of it,
rewrites that one answer and passes everything else through untouched.
"""

from __future__ import annotations

import concurrent.futures.thread
import contextlib
import encodings.idna
import functools
import io
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

import ledger_v1
from as_nobody import NOBODY, as_nobody
from evalpush import cli, push
from evalpush.cli import push_report
from evalpush.local_platform import LocalPlatform
from support import platform_view, runs
from support.commands import evalpush
from support.environ import cli_environ
from support.platform_view import requests
from support.runs import config_toml, rewrite_in_place, trace_line, traces
from support.waiting import wait_until

PRELOADED_FOR_PUSH = (encodings.idna, concurrent.futures.thread, push_report, push)
"""What `push` imports as it runs, imported before `as_nobody` forks: a child that became
`nobody` may not read this interpreter's library (under /root) to import it then."""
CRASH_ENV = "EVALPUSH_CRASH_AT"  # upload.py's crash points: `<point>` or `<point>:<n>`

RUN_ID = "0f1e2d3c-4b5a-4968-8776-a5b4c3d2e1f0"
OTHER_RUN_ID = "11111111-2222-4333-8444-555555555555"
SECRET_KEY = "sk-live-7Hw2Qp9Zx4Lm1Rv8Tn3Kb6Jd0Fc5Ys"
TIMEOUT_SECONDS = 60
EXIT_BOUND_SECONDS = 5.0
"""SIGTERM to exit, asserted (the target is two seconds)."""
STUCK_READS = 4
"""A push that lists this many times without creating anything is going round in circles."""


# ---------------------------------------------------------------- runs on disk


write_run = functools.partial(runs.write_run, run_id=RUN_ID, config=config_toml())
"""`write_run(root, lines, run_id=RUN_ID, group=...)`: `root/group/run_id`, env `gsm8k`, with no
`num_tasks` (`support.runs.write_run`)."""


# ---------------------------------------------------------------- evalpush and the platform


@pytest.fixture
def platform() -> Iterator[LocalPlatform]:
    with LocalPlatform(api_key=SECRET_KEY) as local:
        yield local


def cli_env(platform: LocalPlatform, tmp_path: Path, **extra: str) -> dict[str, str]:
    """`cli_environ` (pointed at `platform`, a private state dir and home) with 2-sample batches
    and warning-level logs."""
    settings = {"EVALPUSH_UPLOAD__MAX_BATCH_SAMPLES": "2", "EVALPUSH_LOG__LEVEL": "warning"}
    return cli_environ(platform, tmp_path, **{**settings, **extra})


def evaluations_of(platform: LocalPlatform, run_id: str = RUN_ID) -> list[dict[str, Any]]:
    """The run's evaluations on the platform, each with its `id`."""
    return [
        {"id": evaluation_id, **evaluation}
        for evaluation_id, evaluation in platform_view.evaluations_of(platform, run_id).items()
    ]


def assert_once(platform: LocalPlatform, samples: int, run_id: str = RUN_ID) -> None:
    """The run has exactly one evaluation: COMPLETED, finalized once, each sample once."""
    found = evaluations_of(platform, run_id)
    shapes = [(e["status"], e["sample_count"], e["duplicates"]) for e in found]
    assert shapes == [("COMPLETED", samples, 0)], shapes
    assert found[0]["finalize_count"] == 1


def line_of(output: str, run: Path) -> str:
    """The one line `push` printed about `run` ("" if none)."""
    lines = [line for line in output.splitlines() if line.split()[1:2] == [f"{run}:"]]
    assert len(lines) <= 1, lines
    return lines[0] if lines else ""


def key_in(data: bytes) -> bool:
    """Whether any 8 consecutive characters of the key are in `data`."""
    key = SECRET_KEY.encode()
    return any(key[i : i + 8] in data for i in range(len(key) - 7))


class Hop:
    """A loopback HTTP hop in front of the local platform: every request is forwarded as is, and
    `rewrite(method, path, status, body)` may replace the answer (None passes it through)."""

    def __init__(
        self, target: str, rewrite: Callable[[str, str, int, bytes], tuple[int, bytes] | None]
    ):
        client = httpx.Client(base_url=target, timeout=TIMEOUT_SECONDS)

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                headers = {
                    k: v
                    for k, v in self.headers.items()
                    if k.lower() in ("authorization", "content-type")
                }
                answer = client.request(
                    self.command, self.path, content=self.rfile.read(length), headers=headers
                )
                status, body = rewrite(
                    self.command, self.path, answer.status_code, answer.content
                ) or (answer.status_code, answer.content)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = forward

        self._client = client
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = False  # server_close() joins every handler thread
        self._thread = threading.Thread(target=self._server.serve_forever, name="hop")
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
        self._client.close()


@pytest.fixture
def hop(platform: LocalPlatform) -> Iterator[Callable[..., Hop]]:
    made: list[Hop] = []

    def make(rewrite: Callable[[str, str, int, bytes], tuple[int, bytes] | None]) -> Hop:
        made.append(Hop(platform.base_url, rewrite))
        return made[-1]

    yield make
    for each in made:
        each.close()


def is_evaluation_listing(method: str, path: str) -> bool:
    return method == "GET" and path.startswith("/api/v1/evaluations/?")


# ================================================================ exactly-once violations


def test_a_create_intent_left_by_a_killed_push_is_reconciled_even_when_the_file_is_rewritten(
    platform, tmp_path
):
    """F1: the file rewritten after a create-sent crash; the evaluation that create made is closed
    out."""
    run = write_run(tmp_path / "out", traces(6))
    env = cli_env(platform, tmp_path)
    killed = evalpush(env, "push", str(run), **{CRASH_ENV: "create-sent"})
    assert killed.returncode == -signal.SIGKILL
    rewrite_in_place(run, traces(6, start=100))

    done = evalpush(env, "push", str(run))

    assert done.returncode == 0, done.stdout + done.stderr
    statuses = sorted(e["status"] for e in evaluations_of(platform))
    assert "RUNNING" not in statuses, "the dead push's evaluation is closed out"
    assert statuses.count("COMPLETED") == 1


@pytest.mark.parametrize("status", [409, 404])
def test_a_samples_refusal_the_evaluation_does_not_bear_out_leaves_one_evaluation(
    platform, tmp_path, status
):
    """F6: a 404/409 on a batch is believed only if a read of the evaluation bears it out."""
    run = write_run(tmp_path / "out", traces(6))
    platform.inject("status", on="samples", status=status, do_work=True)

    done = evalpush(cli_env(platform, tmp_path), "push", str(run))

    assert done.returncode == 0, done.stdout + done.stderr
    assert_once(platform, 6)


def test_a_create_intent_is_reconciled_in_the_environment_it_was_sent_to(platform, tmp_path):
    """F7: the create intent records its environment; the lookup lists that one."""
    run = write_run(tmp_path / "out", traces(4))
    env = cli_env(platform, tmp_path)
    killed = evalpush(env, "push", str(run), **{CRASH_ENV: "create-sent"})
    assert killed.returncode == -signal.SIGKILL
    (run / "config.toml").write_text(config_toml(env="gsm8k-renamed"))

    done = evalpush(env, "push", str(run))

    assert done.returncode == 0, done.stdout + done.stderr
    assert [e["status"] for e in evaluations_of(platform)] == ["COMPLETED"]


def test_a_push_whose_ledger_was_moved_aside_stops_instead_of_racing_the_next_push(
    platform, tmp_path, start_evalpush
):
    """F8: every write checks that state.db is still the file the process opened."""
    run = write_run(tmp_path / "out", traces(12))
    env = cli_env(platform, tmp_path)
    platform.inject("stall", on="samples", seconds=3)  # stored, answered 3 s later
    first = start_evalpush(env, "push", str(run))
    wait_until(lambda: requests(platform, "samples") >= 1, "the first batch")
    os.rename(tmp_path / "state", tmp_path / "state.moved-aside")

    second = evalpush(env, "push", str(run))
    first.communicate(timeout=TIMEOUT_SECONDS)

    assert second.returncode == 0, second.stdout + second.stderr
    assert_once(platform, 12)


def test_a_run_keeps_its_identity_when_the_host_name_changes(platform, tmp_path):
    """F14: a directory that is not a UUID keeps the run id the ledger knows for its path."""
    run = write_run(tmp_path / "out", traces(4), run_id="my-run")
    env = cli_env(platform, tmp_path)
    assert evalpush(env, "push", str(run)).returncode == 0

    renamed = subprocess.run(
        ["unshare", "--uts", "sh", "-c", 'hostname renamed-host && exec "$0" -m evalpush push "$1"']
        + [sys.executable, str(run)],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_SECONDS,
    )

    assert renamed.returncode == 0, renamed.stdout + renamed.stderr
    assert len(platform.summary()["evaluations"]) == 1, "the platform already has this run"


def test_samples_never_land_in_an_evaluation_of_another_run(platform, tmp_path):
    """F18: a create's answer is trusted only once a read says the evaluation is this run's."""
    env = cli_env(platform, tmp_path)
    other = write_run(tmp_path / "other", traces(6), run_id=OTHER_RUN_ID)
    evalpush(env, "push", str(other), **{CRASH_ENV: "batch-acked:1"})  # its evaluation open
    [open_one] = evaluations_of(platform, OTHER_RUN_ID)
    run = write_run(tmp_path / "out", [trace_line(i, sample_id=f"mine-{i}") for i in range(4)])
    platform.inject("bad_id", on="create", value=open_one["id"])

    evalpush(env, "push", str(run))

    stored = [s["sample_id"] for s in platform.samples(open_one["id"])]
    assert not [s for s in stored if s.startswith("mine-")], stored


def test_a_reconciling_read_finds_ids_with_surrounding_spaces(platform, tmp_path):
    """F5a: listed sample ids are compared exactly as stored, never stripped."""
    run = write_run(tmp_path / "out", [trace_line(i, sample_id=f"t{i} ") for i in range(6)])
    platform.inject("reset", on="samples")  # stored, then the answer is lost

    done = evalpush(cli_env(platform, tmp_path), "push", str(run))

    assert done.returncode == 0, done.stdout + done.stderr
    assert_once(platform, 6)


def test_a_run_directory_moved_while_it_uploads_keeps_its_one_evaluation(
    platform, tmp_path, start_evalpush
):
    """F16: a run directory moved mid-upload is not a deleted file: the upload goes on."""
    root = tmp_path / "out"
    run = write_run(root, traces(12))
    env = cli_env(platform, tmp_path)
    platform.inject("stall", on="samples", seconds=1)
    first = start_evalpush(env, "push", str(root))
    wait_until(lambda: requests(platform, "samples") >= 1, "the first batch")
    (root / "elsewhere").mkdir()
    os.rename(run, root / "elsewhere" / run.name)
    first.communicate(timeout=TIMEOUT_SECONDS)

    again = evalpush(env, "push", str(root))

    assert again.returncode == 0, again.stdout + again.stderr
    assert_once(platform, 12)


# ================================================================ data loss


def test_a_directory_with_a_colliding_run_id_but_other_traces_is_not_dropped_silently(
    platform, tmp_path
):
    """F3: a directory with a run's id but other bytes is not taken for its copy."""
    write_run(tmp_path / "out", traces(4), group="a")
    collider = write_run(tmp_path / "out", traces(6, start=50), group="b")

    done = evalpush(cli_env(platform, tmp_path), "push", str(tmp_path / "out"))

    stored = {s["sample_id"] for e in evaluations_of(platform) for s in platform.samples(e["id"])}
    uploaded = {f"trace-{i}" for i in range(50, 56)} <= stored
    reported_done = line_of(done.stdout, collider).startswith("finalized")
    assert uploaded or not reported_done, done.stdout
    assert uploaded or done.returncode == 1


def test_adopting_a_finalized_evaluation_that_lacks_traces_does_not_lose_them(platform, tmp_path):
    """F9: a finalized evaluation holding fewer samples than the file is superseded, not adopted."""
    run = write_run(tmp_path / "out", traces(4))
    env = cli_env(platform, tmp_path)
    assert evalpush(env, "push", str(run)).returncode == 0
    with (run / "traces.jsonl").open("ab") as f:
        f.write(b"".join(line + b"\n" for line in traces(4, start=4)))
    os.rename(tmp_path / "state", tmp_path / "state.moved-aside")

    done = evalpush(env, "push", str(run))

    held = max(e["sample_count"] for e in evaluations_of(platform))
    assert held == 8 or done.returncode != 0, done.stdout


# ================================================================ stuck runs


def test_a_finalized_run_whose_config_broke_for_a_while_stays_finalized(platform, tmp_path):
    """F2: an error on a finalized run is reported; the run stays finalized."""
    run = write_run(tmp_path / "out", traces(4))
    env = cli_env(platform, tmp_path)
    assert evalpush(env, "push", str(run)).returncode == 0
    good = (run / "config.toml").read_text()
    (run / "config.toml").write_text("model = [unclosed\n")
    assert evalpush(env, "push", str(run)).returncode == 1
    (run / "config.toml").write_text(good)

    done = evalpush(env, "push", str(run))

    assert done.returncode == 0, done.stdout + done.stderr
    assert [row["state"] for row in json.loads(evalpush(env, "status", "--json").stdout)] == [
        "finalized"
    ]
    assert len(evaluations_of(platform)) == 1


def test_a_refused_close_out_fails_that_run_alone_and_every_run_is_reported(platform, tmp_path):
    """F4: admission runs inside the upload's error handling."""
    root = tmp_path / "out"
    run = write_run(root, traces(6))
    other = write_run(root, traces(4), run_id=OTHER_RUN_ID)
    env = cli_env(platform, tmp_path)
    evalpush(env, "push", str(run), **{CRASH_ENV: "batch-acked:1"})  # its evaluation open
    rewrite_in_place(run, traces(6, start=100))
    platform.inject("status", on="close", status=422, count=1000)

    done = evalpush(env, "push", str(root))

    assert line_of(done.stdout, other).startswith("finalized"), done.stdout + done.stderr
    assert line_of(done.stdout, run).startswith("failed"), done.stdout


def test_a_blank_trace_id_does_not_wedge_the_reconciling_read(platform, tmp_path, start_evalpush):
    """F5b: an id of spaces is an id: the listing is not malformed."""
    run = write_run(tmp_path / "out", [trace_line(0, sample_id=" "), *traces(5, start=1)])
    platform.inject("reset", on="samples")
    env = cli_env(platform, tmp_path)

    push = start_evalpush(env, "push", str(run))
    wait_until(
        lambda: push.poll() is not None or requests(platform, "read") >= 1 + STUCK_READS,
        "the push to end or to list again and again",
    )

    assert push.poll() is not None, "still listing the same samples"
    assert [e["duplicates"] for e in evaluations_of(platform)] == [0]


def test_a_huge_number_from_the_platform_is_a_malformed_answer_not_a_traceback(
    platform, hop, tmp_path
):
    """F10: a sample count past SQLite's integer is no count: the first listing says so, is
    retried like any unusable answer, and the next one (a sane count) is used."""
    run = write_run(tmp_path / "out", traces(4))
    env = cli_env(platform, tmp_path)
    assert evalpush(env, "push", str(run)).returncode == 0
    shutil.rmtree(tmp_path / "state")  # the run is new to the ledger: it is looked up
    listings = []

    def huge_counts(method: str, path: str, status: int, body: bytes) -> tuple[int, bytes] | None:
        if not is_evaluation_listing(method, path) or "environment_name=" not in path:
            return None
        listings.append(path)
        if len(listings) > 1:
            return None
        page = json.loads(body)
        for evaluation in page["evaluations"]:
            evaluation["sample_count"] = 10**30
        return status, json.dumps(page).encode()

    via = hop(huge_counts)
    done = evalpush(env, "push", str(run), PRIME_API_BASE_URL=via.base_url)

    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "an answer of another shape" in done.stderr, done.stderr[-2000:]
    assert "sample_count" in done.stderr, done.stderr[-2000:]
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(listings) >= 2
    assert line_of(done.stdout, run), done.stdout


def test_an_odd_evaluation_in_the_listing_does_not_stop_new_runs_of_its_environment(
    platform, hop, tmp_path, start_evalpush
):
    """F11: an evaluation whose id is not a platform id is listed as unusable, not a bad page."""
    run = write_run(tmp_path / "out", traces(4))

    def one_odd_item(method: str, path: str, status: int, body: bytes) -> tuple[int, bytes] | None:
        if not is_evaluation_listing(method, path):
            return None
        page = json.loads(body)
        page["evaluations"].insert(0, {"id": "legacy.eval.7", "metadata": {"run_id": "x"}})
        page["total"] += 1
        return status, json.dumps(page).encode()

    via = hop(one_odd_item)
    push = start_evalpush(
        cli_env(platform, tmp_path, PRIME_API_BASE_URL=via.base_url), "push", str(run)
    )
    wait_until(
        lambda: push.poll() is not None or requests(platform, "read") >= STUCK_READS,
        "the push to end or to list again and again",
    )

    assert push.poll() is not None, "still listing the environment"
    assert push.returncode == 0
    assert_once(platform, 4)


def test_a_trace_file_that_became_unreadable_fails_its_run_alone(platform, open_dir):
    """F12: an unreadable trace file is that run's error alone; a finalized run stays finalized."""
    root = open_dir / "out"
    run = write_run(root, traces(4))
    other = write_run(root, traces(4), run_id=OTHER_RUN_ID)
    env = cli_env(platform, open_dir)
    assert evalpush(env, "push", str(root)).returncode == 0
    for path in [open_dir, *open_dir.rglob("*")]:
        os.chown(path, NOBODY, NOBODY)
    (run / "traces.jsonl").chmod(0)

    def push_as_nobody() -> tuple[Any, str, str]:
        os.environ.clear()
        os.environ.update(env)
        out, err = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code: Any = cli.main(["push", str(root)])
        except BaseException as exc:  # noqa: BLE001 - what escaped is the finding
            code = f"raised {type(exc).__name__}: {exc}"
        return code, out.getvalue(), err.getvalue()

    code, out, err = as_nobody(push_as_nobody)

    assert code == 1, (code, out, err)
    assert "traces.jsonl" in line_of(out, run), out
    assert line_of(out, other).startswith("finalized"), out


# ================================================================ stopping


def test_sigterm_ends_a_push_quickly_while_another_process_holds_the_ledger_lock(
    platform, tmp_path, start_evalpush
):
    """F13: the ledger's waits for a lock are stop-aware."""
    run = write_run(tmp_path / "out", traces(8))
    platform.inject("stall", on="samples", seconds=30)
    push = start_evalpush(cli_env(platform, tmp_path), "push", str(run))
    wait_until(lambda: requests(platform, "samples") >= 1, "the first batch")
    holder = sqlite3.connect(tmp_path / "state" / "state.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        sent = time.monotonic()
        push.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            push.wait(timeout=EXIT_BOUND_SECONDS)
        exited = push.poll() is not None
        if not exited:
            push.kill()
        took = time.monotonic() - sent
    finally:
        holder.execute("ROLLBACK")
        holder.close()

    assert exited, f"still running {took:.1f} s after SIGTERM"


# ================================================================ secrets


def test_upgrading_a_ledger_that_holds_the_key_leaves_no_trace_of_it(platform, tmp_path):
    """F15: push scrubs the stored texts of the key, and the file of stale copies."""
    root = tmp_path / "runs"
    ledger_v1.copy_runs(root)
    path = ledger_v1.build(tmp_path / "state", root)
    db = sqlite3.connect(path, isolation_level=None)
    db.execute(
        "UPDATE set_aside SET reason = ?",
        (f"HTTP 422: refused: you sent Authorization: 'Bearer {SECRET_KEY}'",),
    )
    db.close()
    run = write_run(tmp_path / "out", traces(2))

    done = evalpush(cli_env(platform, tmp_path), "push", str(run))

    assert done.returncode == 0, done.stdout + done.stderr
    leaking = [p.name for p in (tmp_path / "state").iterdir() if key_in(p.read_bytes())]
    assert leaking == []


# ================================================================ messages and tracebacks


def test_overlapping_arguments_to_push_report_each_run_once(platform, tmp_path):
    """F19: a run found twice is pushed and reported once."""
    run = write_run(tmp_path / "out", traces(4))

    done = evalpush(cli_env(platform, tmp_path), "push", str(tmp_path / "out"), str(run))

    assert done.returncode == 0, done.stderr[-2000:]
    assert line_of(done.stdout, run).startswith("finalized")


def test_a_run_key_that_is_not_utf8_is_looked_up_without_a_traceback(platform, tmp_path):
    """F20: a key that is not UTF-8 is matched as a path only."""
    env = cli_env(platform, tmp_path)

    done = evalpush(env, "forget", os.fsdecode(b"runs/odd-\xff-run"), "--yes")

    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.returncode == 2 and "no run" in done.stderr


def test_a_trace_file_replaced_by_a_symlink_mid_upload_is_named_as_such(
    platform, tmp_path, start_evalpush
):
    """F17: what took the trace file's place is named, not called a deletion."""
    run = write_run(tmp_path / "out", traces(8))
    platform.inject("stall", on="samples", seconds=1)
    push = start_evalpush(cli_env(platform, tmp_path), "push", str(run))
    wait_until(lambda: requests(platform, "samples") >= 1, "the first batch")
    os.rename(run / "traces.jsonl", tmp_path / "real.jsonl")
    os.symlink(tmp_path / "real.jsonl", run / "traces.jsonl")

    out, _ = push.communicate(timeout=TIMEOUT_SECONDS)

    line = line_of(out.decode(), run)
    assert "deleted" not in line and "symlink" in line, line
