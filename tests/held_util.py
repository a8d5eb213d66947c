"""A transaction held open elsewhere, for the tests of what it does to a queue (issue 30)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connections


@contextmanager
def held_transaction() -> Iterator[int]:
    """Hold a REPEATABLE READ transaction open in another connection (as a long report, a
    ``pg_dump`` or a request idle in its transaction does); yield its server process id."""
    other = connections.create_connection("default")
    try:
        other.set_autocommit(False)
        with other.cursor() as cursor:
            if other.vendor == "postgresql":
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                cursor.execute("SELECT pg_backend_pid()")
            else:
                cursor.execute("SELECT CONNECTION_ID()")
            pid = cursor.fetchone()[0]
            cursor.execute("SELECT COUNT(*) FROM taskloop_tube")  # the snapshot (InnoDB: a read view)
            cursor.fetchone()
        yield pid
    finally:
        other.rollback()
        other.close()
