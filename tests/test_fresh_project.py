"""What a new project meets when TASKS is forgotten, or names another backend (issue 41).

A project of its own in a temporary directory (SQLite), driven through ``manage.py`` as a user
does: ``check`` warns that the apps' Django Tasks would run inline, ``workers`` with nothing to
serve says what to configure and exits non-zero, and ``tasks.py`` with django-taskloop's task
options imports and runs under Django's ImmediateBackend (a test settings file's).
"""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import django

from .workers_util import manage

FRAMEWORK = "django.tasks" if django.VERSION >= (6,) else "django_tasks"

SETTINGS = """
SECRET_KEY = "fresh"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "db.sqlite3"}}
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_taskloop", "shop"]
try:
    import django.tasks  # noqa: F401
except ImportError:
    INSTALLED_APPS.append("django_tasks")  # Django 5.2: the backport
"""

TASKS_PY = """
from django_taskloop.task_options import task


@task(max_attempts=5, ttl=60)
def charge(amount):
    return amount * 2
"""


def _project(tmp_path: Path, settings: str, tasks_py: str = TASKS_PY) -> Path:
    project = tmp_path / "project"
    (project / "shop").mkdir(parents=True)
    (project / "shop" / "__init__.py").write_text("")
    (project / "shop" / "tasks.py").write_text(textwrap.dedent(tasks_py))
    (project / "settings.py").write_text(SETTINGS + settings)
    return project


def _manage(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "settings", "PYTHONPATH": str(project)}
    env.pop("DATABASE_URL", None)
    return manage(*args, env=env, cwd=project)


def test_forgetting_tasks_is_a_warning_and_workers_with_nothing_to_serve_fail(tmp_path):
    project = _project(tmp_path, "")
    assert _manage(project, "migrate", "--no-input").returncode == 0

    check = _manage(project, "check")
    assert check.returncode == 0, check.stderr
    assert "taskloop.W003" in check.stderr and "shop.tasks.charge is a Django Task" in check.stderr, (
        check.stderr
    )
    assert "TASKS is not set" in check.stderr

    workers = _manage(project, "workers", "--burst")
    assert workers.returncode == 1, workers
    assert "nothing to serve" in workers.stderr and "TaskloopBackend" in workers.stderr, workers.stderr


def test_task_options_import_and_run_under_another_backend(tmp_path):
    project = _project(
        tmp_path, f'TASKS = {{"default": {{"BACKEND": "{FRAMEWORK}.backends.immediate.ImmediateBackend"}}}}\n'
    )
    check = _manage(project, "check")
    assert check.returncode == 0 and "W003" not in check.stderr, check.stderr  # TASKS chosen: no warning
    run = _manage(
        project, "shell", "-c", "from shop.tasks import charge; print(charge.enqueue(21).return_value)"
    )
    assert run.returncode == 0 and run.stdout.strip().splitlines()[-1] == "42", run


def test_djangos_own_task_with_options_under_another_backend_is_its_type_error(tmp_path):
    """As the README says: Django's own ``@task(max_attempts=…)`` needs TaskloopBackend (or
    django_taskloop.testing.ImmediateBackend); under Django's ImmediateBackend it is a TypeError
    (on Django 6.0 under any backend: its task() passes no option on)."""
    own = TASKS_PY.replace("from django_taskloop.task_options import task", f"from {FRAMEWORK} import task")
    project = _project(
        tmp_path,
        f'TASKS = {{"default": {{"BACKEND": "{FRAMEWORK}.backends.immediate.ImmediateBackend"}}}}\n',
        own,
    )
    run = _manage(project, "shell", "-c", "import shop.tasks")
    assert run.returncode != 0 and "unexpected keyword argument 'max_attempts'" in run.stderr, run.stderr
    # manage.py check names the cause and the fix, unless something imports the module first.
    check = _manage(project, "check")
    assert check.returncode != 0 and "taskloop.E005" in check.stderr, check.stderr
    assert "shop.tasks cannot be imported" in check.stderr and "task_options.task" in check.stderr
    # So does it when TASKS is forgotten (Django's default backend refuses the options too).
    forgotten = _project(tmp_path / "forgotten", "", own)
    check = _manage(forgotten, "check")
    assert check.returncode != 0 and "taskloop.E005" in check.stderr, check.stderr
