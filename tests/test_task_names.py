"""Django Tasks queues answer to their Django names: ``--only default`` runs the queue
``default`` — its plain and its keyed tasks — as a Django Tasks user would expect (issue 28,
item 2). The internal tube names keep working."""

from __future__ import annotations

import pytest

from django_taskloop.models import TaskRecord
from django_taskloop.workers import get_handlers

from . import options_tasks as t
from .workers_util import run_workers

FAST = '{"POLL_MIN": 0.05, "HEARTBEAT_INTERVAL": 0.2}'


def test_a_django_tasks_queue_name_selects_its_plain_and_keyed_handlers():
    names = [handler.name for handler in get_handlers(["default"])]
    assert names == ["tasks.default", "tasks-keyed.default"]
    # The internal names still select one handler each.
    assert [handler.name for handler in get_handlers(["tasks-keyed.default"])] == ["tasks-keyed.default"]


def test_an_unknown_name_lists_the_django_queue_names_among_the_known():
    with pytest.raises(ValueError) as raised:
        get_handlers(["no-such-queue"])
    assert "no-such-queue" in str(raised.value)
    assert "'default'" in str(raised.value)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_only_default_runs_the_queue_s_plain_and_keyed_tasks_in_a_worker():
    plain = t.refresh.enqueue("weekly")
    keyed = t.sync.enqueue(7)

    run = run_workers(
        "--burst",
        "--only",
        "default",
        DJANGO_SETTINGS_MODULE="tests.workers_settings",
        TASKLOOP_OVERRIDES=FAST,
    )

    assert run.returncode == 0, run.stderr
    statuses = dict(TaskRecord.objects.filter(pk__in=[plain.id, keyed.id]).values_list("pk", "status"))
    assert statuses == {plain.id: "SUCCESSFUL", keyed.id: "SUCCESSFUL"}
