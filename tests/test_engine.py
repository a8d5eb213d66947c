"""The engine's clock and transaction helpers on each database."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from django.utils import timezone

from django_taskloop.engine import DbNow, db_now, features
from tests.testapp.models import Ticket

pytestmark = pytest.mark.django_db


def test_db_now_is_aware_and_close_to_wall_clock():
    now = db_now()
    assert timezone.is_aware(now)
    assert abs((now - timezone.now()).total_seconds()) < 5


def test_dbnow_offsets_are_fractional_seconds():
    Ticket.objects.create()
    Ticket.objects.update(lock_expires_at=DbNow(0.25))
    at = Ticket.objects.get().lock_expires_at
    now = db_now()
    assert dt.timedelta(seconds=0.1) < at - now <= dt.timedelta(seconds=0.26)
    Ticket.objects.update(lock_expires_at=DbNow(-3600.5))
    assert 3599 < (now - Ticket.objects.get().lock_expires_at).total_seconds() < 3602


def test_dbnow_compares_in_filters():
    Ticket.objects.create(lock_expires_at=timezone.now() - dt.timedelta(seconds=10))
    Ticket.objects.create(lock_expires_at=timezone.now() + dt.timedelta(seconds=100))
    assert Ticket.objects.filter(lock_expires_at__lte=DbNow()).count() == 1
    assert Ticket.objects.filter(lock_expires_at__lte=DbNow(200)).count() == 2


def test_features_are_decided_per_vendor(vendor):
    f = features("default")
    assert f.vendor == vendor
    assert f.skip_locked is (vendor != "sqlite")
    assert f.write_lock_first is (vendor == "sqlite")


def _task_fields():
    from django.db.models import AutoField

    from django_taskloop.models import Task

    return [f for f in Task._meta.concrete_fields if not isinstance(f, AutoField) and not f.generated]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("offset", [0, 90.5])
def test_a_one_row_insert_sends_the_compilers_statement_and_stores_what_save_would(offset):
    """engine.insert keeps the one-row INSERT it compiled for a shape of row (a put's hot
    path). It must be the statement Django's compiler writes, with the same parameters, and
    leave the same row as ``save()`` — for JSON, NULLs, auto_now_add and DbNow deadlines."""
    from django.db import connection
    from django.db.models.sql import InsertQuery
    from django.test.utils import CaptureQueriesContext

    from django_taskloop import engine
    from django_taskloop.models import Task, Tube

    tube = Tube.objects.create_tube("kept", "fifottl")

    def new(n):
        return Task(
            tube_id=tube.pk, state="~", pri=n, data={"n": n, "s": "é"}, ttl_at=DbNow(offset), event_at=None
        )

    first, second = new(1), new(2)
    compiled = InsertQuery(Task)
    compiled.insert_values(_task_fields(), [new(2)])
    compiler = compiled.get_compiler(using="default")
    compiler.returning_fields = [Task._meta.pk, Task._meta.get_field("ttl_at")]
    ((expected_sql, _),) = compiler.as_sql()
    engine.insert([first], "default", returning=["ttl_at"])  # compiles and keeps
    with CaptureQueriesContext(connection) as queries:
        engine.insert([second], "default", returning=["ttl_at"])  # sends the kept one
    (sent,) = [q["sql"] for q in queries.captured_queries]
    # The captured SQL has the parameters interpolated: compare the statement's text up to them.
    assert sent.split("VALUES")[0] == expected_sql.split("VALUES")[0]
    before = db_now()
    for task in (first, second):
        stored = Task.objects.get(pk=task.pk)
        assert (stored.tube_id, stored.state, stored.pri, stored.data) == (tube.pk, "~", task.pri, task.data)
        assert stored.utube is None and stored.event_at is None and stored.attempts == 0
        assert stored.ttl_at == task.ttl_at  # read back with the statement, as stored
        assert timezone.is_aware(task.ttl_at)
        assert dt.timedelta(seconds=offset - 30) < task.ttl_at - before <= dt.timedelta(seconds=offset + 1)
        assert stored.created == task.created and abs((stored.created - before).total_seconds()) < 30
    saved = new(3)
    saved.ttl_at = None
    saved.save()
    inserted = new(3)
    inserted.ttl_at = None
    engine.insert([inserted], "default")
    a, b = Task.objects.get(pk=saved.pk), Task.objects.get(pk=inserted.pk)
    assert [getattr(a, f.attname) for f in _task_fields() if f.name != "created"] == [
        getattr(b, f.attname) for f in _task_fields() if f.name != "created"
    ]


@pytest.mark.django_db(transaction=True)
def test_a_one_row_insert_with_another_expression_goes_through_the_compiler():
    from django.db.models import Value

    from django_taskloop import engine
    from django_taskloop.models import Task, Tube

    tube = Tube.objects.create_tube("expr", "fifo")
    task = Task(tube_id=tube.pk, state="r", pri=Value(7), data=None)
    engine.insert([task], "default")
    assert Task.objects.get(pk=task.pk).pri == 7


@pytest.mark.django_db(transaction=True)
def test_insert_together_writes_all_rows_or_none():
    """The Django Task enqueue's two rows: one statement on PostgreSQL, one transaction
    elsewhere. A failing row (a tube that is gone) leaves the other unwritten too."""
    from django.db import IntegrityError

    from django_taskloop import engine
    from django_taskloop.models import Task, TaskRecord, Tube

    tube = Tube.objects.create_tube("together", "fifottl", ttl=60)
    record = TaskRecord(backend="default", queue_name="q", task_path="x.y", enqueued_at=DbNow())
    task = Task(tube_id=tube.pk, state="r", data={"result": record.id}, ttl_at=DbNow(60))
    engine.insert_together([record, task], "default", returning=[["enqueued_at"], ["ttl_at"]])
    assert TaskRecord.objects.get(pk=record.pk).enqueued_at == record.enqueued_at
    assert Task.objects.get(pk=task.pk).ttl_at == task.ttl_at
    assert dt.timedelta(seconds=59) < task.ttl_at - record.enqueued_at < dt.timedelta(seconds=61)
    lost = TaskRecord(backend="default", queue_name="q", task_path="x.y", enqueued_at=DbNow())
    orphan = Task(tube_id=tube.pk + 1000, state="r", data={"result": lost.id})
    with pytest.raises(IntegrityError):
        engine.insert_together([lost, orphan], "default", returning=[["enqueued_at"], []])
    assert not TaskRecord.objects.filter(pk=lost.pk).exists()
    assert Task.objects.count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path", ["kept", "compiler"])
def test_insert_only_if_writes_only_while_the_guard_row_exists(path):
    """``only_if``: the INSERT itself checks that a row still exists (one statement, kept or
    built by the compiler), and writes nothing and says so when it is gone."""
    from django.db import connection, transaction
    from django.db.models import Value
    from django.test.utils import CaptureQueriesContext

    from django_taskloop import engine
    from django_taskloop.models import Task, Tube

    tube = Tube.objects.create_tube("guarded", "fifottl")
    gone = Tube.objects.create_tube("guard-gone", "fifottl")
    Tube.objects.filter(pk=gone.pk).delete()

    def new(tube_id):
        return Task(tube_id=tube_id, state="r", pri=Value(3) if path == "compiler" else 3, data={"n": 1})

    with transaction.atomic():
        kept = new(tube.pk)
        with CaptureQueriesContext(connection) as queries:
            assert engine.insert([kept], "default", returning=["ttl_at"], only_if=tube) is True
        if path == "kept":
            assert len(queries.captured_queries) == 1, queries.captured_queries
        # A task for a dropped tube: nothing written, the transaction goes on.
        orphan = new(gone.pk)
        assert engine.insert([orphan], "default", only_if=gone) is False
        assert orphan.pk is None
    assert list(Task.objects.values_list("pk", "tube_id", "pri")) == [(kept.pk, tube.pk, 3)]
    with pytest.raises(ValueError, match="one row"):
        engine.insert([new(tube.pk), new(tube.pk)], "default", only_if=tube)


@pytest.mark.django_db(transaction=True)
def test_insert_together_only_if_writes_no_row_when_the_guard_is_gone():
    from django.db import transaction

    from django_taskloop import engine
    from django_taskloop.models import Task, TaskRecord, Tube

    tube = Tube.objects.create_tube("together-guarded", "fifottl")
    record = TaskRecord(backend="default", queue_name="q", task_path="x.y", enqueued_at=DbNow())
    task = Task(tube_id=tube.pk, state="r", data={"result": record.id})
    assert engine.insert_together([record, task], "default", returning=[["enqueued_at"], []], only_if=tube)
    lost = TaskRecord(backend="default", queue_name="q", task_path="x.y", enqueued_at=DbNow())
    orphan = Task(tube_id=tube.pk, state="r", data={"result": lost.id})
    Task.objects.all().delete()
    Tube.objects.filter(pk=tube.pk).delete()
    with transaction.atomic():
        assert not engine.insert_together(
            [lost, orphan], "default", returning=[["enqueued_at"], []], only_if=tube
        )
        assert TaskRecord.objects.count() == 1  # the transaction is usable: nothing was written
    assert list(TaskRecord.objects.values_list("pk", flat=True)) == [record.pk]
    assert Task.objects.count() == 0


# One retry layer (issue 26, item 2) ------------------------------------------------------------


def _retryable_error():
    """A deadlock/lock error as this database's driver reports it (engine.is_retryable)."""
    from django.db import OperationalError, connection

    if connection.vendor == "mysql":
        return OperationalError(1213, "Deadlock found when trying to get lock")
    error = OperationalError("database is locked")
    error.sqlstate = "40P01"  # PostgreSQL's deadlock_detected
    return error


