"""The testing recipe (issue 28 item 4): django_taskloop.testing runs Django Tasks in the test's
own thread, connection and transaction — ``run_queued()`` what is queued, or
``ImmediateBackend`` each task as it is enqueued — through the worker's tube handlers, with
every option honoured and nothing printed; in ``django.test.TestCase`` and with pytest-django.
"""

from __future__ import annotations

import datetime as dt
import logging

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connection, transaction
from django.test import TestCase, override_settings
from django.utils import timezone

from django_taskloop.backends import TaskloopBackend
from django_taskloop.testing import (
    ImmediateBackend,
    RunawayTasks,
    commit_and_run_queued,
    immediate,
    run_queued,
)

from . import testing_tasks as t
from .testing_tasks import logged

try:
    from django.tasks import task_backends
except ImportError:  # Django 5.2: the backport
    from django_tasks import task_backends

# The opt-in pytest plugin, as a user's conftest.py would load it.
pytest_plugins = ["django_taskloop.pytest_plugin"]

FUTURE = dt.timedelta(hours=1)


def status(result) -> str:
    """How ``result`` reads now, through the backend (``get_result``), as a user reads it."""
    return str(result.task.get_result(result.id).status)


def error_classes(result) -> list[str]:
    return [error.exception_class_path for error in result.task.get_result(result.id).errors]


# run_queued() with the production backend -----------------------------------------------------


@pytest.mark.django_db
def test_run_queued_runs_what_is_queued_and_says_how_many():
    result = t.record.enqueue("a")
    assert status(result) == "READY" and logged() == []
    assert isinstance(task_backends["default"], TaskloopBackend)
    assert run_queued() == 1
    done = t.record.get_result(result.id)
    assert done.status == "SUCCESSFUL" and done.return_value == "A" and done.attempts == 1
    assert logged() == ["a"]
    assert run_queued() == 0


def test_the_plugin_s_fixture_brings_database_access(taskloop_run_queued):
    # No django_db mark: the fixture asks for pytest-django's db itself.
    result = t.record.enqueue("fixture")
    assert taskloop_run_queued() == 1 and status(result) == "SUCCESSFUL"


@pytest.mark.django_db
def test_run_queued_runs_one_queue_when_named():
    plain, slow = t.record.enqueue("plain"), t.record_slow.enqueue("slow")
    assert run_queued("slow") == 1
    assert (status(plain), status(slow)) == ("READY", "SUCCESSFUL")
    assert run_queued() == 1 and status(plain) == "SUCCESSFUL"


@pytest.mark.django_db
def test_run_queued_refuses_bad_arguments_clearly():
    with pytest.raises(ValueError, match="queue_name 'nope' is not one of TASKS\\['default'\\]"):
        run_queued("nope")
    with pytest.raises(TypeError, match="limit must be an int"):
        run_queued(limit=1.5)
    with pytest.raises(ValueError, match="limit must be >= 1"):
        run_queued(limit=0)
    with pytest.raises(TypeError, match="include_delayed must be a bool"):
        run_queued(include_delayed="yes")
    dummy = "django.tasks.backends.dummy.DummyBackend"
    try:
        import django.tasks  # noqa: F401
    except ImportError:
        dummy = "django_tasks.backends.dummy.DummyBackend"
    with override_settings(TASKS={"default": {"BACKEND": dummy}}):
        with pytest.raises(TypeError, match="not a TaskloopBackend"):
            run_queued()
    with pytest.raises(ValueError, match="queue_name 'nope'"):
        with commit_and_run_queued("nope"):
            t.record.enqueue("never")  # refused before the block runs
    assert logged() == [] and run_queued() == 0


@pytest.mark.django_db
def test_tasks_that_enqueue_tasks_are_drained():
    t.chain.enqueue(3)
    assert run_queued() == 4
    assert logged("end") == ["chain:3", "chain:2", "chain:1", "chain:0"]


@pytest.mark.django_db
def test_a_runaway_stops_with_a_clear_error_and_leaves_the_rest_queued():
    t.forever.enqueue(0)
    with pytest.raises(RunawayTasks, match=r"ran 5 tasks .*tests\.testing_tasks\.forever ×5.*limit="):
        run_queued(limit=5)
    assert logged() == [f"forever:{n}" for n in range(5)]
    # What was left is still queued: the next run starts with it (and meets the same loop).
    with pytest.raises(RunawayTasks):
        run_queued(limit=1)
    assert len(logged()) == 6


