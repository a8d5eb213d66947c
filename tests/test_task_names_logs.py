"""A worker's log and the operator's Failures speak of a Django Task by its result id and its
task path, never by the tube task that carried one attempt (issue 28, item 3); a Django Tasks
queue is named by its Django name in the start and summary lines (item 2). Real ``manage.py
workers`` processes."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest

from django_taskloop.models import Failure, TaskRecord

from . import options_tasks as t
from .workers_util import add, run_workers

FAST = '{"POLL_MIN": 0.05, "HEARTBEAT_INTERVAL": 0.2}'

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def lines_with(text: str, needle: str) -> list[str]:
    return [line for line in text.splitlines() if needle in line]


def burst_default(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``manage.py workers --burst --only default *args`` with the fast test settings."""
    return run_workers(
        "--burst",
        "--only",
        "default",
        *args,
        DJANGO_SETTINGS_MODULE="tests.workers_settings",
        TASKLOOP_OVERRIDES=FAST,
    )


def test_a_failing_django_task_logs_its_result_id_path_and_attempts_and_is_one_failures_item():
    result = t.always_fails.enqueue("boom")
    path = "tests.options_tasks.always_fails"

    run = burst_default()

    assert run.returncode == 0, run.stderr
    failed = lines_with(run.stderr, "WARNING django_taskloop.workers")
    # Three attempts, each named by the result and the task, with what became of it.
    assert len(failed) == 3, run.stderr
    for attempt, line in enumerate(failed, 1):
        assert (
            f'Django task {result.id} ({path}) of queue "default" failed (attempt {attempt} of 3)' in line
        ), line
        assert ": RuntimeError: boom #" in line, line
    assert "retrying in 0 s" in failed[0] and "retrying in" in failed[1]
    assert "retrying" not in failed[2]
    # No internal tube task id, no tube name in what the worker says of it.
    assert not re.search(r"task \d+ of tube", run.stderr), run.stderr
    assert "tasks.default" not in run.stderr and "tasks-keyed.default" not in run.stderr, run.stderr
    # The operator's Failures: one item (the result), three attempts.
    rows = list(Failure.objects.order_by("attempt").values_list("kind", "item", "attempt"))
    assert rows == [("task", result.id, 1), ("task", result.id, 2), ("task", result.id, 3)]
    record = TaskRecord.objects.get(pk=result.id)
    assert [f.attempt for f in Failure.objects.for_item(record)] == [3, 2, 1]


def test_the_start_and_summary_lines_name_the_django_tasks_queue_once():
    plain = add.enqueue(1, 2)
    keyed = t.sync.enqueue(7)

    run = burst_default()

    assert run.returncode == 0, run.stderr
    assert TaskRecord.objects.filter(pk__in=[plain.id, keyed.id], status="SUCCESSFUL").count() == 2
    (start,) = lines_with(run.stderr, "starting 1 worker process")
    assert start.endswith("for: Django Tasks queue default"), start
    # One summary line for the queue, its plain and keyed tasks together.
    (summary,) = lines_with(run.stderr, "summary ")
    assert "summary default (Django Tasks): 2 done, 0 failed, 0 given back" in summary, run.stderr
    assert "tasks.default" not in run.stderr and "tasks-keyed" not in run.stderr, run.stderr


def test_an_idle_keyed_tube_adds_no_summary_line():
    add.enqueue(2, 3)

    run = burst_default("--only", "slow")

    assert run.returncode == 0, run.stderr
    summaries = lines_with(run.stderr, "summary ")
    assert [line.split("summary ", 1)[1].split(":", 1)[0] for line in summaries] == [
        "default (Django Tasks)",
        "slow (Django Tasks)",
    ], run.stderr
    assert "summary default (Django Tasks): 1 done" in summaries[0]


@pytest.mark.parametrize("verbosity", ["2", "3"])
def test_verbose_workers_name_each_django_task_as_it_starts_and_ends(verbosity):
    result = add.enqueue(20, 22)
    path = "tests.workers_util.add"

    run = burst_default("-v", verbosity)

    assert run.returncode == 0, run.stderr
    # The worker names the result id twice: as it runs, and as it has finished. (Django 6 with
    # DEBUG also prints the framework's own "Task id=… state=RUNNING/SUCCESSFUL" lines.)
    named = [line for line in lines_with(run.stderr, result.id) if "django_taskloop.workers" in line]
    assert len(named) == 2, run.stderr
    assert named[0].endswith(f'Django task {result.id} ({path}) of queue "default": started'), named
    assert named[1].endswith(f'Django task {result.id} ({path}) of queue "default": done'), named


def test_a_task_path_that_no_longer_imports_is_named_as_stored(tmp_path, monkeypatch):
    # A module the test process imports and the worker process cannot: the code is gone.
    (tmp_path / "taskloop_gone_tasks.py").write_text(
        textwrap.dedent(
            """
            try:
                from django.tasks import task
            except ImportError:
                from django_tasks import task

            @task()
            def vanished():
                return 1
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    from taskloop_gone_tasks import vanished  # type: ignore[import-not-found]

    result = vanished.enqueue()
    sys.modules.pop("taskloop_gone_tasks", None)

    run = burst_default()

    assert run.returncode == 0, run.stderr
    (line,) = lines_with(run.stderr, "WARNING django_taskloop.workers")
    assert f'Django task {result.id} (taskloop_gone_tasks.vanished) of queue "default" failed' in line, line
    assert "ModuleNotFoundError" in line or "ImportError" in line, line
    assert "_missing" not in line
    assert list(Failure.objects.values_list("item", flat=True)) == [result.id]
