"""The service: `evalpush run`, the daemon that watches the roots and uploads finished runs.

It wires the stages: discover (a `Watcher` for hints, a `Scanner` for the truth) feeds the
`Tracker`, which decides readiness and hands ready runs to the `Scheduler`, whose workers run
the uploader (`App`). One loop, on the main thread, owns all of it:

- it waits on the hint queue, at most until the next thing is due: a rescan every
  `watch.rescan_seconds`, a waiting run's settle time, a look at the ledger for queued runs
  (`evalpush retry`), a watchdog ping and a STATUS line for systemd;
- signal handlers only record (`request`); the loop acts between turns: SIGTERM/SIGINT stop it
  (no new work; an upload in flight is cut off within a second or two and resumes at its step
  next start; exit 0), SIGHUP reloads: the configuration is read again and, if valid, every
  part is rebuilt from it (nothing is patched; a bad new configuration is logged and the old
  one kept), and the credentials are read again;
- sd_notify: READY=1 once the ledger's runs are loaded, the roots are watched and this
  daemon's heartbeat row names the roots it follows runs under, before the first walk of the
  tree (it runs on the loop, a part per turn at a bounded rate), STATUS= kept current,
  WATCHDOG=1 from this loop (a wedged loop is restarted by systemd), STOPPING=1;
- the STATUS line and the gate's state go to this daemon's heartbeat row in the ledger (for
  `status`), and, with `[metrics] listen` set, runs by state to the metrics
  (`metrics.DaemonFeed`, which also serves `/metrics`, `/livez` and `/readyz` and hears of
  every request, retry and batch; each turn of the loop is what `/livez` reads).

No key, or a key the platform refuses, does not stop it: uploads wait on the gate, which says
so once and probes again as soon as the key changes. Nor does a shared ledger's database going
away (`LedgerUnavailable`): an upload stops where its write failed (nothing is sent without its
intent written) and is queued again once the database answers; the loop keeps turning, says so
at the outage cadence, and `/readyz` answers 503 meanwhile.

Each daemon keeps a row in the ledger's `daemons` table (its heartbeat, with the STATUS line
and the gate), which is how `status` shows this host's daemon and its gate, and, on a shared
ledger, the fleet's daemons.
"""

from __future__ import annotations

import enum
import os
import queue
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from evalpush import __version__
from evalpush.app import App, Outcome, Scheduler, attempt
from evalpush.config import Config
from evalpush.core import paths
from evalpush.core.errors import (
    AuthError,
    ClaimLost,
    ConfigError,
    EvalpushError,
    LedgerError,
    LedgerUnavailable,
)
from evalpush.discover import (
    Hint,
    HintKind,
    HintQueue,
    Scanner,
    SweepShare,
    Watcher,
    Watches,
    refuse_relative_roots,
)
from evalpush.ledger.records import HEARTBEAT_SECONDS, GateState
from evalpush.log import get_logger
from evalpush.service.counts import RunCounts
from evalpush.service.sdnotify import Notifier
from evalpush.service.tracker import Tracker

STATUS_SECONDS = HEARTBEAT_SECONDS
STARTING = "starting: roots watched, the first walk of the tree to come"
"""The heartbeat row's STATUS line from READY=1 to the end of the daemon's first turn."""
"""How often the STATUS line for systemd (and the heartbeat row, and the metrics' runs by
state) is brought up to date."""

if TYPE_CHECKING:
    from evalpush.service.metrics import DaemonFeed
OUTAGE_TURN_SECONDS = 2.0
"""While a shared ledger's database is unreachable, the loop tries its rescan this often."""
RESCAN_BUDGET = 2000
RESCAN_PAUSE_SECONDS = 0.05
"""A rescan looks at this many directories per turn of the loop, this long apart, so the first
walk of a large tree (every directory listed) runs at a bounded rate (about 40,000 directories
a second at most, half a core) while hints and uploads go on between its parts."""
HINT_GATHER_SECONDS = 0.1
"""A turn of the loop that wakes on a hint first lets the hints of this long gather: a run being
written gives an event per line (a hundred a second, for a fast eval), and the hints of one run
waiting together are one look (`HintQueue` holds each once). A new run is found this much later."""
MAX_WAIT_SECONDS = 5.0
"""The loop's longest sleep without a hint (a bound on how late anything due can be)."""


class Request(enum.StrEnum):
    """What a signal asked of the loop."""

    STOP = "stop"
    RELOAD = "reload"


