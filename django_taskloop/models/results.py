"""Results of Django Tasks run through :class:`django_taskloop.backends.TaskloopBackend`."""

from __future__ import annotations

import secrets

from django.db import models

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