@pytest.mark.django_db
def test_max_attempts_and_backoff_a_retry_waits_out_its_backoff_unless_delayed_are_included():
    result = t.flaky.enqueue("f")
    assert run_queued() == 1  # attempt 2 waits 600 s, as it would for a worker
    waiting = t.flaky.get_result(result.id)
    assert waiting.status == "READY" and waiting.attempts == 1
    assert error_classes(result) == ["builtins.ValueError"]
    assert run_queued() == 0
    assert run_queued(include_delayed=True) == 2
    done = t.flaky.get_result(result.id)
    assert done.status == "SUCCESSFUL" and done.return_value == 3 and done.attempts == 3
    assert error_classes(result) == ["builtins.ValueError"] * 2
    assert logged() == ["f:1", "f:2", "f:3"]


@pytest.mark.django_db
def test_max_attempts_with_no_backoff_runs_every_attempt_then_fails():
    result = t.always_fails.enqueue("x")
    assert run_queued() == 2
    assert status(result) == "FAILED" and error_classes(result) == ["builtins.RuntimeError"] * 2


@pytest.mark.django_db
def test_a_callable_backoff_delays_the_retry():
    result = t.fails_with_callable_backoff.enqueue("c")
    assert run_queued() == 1 and status(result) == "READY"
    assert run_queued(include_delayed=True) == 1 and status(result) == "FAILED"
    assert logged() == ["c", "c"]


@pytest.mark.django_db
def test_ttl_a_task_not_started_in_time_fails_and_is_never_called(clock):
    result = t.short_lived.enqueue("late")
    clock.advance(30)  # its ttl is 60 s
    assert status(result) == "READY"
    clock.advance(31)
    assert status(result) == "FAILED"
    assert run_queued() == 1
    assert error_classes(result) == ["django_taskloop.exceptions.TaskExpired"]
    assert logged() == []


@pytest.mark.django_db
def test_ttr_the_running_attempt_holds_its_lease_and_reads_running():
    result = t.leased.enqueue()
    assert run_queued() == 1
    assert t.leased.get_result(result.id).return_value == {"status": "RUNNING", "ttr": [20.0], "attempt": 1}
    with pytest.raises(ValueError, match="ttr must be at least twice"):
        t.leased.using(ttr=1)


@pytest.mark.django_db
def test_key_a_task_of_a_held_key_runs_after_the_one_holding_it():
    t.account_step.enqueue(1, 1)
    assert run_queued() == 2
    assert logged() == ["1:1", "1:1", "1:2", "1:2"]
    from tests.testapp.models import WorkLog

    phases = list(WorkLog.objects.filter(kind="recipe").order_by("pk").values_list("phase", flat=True))
    assert phases == ["start", "end", "start", "end"]


@pytest.mark.django_db
def test_unique_returns_the_waiting_twin_until_it_ran():
    first = t.refresh.enqueue("r")
    assert t.refresh.enqueue("r").id == first.id
    assert run_queued() == 1 and logged() == ["r"]
    assert t.refresh.enqueue("r").id != first.id


@pytest.mark.django_db
def test_enqueue_on_commit_runs_only_what_a_commit_wrote():
    pending = t.notify.enqueue(1)  # the test's transaction never commits
    assert pending.enqueued_at is None
    assert run_queued() == 0
    with transaction.atomic():
        t.notify.enqueue(2)
        transaction.set_rollback(True)
    with commit_and_run_queued() as ran:
        committed = t.notify.enqueue(3)
        assert ran.count == 0
    assert ran.count == 1
    assert status(committed) == "SUCCESSFUL"
    assert logged() == ["notify:3"]


@pytest.mark.django_db
def test_priority_orders_the_queue():
    t.low.enqueue("low")
    t.record.enqueue("normal")
    t.high.enqueue("high")
    assert run_queued() == 3
    assert logged() == ["high", "normal", "low"]


@pytest.mark.django_db
def test_run_after_in_the_future_waits_unless_delayed_are_included():
    result = t.record.using(run_after=timezone.now() + FUTURE).enqueue("later")
    assert run_queued() == 0 and status(result) == "READY"
    assert run_queued(include_delayed=True) == 1
    assert status(result) == "SUCCESSFUL" and logged() == ["later"]


@pytest.mark.django_db(transaction=True)
def test_run_queued_works_outside_a_transaction_too():
    result = t.chain.enqueue(1)
    assert run_queued() == 2 and status(result) == "SUCCESSFUL"


