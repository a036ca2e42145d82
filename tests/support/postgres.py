"""A real PostgreSQL for the tests: Debian's `postgresql` package, a cluster made with initdb in
a temporary directory, owned by a user who is not root (initdb refuses root), listening on a
free loopback port. `.ci/run` installs the package where it is missing.

Clients connect over TCP with a password (scram), as a fleet's hosts would; each test gets a
database of its own (`Cluster.database`).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

USER = "evalpush"
PASSWORD = "Qz7vK2mXw9pL4tRb"
"""The cluster's password for `USER`: a secret as far as the tests go (it must never reach a
log line, `status` or the ledger)."""


def binaries() -> Path | None:
    """Where initdb and pg_ctl are: the newest /usr/lib/postgresql/N/bin, or the PATH's."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=_major)
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).resolve().parent if initdb else None


def _major(path: str) -> int:
    try:
        return int(Path(path).parent.parent.name)
    except ValueError:
        return 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """One PostgreSQL server, started by `start` and gone after `destroy`."""

    def __init__(self, bin_dir: Path):
        self.bin_dir = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="evalpush-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self._user = self._runner()
        self._count = 0
        os.chmod(self.root, 0o700)
        if self._user is not None:
            os.chown(self.root, self._user.pw_uid, self._user.pw_gid)

    @staticmethod
    def _runner() -> pwd.struct_passwd | None:
        """The user the server runs as: this one, or (as root) `postgres`, else `nobody`."""
        if os.geteuid() != 0:
            return None
        for name in ("postgres", "nobody"):
            with contextlib.suppress(KeyError):
                return pwd.getpwnam(name)
        raise RuntimeError("running as root with no postgres or nobody user to run PostgreSQL")

    def _run(self, *argv: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(a) for a in argv],
            user=None if self._user is None else self._user.pw_uid,
            group=None if self._user is None else self._user.pw_gid,
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=120,
            check=check,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"},
        )

    def start(self) -> None:
        pwfile = self.root / "pw"
        pwfile.write_text(PASSWORD)
        if self._user is not None:
            os.chown(pwfile, self._user.pw_uid, self._user.pw_gid)
        self._run(
            self.bin_dir / "initdb",
            "-D",
            self.data,
            "-U",
            USER,
            "--pwfile",
            pwfile,
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            "--locale=C",
            "--encoding=UTF8",
        )
        pwfile.unlink()
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(
                f"listen_addresses = '127.0.0.1'\nport = {self.port}\n"
                f"unix_socket_directories = '{self.root}'\n"
                # Speed, not safety: a test cluster's data need not survive the host crashing
                # (a server killed, `restart -m immediate`, still recovers from its log).
                "fsync = off\nfull_page_writes = off\nmax_connections = 200\n"
            )
        self.pg_ctl("start", "-w", "-l", str(self.root / "log"))

    def pg_ctl(self, *args: str) -> None:
        result = self._run(self.bin_dir / "pg_ctl", "-D", self.data, *args, check=False)
        if result.returncode != 0:
            log = (self.root / "log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"pg_ctl {' '.join(args)}: {result.stderr}\n{log}")

    def restart(self) -> None:
        """What a crash and a restart do: `pg_ctl restart -m immediate`."""
        self.pg_ctl("restart", "-m", "immediate", "-w", "-l", str(self.root / "log"))

    def stop(self) -> None:
        self.pg_ctl("stop", "-m", "immediate", "-w")

    def url(self, database: str) -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def admin(self):  # noqa: ANN201 - a psycopg connection
        import psycopg

        return psycopg.connect(
            self.url("postgres"), password=PASSWORD, autocommit=True, connect_timeout=10
        )

    def database(self) -> str:
        """A new empty database; its URL (no password in it: pass `PASSWORD`)."""
        self._count += 1
        name = f"t{os.getpid()}_{self._count}"
        with self.admin() as admin:
            admin.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def destroy(self) -> None:
        with contextlib.suppress(RuntimeError, subprocess.SubprocessError, OSError):
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
