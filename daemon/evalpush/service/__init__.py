"""The daemon (`evalpush run`): the tracker of runs under the roots, metrics and health, sd_notify."""

from evalpush.service.daemon import Daemon, Request
from evalpush.service.feeder import FEED_BYTES
from evalpush.service.metrics import (
    MAX_CONNECTIONS,
    RUN_STATES,
    DaemonFeed,
    Endpoint,
    Health,
    Metrics,
    MetricsServer,
    Outcome,
    Probes,
    ledger_file_bytes,
    observed,
    outcome_of,
    server_for,
)
from evalpush.service.sdnotify import MAX_STATUS_CHARS, Notifier
from evalpush.service.tracker import Tracker

__all__ = [
    "Daemon",
    "DaemonFeed",
    "Endpoint",
    "FEED_BYTES",
    "Health",
    "MAX_CONNECTIONS",
    "MAX_STATUS_CHARS",
    "Metrics",
    "MetricsServer",
    "Notifier",
    "Outcome",
    "Probes",
    "RUN_STATES",
    "Request",
    "Tracker",
    "ledger_file_bytes",
    "observed",
    "outcome_of",
    "server_for",
]
