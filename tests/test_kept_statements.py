"""A worker's batch sends statements compiled once and kept (engine.claim(key=...),
engine.delete_pks, engine.add_to): they must do exactly what the ORM's statements did.

The claim is one ``UPDATE … WHERE pk IN (SELECT … LIMIT n FOR UPDATE SKIP LOCKED) RETURNING``
on PostgreSQL and SQLite; MariaDB (no ``UPDATE … RETURNING``) keeps the locking read.
"""

from __future__ import annotations

import importlib
import re

import pytest
from django.db import DatabaseError, IntegrityError, connection, connections, transaction
from django.db.models import Q, signals
from django.db.transaction import TransactionManagementError
from django.test.utils import CaptureQueriesContext

from django_taskloop import engine
from django_taskloop.models import Task, Tube, TubeStat
from django_taskloop.models.tubes import claiming as tubes_claiming
from django_taskloop.models.tubes.definitions import TAKE_ORDER

from .conftest import race

# (engine.claim is the function; these are the modules.)
kept = importlib.import_module("django_taskloop.engine.kept")
claim_module = importlib.import_module("django_taskloop.engine.claim")

pytestmark = pytest.mark.django_db(transaction=True)


def _sql(queries: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in queries.captured_queries]


def test_a_worker_batch_is_one_statement_on_postgresql_and_three_on_sqlite(vendor):
    tube = Tube.objects.create_tube("batch", "fifottl", ttr=60)
    tube.put_many(list(range(30)))
    first = tube.take_many(10, consumer="w")
    tube.ack_and_take([t.pk for t in first], 10, consumer="w")  # warm: statements kept
    held = [t.pk for t in Task.objects.filter(state="t")]
    tubes_claiming._due_checks.clear()  # as if the worker's due-timer probe interval had passed
    with CaptureQueriesContext(connection) as queries:
        acked, taken = tube.ack_and_take(held, 10, consumer="w")
    # (Django 5.2 captures BEGIN and COMMIT, 6.x not: the transaction is counted apart.)
    sent = [s for s in _sql(queries) if not s.startswith("SELECT 1 AS")]
    assert acked == 10 and len(taken) == 10
    assert sent.count("BEGIN") <= 1 and sent.count("COMMIT") <= 1
    statements = [s for s in sent if s not in ("BEGIN", "COMMIT")]
    kinds = [s.split()[0].upper() for s in statements]
    if vendor == "mysql":
        # No UPDATE … RETURNING: lock, update, read back, as before.
        assert kinds[0] == "DELETE" and "UPDATE" in kinds
        return
    if vendor == "postgresql":
        # One statement, the DELETE, the claim and the counters as WITH parts, led in the same
        # text (one round trip) by the one that pins their plans (engine.vendor's pin_plans).
        lead = engine.features("default").pin_plans + "; "
        assert len(statements) == 1 and statements[0].startswith(f"{lead}WITH"), statements
        claim = statements[0][len(lead) :]
        assert "DELETE FROM" in claim and 'UPDATE "taskloop_tube_stat"' in claim
        assert "SKIP LOCKED" in claim
    else:
        assert kinds == ["DELETE", "UPDATE", "UPDATE"], statements
        claim = statements[1]
    # PostgreSQL updates the locked rows by address (engine.compiler.by_row_address).
    found = " = ANY(ARRAY(SELECT " if vendor == "postgresql" else " IN (SELECT "
    assert "RETURNING" in claim and found in claim and "LIMIT 10" in claim
    # What the batch did is counted.
    calls = tube.statistics()["calls"]
    assert (calls["take"], calls["ack"]) == (30, 20)


