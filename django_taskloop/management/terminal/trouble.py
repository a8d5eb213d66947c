"""What ``manage.py taskloop`` says when a database is down or lacks the tables: one line, as
the workers do (``workers/outage.py``), never the traceback of the first failed read."""

from __future__ import annotations

from typing import Any

import django
from django.db import DatabaseError, connections

from django_taskloop.health import queue_tables
from django_taskloop.workers.outage import describe, first_line, not_migrated, tables_missing, unreachable

__all__ = ["checked_databases", "database_trouble", "unreachable_database"]


def unreachable_database() -> str | None:
    """Return the line that says which of the queues' databases cannot be reached, or None."""
    for alias in queue_tables():
        down = unreachable(alias)
        if down is not None:
            return f"database {describe(alias)} is unreachable ({first_line(down)})"
    return None


def checked_databases(databases: Any) -> Any:
    """The ``databases`` a command's system checks run against: Django 6 checks every database
    by default (MySQL's model checks read each server's version), so a shard that is down would
    be a traceback before the command could name it; those that can be reached now, then."""
    if django.VERSION >= (6, 0) and databases is None:
        return [alias for alias in connections if unreachable(alias) is None]
    return databases


def database_trouble(error: DatabaseError) -> tuple[str, int]:
    """Return the line that says what is wrong with the queues' databases, and the exit status
    (2 for tables not migrated, as ``workers``; 1 for a database that cannot be reached)."""
    down = unreachable_database()
    if down is not None:
        return down, 1
    for alias, names in queue_tables().items():
        if tables_missing(alias, names):
            said = not_migrated([alias], {"django_taskloop"})
            if said is not None:
                return said, 2
    return f"cannot read the queues: {first_line(error)}", 1
