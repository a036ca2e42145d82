"""Every failure evalpush reports, and the one place that decides what a failure means.

The tree (what the daemon does about each class in brackets)::

    EvalpushError
    ├── BadInput              the input is wrong [set it aside, name where, the rest goes on]
    │   ├── ConfigError       a config file or value; names the key and the file [exit 2]
    │   ├── UsageError        the command line names a run or directory that is not there [exit 2]
    │   ├── RunError          a run directory that cannot be uploaded (no config.toml, no env)
    │   ├── RunIdTaken        a directory holding another run's run id, not its copy [the run
    │   │                     it names is left alone; the directory is reported, not uploaded]
    │   └── BadRecord         one trace line or sample; names the line and the reason
    ├── Transient             the platform did not do the work; retry later with backoff
    │   ├── Unreachable       no connection at all; the whole daemon waits on one probe
    │   │   └── CertificateRefused  the platform's certificate failed verification
    │   └── Ambiguous         the platform may have done the work: reconcile with a read first
    ├── Refused               the platform refused this request; sending it again will not help
    │   ├── Unsendable        the request cannot be built or sent as it is (a bad header or URL)
    │   ├── UnusableAnswers   2xx answers that cannot be used, again and again (about a minute)
    │   ├── BatchRefused      413/422 on a samples batch: split it, then set samples aside
    │   ├── Gone              404: the evaluation was deleted; start a new one
    │   └── Conflict          409: the evaluation is already closed or finalized
    ├── NeedsPerson           nothing changes until an operator acts [pause, say so once]
    │   ├── AuthError         401/403 or no API key
    │   ├── CertificateError  push: the platform's certificate failed verification [exit 2]
    │   └── LedgerError       the state database cannot be written (full disk, corrupt, locked)
    │       ├── LedgerRefused  the database refused one run's value (past its limits) [that
    │       │                  run fails alone with the reason; the others go on]
    │       └── LedgerUnavailable  a shared ledger's PostgreSQL cannot be reached [an outage:
    │                          uploads pause, nothing is sent without its intent written]
    ├── Busy                  another live process holds the run's claim [leave the run alone]
    ├── ClaimLost             the run's claim was taken over: this upload stops, writing nothing
    └── Interrupted           a stop was requested while waiting; not a failure

`from_status` and `from_transport_error` map the platform's answers onto this tree exactly as
docs/PLATFORM_API.md's table says. Elsewhere only the `status` an error carries is read: the gate
takes an answer of any status for the platform being back, and the metrics count a 429 as
throttled. The messages built there are scrubbed of secrets (`evalpush.core.secrets.scrub`):
a server may echo the key back.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from evalpush.core.secrets import scrub

if TYPE_CHECKING:  # httpx is imported by the platform client, never for an error class
    import httpx

__all__ = [
    "Ambiguous",
    "AuthError",
    "BadInput",
    "BadRecord",
    "BatchRefused",
    "Busy",
    "CertificateError",
    "CertificateRefused",
    "ClaimLost",
    "ConfigError",
    "Conflict",
    "EvalpushError",
    "Gone",
    "Interrupted",
    "LedgerError",
    "LedgerRefused",
    "LedgerUnavailable",
    "NeedsPerson",
    "Refused",
    "RunError",
    "RunIdTaken",
    "Transient",
    "Unreachable",
    "Unsendable",
    "UnusableAnswers",
    "UsageError",
    "from_status",
    "from_transport_error",
    "parse_retry_after",
]

RETRY_AFTER_CAP_SECONDS = 3600.0
"""A `Retry-After` longer than this is read as this: a typo on the server must not park us for days."""


class EvalpushError(Exception):
    """Base of every error evalpush raises on purpose."""


class BadInput(EvalpushError):
    """The input is wrong; it is set aside with where and why, and the rest goes on. `fix`:
    what to do about it, when the message alone does not say."""

    def __init__(self, message: str = "", *, fix: str = "") -> None:
        super().__init__(message)
        self.fix = fix


class ConfigError(BadInput):
    """A configuration file or value is invalid; the message names the key and the file."""


class UsageError(BadInput):
    """The command line names a run or directory that does not exist."""


class RunError(BadInput):
    """A run directory cannot be uploaded as it stands (no config.toml, no environment name)."""


class RunIdTaken(BadInput):
    """A directory holds the run id of a run the ledger knows at another path, which is still
    there, and its traces are not that run's: it is not a copy, and it is not uploaded (one run
    id names one run); the run the ledger knows is left as it is."""


class BadRecord(BadInput):
    """One trace line that cannot become a sample, or one sample the platform cannot take."""

    def __init__(self, reason: str, *, line: int | None = None, size: int | None = None):
        self.reason = reason
        self.line = line
        self.size = size
        where = f"line {line}: " if line is not None else ""
        super().__init__(f"{where}{reason}")


class Transient(EvalpushError):
    """The platform did not do the work (or cannot be reached); retry later. `unusable`: a 2xx
    answer that cannot be used (not JSON, no id, a malformed page): retried a bounded number
    of times (`UnusableAnswers`), since one that comes back the same way may never change."""

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | None = None,
        status: int | None = None,
        unusable: bool = False,
    ):
        self.retry_after = retry_after
        self.status = status
        self.unusable = unusable
        super().__init__(message)


class Unreachable(Transient):
    """No connection could be made; nothing was sent."""


class CertificateRefused(Unreachable):
    """The platform's TLS certificate failed verification: nothing was sent. The daemon waits
    it out as an outage (certificates get fixed on the server); `push` stops at once
    (`CertificateError`)."""


class Ambiguous(Transient):
    """The request was sent and the answer lost: the platform may have done the work."""


class Refused(EvalpushError):
    """The platform refused this request; the same request will be refused again."""

    def __init__(self, message: str, *, status: int | None = None):
        self.status = status
        super().__init__(message)


class UnusableAnswers(Refused):
    """A 2xx answer that cannot be used came back attempt after attempt (for about a minute):
    the run fails with it (`retry` queues it again)."""


class Unsendable(Refused):
    """The request cannot be sent as built (an illegal header value or URL, a scheme the transport
    does not speak): nothing was sent, and the same request will fail the same way."""


class BatchRefused(Refused):
    """413 or 422 on a samples batch: this batch is refused, a smaller one may pass."""


class Gone(Refused):
    """404: the evaluation no longer exists on the platform."""


class Conflict(Refused):
    """409: the evaluation is already finalized or closed."""


class NeedsPerson(EvalpushError):
    """Nothing will change until an operator acts."""


class AuthError(NeedsPerson):
    """The API key is missing, wrong, or lacks access (401/403)."""


class CertificateError(NeedsPerson):
    """`push`: the platform's certificate failed verification; it exits 2 with the reason."""