def test_a_worker_s_batch_of_one_task_is_the_statements_of_a_batch_of_many(vendor):
    """A worker whose handler runs longer than its batch_time claims one task at a time, and
    each claim of one is the kept claim a batch of many is (it took the ORM's candidate read,
    locking read and UPDATE, built anew each time: 3-4x the round trips, 3-7x the client CPU)."""
    tube = Tube.objects.create_tube("one", "fifottl", ttr=60)
    tube.put_many(list(range(10)))
    held = [t.pk for t in tube.take_many(1, consumer="w")]
    sent = {}
    for limit in (1, 1, 3):  # (the first of each: compiled, then kept)
        tubes_claiming._due_checks.clear()
        with CaptureQueriesContext(connection) as queries:
            acked, taken = tube.ack_and_take(held, limit, consumer="w")
        assert (acked, len(taken)) == (len(held), limit)
        assert [t.pk for t in taken] == sorted(t.pk for t in taken) and {t.owner for t in taken} == {"w"}
        held = [t.pk for t in taken]
        statements = [
            s for s in _sql(queries) if s not in ("BEGIN", "COMMIT") and not s.startswith("SELECT 1 AS")
        ]
        # (The limit is a parameter: the same texts, whatever it is.)
        sent[limit] = [re.sub(r"\d+", "n", re.sub(r"IN \([^)]*\)|'\{[^}]*\}'", "…", s)) for s in statements]
    assert sent[1] == sent[3], sent
    assert len(sent[1]) == (1 if vendor == "postgresql" else 3 if vendor == "sqlite" else 4), sent[1]


def test_the_kept_claim_returns_the_rows_as_stored_in_claim_order():
    tube = Tube.objects.create_tube("order", "fifottl", ttl=600, ttr=30)
    for n, pri in enumerate([5, 1, 3, 1, 0, 5, 2]):
        tube.put({"n": n, "nested": [n, None]}, pri=pri)
    for _ in range(2):  # the first claim compiles the statement, the second uses it kept
        taken = tube.take_many(3, consumer="w")
        assert [(t.pri, t.pk) for t in taken] == sorted((t.pri, t.pk) for t in taken)
        for task in taken:
            stored = Task.objects.get(pk=task.pk)
            for field in Task._meta.concrete_fields:
                assert getattr(task, field.attname) == getattr(stored, field.attname), field.name
            assert task._state.adding is False and task._state.db == "default"
            assert task.tube == tube and task.owner == "w" and task.attempts == 1
            assert task.event_at is not None and task.event_at.tzinfo is not None
    pris = [t.pri for t in Task.objects.filter(state="t").order_by("pri", "id")]
    assert pris == [0, 1, 1, 2, 3, 5]


def test_kept_statements_are_per_consumer_whatever_the_limit():
    tube = Tube.objects.create_tube("who", "fifo")
    tube.put_many(list(range(20)))
    a = tube.take_many(3, consumer="a")
    b = tube.take_many(3, consumer="b")
    a2 = tube.take_many(5, consumer="a")
    assert (len(a), len(b), len(a2)) == (3, 3, 5)
    owners = dict(Task.objects.filter(state="t").values_list("pk", "owner"))
    assert {owners[t.pk] for t in a + a2} == {"a"} and {owners[t.pk] for t in b} == {"b"}
    # A consumer's kept acknowledgement never removes another's tasks.
    assert tube.ack_many([t.pk for t in b], consumer="a") == 0
    assert tube.ack_many([t.pk for t in a], consumer="a") == 3
    assert tube.ack_many([t.pk for t in b], consumer="b") == 3
    assert Task.objects.count() == 20 - 6
    assert tube.statistics()["calls"]["take"] == 11


def test_a_claim_is_compiled_once_whatever_its_limit(monkeypatch, vendor):
    """A worker's claim grows from one item to its batch (and follows its handler's measured
    time): its limit is a parameter of the one kept statement, not a statement per limit (each
    compiled by the ORM, a few milliseconds, and filling the kept statements)."""
    tube = Tube.objects.create_tube("limits", "fifottl", ttr=60)
    tube.put_many(list(range(60)))
    built = []
    for kind in (kept.ClaimStatement, kept.LockedClaimStatement):
        build = kind.build.__func__

        def counting(cls, *args, _build=build, **kwargs):
            statement = _build(cls, *args, **kwargs)
            built.append(cls.__name__)
            return statement

        monkeypatch.setattr(kind, "build", classmethod(counting))
    batches = []
    monkeypatch.setattr(
        claim_module, "_delete_and_claim_sql", _counting(claim_module._delete_and_claim_sql, batches)
    )
    kept._kept.clear()
    taken = []
    for limit in (1, 2, 3, 5):  # (a claim of one row is the same kept claim)
        taken += tube.take_many(limit, consumer="w")
    held = [t.pk for t in taken]
    for limit in (4, 6, 9, 13):
        acked, more = tube.ack_and_take(held, limit, consumer="w")
        assert (acked, len(more)) == (len(held), limit)
        taken += more
        held = [t.pk for t in more]
    # Best first, batch after batch, and every one taken once.
    assert [t.pk for t in taken] == sorted(t.pk for t in taken)
    assert len(taken) == 11 + 32 and Task.objects.filter(state="t").count() == 13
    assert len(built) == 1, built
    assert len(batches) == (1 if vendor == "postgresql" else 0), batches


