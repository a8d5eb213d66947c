"""Django Tasks that tests/test_testing_recipe.py runs through django_taskloop.testing (module
level: the backend finds a task by its dotted path). Each call leaves a WorkLog row (kind
"recipe"), so that a test can tell what ran, in which order, and how often."""

from __future__ import annotations

import time
from typing import Any

from django.db import transaction

# Django's own @task takes the options on Django 5.2 (backport) and 6.1+, not on 6.0: this one
# takes them everywhere (the README's version table).
from django_taskloop.task_options import task


def log(key: str, phase: str = "end") -> None:
    from tests.testapp.models import WorkLog

    WorkLog.objects.create(kind="recipe", key=key, phase=phase, pid=0, at=time.time())


def logged(phase: str | None = None) -> list[str]:
    """The keys logged so far, in order (``phase``: only those of that phase)."""
    from tests.testapp.models import WorkLog

    rows = WorkLog.objects.filter(kind="recipe").order_by("pk")
    if phase is not None:
        rows = rows.filter(phase=phase)
    return list(rows.values_list("key", flat=True))


@task
def record(name: str) -> str:
    log(name)
    return name.upper()


@task(queue_name="slow")
def record_slow(name: str) -> str:
    log(name)
    return name


@task(takes_context=True, max_attempts=3, backoff=600)
def flaky(context: Any, name: str) -> int:
    """Fails its first two attempts; a long backoff (600 s) between them."""
    log(f"{name}:{context.attempt}")
    if context.attempt < 3:
        raise ValueError(f"{name} attempt {context.attempt}")
    return context.attempt


@task(max_attempts=2, backoff=0)
def always_fails(name: str) -> None:
    log(name)
    raise RuntimeError(f"{name} failed")


def doubling(attempt: int) -> float:
    return 300.0 * attempt


@task(max_attempts=2, backoff=doubling)
def fails_with_callable_backoff(name: str) -> None:
    log(name)
    raise RuntimeError(name)


@task
def chain(n: int) -> int:
    """Enqueues chain(n - 1) until 0: tasks that enqueue tasks."""
    log(f"chain:{n}", "start")
    if n > 0:
        chain.enqueue(n - 1)
    log(f"chain:{n}")
    return n


@task
def forever(n: int) -> None:
    """Enqueues itself for ever: a runaway."""
    log(f"forever:{n}")
    forever.enqueue(n + 1)


@task(key=lambda account, n: f"account:{account}")
def account_step(account: int, n: int) -> int:
    """The first step enqueues the second of the same key while it runs: the second must not
    start before the first has ended."""
    log(f"{account}:{n}", "start")
    if n == 1:
        account_step.enqueue(account, 2)
    log(f"{account}:{n}")
    return n


@task(key="slot", ttl=0.2)
def expires_behind_its_key(name: str) -> str:
    log(name)
    return name


@task(key="slot")
def holds_the_slot(name: str, wait: float) -> str:
    """Enqueues a keyed task with a short ttl, then holds the key longer than that ttl;
    returns the keyed task's result id."""
    log(name, "start")
    late = expires_behind_its_key.enqueue(f"{name}-late")
    time.sleep(wait)
    log(name)
    return str(late.id)


@task(ttl=60)
def short_lived(name: str) -> str:
    log(name)
    return name


@task(takes_context=True, ttr=20)
def leased(context: Any) -> dict[str, Any]:
    """Says how its own result reads while it runs, and the lease its tube task holds."""
    from django_taskloop.backends import tube_name
    from django_taskloop.models import Task as TubeTask

    log("leased")
    running = context.task_result.task.get_result(context.task_result.id)
    taken = TubeTask.objects.filter(tube__name=tube_name("default")).taken()
    return {"status": running.status, "ttr": [row.ttr for row in taken], "attempt": context.attempt}


@task(unique=True)
def refresh(report: str) -> str:
    log(report)
    return report


@task(enqueue_on_commit=True)
def notify(order: int) -> int:
    log(f"notify:{order}")
    return order


@task(priority=-50)
def low(name: str) -> str:
    log(name)
    return name


@task(priority=50)
def high(name: str) -> str:
    log(name)
    return name


@task
def fanout() -> None:
    """Enqueues a low-priority then a high-priority task: the high one runs first."""
    low.enqueue("low")
    high.enqueue("high")
    log("fanout")


@task
def breaks_the_transaction(name: str) -> None:
    """A database error in the task's own code, not caught: on PostgreSQL it aborts the
    transaction it runs in."""
    from tests.testapp.models import WorkLog

    first = WorkLog.objects.create(kind="recipe", key=name, pid=0, at=0.0)
    WorkLog.objects.create(pk=first.pk, kind="recipe", key=name, pid=0, at=0.0)


@task
def writes_then_commits(name: str) -> None:
    with transaction.atomic():
        log(name)
