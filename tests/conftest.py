"""Shared fixtures: a real local platform on loopback, clients pointed at it, fast retries,
`evalpush` as a subprocess. The helpers behind them are in `support/` (builders of runs and
environments, the producer's run generator, waiting, the thread check): import from there.

Every test runs under `no_thread_outlives_its_test` (autouse): a test that leaves a thread
running fails, daemon threads (watchdog's) included, so whatever starts a thread must stop it;
`no_thread_outlives_its_module` (autouse) does the same for module-scoped fixtures.
`--viewer-screenshot PNG` saves the viewer page's browser-test screenshot there
(tests/test_dashboard.py).

Fixtures for tests that talk to the platform:

- `local_platform`: a started `evalpush.local_platform.LocalPlatform` on an ephemeral loopback
  port with a random bearer key (in memory; stopped after the test). Drive it with
  `local_platform.inject("status", on="create", status=503, count=2)`, `inject("reset",
  on="samples")`, `inject("stall", on="finalize", seconds=1)`, `inject("malformed", on="create")`,
  `inject("refuse", seconds=0.5)`; check what it stored with `local_platform.summary()` (per
  evaluation: status, metadata, sample_count, distinct_sample_ids, duplicates, finalize_count;
  `runs`: evaluations per metadata.run_id; `requests`: requests per kind) and
  `local_platform.samples(evaluation_id)`.
- `make_platform_client(**platform_settings, api_key=None, environ=None, stop=None)`: a `PlatformClient`
  for `local_platform` (its key, its URL, an empty temporary home so no real
  `~/.prime/config.json` leaks in, 2 s connect / 5 s read timeouts unless given). `environ`
  replaces the environment it reads credentials from; mutate that dict and the next
  `reload_credentials()` sees it. Clients are closed after the test.
- `platform_client`: `make_platform_client()` with the defaults.
- `ledger`: a real ledger file, `tmp_path/state/state.db`, closed after the test.
- `stop_event`: a `threading.Event` set after the test, so nothing keeps waiting on it.
- `fast_gate`: a `retry.Gate` whose probes back off by milliseconds.
- `make_retrier(client)`: a `retry.Retrier(client, fast_gate, stop_event)` with millisecond
  backoff, for a client made with `make_platform_client`.
- `retrier`: `make_retrier(platform_client)`:
  `retrier.call(lambda: platform_client.create_evaluation(body), replayable=False, what=..., run=...)`.

Fixtures for tests that run `python -m evalpush ...` (support/commands.py, support/environ.py):

- `platform`: `local_platform` by the name the subprocess tests use (a module overrides it for a
  platform of its own, e.g. one with a known key).
- `evalpush(*args, **env)`: `evalpush ARGS...` run to its end with `cli_environ(platform,
  tmp_path)` (the platform's key and URL, a private state dir and home) plus `env`.
- `start_evalpush(environ, *args)`: `evalpush ARGS...` started (output piped); any still running
  when the test ends is continued and killed.
- `tree`: an empty outputs root, `tmp_path/outputs`, for a daemon to watch.
- `open_dir`: a directory every user may enter (for tests that drop to user `nobody`).
"""

from __future__ import annotations

import compileall
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
import tenacity

import evalpush as evalpush_package  # the `evalpush` fixture has the plain name
from evalpush.client import Gate, PlatformClient, Retrier
from evalpush.config import PlatformConfig
from evalpush.core import secrets
from evalpush.ledger import Ledger, default_path
from evalpush.local_platform import LocalPlatform
from support import commands, threads
from support.environ import cli_environ
from support.files import open_directory
from support.postgres import PASSWORD as PG_PASSWORD
from support.postgres import Cluster
from support.postgres import binaries as postgres_binaries

pytest_plugins = ["pytester"]  # test_thread_guard.py runs a session of leaky tests

FAST_WAIT = tenacity.wait_random_exponential(multiplier=0.002, max=0.02)


def pytest_configure(config: pytest.Config) -> None:
    """Byte-compile evalpush once, before any worker starts: the tests start `python -m
    evalpush` hundreds of times, and an editable install has no `.pyc` files of its own; where
    `PYTHONDONTWRITEBYTECODE` is set (CI images set it) every one of those processes would
    compile every module again (~0.2 CPU s each)."""
    if not hasattr(config, "workerinput"):  # the controller, or a run without workers
        compileall.compile_dir(Path(evalpush_package.__file__).parent, quiet=1)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--viewer-screenshot",
        metavar="PNG",
        type=Path,
        help="also save the viewer page's browser-test screenshot here (docs/viewer.png)",
    )


_REPORTED: set[threading.Thread] = set()
"""Threads a test's guard already failed it for: its module's guard does not name them again."""


