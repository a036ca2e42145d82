"""The daemon (`evalpush run`): the tracker of runs under the roots, metrics (`metrics`), health
(`health`) and the server of both (`server`), sd_notify."""

from evalpush.service.daemon import Daemon, Request
from evalpush.service.feeder import FEED_BYTES
from evalpush.service.health import Health, Probes
from evalpush.service.metrics import (
    RUN_STATES,
    DaemonFeed,
    Endpoint,
    Metrics,
    RequestOutcome,
    ledger_file_bytes,
    outcome_of,
    server_for,
)
from evalpush.service.sdnotify import MAX_STATUS_CHARS, Notifier
from evalpush.service.server import MAX_CONNECTIONS, MetricsServer
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
    "Probes",
    "RUN_STATES",
    "Request",
    "RequestOutcome",
    "Tracker",
    "ledger_file_bytes",
    "outcome_of",
    "server_for",
]
