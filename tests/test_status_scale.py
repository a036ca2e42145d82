"""`status` on a ledger of many runs, through the real CLI on both stores (the `ledger`
fixture): the default view (how many runs are in each state, every run that needs a person,
only the runs updated last of the rest and how many more there are), `--all` (every row),
`--json` (every run, one document written a page at a time), and `--state` (a state's runs read
a page at a time through its index). The ledgers are built with the ledger's own writes, not by
uploading; the reads are made to page every few runs so that many pages are crossed."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from evalpush.cli.parser import EXIT_PARTIAL
from evalpush.cli.report import LATEST_SHOWN
from evalpush.core.ids import short_id
from evalpush.core.setaside import SetAside
from evalpush.core.states import HistoryOutcome, SetAsideKind, State
from evalpush.ledger import Ledger, RunRecord, default_path, reads, transitions
from support.commands import COMMAND_SECONDS, evalpush
from support.environ import clean_environ
from support.postgres import PASSWORD, Cluster

FINALIZED = LATEST_SHOWN + 25
"""Finalized runs with nothing to look at: more than the default view lists."""
PAGE = 7
"""Runs a page of the ledger's reads holds in these tests: many pages, each crossed."""


@pytest.fixture(autouse=True)
def small_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reads, "PAGE_RUNS", PAGE)


def run_id(n: int) -> str:
    return f"{n:08d}-0000-4000-8000-000000000000"


class Built:
    """A ledger of many finalized runs and a few that need a person (each kind's run ids)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.count = 0
        self.needing: dict[str, list[str]] = {}
        # Those needing a person are written first: the default view lists every one of them,
        # however long ago they were updated.
        failed = [self.add(State.READY) for _ in range(2)]
        for record in failed:
            transitions.fail(ledger, record, "config.toml: no environment name")
        held = self.add(State.READY)
        transitions.hold(ledger, held, "2 bad lines set aside", expected_traces=4)
        partial = self.finalized(expected=40, seen=30)
        aside = self.finalized(expected=4, seen=4)
        ledger.add_set_aside(aside, [SetAside(2, 10, 5, SetAsideKind.BAD_LINE, "invalid JSON")])
        waiting = self.add(State.WAITING, reason="waiting for 4 traces (1 so far)")
        ready = self.add(State.READY)
        self.needing = {
            "failed": [r.run_id for r in failed],
            "held": [held.run_id],
            "partial": [partial.run_id],
            "set aside": [aside.run_id],
            "waiting": [waiting.run_id],
            "ready": [ready.run_id],
        }
        # One finalized run had an earlier evaluation, superseded.
        again = self.finalized(expected=4, seen=4)
        again = ledger.restart(again, outcome=HistoryOutcome.SUPERSEDED, state=State.READY)
        transitions.finalize(
            ledger, again, at=1.0, evaluation_id="eval-again", samples_sent=4, samples_seen=4
        )
        self.superseded = again.run_id
        self.done = [again.run_id] + [
            self.finalized(expected=4, seen=4).run_id for _ in range(FINALIZED - 1)
        ]
        """The runs with nothing to look at, the one updated last at the end."""

    def add(self, state: State, reason: str = ""):
        self.count += 1
        path = f"/srv/evals/outputs/{run_id(self.count)}"
        return self.ledger.add(
            path=path, run_id=run_id(self.count), kind="eval", state=state, reason=reason
        )

    def finalized(self, *, expected: int, seen: int):
        record = self.add(State.READY)
        return transitions.finalize(
            self.ledger,
            record,
            at=1.0,
            evaluation_id=f"eval-{record.run_id}",
            samples_sent=seen,
            samples_seen=seen,
            expected_traces=expected,
        )

    @property
    def needing_ids(self) -> set[str]:
        return {run for runs in self.needing.values() for run in runs}


def environ_for(ledger: Ledger, tmp_path: Path) -> dict[str, str]:
    """`evalpush`'s environment pointed at `ledger` (its state dir, or its database)."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    if ledger.server is None:
        assert ledger.path is not None
        return clean_environ(HOME=str(home), EVALPUSH_STATE_DIR=str(ledger.path.parent))
    password_file = tmp_path / "pw"
    password_file.write_text(PASSWORD)
    return clean_environ(
        HOME=str(home),
        EVALPUSH_STATE_DIR=str(tmp_path / "state"),
        EVALPUSH_LEDGER__URL=ledger.server.url,
        EVALPUSH_LEDGER__PASSWORD_FILE=str(password_file),
    )


def rows(stdout: str) -> list[list[str]]:
    """The table's rows: (run, state) of each."""
    return [line.split()[:2] for line in stdout.splitlines() if re.match(r"^[0-9]{8}  ", line)]


