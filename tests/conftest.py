"""Fixtures shared by the whole suite, and helpers to race real processes."""

from __future__ import annotations

import itertools
import multiprocessing
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from django.db import connections

pytest_plugins = ["tests.selection", "tests.clock", "tests.flushing"]


def _child(target: Callable[..., Any], args: Sequence[Any], queue: Any, barrier: Any) -> None:
    # The parent closed its connections before forking, so each child opens its own.
    try:
        barrier.wait(timeout=60)  # start together, so that the race is real
        queue.put(("ok", target(*args)))
    except BaseException:  # report anything, the parent asserts on it
        queue.put(("error", traceback.format_exc()))
    finally:
        connections.close_all()


def race(
    target: Callable[..., Any], args_per_process: Sequence[Sequence[Any]], timeout: float = 300
) -> list[Any]:
    """Run ``target(*args)`` in one real OS process per entry, all at once; return the results.

    Use from ``transaction=True`` tests only: the processes see committed data alone.
    """
    connections.close_all()
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    barrier = ctx.Barrier(len(args_per_process))
    processes = [ctx.Process(target=_child, args=(target, args, queue, barrier)) for args in args_per_process]
    for process in processes:
        process.start()
    results = []
    errors = []
    for _ in processes:
        kind, value = queue.get(timeout=timeout)
        (results if kind == "ok" else errors).append(value)
    for process in processes:
        process.join(timeout=30)
    assert not errors, "a racing process failed:\n" + "\n".join(errors)
    return results


@pytest.fixture
def boss(client: Any) -> Any:
    """The test client, logged in as a superuser (the admin tests' operator)."""
    from django.contrib.auth.models import User

    client.force_login(User.objects.create_superuser("boss", "boss@example.com", "pw"))
    return client


@pytest.fixture
def vendor() -> str:
    """The vendor of the default database (``sqlite``, ``mysql`` or ``postgresql``)."""
    return connections["default"].vendor


def pytest_configure(config: Any) -> None:
    """Refuse to run on another database than the one CI asked for (no silent skips)."""
    import os

    expected = os.environ.get("TASKLOOP_EXPECT_VENDOR")
    if expected:
        from django.conf import settings

        engine = settings.DATABASES["default"]["ENGINE"]
        actual = {"sqlite3": "sqlite", "mysql": "mysql", "postgresql": "postgresql"}.get(
            engine.rsplit(".", 1)[-1]
        )
        if actual != expected:
            raise pytest.UsageError(f"TASKLOOP_EXPECT_VENDOR={expected} but DATABASE_URL gives {engine}")


def pytest_report_header(config: Any) -> str:
    from django.conf import settings

    return f"django-taskloop: database engine {settings.DATABASES['default']['ENGINE']}"


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """Leave out, and say so: tests that start servers unless asked; outside CI, browser tests
    where no browser can run them.

    CI (``CI=true``, ``TASKLOOP_START_SERVERS=1``) runs them all: there a missing browser is a
    failure, not a skip.
    """
    import importlib.util
    import os
    from pathlib import Path

    from tests.selection import deselect

    if os.environ.get("TASKLOOP_START_SERVERS") != "1":
        # Throwaway database servers and network namespaces change the machine: only when asked.
        _leave_out_server_tests(
            config,
            items,
            "{} test(s) that start their own database servers or network namespaces "
            "not run: set TASKLOOP_START_SERVERS=1 to run them (needs root; .ci/run does)",
        )
    servers = os.environ.get("TASKLOOP_SERVER_TESTS")
    if servers in ("only", "none"):
        # CI: the tests that start their own servers run in a leg of their own (one process;
        # "only"), so that the other legs never wait on their chain ("none").
        _leave_out_server_tests(
            config,
            items,
            f"{{}} test(s) {'that start no server' if servers == 'only' else 'that start servers'}: "
            f"another leg runs them (TASKLOOP_SERVER_TESTS={servers})",
            others=servers == "only",
        )
    if os.environ.get("TASKLOOP_SERVER_TESTS_ON_OWN_LEG") == "1":
        from django.conf import settings

        if "sqlite" in settings.DATABASES["default"]["ENGINE"]:
            # CI: a SQLite leg's server tests would start the same throwaway servers that the
            # MariaDB and PostgreSQL legs start, and repeat their runs; they run there.
            _leave_out_server_tests(
                config,
                items,
                "{} test(s) that start their own database servers left to the MariaDB and "
                "PostgreSQL legs, which run them (TASKLOOP_SERVER_TESTS_ON_OWN_LEG=1)",
            )
    if os.environ.get("CI"):
        return
    missing = []
    if importlib.util.find_spec("playwright") is None:
        missing.append("the playwright package (pip install -e '.[browser]')")
    if not Path(os.environ.get("TASKLOOP_CHROMIUM", "/usr/bin/chromium")).exists():
        missing.append("chromium (apt-get install chromium)")
    if not missing:
        return
    browser = [item for item in items if item.get_closest_marker("browser")]
    deselect(config, items, browser, "{} browser test(s) not run: missing " + " and ".join(missing))


def _leave_out_server_tests(config: Any, items: list[Any], said: str, others: bool = False) -> None:
    """Deselect the tests that start servers (the fixtures in tests/reliability/conftest.py), or
    with ``others`` all the rest, and say so in the summary: ``said`` with their count."""
    from tests.reliability.conftest import SERVER_FIXTURES
    from tests.selection import deselect

    leave = [
        item for item in items if bool(SERVER_FIXTURES & set(getattr(item, "fixturenames", ()))) != others
    ]
    deselect(config, items, leave, said)


@pytest.fixture(autouse=True)
def _forget_process_caches() -> Any:
    """What a process remembers of rows that a test's end removes: workers trust a pause they
    read for half a second, and a consumer beats at most every 5 s (a test after one whose
    consumer of the same name beat skipped its beat, and its row was missing: a
    test_kept_statements run once saw the row registered inside the batch it counted)."""
    from django_taskloop import shards
    from django_taskloop.models import operating
    from django_taskloop.models.tubes import records

    operating._pause_cache.clear()
    records._beats.clear()
    shards._down.clear()  # shards found down, left out of the puts' turn for a few seconds
    # Whose turn the next put is: from the first shard, whatever this process ran before (under
    # -n a process runs another share of the suite, in another order).
    shards._turn = itertools.count()
    yield
    operating._pause_cache.clear()
    records._beats.clear()
    shards._down.clear()


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None, django_db_blocker: Any) -> Any:
    """pytest-django's test databases; before it drops them, on PostgreSQL, end every other
    session still on them. A session a subprocess left is closed by its server a moment
    after the client went, and DROP DATABASE refused the test database once for it ("being
    accessed by other users", CI run 5, after every test had passed)."""
    yield
    import time

    with django_db_blocker.unblock():
        for alias in connections:
            connection = connections[alias]
            if connection.vendor != "postgresql":
                continue
            others = "FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            with connection.cursor() as cursor:
                cursor.execute(f"SELECT pg_terminate_backend(pid) {others}")
                for _ in range(50):  # terminated sessions end within moments
                    cursor.execute(f"SELECT count(*) {others}")
                    if not cursor.fetchone()[0]:
                        break
                    time.sleep(0.1)
