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
            if connection.vendor == "mysql":
                _refuse_a_node_not_ready(connection)
    except DatabaseError as error:
        connection.close()
        return error
    return None


def _refuse_a_node_not_ready(connection: object) -> None:
    """A Galera node that is not ready (cut off from its cluster's primary component) accepts
    connections and answers pings, and refuses every query on the tables with error 1047:
    count it unreachable, so that a worker waits it out like an outage. (A server without
    Galera has ``wsrep_on`` OFF: nothing more is read.)"""
    with connection.cursor() as cursor:  # type: ignore[attr-defined]
        # (A MariaDB without Galera has wsrep_ready too, always OFF: wsrep_on says which.)
        cursor.execute("SHOW GLOBAL VARIABLES LIKE 'wsrep_on'")
        on = cursor.fetchone()
        if on is None or str(on[1]).upper() != "ON":
            return
        cursor.execute("SHOW GLOBAL STATUS LIKE 'wsrep_ready'")
        row = cursor.fetchone()
    if row is not None and str(row[1]).upper() != "ON":
        raise DatabaseError(1047, "WSREP has not yet prepared node for application use")
