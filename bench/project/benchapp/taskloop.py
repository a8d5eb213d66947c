"""The benchmark's handlers: a no-op tube task and a no-op board job that record that they ran."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from django_taskloop.workers import board, tube

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from common import record  # noqa: E402


@tube("bench", batch=100)
def noop(task: Any) -> None:
    """Run nothing; the record is the whole job."""
    record(task.data)


@board("bench-board", batch=100)
def noop_job(job: Any) -> None:
    """Run nothing; the record is the whole job."""
    record(job.details["n"])


try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task


@task()
def noop_task(n: int) -> None:
    """A Django Task that does nothing: the enqueue scenario times its ``enqueue()``."""


@task()
def startup_task(n: int) -> None:
    """A Django Task that records its start: the startup scenario times spawn → here."""
    record(n)
