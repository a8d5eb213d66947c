"""After a ``transaction=True`` test, empty only the tables the test wrote (a pytest plugin of
the suite).

Django empties every table after such a test (``manage.py flush``): on PostgreSQL one
``TRUNCATE`` of all of them, which makes every table's and index's files anew and waits for
their sync — half a second a test on this machine's stock server, the largest part of a
PostgreSQL leg. Then its ``post_migrate`` writes the content types and permissions again.

Here the flush first asks which tables hold a row (one ``UNION ALL`` of ``EXISTS`` reads, each
one index probe) and empties those alone, the same way Django would (PostgreSQL: ``TRUNCATE …
CASCADE``, since a table another one names may be emptied alone). The content types and
permissions are kept: ``post_migrate`` would write the same rows again. A table the test left
empty stays as it is, so no test sees another's rows, as before; sequences are not reset, as
before. The servers stay as users run them: this is the suite's cleanup, not a setting.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: What ``post_migrate`` writes back after every flush: kept instead.
KEPT = frozenset({"django_content_type", "auth_permission"})


def _holding_rows(connection: Any, tables: Sequence[str]) -> list[str]:
    """The tables of ``tables`` that hold at least one row."""
    if not tables:
        return []
    quote = connection.ops.quote_name
    reads = " UNION ALL ".join(
        f"SELECT {i} AS n FROM (SELECT 1 AS one) t{i} WHERE EXISTS (SELECT 1 FROM {quote(table)})"
        for i, table in enumerate(tables)
    )
    with connection.cursor() as cursor:
        cursor.execute(reads)
        return [tables[row[0]] for row in cursor.fetchall()]


def _written_only(operations: type[Any], cascade: bool) -> None:
    original = operations.sql_flush

    def sql_flush(
        self: Any,
        style: Any,
        tables: Sequence[str],
        *,
        reset_sequences: bool = False,
        allow_cascade: bool = False,
    ) -> list[str]:
        written = _holding_rows(self.connection, [table for table in tables if table not in KEPT])
        if not written:
            return []
        return list(
            original(
                self, style, written, reset_sequences=reset_sequences, allow_cascade=allow_cascade or cascade
            )
        )

    operations.sql_flush = sql_flush


def pytest_configure(config: Any) -> None:
    import importlib

    # PostgreSQL refuses to TRUNCATE a table another names unless both go, or CASCADE.
    for vendor, cascade in (("postgresql", True), ("sqlite3", False), ("mysql", False)):
        try:
            module = importlib.import_module(f"django.db.backends.{vendor}.operations")
        except ImportError:  # (its driver is not installed: no such database either)
            continue
        _written_only(module.DatabaseOperations, cascade)
