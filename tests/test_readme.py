"""Every Python block of README.md runs as written, in a brand-new project (issue 13).

Each block is preceded by a marker comment that says where it goes, the way a user would put it:

- ``<!-- readme-test: settings -->``: appended to the new project's ``settings.py``;
- ``<!-- readme-test: models -->``: the new app's ``models.py``;
- ``<!-- readme-test: taskloop -->``: the new app's ``taskloop.py``;
- ``<!-- readme-test: run -->``: run in order, in one ``manage.py shell`` session, after
  ``makemigrations`` and ``migrate``, with the app's models imported;
- ``<!-- readme-test: tests -->``: the new app's ``tests.py``, run by ``manage.py test``.

A Python block without a marker fails the test, so no example goes untested. The project uses
the suite's database server (``DATABASE_URL``) with a database of its own.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import django
import pytest
from django.db import connections

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"(?:<!-- readme-test: (\w+) -->\n)?```python\n(.*?)```", re.S)

pytestmark = [pytest.mark.slow, pytest.mark.django_db]


def readme_blocks() -> list[tuple[str | None, str]]:
    return [(kind, code) for kind, code in BLOCK.findall((ROOT / "README.md").read_text())]


def test_every_python_block_has_a_place():
    blocks = readme_blocks()
    assert len(blocks) >= 8
    unplaced = [
        code.splitlines()[0]
        for kind, code in blocks
        if kind not in ("settings", "models", "taskloop", "run", "tests")
    ]
    assert not unplaced, f"README blocks without a readme-test marker: {unplaced}"


def _database_url(tmp_path: Path) -> tuple[str, Any]:
    """A database of the project's own on the suite's server; return its URL and a dropper."""
    connection = connections["default"]
    settings = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{tmp_path / 'readme.sqlite3'}", lambda: None
    name = f"readme_{os.environ.get('TASKLOOP_TEST_SUFFIX', 'x')}".lower()
    with connection._nodb_cursor() as cursor:
        cursor.execute(f"DROP DATABASE IF EXISTS {name}")
        cursor.execute(f"CREATE DATABASE {name}")

    def drop() -> None:
        with connection._nodb_cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS {name}")

    scheme = {"mysql": "mysql", "postgresql": "postgres"}[connection.vendor]
    user = settings.get("USER") or ""
    password = f":{settings['PASSWORD']}" if settings.get("PASSWORD") else ""
    at = "@" if user else ""
    host = settings.get("HOST") or ""
    port = f":{settings['PORT']}" if settings.get("PORT") else ""
    return f"{scheme}://{user}{password}{at}{host}{port}/{name}", drop


def test_readme_examples_run_as_written_in_a_fresh_project(tmp_path):
    blocks = readme_blocks()
    project = tmp_path / "project"
    app = project / "readme_app"
    (app / "migrations").mkdir(parents=True)
    (app / "__init__.py").write_text("")
    (app / "migrations" / "__init__.py").write_text("")
    place = {
        kind: [code for k, code in blocks if k == kind]
        for kind in ("settings", "models", "taskloop", "run", "tests")
    }
    settings_py = textwrap.dedent(
        """
        import os

        import dj_database_url

        SECRET_KEY = "readme"
        USE_TZ = True
        DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
        DATABASES = {"default": dj_database_url.parse(os.environ["README_DATABASE_URL"])}
        INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "readme_app"]
        try:
            import django.tasks  # noqa: F401
        except ImportError:
            INSTALLED_APPS.append("django_tasks")  # Django 5.2: the backport (the tasks extra)
        """
    )
    (project / "settings.py").write_text(settings_py + "\n".join(place["settings"]))
    (app / "models.py").write_text("\n\n".join(place["models"]))
    (app / "taskloop.py").write_text("\n\n".join(place["taskloop"]))
    (app / "tests.py").write_text("\n\n".join(place["tests"]))
    script = "from readme_app.models import *\n\n" + "\n\n".join(place["run"]) + "\nprint('README OK')\n"
    url, drop = _database_url(tmp_path)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "settings",
        "PYTHONPATH": str(project),
        "README_DATABASE_URL": url,
    }
    env.pop("DATABASE_URL", None)

    def manage(*args: str, stdin: str | None = None) -> str:
        run = subprocess.run(
            [sys.executable, "-m", "django", *args],
            cwd=project,
            env=env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert run.returncode == 0, f"manage.py {' '.join(args)} failed:\n{run.stdout}\n{run.stderr}"
        return run.stdout + run.stderr

    try:
        if django.VERSION[:2] == (6, 0):
            # As the README's table says: Django 6.0's task() passes no option on, and a
            # taskloop.py that gives it one is one ImproperlyConfigured naming the version...
            run = subprocess.run(
                [sys.executable, "-m", "django", "check"],
                cwd=project,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert run.returncode != 0 and "ImproperlyConfigured" in run.stderr, run.stderr
            assert "6.0" in run.stderr.strip().splitlines()[-1], run.stderr
            # ... and django_taskloop.task_options.task takes them on every version.
            taskloop_py = (app / "taskloop.py").read_text()
            assert "from django.tasks import task" in taskloop_py
            # (There a callable backoff must be a module-level function, which the worker imports.)
            lambda_backoff = "backoff=lambda attempt: 30 * attempt"
            assert lambda_backoff in taskloop_py
            taskloop_py = taskloop_py.replace(
                "from django.tasks import task", "from django_taskloop.task_options import task"
            ).replace(lambda_backoff, "backoff=thirty_seconds_an_attempt")
            (app / "taskloop.py").write_text(
                "def thirty_seconds_an_attempt(attempt):\n    return 30 * attempt\n\n\n" + taskloop_py
            )
        manage("makemigrations", "readme_app")
        manage("migrate", "--no-input")
        manage("check")
        out = manage("shell", "--no-startup", "-c", script)
        assert "README OK" in out
        # The testing recipe's TestCase, with Django's own test runner (a test database).
        tested = manage("test", "readme_app", "--noinput")
        cases = sum(code.count("def test_") for code in place["tests"])
        assert cases and f"Ran {cases} test" in tested and "\nOK" in tested, tested
        assert "locked" not in tested, tested  # nothing printed: no worker met the test's transaction
        # The handlers of the README's taskloop.py are found, by the names the README gives.
        listed = manage(
            "shell",
            "-c",
            "from django_taskloop.workers import get_handlers; print(sorted(h.name for h in get_handlers()))",
        )
        assert "'emails'" in listed and "'readme_app.feedloop'" in listed and "'builds'" in listed
        manage(
            "shell", "-c", "from django_taskloop.models import Tube; Tube.objects.get(name='emails').put({})"
        )
        done = manage("workers", "--burst", "--only", "emails")
        summary = re.search(r"summary emails: (\d+) done, 0 failed", done)
        assert summary and int(summary.group(1)) >= 1, done
        # The README's create_tube() and @tube() ask for the same options: no mismatch warning.
        assert "already exists with" not in done, done
        # The webhooks the README put, up to 20 at a time (the handler's concurrency=20).
        done = manage("workers", "--burst", "--only", "webhooks")
        assert re.search(r"summary webhooks: 40 done, 0 failed", done), done
        # The charges, at most 5 at a time however many slots (the handler's limit=5).
        done = manage("workers", "--burst", "--only", "charges", "--concurrency", "10")
        assert re.search(r"summary charges: 12 done, 0 failed", done), done
        limit = manage(
            "shell",
            "-c",
            "from django_taskloop.models import Tube; print(Tube.objects.get(name='charges').running_limit)",
        )
        assert limit.strip().endswith("5"), limit
    finally:
        connections.close_all()
        drop()
