"""Test-only models of the worker tests: a log of what handlers ran."""

from django.db import models

from django_taskloop.models import TaskLoop

__all__ = ["WorkLog", "WorkerLoop"]


class WorkLog(models.Model):
    """One row per handler call (``phase`` "start" or "end"), written by worker processes."""

    kind = models.CharField(max_length=20)
    key = models.CharField(max_length=100)
    phase = models.CharField(max_length=10, default="end")
    pid = models.IntegerField()
    at = models.FloatField()

    class Meta:
        app_label = "testapp"
        indexes = [models.Index(fields=["kind", "key"], name="testapp_worklog_kind_key")]

    def __str__(self) -> str:
        return f"{self.kind} {self.key} {self.phase}"


class WorkerLoop(TaskLoop):
    """The loop that the worker tests drain."""

    class Meta:
        app_label = "testapp"
