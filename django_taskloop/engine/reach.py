"""Whether a database can be reached now, within a bounded time: for workers that wait out an
outage or leave a shard that is down aside, and puts that move on to the next shard."""

from __future__ import annotations

from typing import Any

from django.db import DatabaseError, connections

from .deadline import bounded

__all__ = ["unreachable"]


def unreachable(alias: str) -> DatabaseError | None:
    """Return the error of ``alias``'s connection if the database cannot be reached, else
    ``None``. A connection that is open is pinged; otherwise a new one is made (and left open
    for the next use). Both within ``TASKLOOP["DATABASE_TIMEOUT"]``: a server that hangs counts
    as unreachable, as one that went away does."""
    connection = connections[alias]
    try:
        if connection.connection is not None:
            with bounded(alias):
                if connection.is_usable():
                    return None
            connection.close()
        with bounded(alias):  # (connects with a connect timeout)
            connection.ensure_connection()
            if connection.vendor == "mysql":
                _refuse_a_node_not_ready(connection)
    except DatabaseError as error:
        connection.close()
        return error
    return None


def _refuse_a_node_not_ready(connection: Any) -> None:
    """A Galera node that is not ready (cut off from its cluster's primary component) accepts
    connections and answers pings, and refuses every query on the tables with error 1047:
    count it unreachable, so that a worker waits it out like an outage. (A server without
    Galera has ``wsrep_on`` OFF: nothing more is read.)"""
    with connection.cursor() as cursor:
        # (A MariaDB without Galera has wsrep_ready too, always OFF: wsrep_on says which.)
        cursor.execute("SHOW GLOBAL VARIABLES LIKE 'wsrep_on'")
        on = cursor.fetchone()
        if on is None or str(on[1]).upper() != "ON":
            return
        cursor.execute("SHOW GLOBAL STATUS LIKE 'wsrep_ready'")
        row = cursor.fetchone()
    if row is not None and str(row[1]).upper() != "ON":
        raise DatabaseError(1047, "WSREP has not yet prepared node for application use")
