"""The `evalpush` command: one entry point, one subcommand per job.

Exit codes: 0 done, 1 the job ran but something was set aside or failed, 2 usage or
configuration error.
"""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from evalpush import __version__
from evalpush.config import Config, load_config
from evalpush.errors import ConfigError, EvalpushError, RunError, UsageError
from evalpush.ledger import Ledger, RunRecord, State, default_path

if TYPE_CHECKING:
    from evalpush.read import Line

EXIT_OK, EXIT_PARTIAL, EXIT_USAGE = 0, 1, 2


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

    p = sub.add_parser("status", help="every run the ledger knows, and how far it got")
    p.add_argument("--json", action="store_true", help="a JSON list instead of a table")

    p = sub.add_parser("retry", help="put a failed or held run back in the queue")
    p.add_argument("run", metavar="RUN", help="run id (or a unique prefix) or path")

    p = sub.add_parser("forget", help="drop a run from the ledger (it will be seen as new)")
    p.add_argument("run", metavar="RUN", help="run id (or a unique prefix) or path")

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

    from evalpush.convert import RunTotals, SetAside, convert_lines, summary
    from evalpush.runs import load_run

    run = load_run(directory)
    totals = RunTotals()
    set_aside: list[dict[str, Any]] = []
    lines = _readable_lines(run.traces_path, config.read.max_line_bytes)
    pending: list[bytes] = []
    for item in convert_lines(lines, totals, max_line_bytes=config.read.max_line_bytes):
        if isinstance(item, SetAside):
            set_aside.append(item.to_dict())
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
    from evalpush.report import PushProgress, push_line
    from evalpush.service import Service

    missing = [str(d) for d in args.dirs if not d.exists()]
    if missing:
        print(f"evalpush push: no such directory: {', '.join(missing)}", file=sys.stderr)
        return EXIT_USAGE
    log.configure(config.log.level, config.log.format, stream=sys.stderr)
    progress = PushProgress(sys.stderr)
    service = Service(config, progress=progress.update, wait_on_auth=False)
    # What is loaded by now (modules, config, clients) lives as long as the process: keep it
    # out of every garbage collection to come (issue 10: about 6% of a push's CPU).
    gc.freeze()
    with service, service.stop_on_signals():
        results = service.push([d.resolve() for d in args.dirs])
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


def cmd_status(args: argparse.Namespace, config: Config) -> int:
    from evalpush.report import status_rows, status_table

    path = default_path(config.state_dir)
    if not path.exists():
        rows = []
    else:
        with Ledger(path) as ledger:
            rows = status_rows(ledger)
    if args.json:
        import msgspec

        sys.stdout.buffer.write(msgspec.json.format(msgspec.json.encode(rows), indent=2) + b"\n")
    else:
        print(status_table(rows))
    return EXIT_OK


def cmd_retry(args: argparse.Namespace, config: Config) -> int:
    with Ledger(default_path(config.state_dir)) as ledger:
        record = _find(ledger, args.run)
        if record.state not in (State.FAILED, State.HELD):
            print(
                f"evalpush retry: run {record.run_id} is {record.state}; only failed or held "
                "runs are retried",
                file=sys.stderr,
            )
            return EXIT_PARTIAL
        ledger.update(
            record,
            state=State.READY,
            release_hold=int(record.state == State.HELD),
            reason="queued by `evalpush retry`",
            last_error=None,
        )
    print(f"queued {record.run_id} ({record.path})")
    return EXIT_OK


def cmd_forget(args: argparse.Namespace, config: Config) -> int:
    with Ledger(default_path(config.state_dir)) as ledger:
        record = _find(ledger, args.run)
        ledger.forget(record)
    print(f"forgot {record.run_id} ({record.path})")
    return EXIT_OK


def _find(ledger: Ledger, key: str) -> RunRecord:
    path = Path(key)
    record = ledger.get(str(path.resolve())) if path.exists() else None
    record = record or ledger.get(key)
    if record is None:
        raise UsageError(f"no run {key!r} in the ledger (see `evalpush status`)")
    return record


def cmd_check(args: argparse.Namespace, config: Config) -> int:
    """Each thing the daemon needs, one line each; exit 0 only if all of them are fine."""
    import os
    import time

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

    log.configure(config.log.level, config.log.format, stream=sys.stderr)
    return run_demo(sys.stdout, directory=args.dir, keep=args.keep)


def cmd_local_platform(args: argparse.Namespace, config: Config) -> int:
    from evalpush.local_platform import serve

    serve(host=args.host, port=args.port, api_key=args.api_key, db=args.db)
    return EXIT_OK


_COMMANDS: dict[str, Callable[[argparse.Namespace, Config], int]] = {
    "convert": cmd_convert,
    "push": cmd_push,
    "status": cmd_status,
    "retry": cmd_retry,
    "forget": cmd_forget,
    "check": cmd_check,
    "demo": cmd_demo,
    "local-platform": cmd_local_platform,
}


def main(argv: Sequence[str] | None = None) -> int:
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
