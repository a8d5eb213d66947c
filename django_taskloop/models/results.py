"""Results of Django Tasks run through :class:`django_taskloop.backends.TaskloopBackend`."""

from __future__ import annotations

import datetime as dt
import secrets

from django.db import models

from ..exceptions import TaskExpired

__all__ = ["TaskRecord", "TaskRecordStatus"]


def _new_id() -> str:
    # 128 random bits as 32 hex digits: as unguessable as a UUID4, and a twentieth of the
    # cost of get_random_string(32) (one os.urandom call instead of 32 choices), which an
    # enqueue pays on every call.
    return secrets.token_hex(16)


class TaskRecordStatus(models.TextChoices):
    """The states of Django's ``TaskResultStatus``, spelled the same."""

    READY = "READY", "Ready"
    RUNNING = "RUNNING", "Running"
    FAILED = "FAILED", "Failed"
    SUCCESSFUL = "SUCCESSFUL", "Successful"


class TaskRecord(models.Model):
    """One enqueued Django Task: its call, where it waits, and how it ended.

    The waiting itself happens in a tube (one per queue name); this row holds what Django's
    ``TaskResult`` shows, so that ``get_result()`` works from any process.
    """

    id = models.CharField(primary_key=True, max_length=32, default=_new_id, editable=False)
    backend = models.CharField(max_length=100)
    queue_name = models.CharField(max_length=100)
    #: Dotted path of the ``Task`` object (the decorated function's module and name).
    task_path = models.CharField(max_length=255)
    priority = models.SmallIntegerField(default=0)
    run_after = models.DateTimeField(null=True, blank=True)
    takes_context = models.BooleanField(default=False)
    args = models.JSONField(default=list)
    kwargs = models.JSONField(default=dict)
    status = models.CharField(max_length=10, choices=TaskRecordStatus.choices, default=TaskRecordStatus.READY)
    return_value = models.JSONField(null=True, blank=True)
    #: ``[{"exception_class_path": …, "traceback": …}, …]``
    errors = models.JSONField(default=list)
    worker_ids = models.JSONField(default=list)
    enqueued_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    last_attempted_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    #: Seconds the task may wait to start, counted from ``enqueued_at`` or, if later,
    #: ``run_after`` (the ``ttl`` option; ``None``: for ever). See :meth:`expiry`.
    ttl = models.FloatField(null=True, blank=True)

    class Meta:
        app_label = "django_taskloop"
        db_table = "taskloop_task_record"
        verbose_name = "Django task result"
        indexes = [
            # Pruning finished results past RESULT_RETENTION.
            models.Index(fields=["status", "finished_at"], name="taskloop_taskrec_status_fin"),
        ]

    def __str__(self) -> str:
        return f"{self.task_path} [{self.status}] {self.id}"

    def ttl_deadline(self, ttl: float | None = None) -> dt.datetime | None:
        """Return when the task, not started yet, expires (``None``: it does not).

        ``ttl`` stands in for :attr:`ttl` on records stored without it (enqueued before the
        column existed: their tube task's data carries it)."""
        ttl = self.ttl if self.ttl is not None else ttl
        since = self._ttl_since()
        if ttl is None or self.started_at is not None or since is None:
            return None
        return since + dt.timedelta(seconds=ttl)

    def _ttl_since(self) -> dt.datetime | None:
        # A run_after later than the enqueue extends the lifetime, as a delay does in a tube.
        if self.enqueued_at is None:
            return None
        return max(self.enqueued_at, self.run_after or self.enqueued_at)

    def expiry(self, now: dt.datetime, ttl: float | None = None) -> TaskExpired | None:
        """Return why the task has expired at ``now`` (the database's clock), else ``None``.

        The single definition of an expired Django Task: READY and not started past its
        :meth:`ttl_deadline`. ``get_result()`` reads it as FAILED at once; the worker that
        reaches it records that end and never calls the task."""
        deadline = self.ttl_deadline(ttl)
        if deadline is None or self.status != TaskRecordStatus.READY or now <= deadline:
            return None
        ttl = self.ttl if self.ttl is not None else ttl
        return TaskExpired(f"not started within its ttl of {ttl:g} s (since {self._ttl_since()})")
