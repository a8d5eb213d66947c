"""Handlers of the worker tests; each logs what it runs in ``WorkLog``."""

from __future__ import annotations

import asyncio
import functools
import os
import time
from typing import Any

from django_taskloop.workers import board, loop, tube

from .models import WorkerLoop, WorkLog


def log(kind: str, key: Any, phase: str = "end") -> None:
    WorkLog.objects.create(kind=kind, key=str(key), phase=phase, pid=os.getpid(), at=time.time())


@tube("w-drain", batch=50)
def drain(task: Any) -> None:
    log("drain", task.id)


@tube("w-noop", batch=100)
def noop(task: Any) -> None:
    """Nothing at all: the throughput measurement."""


@tube("w-fail", batch=5)
def fail(task: Any) -> None:
    log("fail", task.id)
    raise RuntimeError(f"task {task.id} fails on purpose")


@tube("w-slow", batch=3, ttr=2)
def slow(task: Any) -> None:
    log("slow", task.id, "start")
    time.sleep(task.data["sleep"])
    log("slow", task.id)


@board("w-board", expiry=30)
def build(job: Any) -> None:
    log("board", job.uuid)
    if job.details.get("fail"):
        raise RuntimeError(f"job {job.name} fails on purpose")


@loop(WorkerLoop, batch=10, lock_for=30)
def visit(item_id: int) -> None:
    log("loop", item_id)
    if item_id < 0:
        raise RuntimeError(f"id {item_id} fails on purpose")


@loop(WorkerLoop, batch=1, lock_for=1, name="w-loop-slow")
def visit_slowly(item_id: int) -> None:
    log("loop-slow", item_id, "start")
    time.sleep(2.5)
    log("loop-slow", item_id)


# The graceful-stop test (issue 12.3): the handler *is* a builtin (print to a file opened with
# O_APPEND), so no Python line of user code runs after its side effect; a stop that reaches the
# worker while it prints is handled just after the handler returned.
_record_file = open(os.environ.get("TASKLOOP_TEST_RECORD") or os.devnull, "a")  # noqa: SIM115
record = loop(WorkerLoop, batch=3000, lock_for=60, name="w-loop-record")(
    functools.partial(print, file=_record_file, flush=True)
)


@tube("w-flaky", batch=5)
def flaky(task: Any) -> None:
    """Fails until someone "fixes" it (a WorkLog row of kind "fixed"): the operator's story."""
    if not WorkLog.objects.filter(kind="fixed").exists():
        raise ConnectionError(f"smtp.example.com refused task {task.id}")
    log("flaky", task.id)


if os.environ.get("TASKLOOP_TEST_PERIODIC"):
    from . import periodic  # noqa: F401  (the schedule tests' @periodic functions)


# Issue 26: the edges of the worker. ---------------------------------------------------------


async def _alog(kind: str, key: Any, phase: str = "end") -> None:
    from asgiref.sync import sync_to_async

    await sync_to_async(log)(kind, key, phase)


@tube("w-async")
async def send_async(task: Any) -> None:
    """An ``async def`` handler: awaited to completion, never acknowledged unrun."""
    await asyncio.sleep(0.01)
    await _alog("async-tube", task.id)


@board("w-async-board")
async def build_async(job: Any) -> None:
    await asyncio.sleep(0.01)
    await _alog("async-board", job.uuid)


@loop(WorkerLoop, name="w-async-loop", lock_for=30)
async def visit_async(item_id: int) -> None:
    await asyncio.sleep(0.01)
    await _alog("async-loop", item_id)


@tube("w-async-stop")
async def hang_async(task: Any) -> None:
    """Starts, then waits far longer than any grace period: a hard stop must cut it off."""
    await _alog("async-stop", task.id, "start")
    try:
        await asyncio.sleep(120)
    except asyncio.CancelledError:
        await _alog("async-stop", task.id, "cancelled")
        raise
    await _alog("async-stop", task.id)


@tube("w-settle")
def settle_later(task: Any) -> None:
    """Does its work (logs it), then returns only once the file named by TASKLOOP_TEST_GO
    exists: the test breaks the worker's database in between, so that the settle fails."""
    log("settle", task.id, "start")
    log("settle", task.id)
    go = os.environ["TASKLOOP_TEST_GO"]
    while not os.path.exists(go):
        time.sleep(0.02)


