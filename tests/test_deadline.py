"""The client-side deadline on the package's own round trips (engine.deadline, issue 39).

A statement that outlives its deadline has its connection's socket shut down from the
watchdog thread: the driver's wait ends at once with a lost connection, raised as
``DeadlinePassed``; nothing of an unfinished transaction is committed; the next use connects
again. Here the server is healthy and the statement merely slow (a sleep in SQL): the
reliability tests freeze a real server (``tests/reliability/test_hung.py``).
"""

from __future__ import annotations

import time

import pytest
from django.db import connection, transaction

from django_taskloop.engine import DeadlinePassed, bounded
from django_taskloop.models import Tube

pytestmark = pytest.mark.django_db(transaction=True)

SLEEP = {"postgresql": "SELECT pg_sleep(5)", "mysql": "SELECT SLEEP(5)"}


def test_a_statement_past_its_deadline_is_cut_off_and_the_connection_comes_back(vendor):
    if vendor == "sqlite":
        # No socket: SQLite's waits are its busy timeout's; the block runs unbounded.
        with bounded("default", 0.2):
            assert Tube.objects.count() == 0
        return
    started = time.monotonic()
    with pytest.raises(DeadlinePassed, match="did not answer within 0.5 s"):
        with bounded("default", 0.5), connection.cursor() as cursor:
            cursor.execute(SLEEP[vendor])
    assert time.monotonic() - started < 3, "the deadline did not end the wait"
    assert connection.connection is None  # dropped: the next use connects again
    assert Tube.objects.count() == 0


@pytest.mark.vendors("mysql", "postgresql")  # SQLite: no socket to cut
def test_a_transaction_cut_off_before_its_commit_is_not_made(vendor):
    with pytest.raises(DeadlinePassed):
        with bounded("default", 0.5), transaction.atomic():
            Tube.objects.create_tube("cut-off", "fifo")
            with connection.cursor() as cursor:
                cursor.execute(SLEEP[vendor])
    assert not Tube.objects.filter(name="cut-off").exists()


def test_work_within_the_deadline_is_untouched(vendor):
    with bounded("default", 5):
        tube = Tube.objects.create_tube("in-time", "fifo")
        tube.put("x")
    assert tube.statistics()["tasks"]["ready"] == 1
    # The watchdog fired nothing: the connection is the same one, still open.
    assert connection.connection is not None or vendor == "sqlite"


@pytest.mark.vendors("mysql", "postgresql")  # SQLite: no socket to cut
def test_zero_turns_the_deadline_off(settings, vendor):
    settings.TASKLOOP = {"DATABASE_TIMEOUT": 0}
    with bounded("default", 0.2), connection.cursor() as cursor:
        cursor.execute("SELECT pg_sleep(0.5)" if vendor == "postgresql" else "SELECT SLEEP(0.5)")