def sections(stdout: str) -> dict[str, list[str]]:
    """The default view's run ids (as shown, short) by section: `needs`, `latest`."""
    found: dict[str, list[str]] = {"needs": [], "latest": []}
    section = None
    for line in stdout.splitlines():
        if line.startswith("needs a person:"):
            section = "needs"
        elif line.startswith("latest:"):
            section = "latest"
        elif section and re.match(r"^[0-9]{8}  ", line):
            found[section].append(line.split()[0])
    return found


def test_the_default_view_counts_every_state_lists_every_run_needing_a_person_and_only_the_latest_others(
    ledger: Ledger, tmp_path: Path
) -> None:
    built = Built(ledger)
    environ = environ_for(ledger, tmp_path)

    done = evalpush(environ, "status")

    assert done.returncode == 0, done.stderr
    out = done.stdout
    total = built.count
    assert (
        f"{total} runs: 1 waiting, 1 ready, {FINALIZED + 2} finalized, 2 failed, 1 held" in out
    ), out
    assert (
        "needs a person: 7 runs (1 waiting, 1 ready, 2 failed, 1 held, 1 partial, "
        "1 with records set aside)"
    ) in out
    shown = sections(out)
    assert sorted(shown["needs"]) == sorted(short_id(r) for r in built.needing_ids)
    latest = [short_id(r) for r in built.done[-LATEST_SHOWN:]]
    assert sorted(shown["latest"]) == sorted(latest)
    assert f"latest: {LATEST_SHOWN} of {FINALIZED} other runs, the ones updated last:" in out
    assert f"({FINALIZED - LATEST_SHOWN} more not shown: `evalpush status --all`" in out
    assert "PARTIAL: 10 of 40 expected traces missing" in out
    assert "superseded" not in out, "the run's earlier evaluation is not among the latest"


def test_status_all_shows_every_row_and_json_every_run_as_one_document(
    ledger: Ledger, tmp_path: Path
) -> None:
    built = Built(ledger)
    environ = environ_for(ledger, tmp_path)

    table = evalpush(environ, "status", "--all")
    listed = evalpush(environ, "status", "--json")

    assert (table.returncode, listed.returncode) == (0, 0), table.stderr + listed.stderr
    shown = rows(table.stdout)
    assert len(shown) == built.count + 1, "every run, and the superseded evaluation"
    assert [r[0] for r in shown if r[1] != State.SUPERSEDED] == [
        short_id(run_id(n)) for n in range(1, built.count + 1)
    ], "in ledger order"
    assert [r[0] for r in shown if r[1] == State.SUPERSEDED] == [short_id(built.superseded)]
    assert table.stdout.count("RUN       STATE") == 1, "one header, however many pages"
    document = json.loads(listed.stdout)
    assert [run["run_id"] for run in document] == [run_id(n) for n in range(1, built.count + 1)]
    by_id = {run["run_id"]: run for run in document}
    (aside,) = built.needing["set aside"]
    assert [r["reason"] for r in by_id[aside]["set_aside_records"]] == ["invalid JSON"]
    assert [e["outcome"] for e in by_id[built.superseded]["evaluations"]] == [
        "superseded",
        "current",
    ]
    whole = msgspec.json.format(msgspec.json.encode(document), indent=2) + b"\n"
    assert listed.stdout.encode() == whole, "the pages written make the document whole"


def test_state_and_limit_select_through_the_pages_as_before(ledger: Ledger, tmp_path: Path) -> None:
    built = Built(ledger)
    environ = environ_for(ledger, tmp_path)

    finalized = evalpush(environ, "status", "--state", "finalized", "--json")
    failed = evalpush(environ, "status", "--state", "failed")
    superseded = evalpush(environ, "status", "--state", "superseded")
    newest = evalpush(environ, "status", "--limit", "3", "--json")

    ids = {run["run_id"] for run in json.loads(finalized.stdout)}
    assert ids == set(built.done) | set(built.needing["partial"] + built.needing["set aside"])
    assert rows(failed.stdout) == [[short_id(r), "failed"] for r in built.needing["failed"]]
    assert failed.stdout.splitlines()[-1].startswith("(2 shown;")
    assert rows(superseded.stdout) == [[short_id(built.superseded), "superseded"]]
    assert [run["run_id"] for run in json.loads(newest.stdout)] == built.done[-3:]


def test_an_empty_ledger_says_so_and_lists_nothing(ledger: Ledger, tmp_path: Path) -> None:
    environ = environ_for(ledger, tmp_path)

    text = evalpush(environ, "status")
    listed = evalpush(environ, "status", "--json")

    assert "0 runs" in text.stdout and "no runs in the ledger yet" in text.stdout
    assert listed.stdout == "[]\n"