@pytest.mark.django_db(transaction=True)
def test_a_deadlock_in_nested_work_is_retried_once_per_try_by_the_outermost_transaction(settings):
    """A DatabaseBusy raised by work nested inside (an inner run_in_transaction, which never
    retries) is retried by the outermost one, the one layer that replays the whole
    transaction: RETRIES + 1 tries in all, and the message counts them."""
    from django.db import transaction

    from django_taskloop.engine import run_in_transaction
    from django_taskloop.exceptions import DatabaseBusy

    settings.TASKLOOP = {"RETRIES": 2}
    tries = []

    def inner():
        raise _retryable_error()

    def outer():
        tries.append(1)
        return run_in_transaction(Ticket, "default", inner)

    with pytest.raises(DatabaseBusy, match="after 3 tries"):
        run_in_transaction(Ticket, "default", outer)
    assert len(tries) == 3
    # Inside a caller's transaction nothing is retried, and the message says whose it is.
    tries.clear()
    with pytest.raises(DatabaseBusy, match="inside the caller's transaction") as busy:
        with transaction.atomic():
            run_in_transaction(Ticket, "default", outer)
    assert "tries" not in str(busy.value)
    assert len(tries) == 1


@pytest.mark.django_db(transaction=True)
def test_the_database_under_test_reads_reachable_on_a_fresh_connection():
    """``engine.reach.unreachable`` (the workers' look at a database after an error) on a
    server that works: ``None``. (A plain MariaDB reads ``wsrep_ready`` OFF: only a Galera node,
    ``wsrep_on`` ON, is asked whether it is ready; every MariaDB read unreachable before.)"""
    from django.db import connection

    from django_taskloop.engine.reach import unreachable

    connection.close()
    assert unreachable("default") is None
    assert connection.connection is not None  # left open for the next use


