"""Progress of long work (issue 29, item 2): ``progress.report()`` in any handler, written by
the worker at most once a second with the lease renewed, read by ``stats.running_progress()``
and shown on the item's admin page and on the worker processes page."""

from __future__ import annotations

import asyncio
import contextvars
import json
import math
import threading
from dataclasses import dataclass
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_taskloop import progress
from django_taskloop.models import Job, JobBoard, Task, Tube, WorkerProcess
from django_taskloop.stats import running_progress
from django_taskloop.workers import get_handlers
from django_taskloop.workers.runner import Worker
from tests.progress_tasks import along_task, finish, long_task
from tests.testapp.models import WorkerLoop, WorkLog

from .workers_util import start_workers, stop, taskloop, wait_until


def key(driver: Any, item: Any) -> tuple[str, str, str]:
    """Name an item as the worker does (its Failure rows' kind, queue and item)."""
    return (driver.queue_kind, driver.queue, driver.failure_item(item))


class Clock:
    """A monotonic clock that moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# The call itself (no database). -----------------------------------------------------------


def test_report_outside_a_worker_checks_its_arguments_and_does_nothing_else():
    assert progress.report(0.5, "half") is False
    assert asyncio.run(progress.areport(1, "done")) is False
    with pytest.raises(ValueError, match="fraction must be from 0 to 1, not 1.5"):
        progress.report(1.5)


@pytest.mark.parametrize(
    ("fraction", "message", "error", "says"),
    [
        (1.01, "", ValueError, "fraction must be from 0 to 1, not 1.01"),
        (-0.1, "", ValueError, "fraction must be from 0 to 1, not -0.1"),
        (math.nan, "", ValueError, "fraction must be from 0 to 1, not nan"),
        (math.inf, "", ValueError, "fraction must be from 0 to 1, not inf"),
        ("0.5", "", TypeError, "fraction must be a number from 0 to 1, not str"),
        (True, "", TypeError, "fraction must be a number from 0 to 1, not bool"),
        (None, "", TypeError, "fraction must be a number from 0 to 1, not NoneType"),
        (0.5, 42, TypeError, "message must be a str, not int"),
    ],
)
def test_bad_input_raises_and_notes_nothing(fraction, message, error, says):
    clock = Clock()
    board = progress.Board(lambda owner, item: ("task", owner, str(item)), clock=clock)
    with board.running("emails", 7):
        assert progress.report(0.25, "a quarter")
        assert board.due()  # written; nothing changed since
        with pytest.raises(error, match=f"^{says}$"):
            progress.report(fraction, message)
        clock.now += 5
        assert board.due() is None  # nothing noted: no write due, however long since the last


def test_a_long_message_is_cut_to_the_maximum_and_the_latest_value_wins():
    board = progress.Board(lambda owner, item: ("job", owner, str(item)), clock=Clock())
    with board.running("builds", "u-1"):
        progress.report(0.1, "first")
        progress.report(1, "x" * 1000)
        reports, owners = board.due()
    (stored,) = reports.values()
    assert stored.fraction == 1.0 and isinstance(stored.fraction, float)
    assert len(stored.message) == progress.MAX_MESSAGE and stored.message.endswith("x…")
    assert reports.keys() == {("job", "builds", "u-1")} and owners == {"builds"}


def test_a_finished_items_progress_goes_with_the_next_write():
    clock = Clock()
    board = progress.Board(lambda owner, item: ("task", owner, str(item)), clock=clock)
    with board.running("emails", 1):
        progress.report(0.5)
        assert board.due()[0] == {("task", "emails", "1"): progress.Report(0.5, "")}
    clock.now += 1
    assert board.due() == ({}, set())
    with board.running("emails", 2):
        pass  # reported nothing: nothing to drop
    clock.now += 1
    assert board.due() is None


def test_async_code_and_copied_contexts_see_the_running_item_other_threads_do_not():
    board = progress.Board(lambda owner, item: ("task", owner, str(item)), clock=Clock())
    seen: list[bool] = []
    with board.running("emails", 3):
        assert asyncio.run(progress.areport(0.3, "async"))
        plain = threading.Thread(target=lambda: seen.append(progress.report(0.4)))
        plain.start()
        plain.join()
        context = contextvars.copy_context()
        copied = threading.Thread(target=lambda: seen.append(context.run(progress.report, 0.6, "copied")))
        copied.start()
        copied.join()
        reports, _owners = board.due()
    assert seen == [False, True]
    assert reports == {("task", "emails", "3"): progress.Report(0.6, "copied")}


# The throttle, in this process (the writes counted, no timing). -----------------------------


@pytest.mark.django_db
def test_a_thousand_reports_over_four_seconds_make_four_writes_and_each_renews_the_lease():
    worker = Worker(get_handlers(["p-tube"]), burst=True, schedule=False)
    driver = worker.drivers[0]
    driver.prepare()
    WorkerProcess.objects.beat(worker.identity, host="here", pid=1, queues=["task:p-tube"], holding={})
    driver.tube.put({"n": 1})
    [task] = driver.claim(1)
    worker.holdings.inflight[driver] = [task]  # what the batch holds (the heartbeat renews it)
    clock = Clock()
    worker.heart.progress = progress.Board(key, clock=clock)
    deadline = Task.objects.get(pk=task.id).event_at
    rounds, reporting = 0, 0
    with worker.heart.progress.running(driver, task):
        for n in range(1000):
            clock.now += 1 / 256  # 3.9 s in all (a step that adds up exactly)
            with CaptureQueriesContext(connection) as queries:
                progress.report(n / 1000, f"file {n} of 1000")
            reporting += len(queries.captured_queries)
            with CaptureQueriesContext(connection) as queries:
                worker.heart.write_progress()  # the heartbeat's chore, called as often as can be
            rounds += bool(queries.captured_queries)
            if queries.captured_queries:
                sql = " ".join(q["sql"] for q in queries.captured_queries)
                assert "taskloop_worker_process" in sql and "taskloop_task" in sql  # write + renew
        [written] = running_progress("task", "p-tube", task.id)
        assert written.message == "file 768 of 1000" and written.worker == worker.identity
        clock.now += 1
        worker.heart.write_progress()  # the latest value, on the next allowed write
        [written] = running_progress("task", "p-tube", task.id)
        assert (written.fraction, written.message) == (0.999, "file 999 of 1000")
        assert running_progress("task", "p-tube", task.id + 1) == []
        assert running_progress("job") == [] and len(running_progress()) == 1
    assert reporting == 0  # report() never touches the database
    assert rounds == 4  # at the first report, then once a second
    assert Task.objects.get(pk=task.id).event_at > deadline  # the lease moved forward
    # The handler returned: the next write drops its progress.
    clock.now += 1
    worker.heart.write_progress()
    assert running_progress() == [] and WorkerProcess.objects.get().progress == []


@pytest.mark.django_db
def test_a_bad_report_writes_nothing():
    worker = Worker(get_handlers(["p-tube"]), burst=True, schedule=False)
    driver = worker.drivers[0]
    driver.prepare()
    WorkerProcess.objects.beat(worker.identity, host="here", pid=1, queues=["task:p-tube"], holding={})
    task = driver.tube.put({"n": 1})
    with worker.heart.progress.running(driver, task):
        with pytest.raises(ValueError):
            progress.report(2.0, "too far")
        with CaptureQueriesContext(connection) as queries:
            worker.heart.write_progress()
    assert queries.captured_queries == []
    assert WorkerProcess.objects.get().progress == [] and running_progress() == []


# A real worker process, for each kind of handler. ---------------------------------------------

#: Leases and beats far longer than the test: only a progress write renews a lease meanwhile.
SLOW_BEATS = json.dumps({"HEARTBEAT_INTERVAL": 300, "CONSUMER_TIMEOUT": 900})


@dataclass
class Case:
    handler: str
    kind: str
    queue: str
    item: str
    finish_key: str
    admin_url: str
    lease_end: Any  # () -> the item's lease end now


def tube_case() -> Case:
    task = Tube.objects.create_tube("p-tube", "fifottl", ttr=900).put({"n": 1})
    url = reverse("admin:django_taskloop_task_change", args=[task.id])
    return Case("p-tube", "task", "p-tube", str(task.id), str(task.id), url, lambda: _event_at(task.id))


def board_case() -> Case:
    job = JobBoard.objects.create_board("p-board").post("long-1", details={"n": 1})
    url = reverse("admin:django_taskloop_job_change", args=[job.pk])

    def lease_end() -> Any:
        return Job.objects.get(pk=job.pk).claim_expires_at

    return Case("p-board", "job", "p-board", str(job.uuid), str(job.uuid), url, lease_end)


def loop_case() -> Case:
    WorkerLoop.objects.add([7])
    url = reverse("admin:testapp_workerloop_change", args=[7])

    def lease_end() -> Any:
        return WorkerLoop.objects.get(pk=7).lock_until

    return Case("p-loop", "loop", "testapp.workerloop", "7", "7", url, lease_end)


def django_task_case(task: Any) -> Case:
    result = task.enqueue("d-1")
    url = reverse("admin:django_taskloop_taskrecord_change", args=[result.id])

    def lease_end() -> Any:
        taken = Task.objects.filter(tube__name="tasks.default").taken().first()
        return taken.event_at if taken is not None else None

    return Case("tasks.default", "task", "tasks.default", str(result.id), "d-1", url, lease_end)


def _event_at(task_id: int) -> Any:
    return Task.objects.get(pk=task_id).event_at


CASES = {
    "tube": tube_case,
    "board": board_case,
    "loop": loop_case,
    "django-task": lambda: django_task_case(long_task),
    "async-django-task": lambda: django_task_case(along_task),
}


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", list(CASES))
def test_a_worker_shows_progress_renews_the_lease_and_drops_it_at_the_end(name, boss):
    case = CASES[name]()
    worker = start_workers(
        "--only", case.handler, DJANGO_SETTINGS_MODULE="tests.workers_settings", TASKLOOP_OVERRIDES=SLOW_BEATS
    )
    try:
        [first] = wait_until(lambda: running_progress(case.kind, case.queue, case.item), timeout=60)
        assert first.message.startswith("step ") and 0 < first.fraction <= 1
        assert first.worker in WorkerProcess.objects.values_list("identity", flat=True)
        lease = wait_until(case.lease_end)
        # Renewed by a progress write (the heartbeat's own renewal is 300 s away).
        wait_until(lambda: case.lease_end() > lease)
        wait_until(lambda: running_progress(case.kind, case.queue, case.item)[0].fraction > first.fraction)
        page = boss.get(case.admin_url).content.decode()
        assert '<progress max="1" value="' in page and "% step " in page, page
        workers = boss.get(reverse("admin:django_taskloop_workerprocess_changelist")).content.decode()
        assert f"{case.kind} {case.item} of " in workers and "% step " in workers, workers
        # And in the terminal: `taskloop status` lists it, by the queue's shown name.
        shown = "default" if case.queue == "tasks.default" else case.queue
        status = taskloop("status").stdout
        assert "IN PROGRESS" in status, status
        [line] = [line for line in status.splitlines() if line.startswith(shown) and "% " in line]
        assert case.item[:20] in line and "step " in line and first.worker[:20] in line, status
        assert max(len(line) for line in status.splitlines()) <= 100, status  # docs/operating.md
        [entry] = json.loads(taskloop("status", "--json").stdout)["progress"]
        assert (entry["queue"], entry["item"]) == (shown, case.item) and entry["message"].startswith("step ")
        finish(case.finish_key)
        wait_until(
            lambda: WorkLog.objects.filter(key=case.finish_key, phase="end").exclude(kind="progress-finish")
        )
        # The handler returned: the next write drops its progress (the worker still runs).
        wait_until(lambda: not running_progress(case.kind, case.queue, case.item))
        assert worker.poll() is None
        if name not in ("tube", "board"):  # (an acknowledged task, a consumed job: gone)
            assert "—" in boss.get(case.admin_url).content.decode()
    finally:
        finish(case.finish_key)  # (again, or at once when the test failed: no grace period to wait)
        output = stop(worker)
        print(output)  # shown when the test fails
    assert worker.returncode == 0, output
    assert "could not write the progress" not in output
