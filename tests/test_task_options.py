"""Options of Django Tasks (issue 16): max_attempts and backoff, ttl, ttr, key, unique,
enqueue_on_commit — spelled ``@task(option=…)`` (the backend's ``task_class``) on Django 6.1
and on the django-tasks backport alike."""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import time

import pytest
from django.db import transaction

from django_taskloop.backends import TaskloopBackend, keyed_tube_name, result_id_of, tube_name
from django_taskloop.engine import db_now
from django_taskloop.exceptions import TaskExpired
from django_taskloop.models import Failure, Task, TaskRecord, Tube
from django_taskloop.task_options import TaskloopTask
from django_taskloop.workers import FailedForGood
from tests.testapp.models import WorkLog

from . import options_tasks as t
from .options_tasks import task  # Django's @task, or on Django 6.0 django-taskloop's
from .workers_util import add, run_workers, start_workers, stop, wait_until

try:
    from django.tasks import TaskResultStatus, task_backends
except ImportError:  # Django 5.2: the backport
    from django_tasks import TaskResultStatus, task_backends

FAST = '{"RETRY_BACKOFF": 0.05, "HEARTBEAT_INTERVAL": 0.5, "GRACE_PERIOD": 5}'


def drain_default() -> subprocess.CompletedProcess[str]:
    """Run a burst worker over the queue ``default`` with the fast settings; return the run."""
    return run_workers(
        "--burst",
        "--only",
        "tasks.default",
        DJANGO_SETTINGS_MODULE="tests.workers_settings",
        TASKLOOP_OVERRIDES=FAST,
    )


def backend() -> TaskloopBackend:
    return task_backends["default"]


def take(queue: str = "default", keyed: bool = False):
    """Take the next tube task of ``queue`` as a worker would (None if there is none)."""
    name = keyed_tube_name(queue) if keyed else tube_name(queue)
    return Tube.objects.get(name=name).take(0, consumer="test")


def run_one(queue: str = "default", keyed: bool = False):
    """Take one tube task and execute it as the worker does; return what execute raised."""
    queued = take(queue, keyed)
    assert queued is not None
    try:
        backend().execute(result_id_of(queued), "test-worker", queued=queued)
    except FailedForGood as error:
        Tube.objects.get(pk=queued.tube_id).ack(queued.id, consumer="test")
        return error
    Tube.objects.get(pk=queued.tube_id).ack(queued.id, consumer="test")
    return None


def func() -> None:
    """A module-level function to decorate in the validation tests."""


# Spelling and validation --------------------------------------------------------------------


def test_the_backend_s_task_class_carries_the_options():
    assert backend().task_class is TaskloopTask
    assert isinstance(t.always_fails, TaskloopTask)
    assert t.always_fails.max_attempts == 3 and t.always_fails.backoff == 0
    assert add.max_attempts == 1 and add.ttl is None and not add.unique  # defaults: no option
    once = t.always_fails.using(max_attempts=5, ttl=30, priority=10)
    assert (once.max_attempts, once.ttl, once.priority, once.backoff) == (5, 30, 10, 0)


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"max_attempts": 0}, ValueError, "max_attempts must be >= 1"),
        ({"max_attempts": True}, TypeError, "max_attempts must be an int"),
        ({"max_attempts": 2.0}, TypeError, "max_attempts must be an int"),
        ({"backoff": -1}, ValueError, "backoff must be >= 0"),
        ({"backoff": "1s"}, TypeError, "backoff must be an int or float"),
        ({"ttl": -5}, ValueError, "ttl must be > 0"),
        ({"ttl": 0}, ValueError, "ttl must be > 0"),
        ({"ttr": float("nan")}, ValueError, "ttr must be finite"),
        ({"key": ""}, ValueError, "key must not be empty"),
        ({"key": 5}, TypeError, "key must be a str or a callable"),
        ({"unique": "key"}, ValueError, "unique='key' needs a key"),
        ({"unique": "yes"}, ValueError, "unique must be False, True, 'args' or 'key'"),
        ({"unique": True, "enqueue_on_commit": True}, ValueError, "cannot be combined"),
        ({"enqueue_on_commit": 1}, TypeError, "enqueue_on_commit must be a bool"),
        ({"retries": 3}, TypeError, "retries"),
    ],
)
def test_a_bad_option_is_refused_where_the_task_is_defined(options, error, match):
    with pytest.raises(error, match=match):
        task(**options)(func)
    with pytest.raises(error, match=match):
        add.using(**options)


