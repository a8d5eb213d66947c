"""The peers' no-op job: record that job ``n`` started, nothing else."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from common import record  # noqa: E402

try:  # Django 6
    from django.tasks import task
except ImportError:
    try:  # Django 5.2 with the django-tasks backport
        from django_tasks import task
    except ImportError:  # django-q2's environment: it calls noop() by its dotted path
        task = None


def noop(n: int) -> None:
    """Run nothing; the record is the whole job (django-q2 calls this by its dotted path)."""
    record(n)


if task is not None:

    @task()
    def noop_task(n: int) -> None:
        """The same job as a Django Tasks task (django-tasks-db, dj-queue)."""
        record(n)
