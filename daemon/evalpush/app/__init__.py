"""The composition root and the scheduler: every part of the pipeline built from a configuration, and the workers that upload."""

from evalpush.app.root import App
from evalpush.app.scheduler import Scheduler

__all__ = ["App", "Scheduler"]
