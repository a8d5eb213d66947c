"""Django Tasks for tests/test_task_options_workers.py: every option of
``django_taskloop.task_options.task`` and Django's own, given at the decorator, so that the tests
can override each per call with ``.using(...)`` and see what a worker process did.

Module level, so that a worker process imports them. Each call writes a ``WorkLog`` row: the
tests count calls and read, from ``at``, the database's time the worker recorded for the
attempt's start (``TaskResult.last_attempted_at``), never a worker's own clock.
"""

from __future__ import annotations

import os
import time
from typing import Any

from django_taskloop.task_options import task  # the options on every Django version


def log(kind: str, key: str, phase: str = "end", at: float | None = None) -> None:
    """Write one ``WorkLog`` row for this call (``at``: default this process's clock)."""
    from tests.testapp.models import WorkLog

    WorkLog.objects.create(
        kind=kind, key=key, phase=phase, pid=os.getpid(), at=time.time() if at is None else at
    )


def log_attempt(kind: str, context: Any) -> None:
    """Log this attempt of a ``takes_context`` task: key = result id, phase = the attempt
    number, ``at`` = when the worker started it on the database's clock."""
    result = context.task_result
    log(kind, result.id, str(context.attempt), at=result.last_attempted_at.timestamp())


def growing(attempt: int) -> float:
    """A callable backoff: one second after the first failed attempt, two after the second."""
    return 1.0 * attempt


def two_seconds(attempt: int) -> float:
    """A callable backoff given per call (``.using(backoff=two_seconds)``)."""
    return 2.0


# max_attempts, backoff and takes_context ----------------------------------------------------


@task(takes_context=True, max_attempts=3, backoff=1)
def fails_every_second(context: Any) -> None:
    log_attempt("backoff", context)
    raise RuntimeError(f"attempt {context.attempt} of {context.task_result.id}")


@task(takes_context=True, max_attempts=3, backoff=growing)
def fails_growing(context: Any) -> None:
    log_attempt("backoff", context)
    raise RuntimeError(f"attempt {context.attempt} of {context.task_result.id}")


@task(takes_context=True, max_attempts=2, backoff=600)
def fails_slowly(context: Any) -> None:
    """Its own backoff (ten minutes) would outlast any test: a test that sees its retry
    run saw a per-call backoff."""
    log_attempt("backoff", context)
    raise RuntimeError(f"attempt {context.attempt} of {context.task_result.id}")


@task(takes_context=True, max_attempts=3, backoff=0)
def succeeds_third(context: Any) -> dict[str, Any]:
    log_attempt("context", context)
    if context.attempt < 3:
        raise ValueError(f"attempt {context.attempt}")
    return {"attempt": context.attempt, "id": context.task_result.id}


# ttl ------------------------------------------------------------------------------------------


@task(ttl=1)
def expires(name: str) -> str:
    log("ttl", name)
    return name


# ttr ------------------------------------------------------------------------------------------


# ttr=20: the test process keeps the suite's 10 s heartbeat, and a ttr must be at least two
# heartbeats where it is given; the worker processes beat every 0.5 s.
@task(takes_context=True, ttr=20)
def hangs_first(context: Any, name: str) -> int:
    """Hangs in its first attempt (the test kills that worker), returns in the next."""
    log_attempt("ttr", context)
    if context.attempt == 1:
        time.sleep(300)
    return context.attempt


@task(takes_context=True)
def naps(context: Any, seconds: float) -> int:
    log_attempt("nap", context)
    time.sleep(seconds)
    return context.attempt


# key ------------------------------------------------------------------------------------------


@task(key=lambda group, name, partner=None: f"group:{group}")
def meets(group: str, name: str, partner: str | None = None) -> str:
    """Log the start; with a ``partner``, wait (up to 30 s) until that task has started too:
    it returns only if the two ran at the same time."""
    from tests.testapp.models import WorkLog

    log("key", name, "start")
    if partner is not None:
        deadline = time.monotonic() + 30
        while not WorkLog.objects.filter(kind="key", key=partner, phase="start").exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} never met {partner}: they did not run at the same time")
            time.sleep(0.05)
    log("key", name)
    return name


# unique ---------------------------------------------------------------------------------------


@task(unique=True)
def report(name: str) -> str:
    log("unique", name)
    return name


# Django's own options ------------------------------------------------------------------------


@task(priority=20)
def ranked(name: str) -> str:
    log("order", name)
    return name


@task(queue_name="slow")
def in_slow(name: str) -> str:
    log("queue", name)
    return name


@task(enqueue_on_commit=True)
def after_commit(name: str) -> str:
    log("commit", name)
    return name


@task
def plain(kind: str, name: str) -> str:
    """No option at all: the tests give them per call."""
    log(kind, name)
    return name


# A queue's running limit (tests/test_task_queue_limits.py) ---------------------------------


@task
def napping(name: str) -> str:
    """A start and an end, 0.2 s apart: how many ran at once is counted from them."""
    log("nap", name, "start")
    time.sleep(0.2)
    log("nap", name)
    return name


@task(key=lambda name: f"k{int(name) % 4}")
def napping_keyed(name: str) -> str:
    """:func:`napping`, in the queue's keyed tube (four keys)."""
    log("nap", name, "start")
    time.sleep(0.2)
    log("nap", name)
    return name
