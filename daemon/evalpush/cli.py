"""The `evalpush` command: one entry point, one subcommand per job.

Exit codes: 0 done, 1 the job ran but something was set aside or failed, 2 usage or
configuration error.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import IO, TYPE_CHECKING, Any

from evalpush import __version__
from evalpush.claims import Process, holder_alive
from evalpush.config import Config, load_config
from evalpush.errors import Busy, ConfigError, EvalpushError, RunError, UsageError
from evalpush.ledger import Ledger, RunRecord, default_path
from evalpush.log import scrubbed_output
from evalpush.states import State

if TYPE_CHECKING:
    from evalpush.read import Line

EXIT_OK, EXIT_PARTIAL, EXIT_USAGE = 0, 1, 2

GIL_SWITCH_SECONDS = 0.001
"""While one thread converts the next batch, the thread sending the current one needs the GIL
back after every socket and SQLite call; the default 5 ms hand-over made each batch's
bookkeeping wait behind the converter (measured: the 72 MB push's push step 1.5 s -> 1.3 s)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="evalpush",
        description="Upload verifiers eval runs to the platform, exactly once.",
    )
    parser.add_argument("--version", action="version", version=f"evalpush {__version__}")
    parser.add_argument("--config", type=Path, help="config file (TOML); default $EVALPUSH_CONFIG")
    parser.add_argument("--state-dir", type=Path, help="where the ledger lives")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("convert", help="print a run's samples as JSON lines (no network)")
    p.add_argument("dir", type=Path, help="the run directory")

    p = sub.add_parser("push", help="upload the given run dirs (or roots holding them) now")
    p.add_argument("dirs", type=Path, nargs="+", metavar="DIR")
    p.add_argument(
        "--no-wait",
        action="store_true",
        help="do not wait for runs another process is uploading: report them and exit 1",
    )

    sub.add_parser(
        "run", help="the daemon: watch watch.roots and upload each run once it is finished"
    )

    p = sub.add_parser("status", help="every run the ledger knows, and how far it got")
    p.add_argument("--json", action="store_true", help="a JSON list instead of a table")

    p = sub.add_parser("retry", help="put a failed or held run back in the queue")
    p.add_argument("run", metavar="RUN", help="run id (or a unique prefix) or path")

    p = sub.add_parser("forget", help="drop a run from the ledger (it will be seen as new)")
    p.add_argument("run", metavar="RUN", help="run id (or a unique prefix) or path")
    p.add_argument(
        "--yes",
        action="store_true",
        help="forget a run that has an evaluation (the next push creates a second one)",
    )

    sub.add_parser("check", help="validate config and credentials, reach the platform, report")

    p = sub.add_parser(
        "demo", help="the main job on an embedded default: local platform, sample runs"
    )
    p.add_argument("--dir", type=Path, default=None, help="scratch dir (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the local platform up until Ctrl-C")

    p = sub.add_parser("local-platform", help="serve the local stand-in of the platform")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8700)
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
    from evalpush.runs import load_run
    from evalpush.setaside import SetAside

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
    from evalpush.read import read_lines

    try:
        yield from read_lines(path, max_line_bytes=max_line_bytes)
    except PermissionError:
        raise RunError(f"{path}: not readable (permission denied)") from None
    except OSError as exc:
        raise RunError(f"{path}: cannot be read: {exc.strerror or exc}") from None


