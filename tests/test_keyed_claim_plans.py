"""A keyed claim's "nothing of this key ahead" reads the sub-queue's index on MariaDB, whatever
the statistics say (issue 39).

A keyed tube's claim (``utube``/``utubettl``, keyed Django Tasks) keeps only the head of each
sub-queue: ``NOT EXISTS`` an earlier ready or a taken task of the same key, a correlated
subquery on the same table. After a burst of puts, before InnoDB's statistics caught up,
MariaDB's optimizer read the whole table once per candidate for it (``ALL``): 100–250 ms a
claim of 100 from a tube of 3,000 tasks, a keyed drain at a tenth of the unkeyed one. The
claim now names the sub-queue index to MariaDB (``FORCE INDEX``, as an ``ANALYZE TABLE``
would have it choose): a plan check, not a timing assert.
"""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_taskloop.models import Task, Tube
from django_taskloop.models.tubes import ClaimCursor

pytestmark = [
    pytest.mark.vendors("mysql"),  # MariaDB's optimizer and its index hints
    pytest.mark.django_db(transaction=True),
]


@pytest.mark.parametrize("kind", ["utube", "utubettl"])
def test_a_keyed_claim_reads_the_sub_queue_index_for_its_subquery(kind):
    tube = Tube.objects.create_tube(f"keyed-plan-{kind}", kind)
    Task.objects.bulk_create(
        [Task(tube_id=tube.pk, data=n, state="r", pri=0, utube=f"k{n % 500}") for n in range(3000)]
    )
    at = ClaimCursor()
    taken = tube.take_many(100, consumer="w", cursor=at)
    with CaptureQueriesContext(connection) as queries:
        _, taken = tube.ack_and_take([task.id for task in taken], 100, consumer="w", cursor=at)
    assert len(taken) == 100
    claim = next(q["sql"] for q in queries.captured_queries if "SKIP LOCKED" in q["sql"])
    # The plan is pinned, not left to the statistics (which this test cannot make stale on
    # demand: bench/scenarios.py kinds showed it, 0.06x the unkeyed drain before).
    assert len(re.findall(r"`taskloop_task` `?U0`? FORCE INDEX \(`taskloop_task_utube`\)", claim)) == 2, claim
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + claim)
        plan = cursor.fetchall()
    subqueries = [row for row in plan if row[1] == "DEPENDENT SUBQUERY"]
    assert subqueries, plan
    # Each subquery reads the sub-queue index by the key (ref), none the whole table (ALL).
    for row in subqueries:
        assert row[3] == "ref" and row[5] == "taskloop_task_utube", plan
