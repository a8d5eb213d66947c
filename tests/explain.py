"""Read a query plan on any of the three databases, to prove that an index serves a query."""

from __future__ import annotations

from typing import Any

from django.db import connections
from django.db.models import QuerySet


def plan(queryset: QuerySet[Any]) -> str:
    """Return the plan of ``queryset`` as text (ANALYZE first on PostgreSQL, for real statistics)."""
    connection = connections[queryset.db]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {connection.ops.quote_name(queryset.model._meta.db_table)}")
    # Not ANALYZE TABLE on MySQL: it commits implicitly, which would break test isolation.
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