class LedgerError(NeedsPerson):
    """The ledger cannot be read or written (full disk, corrupt or locked database)."""


class LedgerRefused(LedgerError):
    """The ledger's database refused a value of one run (one it cannot hold: past a limit of
    the database, or not text it takes). Not the whole ledger's failure: that run fails alone
    with the reason, and the others go on."""


class LedgerUnavailable(LedgerError):
    """A shared ledger's database cannot be reached (down, restarting, the network between).
    Not the operator's to fix like its parent: an outage, waited out. Whatever write raised it
    may or may not have been committed; the run resumes from the ledger as after a crash."""


class Busy(EvalpushError):
    """Another live process holds the run's claim: this one leaves the run alone."""

    def __init__(self, message: str, *, pid: int, host: str, since: float):
        self.pid = pid
        self.host = host
        self.since = since
        super().__init__(message)


class ClaimLost(EvalpushError):
    """The run's claim is no longer this process's (another took it over, presumed this one
    dead): the upload stops without another write; the new owner reconciles with the platform."""


class Interrupted(EvalpushError):
    """A stop was requested while waiting; the work is left for the next start."""


_TRANSIENT_STATUSES = {408, 429, 500, 503}
_AMBIGUOUS_STATUSES = {502, 504}


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds to wait from a `Retry-After` header (delta-seconds or HTTP-date), capped.

    None when absent or unparsable; a date in the past is 0.
    """
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        import email.utils  # ~12 ms of imports, for the rare answer that carries a date

        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - (now or datetime.now(UTC))).total_seconds()
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), RETRY_AFTER_CAP_SECONDS)


def from_status(
    status: int,
    *,
    what: str,
    replayable: bool = True,
    retry_after: str | None = None,
    body: str = "",
) -> EvalpushError:
    """The error a non-2xx answer stands for. `what` names the request for the message.

    A status says what the server meant, not what it did: a proxy answers 503 or 504 while the
    backend commits, an application raises its 500 after the commit, a layer in front answers
    408 or 429 to a request that went through. So for a step that must not be replayed
    (`replayable=False`: create, samples, finalize), every answer that would be retried is
    `Ambiguous`: reconciled with a read before anything is sent again. Only the refusals the
    platform documents are believed as they stand: 401/403 (the key), 413/422 (this batch),
    and 404/409, which the caller settles with a read of the evaluation anyway."""
    detail = scrub(f"{what}: HTTP {status}" + (f": {body[:200]}" if body else ""))
    wait = parse_retry_after(retry_after)
    if status in (401, 403):
        return AuthError(f"{detail} (check the API key and its access)")
    if status == 404:
        return Gone(detail, status=status)
    if status == 409:
        return Conflict(detail, status=status)
    if status in (413, 422):
        return BatchRefused(detail, status=status)
    retried = status in _AMBIGUOUS_STATUSES or status in _TRANSIENT_STATUSES or status >= 500
    if status in _AMBIGUOUS_STATUSES or (retried and not replayable):
        return Ambiguous(detail, retry_after=wait, status=status)
    if retried:
        return Transient(detail, retry_after=wait, status=status)
    return Refused(detail, status=status)


def from_transport_error(exc: httpx.RequestError, *, what: str) -> EvalpushError:
    """The error a failed httpx exchange stands for: was the request possibly acted on?

    A connection that never opened (`ConnectError`, its timeout, a proxy that refused the
    tunnel, no connection free in the pool) is `Unreachable`; one that broke or timed out after
    the request went out, or an answer that is not HTTP, is `Ambiguous`, since the platform may
    have done the work. A request that could not be put on the wire (`LocalProtocolError`: an
    illegal header value; `UnsupportedProtocol`) is `Unsendable`: retrying sends the same
    bytes, so it fails at once.
    """
    import httpx

    detail = scrub(f"{what}: {type(exc).__name__}: {exc}".rstrip(": "))
    if isinstance(exc, httpx.ConnectError) and "CERTIFICATE_VERIFY_FAILED" in str(exc):
        return CertificateRefused(
            f"{detail} (the platform's TLS certificate failed verification: fix it on the "
            "server, or name the CA that signed it in SSL_CERT_FILE)"
        )
    if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout, httpx.ProxyError)):
        return Unreachable(detail)
    if isinstance(exc, httpx.PoolTimeout):
        return Unreachable(detail)
    if isinstance(exc, (httpx.LocalProtocolError, httpx.UnsupportedProtocol)):
        return Unsendable(detail)
    return Ambiguous(detail)
