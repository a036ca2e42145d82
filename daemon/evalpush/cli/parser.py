"""The `evalpush` command line: its parser, and the exit codes each subcommand documents
(`COMMAND_EXIT_CODES`, shown by its `--help`; the top-level help sums them up in `EXIT_CODES`,
and so does the README's table). Progress is kept in the ledger whatever a push exits with.
"""

from __future__ import annotations

import argparse
import re
import signal
from pathlib import Path
from typing import Any

from evalpush import __version__
from evalpush.core.states import FOLLOWING, State

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
       process (--no-wait) or followed by a daemon while it is written (following)
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
    "  1    the ledger cannot be read (the message says why, and the fix); a --json\n"
    '       listing cut by it still ends whole, its last object {"error": ...}\n'
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


def parse_count(text: str) -> int:
    """A count of 1 or more (`status --limit N`); argparse's type for it."""
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if count < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give 1 or more")
    return count


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="evalpush",
        description="Upload verifiers eval runs to the platform, exactly once.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
            formatter_class=argparse.RawDescriptionHelpFormatter,
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

    p = command(
        "status",
        "runs by state, those needing a person, the latest (--all: every run), or one in full",
    )
    p.add_argument(
        "run",
        metavar="RUN",
        nargs="?",
        help="one run in full: run id (or a unique prefix) or path",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="JSON instead of text: a list of one object per run, every run (or those --state "
        "and --limit select); one object with RUN",
    )
    p.add_argument(
        "--all",
        action="store_true",
        help="every run, one a line (the default lists those needing a person and the other "
        "runs updated last)",
    )
    p.add_argument(
        "--daemon",
        action="store_true",
        help='only the ledger and the daemon\'s view (with --json: {"ledger", "schema", "daemon"})',
    )
    p.add_argument(
        "--state",
        action="append",
        choices=[*(str(s) for s in State), FOLLOWING],
        metavar="STATE",
        help="only runs in STATE (again for more), each state's oldest update first: "
        + ", ".join([*(str(s) for s in State), FOLLOWING]),
    )
    p.add_argument(
        "--limit", type=parse_count, metavar="N", help="only the N runs updated last (the newest)"
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