@pytest.mark.django_db
def test_a_bad_option_enqueues_nothing(settings):
    settings.TASKLOOP = {"HEARTBEAT_INTERVAL": 10}
    with pytest.raises(ValueError, match=r"ttr must be at least twice TASKLOOP\['HEARTBEAT_INTERVAL'\]"):
        add.using(ttr=19).enqueue(1, 2)
    with pytest.raises(ValueError, match="must return a non-empty str"):
        add.using(key=lambda a, b: None).enqueue(1, 2)
    assert not TaskRecord.objects.exists()
    assert not Tube.objects.filter(tasks__isnull=False).exists()


# max_attempts and backoff ----------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_failed_attempt_with_attempts_left_is_ready_again_after_its_backoff():
    result = t.waits_long.enqueue("kaboom")
    error = run_one()
    assert "attempt 1 of 2" in str(error) and "retrying in 600 s" in str(error)
    result.refresh()
    assert result.status == TaskResultStatus.READY
    assert len(result.errors) == 1 and "kaboom" in result.errors[0].traceback
    assert result.errors[0].exception_class is RuntimeError
    (queued,) = Tube.objects.get(name=tube_name("default")).tasks.all()
    assert queued.state == "~" and result_id_of(queued) == result.id
    waits = (queued.event_at - db_now()).total_seconds()
    assert 590 < waits <= 600  # ten_minutes(1): the callable backoff
    # Nothing to take meanwhile.
    assert take() is None
    # Due now: the second and last attempt fails for good.
    Tube.objects.get(name=tube_name("default")).kick(0)
    type(queued).objects.filter(pk=queued.pk).update(event_at=db_now())
    error = run_one()
    assert "attempt 2 of 2" in str(error)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert len(result.errors) == 2 and result.attempts == 2
    assert Tube.objects.statistics()[tube_name("default")]["tasks"]["total"] == 0


@pytest.mark.django_db(transaction=True)
def test_the_default_backoff_is_the_worker_s(settings):
    settings.TASKLOOP = {"RETRY_BACKOFF": 40, "RETRY_BACKOFF_MAX": 70}
    t.default_backoff.enqueue()
    assert "retrying in 40 s" in str(run_one())
    Tube.objects.get(name=tube_name("default")).tasks.all().update(event_at=db_now())
    assert "retrying in 70 s" in str(run_one())  # 80, capped


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_retries_run_in_worker_processes_and_every_attempt_is_kept():
    failing = t.always_fails.enqueue("boom")
    flaky = t.fails_twice.enqueue()
    plain = add.enqueue(1, 1)

    run = drain_default()

    assert run.returncode == 0, run.stderr
    failing.refresh()
    assert failing.status == TaskResultStatus.FAILED, run.stderr
    assert failing.attempts == 3 and len(failing.errors) == 3
    assert [e.exception_class for e in failing.errors] == [RuntimeError] * 3
    assert len({e.traceback for e in failing.errors}) == 3  # each attempt's own
    assert WorkLog.objects.filter(kind="always").count() == 3
    flaky.refresh()
    assert flaky.status == TaskResultStatus.SUCCESSFUL and flaky.return_value == 3
    assert [e.exception_class for e in flaky.errors] == [ValueError, ValueError]
    assert add.get_result(plain.id).return_value == 2
    # The operator's Failures: one per failed attempt, numbered by the task's attempt.
    attempts = sorted(
        Failure.objects.filter(kind="task", queue="tasks.default").values_list("attempt", "error")
    )
    assert attempts == [
        (1, "builtins.RuntimeError"),
        (1, "builtins.ValueError"),
        (2, "builtins.RuntimeError"),
        (2, "builtins.ValueError"),
        (3, "builtins.RuntimeError"),
    ]
    assert "summary default (Django Tasks): 2 done, 5 failed" in run.stderr
    assert Tube.objects.statistics()["tasks.default"]["tasks"]["total"] == 0


