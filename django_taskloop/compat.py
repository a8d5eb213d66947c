"""The Django Tasks framework, wherever it comes from: ``django.tasks`` (Django 6+) or the
``django-tasks`` backport (``django_tasks``) on Django 5.2.

Every name here is ``None`` when neither can be imported (:data:`TASKS_AVAILABLE` says which);
then the Tasks backend is ``None`` and system check ``taskloop.E004`` says why. The type
checker reads the framework of its Python version: the backport below 3.12 (Django 6 needs
3.12), ``django.tasks`` from it on.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, TypeAlias

__all__ = [
    "TASKS_AVAILABLE",
    "DjangoTask",
    "DjangoTaskResult",
    "explain_refused_options",
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "framework_task",
    "normalize_json",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]

if TYPE_CHECKING:
    if sys.version_info >= (3, 12):
        from django.tasks import TaskResult, TaskResultStatus, task_backends
        from django.tasks import task as framework_task
        from django.tasks.backends.base import BaseTaskBackend
        from django.tasks.base import Task, TaskContext, TaskError
        from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
        from django.tasks.signals import task_enqueued, task_finished, task_started
        from django.utils.json import normalize_json

        #: A result of any Django Task (django-stubs make it generic in the task's parameters
        #: and return type, the backport in its return type only).
        DjangoTaskResult: TypeAlias = TaskResult[Any, Any]
    else:
        from django_tasks import TaskResult, TaskResultStatus, task_backends
        from django_tasks import task as framework_task
        from django_tasks.backends.base import BaseTaskBackend
        from django_tasks.base import Task, TaskContext, TaskError
        from django_tasks.exceptions import InvalidTaskError as InvalidTask
        from django_tasks.exceptions import TaskResultDoesNotExist
        from django_tasks.signals import task_enqueued, task_finished, task_started
        from django_tasks.utils import normalize_json

        DjangoTaskResult: TypeAlias = TaskResult[Any]
    #: A Django Task of any parameters and return type (a backend reads tasks by their path).
    DjangoTask: TypeAlias = Task[Any, Any]
else:
    try:  # Django 6.0+
        from django.tasks import TaskResult, TaskResultStatus, task_backends
        from django.tasks import task as framework_task
        from django.tasks.backends.base import BaseTaskBackend
        from django.tasks.base import Task, TaskContext, TaskError
        from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
        from django.tasks.signals import task_enqueued, task_finished, task_started
        from django.utils.json import normalize_json
    except ImportError:  # Django 5.2 with the django-tasks backport
        try:
            from django_tasks import TaskResult, TaskResultStatus, task_backends
            from django_tasks import task as framework_task
            from django_tasks.backends.base import BaseTaskBackend
            from django_tasks.base import Task, TaskContext, TaskError
            from django_tasks.exceptions import InvalidTaskError as InvalidTask
            from django_tasks.exceptions import TaskResultDoesNotExist
            from django_tasks.signals import task_enqueued, task_finished, task_started
            from django_tasks.utils import normalize_json
        except ImportError:  # neither is installed
            TaskResult = TaskResultStatus = task_backends = BaseTaskBackend = framework_task = None
            Task = TaskContext = TaskError = InvalidTask = TaskResultDoesNotExist = None
            task_enqueued = task_finished = task_started = normalize_json = None
    # (Django 6's Task and TaskResult are not generic at run time: the classes themselves.)
    DjangoTask, DjangoTaskResult = Task, TaskResult

#: Whether a Tasks framework could be imported.
TASKS_AVAILABLE: bool = BaseTaskBackend is not None


def explain_refused_options(error: TypeError) -> str | None:
    """Return one clear message if ``error`` is Django 6.0's ``@task`` refusing a backend
    option (its ``task()`` passes no unknown keyword to the backend; 6.1 and the backport do),
    else ``None``."""
    import django

    text = str(error)
    if django.VERSION[:2] != (6, 0) or "unexpected keyword argument" not in text:
        return None
    return (
        f"Django {django.get_version()}'s @task takes no backend options ({text}). "
        "django-taskloop's task options (max_attempts, backoff, ttl, ttr, key, unique, "
        "enqueue_on_commit) need Django 6.1+, or Django 5.2 with django-tasks 0.12+, with "
        "django.tasks' @task; on Django 6.0 decorate with django_taskloop.task_options.task "
        "(the same options, on every version) or give them per call with task.using(...)"
    )
