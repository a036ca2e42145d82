"""Which ledger a configuration names, opened: the SQLite file in the state dir (`[ledger] url`
empty), or the shared ledger in PostgreSQL with its password found (`password_file`, else the
systemd credential `ledger-password`, else libpq's own `PGPASSWORD` / `~/.pgpass`)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from evalpush.config import Config
from evalpush.core.errors import ConfigError
from evalpush.core.secrets import register_secret
from evalpush.core.smallfile import SECRET_FILE_BYTES, read_small_file
from evalpush.ledger.file import default_path
from evalpush.ledger.store import Ledger

SYSTEMD_CREDENTIAL_NAME = "ledger-password"


def ledger_password(config: Config, environ: Mapping[str, str] | None = None) -> str | None:
    """The shared ledger's password, registered as a secret (never logged, never stored);
    None: libpq looks for one itself."""
    environ = os.environ if environ is None else environ
    path = config.ledger.password_file
    if path is None:
        credentials = environ.get("CREDENTIALS_DIRECTORY")
        candidate = Path(credentials) / SYSTEMD_CREDENTIAL_NAME if credentials else None
        if candidate is None or not candidate.exists():
            return None
        path = candidate
    path = path.expanduser()
    try:
        password = read_small_file(path, SECRET_FILE_BYTES)[0].decode("utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"ledger.password_file: cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"ledger.password_file: {path} is not UTF-8 text") from None
    if not password:
        raise ConfigError(f"ledger.password_file: {path} is empty")
    register_secret(password)
    return password


def where(config: Config) -> str:
    """The ledger as people are shown it: the file's path, or the shared ledger's URL."""
    if config.ledger.url:
        from evalpush.ledger.server import display_url

        return display_url(config.ledger.url)
    return str(default_path(config.state_dir))


def open_ledger(
    config: Config,
    *,
    read_only: bool = False,
    clock: Callable[[], float] = time.time,
    stop: threading.Event | None = None,
) -> Ledger:
    """The ledger `config` names, opened (the file is created if missing unless `read_only`;
    a shared ledger's tables are created in its database by the first to open it)."""
    if config.ledger.url:
        return Ledger.shared(
            config.ledger.url, password=ledger_password(config), clock=clock, read_only=read_only
        )
    if read_only:
        return Ledger.for_reading(default_path(config.state_dir))
    return Ledger(default_path(config.state_dir), clock=clock, stop=stop)
