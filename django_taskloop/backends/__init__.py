"""A Django Tasks backend whose tasks wait in tubes and run in ``manage.py workers``.

    TASKS = {"default": {"BACKEND": "django_taskloop.backends.TaskloopBackend", "QUEUES": ["default"]}}

Each queue name is a ``fifottl`` tube named ``tasks.<queue_name>`` (created on first use);
Django's priority orders the tube (``pri = 100 - priority``: higher runs sooner) and
``run_after`` becomes the put's ``delay``, measured on the database's clock. The result lives
in a :class:`~django_taskloop.models.TaskRecord` row. Works with Django 6's ``django.tasks``
and with the ``django-tasks`` backport (``django_tasks``) on Django 5.2.

The backend is one class made of parts, one job each: ``backend`` (Django's side of it, and
finding the backends of ``TASKS``), ``enqueue`` (checking a task, putting its calls in their
queues' tubes, on their shards), ``results`` (reading results, ``retry``), ``execute`` (a
worker running a claimed task: attempts, signals, the result written) and ``handlers`` (the
worker's tube handler for each queue); ``queues`` keeps the tube of each queue.
"""

from __future__ import annotations

from ..task_calls import (
    KEYED_TUBE_PREFIX,
    TUBE_PREFIX,
    keyed_tube_name,
    result_id_of,
    short_result_id,
    task_path_of,
    tube_name,
    waiting_results,
)
from .backend import TaskloopBackend, taskloop_backend, taskloop_backends
from .handlers import task_handlers

__all__ = [
    "TaskloopBackend",
    "TUBE_PREFIX",
    "KEYED_TUBE_PREFIX",
    "tube_name",
    "keyed_tube_name",
    "task_handlers",
    "taskloop_backend",
    "taskloop_backends",
    "result_id_of",
    "task_path_of",
    "waiting_results",
    "short_result_id",
]
