"""The worker's edges (issue 26, items 1–4), with real worker processes on the real database:

1. an ``async def`` handler (``@tube``, ``@board``, ``@loop``, ``@periodic``, a Django Task) is
   awaited to completion, never acknowledged unrun, and a hard stop cancels it and gives its
   item back; a function that cannot be run (a generator) is refused when it is registered;
2. a finished batch whose settle fails (the connection dropped, or the database stayed locked
   past the engine's retries) is settled in the worker's next round, not stranded;
3. after a stop signal nothing new is started: claimed items not yet started go back at once;
4. a worker claims no more slow work than it will start soon, so idle processes get the rest.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, transaction

from django_taskloop.backends import keyed_tube_name, tube_name
from django_taskloop.exceptions import DatabaseBusy
from django_taskloop.models import Failure, JobBoard, Task, TaskRecord, Tube, WorkerProcess
from django_taskloop.schedules import ScheduleError, periodic
from django_taskloop.workers import Handler, board, loop, tube
from django_taskloop.workers.drivers import make_driver
from django_taskloop.workers.runner import Worker
from tests.testapp.models import WorkerLoop, WorkLog

from .test_schedules import PERIODIC_ENV, periodic_row
from .workers_util import add_async, nap, run_workers, start_workers, stop, task, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def logged(kind: str, phase: str = "end") -> int:
    return WorkLog.objects.filter(kind=kind, phase=phase).count()


def start(*args: str, env: dict[str, str] | None = None, **taskloop: Any) -> Any:
    """Start ``manage.py workers *args`` with these TASKLOOP settings (and a 0.5 s heartbeat)."""
    return start_workers(
        *args,
        DJANGO_SETTINGS_MODULE="tests.workers_settings",
        TASKLOOP_OVERRIDES=json.dumps({"HEARTBEAT_INTERVAL": 0.5, **taskloop}),
        **(env or {}),
    )


# 1. async def handlers --------------------------------------------------------------------------


def test_async_tube_board_and_loop_handlers_are_awaited():
    tube_ = Tube.objects.create_tube("w-async", "fifottl")
    tube_.put_many([{"n": n} for n in range(3)])
    board_ = JobBoard.objects.create_board("w-async-board")
    for n in range(2):
        board_.post(f"job-{n}")
    WorkerLoop.objects.add([1, 2, 3])

    result = run_workers("--burst", "--only", "w-async", "--only", "w-async-board", "--only", "w-async-loop")

    assert result.returncode == 0, result.stderr
    assert "never awaited" not in result.stderr, result.stderr
    assert logged("async-tube") == 3
    assert logged("async-board") == 2
    assert logged("async-loop") == 3
    assert tube_.statistics()["tasks"]["total"] == 0
    assert WorkerLoop.objects.filter(last_updated__isnull=True).count() == 0


def test_an_async_handler_that_raises_is_retried_and_recorded_like_a_sync_one():
    tube_ = Tube.objects.create_tube("w-async-fail", "fifottl")
    put = tube_.put({"n": 1})
    result = run_workers("--burst", "--only", "w-async-fail")
    assert result.returncode == 0, result.stderr
    assert "(attempt 1 of 5), retrying in" in result.stderr, result.stderr
    failure = Failure.objects.get(queue="w-async-fail")
    assert failure.error == "builtins.RuntimeError"
    assert "fails on purpose" in failure.message
    assert Task.objects.get(pk=put.id).state == "~"  # released with a delay, not acknowledged


def test_an_async_django_task_is_awaited():
    result = add_async.enqueue(2, 3)
    run = run_workers("--burst", "--only", tube_name(add_async.queue_name))
    assert run.returncode == 0, run.stderr
    assert "never awaited" not in run.stderr, run.stderr
    result.refresh()
    assert result.status == "SUCCESSFUL", result.errors
    assert result.return_value == 5


def test_an_async_periodic_function_is_awaited():
    periodic_row("t-async", "yearly_async", seconds_ago=60)
    run = run_workers("--burst", **PERIODIC_ENV)
    assert run.returncode == 0, run.stderr
    assert "never awaited" not in run.stderr, run.stderr
    assert logged("periodic-async") == 1


def test_a_hard_stop_cancels_an_async_handler_and_gives_its_task_back():
    tube_ = Tube.objects.create_tube("w-async-stop", "fifottl")
    put = tube_.put({"n": 1})
    worker = start("--only", "w-async-stop", GRACE_PERIOD=0.5)
    try:
        wait_until(lambda: logged("async-stop", "start") == 1)
        started = time.monotonic()
        output = stop(worker, timeout=30)
        took = time.monotonic() - started
    finally:
        if worker.poll() is None:
            worker.kill()
    assert worker.returncode == 0, output
    assert took < 20, output  # cut off at the grace period's end, not after its 120 s sleep
    assert logged("async-stop", "cancelled") == 1, output
    assert logged("async-stop") == 0, output
    # Given back: ready to run again, not acknowledged.
    assert Task.objects.get(pk=put.id).state == "r", output


def _gen(task: Any) -> Any:
    yield task


async def _agen(task: Any) -> Any:
    yield task


@pytest.mark.parametrize("func", [_gen, _agen], ids=["generator", "async generator"])
def test_functions_a_worker_cannot_run_are_refused_at_registration(func):
    from django_taskloop.workers import registry

    before = dict(registry)
    for decorate in (tube("w-refused"), board("w-refused"), loop(WorkerLoop, name="w-refused")):
        with pytest.raises(TypeError, match="generator function"):
            decorate(func)
    with pytest.raises(ScheduleError, match="generator function"):
        periodic("0 0 1 1 *", name="t-refused")(func)
    with pytest.raises(Exception, match="generator function") as refused:
        task()(func)
    assert type(refused.value).__name__.startswith("InvalidTask")  # InvalidTaskError on Django 6
    assert registry == before


# 2. A finished batch whose settle fails ----------------------------------------------------------


def _break_the_settle(vendor: str, db_file: str, go: Path, released: threading.Event) -> None:
    """Make the worker's acknowledgement of its finished task fail, then let it through."""
    if vendor == "sqlite":
        # Hold SQLite's write lock longer than the worker's busy timeout and retries.
        lock = sqlite3.connect(db_file, timeout=30)
        lock.execute("BEGIN IMMEDIATE")
        go.touch()
        time.sleep(3.0)
        lock.rollback()
        lock.close()
    else:
        # Drop every connection of the worker while its handler runs: the ack meets a dead one.
        with connection.cursor() as cursor:
            if vendor == "postgresql":
                cursor.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            else:
                cursor.execute(
                    "SELECT id FROM information_schema.processlist WHERE db = DATABASE() AND id <> CONNECTION_ID()"
                )
                for (pid,) in cursor.fetchall():
                    try:
                        cursor.execute(f"KILL {int(pid)}")
                    except Exception:  # gone meanwhile
                        pass
        go.touch()
    released.set()


