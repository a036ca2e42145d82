"""The `evalpush` command: one entry point, one subcommand per job.

Exit codes: each subcommand's own (`COMMAND_EXIT_CODES`, shown by its `--help`; the top-level
help sums them up in `EXIT_CODES`, and so does the README's table). For `push`: 0 every run finalized; 1 some run
failed, is held, had records set aside, or is busy elsewhere; 2 the command line, the
configuration or the credentials are wrong (no key, or the platform refused it: checked once,
before anything is sent, and said in one line); 3 no eval run found; 4 every run done, but some
uploaded partial (short of the traces its config expects); 124 `push --timeout` ran
out; 128 + the signal (130 SIGINT, 143 SIGTERM) when `push` was stopped by one; 141 (every
command) the output's reader went away. Progress is kept in the ledger in every case: the next
push goes on from there.
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import gc
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import IO, TYPE_CHECKING, Any

import msgspec

from evalpush import __version__
from evalpush.config import Config, load_config
from evalpush.core.errors import (
    AuthError,
    CertificateError,
    ConfigError,
    EvalpushError,
    RunError,
    UsageError,
)
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
    refuse_uncreatable,
    where,
)
from evalpush.log import scrubbed_output

if TYPE_CHECKING:
    from evalpush.runs import Line

EXIT_OK, EXIT_PARTIAL, EXIT_USAGE = 0, 1, 2
EXIT_TIMEOUT = 124
"""`push --timeout` ran out: what `timeout(1)` exits with, so a script tells "out of time, push
again to go on" from "some run needs a person" (1) without parsing the output."""
EXIT_SIGNAL_BASE = 128
"""A push stopped by signal N exits 128 + N (130 SIGINT, 143 SIGTERM), as a shell reports it."""
EXIT_BROKEN_PIPE = EXIT_SIGNAL_BASE + signal.SIGPIPE
"""141: the output's reader went away (`evalpush status | head -1`), as SIGPIPE would exit."""

EXIT_NO_RUN = 3
"""`push` found no eval run under the directories it was given: nothing was sent. Not 2 (the
command line is fine) nor 1 (no run needs a person): a script pushing a directory its eval
may not have written tells "nothing there" from both."""

EXIT_UPLOADED_PARTIAL = 4
"""`push` uploaded every run, but some short of the traces its config expects (an eval that
crashed): nothing needs a person now (not 1), but the platform does not hold the whole run (not
0). Resuming the eval into the same directory and pushing again supersedes it."""

_STOPPED = "  130  stopped by SIGINT (Ctrl-C)\n"
_PIPE = "  141  the output's reader went away (`evalpush ... | head -1`): a quiet exit\n"
_USAGE = "  2    usage or configuration: a bad flag, key or value (one line says which)\n"

EXIT_CODES = (
    """exit codes:
  0    done (push: every run finalized, or skipped, or finalized before)
  1    push: some run failed, is held, had records set aside, or is being uploaded by
       another process (push --no-wait); check: the ledger, the platform or a watched root
       cannot be used; status, retry, forget, migrate: the ledger cannot be used
  2    usage, configuration or credentials: no API key, the platform refused it, or
       its TLS certificate failed verification (checked once before anything is sent;
       one line says which)
  3    push: no eval run found under the directories given
  4    push: every run uploaded, but some partial (fewer traces than its config expects)
  124  push --timeout ran out; progress is kept, push again to go on
  130  stopped by SIGINT (Ctrl-C), 143 by SIGTERM; progress is kept, push again to go on
"""
    + _PIPE
    + "  (each command's --help says its own)\n"
)
"""The top-level help's summary of every command's exit codes."""