@pytest.mark.parametrize("use_tz", [True, False])
def test_rows_made_into_instances_hold_what_the_orm_reads(use_tz, settings):
    """The claim's own conversion of rows (a column at a time, the backends' datetime
    converters done in one pass) gives every column what the ORM's iterator gives it."""
    from django.db import connection

    from django_taskloop.engine import compiler
    from django_taskloop.models import Task, Tube

    settings.USE_TZ = use_tz
    tube = Tube.objects.create_tube("converted", "fifottl", ttr=30)
    for n in range(5):
        tube.put({"n": n, "at": [n, None]}, delay=n or None, ttl=None if n == 2 else 600)
    queryset = Task.objects.filter(tube=tube).order_by("pk")
    select = queryset.query.get_compiler(using="default")
    sql, params = select.as_sql()
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    made = compiler.Instances(Task, select).make("default", rows)
    names = [field.attname for field in Task._meta.concrete_fields]
    read = list(queryset)
    assert [[getattr(obj, name) for name in names] for obj in made] == [
        [getattr(obj, name) for name in names] for obj in read
    ]
    moments = [obj.created for obj in made] + [obj.event_at for obj in made if obj.event_at]
    assert moments and all(timezone.is_aware(m) == use_tz for m in moments)
    assert any(obj.ttl_at is None for obj in made) and any(obj.ttl_at is not None for obj in made)


