"""Handlers of the progress tests (issue 29, item 2): each reports its progress over and over
until the test tells it to finish (a ``WorkLog`` row), so the test reads it while it runs.

The tube, board and loop handlers are registered in ``tests/testapp/taskloop.py``; the Django
Task is here (a worker imports it by its path)."""

from __future__ import annotations

import os
import time
from typing import Any

import django
from asgiref.sync import sync_to_async

from django_taskloop import progress
from tests.testapp.models import WorkLog

if django.VERSION[:2] == (6, 0):
    # Django 6.0's @task passes no option on (issue 28): django-taskloop's decorator does.
    from django_taskloop.task_options import task
else:
    try:
        from django.tasks import task
    except ImportError:  # Django 5.2: the backport
        from django_tasks import task

#: How long a handler waits at most for the test to tell it to finish.
LONGEST = 120.0


def finish(key: Any) -> None:
    """Tell the handler working on ``key`` to return."""
    WorkLog.objects.create(kind="progress-finish", key=str(key), phase="end", pid=os.getpid(), at=time.time())


def report_until_told(kind: str, key: Any) -> None:
    """Report progress in bursts of 1,000 calls (the throttle's business) until told to finish."""
    WorkLog.objects.create(kind=kind, key=str(key), phase="start", pid=os.getpid(), at=time.time())
    deadline = time.monotonic() + LONGEST
    step = 0
    while not WorkLog.objects.filter(kind="progress-finish", key=str(key)).exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{kind} {key}: the test never said to finish")
        step += 1
        for n in range(1000):
            progress.report(min(step / 100, 1.0), f"step {step} ({n})")
        time.sleep(0.05)
    WorkLog.objects.create(kind=kind, key=str(key), phase="end", pid=os.getpid(), at=time.time())


# A ttr far longer than the test: only a progress write renews the lease (its tube has none).
@task(ttr=900)
def long_task(key: str) -> str:
    report_until_told("p-django", key)
    return "finished"


@task(ttr=900)
async def along_task(key: str) -> str:
    """The ``async def`` twin: reports with :func:`progress.areport` on the event loop, then
    from a thread of ``sync_to_async`` (which runs it with a copy of the context)."""
    assert await progress.areport(0.25, "async quarter")
    await sync_to_async(report_until_told)("p-django", key)
    return "finished"