def test_a_finished_task_whose_settle_fails_is_settled_in_the_next_round(tmp_path: Path):
    tube_ = Tube.objects.create_tube("w-settle", "fifottl")
    put = tube_.put({"n": 1})
    go = tmp_path / "go"
    vendor = connection.vendor
    worker = start(
        "--only",
        "w-settle",
        env={"TASKLOOP_TEST_GO": str(go), "TASKLOOP_TEST_SQLITE_TIMEOUT": "0.3"},
        RETRIES=1,
        GRACE_PERIOD=5,
    )
    try:
        wait_until(lambda: logged("settle") == 1)
        released = threading.Event()
        _break_the_settle(vendor, connection.settings_dict["NAME"], go, released)
        # Settled while the worker still runs: the task is acknowledged, gone from the tube.
        wait_until(lambda: not Task.objects.filter(pk=put.id).exists(), timeout=30)
        assert worker.poll() is None
    finally:
        output = stop(worker)
    assert worker.returncode == 0, output
    assert "could not settle 1 finished task" in output, output
    assert "settled 1 task kept from an earlier round" in output, output
    assert logged("settle", "start") == 1, output  # ran once, never again
    assert logged("settle") == 1, output


# 3. A stop starts nothing new ----------------------------------------------------------------------


def test_after_a_stop_signal_nothing_new_is_started():
    tube_ = Tube.objects.create_tube("w-stop-start", "fifottl")
    ids = [task.id for task in tube_.put_many([{"sleep": 2}] * 4)]
    worker = start("--only", "w-stop-start", GRACE_PERIOD=3)
    try:
        wait_until(lambda: logged("stop-start", "start") == 1)
        worker.send_signal(signal.SIGTERM)
        # The three claimed but not started go back at once, while the first still runs.
        wait_until(lambda: Task.objects.filter(pk__in=ids, state="r").count() == 3, timeout=1.5)
        output, _ = worker.communicate(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert worker.returncode == 0, output
    assert logged("stop-start", "start") == 1, output  # nothing new started after the signal
    assert logged("stop-start") == 1, output  # the running one finished within the grace period
    assert Task.objects.filter(pk__in=ids).count() == 3
    assert Task.objects.filter(pk__in=ids, state="r").count() == 3


# 4. A worker holds no more than it will start soon -------------------------------------------------


def test_two_processes_run_two_slow_django_tasks_side_by_side():
    # A Django Tasks queue is two tubes (plain and keyed): the worker's several-tube path.
    queue = nap.queue_name
    supervisor = start(
        "--processes", "2", "--only", tube_name(queue), "--only", keyed_tube_name(queue), GRACE_PERIOD=5
    )
    try:
        wait_until(lambda: WorkerProcess.objects.count() >= 2, timeout=60)
        # Both at once, in one transaction (so that one process could take both). On SQLite a
        # transaction that read before it wrote cannot wait out the workers' own writes: it is
        # retried whole, as DatabaseBusy's message tells a caller to.
        for attempt in range(5):
            try:
                with transaction.atomic():
                    results = [nap.enqueue(2) for _ in range(2)]
                break
            except DatabaseBusy:
                if attempt == 4:
                    raise
        wait_until(
            lambda: (
                TaskRecord.objects.filter(pk__in=[r.id for r in results], status="SUCCESSFUL").count() == 2
            ),
            timeout=60,
        )
    finally:
        output = stop(supervisor)
    records = TaskRecord.objects.filter(pk__in=[r.id for r in results])
    workers = {record.worker_ids[0] for record in records}
    assert len(workers) == 2, f"one process ran both while the other idled: {workers}\n{output}"
    first, second = sorted(records, key=lambda r: r.started_at)
    assert second.started_at < first.finished_at, "the second task waited for the first"


def _worker_for(handler: Handler) -> tuple[Worker, Any]:
    worker = Worker([handler], burst=True, schedule=False)
    return worker, worker.drivers[0]


def test_batch_size_follows_the_measured_time_per_item(settings):
    settings.TASKLOOP = {"BATCH_TIME": 0.1}
    worker, driver = _worker_for(Handler("tube", "w-sizes", print, "w-sizes", batch=100))
    size = worker.batches.batch_size(driver)
    assert size == 1  # nothing measured yet: one item
    for expected in (2, 4, 8, 16, 32, 64, 100, 100):  # fast: doubles up to the batch
        worker.batches.measured(driver, size, 0.0001 * size)
        worker.batches.sizes[driver] = size
        size = worker.batches.batch_size(driver)
        assert size == expected
    for _ in range(20):  # slow (2 s an item): one at a time, whatever came before
        worker.batches.measured(driver, 1, 2.0)
    assert worker.batches.batch_size(driver) == 1
    for _ in range(20):  # 10 ms an item: what fits 100 ms (the 2 s items have not quite faded)
        worker.batches.measured(driver, 10, 0.1)
        worker.batches.sizes[driver] = 100
    assert worker.batches.batch_size(driver) in (9, 10)
    # Per handler: batch_time=0 always claims the whole batch; a larger one claims more.
    fixed, fixed_driver = _worker_for(Handler("tube", "w-fixed", print, "w-fixed", batch=7, batch_time=0))
    assert fixed.batches.batch_size(fixed_driver) == 7
    roomy, roomy_driver = _worker_for(Handler("tube", "w-roomy", print, "w-roomy", batch=100, batch_time=1.0))
    roomy.batches.measured(roomy_driver, 1, 0.05)
    roomy.batches.sizes[roomy_driver] = 64
    assert roomy.batches.batch_size(roomy_driver) == 20


def test_batch_time_is_checked_when_registered():
    with pytest.raises(ValueError, match="batch_time"):
        tube("w-bad-batch-time", batch_time=-1)
    with pytest.raises(TypeError, match="batch_time"):
        board("w-bad-batch-time", batch_time="fast")
    assert make_driver(Handler("tube", "x", print, "x"), "me").handler.batch_time is None


def test_a_burst_worker_exits_without_waiting_out_its_heartbeats_pause(settings, monkeypatch):
    """The heartbeat thread sleeps until its next beat; a worker's end must wake it, not wait
    the pause out (found trying a burst from a fresh project: 1 s for a 50 ms drain). With an
    hour between beats, the old worker waited out its 30 s join."""
    from django_taskloop.workers import heartbeat

    settings.TASKLOOP = {"HEARTBEAT_INTERVAL": 3600, "CONSUMER_TIMEOUT": 36000}
    monkeypatch.setattr(heartbeat, "THROUGHPUT_EVERY", 3600.0)
    Tube.objects.create_tube("w-burst-exit", "fifo")
    handler = Handler("tube", "w-burst-exit", print, "w-burst-exit", create={"type": "fifo"})
    worker = Worker([handler], burst=True, schedule=False)
    started = time.monotonic()
    assert worker.run() == 0
    assert time.monotonic() - started < 15  # not the heartbeat's 30 s join timeout


def test_a_burst_does_not_end_while_a_rivals_claim_holds_a_ready_task():
    """A burst ends when nothing is left to claim, not when a claim came back empty: a claim
    skips rows that another transaction holds (a rival's claim in flight, which may leave them
    ready), so an empty claim proves nothing (CI: a burst of two processes ended one process
    while a keyed task was still ready, and its partner waited for it in vain). Here a
    transaction holds the only ready task's row for a second while a burst starts."""
    tube_ = Tube.objects.create_tube("w-burst-held", "fifo")
    task_ = tube_.put({"n": 1})
    ran: list[Any] = []
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                # A write that changes nothing: a row lock (SQLite: the write lock) until commit.
                Task.objects.filter(pk=task_.pk).update(pri=task_.pri)
                holding.set()
                release.wait(10)
        finally:
            connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert holding.wait(10)
        threading.Timer(1.0, release.set).start()
        worker = Worker(
            [Handler("tube", "w-burst-held", ran.append, "w-burst-held", create={"type": "fifo"})],
            burst=True,
            schedule=False,
        )
        assert worker.run() == 0
    finally:
        release.set()
        holder.join()
    assert [item.data for item in ran] == [{"n": 1}]
    assert tube_.statistics()["tasks"]["ready"] == 0


@pytest.mark.vendors("mysql", "postgresql")  # where claims keep a cursor (dead entries linger)
@pytest.mark.django_db(transaction=True)
def test_a_burst_is_not_over_while_a_task_behind_its_claim_cursor_is_ready():
    """A burst ends when a plain read finds nothing claimable. A rival held task 1 while this
    worker claimed (SKIP LOCKED passed it; the cursor moved past it), then gave it back: the
    read that ends the burst must look from the head, not from the cursor, or the burst ends
    with task 1 ready and nobody to run it (seen in CI: a two-process burst left one task)."""
    worker, driver = _worker_for(Handler("tube", "w-behind", print, "w-behind", create={"type": "fifottl"}))
    worker._prepare()
    tube = driver.tube
    first, *_rest = [tube.put({"n": n}) for n in range(3)]
    assert tube.take(consumer="rival").pk == first.pk
    claimed = driver.claim(10)
    assert sorted(task.pk for task in claimed) == sorted(task.pk for task in _rest)
    tube.ack_many([task.pk for task in claimed], consumer=driver.identity)
    tube.release(first.pk, consumer="rival")
    assert not worker._burst_over([driver])
