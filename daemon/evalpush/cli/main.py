"""The `evalpush` command's entry point: `main` parses the command line (`cli.parser`), loads
the configuration, configures the log once and runs the command: `convert`, `push`, `run`,
`demo` and `local-platform` here, `status`, `retry`, `forget` and `migrate` in `cli.ledger`,
`check` in `cli.check`; what they print is `cli.report`'s.

A command that brings a subsystem of its own (the daemon and its metrics, the watcher, the demo,
the local platform's server) imports it when it runs: a `push` loads none of them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import IO, Any

import msgspec

from evalpush import log
from evalpush.cli.ledger import (
    cmd_forget,
    cmd_migrate,
    cmd_retry,
    cmd_status,
    tell_upgrade,
)
from evalpush.cli.parser import (
    EXIT_BROKEN_PIPE,
    EXIT_NO_RUN,
    EXIT_OK,
    EXIT_PARTIAL,
    EXIT_SIGNAL_BASE,
    EXIT_TIMEOUT,
    EXIT_UPLOADED_PARTIAL,
    EXIT_USAGE,
    build_parser,
)
from evalpush.config import Config, load_config
from evalpush.convert import RunTotals, convert_lines, summary
from evalpush.core.errors import (
    AuthError,
    CertificateError,
    ConfigError,
    EvalpushError,
    RunError,
    UsageError,
)
from evalpush.core.setaside import SetAside
from evalpush.core.words import format_duration
from evalpush.log import scrubbed_output
from evalpush.runs import Line, load_run, read_lines


def _load(args: argparse.Namespace) -> Config:
    flags = {"state": {"dir": args.state_dir}} if args.state_dir else None
    return load_config(args.config, flags=flags)


def cmd_convert(args: argparse.Namespace, config: Config) -> int:
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
    try:
        yield from read_lines(path, max_line_bytes=max_line_bytes)
    except PermissionError:
        raise RunError(f"{path}: not readable (permission denied)") from None
    except OSError as exc:
        raise RunError(f"{path}: cannot be read: {exc.strerror or exc}") from None


def cmd_push(args: argparse.Namespace, config: Config) -> int:
    from evalpush import log
    from evalpush.app import App, Outcome
    from evalpush.cli.push_report import push_object, push_progress
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
        tell_upgrade(app.ledger)
        app.client.credentials  # noqa: B018 - no key (or an unusable base URL): one error, up front
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
    from evalpush.service import Daemon, Notifier, Request

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


def _configure_log(command: str, config: Config) -> None:
    """The log, once for the process: a server's (`run`, `local-platform`) on stdout at
    `log.level` (the journal reads it), the daemon's with Python's warnings and threads' uncaught
    exceptions as log lines; any other command's on stderr, at warning unless `log.level` is
    set (its own output says what it did)."""
    if command in ("run", "local-platform"):
        log.configure(config.log.level, config.log.format, stream=sys.stdout)
        if command == "run":
            log.capture_warnings()
        return
    level = config.log.level if "level" in config.log.model_fields_set else "warning"
    log.configure(level, config.log.format, stream=sys.stderr)


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
        try:
            config = _load(args)
        except ConfigError as exc:
            if args.command != "check":
                raise
            from evalpush.cli.check import cmd_check

            return cmd_check(args, None, exc)  # a configuration error is one of its rows
        _configure_log(args.command, config)
        if args.command == "check":
            from evalpush.cli.check import cmd_check

            return cmd_check(args, config, None)
        return _COMMANDS[args.command](args, config)
    except (ConfigError, UsageError, AuthError, CertificateError) as exc:
        print(f"evalpush: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except EvalpushError as exc:
        print(f"evalpush: {exc}", file=sys.stderr)
        return EXIT_PARTIAL
    except KeyboardInterrupt:
        return 130
