"""A worker's claims start after its last (issue 30): the claim cursor.

Each claimed or finished task leaves a dead entry at the head of the claim index until the
database cleans it up, and a transaction held open anywhere holds the cleanup back: a claim
from the head then walks every task finished since. With a cursor, a take starts after the
last task it claimed (one descent of the index); what it may skip behind it (a release, a
kick, a delay run out) is found by a look from the head at least every second.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_taskloop.engine import cursor as cursor_module
from django_taskloop.models import Tube
from django_taskloop.models.tubes import ClaimCursor, worth_trying

from .held_util import held_transaction

pytestmark = pytest.mark.django_db

LINGERS = connection.vendor in ("postgresql", "mysql")


@pytest.fixture
def slow_looks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Looks from the head come no sooner than a minute (the test says when)."""
    monkeypatch.setattr(cursor_module, "FULL_LOOK_MIN", 60.0)
    yield


def looks_due(monkeypatch: pytest.MonkeyPatch) -> None:
    """From now on every look starts from the head."""
    monkeypatch.setattr(cursor_module, "FULL_LOOK_MIN", 0.0)
    monkeypatch.setattr(cursor_module, "FULL_LOOK_FACTOR", 0.0)


def numbers(tasks: list[Any]) -> list[int]:
    return [task.data for task in tasks]


@pytest.mark.parametrize("kind", ["fifo", "fifottl"])
def test_takes_start_after_the_last_and_look_from_the_head_when_due(kind, slow_looks, monkeypatch):
    tube = Tube.objects.create_tube(f"cursor-{kind}", kind)
    tube.put_many(list(range(10)))
    at = ClaimCursor()
    first = tube.take_many(3, consumer="w", cursor=at)
    assert numbers(first) == [0, 1, 2]
    tube.release(first[0].id, consumer="w")  # ready again, behind the cursor
    second = tube.take_many(3, consumer="w", cursor=at)
    if LINGERS:
        assert numbers(second) == [3, 4, 5]  # started after task 2: task 0 waits
        assert at.position is not None and at.position[-1] == second[-1].id
    else:
        assert numbers(second) == [0, 3, 4]  # SQLite: no dead entries, exact order
    # A look from the head is due: the released task comes first again.
    looks_due(monkeypatch)
    third = tube.take_many(3, consumer="w", cursor=at)
    assert numbers(third) == ([0, 6, 7] if LINGERS else [5, 6, 7])
    # Without a cursor a take is exact, as ever.
    tube.release(third[0].id, consumer="w")
    assert numbers(tube.take_many(2, consumer="other")) == [third[0].data, 8]


def test_a_priority_put_behind_the_cursor_waits_for_the_look_from_the_head(slow_looks, monkeypatch):
    tube = Tube.objects.create_tube("cursor-pri", "fifottl")
    tube.put_many([1, 2, 3, 4], pri=5)
    at = ClaimCursor()
    assert numbers(tube.take_many(2, consumer="w", cursor=at)) == [1, 2]
    tube.put("urgent", pri=0)
    expected = [3] if LINGERS else ["urgent"]
    assert numbers(tube.take_many(1, consumer="w", cursor=at)) == expected
    looks_due(monkeypatch)
    assert numbers(tube.take_many(1, consumer="w", cursor=at)) == (["urgent"] if LINGERS else [3])


def test_ack_and_take_moves_the_cursor(slow_looks):
    tube = Tube.objects.create_tube("cursor-ack", "fifo")
    tube.put_many(list(range(6)))
    at = ClaimCursor()
    held = tube.take_many(2, consumer="w", cursor=at)
    tube.release(held[1].id, consumer="w")
    acked, taken = tube.ack_and_take([held[0].id], 2, consumer="w", cursor=at)
    assert acked == 1
    assert numbers(taken) == ([2, 3] if LINGERS else [1, 2])
    if LINGERS:
        assert at.position == (taken[-1].id,)


def test_an_idle_look_starts_where_the_takes_do(slow_looks, monkeypatch):
    tube = Tube.objects.create_tube("cursor-look", "fifo")
    tube.put_many([1, 2])
    at = ClaimCursor()
    held = tube.take_many(2, consumer="w", cursor=at)
    tube.release(held[0].id, consumer="w")  # the only ready task lies behind the cursor
    assert worth_trying([tube], {tube.pk: at}) == {tube.pk: "" if LINGERS else "ready"}
    assert worth_trying([tube]) == {tube.pk: "ready"}  # without the cursor: from the head
    looks_due(monkeypatch)
    # Due: the look starts from the head, finds it, and the next take starts there too.
    assert worth_trying([tube], {tube.pk: at}) == {tube.pk: "ready"}
    monkeypatch.setattr(cursor_module, "FULL_LOOK_MIN", 60.0)
    monkeypatch.setattr(cursor_module, "FULL_LOOK_FACTOR", 20.0)
    assert numbers(tube.take_many(1, consumer="w", cursor=at, checked=True)) == [1]


def test_utube_takes_ignore_the_cursor(slow_looks):
    tube = Tube.objects.create_tube("cursor-utube", "utube")
    tube.put("a1", utube="a")
    tube.put("b1", utube="b")
    tube.put("a2", utube="a")
    at = ClaimCursor()
    first = tube.take_many(2, consumer="w", cursor=at)
    assert numbers(first) == ["a1", "b1"]
    tube.ack(first[0].id, consumer="w")
    # a2 is now its sub-queue's head, behind where the last take ended: taken at once.
    assert numbers(tube.take_many(2, consumer="w", cursor=at)) == ["a2"]
    assert at.position is None