def _counting(func, calls):
    def counted(*args, **kwargs):
        calls.append(args)
        return func(*args, **kwargs)

    return counted


def test_a_kept_claim_honours_ttl_and_utube_like_the_orm_claim(clock):
    ttl = Tube.objects.create_tube("ttl", "fifottl")
    ttl.put("old", ttl=60)
    ttl.put("young", ttl=600)
    clock.advance(30)
    assert ttl.statistics()["tasks"]["ready"] == 2
    clock.advance(31)
    for _ in range(2):
        assert [t.data for t in ttl.take_many(5, consumer="w")] in (["young"], [])
    ut = Tube.objects.create_tube("ut", "utube")
    ut.put_many(["a1", "a2"], utube="a")
    ut.put_many(["b1"], utube="b")
    assert sorted(t.data for t in ut.take_many(5, consumer="w")) == ["a1", "b1"]


def test_init_signal_listeners_still_hear_claimed_instances():
    tube = Tube.objects.create_tube("heard", "fifo")
    tube.put_many([1, 2])
    heard = []

    def listener(sender, instance, **kwargs):
        heard.append(instance.pk)

    signals.post_init.connect(listener, sender=Task)
    try:
        taken = tube.take_many(2, consumer="w")
    finally:
        signals.post_init.disconnect(listener, sender=Task)
    assert sorted(heard) == sorted(t.pk for t in taken)


def test_a_put_task_is_the_instance_task_init_would_make_and_listeners_still_hear_it():
    """put builds its unsaved task without ``Task.__init__`` when nobody listens for the init
    signals: the same values and state as ``Task(...)``, and a listener still hears it."""
    tube = Tube.objects.create_tube("made", "utubettl", ttr=30, pri=2)
    task = tube.put({"n": 1}, utube="k", ttl=60)
    made = Task(tube_id=tube.pk, data={"n": 1}, utube="k", pri=2, ttr=30)
    fields = ["tube_id", "data", "utube", "pri", "ttr", "state"]
    assert [getattr(task, name) for name in fields] == [getattr(made, name) for name in fields]
    assert task._state.adding is False and task._state.db == "default"  # (saved by the put)
    assert Task.objects.get(pk=task.pk).data == {"n": 1}
    heard = []

    def listener(sender, instance, **kwargs):
        heard.append(instance.data)

    signals.post_init.connect(listener, sender=Task)
    try:
        heard_task = tube.put({"n": 2}, utube="k")
    finally:
        signals.post_init.disconnect(listener, sender=Task)
    assert heard == [{"n": 2}] and heard_task.pk > task.pk


def test_a_kept_claim_makes_its_task_instances_after_the_commit(vendor):
    """Turning a batch's rows into Task instances costs more than the claim statement: it
    happens once the transaction has committed (on SQLite no other writer waits for it)."""
    tube = Tube.objects.create_tube("after", "fifottl", ttr=60)
    tube.put_many([{"n": n} for n in range(12)])
    made_in_transaction = []

    def listener(sender, instance, **kwargs):
        made_in_transaction.append(connection.in_atomic_block)

    first = tube.take_many(4, consumer="w")
    signals.post_init.connect(listener, sender=Task)
    try:
        taken = tube.take_many(4, consumer="w")  # the kept statement
        acked, more = tube.ack_and_take([t.pk for t in first + taken], 4, consumer="w")
    finally:
        signals.post_init.disconnect(listener, sender=Task)
    assert [t.data for t in taken] == [{"n": n} for n in range(4, 8)]
    assert acked == 8 and [t.data for t in more] == [{"n": n} for n in range(8, 12)]
    assert len(made_in_transaction) == 8
    if vendor != "mysql":  # MariaDB has no UPDATE … RETURNING: the ORM's claim reads them back
        assert not any(made_in_transaction)