def test_a_row_the_file_cannot_decode_ends_status_json_with_an_error_naming_the_ledger(
    tmp_path: Path,
) -> None:
    """A TEXT value that is not UTF-8 (a foreign tool's write, a damaged page) on a later page:
    the rows before it are out already; `status --json` ends the document whole, its last object
    the error naming the file, said on stderr too, with exit 1, not a traceback (SQLite's module
    raises that error with no SQLite code)."""
    import sqlite3

    from evalpush.ledger import default_path

    path = default_path(tmp_path / "state")
    with Ledger(path) as ledger:
        for n in range(1, PAGE * 3):
            ledger.add(path=f"/srv/runs/{n}", run_id=run_id(n), kind="eval", state=State.READY)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE runs SET reason = CAST(x'ff41' AS TEXT) WHERE id = ?", (PAGE + 2,))
    environ = clean_environ(HOME=str(tmp_path), EVALPUSH_STATE_DIR=str(path.parent))

    done = evalpush(environ, "status", "--json")

    assert done.returncode == EXIT_PARTIAL and "Traceback" not in done.stderr, done.stderr
    assert str(path) in done.stderr and "cannot read the ledger" in done.stderr, done.stderr
    *listed, last = json.loads(done.stdout)
    assert [run["run_id"] for run in listed] == [run_id(n) for n in range(1, PAGE + 1)]
    assert str(path) in last["error"] and "cannot read the ledger" in last["error"], last


@pytest.mark.parametrize("limit", ["0", "-3", "many"])
def test_a_limit_that_is_not_a_count_is_a_usage_error(limit: str, tmp_path: Path) -> None:
    environ = clean_environ(HOME=str(tmp_path), EVALPUSH_STATE_DIR=str(tmp_path / "state"))

    done = evalpush(environ, "status", f"--limit={limit}")

    assert done.returncode == 2 and "--limit" in done.stderr and limit in done.stderr, done


def test_the_table_shows_control_characters_of_a_run_id_or_reason_escaped(tmp_path: Path) -> None:
    """An escape sequence in a run id or a reason (written by whatever wrote the ledger or the
    run's lines) would drive the terminal the table is printed to."""
    from evalpush.ledger import default_path

    path = default_path(tmp_path / "state")
    with Ledger(path) as ledger:
        ledger.add(path="/srv/runs/a", run_id="run-\x1b]0;owned\x07", kind="eval", state="ready")
        ledger.add(
            path="/srv/runs/b",
            run_id=run_id(2),
            kind="eval",
            state=State.WAITING,
            reason="waiting \x1b[2J\x1b[31m",
        )
    environ = clean_environ(HOME=str(tmp_path), EVALPUSH_STATE_DIR=str(path.parent))

    for args in (["status"], ["status", "--all"]):
        done = evalpush(environ, *args)

        assert done.returncode == 0, done.stderr
        assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", done.stdout), repr(done.stdout)
        assert "\\x1b[2J" in done.stdout, done.stdout


PAGED_STATUS = """
import sys
from evalpush.ledger import reads
reads.PAGE_RUNS = int(sys.argv[1])
from evalpush.cli import main
sys.exit(main(sys.argv[2:]))
"""
"""`evalpush ARGS` as a process whose reads page every few runs (the `small_pages` of a process)."""


