"""The Django Tasks backend: enqueue into tubes, results from any process, run by ``workers``."""

from __future__ import annotations

import datetime as dt

import pytest

from django_taskloop.backends import TaskloopBackend, result_id_of, tube_name
from django_taskloop.engine import db_now
from django_taskloop.models import TaskRecord, Tube

from .workers_util import add, attempt_of, explode, run_workers

try:
    from django.tasks import TaskResultStatus, task, task_backends
    from django.tasks.exceptions import InvalidTask as InvalidTaskError
    from django.tasks.exceptions import TaskResultDoesNotExist
except ImportError:  # Django 5.2: the backport
    from django_tasks import TaskResultStatus, task, task_backends
    from django_tasks.exceptions import InvalidTaskError, TaskResultDoesNotExist

pytestmark = pytest.mark.django_db


def test_the_configured_backend_is_taskloop():
    backend = task_backends["default"]
    assert isinstance(backend, TaskloopBackend)
    assert backend.supports_defer and backend.supports_get_result and backend.supports_priority


def test_enqueue_writes_one_row_the_tube_task_that_carries_the_call():
    result = add.using(priority=30).enqueue(2, b=3)
    assert result.status == TaskResultStatus.READY
    assert result.args == [2] and result.kwargs == {"b": 3}
    assert result.enqueued_at is not None
    tube = Tube.objects.get(name=tube_name("default"))
    assert tube.type == "fifottl"
    (task,) = tube.tasks.all()
    assert task.state == "r"
    assert result_id_of(task) == result.id == f"{task.pk}-{task.data['id']}"
    assert task.data == {
        "task": add.module_path,
        "args": [2],
        "kwargs": {"b": 3},
        "id": task.data["id"],
        "backend": "default",
        "queue": "default",
    }
    assert task.pri == 70  # higher Django priority, lower (sooner) tube pri
    # One row: the result reads from the tube task until a worker starts it.
    assert not TaskRecord.objects.exists()
    again = add.get_result(result.id)
    assert again.status == TaskResultStatus.READY
    assert again.id == result.id and again.enqueued_at == result.enqueued_at
    assert (again.args, again.kwargs) == ([2], {"b": 3})
    assert again.task.func is add.func
    assert again.task.priority == 30
    with pytest.raises(ValueError, match="not finished"):
        _ = again.return_value


def test_run_after_delays_the_tube_task():
    result = add.using(run_after=db_now() + dt.timedelta(seconds=300)).enqueue(1, 1)
    (task,) = Tube.objects.get(name="tasks.default").tasks.all()
    assert task.state == "~"
    assert add.get_result(result.id).task.run_after is not None


def test_get_result_of_an_unknown_id_raises():
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result("nope")


def test_a_queue_the_backend_does_not_serve_is_refused():
    def f() -> None:
        pass

    f.__module__ = __name__
    with pytest.raises(InvalidTaskError):
        task(queue_name="not configured")(f)


def test_enqueue_inside_a_rolled_back_transaction_leaves_nothing():
    from django.db import transaction

    with transaction.atomic():
        add.enqueue(1, 2)
        transaction.set_rollback(True)
    assert not TaskRecord.objects.exists()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_round_trip_through_a_worker_process():
    ok = add.enqueue(2, 3)
    bad = explode.enqueue("kaboom")
    ctx = attempt_of.enqueue()

    done = run_workers("--burst", "--only", "tasks.default", "--only", "tasks.slow")

    assert done.returncode == 0, done.stderr
    ok.refresh()
    assert ok.status == TaskResultStatus.SUCCESSFUL
    assert ok.return_value == 5
    assert ok.started_at and ok.finished_at and ok.finished_at >= ok.started_at
    assert ok.attempts == 1 and len(ok.worker_ids) == 1
    bad = explode.get_result(bad.id)
    assert bad.status == TaskResultStatus.FAILED
    assert bad.is_finished
    with pytest.raises(ValueError, match="failed"):
        _ = bad.return_value
    (error,) = bad.errors
    assert error.exception_class is RuntimeError
    assert "kaboom" in error.traceback
    assert attempt_of.get_result(ctx.id).return_value == {"attempt": 1, "id": ctx.id}
    # Failures are final for Django Tasks: the tube tasks were all acknowledged.
    assert Tube.objects.statistics()["tasks.default"]["tasks"]["total"] == 0
    assert Tube.objects.statistics()["tasks.slow"]["tasks"]["total"] == 0


@pytest.mark.django_db(transaction=True)
def test_a_task_finished_before_a_redelivery_is_not_run_again():
    result = add.enqueue(4, 4)
    backend = task_backends["default"]
    backend.execute(result.id, "w1")
    backend.execute(result.id, "w2")  # e.g. its worker died before acknowledging
    result.refresh()
    assert result.return_value == 8
    assert result.worker_ids == ["w1"]


def test_the_demo_view_enqueues_a_task_and_shows_its_result(client):
    response = client.post("/demo/tasks/")
    assert response.status_code == 202
    result_id = response.json()["id"]
    assert response.json()["status"] == "READY"
    assert task_backends["default"].get_result(result_id).task.module_path == "demo.tasks.count_reviewed"
    shown = client.get(f"/demo/tasks/{result_id}/").json()
    assert shown == {"id": result_id, "status": "READY"}
    task_backends["default"].execute(result_id, "here")
    shown = client.get(f"/demo/tasks/{result_id}/").json()
    assert shown == {"id": result_id, "status": "SUCCESSFUL", "return_value": {"reviewed": 0, "total": 0}}