class _Parts:
    """What one configuration builds: the app, the scheduler, discover and the tracker."""

    def __init__(
        self,
        config: Config,
        hints: HintQueue,
        *,
        environ: Mapping[str, str] | None,
        home: Path | None,
        feed: DaemonFeed | None = None,
    ) -> None:
        self.config = config
        self._feed = feed
        self._hints = hints
        hooks: dict[str, Any] = {}
        if feed is not None:  # the metrics hear of every request, retry and batch
            hooks = {"observer": feed, "on_retry": feed.retried, "progress": feed.batch_acked}
        self.app = App.from_config(config, environ=environ, home=home, **hooks)
        if self.app.ledger.upgrade is not None:
            self.app.ledger.upgrade.log()
        try:
            self.tracker = Tracker(
                self.app.ledger, config, self._submit, alive=self.app.claims.alive
            )
            self.scanner = Scanner.from_config(config.watch, config.runs, self._sweep_share)
            self.watcher = Watcher.from_config(config.watch, config.runs, hints)
            self.watches = Watches(self.watcher, self.scanner, self.tracker.settled)
            self.counts = RunCounts(self.app.ledger)
            self.scheduler: Scheduler[str] = Scheduler(
                self._upload, workers=config.upload.max_concurrent_runs, on_error=self._failed
            )
        except BaseException:
            self.app.close()
            raise
        self._log = get_logger(stage="service")
        process = self.app.claims.process
        # The pid namespace too: daemons in containers of one host may share pid and start.
        self.daemon_id = "/".join(
            (process.host, process.boot, process.pidns, str(process.pid), str(process.start))
        )
        self._started_at = time.time()

    def _sweep_share(self) -> SweepShare:
        """This daemon's part of the slow sweep, as a sweep begins: on a shared ledger, its place
        among the daemons running on it (by id, from their heartbeat rows), so the fleet sweeps
        the tree once, not once a host; alone, all of it. While the fleet changes (a daemon
        joins or leaves between two sweeps) a directory may be swept twice or wait one more
        period; when the ledger cannot say, this daemon sweeps all (twice, never missed)."""
        if self.app.ledger.server is None:
            return SweepShare(0, 1)
        now = time.time()
        try:
            running = {d.id for d in self.app.ledger.daemons() if d.running(now)}
        except EvalpushError:
            return SweepShare(0, 1)
        ids = sorted(running | {self.daemon_id})
        return SweepShare(ids.index(self.daemon_id), len(ids))

    def beat(self, status: str) -> None:
        """This daemon's heartbeat row in the ledger, with its STATUS line, its gate and the
        roots it follows runs under (what `push` reads to leave a run to a daemon)."""
        process = self.app.claims.process
        watching = self.watcher.watching
        follows = [paths.raw(root) for root in watching] if self.tracker.follows_runs else []
        self.app.ledger.daemon_seen(
            self.daemon_id,
            host=process.host,
            pid=process.pid,
            version=__version__,
            observer=", ".join(sorted({str(w) for w in watching.values()})),
            started_at=self._started_at,
            lease_seconds=self.config.ledger.lease_seconds,
            status=status,
            gate=msgspec.convert(self.app.gate.snapshot(), GateState),
            follows=follows,
        )

    def start(self) -> None:
        self.scheduler.start()
        try:
            self.watcher.start()
        except BaseException:
            self.scheduler.stop()
            raise

    def stop(self, *, for_good: bool = True) -> None:
        """Stop taking work, cut off what is in flight, join every thread, close the app;
        `for_good` (not a reload's): this daemon's row says it stopped."""
        self.app.request_stop()
        try:
            self.watcher.stop()
            self.scheduler.stop()
            if for_good:
                try:
                    self.app.ledger.daemon_stopped(self.daemon_id)
                except LedgerError as exc:  # its row ages past its lease instead
                    self._log.info(
                        "could not mark this daemon stopped in the ledger", error=str(exc)
                    )
        finally:
            self.app.close()

    def _submit(self, path: str) -> None:
        self.scheduler.submit(path)

    def _upload(self, path: str) -> None:
        """One scheduler job: one upload attempt of the run (`evalpush.app.attempt`, `push`'s
        too), whose result goes to the tracker (and the metrics). A run the ledger cannot
        record, or that clashes with another run's id, is left alone until its file changes;
        one a shared ledger's outage cut off is queued again once the database answers."""
        if self.tracker.job(path):
            self._stretch(path)
            return
        result = attempt(self.app, Path(path), retry_failed=False)
        if result.outcome == Outcome.LEDGER_UNAVAILABLE:
            self._after_outage(path)
        self.counts.changed()
        leave = result.outcome in (Outcome.LEDGER_REFUSED, Outcome.RUN_ID_TAKEN)
        if self.tracker.finished(path, result.record, leave_alone=leave):
            # A line appended while it uploaded (a resumed eval): its event was passed over
            # while the run was in flight, and the next rescan may be a minute away.
            self._hints.put(Hint(HintKind.RUN, path))
        if self._feed is not None and result.outcome not in (Outcome.ALREADY, Outcome.BUSY):
            self._feed.upload_done(result.record, result.set_aside)

    def _stretch(self, path: str) -> None:
        """A stretch of a followed run: its lines so far to its open evaluation. The run is
        looked at again after it (lines written meanwhile ask for the next stretch, and it may
        be ready)."""
        result = attempt(self.app, Path(path), retry_failed=False, follow=True)
        if result.outcome == Outcome.LEDGER_UNAVAILABLE:
            server = self.app.ledger.server
            if server is not None:
                server.wait_available(self.app.stop)
        lag = self.tracker.followed(path, result.record)
        self._hints.put(Hint(HintKind.RUN, path))
        if self._feed is not None and lag is not None:
            self._feed.followed(lag)

    def _after_outage(self, path: str) -> None:
        """The shared ledger went away mid-job (said by the store, once): wait for it, then
        queue the run again (it resumes from the ledger as after a crash). A stop ends the
        wait; the run resumes at the next start."""
        server = self.app.ledger.server
        if server is not None and server.wait_available(self.app.stop):
            self.scheduler.submit(path)  # runs once more after this job ends

    def _failed(self, path: str, exc: BaseException) -> None:
        self.tracker.finished(path, None)
        self._run_logger(path).error(
            "upload failed unexpectedly", error=paths.printable(str(exc)), exc_info=exc
        )

    def _run_logger(self, path: str) -> Any:
        """The log bound to a run: its id and its path, shown escaped (a name that is not UTF-8
        would otherwise reach the JSON line as a lone surrogate)."""
        return self._log.bind(run=self.app.run_id_of(Path(path)), path=paths.display(path))


