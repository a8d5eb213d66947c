"""Async Django Tasks and the backend from async code (issue 28, item 6), with real worker
processes (``manage.py workers`` subprocesses) and real ASGI requests (Django's AsyncClient
runs the project's ASGI handler: the views run on an event loop, the ORM is guarded there).

1. an ``async def`` Django Task (``takes_context``, the async ORM inside) runs under a running,
   not burst, ``manage.py workers``, as Django's contract says;
2. ``aenqueue()`` and ``aget_result()`` from async views under ASGI: READY before a worker,
   SUCCESSFUL after; ``Tube.aput`` from an async view too;
3. start-up: a worker started with a task already queued starts it before it ever waits,
   sleeps or polls (read off the worker's own order of events, not a clock).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.http import HttpRequest, JsonResponse
from django.test import AsyncClient
from django.urls import path

from django_taskloop.backends import tube_name
from django_taskloop.models import Task as TubeTask
from django_taskloop.models import Tube
from tests.testapp.models import WorkLog

from .workers_util import ROOT, add, add_async, child_env, run_workers, start_workers, stop, task, wait_until

try:
    from django.tasks import default_task_backend
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import default_task_backend

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


# Tasks and views (module level: the worker imports the tasks by path, the client the views). --


@task(takes_context=True)
async def log_async(context: Any, key: str) -> dict[str, Any]:
    """An ``async def`` task that writes with the async ORM and reads its context."""
    row = await WorkLog.objects.acreate(kind="async-task", key=key, pid=os.getpid(), at=time.time())
    return {"attempt": context.attempt, "id": context.task_result.id, "row": row.pk}


async def enqueue_view(request: HttpRequest, name: str) -> JsonResponse:
    chosen = {"add": add, "add_async": add_async}[name]
    result = await chosen.aenqueue(2, 3)
    return JsonResponse({"id": result.id, "status": result.status.name})


async def result_view(request: HttpRequest, result_id: str) -> JsonResponse:
    result = await default_task_backend.aget_result(result_id)
    value = result.return_value if result.status.name == "SUCCESSFUL" else None
    return JsonResponse({"status": result.status.name, "return_value": value})


async def put_view(request: HttpRequest) -> JsonResponse:
    tube = await Tube.objects.aget(name="a-asgi")
    put = await tube.aput({"from": "asgi"}, pri=4)
    many = await tube.aput_many([1, 2])
    return JsonResponse({"ids": [put.pk, *(t.pk for t in many)]})


urlpatterns = [
    path("enqueue/<str:name>/", enqueue_view),
    path("result/<str:result_id>/", result_view),
    path("put/", put_view),
]


def get(url: str) -> Any:
    """GET ``url`` through the ASGI handler; return the JSON it answered."""
    response = async_to_sync(AsyncClient().get)(url)
    assert response.status_code == 200, response.content
    return json.loads(response.content)


# 1. an async def Django Task under a running worker -------------------------------------------


def test_an_async_task_runs_under_a_running_worker_with_its_context_and_the_async_orm():
    results = [log_async.enqueue(f"k{n}") for n in range(3)]
    worker = start_workers("--only", tube_name(log_async.queue_name))
    try:
        for result in results:
            wait_until(
                lambda result=result: (result.refresh(), result.status.name)[1] in ("SUCCESSFUL", "FAILED")
            )
    finally:
        output = stop(worker)
    assert "never awaited" not in output and "SynchronousOnlyOperation" not in output, output
    rows = {row.key: row for row in WorkLog.objects.filter(kind="async-task")}
    assert sorted(rows) == ["k0", "k1", "k2"]
    for n, result in enumerate(results):
        assert result.status.name == "SUCCESSFUL", result.errors
        assert result.return_value == {"attempt": 1, "id": result.id, "row": rows[f"k{n}"].pk}
        assert rows[f"k{n}"].pid != os.getpid()  # the worker process wrote it


# 2. aenqueue / aget_result / aput from async views under ASGI ----------------------------------


@pytest.mark.urls(__name__)
@pytest.mark.parametrize("name", ["add", "add_async"])
def test_aenqueue_and_aget_result_from_async_views_under_asgi(name):
    enqueued = get(f"/enqueue/{name}/")
    assert enqueued["status"] == "READY"
    assert get(f"/result/{enqueued['id']}/") == {"status": "READY", "return_value": None}
    run = run_workers("--burst", "--only", tube_name("default"))
    assert run.returncode == 0, run.stderr
    assert get(f"/result/{enqueued['id']}/") == {"status": "SUCCESSFUL", "return_value": 5}


@pytest.mark.urls(__name__)
def test_an_unknown_result_id_raises_the_frameworks_error_in_an_async_view():
    from django_taskloop.compat import TaskResultDoesNotExist

    with pytest.raises(TaskResultDoesNotExist):
        get("/result/12345678/")


@pytest.mark.urls(__name__)
def test_aput_and_aput_many_from_an_async_view_under_asgi():
    Tube.objects.create_tube("a-asgi", "fifottl")
    ids = get("/put/")["ids"]
    rows = {t.pk: (t.data, t.pri) for t in TubeTask.objects.filter(pk__in=ids)}
    assert [rows[i] for i in ids] == [({"from": "asgi"}, 4), (1, 0), (2, 0)]


# 3. start-up: the first claim comes before any wait ---------------------------------------------

#: Runs ``manage.py workers`` (call_command, in a process of its own) with its main thread's
#: waits noted in order: every sleep, Event.wait and idle step of the worker, and each Django
#: Task's start. Nothing is changed but the noting.
WORKER_WITH_EVENTS = """
import os, sys, threading, time
import django
django.setup()
from django.core.management import call_command
from django_taskloop.compat import task_started
from django_taskloop.workers import runner

