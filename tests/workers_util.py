"""Helpers for the worker tests: run ``manage.py workers`` as a real subprocess on the test
database, and the Django Tasks that the backend tests enqueue (module level, so that a worker
process can import them)."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from django.db import connections

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task

ROOT = Path(__file__).resolve().parent.parent


def child_env(**extra: str) -> dict[str, str]:
    """Return the environment of a subprocess that uses the current test database."""
    settings = connections["default"].settings_dict
    vendor = connections["default"].vendor
    name = settings["NAME"]
    if vendor == "sqlite":
        url = f"sqlite:///{name}"
    else:
        scheme = {"mysql": "mysql", "postgresql": "postgres"}[vendor]
        user = settings.get("USER") or ""
        password = f":{settings['PASSWORD']}" if settings.get("PASSWORD") else ""
        at = "@" if user else ""
        host = settings.get("HOST") or ""
        port = f":{settings['PORT']}" if settings.get("PORT") else ""
        url = f"{scheme}://{user}{password}{at}{host}{port}/{name}"
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "testproject")]),
        "TASKLOOP_LOG": "INFO",
    }
    env.update(extra)
    return env


def workers_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "django", "workers", *args]


def run_workers(*args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``manage.py workers *args`` to completion (use ``--burst``) and return the result."""
    connections.close_all()
    return subprocess.run(
        workers_command(*args),
        env=child_env(**env),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def manage(
    *args: str, env: dict[str, str], cwd: Any = ROOT, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m django ARGS`` (``manage.py``) with ``env`` in ``cwd``; return what it did."""
    connections.close_all()
    return subprocess.run(
        [sys.executable, "-m", "django", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def taskloop(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``manage.py taskloop ARGS`` on the test database; return what it did."""
    return manage("taskloop", *args, env=child_env())


def taskloop_here(*args: str) -> subprocess.CompletedProcess[str]:
    """``manage.py taskloop ARGS`` in this process, as the command line runs it (its exit status,
    what it wrote to stdout and to stderr), without starting a process: a start costs 0.8 s of
    CPU, and the terminal's tests made 54 of them. For what only a process shows (Django's
    ``--settings``, ``--pythonpath``, ``--traceback``; signals; another database), :func:`taskloop`.
    The command closes its connections at the end, as at the command line: the test's must be
    a transactional one."""
    from django.core.management import load_command_class

    out, err = io.StringIO(), io.StringIO()
    status = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        command = load_command_class("django_taskloop", "taskloop")
        try:
            # The system checks are left out: the command line runs them, but here they would
            # reach every database (Django 6 checks each one), which a test may not touch. They
            # have tests of their own (test_checks.py).
            command.run_from_argv(["manage.py", "taskloop", "--skip-checks", *args])
        except SystemExit as exit:
            status = exit.code if isinstance(exit.code, int) else int(exit.code is not None)
    return subprocess.CompletedProcess(
        ["manage.py", "taskloop", *args], status, out.getvalue(), err.getvalue()
    )


def stop_once(worker: subprocess.Popen[str], timeout: float = 30) -> str:
    """Send one SIGTERM (the graceful stop: :func:`stop` would send another) and return the
    worker's output once it has exited; kill it if it has not within ``timeout``."""
    worker.send_signal(signal.SIGTERM)
    try:
        return worker.communicate(timeout=timeout)[0]
    finally:
        if worker.poll() is None:
            worker.kill()


def stop_hard(worker: subprocess.Popen[str], timeout: float = 30) -> str:
    """Send SIGTERM, then SIGTERM again (the hard stop), and return the worker's output.

    The second signal is sent again every 5 s until the worker exits: two signals that reach a
    busy process before its handler runs are one (POSIX does not queue them), and a loaded
    machine would then see only the graceful stop, which waits out GRACE_PERIOD. (Not sooner: a
    signal that arrives after the worker has given everything back, while it exits, finds the
    default handler again and ends it with -15 — seen at load 10 with a resend every 2 s; an
    open defect of the worker's, see the issue-40 note.)"""
    worker.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    deadline = time.monotonic() + timeout
    while True:
        worker.send_signal(signal.SIGTERM)
        try:
            return worker.communicate(timeout=5)[0]
        except subprocess.TimeoutExpired:
            if time.monotonic() > deadline:
                raise


def start_workers(*args: str, preexec_fn: Any = None, **env: str) -> subprocess.Popen[str]:
    """Start ``manage.py workers *args`` in the background; stop it with :func:`stop`."""
    connections.close_all()
    return subprocess.Popen(
        workers_command(*args),
        env=child_env(**env),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=preexec_fn,
    )


def ignore_and_block_stop_signals() -> None:
    """Start a child as a shell's background job is (SIGINT ignored), with the stop signals
    blocked as well (a parent that had them blocked): it must stop on one signal all the same."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})


def stop(process: subprocess.Popen[str], sig: int = signal.SIGTERM, timeout: float = 60) -> str:
    """Send ``sig`` and return everything the process wrote once it has exited."""
    if process.poll() is None:
        process.send_signal(sig)
    output, _ = process.communicate(timeout=timeout)
    return output


def children_of(pid: int) -> list[int]:
    """Return the pids of process ``pid``'s children (none once it is gone)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except FileNotFoundError:
        return []


def alive(pid: int) -> bool:
    """Say whether process ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return "zombie" not in f.read()
    except FileNotFoundError:
        return False


def most_running(starts: Any, ends: Any) -> int:
    """The most items running at one moment, from their start and end times (an end before a
    start at the same instant)."""
    events = sorted([(at, 1) for at in starts] + [(at, -1) for at in ends])
    running = most = 0
    for _at, step in events:
        running += step
        most = max(most, running)
    return most


def wait_until(predicate: Any, timeout: float = 30, every: float = 0.05) -> Any:
    """Poll ``predicate()`` until it is truthy; return its value (fail after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {predicate}")
        time.sleep(every)


# Django Tasks run by the worker in the backend tests. ----------------------------------------


@task()
def add(a: int, b: int) -> int:
    return a + b


@task(queue_name="slow", priority=10)
def explode(message: str) -> None:
    raise RuntimeError(message)


@task(takes_context=True)
def attempt_of(context: Any) -> dict[str, Any]:
    return {"attempt": context.attempt, "id": context.task_result.id}


@task()
def exit_now(code: int) -> None:
    raise SystemExit(code)


@task()
def interrupt() -> None:
    raise KeyboardInterrupt


@task()
def nap(seconds: float) -> str:
    time.sleep(seconds)
    return "rested"


def not_a_task() -> None:
    """A plain function: a stored task path naming it must never call it."""
    from tests.testapp.models import WorkLog

    WorkLog.objects.create(kind="not-a-task", key="called", pid=os.getpid(), at=time.time())


@task()
async def add_async(a: int, b: int) -> int:
    """An ``async def`` Django Task: the worker awaits it."""
    import asyncio

    await asyncio.sleep(0.01)
    return a + b