@contextlib.contextmanager
def paged_status(environ: dict[str, str], *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """`evalpush status ARGS` started as a process reading `PAGE` runs a page, its output a pipe
    of one memory page: once the test has read its first byte (the first page of runs was
    read), it writes a few runs' JSON at most and waits for the test to read on, its listing
    half done and its later pages not read yet."""
    process = subprocess.Popen(
        [sys.executable, "-c", PAGED_STATUS, str(PAGE), "status", *args],
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        fcntl.fcntl(process.stdout.fileno(), fcntl.F_SETPIPE_SZ, os.sysconf("SC_PAGE_SIZE"))
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()


LISTED = PAGE * 10
"""Runs in the ledger when a listing starts: more than the listing's output a pipe holds."""


def finalized_runs(ledger: Ledger, numbers: range) -> list[RunRecord]:
    """Finalized runs, each 4 samples seen."""
    made = []
    for n in numbers:
        record = ledger.add(path=f"/srv/runs/{n}", run_id=run_id(n), kind="eval", state=State.READY)
        made.append(
            transitions.finalize(
                ledger, record, at=1.0, evaluation_id=f"eval-{n}", samples_sent=4, samples_seen=4
            )
        )
    return made


@pytest.mark.parametrize(
    "args", [["--state", "finalized", "--json"], ["--json"]], ids=["state", "all"]
)
def test_a_listing_while_another_process_updates_and_adds_runs_shows_each_run_once_as_it_was(
    ledger: Ledger, tmp_path: Path, args: list[str]
) -> None:
    """`--state` pages by (updated_at, id): a run updated after its page was printed moves past
    the pages read, and would be listed again; `--json` pages by id: a run added would be
    listed, and the runs of the later pages read as updated. Read in one snapshot, the listing
    is the ledger as it was when it began."""
    listed = finalized_runs(ledger, range(1, LISTED + 1))

    with paged_status(environ_for(ledger, tmp_path), *args) as status:
        assert status.stdout is not None
        first = os.read(status.stdout.fileno(), 1)
        for record in listed:  # each moved to the end of its state's order
            ledger.update(ledger.get(record.id), samples_seen=5)
        finalized_runs(ledger, range(LISTED + 1, LISTED + PAGE + 1))
        if ledger.path is not None:  # the file: its log moved into it meanwhile, as far as it may
            with sqlite3.connect(ledger.path) as checkpointer:
                checkpointer.execute("PRAGMA wal_checkpoint(PASSIVE)")
        out, err = status.communicate(timeout=COMMAND_SECONDS)

    assert status.returncode == 0, err.decode()
    document = json.loads(first + out)
    assert sorted(run["run_id"] for run in document) == [r.run_id for r in listed]
    assert {run["samples_seen"] for run in document} == {4}, "each as it was when it began"


def test_a_shared_ledger_stopping_mid_listing_ends_status_json_whole_with_the_error(
    postgres: Cluster, pg_url: str, tmp_path: Path
) -> None:
    with Ledger.shared(pg_url, password=PASSWORD) as ledger:
        listed = finalized_runs(ledger, range(1, LISTED + 1))
        environ = environ_for(ledger, tmp_path)

    with paged_status(environ, "--json") as status:
        assert status.stdout is not None
        first = os.read(status.stdout.fileno(), 1)
        postgres.stop()
        try:
            out, err = status.communicate(timeout=COMMAND_SECONDS)
        finally:
            postgres.pg_ctl("start", "-w", "-l", str(postgres.root / "log"))

    assert status.returncode == EXIT_PARTIAL, err.decode()
    *runs, last = json.loads(first + out)
    assert 0 < len(runs) < LISTED
    assert [run["run_id"] for run in runs] == [r.run_id for r in listed[: len(runs)]]
    assert "the shared ledger cannot be reached" in last["error"], last
    assert last["error"] in err.decode() and "Traceback" not in err.decode()


def test_a_listing_of_a_file_no_process_had_open_keeps_reading_it_as_it_was_when_a_writer_comes(
    tmp_path: Path,
) -> None:
    """No process had the file open: `status` reads it as immutable, without locks. A writer
    opening it meanwhile commits to its log, not the file: the listing goes on reading the file
    as it was (before, a read after a writer came was read again through its log)."""
    path = default_path(tmp_path / "state")
    with Ledger(path) as ledger:
        listed = finalized_runs(ledger, range(1, LISTED + 1))
    environ = clean_environ(HOME=str(tmp_path), EVALPUSH_STATE_DIR=str(path.parent))

    with paged_status(environ, "--state", "finalized", "--json") as status:
        assert status.stdout is not None
        first = os.read(status.stdout.fileno(), 1)  # the file read as immutable: no writer yet
        with Ledger(path) as ledger:
            for record in listed:
                ledger.update(ledger.get(record.id), samples_seen=5)
        out, err = status.communicate(timeout=COMMAND_SECONDS)

    assert status.returncode == 0, err.decode()
    document = json.loads(first + out)
    assert sorted(run["run_id"] for run in document) == [r.run_id for r in listed]
    assert {run["samples_seen"] for run in document} == {4}


def test_a_checkpoint_into_the_file_under_an_immutable_listing_ends_it_with_an_error(
    tmp_path: Path,
) -> None:
    """A writer's checkpoint moves its commits into the file that a reader without locks is
    reading: what it reads after may be half of each. The listing ends there, whole, with the
    error, and exit 1."""
    path = default_path(tmp_path / "state")
    with Ledger(path) as ledger:
        listed = finalized_runs(ledger, range(1, LISTED + 1))
    environ = clean_environ(HOME=str(tmp_path), EVALPUSH_STATE_DIR=str(path.parent))

    with paged_status(environ, "--json") as status:
        assert status.stdout is not None
        first = os.read(status.stdout.fileno(), 1)  # the file read as immutable: no writer yet
        with Ledger(path) as ledger:
            for record in listed:
                ledger.update(ledger.get(record.id), samples_seen=5)
            with sqlite3.connect(path) as checkpointer:
                checkpointer.execute("PRAGMA wal_checkpoint(PASSIVE)")
        out, err = status.communicate(timeout=COMMAND_SECONDS)

    assert status.returncode == EXIT_PARTIAL, err.decode()
    *runs, last = json.loads(first + out)
    assert 0 < len(runs) < LISTED and {run["samples_seen"] for run in runs} == {4}
    assert "rewrote the file under this read" in last["error"], last
