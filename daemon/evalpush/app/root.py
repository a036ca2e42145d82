"""The composition root: builds every part of the pipeline from a configuration, and closes it.

`App.from_config` opens the ledger and builds the platform client, the connectivity gate and
retry policy, the claims and the uploader; a test may pass in its own ledger or client (those it
then closes itself). Nothing here touches the process: log setup and signal handlers belong to
`main` (`evalpush.cli`). Credentials are not read here: the client
reads them at its first request (a missing key is then the gate's wait for one, not a crash).
A configuration reload builds a new `App` and closes the old one; nothing is patched in place.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import msgspec

from evalpush.client import Gate, PlatformClient, Retrier
from evalpush.config import Config
from evalpush.ledger import Claims, Ledger, open_ledger
from evalpush.runs import Run, derive_run_id, load_run
from evalpush.upload import Progress, Uploader
from evalpush.upload.context import Context, no_progress

if TYPE_CHECKING:
    from evalpush.client import RequestObserver

__all__ = ["App"]


class _Closeable(Protocol):
    def close(self) -> None: ...


class App(msgspec.Struct):
    """The wired parts. Use as a context manager; it closes what it opened."""

    config: Config
    ledger: Ledger
    client: PlatformClient
    gate: Gate
    retrier: Retrier
    claims: Claims
    uploader: Uploader
    stop: threading.Event
    _owned: list[_Closeable] = msgspec.field(default_factory=list)  # what `close` closes

    @classmethod
    def from_config(
        cls,
        config: Config,
        *,
        ledger: Ledger | None = None,
        client: PlatformClient | None = None,
        gate: Gate | None = None,
        stop: threading.Event | None = None,
        progress: Progress = no_progress,
        wait_on_auth: bool = True,
        environ: Mapping[str, str] | None = None,
        home: Path | None = None,
        clock: Callable[[], float] = time.time,
        observer: RequestObserver | None = None,
        on_retry: Callable[[], object] | None = None,
    ) -> App:
        """`environ` and `home` replace the process environment and home directory as the
        places credentials are read from (the demo isolates itself with them).
        `wait_on_auth=False` fails a run at once when the platform refuses the key, instead of
        waiting for a new one (for a one-shot command a person is watching). `observer` hears
        of every request the client makes and `on_retry` of every retry, a probe of an outage
        included (the daemon's metrics)."""
        stop = stop or threading.Event()
        owned: list[_Closeable] = []
        if ledger is None:
            ledger = open_ledger(config, clock=clock, stop=stop)
            owned.append(ledger)
        if client is None:
            client = PlatformClient(
                config.platform, environ=environ, home=home, stop=stop, observer=observer
            )
            owned.append(client)
        gate = gate or Gate(on_probe=on_retry)
        retrier = Retrier(client, gate, stop, wait_on_auth=wait_on_auth, on_retry=on_retry)
        claims = Claims(ledger, clock=clock, lease_seconds=config.ledger.lease_seconds)
        owned.append(claims)
        context = Context(
            config,
            ledger,
            client,
            retrier,
            progress=progress,
            clock=clock,
            lease_left=claims.lease_left,
        )
        uploader = Uploader(context, claims)
        return cls(config, ledger, client, gate, retrier, claims, uploader, stop, owned)

    def load_run(self, directory: Path) -> Run:
        """The run in `directory`, with the run id this ledger knows for its path."""
        return load_run(directory, known=self.ledger.run_id_at)

    def run_id_of(self, directory: Path) -> str:
        """The run id of `directory`, as `load_run` gives it (without reading its config)."""
        return derive_run_id(directory, known=self.ledger.run_id_at)

    def request_stop(self) -> None:
        """Stop taking work: waits end with `Interrupted`, a request in flight is cut off."""
        self.stop.set()
        self.gate.wake()

    def close(self) -> None:
        """Close what `from_config` opened, last opened first."""
        for part in reversed(self._owned):
            part.close()
        self._owned.clear()

    def __enter__(self) -> App:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
