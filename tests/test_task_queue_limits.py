"""A Django Tasks queue's running limit and rate (issue 44 §2): ``OPTIONS["LIMITS"]`` and
``OPTIONS["RATES"]`` of a ``TaskloopBackend``. The queue is two tubes, its plain and its keyed
tasks: they share one count, whichever tube a task is in."""

from __future__ import annotations

from typing import Any

import pytest

from django_taskloop.compat import TASKS_AVAILABLE
from django_taskloop.models import Tube
from django_taskloop.validation import Rate

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not TASKS_AVAILABLE, reason="needs a Tasks framework (Django 6, or django-tasks)"),
]


def _backend(settings: Any, **options: Any) -> None:
    settings.TASKS = {
        "default": {
            "BACKEND": "django_taskloop.backends.TaskloopBackend",
            "QUEUES": ["dq", "free"],
            "OPTIONS": options,
        }
    }


def _prepared(queue: str) -> tuple[Tube, Tube]:
    """The queue's two tubes, as a worker's start makes them (with their limit and rate)."""
    from django_taskloop.backends.handlers import task_handlers
    from django_taskloop.workers.drivers import TubeDriver

    tubes = []
    for handler in task_handlers():
        if handler.queue == queue:
            driver = TubeDriver(handler, "w")
            driver.prepare()
            tubes.append(driver.tube)
    plain, keyed = sorted(tubes, key=lambda tube: tube.name.startswith("tasks-keyed."))
    return plain, keyed


def test_a_queue_s_limit_counts_its_plain_and_keyed_tasks_together(settings):
    _backend(settings, LIMITS={"dq": 3})
    plain, keyed = _prepared("dq")
    assert (plain.running_limit, keyed.running_limit) == (3, 3)
    free_plain, _free_keyed = _prepared("free")
    assert free_plain.running_limit is None  # a queue the options do not name
    for i in range(5):
        plain.put(i)
        keyed.put(i, utube=f"k{i}")
    assert len(plain.take_many(2, consumer="w")) == 2
    taken = keyed.take_many(5, consumer="w")
    assert len(taken) == 1  # 3 for the queue: 2 plain + 1 keyed
    assert plain.take_many(5, consumer="w") == []
    keyed.ack(taken[0].id, consumer="w")
    assert len(plain.take_many(5, consumer="w")) == 1  # the keyed task's slot, taken by a plain one


def test_a_queue_s_key_limit_is_its_keyed_tube_s(settings):
    """``OPTIONS["KEY_LIMITS"]``: at most N tasks enqueued with one key run at once (the
    queue's keyed tube's key limit); its plain tasks have no key."""
    from django_taskloop.backends.backend import taskloop_backend

    _backend(settings, KEY_LIMITS={"dq": 2, "free": 1})
    assert taskloop_backend("default").queue_key_limits() == {"dq": 2}  # (1: one at a time)
    plain, keyed = _prepared("dq")
    assert (plain.key_limit, keyed.key_limit) == (None, 2)
    assert _prepared("free")[1].key_limit is None
    for i in range(3):
        keyed.put(i, utube="user:1")
    keyed.put(9, utube="user:2")
    assert sorted(task.data for task in keyed.take_many(5, consumer="w")) == [0, 1, 9]
    _backend(settings, KEY_RATES={"dq": "5/m"})  # a key rate, on the keyed tube alone
    plain, keyed = _prepared("dq")
    assert (plain.key_rate, str(keyed.key_rate), keyed.key_limit) == (None, "5/m", None)
    _backend(settings)  # the options no longer name it: one at a time again
    assert _prepared("dq")[1].key_limit is None and _prepared("dq")[1].key_rate is None