# ttl ----------------------------------------------------------------------------------------


def age(result, seconds: float, run_after_ago: float | None = None) -> None:
    """Make ``result`` look enqueued ``seconds`` ago (and due ``run_after_ago`` seconds ago):
    its record if a worker wrote one, else the tube task that carries its call."""
    now = db_now()
    enqueued = now - dt.timedelta(seconds=seconds)
    run_after = None if run_after_ago is None else now - dt.timedelta(seconds=run_after_ago)
    TaskRecord.objects.filter(pk=result.id).update(enqueued_at=enqueued, run_after=run_after)
    queued = Task.objects.filter(pk=int(result.id.partition("-")[0])).first() if "-" in result.id else None
    if queued is not None:
        queued.data.pop("run_after", None)
        if run_after is not None:
            queued.data["run_after"] = run_after.isoformat()
        Task.objects.filter(pk=queued.pk).update(created=enqueued, data=queued.data)


@pytest.mark.django_db(transaction=True)
def test_a_task_not_started_within_its_ttl_ends_failed_and_never_runs():
    late = t.must_start_soon.enqueue("late")
    age(late, 61)
    error = run_one()
    assert "expired" in str(error)
    late.refresh()
    assert late.status == TaskResultStatus.FAILED and late.finished_at is not None
    (failure,) = late.errors
    assert failure.exception_class is TaskExpired
    assert "not started within its ttl of 60 s" in failure.traceback
    assert not WorkLog.objects.filter(kind="ttl").exists()  # never called
    assert Tube.objects.statistics()[tube_name("default")]["tasks"]["total"] == 0


@pytest.mark.django_db(transaction=True)
def test_a_task_started_within_its_ttl_runs_and_run_after_extends_the_ttl():
    in_time = t.must_start_soon.enqueue("in time")
    age(in_time, 59)
    assert run_one() is None
    in_time.refresh()
    assert in_time.status == TaskResultStatus.SUCCESSFUL and in_time.return_value == "in time"
    # Enqueued 100 s ago but due only 30 s ago: the ttl counts from run_after (as a delay
    # extends a tube task's ttl).
    deferred = t.must_start_soon.enqueue("deferred")
    age(deferred, 100, run_after_ago=30)
    assert run_one() is None
    assert t.must_start_soon.get_result(deferred.id).status == TaskResultStatus.SUCCESSFUL
    # using(ttl=…) for one call.
    short = t.must_start_soon.using(ttl=5).enqueue("short")
    age(short, 6)
    assert "expired" in str(run_one())
    assert WorkLog.objects.filter(kind="ttl").count() == 2


@pytest.mark.django_db(transaction=True)
def test_expired_task_is_not_ready_in_get_result():
    """A task past its ttl reads FAILED (TaskExpired) at once, not READY until a worker
    reaches it; the worker then records that same end."""
    late = t.must_start_soon.enqueue("late")
    age(late, 61)
    expired = backend().get_result(late.id)
    assert expired.status == TaskResultStatus.FAILED
    (failure,) = expired.errors
    assert failure.exception_class is TaskExpired
    assert "not started within its ttl of 60 s" in failure.traceback
    assert expired.finished_at is not None and expired.started_at is None
    # using(ttl=…) for one call counts too; a task still within its ttl is READY.
    short = t.must_start_soon.using(ttl=5).enqueue("short")
    age(short, 6)
    assert backend().get_result(short.id).status == TaskResultStatus.FAILED
    in_time = t.must_start_soon.enqueue("in time")
    age(in_time, 59)
    assert backend().get_result(in_time.id).status == TaskResultStatus.READY
    # The worker reaches it: the same status, error and end time as read before.
    assert "expired" in str(run_one())
    recorded = backend().get_result(late.id)
    assert recorded.status == TaskResultStatus.FAILED
    assert recorded.finished_at == expired.finished_at
    assert [e.traceback for e in recorded.errors] == [e.traceback for e in expired.errors]
    # A retry asked for by an operator runs with no ttl: READY, not expired again.
    assert backend().retry(late.id).status == TaskResultStatus.READY
    assert backend().get_result(late.id).status == TaskResultStatus.READY


