"""The lifecycle lines of an upload, one wording for `push` and the daemon: at info when an
upload starts and when it ends (finalized with samples, bytes, seconds and the viewer URL; held
or skipped with why), at warning when it failed (with why)."""

from __future__ import annotations

from evalpush.ledger import RunRecord
from evalpush.log import Logger
from evalpush.states import State


def upload_started(log: Logger) -> None:
    log.info("upload started")


def upload_ended(log: Logger, record: RunRecord, seconds: float) -> None:
    """What the upload of `record`'s run came to, after `seconds`."""
    if record.state == State.FINALIZED:
        log.info(
            "run finalized",
            evaluation=record.evaluation_id,
            url=record.viewer_url,
            samples=record.samples_sent,
            bytes=record.bytes_sent,
            seconds=round(seconds, 3),
        )
    elif record.state == State.FAILED:
        log.warning("upload failed", error=record.last_error)
    else:
        log.info("upload ended", state=record.state, reason=record.reason)


__all__ = ["upload_ended", "upload_started"]
