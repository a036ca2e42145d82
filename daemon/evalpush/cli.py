"""The `evalpush` command: one entry point, one subcommand per job.

Exit codes: 0 done, 1 the job ran but something was set aside or failed, 2 usage or
configuration error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from evalpush import __version__
from evalpush.config import Config, load_config
from evalpush.errors import ConfigError, EvalpushError, RunError

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
    from evalpush.convert import convert_to_streams

    try:
        report = convert_to_streams(args.dir, config, sys.stdout.buffer, sys.stderr.buffer)
    except RunError as exc:
        print(f"evalpush: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_PARTIAL if report["set_aside"] or not report["env_name"] else EXIT_OK


def cmd_local_platform(args: argparse.Namespace, config: Config) -> int:
    from evalpush.local_platform import serve

    serve(host=args.host, port=args.port, api_key=args.api_key, db=args.db)
    return EXIT_OK


_COMMANDS: dict[str, Callable[[argparse.Namespace, Config], int]] = {
    "convert": cmd_convert,
    "local-platform": cmd_local_platform,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = _load(args)
        return _COMMANDS[args.command](args, config)
    except ConfigError as exc:
        print(f"evalpush: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except EvalpushError as exc:
        print(f"evalpush: {exc}", file=sys.stderr)
        return EXIT_PARTIAL
    except KeyboardInterrupt:
        return 130
