"""Enqueue is the call every web request makes: a put is one statement, a Django Task two.

Counted with Django's own query capture, outside any transaction (``transaction=True``), as a
view calls them. Statements only: the capture does not show BEGIN/COMMIT, so the tests also
say that a put opens no transaction of its own (autocommit: one round trip).
"""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from django_taskloop.backends import result_id_of
from django_taskloop.engine import db_now, features
from django_taskloop.exceptions import NotFound
from django_taskloop.models import Task, TaskRecord, Tube
from django_taskloop.models.tubes import claiming as tubes_claiming

from .workers_util import add

try:
    from django.tasks import TaskResultStatus
except ImportError:  # Django 5.2: the backport
    from django_tasks import TaskResultStatus

pytestmark = pytest.mark.django_db(transaction=True)


def _statements(queries: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in queries.captured_queries]


@pytest.mark.parametrize("type", ["fifo", "fifottl", "utube", "utubettl"])
def test_a_put_is_one_statement_and_no_transaction_of_its_own(type, monkeypatch):
    tube = Tube.objects.create_tube("one", type, ttl=600, ttr=30)
    opened = []
    real_atomic = transaction.Atomic.__enter__
    monkeypatch.setattr(transaction.Atomic, "__enter__", lambda self: opened.append(1) or real_atomic(self))
    with CaptureQueriesContext(connection) as queries:
        task = tube.put({"n": 1}, pri=2, delay=5 if type.endswith("ttl") else None, utube="k")
    assert len(_statements(queries)) == 1, _statements(queries)
    assert _statements(queries)[0].lstrip().upper().startswith(("INSERT", "WITH"))
    assert opened == []
    # What the database computed came back with the statement.
    stored = Tube.objects.get(pk=tube.pk).peek(task.pk)
    assert (task.pk, task.state, task.ttl_at, task.event_at) == (
        stored.pk,
        stored.state,
        stored.ttl_at,
        stored.event_at,
    )
    if type.endswith("ttl"):
        assert task.state == "~" and task.event_at is not None and task.ttl_at > task.event_at


def test_put_many_is_one_statement():
    tube = Tube.objects.create_tube("many", "fifottl", ttl=600)
    with CaptureQueriesContext(connection) as queries:
        tasks = tube.put_many([{"n": n} for n in range(500)], delay=1)
    assert len(_statements(queries)) == 1, _statements(queries)
    assert all(t.ttl_at is not None and t.event_at is not None for t in tasks)
    assert tube.statistics()["calls"]["put"] == 500


def test_put_into_a_dropped_tube_is_not_found_and_counts_nothing():
    tube = Tube.objects.create_tube("gone", "fifo")
    Tube.objects.get(pk=tube.pk).drop()
    with pytest.raises(NotFound):
        tube.put(1)
    with pytest.raises(NotFound):
        tube.put_many([1, 2])
    with pytest.raises(NotFound), transaction.atomic():
        tube.put(1)


@pytest.mark.parametrize("type", ["fifo", "fifottl", "utube", "utubettl"])
def test_a_put_inside_a_transaction_is_one_statement(type):
    """ATOMIC_REQUESTS views put inside a transaction: still one statement (no savepoint, no
    look-up of the tube: the INSERT itself says whether the tube is still there)."""
    tube = Tube.objects.create_tube("inside", type, ttl=600, ttr=30)
    with transaction.atomic():
        with CaptureQueriesContext(connection) as queries:
            task = tube.put({"n": 1}, pri=2, utube="k")
        assert len(_statements(queries)) == 1, _statements(queries)
        assert _statements(queries)[0].lstrip().upper().startswith(("INSERT", "WITH"))
    assert Tube.objects.get(pk=tube.pk).peek(task.pk).data == {"n": 1}


def test_a_put_into_a_dropped_tube_inside_a_transaction_writes_nothing_and_the_transaction_goes_on():
    live = Tube.objects.create_tube("live", "fifottl")
    gone = Tube.objects.create_tube("gone", "fifottl")
    Tube.objects.get(pk=gone.pk).drop()
    with transaction.atomic():
        live.put(1)
        with pytest.raises(NotFound):
            gone.put(2)
        live.put(3)
    assert [t.data for t in live.tasks.all().order_by("pk")] == [1, 3]
    assert not Task.objects.filter(tube_id=gone.pk).exists()


def test_a_django_task_enqueue_inside_a_transaction_is_one_insert():
    add.enqueue(1, 2)  # the first enqueue of a process makes the queue's tube
    with transaction.atomic():
        with CaptureQueriesContext(connection) as queries:
            result = add.enqueue(2, 3)
        statements = _statements(queries)
        # One INSERT (its NOTIFY within it on PostgreSQL): the tube task carries the call.
        assert len(statements) == 1, statements
        assert statements[0].lstrip().upper().startswith(("INSERT", "WITH")), statements
    assert not TaskRecord.objects.filter(pk=result.id).exists()
    assert add.get_result(result.id).status == "READY"
    (queued,) = [
        t for t in Tube.objects.get(name="tasks.default").tasks.all() if result_id_of(t) == result.id
    ]
    assert queued.data["args"] == [2, 3]


