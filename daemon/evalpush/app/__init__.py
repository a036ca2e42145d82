"""The composition root, the scheduler and the upload attempt: every part of the pipeline built
from a configuration, the workers that upload, and what one upload of a run came to."""

from evalpush.app.attempt import Attempt, Outcome, attempt
from evalpush.app.root import App
from evalpush.app.scheduler import Scheduler

__all__ = ["App", "Attempt", "Outcome", "Scheduler", "attempt"]