# ttr ----------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_task_whose_worker_stops_beating_comes_back_after_its_ttr(settings):
    settings.TASKLOOP = {"HEARTBEAT_INTERVAL": 0.5}
    hung = t.hangs_first.using(ttr=2).enqueue("hung")
    long = t.naps_past_ttr.using(ttr=2).enqueue(3)  # longer than its ttr: the heartbeat keeps its lease
    env = {"DJANGO_SETTINGS_MODULE": "tests.workers_settings", "TASKLOOP_OVERRIDES": FAST}
    worker = start_workers("--only", "tasks.default", **env)
    output = ""
    try:
        first = wait_until(lambda: WorkLog.objects.filter(kind="ttr", phase="start").first(), timeout=60)
        os.kill(first.pid, signal.SIGKILL)  # the worker process running it dies
        killed = time.time()
        output += stop(worker, signal.SIGKILL)
        # Meanwhile the task still reads RUNNING (nothing ran it to an end).
        assert t.hangs_first.get_result(hung.id).status == TaskResultStatus.RUNNING
        worker = start_workers("--only", "tasks.default", **env)
        wait_until(lambda: t.hangs_first.get_result(hung.id).is_finished, timeout=60)
        again = WorkLog.objects.filter(kind="ttr", phase="start").order_by("at").last()
        # Back after the ttr (2 s), long before the dead consumer's timeout (60 s).
        assert again.pid != first.pid and again.at - killed < 30
        wait_until(lambda: t.naps_past_ttr.get_result(long.id).is_finished, timeout=60)
    finally:
        output += stop(worker)
    hung.refresh()
    assert hung.status == TaskResultStatus.SUCCESSFUL, output
    assert hung.return_value == 2 and hung.attempts == 2
    long.refresh()
    assert long.status == TaskResultStatus.SUCCESSFUL and long.attempts == 1, output


# key ----------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_keyed_tasks_wait_in_their_key_s_sub_queue():
    t.step.enqueue(7, 0)
    t.step.using(key="by hand").enqueue(7, 1)
    tasks = list(Tube.objects.get(name=keyed_tube_name("default")).tasks.all().order_by("id"))
    assert [task.utube for task in tasks] == ["account:7", "by hand"]
    assert Tube.objects.get(name=keyed_tube_name("default")).type == "utubettl"


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_tasks_with_the_same_key_run_one_at_a_time_in_enqueue_order():
    for n in range(6):
        for account in (1, 2):
            t.step.enqueue(account, n)

    run = run_workers(
        "--burst",
        "--processes",
        "3",
        "--only",
        "tasks-keyed.default",
        DJANGO_SETTINGS_MODULE="tests.workers_settings",
        TASKLOOP_OVERRIDES=FAST,
    )

    assert run.returncode == 0, run.stderr
    for account in ("1", "2"):
        rows = list(
            WorkLog.objects.filter(kind="key", key__startswith=account)
            .order_by("at", "id")
            .values_list("phase", "key")
        )
        # start, end, start, end…: never two of one key at once; steps in enqueue order.
        assert [phase for phase, _ in rows] == ["start", "end"] * 6, rows
        assert [key for phase, key in rows if phase == "end"] == [f"{account}:{n}" for n in range(6)]
    assert TaskRecord.objects.filter(status="SUCCESSFUL").count() == 12


# unique -----------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_unique_by_arguments_returns_the_waiting_task_s_result():
    first = t.refresh.enqueue("sales")
    again = t.refresh.enqueue("sales")
    other = t.refresh.enqueue("costs")
    assert again.id == first.id and other.id != first.id
    assert again.status == TaskResultStatus.READY and again.args == ["sales"]
    assert TaskRecord.objects.count() == 2
    assert len(Tube.objects.get(name=tube_name("default")).tasks.all()) == 2
    # Once it has started it no longer waits: the next enqueue adds a new one.
    assert run_one() is None
    assert t.refresh.get_result(first.id).status == TaskResultStatus.SUCCESSFUL
    assert t.refresh.enqueue("sales").id != first.id
    # Another task with the same arguments is not a twin.
    assert t.must_start_soon.enqueue("sales").id != first.id