@pytest.mark.django_db
def test_a_database_error_in_a_task_leaves_the_tests_transaction_usable():
    result = t.breaks_the_transaction.enqueue("dup")
    # Inside the test's atomic block Django marks the block for rollback at the task's
    # IntegrityError (PostgreSQL aborts it too), so the backend cannot record the failure:
    # rolled back to the savepoint around the task, the tube task given back, the error raised.
    with pytest.raises(DatabaseError) as raised:
        run_queued()
    notes = getattr(raised.value, "__notes__", [])
    assert any("tests.testing_tasks.breaks_the_transaction" in note for note in notes), notes
    assert status(result) == "READY"
    t.record.enqueue("after")
    assert run_queued("slow") == 0  # the test's transaction still works
    with pytest.raises(DatabaseError):
        run_queued()  # the given-back task comes first, and fails the same way


@pytest.mark.django_db
def test_a_queue_s_tasks_stay_in_its_tube_after_a_rollback():
    """A TestCase rolls back after each test: the backend's tube cache must not outlive that
    (SQLite reuses a rolled-back id; this put the queue's next task into another queue's tube
    before d8b4285)."""
    from django_taskloop.models import Tube

    for name in ("tasks.default", "tasks.slow"):
        tube = Tube.objects.filter(name=name).first()
        if tube is not None:
            tube.drop()
    with transaction.atomic():
        t.record.enqueue("rolled back")  # creates the queue's tube, which the backend caches
        transaction.set_rollback(True)
    t.record_slow.enqueue("slow")  # another queue's tube: on SQLite, the rolled-back id
    t.record.enqueue("default")
    assert run_queued("slow") == 1
    assert logged() == ["slow"]


# ImmediateBackend ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_immediate_runs_at_enqueue_and_returns_the_finished_result(taskloop_immediate):
    assert isinstance(task_backends["default"], ImmediateBackend)
    result = t.record.enqueue("now")
    assert result.status == "SUCCESSFUL" and result.return_value == "NOW"
    assert logged() == ["now"]


@pytest.mark.django_db
def test_immediate_max_attempts_run_at_once_with_their_backoff_skipped(taskloop_immediate):
    result = t.flaky.enqueue("f")
    assert result.status == "SUCCESSFUL" and result.return_value == 3 and result.attempts == 3
    assert [e.exception_class_path for e in result.errors] == ["builtins.ValueError"] * 2
    assert logged() == ["f:1", "f:2", "f:3"]
    failed = t.always_fails.enqueue("x")
    assert failed.status == "FAILED" and len(failed.errors) == 2
    callable_backoff = t.fails_with_callable_backoff.enqueue("c")
    assert callable_backoff.status == "FAILED" and callable_backoff.attempts == 2
    again = task_backends["default"].retry(failed.id)  # the admin's Retry: one more attempt, now
    assert again.id == failed.id and again.status == "FAILED" and len(again.errors) == 3


@pytest.mark.django_db
def test_immediate_a_task_enqueued_by_a_task_runs_after_it_not_inside_it(taskloop_immediate):
    result = t.chain.enqueue(2)
    assert result.status == "SUCCESSFUL"
    from tests.testapp.models import WorkLog

    rows = list(WorkLog.objects.filter(kind="recipe").order_by("pk").values_list("key", "phase"))
    assert rows == [
        ("chain:2", "start"),
        ("chain:2", "end"),
        ("chain:1", "start"),
        ("chain:1", "end"),
        ("chain:0", "start"),
        ("chain:0", "end"),
    ]


@pytest.mark.django_db
def test_immediate_key_order_and_ttl_behind_a_held_key(taskloop_immediate):
    first = t.account_step.enqueue(7, 1)
    assert first.status == "SUCCESSFUL"
    assert logged("start") == ["7:1", "7:2"] and logged("end") == ["7:1", "7:2"]
    holder = t.holds_the_slot.enqueue("h", 0.4)  # its keyed follower (ttl 0.2 s) waits 0.4 s
    assert holder.status == "SUCCESSFUL"
    assert "h-late" not in logged()
    expired = t.expires_behind_its_key.get_result(holder.return_value)
    assert expired.status == "FAILED"
    assert [e.exception_class_path for e in expired.errors] == ["django_taskloop.exceptions.TaskExpired"]


