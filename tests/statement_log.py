"""Count what a worker process sends its database, as it sends it (for the idle-cost tests).

``tests.statement_log_settings`` installs :func:`install` in worker subprocesses: every
statement a Django connection executes, and every commit, rollback and autocommit switch
(each one more round trip on MariaDB, where the server counts them as ``Questions``), is
noted with its time; at exit the notes go to the file ``TASKLOOP_STATEMENT_LOG`` names, one
``<unix time> <kind> <alias> <in a transaction: 0/1>`` line each. Only Django connections
count: PostgreSQL's ``LISTEN`` connection (psycopg's own) is seen on the server instead.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from typing import Any

ENV = "TASKLOOP_STATEMENT_LOG"

_notes: list[tuple[float, str, str, int]] = []
_lock = threading.Lock()


def _note(kind: str, connection: Any) -> None:
    with _lock:
        _notes.append((time.time(), kind, connection.alias, int(connection.in_atomic_block)))


def _wrap(connection: Any, name: str, kind: str) -> None:
    original = getattr(connection, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        _note(kind, connection)
        return original(*args, **kwargs)

    setattr(connection, name, wrapped)


def _statement(execute: Any, sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
    _note("statement", context["connection"])
    return execute(sql, params, many, context)


def _on_connection(sender: Any, connection: Any, **kwargs: Any) -> None:
    if getattr(connection, "_statement_log", False):
        return
    connection._statement_log = True
    connection.execute_wrappers.append(_statement)
    _wrap(connection, "_commit", "commit")
    _wrap(connection, "_rollback", "rollback")
    _wrap(connection, "_set_autocommit", "autocommit")


def _dump(path: str) -> None:
    with _lock, open(path, "a") as f:
        for at, kind, alias, atomic in _notes:
            f.write(f"{at:.6f} {kind} {alias} {atomic}\n")


def install() -> None:
    path = os.environ.get(ENV)
    if not path:
        return
    from django.db.backends.signals import connection_created

    connection_created.connect(_on_connection, weak=False)
    atexit.register(_dump, f"{path}.{os.getpid()}")


def read(path: str) -> list[tuple[float, str, str, int]]:
    """Return every note that the processes logging to ``path`` wrote, in time order."""
    from pathlib import Path

    notes = []
    base = Path(path)
    for part in base.parent.glob(base.name + ".*"):
        for line in part.read_text().splitlines():
            at, kind, alias, atomic = line.split()
            notes.append((float(at), kind, alias, int(atomic)))
    return sorted(notes)
