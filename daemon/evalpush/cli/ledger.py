"""The commands that read or change the ledger: `status`, `retry`, `forget`, `migrate`; and
how a command finds the one run a key names (`find`).

`status` only reads (a missing ledger is said, never created); `retry` and `forget` change a
ledger that is there, through `evalpush.ledger.transitions`; `migrate` upgrades one in place or
moves it into a shared ledger. What the text and JSON look like is `evalpush.cli.report`'s.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from evalpush.cli.parser import EXIT_OK, EXIT_PARTIAL
from evalpush.cli.report import (
    Alive,
    Overview,
    TableLines,
    counts_text,
    daemon_json,
    daemon_text,
    detail_pages,
    detail_text,
    fleet_alive,
    fleet_rows,
    fleet_text,
    latest_text,
    local_daemon,
    mark_paused,
    needs_person_text,
    not_running_text,
    not_shown_text,
    overview,
    pick,
    row_pages,
    run_detail,
    selected,
)
from evalpush.config import Config
from evalpush.config.settings import check_ledger_url
from evalpush.core.errors import EvalpushError, UsageError
from evalpush.core.states import State
from evalpush.core.words import counted
from evalpush.ledger import (
    SCHEMA_VERSION,
    Ledger,
    Process,
    RunRecord,
    default_path,
    held_by,
    holder_alive,
    open_ledger,
    transitions,
    where,
)
from evalpush.ledger.moving import move
from evalpush.ledger.opening import ledger_password
from evalpush.ledger.records import DaemonRecord
from evalpush.ledger.server import display_url
from evalpush.runs import why_not_a_run


def cmd_status(args: argparse.Namespace, config: Config) -> int:
    """Read-only: a missing ledger is said (with its path), never created. Every row (`--all`,
    `--state`, `--json`) is read and printed a page at a time; the default view reads only what
    it shows (`report.overview`). Everything shown is read in one snapshot (`Ledger.snapshot`):
    a run another process writes meanwhile is listed once, as it was, and the counts agree with
    the rows."""
    path = default_path(config.state_dir)
    shared = bool(config.ledger.url)
    shown = where(config)
    if not shared and not os.path.lexists(path):  # no daemon has run here either
        if args.run is not None:
            raise UsageError(f"no run {args.run!r}: there is no ledger at {path} yet")
        if args.daemon and args.json:
            _print_json({"ledger": str(path), "schema": None, "daemon": daemon_json(None, None)})
        elif args.json:
            _print_json([])
        else:
            print(f"no runs: there is no ledger at {path} yet")
            if args.daemon:
                print(not_running_text(None))
        return EXIT_OK
    with open_ledger(config, read_only=True) as ledger, ledger.snapshot():
        view, last = local_daemon(ledger.daemons(), shared=shared)
        fleet = fleet_rows(ledger)
        alive = fleet_alive(ledger) if shared else None
        if args.run is not None:
            detail = run_detail(ledger, find(ledger, args.run, busy_ok=True), alive)
            mark_paused([detail], view)
            _print_json(detail) if args.json else print(detail_text(detail))
            return EXIT_OK
        if args.daemon and args.json:
            document: Any = {
                "ledger": shown,
                "schema": ledger.file_version,
                "daemon": daemon_json(view, last),
                "daemons": fleet,
            }
            _print_json(document)
            return EXIT_OK
        states = args.state
        if args.json:  # each run whose row shows one of the states, in full
            pages = selected(ledger, states=states, limit=args.limit)
            details = (pick(page, states) for page in detail_pages(ledger, pages, alive))
            _stream_json(_paused(details, view))
            return EXIT_OK
        counts = ledger.state_counts()
        total = sum(counts.values())
        print(
            f"ledger:     {shown}: {counted(total, 'run')}"
            + (f": {counts_text(counts)}" if total else "")
        )
        if ledger.file_version != SCHEMA_VERSION:
            print(f"            {upgrade_advice(ledger.file_version)}")
        print(daemon_text(view) if view is not None else not_running_text(last))
        if shared:
            print(fleet_text(fleet))
        if args.daemon:
            return EXIT_OK
        if not total:
            print(f"no runs in the ledger yet ({shown})")
        elif args.all or states or args.limit is not None:
            pages = selected(ledger, states=states, limit=args.limit)
            count = _print_rows(_paused(row_pages(ledger, pages, alive), view), states)
            if states or (args.limit is not None and count >= args.limit):
                print(f"({count} shown; `evalpush status RUN` shows one in full)")
        else:
            _print_overview(ledger, overview(ledger, counts), alive, view)
    return EXIT_OK


def _paused(
    pages: Iterable[list[dict[str, Any]]], view: DaemonRecord | None
) -> Iterator[list[dict[str, Any]]]:
    """Each page of rows, those paused by the running daemon's outage saying so (`mark_paused`)."""
    for rows in pages:
        mark_paused(rows, view)
        yield rows


