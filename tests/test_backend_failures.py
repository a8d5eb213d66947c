"""Django Tasks that fail end FAILED, never a crashed worker, never RUNNING forever (issue 12.4).

Real ``manage.py workers`` subprocesses on the test database.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from typing import Any

import pytest
from django.core import checks

from django_taskloop.backends import TaskloopBackend
from django_taskloop.models import Failure, Task, TaskRecord, Tube
from django_taskloop.workers import FailedForGood
from tests.testapp.models import WorkLog

from .workers_util import (
    ROOT,
    add,
    child_env,
    exit_now,
    explode,
    interrupt,
    nap,
    run_workers,
    start_workers,
    stop_hard,
    wait_until,
)

try:
    from django.tasks import TaskResultStatus, task_backends
    from django.tasks.signals import task_finished
except ImportError:  # Django 5.2: the backport
    from django_tasks import TaskResultStatus, task_backends
    from django_tasks.signals import task_finished

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.slow
def test_system_exit_and_keyboard_interrupt_end_failed_and_the_worker_carries_on():
    leaving = exit_now.enqueue(3)
    stopping = interrupt.enqueue()
    after = add.enqueue(1, 1)

    run = run_workers("--burst", "--only", "tasks.default")

    assert run.returncode == 0, run.stderr
    for result, kind in ((leaving, SystemExit), (stopping, KeyboardInterrupt)):
        result.refresh()
        assert result.status == TaskResultStatus.FAILED, run.stderr
        (error,) = result.errors
        assert error.exception_class is kind
        assert "Traceback" in error.traceback and kind.__name__ in error.traceback
    after.refresh()
    assert after.return_value == 2
    # The operator's Failures list has both, with the task's own exception.
    errors = sorted(
        Failure.objects.filter(kind="task", queue="tasks.default").values_list("error", flat=True)
    )
    assert errors == ["builtins.KeyboardInterrupt", "builtins.SystemExit"]
    # Counted as failed, not as done; the tube tasks are all settled.
    assert "summary default (Django Tasks): 1 done, 2 failed" in run.stderr
    assert Tube.objects.statistics()["tasks.default"]["tasks"]["total"] == 0


#: The three ways a stored path stops naming a Task: its module is gone, the module no longer
#: has the name, the name is something else than a Task (and what each ends FAILED with).
GONE_PATHS = [
    ("tests.nowhere.gone", "ModuleNotFoundError"),
    ("tests.workers_util.no_such_task", "ImportError"),
    ("tests.workers_util.not_a_task", "TypeError"),
]


def lose_path(path: str) -> None:
    """Make the one waiting task of queue ``default`` name ``path`` (the tube task carries the
    call until a worker starts it: its path changes there)."""
    (queued,) = Tube.objects.get(name="tasks.default").tasks.all()
    Task.objects.filter(pk=queued.pk).update(data={**queued.data, "task": path})


@pytest.mark.slow
@pytest.mark.parametrize(("path", "error"), GONE_PATHS)
def test_a_stored_path_that_is_not_a_task_ends_failed_and_is_never_called(path, error):
    result = add.enqueue(1, 2)
    lose_path(path)

    run = run_workers("--burst", "--only", "tasks.default")

    assert run.returncode == 0, run.stderr
    record = TaskRecord.objects.get(pk=result.id)
    assert record.status == "FAILED"
    (stored,) = record.errors
    assert stored["exception_class_path"].endswith(error)
    assert "Traceback" in stored["traceback"]
    assert not WorkLog.objects.filter(kind="not-a-task").exists()
    # Not retried: the tube task was settled.
    assert Tube.objects.statistics()["tasks.default"]["tasks"]["total"] == 0
    # Its result still reads.
    again = task_backends["default"].get_result(result.id)
    assert again.status == TaskResultStatus.FAILED
    assert again.errors[0].traceback == stored["traceback"]
    # Named by the stored path, not by a stand-in's name (issue 28, item 3).
    assert again.task.module_path == path
    assert "_missing" not in run.stderr
    # Failed once, for good: no retry of the worker's own (issue 39, item 4).
    assert "attempt 1 of" not in run.stderr, run.stderr


@pytest.mark.parametrize(("path", "error"), GONE_PATHS)
def test_a_path_that_no_longer_names_a_task_reads_and_ends_failed_with_task_finished(path, error):
    """Issue 39, item 4: on Django 6.0 (whose Task has no default ``run_after``) the stand-in
    that a result of such a path is read with could not be built: ``get_result()`` raised
    ``TypeError``, and so did ``execute()``, before ``task_finished``; the worker then retried."""
    result = add.enqueue(1, 2)
    lose_path(path)
    backend = task_backends["default"]
    waiting = backend.get_result(result.id)  # not started: read off its tube task
    assert waiting.status == TaskResultStatus.READY and waiting.args == [1, 2]
    assert waiting.task.module_path == path and waiting.task.run_after is None
    finished: list[Any] = []

    def on_finished(sender: Any, task_result: Any, **kwargs: Any) -> None:
        finished.append(task_result)

    task_finished.connect(on_finished)
    try:
        with pytest.raises(FailedForGood, match="is not a Task"):
            backend.execute(result.id, "here")
    finally:
        task_finished.disconnect(on_finished)
    (sent,) = finished
    assert sent.id == result.id and sent.status == TaskResultStatus.FAILED
    assert sent.task.module_path == path
    assert sent.errors[0].exception_class_path.endswith(error)
    again = backend.get_result(result.id)
    assert again.status == TaskResultStatus.FAILED and again.task.module_path == path
    assert TaskRecord.objects.get(pk=result.id).status == "FAILED"


@pytest.mark.slow
def test_a_hard_stop_puts_a_running_task_back_to_ready_and_it_runs_again():
    result = nap.enqueue(30)
    worker = start_workers("--only", "tasks.default")
    try:
        wait_until(lambda: TaskRecord.objects.filter(pk=result.id, status="RUNNING").exists(), timeout=60)
        started = time.monotonic()
        output = stop_hard(worker)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert time.monotonic() - started < 15, output
    assert worker.returncode == 0, output
    result.refresh()
    assert result.status == TaskResultStatus.READY, output
    assert (
        Tube.objects.get(name="tasks.default")
        .peek(int(Tube.objects.get(name="tasks.default").tasks.all()[0].id))
        .state
        == "r"
    )
    TaskRecord.objects.filter(pk=result.id).update(args=[0.1])
    again = run_workers("--burst", "--only", "tasks.default")
    assert again.returncode == 0, again.stderr
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == "rested"
    assert len(result.worker_ids) == 2


def test_a_failed_task_logs_its_traceback(caplog):
    result = explode.enqueue("kaboom")
    with caplog.at_level(logging.INFO), pytest.raises(FailedForGood):
        task_backends["default"].execute(result.id, "here")
    failed = [r for r in caplog.records if r.levelno >= logging.ERROR and "state=" in r.getMessage()]
    assert failed, [r.getMessage() for r in caplog.records]
    text = caplog.text
    assert "NoneType: None" not in text
    assert "RuntimeError: kaboom" in text


def _check(settings_code: str) -> subprocess.CompletedProcess[str]:
    """Run ``manage.py check`` in a fresh process whose settings module is ``settings_code``."""
    script = (
        "import sys, types\n"
        f"{settings_code}\n"
        "from django.core.management import execute_from_command_line\n"
        "execute_from_command_line(['manage.py', 'check'])\n"
    )
    env = child_env(DJANGO_SETTINGS_MODULE="check_settings")
    return subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )


_SETTINGS = """
settings = types.ModuleType('check_settings')
settings.SECRET_KEY = 'x'
settings.DATABASES = {'default': {'ENGINE': 'django.db.backends.sqlite3', 'NAME': ':memory:'}}
settings.INSTALLED_APPS = APPS
settings.TASKS = {'default': {'BACKEND': 'django_taskloop.backends.TaskloopBackend'}}
settings.USE_TZ = True
sys.modules['check_settings'] = settings
"""


def test_check_errors_when_the_backend_is_used_without_the_app():
    apps = ["django.contrib.contenttypes", "django.contrib.auth"]
    try:
        import django.tasks  # noqa: F401

        # Django 6 checks task backends once django.tasks is imported, as the code of any
        # project that defines tasks does.
        uses_tasks = "import django.tasks\n"
    except ImportError:
        apps.append("django_tasks")  # the backport's app registers the same check
        uses_tasks = ""
    run = _check(uses_tasks + f"APPS = {apps!r}" + _SETTINGS)
    assert run.returncode != 0, run.stdout + run.stderr
    assert "taskloop.E003" in run.stderr, run.stderr
    assert "'django_taskloop' is not in INSTALLED_APPS" in run.stderr


def test_check_errors_when_no_tasks_framework_can_be_imported():
    # Both spellings made unimportable in that process: setting is then silently ignored.
    block = "sys.modules['django.tasks'] = None\nsys.modules['django_tasks'] = None\n"
    run = _check(
        block + "APPS = ['django.contrib.contenttypes', 'django.contrib.auth', 'django_taskloop']" + _SETTINGS
    )
    assert run.returncode != 0, run.stdout + run.stderr
    assert "taskloop.E004" in run.stderr, run.stderr


def test_no_check_fires_for_a_correct_setup():
    backend = task_backends["default"]
    assert isinstance(backend, TaskloopBackend)
    assert [m for m in backend.check() if m.level >= checks.ERROR] == []
    from django_taskloop.checks import check_tasks_framework

    assert check_tasks_framework() == []


def test_using_the_backend_without_the_app_is_a_clear_error(settings):
    from django.core.exceptions import ImproperlyConfigured

    settings.INSTALLED_APPS = [a for a in settings.INSTALLED_APPS if a not in ("django_taskloop", "demo")]
    backend = TaskloopBackend("elsewhere", {})
    with pytest.raises(ImproperlyConfigured, match="'django_taskloop' is not in INSTALLED_APPS"):
        backend.enqueue(add, [1, 2], {})
    assert not TaskRecord.objects.exists()