COMMAND_EXIT_CODES = {
    "convert": "  0    every line converted, and the run names its environment\n"
    "  1    some line was set aside, or the run names no environment (stderr says which)\n"
    "  2    usage or configuration, or the directory is not a run that can be read\n"
    + _STOPPED
    + _PIPE,
    "push": """  0    every run finalized (or skipped, or finalized before)
  1    some run failed, is held, had records set aside, or is being uploaded by another
       process (--no-wait)
  2    usage, configuration or credentials: no API key, the platform refused it, or
       its TLS certificate failed verification (checked once before anything is sent;
       one line says which)
  3    no eval run found under the directories given: nothing was sent (one line says
       what was found there, and why it is not a run)
  4    every run uploaded (or nothing to do), but some partial: fewer traces than its
       config.toml expects (its line says PARTIAL and how many are missing)
  124  --timeout ran out; progress is kept, push again to go on
  130  stopped by SIGINT (Ctrl-C), 143 by SIGTERM; progress is kept, push again to go on
"""
    + _PIPE,
    "run": "  0    stopped by SIGTERM or SIGINT: the normal way to stop the daemon\n"
    "  1    an error it cannot go on from (an unusable ledger): the last line says which\n"
    "  2    configuration: a bad key or value, a relative watch root (one line says which)\n",
    "status": "  0    shown (no ledger yet included: it says so)\n"
    "  1    the ledger cannot be read (the message says why, and the fix)\n"
    "  2    usage or configuration: a bad flag, key or value, a RUN the ledger does not know\n"
    + _STOPPED
    + _PIPE,
    "retry": "  0    queued\n"
    "  1    the run is not failed or held, or another process is uploading it; or the\n"
    "       ledger cannot be written\n"
    "  2    usage or configuration: neither RUN nor --all-failed, a RUN the ledger does not\n"
    "       know, a bad key or value\n" + _STOPPED + _PIPE,
    "forget": "  0    forgotten\n"
    "  1    not forgotten: the run has an evaluation and --yes was not given (nor yes\n"
    "       answered), or another process is uploading it; or the ledger cannot be written\n"
    "  2    usage or configuration: a RUN the ledger does not know, a bad key or value\n"
    + _STOPPED
    + _PIPE,
    "check": "  0    every check passed (or was skipped)\n"
    "  1    the ledger, the platform or a watched root cannot be used\n"
    "  2    the configuration or the credentials are wrong (the platform refusing the key\n"
    "       included), or a watch root is relative\n" + _STOPPED + _PIPE,
    "migrate": "  0    upgraded, nothing to do, or (--to) moved\n"
    "  1    the ledger cannot be read or written; --to: a process on this host still holds\n"
    "       a run, or the shared ledger cannot be used\n"
    "  2    usage or configuration: a --to URL that is not postgresql:// or holds a password,\n"
    "       no ledger to move, a bad key or value\n" + _STOPPED + _PIPE,
    "demo": "  0    every demo run settled (with --keep: then Ctrl-C)\n"
    "  1    not every demo run settled in time: the table says where each one stands\n"
    + _STOPPED
    + _PIPE,
    "local-platform": "  0    stopped by SIGTERM or SIGINT\n" + _USAGE,
}
"""Each subcommand's exit codes, shown by its `--help`."""


_DURATION = re.compile(
    r"(?:(?P<h>\d+(?:\.\d+)?)h)?(?:(?P<m>\d+(?:\.\d+)?)m)?(?:(?P<s>\d+(?:\.\d+)?)s?)?"
)