def test_claim_later_gives_the_same_rows_as_instances_made_once():
    tube = Tube.objects.create_tube("later", "fifo")
    tube.put_many(list(range(6)))
    tasks = tube.tasks.all()
    kwargs = {
        "claimable": tube._claimable(),
        "order_by": list(TAKE_ORDER),
        "changes": {"state": "t", "owner": "w"},
        "fetch": True,
    }
    for direct, key in ((True, ("later-test", "kept")), (False, None)):
        claimed = engine.claim(tasks, limit=3, direct=direct, key=key, later=True, **kwargs)
        assert isinstance(claimed, engine.Claimed) and len(claimed) == 3
        objs = claimed.instances()
        assert claimed.instances() is objs
        assert [t.owner for t in objs] == ["w"] * 3
        assert [t.pk for t in objs] == sorted(t.pk for t in objs)
    assert sorted(Task.objects.filter(owner="w").values_list("data", flat=True)) == list(range(6))
    assert (
        len(engine.claim(tasks, limit=3, direct=True, key=("later-test", "kept"), later=True, **kwargs)) == 0
    )


def test_delete_pks_deletes_only_the_filtered_rows_and_keeps_filters_apart():
    tube = Tube.objects.create_tube("del", "fifo")
    tasks = tube.put_many(list(range(6)))
    ids = [t.pk for t in tasks]
    Task.objects.filter(pk__in=ids[:3]).update(state="t", owner="x")
    rows = Task.objects.filter(tube_id=tube.pk)
    assert engine.delete_pks(rows, ids, where=lambda: Q(owner="y"), key=("t", "y")) == 0
    assert engine.delete_pks(rows, ids, where=lambda: Q(owner="x"), key=("t", "x")) == 3
    assert engine.delete_pks(rows, [], key=("t", "x")) == 0
    assert engine.delete_pks(rows.filter(pk__in=[]), ids, key=("t", "none")) == 0
    assert sorted(Task.objects.values_list("pk", flat=True)) == ids[3:]
    assert engine.delete_pks(rows, ids[3:], key=("t", "all")) == 3
    assert not Task.objects.exists()


def test_add_to_adds_to_the_matching_rows_only():
    tube = Tube.objects.create_tube("counts", "fifo")
    assert engine.add_to(TubeStat, "default", {"tube_id": tube.pk, "slot": 3}, {"take": 5, "ack": 2}) == 1
    assert engine.add_to(TubeStat, "default", {"tube_id": tube.pk, "slot": 3}, {"take": 1, "ack": 0}) == 1
    assert engine.add_to(TubeStat, "default", {"tube_id": tube.pk + 1000, "slot": 3}, {"take": 1}) == 0
    row = TubeStat.objects.get(tube=tube, slot=3)
    assert (row.take, row.ack) == (6, 2)
    assert sum(TubeStat.objects.filter(tube=tube).values_list("take", flat=True)) == 6


def test_task_timer_indexes_are_partial_where_the_database_has_them(vendor):
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, Task._meta.db_table)
    assert {"taskloop_task_event", "taskloop_task_ttl", "taskloop_task_utube"} <= set(constraints)
    if vendor != "mysql":
        with connection.cursor() as cursor:
            if vendor == "postgresql":
                cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'taskloop_task_ttl'")
            else:
                cursor.execute("SELECT sql FROM sqlite_master WHERE name = 'taskloop_task_ttl'")
            (definition,) = cursor.fetchone()
        assert "WHERE" in definition.upper() and "NOT NULL" in definition.upper()
    # MySQL gets plain indexes, and no system check warns about conditions it would ignore.
    assert not [m for m in Task.check(databases=["default"]) if m.id == "models.W037"]