def claim_statement(call: Any) -> str:
    with CaptureQueriesContext(connection) as queries:
        call()
    (sql,) = [
        q["sql"]
        for q in queries.captured_queries
        if "SKIP LOCKED" in q["sql"] and "taskloop_task" in q["sql"]
    ]
    return sql


@pytest.mark.vendors("postgresql", "mysql")  # the LINGERS ones: SQLite claims keep no cursor
def test_a_cursor_claim_is_one_range_of_the_claim_index(slow_looks):
    tube = Tube.objects.create_tube("cursor-plan", "fifo")
    for start in range(0, 20_000, 5_000):
        tube.put_many(list(range(start, start + 5_000)))
    at = ClaimCursor()
    # A worker that keeps up: a few hundred ready after where its takes stand (a long
    # backlog after it: the test after the next).
    tube.take_many(19_700, consumer="w", cursor=at)
    if connection.vendor == "postgresql":
        # The statistics of an ANALYZE that ran before the newest puts: the cursor stands
        # past their histogram (a constant there was estimated at a few rows).
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE taskloop_task")
        tube.put_many(list(range(20_000, 40_000)))
    sql = claim_statement(lambda: tube.take_many(100, consumer="w", cursor=at))
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            assert re.search(r'\(\S+"id"\) > \(\(SELECT \d+\)\)', sql), sql
            cursor.execute(f"EXPLAIN {sql}")
            plan = "\n".join(row[0] for row in cursor.fetchall())
            # The row comparison bounds the scan (an index condition, not a filter).
            assert re.search(r"Index Cond: .*\(id > \$\d+\)", plan), plan
            # Its value is no constant the planner estimates by (a cursor stands past the
            # histogram): an ordered scan that stops at the limit, never a sort of all after it.
            assert "Sort" not in plan and "Bitmap" not in plan, plan
            # The update finds the locked rows by address: no index for the planner to misjudge.
            assert "Tid Scan" in plan and "TID Cond: (ctid = ANY" in plan, plan
        else:
            select = sql if sql.startswith("SELECT") else sql[sql.index("SELECT") :]
            cursor.execute(f"EXPLAIN {select}")
            names = [col[0].lower() for col in cursor.description]
            (row,) = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
            assert row["key"] == "taskloop_task_claim" and row["type"] == "range", (row, select)
            assert int(row["rows"]) < 1_000, row  # a range after the cursor, not the tube's all


@pytest.mark.vendors("mysql")  # MariaDB's optimizer
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", ["fifo", "fifottl"])
def test_behind_a_long_backlog_a_cursor_claim_still_starts_at_the_cursor(kind, slow_looks):
    """MariaDB reads ``tube = … AND state = 'r' AND pri = 0 AND id > …`` by the equal prefix
    from the head when the range after the cursor is long (its estimates are the same): with
    a read view held open elsewhere, through every entry that purge has not removed, 0.03×
    the put rate in bench/held_horizon.py --vendor mariadb. The claim names its index."""
    tube = Tube.objects.create_tube(f"cursor-backlog-{kind}", kind)
    for start in range(0, 30_000, 10_000):
        tube.put_many(list(range(start, start + 10_000)))
    at = ClaimCursor()
    with held_transaction():
        taken = tube.take_many(1_000, consumer="w", cursor=at)
        for _ in range(4):  # 5,000 claimed and deleted, their entries kept for the read view
            _, taken = tube.ack_and_take([task.id for task in taken], 1_000, consumer="w", cursor=at)
        sql = claim_statement(lambda: tube.take_many(100, consumer="w", cursor=at))
    select = sql if sql.startswith("SELECT") else sql[sql.index("SELECT") :]
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {select}")
        names = [col[0].lower() for col in cursor.description]
        (row,) = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    assert row["key"] == "taskloop_task_claim" and row["type"] == "range", (row, select)


@pytest.mark.vendors("postgresql")  # its MVCC horizon
@pytest.mark.django_db(transaction=True)
def test_with_a_transaction_held_open_a_cursor_claim_reads_few_pages(slow_looks):
    tube = Tube.objects.create_tube("cursor-held", "fifo")
    for start in range(0, 30_000, 10_000):
        tube.put_many(list(range(start, start + 10_000)))
    with held_transaction():
        at = ClaimCursor()
        taken = tube.take_many(1_000, consumer="w", cursor=at)
        for _ in range(24):  # 25,000 claimed and deleted, their entries kept by the snapshot
            _, taken = tube.ack_and_take([task.id for task in taken], 1_000, consumer="w", cursor=at)
        from_cursor = buffers(claim_statement(lambda: tube.take_many(100, consumer="w", cursor=at)))
        from_head = buffers(claim_statement(lambda: tube.take_many(100, consumer="w2")))
    # 100 claimed rows: a few index pages, a heap page per row at most.
    assert from_cursor < 150, from_cursor
    # From the head: every entry that 25,000 finished tasks left, and the pages they point to.
    assert from_cursor * 4 < from_head, (from_cursor, from_head)


def buffers(sql: str) -> int:
    """Pages the claim index's scan reads in a claim statement (run again under EXPLAIN
    ANALYZE and rolled back): index pages, and the heap pages their entries point to."""
    with connection.cursor() as cursor:
        cursor.execute("BEGIN")
        try:
            cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}")
            (plan,) = cursor.fetchone()
        finally:
            cursor.execute("ROLLBACK")
    (scan,) = [node for node in nodes(plan[0]["Plan"]) if node.get("Index Name") == "taskloop_task_claim"]
    return int(scan["Shared Hit Blocks"]) + int(scan["Shared Read Blocks"])


def nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from nodes(child)