def _print_rows(pages: Iterable[list[dict[str, Any]]], states: list[str] | None) -> int:
    """The rows that show one of `states` (all without), a page at a time, under one header;
    how many."""
    table, count = TableLines(), 0
    for rows in pages:
        lines = table.lines(pick(rows, states))
        if lines and not count:
            print(table.header())
        count += len(lines)
        if lines:
            print("\n".join(lines))
    return count


def _print_overview(
    ledger: Ledger, view: Overview, alive: Alive | None, daemon: DaemonRecord | None
) -> None:
    """The default view: the runs needing a person, then the others updated last, each section
    a table (the two in the same columns), and what was left out."""
    sections = [
        (needs_person_text(view), view.needs_person),
        (latest_text(view), view.latest),
    ]
    table = TableLines()
    made = []
    for heading, records in sections:
        if heading is None:
            continue
        rows = [row for page in row_pages(ledger, [records], alive) for row in page]
        mark_paused(rows, daemon)
        made.append((heading, table.widen(rows)))
    for heading, cells in made:
        print(heading)
        if cells:
            print(table.header())
            print("\n".join(table.line(c) for c in cells))
    left_out = not_shown_text(view)
    if left_out is not None:
        print(left_out)


def _stream_json(pages: Iterable[list[dict[str, Any]]]) -> None:
    """The JSON list of every object of `pages`, written a page at a time: the same bytes
    `_print_json` writes of the whole list (indented by 2). A ledger error while reading them
    still ends the document whole: its last object is `{"error": what the ledger said}`, and
    the error goes on to the caller (said on stderr, exit 1)."""
    out, first = sys.stdout.buffer, True

    def write(objects: list[Any]) -> None:
        nonlocal first
        # A page's list formatted alone, less its brackets, is its part of the whole list.
        body = msgspec.json.format(msgspec.json.encode(objects), indent=2)
        out.write((b"[\n" if first else b",\n") + body[2:-2])
        first = False

    def end() -> None:
        out.write(b"[]\n" if first else b"\n]\n")
        sys.stdout.flush()

    try:
        for objects in pages:
            if objects:
                write(objects)
    except EvalpushError as exc:
        write([{"error": str(exc)}])
        end()
        raise
    end()


def _print_json(value: Any) -> None:
    sys.stdout.buffer.write(msgspec.json.format(msgspec.json.encode(value), indent=2) + b"\n")
    sys.stdout.flush()


def _existing_ledger(config: Config, key: str) -> Ledger:
    """The ledger `retry` and `forget` change, opened; a UsageError when there is no file
    (they never create one: there is nothing to retry or forget in a ledger that does not
    exist)."""
    if config.ledger.url:
        return open_ledger(config)
    path = default_path(config.state_dir)
    if not os.path.lexists(path):
        raise UsageError(f"no run {key!r}: there is no ledger at {path} yet")
    return Ledger(path)


def upgrade_advice(version: int) -> str:
    """What a reader says of a ledger an older evalpush wrote."""
    return (
        f"schema {version} from an older evalpush, read through a copy; "
        f"`evalpush migrate` upgrades it to {SCHEMA_VERSION} (with a backup)"
    )


def tell_upgrade(ledger: Ledger) -> None:
    """A command that upgraded the ledger on opening it says so on stderr."""
    if ledger.upgrade is not None:
        print(f"evalpush: {ledger.upgrade.message}", file=sys.stderr)


def cmd_migrate(args: argparse.Namespace, config: Config) -> int:
    """Upgrade the ledger in place after a backup beside it (what a daemon or push of this
    version would do by itself at its start), and say what was done. `--to URL`: move it
    into a shared ledger instead (`evalpush.ledger.moving`)."""
    path = default_path(config.state_dir)
    if args.to is not None:
        return _move_to_shared(path, args.to, config)
    if not config.ledger.url and not os.path.lexists(path):
        print(f"no ledger at {path}: nothing to upgrade (the first push or run creates one)")
        return EXIT_OK
    with open_ledger(config) as ledger:  # opening it to write upgrades it (a shared one too)
        upgrade = ledger.upgrade
    print(
        f"ledger {ledger.where} is at schema {SCHEMA_VERSION}, this evalpush's: nothing to do"
        if upgrade is None
        else upgrade.message
    )
    return EXIT_OK