@pytest.fixture(autouse=True)
def no_thread_outlives_its_test() -> Iterator[None]:
    """Fail a test that leaves a thread alive (after a short grace to finish).

    Daemon threads count too (`support.threads`). No thread is exempt: nothing in evalpush is
    meant to outlive the part that started it. Threads of module-scoped fixtures were started
    before this snapshot; `no_thread_outlives_its_module` checks them.
    """
    before = threads.alive()
    yield
    if leaked := threads.outliving(before):
        _REPORTED.update(leaked)
        pytest.fail(f"threads outlived the test: {', '.join(map(threads.describe, leaked))}")


@pytest.fixture(autouse=True)
def log_setup_restored() -> Iterator[None]:
    """A command run in this process (`cli.main`) sets the log up for the process, at its level:
    put it back, so one test's command does not filter another's `capture_logs`."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


@pytest.fixture(autouse=True)
def secrets_restored() -> Iterator[None]:
    """A secret registered while a test runs (by the test, or a client or command it runs in
    this process) is redacted from all of this process's output from then on: put the registry
    back, so a later test's run ids and reasons are not redacted for an earlier test's key."""
    saved = secrets.registered()
    yield
    secrets.register_only(saved)


@pytest.fixture(autouse=True, scope="module")
def no_thread_outlives_its_module() -> Iterator[None]:
    """Fail the module's last test when a module-scoped fixture leaves a thread alive (e.g. a
    shared local platform not stopped)."""
    before = threads.alive()
    yield
    if leaked := threads.outliving(before | _REPORTED):
        _REPORTED.update(leaked)
        pytest.fail(f"threads outlived the module: {', '.join(map(threads.describe, leaked))}")


@pytest.fixture
def local_platform() -> Iterator[LocalPlatform]:
    with LocalPlatform() as platform:
        yield platform


@pytest.fixture
def make_platform_client(
    local_platform: LocalPlatform, tmp_path: Path
) -> Iterator[Callable[..., PlatformClient]]:
    clients: list[PlatformClient] = []
    home = tmp_path / "client-home"
    home.mkdir()

    def make(
        *,
        api_key: str | None = None,
        environ: dict[str, str] | None = None,
        stop: threading.Event | None = None,
        **settings: Any,
    ) -> PlatformClient:
        settings.setdefault("api_base_url", local_platform.base_url)
        settings.setdefault("connect_timeout_seconds", 2.0)
        settings.setdefault("read_timeout_seconds", 5.0)
        if environ is None:
            environ = {"PRIME_API_KEY": api_key or local_platform.api_key or "any-key"}
        client = PlatformClient(PlatformConfig(**settings), environ=environ, home=home, stop=stop)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def platform_client(make_platform_client: Callable[..., PlatformClient]) -> PlatformClient:
    return make_platform_client()


@pytest.fixture(scope="session")
def postgres() -> Iterator[Cluster]:
    """A PostgreSQL server of this test process's own (started at the first test that asks)."""
    bin_dir = postgres_binaries()
    if bin_dir is None:
        pytest.skip("no PostgreSQL server here (Debian's postgresql package; .ci/run installs it)")
    cluster = Cluster(bin_dir)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture
def pg_url(postgres: Cluster) -> str:
    """A new empty database on the test server: its URL (the password is `PG_PASSWORD`)."""
    return postgres.database()


@pytest.fixture
def sqlite_ledger(tmp_path: Path) -> Iterator[Ledger]:
    """A new ledger file, for what only the file has (its journal, its pages, its mode)."""
    with Ledger(default_path(tmp_path / "state")) as opened:
        yield opened


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Ledger]:
    """A new ledger in each store: the SQLite file, and a shared ledger in PostgreSQL."""
    if request.param == "sqlite":
        opened = Ledger(default_path(tmp_path / "state"))
    else:
        url = request.getfixturevalue("pg_url")
        opened = Ledger.shared(url, password=PG_PASSWORD)
    with opened:
        yield opened


@pytest.fixture
def stop_event() -> Iterator[threading.Event]:
    stop = threading.Event()
    yield stop
    stop.set()


@pytest.fixture
def fast_gate() -> Gate:
    return Gate(wait=FAST_WAIT, poll_seconds=0.01)


@pytest.fixture
def make_retrier(
    fast_gate: Gate, stop_event: threading.Event
) -> Callable[[PlatformClient], Retrier]:
    return lambda client: Retrier(client, fast_gate, stop_event, wait=FAST_WAIT)


@pytest.fixture
def retrier(
    make_retrier: Callable[[PlatformClient], Retrier], platform_client: PlatformClient
) -> Retrier:
    return make_retrier(platform_client)


@pytest.fixture
def platform(local_platform: LocalPlatform) -> LocalPlatform:
    return local_platform


@pytest.fixture
def evalpush(
    platform: LocalPlatform, tmp_path: Path
) -> Callable[..., subprocess.CompletedProcess[str]]:
    environ = cli_environ(platform, tmp_path)
    return lambda *args, **env: commands.evalpush(environ, *args, **env)


@pytest.fixture
def start_evalpush() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    started = commands.Started()
    yield started.start
    started.reap()


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "outputs"
    root.mkdir()
    return root


@pytest.fixture
def open_dir() -> Iterator[Path]:
    with open_directory() as path:
        yield path
