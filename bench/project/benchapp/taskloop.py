"""The benchmark's handlers: a no-op tube task and a no-op board job that record that they ran."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from django_taskloop.workers import board, tube

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from common import record  # noqa: E402


@tube("bench", batch=100)
def noop(task: Any) -> None:
    """Run nothing; the record is the whole job."""
    record(task.data)


# The drain of every kind of queue (bench/scenarios.py ``kinds``): the same no-op on a tube of
# each type (``bench``, above, is the fifottl one); keyed tubes get one sub-queue per key.
@tube("bench-fifo", batch=100, type="fifo")
def noop_fifo(task: Any) -> None:
    record(task.data)


@tube("bench-utube", batch=100, type="utube")
def noop_utube(task: Any) -> None:
    record(task.data)


@tube("bench-utubettl", batch=100, type="utubettl")
def noop_utubettl(task: Any) -> None:
    record(task.data)


# Work that waits, as a network call does (bench/concurrency_bench.py): ``data`` is
# ``[n, seconds]``.
@tube("bench-wait", batch=100)
def wait(task: Any) -> None:
    record(task.data[0])
    time.sleep(task.data[1])


@tube("bench-await", batch=100)
async def await_(task: Any) -> None:
    record(task.data[0])
    await asyncio.sleep(task.data[1])


# At most 5 at once over every process (bench/limit_bench.py): ``data`` is ``[n, seconds]``.
@tube("bench-limited", batch=100, limit=5)
def limited(task: Any) -> None:
    record(task.data[0])
    time.sleep(task.data[1])


# At most 60 started in any second over every process (bench/limit_bench.py): ``data`` is
# ``[n, seconds]``.
@tube("bench-paced", batch=100, rate="60/s")
def paced(task: Any) -> None:
    record(task.data[0])
    time.sleep(task.data[1])


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


@task(queue_name="kinds")
def kinds_task(n: int) -> None:
    """A Django Task that records its run: the ``kinds`` drain of Django Tasks."""
    record(n)


@task(queue_name="kinds", key=lambda n: f"k{n % 500}")
def kinds_keyed_task(n: int) -> None:
    """The same, keyed: one at a time per key, 500 keys (``tasks-keyed.kinds``)."""
    record(n)


@task()
def startup_task(n: int) -> None:
    """A Django Task that records its start: the startup scenario times spawn → here."""
    record(n)