@pytest.mark.django_db(transaction=True)
def test_unique_by_key_returns_the_waiting_task_of_that_key():
    first = t.sync.enqueue(1)
    assert t.sync.enqueue(1).id == first.id
    assert t.sync.enqueue(2).id != first.id
    assert t.sync.using(key="account:1").enqueue(99).id == first.id  # same key, other args
    assert run_one(keyed=True) is None  # account:1 ran
    assert t.sync.enqueue(1).id != first.id


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("unique", "keyed"), [(t.refresh, False), (t.sync, True)], ids=["args", "key"])
def test_unique_finds_the_oldest_waiting_twin_of_a_one_row_enqueue(unique, keyed):
    """Issue 39, item 4: twins enqueued with ``using(unique=False)`` are one-row enqueues (no
    record until a worker starts them); a ``unique`` enqueue added a third beside them."""
    older = [unique.using(unique=False).enqueue(7) for _ in range(2)]
    assert not TaskRecord.objects.exists()  # one row each: their tube tasks carry the calls
    again = unique.enqueue(7)
    assert again.id == older[0].id
    assert again.status == TaskResultStatus.READY and again.args == [7]
    assert again.enqueued_at == older[0].enqueued_at
    tube = Tube.objects.get(name=keyed_tube_name("default") if keyed else tube_name("default"))
    assert tube.tasks.count() == 2 and not TaskRecord.objects.exists()  # nothing added
    # Another call is no twin: added (two rows, as unique enqueues are).
    other = unique.enqueue(8)
    assert other.id not in {r.id for r in older} and TaskRecord.objects.filter(pk=other.id).exists()
    # The oldest twin started: the next oldest one waiting is found.
    assert run_one(keyed=keyed) is None
    assert unique.get_result(older[0].id).status == TaskResultStatus.SUCCESSFUL
    assert unique.enqueue(7).id == older[1].id
    assert tube.tasks.count() == 2  # older[1] and other


@pytest.mark.django_db(transaction=True)
def test_unique_by_arguments_takes_no_one_row_call_of_another_task_or_arguments_for_a_twin():
    t.refresh.using(unique=False).enqueue("costs")
    t.must_start_soon.enqueue("sales")  # another task, the same queue and arguments
    first = t.refresh.enqueue("sales")
    assert TaskRecord.objects.filter(pk=first.id).exists()
    assert t.refresh.enqueue("sales").id == first.id


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_unique_holds_when_processes_enqueue_at_once():
    from .conftest import race

    ids = race(t.enqueue_refresh, [("race",)] * 4)
    assert len(set(ids)) == 1
    assert TaskRecord.objects.filter(status="READY").count() == 1
    assert len(Tube.objects.get(name=tube_name("default")).tasks.all()) == 1


# enqueue_on_commit ---------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_enqueue_on_commit_waits_for_the_commit():
    with transaction.atomic():
        result = t.on_commit.enqueue("later")
        assert result.status == TaskResultStatus.READY and result.id
        assert not TaskRecord.objects.exists()  # not yet
    record = TaskRecord.objects.get()
    assert record.id == result.id and record.enqueued_at is not None
    (queued,) = Tube.objects.get(name=tube_name("default")).tasks.all()
    # Its id was known before commit: the record is written first, the tube task points at it.
    assert queued.data == {"result": result.id, "task": "tests.options_tasks.on_commit"}
    assert run_one() is None
    assert t.on_commit.get_result(result.id).return_value == "later"


@pytest.mark.django_db(transaction=True)
def test_enqueue_on_commit_enqueues_nothing_if_the_transaction_rolls_back():
    with transaction.atomic():
        t.on_commit.enqueue("never")
        add.using(enqueue_on_commit=True).enqueue(1, 2)
        transaction.set_rollback(True)
    assert not TaskRecord.objects.exists()
    assert not Task.objects.exists()
    # Outside a transaction it enqueues at once (one row: the tube task carries the call).
    result = t.on_commit.enqueue("now")
    (queued,) = Task.objects.all()
    assert result_id_of(queued) == result.id
    assert t.on_commit.get_result(result.id).status == TaskResultStatus.READY