@tube("w-stop-start", batch=4, batch_time=0)
def stop_start(task: Any) -> None:
    """Claims four at a time (batch_time=0: a fixed batch) and sleeps ``data["sleep"]``."""
    log("stop-start", task.id, "start")
    time.sleep(task.data["sleep"])
    log("stop-start", task.id)


@tube("w-spread")
def spread(task: Any) -> None:
    """Sleeps ``data["sleep"]`` with the default batch sizing: slow work is not hoarded."""
    log("spread", task.id, "start")
    time.sleep(task.data["sleep"])
    log("spread", task.id)


@tube("w-async-fail")
async def fail_async(task: Any) -> None:
    """Raises after an await: retried and recorded like a sync handler's failure."""
    await asyncio.sleep(0.01)
    raise RuntimeError(f"async task {task.id} fails on purpose")


# Progress (issue 29): long handlers that report until the test says to finish. Leases far
# longer than the test (HEARTBEAT_INTERVAL 300 there): only a progress write renews them.


@tube("p-tube", batch=1, ttr=900)
def report_tube(task: Any) -> None:
    from tests.progress_tasks import report_until_told

    report_until_told("p-tube", task.id)


@board("p-board", batch=1, expiry=900)
def report_board(job: Any) -> None:
    from tests.progress_tasks import report_until_told

    report_until_told("p-board", job.uuid)


@loop(WorkerLoop, batch=1, lock_for=900, name="p-loop")
def report_loop(item_id: int) -> None:
    from tests.progress_tasks import report_until_told

    report_until_told("p-loop", item_id)


# Issue 44: many items at a time in one process (workers --concurrency). ------------------------


@tube("w-many", ttr=30)
def many(task: Any) -> None:
    """Waits as a network call would (``data["sleep"]`` seconds); fails if ``data["fail"]``."""
    log("many", task.id, "start")
    time.sleep(task.data.get("sleep", 0.3))
    if task.data.get("fail"):
        raise RuntimeError(f"task {task.id} fails on purpose")
    log("many", task.id)


@tube("w-limited", ttr=30, limit=5)
def limited(task: Any) -> None:
    """At most 5 of these at once, however many workers and slots."""
    log("limited", task.id, "start")
    time.sleep(task.data.get("sleep", 0.3))
    log("limited", task.id)


@tube("w-key-limited", type="utubettl", ttr=30, key_limit=2)
def key_limited(task: Any) -> None:
    """At most 2 of these of one key at once, however many workers and slots."""
    log("key-limited", f"{task.utube}:{task.id}", "start")
    time.sleep(task.data.get("sleep", 0.3))
    log("key-limited", f"{task.utube}:{task.id}")


@tube("w-key-paced", type="utubettl", ttr=30, key_limit=10, key_rate="5/s")
def key_paced(task: Any) -> None:
    """At most 5 of these of one key started in any second, however many workers and slots."""
    log("key-paced", f"{task.utube}:{task.id}", "start")
    time.sleep(task.data.get("sleep", 0.05))
    log("key-paced", f"{task.utube}:{task.id}")


@tube("w-paced", ttr=30, rate="20/s")
def paced(task: Any) -> None:
    """At most 20 of these started in any second, however many workers and slots."""
    log("paced", task.id, "start")
    time.sleep(task.data.get("sleep", 0.05))
    log("paced", task.id)


@tube("w-many-async", ttr=30)
async def many_async(task: Any) -> None:
    await _alog("many-async", task.id, "start")
    try:
        await asyncio.sleep(task.data.get("sleep", 0.3))
    except asyncio.CancelledError:
        # A cleanup that takes a while (a connection to close): a hard stop lets it finish.
        await asyncio.sleep(0.3)
        await _alog("many-async", task.id, "cancelled")
        raise
    await _alog("many-async", task.id)


@tube("w-many-keyed", type="utubettl", ttr=30)
def many_keyed(task: Any) -> None:
    """Logs its key with its id: per key, never two at once."""
    log("many-keyed", f"{task.utube}/{task.id}", "start")
    time.sleep(task.data.get("sleep", 0.2))
    log("many-keyed", f"{task.utube}/{task.id}")


@tube("w-many-own", ttr=30, concurrency=4)
def many_own(task: Any) -> None:
    """A handler that sets its own concurrency (4), whatever --concurrency says."""
    log("many-own", task.id, "start")
    time.sleep(task.data.get("sleep", 0.3))
    log("many-own", task.id)