def parse_duration(text: str) -> float:
    """`90s`, `5m`, `1h30m`, or plain seconds (`90`), as seconds; argparse's type for it."""
    match = _DURATION.fullmatch(text.strip())
    if not text.strip() or match is None or not any(match.groups()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (e.g. 90s, 5m, 1h30m)")
    hours, minutes, seconds = (float(match[unit] or 0) for unit in "hms")
    total = hours * 3600 + minutes * 60 + seconds
    if total <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a timeout must be longer than 0")
    return total


def _global_flags(parser: argparse.ArgumentParser, *, default: Any, state_dir: bool = True) -> None:
    """`--config` and `--state-dir`, accepted before the subcommand and after it. On the
    subcommands they default to SUPPRESS, so one given before the subcommand is not reset; a
    subcommand that uses no ledger of the user's (`convert`, `demo`, `local-platform`) offers
    no `--state-dir`."""
    parser.add_argument(
        "--config",
        type=Path,
        default=default,
        help="config file (TOML); default $EVALPUSH_CONFIG",
    )
    if state_dir:
        parser.add_argument(
            "--state-dir", type=Path, default=default, help="where the ledger lives"
        )


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """argparse's, given its width as `shutil.get_terminal_size` finds it: argparse would import
    `shutil` (and with it bz2 and lzma, ~7 ms) for every parser built, help printed or not."""

    def __init__(self, prog: str) -> None:
        try:
            columns = int(os.environ.get("COLUMNS", "0"))
        except ValueError:
            columns = 0
        if columns <= 0:
            try:
                columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
            except (AttributeError, ValueError, OSError):
                columns = 80
        super().__init__(prog, width=columns - 2)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="evalpush",
        description="Upload verifiers eval runs to the platform, exactly once.",
        epilog=EXIT_CODES,
        formatter_class=_HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"evalpush {__version__}")
    _global_flags(parser, default=None)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str, *, state_dir: bool = True) -> argparse.ArgumentParser:
        p = sub.add_parser(
            name,
            help=help,
            description=help,
            epilog="exit codes:\n" + COMMAND_EXIT_CODES[name],
            formatter_class=_HelpFormatter,
        )
        _global_flags(p, default=argparse.SUPPRESS, state_dir=state_dir)
        return p

    p = command("convert", "print a run's samples as JSON lines (no network)", state_dir=False)
    p.add_argument("dir", type=Path, help="the run directory")

    p = command("push", "upload the given run dirs (or roots holding them) now")
    p.add_argument(
        "dirs",
        type=Path,
        nargs="+",
        metavar="DIR",
        help="a run directory, or a directory holding runs at any depth (symlinks not followed)",
    )
    p.add_argument(
        "--no-wait",
        action="store_true",
        help="do not wait for runs another process is uploading: report them and exit 1",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help='one JSON document on stdout: {"results": [one object per run]}',
    )
    p.add_argument(
        "--partial",
        choices=("upload", "hold"),
        help="a run with fewer traces than its config expects: upload it as partial (exit 4) "
        "or hold it for a person; overrides runs.on_incomplete for this push",
    )
    p.add_argument(
        "--timeout",
        type=parse_duration,
        metavar="DURATION",
        help="stop cleanly after DURATION (e.g. 90s, 5m, 1h): progress is kept; exit 124",
    )

    command("run", "the daemon: watch watch.roots and upload each run once it is finished")

    p = command("status", "every run the ledger knows and how far it got, or one run in full")
    p.add_argument(
        "run",
        metavar="RUN",
        nargs="?",
        help="one run in full: run id (or a unique prefix) or path",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="JSON instead of text: a list of one object per run; one object with RUN",
    )
    p.add_argument(
        "--daemon",
        action="store_true",
        help='only the ledger and the daemon\'s view (with --json: {"ledger", "schema", "daemon"})',
    )
    p.add_argument(
        "--state",
        action="append",
        choices=[str(s) for s in State],
        metavar="STATE",
        help="only runs in STATE (again for more): " + ", ".join(str(s) for s in State),
    )
    p.add_argument(
        "--limit", type=int, metavar="N", help="only the N runs updated last (the newest)"
    )

    p = command("retry", "put a failed or held run back in the queue")
    p.add_argument("run", metavar="RUN", nargs="?", help="run id (or a unique prefix) or path")
    p.add_argument("--all-failed", action="store_true", help="every failed run")

    p = command("forget", "drop a run from the ledger (it will be seen as new)")
    p.add_argument("run", metavar="RUN", help="run id (or a unique prefix) or path")
    p.add_argument(
        "--yes",
        action="store_true",
        help="forget a run that has an evaluation (the next push creates a second one)",
    )

    command("check", "check config, ledger, credentials and the platform: one row each")

    p = command("migrate", "upgrade the ledger from an older evalpush, keeping a backup of it")
    p.add_argument(
        "--to",
        metavar="URL",
        help="move this host's ledger (state.db) into the shared ledger at this PostgreSQL URL "
        "(a fleet's: docs/FLEET.md); finalized runs stay finalized, nothing is uploaded again",
    )

    p = command(
        "demo", "the main job on an embedded default: local platform, sample runs", state_dir=False
    )
    p.add_argument("--dir", type=Path, default=None, help="scratch dir (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the local platform up until Ctrl-C")

    p = command("local-platform", "serve the local stand-in of the platform", state_dir=False)
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1; clients send keys in plain http only "
        "to a loopback address)",
    )
    p.add_argument("--port", type=int, default=8700, help="port to listen on (default 8700)")
    p.add_argument("--api-key", default=None, help="bearer key to require (default: any)")
    p.add_argument("--db", type=Path, default=None, help="SQLite file (default: in memory)")
    return parser


def _load(args: argparse.Namespace) -> Config:
    flags = {"state": {"dir": args.state_dir}} if args.state_dir else None
    return load_config(args.config, flags=flags)