# What options cost ---------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_options_cost_no_statement_unless_they_look_for_a_twin(settings):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    settings.TASKLOOP = {"HEARTBEAT_INTERVAL": 1}
    t.step.enqueue(1, 0)  # the first enqueues of a process make the queues' tubes
    add.enqueue(0, 0)

    def statements(enqueue) -> list[str]:
        with CaptureQueriesContext(connection) as queries:
            enqueue()
        return [
            q["sql"]
            for q in queries.captured_queries
            if q["sql"].upper() not in ("BEGIN", "COMMIT")
            and not q["sql"].startswith(("SAVEPOINT", "RELEASE"))
        ]

    # One statement: the tube task carries the call and its options (no record yet).
    options = add.using(max_attempts=3, backoff=2, ttl=60, ttr=30)
    assert len(statements(lambda: options.enqueue(1, 2))) == 1
    assert len(statements(lambda: t.step.enqueue(1, 1))) == 1
    first = statements(lambda: t.refresh.enqueue("x"))
    twin = statements(lambda: t.refresh.enqueue("x"))
    # The tube row's lock and the look for a twin; the twin costs no INSERT.
    assert len(first) <= 5 and not any(sql.lstrip().upper().startswith("INSERT") for sql in twin)


# Options exactly as asked (issue 28, item 7) ---------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("most", [1, 2])
def test_using_max_attempts_is_what_the_worker_runs_even_a_falsy_looking_1(most):
    """@task(max_attempts=3) then .using(max_attempts=1 or 2): that many calls, in a real worker."""
    result = t.always_fails.using(max_attempts=most).enqueue("boom")

    run = drain_default()

    assert run.returncode == 0, run.stderr
    result.refresh()
    assert result.status == TaskResultStatus.FAILED, run.stderr
    assert result.attempts == most and len(result.errors) == most
    assert WorkLog.objects.filter(kind="always").count() == most


@pytest.mark.django_db
@pytest.mark.parametrize("ttr", [0.5, 1, 1.9])
def test_a_ttr_under_two_heartbeats_is_refused_where_it_is_given(settings, ttr):
    settings.TASKLOOP = {**getattr(settings, "TASKLOOP", {}), "HEARTBEAT_INTERVAL": 1}
    with pytest.raises(ValueError, match=r"ttr must be at least twice TASKLOOP\['HEARTBEAT_INTERVAL'\]"):
        task(ttr=ttr)(func)
    with pytest.raises(ValueError, match=r"ttr must be at least twice TASKLOOP\['HEARTBEAT_INTERVAL'\]"):
        add.using(ttr=ttr)
    assert TaskRecord.objects.count() == 0
    assert add.using(ttr=2).ttr == 2  # twice the heartbeat is enough


@pytest.mark.django_db(transaction=True)
@pytest.mark.vendors("sqlite")  # SQLite's single write lock
def test_enqueue_inside_a_busy_caller_s_transaction_says_what_is_true():
    """SQLite: enqueue() inside the caller's atomic() while another writer holds the lock. No
    retry is possible there: the message says so (one try), and what to do instead."""
    import sqlite3

    from django.db import connection

    from django_taskloop.exceptions import DatabaseBusy

    connection.ensure_connection()
    lock = sqlite3.connect(connection.settings_dict["NAME"], timeout=30)
    try:
        lock.execute("BEGIN IMMEDIATE")
        with transaction.atomic():
            connection.connection.execute("PRAGMA busy_timeout = 50")
            with pytest.raises(DatabaseBusy) as busy:
                add.enqueue(1, 2)
    finally:
        lock.rollback()
        lock.close()
        connection.connection.execute("PRAGMA busy_timeout = 5000")
    message = str(busy.value)
    assert "caller's transaction" in message and "1 try" in message, message
    assert "not retried" in message and "enqueue_on_commit" in message, message
    assert "outside" in message, message
    assert "raise OPTIONS['timeout']" not in message and "tries" not in message, message
    assert TaskRecord.objects.count() == 0


# Versions (issue 28, item 5) -------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_taskloop_s_task_decorator_takes_the_options_on_every_django():
    """django_taskloop.task_options.task: the options on Django 5.2, 6.0 and 6.1 alike, and the
    worker runs exactly what was asked."""
    from django_taskloop.task_options import task as taskloop_task

    made = taskloop_task(max_attempts=2, ttl=60, priority=5)(t.always_fails.func)
    assert isinstance(made, TaskloopTask)
    assert (made.max_attempts, made.ttl, made.priority, made.module_path) == (
        2,
        60,
        5,
        t.always_fails.module_path,
    )
    assert taskloop_task(t.always_fails.func).max_attempts == 1  # bare, as Django's
    with pytest.raises(ValueError, match="max_attempts must be >= 1"):
        taskloop_task(max_attempts=0)(func)


