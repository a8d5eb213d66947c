"""What a Django Tasks backend promises, checked on ours: the behaviours django-tasks-db's own
suite checks of its backend that are not about its model or its worker (issue 16). Written
here in our words: that suite tests its ``DBTaskResult`` rows and its ``db_worker`` directly,
so it cannot be pointed at another backend, and its code stays out of this repository."""

from __future__ import annotations

import datetime as dt

import pytest
from asgiref.sync import async_to_sync

from django_taskloop.backends import TaskloopBackend, result_id_of, tube_name
from django_taskloop.engine import db_now
from django_taskloop.models import TaskRecord, Tube

from .workers_util import add, explode

try:
    from django.tasks import TaskResultStatus, default_task_backend, task_backends
    from django.tasks.exceptions import InvalidTask as InvalidTaskError
    from django.tasks.exceptions import TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
except ImportError:  # Django 5.2: the backport
    from django_tasks import TaskResultStatus, default_task_backend, task_backends
    from django_tasks.exceptions import InvalidTaskError, TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued, task_finished, task_started

pytestmark = pytest.mark.django_db(transaction=True)


def run_ready(queue: str = "default") -> list[str]:
    """Run, in this process, what is ready in ``queue``'s tube, as a worker does; return the
    result ids in the order they ran."""
    from django_taskloop.workers import FailedForGood

    tube = Tube.objects.get(name=tube_name(queue))
    ran = []
    while (queued := tube.take(0, consumer="contract")) is not None:
        try:
            default_task_backend.execute(result_id_of(queued), "host:1", queued=queued)
        except FailedForGood:
            pass
        tube.ack(queued.id, consumer="contract")
        ran.append(result_id_of(queued))
    return ran


def capture(signal):
    received = []

    def receiver(sender, task_result, **kwargs):
        received.append((sender, task_result.id, task_result.status))

    signal.connect(receiver, weak=False, dispatch_uid=f"contract-{id(received)}")
    return received, lambda: signal.disconnect(dispatch_uid=f"contract-{id(received)}")


def test_the_default_backend_is_ours_and_its_checks_pass():
    assert isinstance(task_backends["default"], TaskloopBackend)
    assert default_task_backend.alias == "default"  # (a proxy of task_backends["default"])
    assert list(task_backends["default"].check()) == []


def test_a_fresh_result_is_ready_unstarted_and_has_no_value_yet():
    received, disconnect = capture(task_enqueued)
    try:
        result = add.enqueue(1, b=3)
    finally:
        disconnect()
    assert result.status == TaskResultStatus.READY and not result.is_finished
    assert result.started_at is None and result.last_attempted_at is None and result.finished_at is None
    assert result.enqueued_at is not None
    assert result.task == add and result.args == [1] and result.kwargs == {"b": 3}
    assert result.attempts == 0 and result.errors == [] and result.worker_ids == []
    with pytest.raises(ValueError, match="not finished"):
        _ = result.return_value
    assert received == [(TaskloopBackend, result.id, TaskResultStatus.READY)]


def test_get_result_equals_the_enqueued_result_and_unknown_ids_raise():
    result = add.enqueue(2, 2)
    assert default_task_backend.get_result(result.id) == result
    assert add.get_result(result.id).args == [2, 2]
    for missing in ("123", "x" * 32, ""):
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result(missing)


def test_async_enqueue_and_get_result():
    result = async_to_sync(add.aenqueue)(4, 5)
    assert result.status == TaskResultStatus.READY
    assert async_to_sync(default_task_backend.aget_result)(result.id) == result
    with pytest.raises(TaskResultDoesNotExist):
        async_to_sync(default_task_backend.aget_result)("123")


def test_refresh_sees_the_result_a_worker_wrote():
    result = add.enqueue(20, 22)
    started, stop_started = capture(task_started)
    finished, stop_finished = capture(task_finished)
    try:
        assert run_ready() == [result.id]
    finally:
        stop_started()
        stop_finished()
    assert result.status == TaskResultStatus.READY  # a result object is a snapshot
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.is_finished
    assert result.return_value == 42 and result.attempts == 1 and result.worker_ids == ["host:1"]
    assert result.started_at <= result.last_attempted_at <= result.finished_at
    assert [s for _, _, s in started] == [TaskResultStatus.RUNNING]
    assert [s for _, _, s in finished] == [TaskResultStatus.SUCCESSFUL]
    async_to_sync(result.arefresh)()
    assert result.return_value == 42


def test_a_failed_task_keeps_its_exception_and_traceback():
    result = explode.enqueue("no disk")
    run_ready("slow")
    result.refresh()
    assert result.status == TaskResultStatus.FAILED and result.is_finished
    (error,) = result.errors
    assert error.exception_class_path == "builtins.RuntimeError"
    assert "no disk" in error.traceback and "Traceback (most recent call last)" in error.traceback
    with pytest.raises(ValueError, match="not finished|failed|no return value"):
        _ = result.return_value


def test_higher_priority_runs_first_and_equal_priorities_in_enqueue_order():
    low = add.using(priority=-10).enqueue(1, 1)
    first = add.enqueue(1, 2)
    second = add.enqueue(1, 3)
    high = add.using(priority=50).enqueue(1, 4)
    assert run_ready() == [high.id, first.id, second.id, low.id]


def test_run_after_holds_a_task_until_then():
    later = add.using(run_after=db_now() + dt.timedelta(seconds=300)).enqueue(1, 1)
    now = add.enqueue(2, 2)
    assert run_ready() == [now.id]
    assert add.get_result(later.id).status == TaskResultStatus.READY
    Tube.objects.get(name=tube_name("default")).tasks.all().filter(state="~").update(event_at=db_now())
    assert run_ready() == [later.id]


def test_validation_refuses_what_the_backend_cannot_run_and_writes_nothing():
    with pytest.raises(InvalidTaskError):
        add.using(queue_name="not-configured").enqueue(1, 1)
    with pytest.raises(InvalidTaskError):
        add.using(priority=101).enqueue(1, 1)
    assert TaskRecord.objects.count() == 0