def cmd_convert(args: argparse.Namespace, config: Config) -> int:
    gc.freeze()  # as in cmd_push: what is loaded by now is never garbage
    try:
        report = _convert_to_streams(args.dir, config, sys.stdout.buffer, sys.stderr.buffer)
    except RunError as exc:
        print(f"evalpush: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_PARTIAL if report["set_aside"] or not report["env_name"] else EXIT_OK


def _convert_to_streams(
    directory: Path, config: Config, out: IO[bytes], err: IO[bytes]
) -> dict[str, Any]:
    """`evalpush convert`: samples as JSON lines on `out`, then the summary on `err`.

    Returns the summary (with its `set_aside` records).
    """
    import msgspec

    from evalpush.convert import RunTotals, convert_lines, summary
    from evalpush.core.setaside import SetAside
    from evalpush.runs import load_run

    run = load_run(directory)
    totals = RunTotals()
    set_aside: list[dict[str, Any]] = []
    lines = _readable_lines(run.traces_path, config.read.max_line_bytes)
    pending: list[bytes] = []
    for item in convert_lines(lines, totals, max_line_bytes=config.read.max_line_bytes):
        if isinstance(item, SetAside):
            set_aside.append(
                {"line": item.line, "offset": item.offset, "reason": item.reason, "size": item.size}
            )
            err.write(f"{run.traces_path}: line {item.line}: {item.reason}\n".encode())
            continue
        pending.append(item.sample)
        if len(pending) >= 256:
            out.write(b"\n".join(pending) + b"\n")
            pending.clear()
    if pending:
        out.write(b"\n".join(pending) + b"\n")
    out.flush()
    if not run.env_name:
        err.write(f"{run.path}: no environment name ('[taskset] id' or 'id')\n".encode())
    report = {**summary(run, totals), "set_aside": set_aside}
    err.write(msgspec.json.encode(report) + b"\n")
    err.flush()
    return report


def _readable_lines(path: Path, max_line_bytes: int) -> Iterator[Line]:
    """`read_lines`, with a trace file that cannot be read reported as the run's error."""
    from evalpush.runs import read_lines

    try:
        yield from read_lines(path, max_line_bytes=max_line_bytes)
    except PermissionError:
        raise RunError(f"{path}: not readable (permission denied)") from None
    except OSError as exc:
        raise RunError(f"{path}: cannot be read: {exc.strerror or exc}") from None


def cmd_push(args: argparse.Namespace, config: Config) -> int:
    from evalpush import log
    from evalpush.app import App, Outcome
    from evalpush.cli.report import push_object, push_progress
    from evalpush.client import Gate
    from evalpush.push import find_runs, push_runs

    missing = [str(d) for d in args.dirs if not d.exists()]
    if missing:
        print(f"evalpush push: no such directory: {', '.join(missing)}", file=sys.stderr)
        return EXIT_USAGE
    roots = [d.resolve() for d in args.dirs]
    found = find_runs(roots)
    if not found:
        from evalpush.runs import why_no_run

        print(
            "evalpush push: no eval run found (a run dir holds config.toml and traces.jsonl, "
            f"or configs/resolved/eval.json and a traces.jsonl holding a line): {why_no_run(roots)}",
            file=sys.stderr,
        )
        return EXIT_NO_RUN
    progress = push_progress(sys.stdout, sys.stderr, found, quiet=args.json)
    # One-shot: the key is checked by one probe before anything is sent, and a refused key
    # stops the push (exit 2) instead of waiting for a new one; outages are told on stderr.
    gate = Gate(one_shot=True, on_outage=progress.outage)
    stopped = _Stopped()
    with App.from_config(config, progress=progress.update, gate=gate, wait_on_auth=False) as app:
        _tell_upgrade(app.ledger)
        app.client.credentials  # noqa: B018 - no key (or an unusable base URL): one error, up front
        # What is loaded by now (modules, config, clients) lives as long as the process: keep it
        # out of every garbage collection to come (about 6% of a push's CPU).
        gc.freeze()
        with (
            progress,
            _stop_on_signals(stopped.by_signal(app.request_stop)),
            _stop_after(args.timeout, stopped.by_timeout(app.request_stop)),
        ):
            # Set up here so the log's lines print above the bar while it shows. A push logs at
            # warning unless log.level is set: its own lines say what became of each run.
            level = config.log.level if "level" in config.log.model_fields_set else "warning"
            log.configure(level, config.log.format, stream=progress.console_stream)
            try:
                results = push_runs(
                    app,
                    found,
                    wait=not args.no_wait,
                    on_result=progress.done,
                    on_incomplete=args.partial,
                )
            except AuthError as exc:
                refused = (
                    f"the platform refused the API key from {app.client.credentials.key_source}"
                )
                raise AuthError(f"{refused}: {exc}") from None
        if args.json:
            objects = [
                push_object(r, app.ledger.set_aside(r.record) if r.record else []) for r in results
            ]
    if args.json:
        import msgspec

        document = msgspec.json.encode({"results": objects})
        sys.stdout.buffer.write(msgspec.json.format(document, indent=2) + b"\n")
        sys.stdout.flush()
    short = [r.outcome == Outcome.PARTIAL and not r.set_aside for r in results]
    finished = all(r.ok or partial for r, partial in zip(results, short, strict=True))
    if stopped.code is not None and not finished:  # a stop after the last run changed nothing
        done = sum(1 for r, partial in zip(results, short, strict=True) if r.ok or partial)
        print(
            f"evalpush push: {stopped.why}: stopped with {done} of {len(results)} runs done; "
            "progress is kept, push again to go on",
            file=sys.stderr,
        )
        return stopped.code
    if not finished:
        return EXIT_PARTIAL
    return EXIT_UPLOADED_PARTIAL if any(short) else EXIT_OK


class _Stopped:
    """Why a push was stopped before it was done (a signal, or its timeout), and the exit code
    that says so; the first reason wins."""

    def __init__(self) -> None:
        self.code: int | None = None
        self.why = ""

    def _set(self, code: int, why: str) -> None:
        if self.code is None:
            self.code, self.why = code, why

    def by_signal(self, request_stop: Callable[[], None]) -> Callable[[int], None]:
        def stop(signum: int) -> None:
            self._set(EXIT_SIGNAL_BASE + signum, signal.Signals(signum).name)
            request_stop()

        return stop

    def by_timeout(self, request_stop: Callable[[], None]) -> Callable[[float], None]:
        def stop(seconds: float) -> None:
            from evalpush.core.words import format_duration

            self._set(EXIT_TIMEOUT, f"--timeout {format_duration(seconds)} ran out")
            request_stop()

        return stop


@contextlib.contextmanager
def _stop_on_signals(stop: Callable[[int], None]) -> Iterator[None]:
    """SIGTERM and SIGINT request a clean stop while the block runs (the handler only records
    it: the work sees the stop event and winds down)."""

    def handler(signum: int, _frame: FrameType | None) -> None:
        stop(signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, before in previous.items():
            signal.signal(signum, before)


@contextlib.contextmanager
def _stop_after(seconds: float | None, stop: Callable[[float], None]) -> Iterator[None]:
    """Call `stop(seconds)` once `seconds` have passed while the block runs (None: never)."""
    if seconds is None:
        yield
        return
    timer = threading.Timer(seconds, stop, args=(seconds,))
    timer.name = "push-timeout"
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        timer.join()


def cmd_run(args: argparse.Namespace, config: Config) -> int:
    """The daemon in the foreground (what systemd starts). Exit 0 after SIGTERM/SIGINT."""
    from evalpush import log
    from evalpush.service import Daemon, Notifier, Request

    log.configure(config.log.level, config.log.format, stream=sys.stdout)
    log.capture_warnings()

    def reload_config() -> Config:
        again = _load(args)
        log.configure(again.log.level, again.log.format, stream=sys.stdout)
        return again

    config_file = args.config or os.environ.get("EVALPUSH_CONFIG")
    daemon = Daemon(
        reload_config,
        notifier=Notifier.from_environ(),
        config_file=None if config_file is None else str(Path(config_file).absolute()),
    )
    requests = {
        signal.SIGTERM: Request.STOP,
        signal.SIGINT: Request.STOP,
        signal.SIGHUP: Request.RELOAD,
    }
    previous = {
        signum: signal.signal(signum, lambda signum, _frame: daemon.request(requests[signum]))
        for signum in requests
    }
    try:
        return daemon.run(config)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def cmd_status(args: argparse.Namespace, config: Config) -> int:
    """Read-only: a missing ledger is said (with its path), never created."""
    from evalpush.cli.report import (
        daemon_json,
        daemon_text,
        detail_text,
        fleet_alive,
        fleet_rows,
        fleet_text,
        local_daemon,
        mark_paused,
        not_running_text,
        run_detail,
        select_rows,
        status_rows,
        status_table,
    )

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
    with open_ledger(config, read_only=True) as ledger:
        view, last = local_daemon(ledger.daemons(), shared=shared)
        fleet = fleet_rows(ledger)
        alive = fleet_alive(ledger) if shared else None
        if args.run is not None:
            detail = run_detail(ledger, _find(ledger, args.run, busy_ok=True), alive)
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
        records = {record.run_id: record for record in ledger.all()}
        rows = select_rows(status_rows(ledger, alive), states=args.state, limit=args.limit)
        mark_paused(rows, view)
        if args.json:
            shown = {row["run_id"] for row in rows if row["state"] != State.SUPERSEDED}
            document = [
                run_detail(ledger, records[run_id], alive) for run_id in records if run_id in shown
            ]
            mark_paused(document, view)
        count = len(records)
        old = ledger.file_version != SCHEMA_VERSION
    if args.json:
        _print_json(document)
        return EXIT_OK
    print(f"ledger:     {shown}: {counted(count, 'run')}")
    if old:
        print(f"            {upgrade_advice(ledger.file_version)}")
    print(daemon_text(view) if view is not None else not_running_text(last))
    if shared:
        print(fleet_text(fleet))
    if args.daemon:
        return EXIT_OK
    print(status_table(rows, ledger=shown))
    if args.state or (args.limit is not None and len(rows) >= args.limit):
        print(f"({len(rows)} shown; `evalpush status RUN` shows one in full)")
    return EXIT_OK


def _print_json(value: Any) -> None:
    import msgspec

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


def _tell_upgrade(ledger: Ledger) -> None:
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
    if config.ledger.url:  # the shared ledger: upgraded in its database by opening it to write
        with open_ledger(config) as ledger:
            upgrade = ledger.upgrade
        print(
            f"ledger {ledger.where} is at schema {SCHEMA_VERSION}, this evalpush's: nothing to do"
            if upgrade is None
            else upgrade.message
        )
        return EXIT_OK
    if not os.path.lexists(path):
        print(f"no ledger at {path}: nothing to upgrade (the first push or run creates one)")
        return EXIT_OK
    with Ledger(path) as ledger:
        upgrade = ledger.upgrade
    if upgrade is None:
        print(f"ledger {path} is at schema {SCHEMA_VERSION}, this evalpush's: nothing to do")
    else:
        print(upgrade.message)
    return EXIT_OK


def _move_to_shared(path: Path, url: str, config: Config) -> int:
    from evalpush.config.settings import check_ledger_url
    from evalpush.ledger.moving import move
    from evalpush.ledger.opening import ledger_password
    from evalpush.ledger.server import display_url

    if not url:
        raise UsageError("migrate --to: give the shared ledger's postgresql:// URL")
    try:
        check_ledger_url(url)
    except ValueError as exc:
        raise UsageError(f"migrate --to: {exc}") from None
    if not os.path.lexists(path):
        raise UsageError(f"no ledger at {path}: nothing to move")
    running = _live_daemon(config, file=True)
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
        _tell_upgrade(source)
        moved = move(source, target)
    print(f"moved {path} into {display_url(url)}: {moved.message}")
    print(
        f"next: set [ledger] url = {display_url(url)!r} on this host and restart the daemon; "
        f"{path} is left as it was (keep it as a backup)"
    )
    return EXIT_OK


def cmd_retry(args: argparse.Namespace, config: Config) -> int:
    from evalpush.ledger import transitions

    if (args.run is None) == (not args.all_failed):
        raise UsageError("retry takes a RUN or --all-failed (not both)")
    with _existing_ledger(config, args.run or "--all-failed") as ledger:
        _tell_upgrade(ledger)
        if args.all_failed:
            failed = ledger.in_state(State.FAILED)
            for record in failed:
                transitions.requeue(ledger, record)
                print(f"queued {record.run_id} ({record.path})")
            print(f"{counted(len(failed), 'failed run')} queued")
            return EXIT_OK
        record = _find(ledger, args.run)
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
        _tell_upgrade(ledger)
        record = _find(ledger, args.run)
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


def _find(ledger: Ledger, key: str, *, busy_ok: bool = False) -> RunRecord:
    """The one run `key` names (a path, a run id or a prefix of one), else a `UsageError`
    saying why: no key, no such run, or which runs an ambiguous prefix could mean. A run
    another live process holds is `Busy`, unless `busy_ok` (to read it)."""
    if not key:
        raise UsageError("an empty run key names no run: give a run id, a prefix or a path")
    path = Path(key)
    found = ledger.match(str(path.resolve())) if path.exists() else []
    found = found or ledger.match(key)
    if not found:
        from evalpush.runs import why_not_a_run

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


class Check(enum.StrEnum):
    """What `check` looks at, in order."""

    CONFIG = "config"
    WATCH = "watch"
    METRICS = "metrics"  # only when [metrics] listen is set
    LEDGER = "ledger"
    CREDENTIALS = "credentials"
    PLATFORM = "platform"


class _Row(msgspec.Struct, frozen=True):
    check: Check
    ok: bool | None  # None: skipped, since what it needs failed
    detail: str
    fix: str = ""
    warn: bool = False  # ok, but something to fix: WARN
    setup: bool = False  # a refusal the daemon makes at start as a configuration error (exit 2)

    def line(self) -> str:
        result = (
            "SKIP"
            if self.ok is None
            else ("FAIL" if not self.ok else ("WARN" if self.warn else "OK"))
        )
        fix = f"; fix: {self.fix}" if self.fix else ""
        return f"{self.check:<12} {result:<6} {self.detail}{fix}"


KEY_REFUSED = "the platform refused the key"
KEY_FIX = (
    "set PRIME_API_KEY, or platform.api_key_file, or $CREDENTIALS_DIRECTORY/prime-api-key, "
    "or run `prime login`"
)


def cmd_check(args: argparse.Namespace, config: Config | None, error: ConfigError | None) -> int:
    """The daemon's start-up, dry, then the platform: one row each (OK, WARN: works but fix it,
    FAIL with the fix, or SKIP when what it needs failed). Every refusal `run` makes at start is
    a FAIL row in `run`'s words, made by the same code. Exit 2 when the configuration or the
    credentials are wrong (the platform refusing the key included: what `run` refuses with 2),
    1 when only the ledger or the platform fails, 0 when all pass (WARN rows included). Writes
    nothing (an address in `[metrics] listen` is bound and let go at once)."""
    from evalpush.client import PlatformClient

    source = args.config or os.environ.get("EVALPUSH_CONFIG") or "defaults and the environment"
    if config is None:
        rows = [
            _Row(Check.CONFIG, False, str(error), error.fix if error else ""),
            *(_Row(c, None, "needs a valid configuration") for c in list(Check)[1:]),
        ]
        return _check_report(rows)
    ignored = "".join(f"; ignored, retired: {notice}" for notice in config.ignored)
    rows = [_Row(Check.CONFIG, True, f"{source}: valid{ignored}")]
    rows.append(_check_watch(config))
    if config.metrics.listen:
        rows.append(_check_metrics(config))
    rows.append(
        _check_shared_ledger(config)
        if config.ledger.url
        else _check_ledger(default_path(config.state_dir))
    )
    with PlatformClient(config.platform) as client:
        rows.append(_check_credentials(client))
        if rows[-1].ok:
            rows.append(_check_platform(client))
        else:
            rows.append(_Row(Check.PLATFORM, None, "needs credentials"))
    return _check_report(rows)


def _check_watch(config: Config) -> _Row:
    """The daemon's roots: absolute (the daemon's own refusal), there, readable; the filesystem
    and watcher of each; with `observer = "inotify"`, the watches set up and let go, as the
    daemon's start does (its refusal when inotify cannot watch them)."""
    from evalpush.discover import HintQueue, Watcher, refuse_relative_roots, watch_verdicts

    if "roots" not in config.watch.model_fields_set:  # not given: the default ./outputs
        return _Row(
            Check.WATCH,
            None,
            "watch.roots not set (the default ./outputs is relative): only `push` can be used (it takes its own directories); "
            "set absolute roots for the daemon (`evalpush run`)",
        )
    verdicts, watches = watch_verdicts(config.watch)
    bad = [v for v in verdicts if not v.ok]
    detail = "; ".join(v.detail for v in verdicts) + f"; {watches}"
    try:
        refuse_relative_roots(config.watch)
    except ConfigError as exc:
        return _Row(Check.WATCH, False, f"{exc}; {detail}", setup=True)
    if config.watch.observer == "inotify":  # first: what it refuses (an unreadable root too)
        watcher = Watcher.from_config(config.watch, config.runs, HintQueue())
        try:
            watcher.start()
        except ConfigError as exc:
            return _Row(Check.WATCH, False, f"{exc}; {detail}", setup=True)
        finally:
            watcher.stop()
    if bad:
        fixes = "; ".join(dict.fromkeys(v.fix for v in bad))
        return _Row(Check.WATCH, False, detail, fixes)
    return _Row(Check.WATCH, True, detail)


def _live_daemon(config: Config, *, file: bool = False) -> int | None:
    """The pid of this host's daemon that runs now, judged as `status` judges it from its row
    in the ledger `config` names (with `file`: the state dir's file), or None."""
    from evalpush.cli.report import local_daemon

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


def _check_metrics(config: Config) -> _Row:
    """`[metrics] listen`: bound and let go, as the daemon binds it at start."""
    from evalpush.service.metrics import check_listen

    try:
        shown = check_listen(config.metrics)
    except ConfigError as exc:
        running = _live_daemon(config)
        if running is not None:
            return _Row(
                Check.METRICS,
                None,
                f"{exc} (the daemon of this state dir runs, pid {running}: it may be the one "
                "listening there)",
            )
        return _Row(
            Check.METRICS,
            False,
            str(exc),
            "choose a free address in metrics.listen, or stop what listens there",
            setup=True,
        )
    return _Row(Check.METRICS, True, f"{shown}: free; the daemon serves /metrics there")


def _check_credentials(client: Any) -> _Row:
    try:
        # The warning logged of a key file others may read is this row's WARN too: it goes to
        # stderr, so the table on stdout stays whole.
        with contextlib.redirect_stdout(sys.stderr):
            creds = client.credentials
    except (AuthError, ConfigError) as exc:
        # A missing key's message says where to set one; an unusable URL's, what to change.
        says_how = isinstance(exc, ConfigError) or "prime login" in str(exc)
        return _Row(Check.CREDENTIALS, False, str(exc), "" if says_how else KEY_FIX)
    team = f" (team {creds.team_id})" if creds.team_id else ""
    detail = f"key from {creds.key_source}; api {creds.api_base}{team}"
    if creds.warning:
        return _Row(Check.CREDENTIALS, True, f"{detail}; {creds.warning}", warn=True)
    return _Row(Check.CREDENTIALS, True, detail)


def _check_ledger(path: Path) -> _Row:
    """Read-only: a ledger that is not there yet is fine where it can be created; one from
    an older evalpush is read through a copy (the file is left as it is) and said to be."""
    if not os.path.lexists(path):
        try:
            refuse_uncreatable(path)  # what the daemon's start (and a push) would refuse
        except EvalpushError as exc:
            return _Row(Check.LEDGER, False, str(exc))
        return _Row(Check.LEDGER, True, f"{path}: not created yet; the first push or run will")
    try:
        with Ledger(path, read_only=True) as ledger:
            runs = f"{counted(len(ledger.all()), 'run')} known"
            if ledger.file_version != SCHEMA_VERSION:
                runs += f" ({upgrade_advice(ledger.file_version)})"
    except EvalpushError as exc:
        return _Row(Check.LEDGER, False, str(exc), "see the message")
    if not (os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)):
        return _Row(
            Check.LEDGER,
            False,
            f"{path}: {runs}, but not writable by this user (uploads write to it)",
            "run as its owner, or fix its owner and mode",
        )
    return _Row(Check.LEDGER, True, f"{path}: {runs}, writable")


def _check_shared_ledger(config: Config) -> _Row:
    """A shared ledger: its database answers, with this evalpush's tables or none yet."""
    shown = where(config)
    try:
        with open_ledger(config, read_only=True) as ledger:
            runs, daemons = len(ledger.all()), ledger.daemons()
    except EvalpushError as exc:
        if "no evalpush ledger in this database yet" in str(exc):
            return _Row(
                Check.LEDGER, True, f"{shown}: shared; no tables yet, the first run creates them"
            )
        return _Row(
            Check.LEDGER,
            False,
            str(exc),
            "check [ledger] url, the password (password_file), and that PostgreSQL runs",
            setup=isinstance(exc, ConfigError),  # what the daemon refuses with exit 2
        )
    here, now = Process.current(), time.time()
    running = sum(d.running(now, lambda h: holder_alive(h, here, now)) for d in daemons)
    return _Row(
        Check.LEDGER,
        True,
        f"{shown}: shared, {counted(runs, 'run')} known, {counted(running, 'daemon')} running",
    )


def _check_platform(client: Any) -> _Row:
    started = time.monotonic()
    try:
        client.probe()
    except AuthError as exc:
        return _Row(Check.PLATFORM, False, f"{KEY_REFUSED}: {exc}", KEY_FIX)
    except EvalpushError as exc:
        return _Row(
            Check.PLATFORM,
            False,
            f"cannot be reached: {exc}",
            "check platform.api_base_url (or PRIME_API_BASE_URL), the network and any proxy",
        )
    elapsed_ms = (time.monotonic() - started) * 1000
    return _Row(Check.PLATFORM, True, f"reachable, key accepted ({elapsed_ms:.0f} ms)")


def _check_report(rows: list[_Row]) -> int:
    print(f"{'CHECK':<12} {'RESULT':<6} DETAIL")
    for row in rows:
        print(row.line())
    failed = [row for row in rows if row.ok is False]
    if not failed:
        return EXIT_OK
    print(
        f"evalpush check: {len(failed)} failed: "
        + "; ".join(f"{row.check}: {row.detail}" for row in failed),
        file=sys.stderr,
    )
    setup = any(
        row.setup
        or row.check in (Check.CONFIG, Check.CREDENTIALS)
        or (row.check == Check.WATCH and "relative" in row.detail)
        or (row.check == Check.PLATFORM and row.detail.startswith(KEY_REFUSED))
        for row in failed
    )
    return EXIT_USAGE if setup else EXIT_PARTIAL


def cmd_demo(args: argparse.Namespace, config: Config) -> int:
    from evalpush.cli.demo import run_demo

    # The live view is the demo's output; the daemon's lifecycle lines would drown it: the log
    # is at warning, and on a terminal its lines go above the view.
    return run_demo(
        sys.stdout,
        directory=args.dir,
        keep=args.keep,
        log_format=config.log.format,
        log_stream=sys.stderr,
    )


def cmd_local_platform(args: argparse.Namespace, config: Config) -> int:
    from evalpush.local_platform import serve

    serve(host=args.host, port=args.port, api_key=args.api_key, db=args.db)
    return EXIT_OK


_COMMANDS: dict[str, Callable[[argparse.Namespace, Config], int]] = {
    "convert": cmd_convert,
    "push": cmd_push,
    "run": cmd_run,
    "status": cmd_status,
    "retry": cmd_retry,
    "forget": cmd_forget,
    "migrate": cmd_migrate,
    "demo": cmd_demo,
    "local-platform": cmd_local_platform,
}


def _print_any_file_name() -> None:
    """A file name that is not UTF-8 reaches text as lone surrogates: print them escaped rather
    than fail on them (what evalpush prints on purpose is escaped already, `evalpush.core.paths`)."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")


def main(argv: Sequence[str] | None = None) -> int:
    """`evalpush ARGS`: the command's exit code. A reader that went away before the output was
    all written (`evalpush status | head -1`) ends the command quietly with 141, the exit of a
    command killed by SIGPIPE as a shell reports it: stdout is pointed at /dev/null, so
    nothing more fails on it (the interpreter flushes it once more on the way out). Python
    ignores SIGPIPE, and so does evalpush: left to kill it, a platform that closed a
    connection mid-request would kill an upload."""
    try:
        code = _main(argv)
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE
    return code


@scrubbed_output  # nothing the command prints can carry the API key
def _main(argv: Sequence[str] | None) -> int:
    _print_any_file_name()
    args = build_parser().parse_args(argv)
    try:
        if args.command == "check":  # a configuration error is one of its rows
            try:
                config: Config | None = _load(args)
            except ConfigError as exc:
                return cmd_check(args, None, exc)
            return cmd_check(args, config, None)
        config = _load(args)
        return _COMMANDS[args.command](args, config)
    except (ConfigError, UsageError, AuthError, CertificateError) as exc:
        print(f"evalpush: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except EvalpushError as exc:
        print(f"evalpush: {exc}", file=sys.stderr)
        return EXIT_PARTIAL
    except KeyboardInterrupt:
        return 130
