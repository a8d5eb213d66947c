"""What holds back a database's cleanup: the oldest open transaction, and the old row versions
that wait for it (PostgreSQL's dead rows, InnoDB's purge backlog).

A queue writes and deletes rows all day. Old versions of them are removed only once no open
transaction can still see them; one transaction held open elsewhere (a long report, a
``pg_dump``, a request idle in its transaction) keeps every version since it began, and every
claim then walks them. These reads let the metrics, the dashboard and the workers say so.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from django.db import connections

__all__ = ["Holder", "Cleanup", "cleanup", "vacuum", "nothing_to_vacuum"]


@dataclass(frozen=True)
class Holder:
    """The open transaction that holds cleanup back the longest (not the caller's own)."""

    seconds: float  # how long it has been open
    pid: int  # its server process (PostgreSQL) or connection id (MariaDB/MySQL)
    user: str
    application: str  # PostgreSQL's application_name; MariaDB/MySQL: the client host
    state: str  # e.g. "idle in transaction", "active"
    query: str  # its last statement, shortened

    def describe(self) -> str:
        """One line naming the holder for a log or a page."""
        who = " ".join(part for part in (f"pid {self.pid}", self.user, self.application) if part)
        said = f"{who}, {self.state or 'open'}"
        return f"{said}, last statement: {self.query}" if self.query else said


@dataclass(frozen=True)
class Cleanup:
    """A database's cleanup as of now: see :func:`cleanup`."""

    vendor: str
    holder: Holder | None  # None: no other transaction is open
    # PostgreSQL: dead row versions per table (the statistics collector's count, seconds late).
    dead_rows: dict[str, int] = field(default_factory=dict)
    # MariaDB/MySQL: undo log records not yet purged (InnoDB's history list length).
    purge_backlog: int | None = None

    @property
    def oldest_seconds(self) -> float:
        """How long the oldest other transaction has been open (0: none is)."""
        return self.holder.seconds if self.holder is not None else 0.0


#: One statement a look (a worker looks every few seconds: it must cost one round trip).
#: PostgreSQL: the oldest other transaction of this database that holds a snapshot or a
#: transaction id (so that VACUUM must keep what it may see), the oldest prepared transaction,
#: and the dead row versions of the tables named. Backends of other databases hold back only
#: shared catalogs, not our tables: they are left out.
_PG_CLEANUP = """
WITH h AS (
    SELECT EXTRACT(EPOCH FROM clock_timestamp() - xact_start) AS seconds, pid, COALESCE(usename, '') AS u,
           COALESCE(application_name, '') AS app, COALESCE(state, '') AS state,
           LEFT(COALESCE(query, ''), 200) AS query
    FROM pg_stat_activity
    WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL
      AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
    ORDER BY xact_start LIMIT 1
), p AS (
    SELECT EXTRACT(EPOCH FROM clock_timestamp() - prepared) AS seconds, owner, gid
    FROM pg_prepared_xacts WHERE database = current_database() ORDER BY prepared LIMIT 1
)
SELECT h.seconds, h.pid, h.u, h.app, h.state, h.query, p.seconds, p.owner, p.gid,
       (SELECT json_object_agg(relname, n_dead_tup) FROM pg_stat_user_tables WHERE relname = ANY(%s))
FROM (SELECT 1) AS one LEFT JOIN h ON TRUE LEFT JOIN p ON TRUE
"""

#: MariaDB/MySQL: InnoDB's oldest open transaction (read-only ones too: their read views hold
#: purge), and the purge backlog (the history list length). INNODB_TRX is a copy refreshed at
#: most every 0.1 s: the join leaves out connections gone since.
_MYSQL_CLEANUP = """
SELECT h.seconds, h.pid, h.u, h.host, h.state, h.query,
       (SELECT `COUNT` FROM information_schema.INNODB_METRICS WHERE NAME = 'trx_rseg_history_len')
FROM (SELECT 1) AS one LEFT JOIN (
    SELECT TIMESTAMPDIFF(MICROSECOND, t.trx_started, NOW(6)) / 1e6 AS seconds, t.trx_mysql_thread_id AS pid,
           p.USER AS u, p.HOST AS host,
           IF(p.COMMAND = 'Sleep', 'idle in transaction', LOWER(p.COMMAND)) AS state,
           LEFT(COALESCE(t.trx_query, p.INFO, ''), 200) AS query
    FROM information_schema.INNODB_TRX t
    JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id
    WHERE t.trx_mysql_thread_id <> CONNECTION_ID()
    ORDER BY t.trx_started LIMIT 1
) AS h ON TRUE
"""


def cleanup(using: str, tables: Sequence[str] = ()) -> Cleanup | None:
    """Read what holds back cleanup on database ``using``, in one statement: the oldest other
    open transaction and, for ``tables``, their dead row versions (PostgreSQL), or InnoDB's
    purge backlog. ``None`` where the database keeps no old versions (SQLite)."""
    connection = connections[using]
    vendor = connection.vendor
    if vendor not in ("postgresql", "mysql"):
        return None
    with connection.cursor() as cursor:
        if vendor == "postgresql":
            cursor.execute(_PG_CLEANUP, [list(tables)])
            row = cursor.fetchone()
            holder = _holder(row[:6])
            if row[6] is not None and (holder is None or row[6] > holder.seconds):
                holder = Holder(float(row[6]), 0, str(row[7]), "", "prepared", str(row[8]))
            dead = row[9] if not isinstance(row[9], str) else json.loads(row[9])
            return Cleanup(vendor, holder, dead_rows={name: int(n) for name, n in (dead or {}).items()})
        cursor.execute(_MYSQL_CLEANUP)
        row = cursor.fetchone()
        backlog = None if row[6] is None else int(row[6])
        return Cleanup(vendor, _holder(row[:6]), purge_backlog=backlog)


def _holder(row: Sequence[object] | None) -> Holder | None:
    if row is None or row[0] is None:
        return None
    seconds, pid, user, application, state, query = row
    return Holder(
        max(0.0, float(seconds)),  # type: ignore[arg-type]
        int(pid),  # type: ignore[call-overload]
        str(user),
        str(application),
        str(state).lower(),
        " ".join(str(query).split()),
    )


def vacuum(using: str, tables: Sequence[str], *, reindex: bool = False) -> list[str]:
    """Give back the space of old row versions in ``tables`` on ``using`` once nothing holds
    them (after an incident); return one line per statement sent.

    PostgreSQL: ``VACUUM (ANALYZE)`` each table; with ``reindex`` also ``REINDEX TABLE
    CONCURRENTLY`` (rebuilds bloated indexes without blocking the queue; VACUUM alone returns no
    index space). MariaDB/MySQL purge by themselves: ``reindex`` runs ``OPTIMIZE TABLE`` (an
    online rebuild of the table and its indexes). SQLite: nothing to do.
    """
    connection = connections[using]
    statements: list[str] = []
    quote = connection.ops.quote_name
    for table in tables:
        if connection.vendor == "postgresql":
            statements.append(f"VACUUM (ANALYZE) {quote(table)}")
            if reindex:
                statements.append(f"REINDEX TABLE CONCURRENTLY {quote(table)}")
        elif connection.vendor == "mysql" and reindex:
            statements.append(f"OPTIMIZE TABLE {quote(table)}")
    if statements and connection.in_atomic_block:
        raise RuntimeError("vacuum runs outside a transaction (VACUUM cannot run inside one)")
    with connection.cursor() as cursor:
        for sql in statements:
            cursor.execute(sql)
            if cursor.description:  # OPTIMIZE TABLE answers with a status table
                cursor.fetchall()
    return statements


#: Why :func:`vacuum` sends nothing to a database, by vendor.
_NOTHING_TO_VACUUM = {
    "sqlite": "SQLite keeps no old row versions",
    "mysql": "InnoDB purges old row versions by itself; --reindex rebuilds the tables",
}


def nothing_to_vacuum(using: str) -> str:
    """Say why :func:`vacuum` without ``reindex`` sends nothing to ``using``."""
    return _NOTHING_TO_VACUUM.get(connections[using].vendor, "nothing kept to clean up")
