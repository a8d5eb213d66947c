"""The facade verbs that workers, the Tasks backend, the admin and the metrics use (issue 27):
``Tube.using/put(run_at=, with_row=)/take_many(checked=)/wait_take/touch_many/edit_task``,
``JobBoard.using/edit_job``, the querysets' ``in_claim_order()`` and the loops' ``renew``."""

from __future__ import annotations

import datetime
import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_taskloop.engine import DbNow, db_now
from django_taskloop.models import Job, JobBoard, JobPriority, Task, Tube
from django_taskloop.models.results import TaskRecord
from tests.testapp.models import IntLoop

from .test_tubes import _forget_callbacks  # noqa: F401  (its autouse fixture, shared)

pytestmark = pytest.mark.django_db


# -- tubes ---------------------------------------------------------------------------------


def test_tube_using_names_its_database():
    tube = Tube.objects.create_tube("q", "fifo")
    assert tube.using == "default"
    assert Tube.objects.using("default").get(pk=tube.pk).using == "default"


def test_put_run_at_delays_a_ttl_task_until_then():
    tube = Tube.objects.create_tube("q", "fifottl")
    later = db_now() + datetime.timedelta(seconds=600)
    task = tube.put({"n": 1}, run_at=later)
    assert Task.objects.get(pk=task.pk).state == "~"
    assert tube.take(0, consumer="w") is None
    Task.objects.filter(pk=task.pk).update(event_at=DbNow(-1))
    assert tube.take(0, consumer="w").pk == task.pk


def test_put_run_at_is_ignored_on_plain_tubes_but_checked():
    tube = Tube.objects.create_tube("q", "fifo")
    task = tube.put(1, run_at=timezone.now() + datetime.timedelta(seconds=600))
    assert task.state == "r"
    with pytest.raises(TypeError, match="run_at"):
        tube.put(1, run_at="tomorrow")
    with pytest.raises(ValueError, match="run_at"):
        tube.put(1, run_at=datetime.datetime(2030, 1, 1))
    assert Task.objects.filter(tube=tube).count() == 1


def test_put_with_row_writes_both_rows_and_reads_fields_back():
    tube = Tube.objects.create_tube("q", "fifottl")
    record = TaskRecord(
        task_path="tests.x",
        queue_name="default",
        backend="default",
        priority=0,
        args=[],
        kwargs={},
        enqueued_at=DbNow(),
    )
    task = tube.put({"result": record.id}, with_row=(record, ["enqueued_at"]))
    assert isinstance(record.enqueued_at, datetime.datetime)
    assert TaskRecord.objects.filter(pk=record.pk).exists()
    assert Task.objects.get(pk=task.pk).data == {"result": record.id}


def test_put_checks_unless_checked():
    tube = Tube.objects.create_tube("q", "fifo")
    with pytest.raises(TypeError, match="data"):
        tube.put({1, 2})
    with CaptureQueriesContext(connection) as unchecked:
        tube.put({"n": 1}, 3)
    with CaptureQueriesContext(connection) as checked:
        tube.put({"n": 2}, 3, checked=True)
    assert len(checked) == len(unchecked) == 1


def test_take_many_checked_takes_like_take_many():
    tube = Tube.objects.create_tube("q", "fifo")
    tube.put_many([1, 2, 3])
    assert [t.data for t in tube.take_many(2, consumer="w", checked=True)] == [1, 2]
    assert [t.data for t in tube.take_many(2, consumer="w")] == [3]
    with pytest.raises(ValueError, match="limit"):
        tube.take_many(0, consumer="w", checked=True)


@pytest.mark.django_db(transaction=True)
def test_wait_take_stops_when_asked():
    tube = Tube.objects.create_tube("q", "fifo")
    start = time.monotonic()
    assert tube.wait_take(30, consumer="w", stop=lambda: True) is None
    assert time.monotonic() - start < 5
    tube.put(7)
    assert tube.wait_take(30, consumer="w", stop=lambda: True).data == 7
    with pytest.raises(ValueError, match="timeout"):
        tube.wait_take(float("nan"))


def test_touch_many_touches_only_what_the_consumer_holds():
    tube = Tube.objects.create_tube("q", "fifottl", ttr=60)
    tube.put_many([1, 2, 3])
    mine = tube.take_many(2, consumer="w")
    other = tube.take(0, consumer="x")
    before = {t.pk: Task.objects.get(pk=t.pk).event_at for t in [*mine, other]}
    assert tube.touch_many([t.pk for t in [*mine, other]], 30, consumer="w") == 2
    after = {t.pk: Task.objects.get(pk=t.pk).event_at for t in [*mine, other]}
    assert all(after[t.pk] > before[t.pk] for t in mine)
    assert after[other.pk] == before[other.pk]
    assert tube.touch_many([t.pk for t in mine], None, consumer="w") == 0
    assert tube.touch_many([], 30, consumer="w") == 0
    with pytest.raises(TypeError, match="increment"):
        tube.touch_many([mine[0].pk], "30", consumer="w")
    plain = Tube.objects.create_tube("p", "fifo")
    plain.put(1)
    assert plain.touch_many([plain.take(0, consumer="w").pk], 30, consumer="w") == 0


