"""The lifecycle lines of an upload, one wording for `push` and the daemon: at info when an
upload starts and when it ends (finalized with samples, bytes, seconds, the viewer URL and the
count of records set aside; held or skipped with why). A run finalized with records set aside,
or with fewer traces than its config.toml expects, is a warning: partial is said loudly. A
failed upload is an error, its message ending with what to do next."""

from __future__ import annotations

from evalpush.core.states import State
from evalpush.ledger import RunRecord
from evalpush.log import Logger


def upload_started(log: Logger) -> None:
    log.info("upload started")


def upload_ended(
    log: Logger,
    record: RunRecord,
    seconds: float,
    *,
    set_aside: int = 0,
    expected: int | None = None,
) -> None:
    """What the upload of `record`'s run came to, after `seconds`; `set_aside`: its records
    set aside, `expected`: the traces its config.toml expects (None: unknown)."""
    if record.state == State.FINALIZED:
        seen = record.samples_seen + set_aside
        short = expected is not None and seen < expected
        fields = {
            "evaluation": record.evaluation_id,
            "url": record.viewer_url,
            "samples": record.samples_sent,
            "bytes": record.bytes_sent,
            "seconds": round(seconds, 3),
            "set_aside": set_aside,
        }
        if short:
            fields |= {"seen_traces": seen, "expected_traces": expected}
        if set_aside or short:
            log.warning("run finalized", complete=False, **fields)
        else:
            log.info("run finalized", **fields)
    elif record.state == State.FAILED:
        log.error("upload failed", error=record.last_error)
    else:
        log.info("upload ended", state=record.state, reason=record.reason)


__all__ = ["upload_ended", "upload_started"]