def _move_to_shared(path: Path, url: str, config: Config) -> int:
    if not url:
        raise UsageError("migrate --to: give the shared ledger's postgresql:// URL")
    try:
        check_ledger_url(url)
    except ValueError as exc:
        raise UsageError(f"migrate --to: {exc}") from None
    if not os.path.lexists(path):
        raise UsageError(f"no ledger at {path}: nothing to move")
    running = live_daemon(config, file=True)
    if running is not None:
        # It would go on writing the file while its runs are copied: two ledgers diverging.
        print(
            f"evalpush migrate --to: the daemon (pid {running}) runs on this state dir "
            f"({config.state_dir}) and writes {path}: stop it first (systemctl stop evalpush), "
            "then migrate, set [ledger] url and start it again",
            file=sys.stderr,
        )
        return EXIT_PARTIAL
    with Ledger(path) as source, Ledger.shared(url, password=ledger_password(config)) as target:
        tell_upgrade(source)
        moved = move(source, target)
    print(f"moved {path} into {display_url(url)}: {moved.message}")
    print(
        f"next: set [ledger] url = {display_url(url)!r} on this host and restart the daemon; "
        f"{path} is left as it was (keep it as a backup)"
    )
    return EXIT_OK


def cmd_retry(args: argparse.Namespace, config: Config) -> int:
    if (args.run is None) == (not args.all_failed):
        raise UsageError("retry takes a RUN or --all-failed (not both)")
    with _existing_ledger(config, args.run or "--all-failed") as ledger:
        tell_upgrade(ledger)
        if args.all_failed:
            failed = ledger.in_state(State.FAILED)
            for record in failed:
                transitions.requeue(ledger, record)
                print(f"queued {record.run_id} ({record.path})")
            print(f"{counted(len(failed), 'failed run')} queued")
            return EXIT_OK
        record = find(ledger, args.run)
        if record.state not in (State.FAILED, State.HELD):
            print(
                f"evalpush retry: run {record.run_id} is {record.state}; only failed or held "
                "runs are retried",
                file=sys.stderr,
            )
            return EXIT_PARTIAL
        transitions.requeue(ledger, record)
    print(f"queued {record.run_id} ({record.path})")
    return EXIT_OK


def cmd_forget(args: argparse.Namespace, config: Config) -> int:
    with _existing_ledger(config, args.run) as ledger:
        tell_upgrade(ledger)
        record = find(ledger, args.run)
        if record.evaluation_id is not None and not args.yes and not _confirm_forget(record):
            return EXIT_PARTIAL
        ledger.forget(record)
    print(f"forgot {record.run_id} ({record.path})")
    return EXIT_OK


def _confirm_forget(record: RunRecord) -> bool:
    """Say what forgetting a run with an evaluation costs; ask on a terminal, refuse without."""
    what = "finalized" if record.state == State.FINALIZED else "open"
    print(
        f"evalpush forget: run {record.run_id} has a {what} evaluation on the platform "
        f"({record.viewer_url or record.evaluation_id}). After forgetting it, the next push "
        "uploads the run again as a SECOND evaluation"
        + ("" if what == "finalized" else ", and this one stays open")
        + ".",
        file=sys.stderr,
    )
    if not sys.stdin.isatty():
        print("evalpush forget: pass --yes to forget it anyway", file=sys.stderr)
        return False
    answer = input("Forget it? [y/N] ")
    return answer.strip().lower() in ("y", "yes")


def find(ledger: Ledger, key: str, *, busy_ok: bool = False) -> RunRecord:
    """The one run `key` names (a path, a run id or a prefix of one), else a `UsageError`
    saying why: no key, no such run, or which runs an ambiguous prefix could mean. A run
    another live process holds is `Busy`, unless `busy_ok` (to read it)."""
    if not key:
        raise UsageError("an empty run key names no run: give a run id, a prefix or a path")
    path = Path(key)
    found = ledger.match(str(path.resolve())) if path.exists() else []
    found = found or ledger.match(key)
    if not found:
        why = why_not_a_run(path) if path.is_dir() else None
        raise UsageError(
            f"no run {key!r} in the ledger (see `evalpush status`)" + (f": {why}" if why else "")
        )
    if len(found) > 1:
        candidates = "\n".join(f"  {r.run_id}  {r.path}" for r in found)
        raise UsageError(f"{key!r} could be any of {len(found)} runs:\n{candidates}")
    record = found[0]
    holder = record.holder
    if not busy_ok and holder is not None and holder_alive(holder, Process.current(), time.time()):
        raise held_by(
            holder,
            f"run {record.run_id} is being uploaded by {holder.describe()}: try again once it is "
            "done",
        )
    return record


def live_daemon(config: Config, *, file: bool = False) -> int | None:
    """The pid of this host's daemon that runs now, judged as `status` judges it from its row
    in the ledger `config` names (with `file`: the state dir's file), or None."""
    path = default_path(config.state_dir)
    shared = bool(config.ledger.url) and not file
    if not shared and not os.path.lexists(path):
        return None
    try:
        opened = open_ledger(config, read_only=True) if shared else Ledger.for_reading(path)
        with opened as ledger:
            running, _ = local_daemon(ledger.daemons(), shared=shared)
    except EvalpushError:
        return None
    return None if running is None else running.pid
