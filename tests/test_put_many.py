"""``tube.put_many`` (SPEC §7): one put per item, in as few statements as possible, all or nothing."""

from __future__ import annotations

import math

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from django_taskloop.models import Tube

pytestmark = pytest.mark.django_db


def test_put_many_puts_every_item_in_order_with_the_puts_options(django_capture_on_commit_callbacks):
    tube = Tube.objects.create_tube("bulk", "fifottl", ttl=600)
    events = []
    tube.on_task_change(lambda task, event: events.append((task.id, event)))
    try:
        with django_capture_on_commit_callbacks(execute=True):
            tasks = tube.put_many([{"n": n} for n in range(250)], pri=3, ttr=30)
    finally:
        tube.on_task_change(None)  # (a callback left behind would watch the next tube of this id)
    assert [t.data for t in tasks] == [{"n": n} for n in range(250)]
    assert all(t.id for t in tasks) and len({t.id for t in tasks}) == 250
    # Each task has the id of its own row (RETURNING's rows taken in the order of VALUES).
    rows = dict(tube.tasks.values_list("id", "data"))
    assert [rows[t.id] for t in tasks] == [{"n": n} for n in range(250)]
    assert all(t.state == "r" and t.pri == 3 and t.ttr == 30 for t in tasks)
    assert all(t.ttl_at is not None for t in tasks)
    stats = tube.statistics()
    assert stats["tasks"]["ready"] == 250 and stats["calls"]["put"] == 250
    assert [event for _id, event in events] == ["put"] * 250
    assert [tube.take(0).data["n"] for _ in range(3)] == [0, 1, 2]


def test_put_many_with_a_delay_and_a_utube():
    tube = Tube.objects.create_tube("u", "utubettl")
    tasks = tube.put_many(["a", "b"], delay=60, utube="k")
    assert [t.state for t in tasks] == ["~", "~"] and all(t.utube == "k" for t in tasks)
    assert tube.statistics()["tasks"]["delayed"] == 2
    assert tube.put_many([]) == []


def test_put_many_writes_in_few_statements():
    tube = Tube.objects.create_tube("few", "fifo")
    with CaptureQueriesContext(connection) as queries:
        tube.put_many([{"n": n} for n in range(500)])
    # (on PostgreSQL the INSERT is wrapped in a WITH that also sends the NOTIFY)
    inserts = [
        q for q in queries.captured_queries if q["sql"].lstrip().upper().startswith(("INSERT", "WITH"))
    ]
    if connection.vendor == "sqlite":
        assert len(inserts) <= 10, len(inserts)  # Django keeps SQLite's statements under 999 variables
    elif connection.features.can_return_rows_from_bulk_insert:
        assert len(inserts) == 1, len(inserts)  # the tasks, in one statement (no counter)
    if connection.vendor == "postgresql":
        # As Django's compiler writes a bulk insert of plain values there: an array a column,
        # not a VALUES row a task (which cost 3× the server's time and 1.7× the client's).
        assert " SELECT * FROM UNNEST(" in inserts[0]["sql"] and " VALUES " not in inserts[0]["sql"]
    assert len(Tube.objects.get(name="few").tasks.all()) == 500


def test_put_many_of_rows_with_the_database_clock_in_them_keeps_each_rows_own():
    """Delayed tasks carry the database's clock (an expression in the row): no arrays then,
    and every task still gets its own row's id and deadline."""
    tube = Tube.objects.create_tube("clocked", "fifottl")
    tasks = tube.put_many([{"n": n} for n in range(120)], delay=30, ttl=90)
    rows = {row[0]: row[1:] for row in tube.tasks.values_list("id", "data", "event_at", "ttl_at")}
    assert [rows[t.id][0] for t in tasks] == [{"n": n} for n in range(120)]
    assert all((t.event_at, t.ttl_at) == rows[t.id][1:] for t in tasks)
    assert all(t.state == "~" and t.ttl_at > t.event_at for t in tasks)


@pytest.mark.parametrize(
    ("kwargs", "error", "word"),
    [
        ({"items": [{"ok": 1}, math.nan]}, ValueError, "items[1]"),
        ({"items": "abc"}, TypeError, "items"),
        ({"items": [1], "pri": "x"}, TypeError, "pri"),
        ({"items": [1], "ttl": -1}, ValueError, "ttl"),
        ({"items": [1], "delay": math.inf}, ValueError, "delay"),
    ],
)
def test_bad_input_writes_nothing(kwargs, error, word):
    tube = Tube.objects.create_tube("bad", "fifottl")
    with pytest.raises(error, match=word.replace("[", r"\[")):
        tube.put_many(**kwargs)
    assert tube.statistics()["tasks"]["total"] == 0
    assert tube.statistics()["calls"]["put"] == 0


def test_put_many_in_a_rolled_back_transaction_leaves_nothing():
    tube = Tube.objects.create_tube("rb", "fifo")
    with transaction.atomic():
        tube.put_many([1, 2, 3])
        transaction.set_rollback(True)
    assert tube.statistics()["tasks"]["total"] == 0 and tube.statistics()["calls"]["put"] == 0