def cmd_push(args: argparse.Namespace, config: Config) -> int:
    from evalpush import log
    from evalpush.app import App
    from evalpush.push import push
    from evalpush.report import PushProgress, push_line

    missing = [str(d) for d in args.dirs if not d.exists()]
    if missing:
        print(f"evalpush push: no such directory: {', '.join(missing)}", file=sys.stderr)
        return EXIT_USAGE
    log.configure(config.log.level, config.log.format, stream=sys.stderr)
    progress = PushProgress(sys.stderr)
    with App.from_config(config, progress=progress.update, wait_on_auth=False) as app:
        app.client.credentials  # noqa: B018 - no key (or an unusable base URL): one error, up front
        # What is loaded by now (modules, config, clients) lives as long as the process: keep it
        # out of every garbage collection to come (about 6% of a push's CPU).
        gc.freeze()
        with _stop_on_signals(app.request_stop):
            results = push(app, [d.resolve() for d in args.dirs], wait=not args.no_wait)
    progress.finish()
    if not results:
        print(
            "evalpush push: no eval run found (a run dir holds config.toml and traces.jsonl)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    for result in results:
        print(push_line(result))
    return EXIT_OK if all(r.ok for r in results) else EXIT_PARTIAL


@contextlib.contextmanager
def _stop_on_signals(request_stop: Callable[[], None]) -> Iterator[None]:
    """SIGTERM and SIGINT request a clean stop while the block runs (the handler only records
    it: the work sees the stop event and winds down)."""

    def handler(_signum: int, _frame: FrameType | None) -> None:
        request_stop()

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, before in previous.items():
            signal.signal(signum, before)


def cmd_run(args: argparse.Namespace, config: Config) -> int:
    """The daemon in the foreground (what systemd starts). Exit 0 after SIGTERM/SIGINT."""
    from evalpush import log
    from evalpush.sdnotify import Notifier
    from evalpush.service import Daemon, Request

    log.configure(config.log.level, config.log.format, stream=sys.stdout)

    def reload_config() -> Config:
        again = _load(args)
        log.configure(again.log.level, again.log.format, stream=sys.stdout)
        return again

    daemon = Daemon(reload_config, notifier=Notifier.from_environ())
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
    from evalpush.report import status_rows, status_table

    path = default_path(config.state_dir)
    if not os.path.lexists(path):
        rows = []
    else:
        with Ledger.for_reading(path) as ledger:
            rows = status_rows(ledger)
    if args.json:
        import msgspec

        sys.stdout.buffer.write(msgspec.json.format(msgspec.json.encode(rows), indent=2) + b"\n")
    else:
        print(status_table(rows))
    return EXIT_OK


def cmd_retry(args: argparse.Namespace, config: Config) -> int:
    from evalpush import transitions

    with Ledger(default_path(config.state_dir)) as ledger:
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
    with Ledger(default_path(config.state_dir)) as ledger:
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


def _find(ledger: Ledger, key: str) -> RunRecord:
    """The one run `key` names (a path, a run id or a prefix of one), else a `UsageError`
    saying why: no key, no such run, or which runs an ambiguous prefix could mean."""
    if not key:
        raise UsageError("an empty run key names no run: give a run id, a prefix or a path")
    path = Path(key)
    found = ledger.match(str(path.resolve())) if path.exists() else []
    found = found or ledger.match(key)
    if not found:
        raise UsageError(f"no run {key!r} in the ledger (see `evalpush status`)")
    if len(found) > 1:
        candidates = "\n".join(f"  {r.run_id}  {r.path}" for r in found)
        raise UsageError(f"{key!r} could be any of {len(found)} runs:\n{candidates}")
    record = found[0]
    holder = record.holder
    if holder is not None and holder_alive(holder, Process.current(), time.time()):
        raise Busy(
            f"run {record.run_id} is being uploaded by {holder.describe()}: try again once it is "
            "done",
            pid=holder.pid,
            host=holder.host,
            since=holder.since,
        )
    return record


def cmd_check(args: argparse.Namespace, config: Config) -> int:
    """Each thing the daemon needs, one line each; exit 0 only if all of them are fine."""

    from evalpush.platform import PlatformClient

    source = args.config or os.environ.get("EVALPUSH_CONFIG") or "(defaults and environment)"
    print(f"config:     {source}: valid")
    with Ledger(default_path(config.state_dir)) as ledger:
        print(f"ledger:     {ledger.path}: writable, {len(ledger.all())} runs known")
    with PlatformClient(config.platform) as client:
        creds = client.credentials
        print(f"api key:    found in {creds.key_source}")
        print(
            f"api base:   {creds.api_base}" + (f" (team {creds.team_id})" if creds.team_id else "")
        )
        started = time.monotonic()
        try:
            client.probe()
        except EvalpushError as exc:
            print(f"platform:   NOT OK: {exc}")
            return EXIT_PARTIAL
        elapsed_ms = (time.monotonic() - started) * 1000
        print(f"platform:   reachable, key accepted ({elapsed_ms:.0f} ms)")
    return EXIT_OK


def cmd_demo(args: argparse.Namespace, config: Config) -> int:
    from evalpush import log
    from evalpush.demo import run_demo

    # The live view is the demo's output; the daemon's lifecycle lines would drown it.
    log.configure("warning", config.log.format, stream=sys.stderr)
    return run_demo(sys.stdout, directory=args.dir, keep=args.keep)


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
    "check": cmd_check,
    "demo": cmd_demo,
    "local-platform": cmd_local_platform,
}


def _print_any_file_name() -> None:
    """A file name that is not UTF-8 reaches text as lone surrogates: print them escaped rather
    than fail on them (what evalpush prints on purpose is escaped already, `evalpush.paths`)."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")


@scrubbed_output  # nothing the command prints can carry the API key
def main(argv: Sequence[str] | None = None) -> int:
    _print_any_file_name()
    sys.setswitchinterval(GIL_SWITCH_SECONDS)
    args = build_parser().parse_args(argv)
    try:
        config = _load(args)
        return _COMMANDS[args.command](args, config)
    except (ConfigError, UsageError) as exc:
        print(f"evalpush: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except EvalpushError as exc:
        print(f"evalpush: {exc}", file=sys.stderr)
        return EXIT_PARTIAL
    except KeyboardInterrupt:
        return 130
