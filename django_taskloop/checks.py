"""System checks, with stable ids ``taskloop.E…``/``taskloop.W…``."""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Sequence

from django.apps import AppConfig, apps
from django.conf import settings
from django.core import checks
from django.db import connections
from django.utils.module_loading import module_has_submodule

from . import backends, compat, engine
from .conf import DEFAULTS, RULES, tasks_backend_aliases, user_settings
from .schedules import ScheduleError, configured


@checks.register(checks.Tags.database)
def check_skip_locked(databases: Sequence[str] | None = None, **kwargs: object) -> list[checks.CheckMessage]:
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
def check_tasks_framework(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: object
) -> list[checks.CheckMessage]:
    """taskloop.E004: ``TASKS`` names TaskloopBackend but no Tasks framework can be imported."""
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
def check_tasks_configured(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: object
) -> list[checks.CheckMessage]:
    """When ``TASKS`` names no ``TaskloopBackend``, the apps' ``tasks`` modules:

    - taskloop.E005: one cannot be imported because Django's ``@task`` handed django-taskloop's
      options (``max_attempts=…``) to a backend that takes none (a ``TypeError``);
    - taskloop.W003: ``TASKS`` is not set at all and they define Django Tasks: ``enqueue()``
      runs each at once, inline, through Django's default backend, and no worker runs them.
      (A ``TASKS`` that names other backends, such as a test settings file's, is a choice.)
    """
    if compat.Task is None or tasks_backend_aliases():
        return []
    found, refused = _defined_tasks(compat.Task)
    messages: list[checks.CheckMessage] = [
        checks.Error(
            f"{module} cannot be imported ({error}): Django's @task hands task options to the "
            "TASKS backend, and only django-taskloop's take them.",
            hint='Set TASKS = {"default": {"BACKEND": "django_taskloop.backends.TaskloopBackend"}}; '
            "under another backend (tests) decorate with django_taskloop.task_options.task, whose "
            "options have no effect there (README: Another backend in tests or staging).",
            id="taskloop.E005",
        )
        for module, error in refused
    ]
    # (is_overridden: whether the settings module sets it; django-stubs lack it.)
    if found and not settings.is_overridden("TASKS"):  # type: ignore[misc]
        shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        messages.append(
            checks.Warning(
                f"{shown} {'is a Django Task' if len(found) == 1 else 'are Django Tasks'}, but TASKS "
                "is not set: enqueue() runs them at once, in the caller, through Django's default "
                "backend, and no worker runs them.",
                hint='Set TASKS = {"default": {"BACKEND": "django_taskloop.backends.TaskloopBackend"}} '
                "(README: Django Tasks).",
                id="taskloop.W003",
            )
        )
    return messages


def _defined_tasks(task_class: type) -> tuple[list[str], list[tuple[str, str]]]:
    """Return the dotted paths of the Django Tasks that the installed apps' ``tasks`` modules
    define (each module imported, as ``admin.autodiscover()`` imports ``admin`` modules), and
    ``(module, error)`` for each that a backend's refusal of task options kept from importing."""
    found: list[str] = []
    refused: list[tuple[str, str]] = []
    for app_config in apps.get_app_configs():
        if not module_has_submodule(app_config.module, "tasks"):
            continue
        dotted = f"{app_config.name}.tasks"
        try:
            module = importlib.import_module(dotted)
        except TypeError as error:
            if "unexpected keyword argument" in str(error):
                refused.append((dotted, f"TypeError: {error}"))
            continue
        except Exception:  # noqa: BLE001 (another framework's tasks module: not this check's business)
            continue
        found += [
            f"{module.__name__}.{name}"
            for name, value in vars(module).items()
            if isinstance(value, task_class) and getattr(value, "module_path", "").startswith(module.__name__)
        ]
    return found, refused


@checks.register()
def check_schedules(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: object
) -> list[checks.CheckMessage]:
    """taskloop.E010: a schedule that workers could not run (``TASKLOOP["SCHEDULE"]``, the time
    zone, a name used twice), reported at ``manage.py check`` rather than in a worker."""
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


@checks.register()
def check_settings(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: object
) -> list[checks.CheckMessage]:
    """taskloop.E020/E021/W020: each ``TASKLOOP`` key has a value of its type and range, and
    every key is one django-taskloop knows (a misspelt key would silently keep its default)."""
    user = user_settings()
    if not isinstance(user, dict):
        return [
            checks.Error(
                f"TASKLOOP must be a dict, not {type(user).__name__}.",
                hint=f"Known keys: {', '.join(DEFAULTS)}; see docs/settings.md, the settings reference.",
                id="taskloop.E021",
            )
        ]
    found: list[checks.CheckMessage] = []
    for key, value in user.items():
        if key not in RULES:
            found.append(_unknown_key(key))
            continue
        try:
            RULES[key](value, f"TASKLOOP[{key!r}]")
        except (TypeError, ValueError) as error:
            found.append(
                checks.Error(
                    f"{error}.",
                    hint=f"The default is {DEFAULTS[key]!r}; see docs/settings.md, the settings reference.",
                    id="taskloop.E020",
                )
            )
    return found


def _unknown_key(key: object) -> checks.CheckMessage:
    """taskloop.W020 for a key ``TASKLOOP`` does not know, naming the nearest known one."""
    nearest = difflib.get_close_matches(str(key).upper(), DEFAULTS, n=1, cutoff=0.6)
    hint = (
        f"Did you mean {nearest[0]!r}?"
        if nearest
        else f"Known keys: {', '.join(DEFAULTS)}; see docs/settings.md, the settings reference."
    )
    return checks.Warning(
        f"TASKLOOP[{key!r}] is not a django-taskloop setting: it is ignored.", hint=hint, id="taskloop.W020"
    )


@checks.register(checks.Tags.admin)
def check_rangefilter(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: object
) -> list[checks.CheckMessage]:
    """taskloop.E030: the admin's date and number range filters need ``rangefilter`` installed."""
    if not apps.is_installed("django.contrib.admin") or apps.is_installed("rangefilter"):
        return []
    return [
        checks.Error(
            "'rangefilter' must be in INSTALLED_APPS: django-taskloop's admin filters dates and "
            "priorities with django-admin-rangefilter, whose templates and static files come "
            "from that app (without it the admin's lists fail to render).",
            hint='Add "rangefilter" to INSTALLED_APPS (it is installed with django-taskloop).',
            id="taskloop.E030",
        )
    ]
