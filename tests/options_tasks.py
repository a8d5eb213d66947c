"""Django Tasks with django-taskloop options, run by worker processes in tests/test_task_options.py
(module level, so that a worker process can import them)."""

from __future__ import annotations

import os
import time
from typing import Any

import django

if django.VERSION[:2] == (6, 0):
    # Django 6.0's @task passes no option on (issue 28): django-taskloop's decorator does.
    from django_taskloop.task_options import task
else:
    try:
        from django.tasks import task
    except ImportError:  # Django 5.2: the backport
        from django_tasks import task


def _log(kind: str, key: str, phase: str = "end") -> None:
    from tests.testapp.models import WorkLog

    WorkLog.objects.create(kind=kind, key=key, phase=phase, pid=os.getpid(), at=time.time())


@task(max_attempts=3, backoff=0)
def always_fails(message: str) -> None:
    _log("always", message)
    raise RuntimeError(f"{message} #{time.time()}")


@task(takes_context=True, max_attempts=4, backoff=0)
def fails_twice(context: Any) -> int:
    if context.attempt < 3:
        raise ValueError(f"attempt {context.attempt}")
    return context.attempt


def ten_minutes(attempt: int) -> float:
    return 600.0 * attempt


@task(max_attempts=2, backoff=ten_minutes)
def waits_long(message: str) -> None:
    raise RuntimeError(message)


@task(max_attempts=3)
def default_backoff() -> None:
    raise RuntimeError("again")


@task(ttl=60)
def must_start_soon(name: str) -> str:
    _log("ttl", name)
    return name


# ttr=2 is given per call (.using(ttr=2)) by a test that sets HEARTBEAT_INTERVAL to 0.5 s: a
# ttr must be at least two heartbeats, and the suite keeps the default 10 s heartbeat.
@task(takes_context=True)
def hangs_first(context: Any, name: str) -> int:
    _log("ttr", name, "start")
    if context.attempt == 1:
        time.sleep(120)  # the worker is killed meanwhile
    _log("ttr", name)
    return context.attempt


@task(key=lambda account, step: f"account:{account}")
def step(account: int, step: int) -> None:
    _log("key", f"{account}", "start")
    time.sleep(0.05)
    _log("key", f"{account}:{step}")


@task(unique=True)
def refresh(report: str) -> str:
    return report


@task(key=lambda account: f"account:{account}", unique=True)
def sync(account: int) -> int:
    return account


@task(enqueue_on_commit=True)
def on_commit(name: str) -> str:
    return name


@task
def naps_past_ttr(seconds: float) -> str:
    time.sleep(seconds)
    return "rested"


def enqueue_refresh(report: str) -> str:
    """Enqueue ``refresh(report)`` and return the result's id (a racing process's target)."""
    return refresh.enqueue(report).id