def test_derived_put_counts_every_put_and_nothing_rolled_back(clock):
    tube = Tube.objects.create_tube("count", "fifottl")
    tube.put(1)
    tube.put_many([2, 3, 4])
    with transaction.atomic():
        tube.put(5)
        transaction.set_rollback(True)
    tube.ack(tube.take(0).pk)  # done: still counted as put
    tube.delete_task(tube.take(0).pk)
    six = tube.put(6, ttl=60)
    clock.advance(30)
    assert tube.peek(six.pk).state == "r"
    clock.advance(31)
    assert tube.truncate() == 2  # the ttl of 6 ran out first: removed, counted as ttl and done
    stats = tube.statistics()
    assert stats["calls"]["put"] == 5
    assert stats["tasks"]["total"] == 0
    tube.put(7)
    assert Tube.objects.get(pk=tube.pk).statistics()["calls"]["put"] == 6


def test_a_django_task_enqueue_is_one_statement_in_autocommit(monkeypatch):
    add.enqueue(1, 2)  # the first enqueue of a process makes the queue's tube
    opened = []
    real_atomic = transaction.Atomic.__enter__
    monkeypatch.setattr(transaction.Atomic, "__enter__", lambda self: opened.append(1) or real_atomic(self))
    with CaptureQueriesContext(connection) as queries:
        result = add.enqueue(2, 3)
    statements = [sql for sql in _statements(queries) if sql.upper() not in ("BEGIN", "COMMIT")]
    # One INSERT (and the wake-up within it on PostgreSQL), in autocommit: one round trip.
    assert len(statements) == 1, "\n".join(sql[:60] for sql in statements)
    assert statements[0].lstrip().upper().startswith(("INSERT", "WITH"))
    assert opened == []
    assert not TaskRecord.objects.exists()  # written by the worker that starts it
    (queued,) = [
        t for t in Tube.objects.get(name="tasks.default").tasks.all() if result_id_of(t) == result.id
    ]
    assert queued.state == "r" and queued.pri == 100 - result.task.priority
    assert result.enqueued_at == queued.created
    assert add.get_result(result.id).enqueued_at == result.enqueued_at


def test_a_django_task_enqueue_in_a_transaction_that_rolls_back_leaves_nothing():
    add.enqueue(1, 2)
    records, tasks = TaskRecord.objects.count(), Tube.objects.get(name="tasks.default").tasks.all().count()
    with pytest.raises(RuntimeError), transaction.atomic():
        add.enqueue(2, 3)
        raise RuntimeError("roll back")
    assert TaskRecord.objects.count() == records
    assert Tube.objects.get(name="tasks.default").tasks.all().count() == tasks


def test_enqueue_after_the_queues_tube_was_dropped_makes_it_again():
    add.enqueue(1, 2)
    Tube.objects.get(name="tasks.default").truncate()
    Tube.objects.get(name="tasks.default").drop()
    result = add.enqueue(3, 4)
    tube = Tube.objects.get(name="tasks.default")
    assert [result_id_of(t) for t in tube.tasks.all()] == [result.id]
    with transaction.atomic():
        Tube.objects.get(name="tasks.default").truncate()
        Tube.objects.get(name="tasks.default").drop()
        inner = add.enqueue(5, 6)
    assert [result_id_of(t) for t in Tube.objects.get(name="tasks.default").tasks.all()] == [inner.id]


def test_run_after_in_the_past_is_ready_at_once_and_in_the_future_waits():
    past = add.using(run_after=db_now() - dt.timedelta(seconds=5)).enqueue(1, 1)
    future = add.using(run_after=db_now() + dt.timedelta(seconds=300)).enqueue(2, 2)
    tube = Tube.objects.get(name="tasks.default")
    taken = tube.take(0)
    assert taken is not None and result_id_of(taken) == past.id
    assert tube.take(0) is None
    assert add.get_result(future.id).status == TaskResultStatus.READY


def test_a_workers_batch_acknowledges_and_claims_in_one_transaction(monkeypatch):
    tube = Tube.objects.create_tube("batch", "fifottl", ttr=60)
    tube.put_many(range(300))
    first = tube.take_many(100, consumer="w")
    opened = []
    real_atomic = transaction.Atomic.__enter__
    monkeypatch.setattr(transaction.Atomic, "__enter__", lambda self: opened.append(1) or real_atomic(self))
    # As if the worker's due-transition probe interval had passed: the probe is counted too.
    tubes_claiming._due_checks.clear()
    with CaptureQueriesContext(connection) as queries:
        acked, taken = tube.ack_and_take([t.pk for t in first], 100, consumer="w")
    assert acked == 100 and len(taken) == 100
    assert [t.data for t in taken] == list(range(100, 200))
    assert all(t.state == "t" and t.owner == "w" and t.attempts == 1 for t in taken)
    statements = [q["sql"] for q in queries.captured_queries if q["sql"] not in ("BEGIN", "COMMIT")]
    if features("default").modifying_with:
        # PostgreSQL: (probe), then one transaction and in it one round trip: the statement
        # that pins the plans (engine.vendor's pin_plans) leading the text of the one that is
        # the DELETE, the claim and the counters.
        pin = features("default").pin_plans
        assert len(statements) <= 2 and statements[-1].startswith(f"{pin}; WITH"), statements
        assert len(opened) == 1
    else:
        # One transaction: (probe), DELETE, locking read, lease UPDATE (… RETURNING where it
        # exists; MySQL/MariaDB: the locking read reads the rows whole, no read after the
        # UPDATE), the counters' UPDATE.
        sqlite_lock = [sql for sql in statements if "SET rowid = rowid WHERE 0" in sql]
        assert len(statements) - len(sqlite_lock) <= 5, statements
        assert len(opened) == 2  # the batch's transaction and the claim nested in it (no savepoint)
    stats = tube.statistics()
    assert stats["calls"]["ack"] == 100 and stats["calls"]["take"] == 200 and stats["tasks"]["taken"] == 100