events = open(os.environ["EVENTS"], "a", buffering=1)

def note(what):
    if threading.current_thread() is threading.main_thread():
        events.write(what + "\\n")

sleep = time.sleep
time.sleep = lambda seconds: (note("sleep"), sleep(seconds))[1]
event_wait = threading.Event.wait
def wait(self, timeout=None):
    # Not Thread.start() waiting for its thread to run: a wait of the worker's own.
    if sys._getframe(1).f_globals.get("__name__") != "threading":
        note("wait")
    return event_wait(self, timeout)
threading.Event.wait = wait
for name in ("_block", "_poll", "_wait_one", "_wait_tubes", "_database_error"):
    def noted(self, *args, __original=getattr(runner.Worker, name), __name=name, **kwargs):
        note("idle " + __name)
        return __original(self, *args, **kwargs)
    setattr(runner.Worker, name, noted)
task_started.connect(lambda sender, task_result, **kw: note("started " + str(task_result.id)), weak=False)
call_command("workers", *sys.argv[1:])
"""


@pytest.mark.parametrize("only", ["queue", "every handler"])
def test_a_worker_started_with_a_task_queued_starts_it_before_any_wait(tmp_path, only):
    queued = add.enqueue(1, 2)
    events = tmp_path / "events"
    events.touch()
    args = ["--only", tube_name("default")] if only == "queue" else ["--no-schedule"]
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER_WITH_EVENTS, *args],
        env=child_env(EVENTS=str(events)),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        # Until it has gone idle after the task: the noting is seen to work.
        wait_until(lambda: any(line.startswith("idle") for line in lines(events)))
    finally:
        output = stop(worker)
    seen = lines(events)
    assert f"started {queued.id}" in seen, (seen, output)
    assert seen[0] == f"started {queued.id}", (
        f"the worker waited before its first claim: {seen[:5]}\n{output}"
    )
    queued.refresh()
    assert queued.status.name == "SUCCESSFUL", queued.errors


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines()