class _Decoder(json.JSONDecoder):
    def __init__(self, **kwargs):
        super().__init__(object_hook=lambda found: {"decoded": found}, **kwargs)


@pytest.mark.parametrize("decoder", [None, _Decoder])
def test_a_json_column_converted_at_once_holds_what_from_db_value_gives(decoder):
    """convert_rows reads a JSONField's column with json's scanner, not from_db_value per
    value: every value, odd ones too (whitespace, text that is no JSON, bytes, NULL), comes
    out as from_db_value makes it, and a field with a decoder of its own keeps it."""
    from django.db import connection, models

    from django_taskloop.engine import compiler

    field = models.JSONField(decoder=decoder)
    field.set_attributes_from_name("data")
    texts = ['{"a": [1, 2.5, null]}', '"s"', "null", "17", " 1", "1 ", "not json", "[1,", "NaN", '{"a": 1}x']
    raw = [*texts, b'{"b": 2}', None]
    col = object()  # (a Col; from_db_value looks only for a KeyTransform)
    rows = [(n, value) for n, value in enumerate(raw)]
    converted = compiler.convert_rows(rows, [(1, [field.from_db_value], col)], connection)
    assert converted == [[n, field.from_db_value(value, col, connection)] for n, value in rows]
    assert converted[0][1] == (
        {"a": [1, 2.5, None]} if decoder is None else {"decoded": {"a": [1, 2.5, None]}}
    )
    assert converted[6][1] == "not json" and converted[11][1] is None


@pytest.mark.parametrize("use_tz", [True, False])
def test_a_datetime_column_converted_at_once_holds_what_the_backend_gives(use_tz, settings):
    """convert_rows reads a DateTimeField's column as the backend's own converter reads each
    value (SQLite: the text parsed, the values given the connection's time zone; MySQL: made
    aware): odd texts too (no microseconds, a few digits of them, an offset, a T), and NULL.
    On SQLite the kept claim's RETURNING hands it the text (see compiler.returning)."""
    import datetime as dt

    from django.db import connection

    from django_taskloop.engine import compiler
    from django_taskloop.models import Task

    settings.USE_TZ = use_tz
    field = Task._meta.get_field("created")
    col = field.get_col(Task._meta.db_table)
    funcs = field.get_db_converters(connection) + connection.ops.get_db_converters(col)
    if connection.vendor == "sqlite":
        raw: list[Any] = [
            "2026-12-07 16:56:29.497454",
            "2026-12-07 16:56:29",
            "2026-12-07 16:56:29.5",
            "2026-12-07T16:56:29.000001",
            "2026-12-07 16:56:29.497454+00:00",
            None,
        ]
    else:
        raw = [dt.datetime(2026, 12, 7, 16, 56, 29, 497454), dt.datetime(2026, 12, 7), None]
    rows = [(n, value) for n, value in enumerate(raw)]
    converted = compiler.convert_rows(rows, [(1, funcs, col)], connection)

    def one_by_one(value: Any) -> Any:
        for func in funcs:
            value = func(value, col, connection)
        return value

    assert converted == [[n, one_by_one(value)] for n, value in rows]
    assert [type(row[1]) for row in converted[:-1]] == [dt.datetime] * (len(raw) - 1)
    if use_tz and connection.vendor != "postgresql":  # (psycopg gives them aware, no converter)
        assert all(row[1].utcoffset() is not None for row in converted[:-1])
