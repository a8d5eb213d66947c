"""System checks, with stable ids ``taskloop.E…``/``taskloop.W…``."""

from __future__ import annotations

from typing import Any

from django.core import checks
from django.db import connections

from . import engine


@checks.register(checks.Tags.database)
def check_skip_locked(databases: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """taskloop.E001: MySQL/MariaDB must support ``SKIP LOCKED``."""
    errors: list[checks.CheckMessage] = []
    for alias in databases or []:
        if not engine.supported(alias):
            errors.append(
                checks.Error(
                    f"Database {alias!r} ({connections[alias].display_name}) is not supported by django-taskloop.",
                    hint="Use SQLite, MySQL 8.0.1+, MariaDB 10.6+ or PostgreSQL 14+.",
                    id="taskloop.E002",
                )
            )
            continue
        features = engine.features(alias)
        # SQLite never row-locks (a writer takes the whole database): nothing to skip.
        if not features.write_lock_first and not features.skip_locked:
            errors.append(
                checks.Error(
                    f"Database {alias!r} does not support SELECT … FOR UPDATE SKIP LOCKED.",
                    hint="django-taskloop needs MySQL 8.0.1+ or MariaDB 10.6+ to claim rows "
                    "without table locks; upgrade the server.",
                    id="taskloop.E001",
                )
            )
    return errors


@checks.register()
def check_tasks_framework(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """taskloop.E004: ``TASKS`` names TaskloopBackend but no Tasks framework can be imported."""
    from . import backends
    from .conf import tasks_backend_aliases

    if backends.TaskloopBackend is not None:
        return []
    named = tasks_backend_aliases()
    if not named:
        return []
    return [
        checks.Error(
            f"TASKS[{alias!r}] names django_taskloop.backends.TaskloopBackend, but neither "
            "django.tasks (Django 6+) nor the django-tasks backport can be imported, so the "
            "setting has no effect.",
            hint="On Django 5.2 install the backport: pip install 'django-taskloop[tasks]' "
            "(and add 'django_tasks' to INSTALLED_APPS).",
            id="taskloop.E004",
        )
        for alias in named
    ]


@checks.register()
def check_schedules(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """taskloop.E010: a schedule that workers could not run (``TASKLOOP["SCHEDULE"]``, the time
    zone, a name used twice), reported at ``manage.py check`` rather than in a worker."""
    from .schedules import ScheduleError, configured

    try:
        configured()
    except ScheduleError as error:
        return [
            checks.Error(
                str(error),
                hint='Fix TASKLOOP["SCHEDULE"] / TASKLOOP["TIME_ZONE"] or the @periodic name: '
                "a cron expression has five fields (minute hour day month weekday), a task is the "
                "dotted path of a function decorated with @task, args a list and kwargs a dict "
                "that the task accepts.",
                id="taskloop.E010",
            )
        ]
    return []
