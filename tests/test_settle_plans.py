"""A worker's statements stay off the claim index's "taken" range (issue 30): a transaction
held open elsewhere fills it with dead entries (118,000 buffers against 107 measured).

- Settles (ack, touch, release) find their rows by primary key: with few tasks taken among
  many ready, planners would otherwise read that range, and the acknowledgement cost more than
  the claim.
- The once-a-second look for a dead consumer's tasks reads the consumers first, and looks at
  the taken tasks only when one is dead (usually none is): a take reads them on their own, an
  idle poll asks first within its one statement."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_taskloop import engine
from django_taskloop.models import Consumer, Task, Tube
from django_taskloop.models.tubes import claiming as tubes_claiming
from django_taskloop.models.tubes import core as tubes_core
from django_taskloop.models.tubes import worth_trying

pytestmark = [pytest.mark.django_db, pytest.mark.xdist_group("settle-plans")]

READY, TAKEN = 20_000, 50


def explain(sql: str) -> str:
    """The plan of a captured statement (its parameters are inline in the captured text)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("ANALYZE taskloop_task")
            cursor.execute(f"EXPLAIN {sql}")
        elif connection.vendor == "mysql":
            cursor.execute(f"EXPLAIN {sql}")
            names = [col[0].lower() for col in cursor.description]
            # The index chosen (not those possible).
            return "\n".join(f"key={dict(zip(names, row, strict=True))['key']}" for row in cursor.fetchall())
        else:
            cursor.execute(f"EXPLAIN QUERY PLAN {sql}")
        return "\n".join(" ".join(str(col) for col in row) for row in cursor.fetchall())


def settle_statement(tube: Tube, call: Any, verb: str = "DELETE") -> str:
    with CaptureQueriesContext(connection) as queries:
        call()
    (sql,) = [
        q["sql"]
        for q in queries.captured_queries
        # Not the counters, nor SQLite's write lock (UPDATE … WHERE 0).
        if q["sql"].startswith(("WITH", verb)) and "taskloop_task" in q["sql"] and "WHERE 0" not in q["sql"]
    ]
    return sql


def assert_by_primary_key(plan: str) -> None:
    if connection.vendor == "postgresql":
        delete = plan.split("CTE c")[0]  # ack_and_take: the DELETE's part of the WITH
        assert "taskloop_task_pkey" in delete, plan
        assert "taskloop_task_claim" not in delete, plan
    elif connection.vendor == "mysql":
        assert plan == "key=PRIMARY", plan
    else:
        assert "PRIMARY KEY" in plan and "taskloop_task_claim" not in plan, plan


@pytest.fixture(scope="module")
def _busy_rows(django_db_setup: Any, django_db_blocker: Any) -> Iterator[tuple[int, list[int]]]:
    """20,000 ready tasks and 50 taken, written once for the module (a plan needs a table of
    some size; each test's own changes are rolled back with its transaction). The module's tests
    run in one process, one after another (``xdist_group`` above)."""
    with django_db_blocker.unblock():
        # Unwatched: a callback another test left on a tube of the same id (SQLite reuses ids)
        # would send each task's settle on its own.
        tubes_core._callbacks.clear()
        tube = Tube.objects.create_tube("settle-plans", "fifottl")
        for start in range(0, READY, 5_000):
            tube.put_many(list(range(start, start + 5_000)))
        taken = [task.pk for task in tube.take_many(TAKEN, consumer="w1")]
    yield tube.pk, taken
    with django_db_blocker.unblock():
        tube.release_many(taken, consumer="w1")
        tube.drop()
        Consumer.objects.filter(name="w1").delete()


@pytest.fixture
def busy_tube(_busy_rows: tuple[int, list[int]], db: Any) -> Iterator[tuple[Tube, list[int]]]:
    tubes_core._callbacks.clear()
    # Alive, as just after its take (the rows may have been written a while ago).
    Consumer.objects.filter(name="w1").update(last_seen=engine.DbNow())
    pk, taken = _busy_rows
    yield Tube.objects.get(pk=pk), taken
    tubes_core._callbacks.clear()


def test_ack_many_deletes_by_primary_key(busy_tube):
    tube, taken = busy_tube
    sql = settle_statement(tube, lambda: tube.ack_many(taken, consumer="w1"))
    assert_by_primary_key(explain(sql))


def test_ack_and_take_deletes_by_primary_key(busy_tube):
    tube, taken = busy_tube
    sql = settle_statement(tube, lambda: tube.ack_and_take(taken, 50, consumer="w1"))
    assert_by_primary_key(explain(sql))


def test_touch_many_updates_by_primary_key(busy_tube):
    tube, taken = busy_tube
    sql = settle_statement(tube, lambda: tube.touch_many(taken, 30, consumer="w1"), "UPDATE")
    assert_by_primary_key(explain(sql))


def test_release_many_reads_by_primary_key(busy_tube):
    tube, taken = busy_tube
    sql = settle_statement(tube, lambda: tube.release_many(taken, consumer="w1"), "SELECT")
    assert_by_primary_key(explain(sql))


def test_a_watched_tubes_settles_go_by_primary_key_too(busy_tube):
    """With a callback (each change told as it happens) the settles read each task and then
    write them: by key as well."""
    tube, taken = busy_tube
    tube.on_task_change(lambda task, event: None)
    sql = settle_statement(tube, lambda: tube.ack_many(taken[:10], consumer="w1"))
    assert_by_primary_key(explain(sql))
    sql = settle_statement(tube, lambda: tube.release_many(taken[10:20], consumer="w1"), "UPDATE")
    assert_by_primary_key(explain(sql))


