"""`evalpush check`: the daemon's start-up, dry, then the platform; one row a check (OK, WARN:
works but fix it, FAIL with the fix, or SKIP when what it needs failed). Every refusal `run`
makes at start is a FAIL row in `run`'s words, made by the same code (`refuse_relative_roots`,
the watcher's start, `check_listen`, `refuse_uncreatable`). Writes nothing (an address in
`[metrics] listen` is bound and let go at once).
"""

from __future__ import annotations

import argparse
import enum
import os
import sys
import time
from pathlib import Path

import msgspec

from evalpush.cli.ledger import live_daemon, upgrade_advice
from evalpush.cli.parser import EXIT_OK, EXIT_PARTIAL, EXIT_USAGE
from evalpush.client import PlatformClient
from evalpush.config import Config
from evalpush.core.errors import AuthError, ConfigError, EvalpushError
from evalpush.core.words import counted
from evalpush.discover import HintQueue, Watcher, refuse_relative_roots, watch_verdicts
from evalpush.ledger import (
    SCHEMA_VERSION,
    Ledger,
    alive_now,
    default_path,
    open_ledger,
    refuse_uncreatable,
    where,
)
from evalpush.service.server import check_listen


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
    setup: bool = False  # FAIL: wrong configuration or credentials, what `run` exits 2 for

    def line(self) -> str:
        result = (
            "SKIP"
            if self.ok is None
            else ("FAIL" if not self.ok else ("WARN" if self.warn else "OK"))
        )
        fix = f"; fix: {self.fix}" if self.fix else ""
        return f"{self.check:<12} {result:<6} {self.detail}{fix}"


KEY_FIX = (
    "set PRIME_API_KEY, or platform.api_key_file, or $CREDENTIALS_DIRECTORY/prime-api-key, "
    "or run `prime login`"
)


def cmd_check(args: argparse.Namespace, config: Config | None, error: ConfigError | None) -> int:
    """The rows, printed; exit 2 when the configuration or the credentials are wrong (the
    platform refusing the key included: what `run` refuses with 2), 1 when only the ledger or
    the platform fails, 0 when all pass (WARN rows included)."""
    source = args.config or os.environ.get("EVALPUSH_CONFIG") or "defaults and the environment"
    if config is None:
        rows = [
            _Row(Check.CONFIG, False, str(error), error.fix if error else "", setup=True),
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


def _check_metrics(config: Config) -> _Row:
    """`[metrics] listen`: bound and let go, as the daemon binds it at start."""
    try:
        shown = check_listen(config.metrics)
    except ConfigError as exc:
        running = live_daemon(config)
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


def _check_credentials(client: PlatformClient) -> _Row:
    try:
        creds = client.credentials  # a warning about its key file is logged too, on stderr
    except (AuthError, ConfigError) as exc:
        # A missing key's message says where to set one; an unusable URL's, what to change.
        says_how = isinstance(exc, ConfigError) or "prime login" in str(exc)
        return _Row(Check.CREDENTIALS, False, str(exc), "" if says_how else KEY_FIX, setup=True)
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
            runs = f"{counted(sum(ledger.state_counts().values()), 'run')} known"
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
            runs, daemons = sum(ledger.state_counts().values()), ledger.daemons()
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
    now = time.time()
    alive = alive_now(now)
    running = sum(d.running(now, alive) for d in daemons)
    return _Row(
        Check.LEDGER,
        True,
        f"{shown}: shared, {counted(runs, 'run')} known, {counted(running, 'daemon')} running",
    )


def _check_platform(client: PlatformClient) -> _Row:
    started = time.monotonic()
    try:
        client.probe()
    except AuthError as exc:
        return _Row(
            Check.PLATFORM, False, f"the platform refused the key: {exc}", KEY_FIX, setup=True
        )
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
    return EXIT_USAGE if any(row.setup for row in failed) else EXIT_PARTIAL