def test_one_taken_task_per_sub_queue_is_a_unique_index_of_taken_utube_tasks_only(vendor):
    """Only a taken utube task has a taken_key: the unique index holds no other task where
    indexes can be partial, and still refuses a second taken task of a sub-queue everywhere."""
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, Task._meta.db_table)
    unique = constraints["taskloop_task_utube_taken"]
    assert unique["unique"] and unique["columns"] == ["tube_id", "taken_key"]
    if vendor != "mysql":
        with connection.cursor() as cursor:
            if vendor == "postgresql":
                cursor.execute(
                    "SELECT indexdef FROM pg_indexes WHERE indexname = 'taskloop_task_utube_taken'"
                )
            else:
                cursor.execute("SELECT sql FROM sqlite_master WHERE name = 'taskloop_task_utube_taken'")
            (definition,) = cursor.fetchone()
        assert definition.upper().startswith("CREATE UNIQUE INDEX")
        assert re.search(r'WHERE \(?"?taken_key"? IS NOT NULL', definition, re.IGNORECASE), definition
    tube = Tube.objects.create_tube("one-each", "utube")
    tube.put_many(["a1", "a2"], utube="a")
    (first,) = tube.take_many(5, consumer="w")
    assert first.data == "a1" and first.taken_key
    second = Task.objects.get(data="a2")
    with pytest.raises(IntegrityError), transaction.atomic():
        Task.objects.filter(pk=second.pk).update(state="t", owner="x", taken_key=first.taken_key)
    # Tasks without a taken_key never collide.
    assert Task.objects.filter(tube=tube, taken_key__isnull=True).count() == 1


def _drain(tube_pk: int, who: int) -> list[int]:
    tube = Tube.objects.get(pk=tube_pk)
    seen: list[int] = []
    acked, taken = 0, tube.take_many(25, consumer=f"p{who}")
    while taken:
        seen.extend(t.data for t in taken)
        held = [t.pk for t in taken]
        acked, taken = tube.ack_and_take(held, 25, consumer=f"p{who}")
        assert acked == len(held)
    connections.close_all()
    return seen


def test_processes_racing_on_kept_claims_run_every_task_exactly_once(vendor):
    tube = Tube.objects.create_tube("race", "fifottl", ttr=60)
    Task.objects.bulk_create([Task(tube=tube, data=n, state="r") for n in range(3000)], batch_size=1000)
    results = race(_drain, [(tube.pk, w) for w in range(6)])
    done = [n for result in results for n in result]
    assert sorted(done) == list(range(3000)), f"{len(done)} runs, {len(set(done))} distinct"
    assert sum(1 for result in results if result) >= 2, "the processes did not share the work"
    assert not Task.objects.exists()
    calls = tube.statistics()["calls"]
    assert calls["take"] == calls["ack"] == 3000


def test_a_batch_counts_even_when_the_tube_has_no_counter_rows():
    """A tube made without create_tube (admin, fixtures) has no counter slots: the batch makes
    them and counts itself, whichever way it was sent."""
    tube = Tube.objects.create(name="bare", type="fifo")
    tube.put_many(list(range(20)))
    assert not TubeStat.objects.filter(tube=tube).exists()
    taken = tube.take_many(5, consumer="w")
    acked, taken = tube.ack_and_take([t.pk for t in taken], 5, consumer="w")
    TubeStat.objects.filter(tube=tube).delete()  # gone again, under a kept statement
    acked2, _taken = tube.ack_and_take([t.pk for t in taken], 5, consumer="w")
    assert (acked, acked2) == (5, 5)
    stats = tube.statistics()
    assert stats["calls"]["take"] == 5  # the counts before the rows were deleted are gone with them
    assert stats["calls"]["ack"] == 5 and stats["tasks"]["done"] == 5
    # put is derived (tasks left + done): the 5 done before the rows went are not in it.
    assert stats["calls"]["put"] == 10 + 5


def test_a_batch_acknowledges_only_its_own_live_tasks_and_claims_the_rest():
    tube = Tube.objects.create_tube("mine", "fifottl", ttr=60)
    tube.put_many(list(range(12)))
    a = tube.take_many(4, consumer="a")
    b = tube.take_many(4, consumer="b")
    # a acknowledges its own tasks and b's: only its own go.
    acked, taken = tube.ack_and_take([t.pk for t in a + b], 4, consumer="a")
    assert acked == 4 and len(taken) == 4
    assert set(Task.objects.filter(owner="b").values_list("pk", flat=True)) == {t.pk for t in b}
    assert {t.owner for t in taken} == {"a"} and not {t.pk for t in taken} & {t.pk for t in a + b}
    acked, taken = tube.ack_and_take([t.pk for t in taken], 4, consumer="a")
    assert (acked, taken) == (4, [])
    assert Task.objects.count() == 4