def test_the_settle_still_checks_what_it_deletes(busy_tube):
    """Found by key, checked on the row: another consumer's tasks, another tube's and ready
    ones are left alone."""
    tube, taken = busy_tube
    other = Tube.objects.create_tube("settle-plans-other", "fifottl")
    other.put_many([1, 2])
    elsewhere = [task.pk for task in other.take_many(2, consumer="w1")]
    rival = [task.pk for task in tube.take_many(3, consumer="w2")]
    ready = list(Task.objects.filter(tube=tube, state="r").values_list("pk", flat=True)[:3])
    assert tube.ack_many([*taken[:5], *elsewhere, *rival, *ready], consumer="w1") == 5
    assert Task.objects.filter(tube=other).count() == 2
    assert Task.objects.filter(pk__in=rival + ready).count() == 6
    acked, more = tube.ack_and_take([*taken[5:10], *elsewhere, *rival], 1, consumer="w1")
    assert (acked, len(more)) == (5, 1)
    assert Task.objects.filter(tube=other).count() == 2
    assert Task.objects.filter(pk__in=rival).count() == 3
    # Touch and release likewise leave what is not this consumer's in this tube alone.
    mine = [task.pk for task in more]
    assert tube.touch_many([*mine, *elsewhere, *rival], 30, consumer="w1") == 1
    assert tube.release_many([*mine, *elsewhere, *rival], consumer="w1") == 1
    assert Task.objects.filter(pk__in=elsewhere + rival, state="t").count() == 5


def test_no_dead_consumer_no_look_at_the_taken_tasks(busy_tube, settings):
    """A take: the consumers are read first, on their own, and the taken tasks not at all."""
    settings.TASKLOOP = {**settings.TASKLOOP, "CONSUMER_TIMEOUT": 60}
    tube, taken = busy_tube
    tubes_claiming._stale_checks.clear()  # as if a second had passed since this process looked
    with CaptureQueriesContext(connection) as queries:
        tube.take_many(5, consumer="w1")
    seen = [q["sql"] for q in queries.captured_queries]
    assert any("taskloop_consumer" in sql and "last_seen" in sql and "SELECT" in sql for sql in seen), seen
    assert not any("taskloop_consumer" in sql and "taskloop_task" in sql for sql in seen), seen


@pytest.mark.vendors("postgresql")  # what runs: PostgreSQL's EXPLAIN ANALYZE
def test_an_idle_poll_looks_at_the_taken_tasks_only_past_a_dead_consumer(busy_tube, settings):
    """The idle poll (one read for every tube) asks for a dead consumer first, in the same
    statement: with none, the look at the taken tasks is never executed."""
    settings.TASKLOOP = {**settings.TASKLOOP, "CONSUMER_TIMEOUT": 60}
    tube, taken = busy_tube
    tubes_claiming._stale_checks.clear()
    with CaptureQueriesContext(connection) as queries:
        assert worth_trying([tube]) == {tube.pk: "ready"}
    (sql,) = [q["sql"] for q in queries.captured_queries if "taskloop_consumer" in q["sql"]]
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, COSTS OFF) {sql}")
        plan = [row[0] for row in cursor.fetchall()]
    taken_scans = [line for line in plan if "'t'::text" in line or "= 't'" in line]
    assert taken_scans, plan
    # The node that reads the taken range, and what it sits under: never run.
    at = next(i for i, line in enumerate(plan) if "Index Cond" in line and "'t'" in line)
    assert "never executed" in plan[at - 1], "\n".join(plan)


def test_a_dead_consumers_tasks_are_still_found(busy_tube, settings):
    settings.TASKLOOP = {**settings.TASKLOOP, "CONSUMER_TIMEOUT": 60}
    tube, taken = busy_tube
    Consumer.objects.filter(name="w1").update(last_seen="2000-01-01T00:00:00Z")
    tubes_claiming._stale_checks.clear()
    assert worth_trying([tube]) == {tube.pk: "due"}
    tubes_claiming._stale_checks.clear()
    tube.take_many(1, consumer="w2")  # its tidy gives w1's tasks back first
    assert not Task.objects.filter(pk__in=taken, owner="w1").exists()


def test_the_claim_index_is_split_by_readiness_where_indexes_can_be_partial():
    """Ready tasks in the claim index, the others in ``taskloop_task_state``: a settle's filter
    (owner and keys) implies neither predicate. MySQL/MariaDB have no partial indexes: one
    whole claim index there, and no second index to write."""
    with connection.cursor() as cursor:
        indexes = connection.introspection.get_constraints(cursor, "taskloop_task")
        if connection.vendor == "postgresql":
            cursor.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'taskloop_task'")
            definitions = dict(cursor.fetchall())
        elif connection.vendor == "sqlite":
            cursor.execute(
                "SELECT name, sql FROM sqlite_master WHERE tbl_name = 'taskloop_task' AND type = 'index'"
            )
            definitions = dict(cursor.fetchall())
    assert indexes["taskloop_task_claim"]["columns"] == ["tube_id", "state", "pri", "id"]
    if connection.vendor == "mysql":
        assert "taskloop_task_state" not in indexes
        return
    assert indexes["taskloop_task_state"]["columns"] == ["tube_id", "state", "pri", "id"]
    claim, rest = definitions["taskloop_task_claim"], definitions["taskloop_task_state"]
    assert re.search(r"WHERE \(?\(?\"?state\"?\)?(::text)? = 'r'", claim), claim
    assert re.search(r"WHERE \(?NOT \(?\(?\"?state\"?\)?(::text)? = 'r'", rest), rest
