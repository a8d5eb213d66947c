"""Whether a database can be reached now: one fresh connection, for workers that wait out an
outage or leave a shard that is down aside."""

from __future__ import annotations

from django.db import DatabaseError, connections

__all__ = ["unreachable"]


def unreachable(alias: str) -> DatabaseError | None:
    """Return the error of a fresh connection to ``alias`` if it cannot be made, else ``None``
    (the connection is left open for the next use)."""
    connection = connections[alias]
    try:
        if connection.connection is None or not connection.is_usable():
            connection.close()
            connection.ensure_connection()
    except DatabaseError as error:
        connection.close()
        return error
    return None