@pytest.mark.parametrize("use_tz", [True, False])
def test_a_workers_batch_gives_datetimes_as_the_orm_reads_them(use_tz, settings):
    """The batch claim's rows are read on a cursor of their own (PostgreSQL: psycopg's own
    timestamptz loader) and given Django's time zone when made instances: the same values,
    the same kind of tzinfo (none without USE_TZ), as the ORM reads."""
    settings.USE_TZ = use_tz
    tube = Tube.objects.create_tube(f"zoned-{use_tz}", "fifottl", ttr=60, ttl=600)
    tube.put_many(range(20))

    def check(tasks: list[Task]) -> None:
        assert len(tasks) == 10
        for task in tasks:
            stored = Task.objects.get(pk=task.pk)
            for name in ("created", "event_at", "ttl_at"):
                mine, theirs = getattr(task, name), getattr(stored, name)
                assert mine == theirs and mine.utcoffset() == theirs.utcoffset()
                assert (mine.tzinfo is None) == (not use_tz) and type(mine.tzinfo) is type(theirs.tzinfo)

    first = tube.take_many(10, consumer="w")
    check(first)
    _, taken = tube.ack_and_take([t.pk for t in first], 10, consumer="w")
    check(taken)


@pytest.mark.parametrize("type", ["fifottl", "utubettl"])
def test_taken_tasks_hold_what_the_claim_wrote(type, clock):
    """A take returns its tasks as the claim left them in the table, every column: where the
    database cannot return an UPDATE's rows (MySQL/MariaDB), the locking read computes the
    lease beside the rows and the UPDATE is pinned to that read's clock; a second read must
    not be what makes them agree."""
    tube = Tube.objects.create_tube(f"held-{type}", type, ttr=30, ttl=3600)
    for n in range(40):
        tube.put(n, utube=f"k{n % 20}" if type == "utubettl" else None, ttr=None if n % 3 else 5)
    clock.advance(7)  # the test clock's offset is in the deadline the claim computes
    started = db_now()
    taken = tube.take_many(25, consumer="w")
    assert taken
    fields = [field.attname for field in Task._meta.concrete_fields]
    stored = {task.pk: task for task in Task.objects.filter(pk__in=[task.pk for task in taken])}
    for task in taken:
        assert [getattr(task, name) for name in fields] == [getattr(stored[task.pk], name) for name in fields]
        assert task.state == "t" and task.owner == "w" and task.attempts == 1
        assert started + dt.timedelta(seconds=task.ttr - 1) <= task.event_at <= task.ttl_at
        if type == "utubettl":
            assert task.taken_key == f".{task.utube}"


def test_ack_and_take_on_a_paused_tube_acknowledges_and_takes_nothing():
    tube = Tube.objects.create_tube("paused", "fifo")
    tube.put_many(range(5))
    held = tube.take_many(2, consumer="w")
    tube.pause()
    assert tube.ack_and_take([t.pk for t in held], 2, consumer="w") == (2, [])
    assert tube.ack_and_take([], 0, consumer="w") == (0, [])
    with pytest.raises(ValueError, match="limit"):
        tube.ack_and_take([], -1, consumer="w")
    with pytest.raises(TypeError, match="limit"):
        tube.ack_and_take([], True, consumer="w")


def test_a_queue_s_tube_made_in_a_rolled_back_transaction_is_not_kept():
    """The backend keeps each queue's tube per process; one made inside a transaction that
    rolls back is gone, and SQLite gives its id to the next tube made: the queue's next task
    must not land in that other queue's tube."""
    for name in ("tasks.default", "tasks.slow"):
        if (tube := Tube.objects.filter(name=name).first()) is not None:
            tube.drop()
    with transaction.atomic():
        add.enqueue(0, 0)  # makes tasks.default
        transaction.set_rollback(True)
    slow = add.using(queue_name="slow").enqueue(1, 1)  # makes tasks.slow (SQLite: the same id)
    default = add.enqueue(2, 2)
    by_tube = {t.name: [result_id_of(task) for task in t.tasks.all()] for t in Tube.objects.all()}
    assert by_tube["tasks.slow"] == [slow.id]
    assert by_tube["tasks.default"] == [default.id]