def test_a_first_batch_that_acknowledges_before_it_ever_claimed_in_bulk():
    """The batch statement may be compiled outside any transaction (PostgreSQL's batch runs in
    autocommit): its locking read must still compile."""
    tube = Tube.objects.create_tube("first", "fifo")
    tube.put_many(list(range(10)))
    held = [tube.take(0, consumer="z").pk for _ in range(2)]  # one at a time: no kept claim yet
    acked, taken = tube.ack_and_take(held, 5, consumer="z")
    assert acked == 2 and len(taken) == 5 and {t.owner for t in taken} == {"z"}


# -- kept statements are sent on a kept cursor (engine.compiler.send) ----------------------------------


def test_kept_statements_share_one_cursor_per_connection_and_make_a_new_one_after_a_reconnect(vendor):
    tube = Tube.objects.create_tube("sent", "fifo")
    tube.put(1)
    kept = connection._taskloop_cursor
    assert kept[0] is connection.connection
    tube.put(2)
    assert connection._taskloop_cursor is kept
    before = connection.connection
    connection.close()
    tube.put(3)  # (sent through connection.cursor(), which connects again)
    tube.put(4)
    assert connection._taskloop_cursor[0] is connection.connection
    if connection.connection is not before:
        assert connection._taskloop_cursor is not kept
    else:
        # Django keeps an in-memory SQLite database's one connection open (close() is a no-op).
        assert vendor == "sqlite"
        assert connection._taskloop_cursor is kept
    assert sorted(Task.objects.values_list("data", flat=True)) == [1, 2, 3, 4]


def test_statements_on_the_kept_cursor_raise_djangos_errors():
    with pytest.raises(IntegrityError):
        # A task of a tube that does not exist: the foreign key refuses it at once outside a
        # transaction (Django's IntegrityError, not the driver's).
        engine.compiler.send(
            connection,
            f"INSERT INTO {Task._meta.db_table} (tube_id, state, pri, created, attempts) "
            "VALUES (%s, %s, %s, %s, %s)",
            [10**9, "r", 0, "2026-01-01 00:00:00", 0],
            "rowcount",
        )
    with pytest.raises(DatabaseError) as caught:
        engine.compiler.send(connection, "SELECT no_such_column FROM taskloop_tube", [])
    assert type(caught.value).__module__ == "django.db.utils"


def test_a_kept_statement_is_refused_in_a_transaction_marked_for_rollback():
    tube = Tube.objects.create_tube("broken", "fifo")
    with transaction.atomic():
        transaction.set_rollback(True)
        with pytest.raises(TransactionManagementError):
            tube.put(1)
    assert Task.objects.count() == 0


def test_watched_connections_see_every_kept_statement():
    tube = Tube.objects.create_tube("watched", "fifo")
    tube.put(0)
    with CaptureQueriesContext(connection) as queries:
        tube.put(1)
    assert any("INSERT INTO" in sql for sql in _sql(queries))
    seen = []

    def wrapper(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        tube.put(2)
    assert any("INSERT INTO" in sql for sql in seen)


@pytest.mark.parametrize(
    "data", [{"a": [1, 2.5, None], "b": "ü"}, [1, "x"], "text", 7, 1.5, True, False, None]
)
def test_a_kept_insert_sends_a_json_value_as_the_field_would(data):
    """A put's kept INSERT hands a plain JSON value to the backend's adapter directly
    (kept._json_adapter): its parameters are what the fields' get_db_prep_save give, and the
    task reads back as put."""
    from django_taskloop.engine import kept
    from django_taskloop.engine.insert import insert_fields

    tube = Tube.objects.create_tube("json-params", "fifo")
    fields, returned = insert_fields(Task, [])
    obj = Task(tube=tube, data=data)
    statement = kept.one_row_insert(obj, "default", fields, returned, False)
    assert statement is not None
    sent = statement.params(obj, connection)
    expected = [field.get_db_prep_save(field.pre_save(obj, True), connection) for field in fields]

    def plain(value):  # (PostgreSQL's adapters have no ==: their class and what they hold)
        held = getattr(value, "obj", getattr(value, "adapted", value))
        return type(value).__name__, held, getattr(value, "dumps", None)

    at = [field.name for field in fields].index("created")  # (now, as the call makes it)
    assert [plain(v) for n, v in enumerate(sent) if n != at] == [
        plain(v) for n, v in enumerate(expected) if n != at
    ]
    assert Task.objects.get(pk=tube.put(data).pk).data == data
