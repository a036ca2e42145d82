"""The daemon (`evalpush run`): the tracker of runs under the roots, metrics (`metrics`), health
(`health`) and the server of both (`server`), sd_notify."""

from evalpush.service.daemon import Daemon, Request
from evalpush.service.feeder import FEED_BYTES
from evalpush.service.sdnotify import MAX_STATUS_CHARS, Notifier
from evalpush.service.tracker import Tracker

__all__ = ["Daemon", "FEED_BYTES", "MAX_STATUS_CHARS", "Notifier", "Request", "Tracker"]