@pytest.mark.django_db
def test_immediate_ttr_priority_takes_context(taskloop_immediate):
    leased = t.leased.enqueue()
    assert leased.return_value == {"status": "RUNNING", "ttr": [20.0], "attempt": 1}
    t.fanout.enqueue()
    assert logged() == ["leased", "fanout", "high", "low"]


@pytest.mark.django_db
def test_immediate_run_after_waits_for_run_queued_and_unique_finds_it(taskloop_immediate):
    later = t.refresh.using(run_after=timezone.now() + FUTURE)
    first = later.enqueue("r")
    assert first.status == "READY" and later.enqueue("r").id == first.id
    assert logged() == []
    assert run_queued(include_delayed=True) == 1
    assert status(first) == "SUCCESSFUL" and logged() == ["r"]


@pytest.mark.django_db
def test_immediate_enqueue_on_commit_runs_at_commit(taskloop_immediate):
    with commit_and_run_queued() as ran:
        result = t.notify.enqueue(9)
        assert result.status == "READY" and logged() == []
    assert status(result) == "SUCCESSFUL" and logged() == ["notify:9"]
    assert ran.count == 0  # it ran at the commit, before run_queued() looked
    with transaction.atomic():
        t.notify.enqueue(10)
        transaction.set_rollback(True)
    assert logged() == ["notify:9"]


@pytest.mark.django_db
def test_immediate_runaway_stops_at_its_limit():
    with override_settings(
        TASKS={
            "default": {
                "BACKEND": "django_taskloop.testing.ImmediateBackend",
                "QUEUES": ["default"],
                "OPTIONS": {"LIMIT": 3},
            }
        }
    ):
        with pytest.raises(RunawayTasks, match="ran 3 tasks"):
            t.forever.enqueue(0)
    assert logged() == ["forever:0", "forever:1", "forever:2"]


def test_immediate_refuses_a_bad_limit():
    bad = {"default": {"BACKEND": "django_taskloop.testing.ImmediateBackend", "OPTIONS": {"LIMIT": 0}}}
    with override_settings(TASKS=bad):
        with pytest.raises(
            ImproperlyConfigured, match=r"TASKS\['default'\]\['OPTIONS'\]: LIMIT must be >= 1"
        ):
            task_backends["default"]


def test_immediate_refuses_what_it_cannot_switch(settings):
    with pytest.raises(ValueError, match="TASKS has no backend 'nope'"):
        immediate("nope")
    settings.TASKS = {}
    with pytest.raises(ValueError, match="no TaskloopBackend"):
        immediate()


# In django.test.TestCase, quietly --------------------------------------------------------------


class RecipeInTestCase(TestCase):
    """The same helpers in Django's own TestCase (its transaction wraps each test)."""

    def test_run_queued(self):
        result = t.chain.enqueue(2)
        self.assertEqual(run_queued(), 3)
        self.assertEqual(status(result), "SUCCESSFUL")

    def test_commit_and_run_queued(self):
        with commit_and_run_queued() as ran:
            result = t.notify.enqueue(4)
        self.assertEqual(ran.count, 1)
        self.assertEqual(status(result), "SUCCESSFUL")

    @immediate()
    def test_immediate(self):
        self.assertEqual(t.flaky.enqueue("tc").status, "SUCCESSFUL")
        with self.captureOnCommitCallbacks(execute=True):
            result = t.notify.enqueue(5)
        self.assertEqual(status(result), "SUCCESSFUL")


@immediate()
class ImmediateTestCase(TestCase):
    """``@immediate()`` on a TestCase class switches every test of it."""

    def test_each_test_runs_immediately(self):
        self.assertEqual(t.record.enqueue("class").status, "SUCCESSFUL")


@pytest.mark.django_db
def test_nothing_is_printed_or_logged_no_database_table_is_locked(capfd, caplog):
    caplog.set_level(logging.DEBUG, logger="django_taskloop")
    for n in range(10):
        t.record.enqueue(f"r{n}")
    t.chain.enqueue(3)
    t.account_step.enqueue(1, 1)
    assert run_queued() == 16
    with immediate():
        t.flaky.enqueue("q")
    out, err = capfd.readouterr()
    text = out + err + caplog.text
    assert "locked" not in text.lower()
    assert not [
        r for r in caplog.records if r.name.startswith("django_taskloop") and r.levelno >= logging.WARNING
    ]
    assert out == "" and err == ""
    assert connection.vendor in ("sqlite", "mysql", "postgresql")