def test_django_6_0_s_refusal_of_an_option_is_one_clear_message(monkeypatch):
    import django

    from django_taskloop.compat import explain_refused_options

    refused = TypeError("task() got an unexpected keyword argument 'max_attempts'")
    monkeypatch.setattr(django, "VERSION", (6, 0, 10, "final", 0))
    monkeypatch.setattr(django, "get_version", lambda: "6.0.10")
    message = explain_refused_options(refused)
    assert message is not None and "Django 6.0.10's @task takes no backend options" in message
    assert "django_taskloop.task_options.task" in message and "6.1" in message
    assert explain_refused_options(TypeError("something else")) is None
    monkeypatch.setattr(django, "VERSION", (6, 1, 3, "final", 0))
    assert explain_refused_options(refused) is None


def test_a_taskloop_py_refused_by_django_6_0_is_an_improperly_configured(monkeypatch):
    from django.core.exceptions import ImproperlyConfigured

    from django_taskloop import workers

    def refuse(name):
        raise TypeError("task() got an unexpected keyword argument 'max_attempts'")

    monkeypatch.setattr(workers, "autodiscover_modules", refuse)
    monkeypatch.setattr(workers, "explain_refused_options", lambda error: "Django 6.0.10's @task ...")
    with pytest.raises(ImproperlyConfigured, match="Django 6.0.10's @task"):
        workers.autodiscover()


@pytest.mark.django_db
def test_a_per_call_backoff_that_cannot_reach_the_worker_is_refused_at_using():
    """A call's options travel to the worker as data: a lambda or nested function cannot."""
    with pytest.raises(ValueError, match="module-level function"):
        t.step.using(backoff=lambda attempt: 1)

    def nested(attempt):
        return 1

    with pytest.raises(ValueError, match="module-level function"):
        t.step.using(backoff=nested)
    assert not Task.objects.exists() and not TaskRecord.objects.exists()


def doubled(n: int) -> int:
    return 2 * n


def test_task_options_leave_another_backend_usable():
    """``django_taskloop.task_options.task(max_attempts=…)`` under another TASKS backend (a test
    settings file's ImmediateBackend): the task is that backend's plain Task, the options have
    no effect there, and it runs. (Django's own ``@task(max_attempts=…)`` is a TypeError there:
    the README says so, and which backends to use in tests.)"""
    import django
    from django.test import override_settings

    from django_taskloop import task_options

    framework = "django.tasks" if django.VERSION >= (6,) else "django_tasks"
    immediate = f"{framework}.backends.immediate.ImmediateBackend"
    with override_settings(TASKS={"default": {"BACKEND": immediate}}):
        made = task_options.task(max_attempts=5, ttl=60)(doubled)
        assert not isinstance(made, TaskloopTask)
        assert made.enqueue(21).return_value == 42
    ours = task_options.task(max_attempts=5, ttl=60)(doubled)
    assert isinstance(ours, TaskloopTask) and (ours.max_attempts, ours.ttl) == (5, 60)


@pytest.mark.django_db(transaction=True)
def test_an_operators_retry_is_one_more_attempt_and_its_failure_says_so():
    """A FAILED task retried (the admin's Retry, ``taskloop retry``) runs once more: its
    failure names the attempt and says it was a retry (it read "failed", no attempt at all, when
    tried from a fresh project), never "attempt 4 of 3"."""
    result = t.always_fails.enqueue("boom")
    said = [str(run_one()) for _ in range(3)]
    assert "(attempt 3 of 3)" in said[-1], said
    assert backend().retry(result.id).status == TaskResultStatus.READY
    error = str(run_one())
    assert "(attempt 4, one more after an operator's retry)" in error, error
    assert "of 3" not in error, error
    result.refresh()
    assert result.status == TaskResultStatus.FAILED and len(result.errors) == 4
