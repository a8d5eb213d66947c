"""Errors raised by django-taskloop. ``TaskloopError`` is the base of all of them."""

__all__ = [
    "TaskloopError",
    "NotFound",
    "JobFailure",
    "UnclaimableJob",
    "NotTaken",
    "TubeError",
    "DatabaseBusy",
    "TaskExpired",
]


class TaskloopError(Exception):
    """Base class of every error django-taskloop raises on purpose."""


class NotFound(TaskloopError, LookupError):
    """The job, task, tube, board or claim asked for does not exist (any more)."""


class JobFailure(TaskloopError):
    """A job-board operation was refused (e.g. the claim belongs to someone else)."""


class UnclaimableJob(JobFailure):
    """The job is already claimed (even by the same owner) and cannot be claimed."""


class NotTaken(TaskloopError):
    """ack/release/touch of a task that the caller does not hold."""


class TubeError(TaskloopError):
    """A tube-level refusal: unsupported operation, drop with taken tasks, tube exists."""


class DatabaseBusy(TaskloopError):
    """The database stayed locked or deadlocked after the engine's bounded retries."""


class TaskExpired(TaskloopError):
    """A Django Task with a ``ttl`` was not started within it: it ends FAILED, never runs late."""