def test_edit_task_changes_a_task_unless_taken():
    tube = Tube.objects.create_tube("q", "fifottl")
    task, held = tube.put({"n": 1}), tube.put({"n": 2}, pri=-1)
    assert tube.take(0, consumer="w").pk == held.pk
    assert tube.edit_task(task, pri=5, data={"n": 10}) == 1
    assert (Task.objects.get(pk=task.pk).pri, Task.objects.get(pk=task.pk).data) == (5, {"n": 10})
    assert tube.edit_task(held.pk, pri=5) == 0
    assert Task.objects.get(pk=held.pk).pri == -1
    with pytest.raises(TypeError, match="state"):
        tube.edit_task(task, state="!")
    other = Tube.objects.create_tube("other", "fifottl")
    assert other.edit_task(task, pri=1) == 0  # not a task of that tube


def test_tasks_in_claim_order():
    tube = Tube.objects.create_tube("q", "fifottl")
    for n, pri in ((1, 5), (2, 0), (3, 5), (4, -2)):
        tube.put(n, pri=pri)
    assert [t.data for t in tube.tasks.ready().in_claim_order()] == [4, 2, 1, 3]
    assert [t.data for t in tube.take_many(4, consumer="w")] == [4, 2, 1, 3]


# -- boards --------------------------------------------------------------------------------


def test_board_using_and_jobs_in_claim_order():
    board = JobBoard.objects.create_board("b")
    assert board.using == "default"
    board.post("low", priority="LOW")
    board.post("high", priority="HIGH")
    board.post("normal")
    board.post("high2", priority="HIGH")
    names = [j.name for j in board.jobs.claimable().in_claim_order()]
    assert names == ["high", "high2", "normal", "low"]
    assert [board.claim_next("w").name for _ in names] == names


def test_edit_job_changes_a_live_job_and_details_only_unclaimed():
    board = JobBoard.objects.create_board("b")
    job = board.post("j", {"a": 1})
    assert board.edit_job(job, priority="HIGH", details={"a": 2}) == 1
    job.refresh_from_db()
    assert (job.priority, job.details) == (JobPriority.HIGH, {"a": 2})
    assert job.last_modified >= job.created_on
    board.claim(job, "w")
    assert board.edit_job(job.uuid, details={"a": 3}) == 0
    assert board.edit_job(job.uuid, priority=JobPriority.LOW) == 1
    job.refresh_from_db()
    assert (job.priority, job.details) == (JobPriority.LOW, {"a": 2})
    board.trash(job, "w")
    assert board.edit_job(job, priority="HIGH") == 0
    with pytest.raises(TypeError, match="name"):
        board.edit_job(job, name="x")
    with pytest.raises(ValueError):
        board.edit_job(job, priority="URGENT")
    with pytest.raises(TypeError, match="details"):
        board.edit_job(job, details=[1])
    assert Job.objects.get(pk=job.pk).priority == JobPriority.LOW


# -- loops ---------------------------------------------------------------------------------


def test_loop_renew_relocks_only_locked_ids():
    IntLoop.objects.add([1, 2, 3])
    assert sorted(IntLoop.objects.claim(2, lock_for=10)) == [1, 2]
    IntLoop.objects.did(2)
    assert IntLoop.objects.renew([1, 2, 3], lock_for=600) == 1
    status = IntLoop.objects.status([1, 2, 3])
    assert status[1][1] > 500
    assert status[2][1] is None and status[3][1] is None
    assert IntLoop.objects.renew([]) == 0
    assert IntLoop.objects.filter(pk=3).renew(1, lock_for=600) == 0
    with pytest.raises(ValueError, match="lock_for"):
        IntLoop.objects.renew(1, lock_for=0)


def test_renewing_a_held_loop_id_keeps_it_held():
    IntLoop.objects.add(1)
    assert IntLoop.objects.claim(1, lock_for=1) == [1]
    IntLoop.objects.renew(1, lock_for=600)
    IntLoop.objects.filter(pk=1).update(last_updated=None)
    assert IntLoop.objects.claim(1, lock_for=1, min_loop_time=0) == []