def test_finishing_a_queue_s_keyed_task_wakes_the_takers_of_both_its_tubes(settings):
    """A keyed task's end frees a slot of the queue's shared limit: whoever waits on the plain
    tube hears of it too (the pair the take counted, kept for the acknowledgement)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_taskloop import wakeup

    _backend(settings, LIMITS={"dq": 1})
    plain, keyed = _prepared("dq")
    keyed.put(1, utube="k")
    (task,) = keyed.take_many(1, consumer="w")
    assert keyed.limit_group == tuple(sorted((plain.pk, keyed.pk)))
    waiter = wakeup.Waiter("default", [plain.pk])
    try:
        with CaptureQueriesContext(connection) as sent:
            keyed.ack(task.id, consumer="w")
        assert waiter.sleep(1.0) == {plain.pk}
    finally:
        waiter.close()
    # No read of the pair by name: the ack knows it from the take.
    assert not [q["sql"] for q in sent.captured_queries if "taskloop_tube" in q["sql"] and " IN " in q["sql"]]


def test_a_queue_s_rate_counts_its_plain_and_keyed_tasks_together(settings):
    _backend(settings, RATES={"dq": "3/m"})
    plain, keyed = _prepared("dq")
    assert plain.rate == keyed.rate == Rate(3, 60)
    for i in range(5):
        plain.put(i)
        keyed.put(i, utube=f"k{i}")
    assert len(keyed.take_many(2, consumer="w")) == 2
    assert len(plain.take_many(5, consumer="w")) == 1
    assert keyed.take_many(5, consumer="w") == []
    assert plain.rate_used() == keyed.rate_used() == 3


def test_a_queue_s_limit_shows_once_for_the_queue(settings):
    from django_taskloop.management.terminal.status import status_lines, summaries

    _backend(settings, LIMITS={"dq": 4}, RATES={"dq": "10/m"})
    plain, keyed = _prepared("dq")
    plain.put(1)
    keyed.put(2, utube="a")
    plain.take_many(1, consumer="w")
    keyed.take_many(1, consumer="w")
    lines = status_lines(summaries(), {})
    (dq,) = [line for line in lines if line.startswith("dq ")]
    assert " 2/4 " in dq and "2 of 10/m" in dq, lines


def test_a_limit_set_before_on_a_queue_is_lifted_when_the_options_drop_it(settings):
    _backend(settings, LIMITS={"dq": 2})
    plain, keyed = _prepared("dq")
    _backend(settings)
    plain, keyed = _prepared("dq")
    assert (plain.running_limit, keyed.running_limit) == (None, None)
    assert Tube.objects.get(pk=plain.pk).running_limit is None


@pytest.mark.parametrize(
    "options",
    [
        {"LIMITS": {"dq": 0}},
        {"LIMITS": {"dq": "3"}},
        {"LIMITS": {"nowhere": 3}},
        {"LIMITS": ["dq"]},
        {"RATES": {"dq": "fast"}},
        {"RATES": {"dq": 5}},
        {"RATES": {"nowhere": "1/s"}},
        {"KEY_LIMITS": {"dq": 0}},
        {"KEY_LIMITS": {"nowhere": 2}},
        {"KEY_LIMITS": ["dq"]},
        {"KEY_RATES": {"dq": "fast"}},
        {"KEY_RATES": {"nowhere": "1/s"}},
    ],
    ids=repr,
)
def test_bad_limits_or_rates_in_the_options_are_a_check_error(settings, options):
    from django_taskloop.backends.backend import taskloop_backend

    _backend(settings, **options)
    errors = [e for e in taskloop_backend("default").check() if e.id == "taskloop.E006"]
    assert errors and "TASKS['default']" in errors[0].msg, errors


@pytest.mark.slow
def test_a_queue_s_limit_holds_across_worker_processes():
    """``OPTIONS["LIMITS"] = {"default": 3}``: two worker processes of four slots each never
    run more than three of the queue's Django Tasks at once, plain and keyed together (counted
    from the tasks' own start and end records), and reach three."""
    from tests import option_worker_tasks as t
    from tests.testapp.models import WorkLog
    from tests.workers_util import most_running, run_workers

    for i in range(8):
        t.napping.enqueue(str(i))
        t.napping_keyed.enqueue(str(100 + i))
    done = run_workers(
        "--burst",
        "--only",
        "default",
        "--processes",
        "2",
        "--concurrency",
        "4",
        DJANGO_SETTINGS_MODULE="tests.workers_settings",
        TASKLOOP_TASKS_OPTIONS='{"LIMITS": {"default": 3}}',
    )
    assert done.returncode == 0, done.stderr
    rows = list(WorkLog.objects.filter(kind="nap").values_list("key", "phase", "at"))
    assert sorted(key for key, phase, _ in rows if phase == "end") == sorted(
        [str(i) for i in range(8)] + [str(100 + i) for i in range(8)]
    ), done.stderr
    most = most_running(
        [at for _k, phase, at in rows if phase == "start"], [at for _k, phase, at in rows if phase == "end"]
    )
    assert most <= 3, rows
    assert most == 3, "the limit was never reached: the test shows nothing"
    assert Tube.objects.get(name="tasks.default").running_limit == 3
    assert Tube.objects.get(name="tasks-keyed.default").running_limit == 3