class Daemon:
    """`evalpush run`. `load_config` reads the configuration (again on SIGHUP)."""

    def __init__(
        self,
        load_config: Callable[[], Config],
        *,
        notifier: Notifier | None = None,
        environ: Mapping[str, str] | None = None,
        home: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
        config_file: str | None = None,
    ) -> None:
        """`config_file`: the file `load_config` reads (None: none), for the start-up line."""
        self._config_file = config_file
        self._load_config = load_config
        self._notifier = notifier or Notifier(None)
        self._environ = environ
        self._home = home
        self._clock = clock
        self._hints = HintQueue()
        # A signal handler may interrupt the main thread anywhere, another handler included:
        # SimpleQueue.put is reentrant (a lock taken there would deadlock a second signal that
        # arrives while the first handler holds it).
        self._requests: queue.SimpleQueue[Request] = queue.SimpleQueue()
        self._log = get_logger(stage="service")
        self._feed: DaemonFeed | None = None

    def request(self, what: Request) -> None:
        """Record what a signal asks; the loop acts on it (safe from a signal handler, and
        from one interrupting another)."""
        self._requests.put(what)
        self._hints.put(Hint(HintKind.WAKE, ""))

    def run(self, config: Config) -> int:
        """Run until a stop is requested; 0 then. `ConfigError` if `config` cannot start; an
        error the loop cannot go on from (an unusable ledger) is raised after every part, the
        ones a reload built included, is stopped."""
        self._parts = self._build(config)
        try:
            self._notifier.ready()
            self._log.info("evalpush daemon running", **self._start_facts(self._parts))
            self._loop()
        finally:
            self._notifier.stopping()
            self._log.info("evalpush daemon stopping")
            self._parts.stop()
            if self._feed is not None:
                self._feed.stop()
        return 0

    def _start_facts(self, parts: _Parts) -> dict[str, Any]:
        """The start-up line's fields: what an operator checks first (never the key)."""
        config, app = parts.config, parts.app
        try:
            credentials = app.client.credentials
            platform, key_source = credentials.api_base, credentials.key_source
        except EvalpushError:
            platform = config.platform.api_base_url or "(from the environment: not usable yet)"
            key_source = "none found (uploads wait for one)"
        watching = parts.watcher.watching
        roots = {
            str(root): str(watching.get(os.path.realpath(root), "not there yet: waited for"))
            for root in config.watch.roots
        }
        return {
            "version": __version__,
            "config": self._config_file or "(none: defaults and the environment)",
            "platform": platform,
            "key_source": key_source,
            "roots": roots,
            "metrics": (self._feed.url if self._feed is not None else None) or "off",
            "state_dir": str(config.state_dir),
            "ledger": app.ledger.where,
            **({"ignored_retired_keys": list(config.ignored)} if config.ignored else {}),
        }

    def _build(self, config: Config) -> _Parts:
        refuse_relative_roots(config.watch)
        if self._feed is None and config.metrics.listen:
            from evalpush.service.metrics import DaemonFeed

            self._feed = DaemonFeed()
        parts = _Parts(config, self._hints, environ=self._environ, home=self._home, feed=self._feed)
        try:
            parts.start()
            parts.tracker.load()
            if self._feed is not None:
                self._feed.attach(config.metrics, parts.app.gate, parts.app.ledger.path)
                if self._feed.url is not None:
                    self._log.info("serving /metrics, /livez and /readyz", url=self._feed.url)
            self._check_credentials(parts)  # a ConfigError (an unusable URL) stops the parts too
            # Its heartbeat row, naming the roots it follows (and its gate), before READY=1 (at
            # start and after a reload): `systemctl restart` returns at READY=1, and a `push`
            # right after must leave a run this daemon follows to it. Its STATUS line comes at
            # the end of the first turn: counting a million finished runs does not hold READY.
            self._beat(parts, STARTING)
        except BaseException:
            parts.stop()
            raise
        return parts

    def _check_credentials(self, parts: _Parts) -> None:
        """Say at start that there is no usable key, once: the gate is closed with it (and says
        so), so the first upload waits on the gate for a key instead of saying it again."""
        app = parts.app
        try:
            app.client.credentials  # noqa: B018 - read them now to report a missing key
        except AuthError as exc:
            app.gate.report(exc, app.gate.wait_open(app.stop, app.client))  # open: no wait

    # ------------------------------------------------------------ the loop

    def _loop(self) -> None:
        """Turn until a stop is requested. `self._parts` is always what runs now (a reload
        replaces it), so whatever way the loop ends, `run` stops what is running."""
        parts = self._parts
        now = self._clock()
        next_rescan = now  # the first scan: queued before READY, done on the first turn
        next_poll = now + parts.config.watch.ledger_poll_seconds
        next_status = now
        settles = float("inf")
        while True:
            wait = min(next_rescan, next_poll, next_status, _monotonic_of(settles)) - self._clock()
            if self._notifier.watchdog_seconds is not None:
                wait = min(wait, self._notifier.watchdog_seconds)
            hint = self._hints.get(max(0.0, min(wait, MAX_WAIT_SECONDS)))
            if hint is not None:
                time.sleep(HINT_GATHER_SECONDS)
            requests = self._take_requests()
            if Request.STOP in requests:
                return
            if Request.RELOAD in requests:
                parts = self._parts = self._reload(parts)
                next_rescan = self._clock()
            now = self._clock()
            try:
                while hint is not None:
                    if hint.kind == HintKind.RESCAN:  # events were lost
                        next_rescan = now
                    try:
                        self._follow(parts, hint)
                    except (LedgerUnavailable, ClaimLost):
                        # Its look did not happen: the next rescan looks inside the runs it
                        # named, finalized ones too (the rescan would pass them by).
                        parts.scanner.again_under(hint.path)
                        raise
                    hint = self._hints.get(0)
                if now >= next_rescan:
                    parts.watcher.sync()  # a root that appeared or was replaced: the scan covers it
                    rescan = parts.scanner.rescan(parts.tracker, budget=RESCAN_BUDGET)
                    try:
                        parts.tracker.rescanned(rescan, parts.scanner.knows)
                    except (LedgerUnavailable, ClaimLost):
                        parts.scanner.again(rescan.runs)  # the next rescan looks at them again
                        raise
                    finally:
                        parts.watches.rescanned(rescan)
                    rest = _rescan_seconds(parts) if rescan.over else RESCAN_PAUSE_SECONDS
                    next_rescan = now + rest
                if now >= next_poll:
                    parts.tracker.poll_ledger()
                    next_poll = now + parts.config.watch.ledger_poll_seconds
                settles = parts.tracker.due()
            except LedgerUnavailable:
                # Said by the store (at the outage cadence); what this turn missed (a hint, a
                # rescan), the rescan after the database is back finds.
                next_rescan = next_poll = now + OUTAGE_TURN_SECONDS
                settles = float("inf")
            except ClaimLost as exc:
                # A write about a waiting run lost its race with another process's claim (a
                # fleet's other daemon, a push): the run is theirs now, and what else this turn
                # had to look at, the next rescan looks at.
                self._log.info("a run was claimed by another process meanwhile", error=str(exc))
                next_rescan = now + OUTAGE_TURN_SECONDS
            if now >= next_status:
                self._publish(parts)
                next_status = now + STATUS_SECONDS
            self._notifier.ping_if_due(self._clock())
            if self._feed is not None:
                self._feed.loop_turned()

    def _follow(self, parts: _Parts, hint: Hint) -> None:
        if hint.kind == HintKind.RUN:
            rundir = parts.scanner.look(hint.path)
            parts.tracker.look(hint.path, rundir)
            if rundir is not None:
                parts.watches.runs([hint.path])
        elif hint.kind == HintKind.SUBTREE:
            parts.watches.subtree(hint.path, parts.tracker.seen)
        elif hint.kind == HintKind.ROOT:
            for root in parts.watcher.sync():
                parts.watches.subtree(root, parts.tracker.seen)

    def _take_requests(self) -> set[Request]:
        taken = set()
        while True:
            try:
                taken.add(self._requests.get_nowait())
            except queue.Empty:
                return taken

    # ------------------------------------------------------------ SIGHUP

    def _reload(self, parts: _Parts) -> _Parts:
        """Read the configuration again; if it is valid, rebuild every part from it."""
        self._notifier.reloading()
        try:
            config = self._load_config()
        except ConfigError as exc:
            self._log.error(
                "reload: the new configuration is not valid; keeping the old one", error=str(exc)
            )
            self._notifier.ready()
            return parts
        changed = _changes(parts.config, config)
        self._log.info("reload: rebuilding from the configuration", changed=changed or "nothing")
        parts.stop(for_good=False)
        try:
            rebuilt = self._build(config)
        except EvalpushError as exc:
            self._log.error(
                "reload: cannot start with the new configuration; keeping the old one",
                error=str(exc),
            )
            rebuilt = self._build(parts.config)
        self._notifier.ready()
        return rebuilt

    # ------------------------------------------------------------ STATUS

    def _publish(self, parts: _Parts) -> None:
        """The STATUS line to systemd, runs by state to the metrics, and both with the gate in
        this daemon's heartbeat row in the ledger (for `status`)."""
        try:
            counts: dict[str, int] | LedgerUnavailable = parts.counts.now()
        except LedgerUnavailable as exc:
            counts = exc
        status = self._status_line(parts, counts)
        self._notifier.status(status)
        self._beat(parts, status)
        if self._feed is not None:
            self._feed.refresh(parts.app.ledger, counts, parts.tracker.following)

    def _beat(self, parts: _Parts, status: str) -> None:
        """This daemon's heartbeat row with `status`; one not written is the next one's."""
        try:
            parts.beat(status)
        except LedgerError as exc:
            self._log.debug("heartbeat not written", error=str(exc))

    @staticmethod
    def _status_line(parts: _Parts, counts: dict[str, int] | LedgerUnavailable) -> str:
        server = parts.app.ledger.server
        if server is not None:
            server.report_if_due()
            if server.down_seconds is not None:
                return f"shared ledger unreachable for {server.down_seconds:.0f} s: uploads paused"
        if isinstance(counts, LedgerUnavailable):
            return "shared ledger unreachable: uploads paused"
        words = [
            f"{counts.get(state, 0):,} {state}"
            for state in ("uploading", "ready", "waiting", "finalized", "failed", "held")
            if counts.get(state) or state in ("uploading", "waiting", "finalized")
        ]
        gate = parts.app.gate.state
        words.append("platform reachable" if gate == "open" else f"platform {gate}")
        return ", ".join(words)


def _rescan_seconds(parts: _Parts) -> float:
    """Until the next rescan: `watch.rescan_seconds`, or `watch.poll_seconds` when a root is
    polled (no event comes from it: the rescan is how its changes are seen)."""
    watch = parts.config.watch
    return (
        min(watch.rescan_seconds, watch.poll_seconds)
        if parts.watcher.polling
        else watch.rescan_seconds
    )


def _monotonic_of(wall: float) -> float:
    """A wall-clock deadline (the tracker's settle times) on the monotonic clock."""
    return wall - time.time() + time.monotonic()


def _changes(old: Config, new: Config) -> dict[str, Any]:
    """What a reload changes, key by key (`section.key`: [old, new])."""
    before, after = old.model_dump(mode="json"), new.model_dump(mode="json")
    return {
        f"{section}.{key}": [before[section].get(key), value]
        for section, values in after.items()
        for key, value in values.items()
        if before[section].get(key) != value
    }


__all__ = ["Daemon", "Request"]
