"""Read a query plan on any of the three databases, to prove that an index serves a query."""

from __future__ import annotations

from typing import Any

from django.db import connections
from django.db.models import QuerySet


def plan(queryset: QuerySet[Any]) -> str:
    """Return the plan of ``queryset`` as text, planned on real statistics: ANALYZE first on
    PostgreSQL, and on MariaDB in a test that commits (``transaction=True``). ANALYZE TABLE
    commits implicitly, which would break a test run inside a transaction; there MariaDB plans
    on the statistics it last sampled, which a previous test's rows may have left (CI saw a
    filesort chosen for 20,000 fresh rows on statistics of a few thousand locked ones)."""
    connection = connections[queryset.db]
    table = connection.ops.quote_name(queryset.model._meta.db_table)
    analyze = {"postgresql": "ANALYZE {}", "mysql": "ANALYZE TABLE {}"}.get(connection.vendor)
    if analyze and (connection.vendor == "postgresql" or not connection.in_atomic_block):
        with connection.cursor() as cursor:
            cursor.execute(analyze.format(table))
            if connection.vendor == "mysql":
                cursor.fetchall()
    return queryset.explain()


def assert_ordered_by_index(queryset: QuerySet[Any]) -> str:
    """Assert that ``queryset`` reads an index in order: no full scan followed by a sort."""
    text = plan(queryset)
    vendor = connections[queryset.db].vendor
    if vendor == "sqlite":
        assert "TEMP B-TREE" not in text, text
    elif vendor == "mysql":
        assert "filesort" not in text.lower(), text
        assert "\tALL\t" not in text and " ALL " not in text, text
    else:
        assert "Sort" not in text.split("\n")[0] and "Seq Scan" not in text, text
        assert "Index" in text, text
    return text
