"""Database health beside the queues: what holds back cleanup of the queue tables.

:func:`database_cleanup` reads it for each database our tables live on (the metrics and the
dashboard show it); :class:`CleanupWatch` turns it into log lines for a worker: a warning while
one transaction has held cleanup back for longer than ``TASKLOOP["HORIZON_WARNING"]`` seconds,
repeated every few minutes, and a line when it ends.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from django.apps import apps
from django.db import router

from .conf import setting
from .engine.health import Cleanup, Holder, cleanup, nothing_to_vacuum, vacuum
from .stats import loop_models

__all__ = ["Cleanup", "Holder", "CleanupWatch", "database_cleanup", "queue_tables", "vacuum_queue_tables"]

#: Where the operator reads what to do about a held transaction.
ADVICE = "docs/operating.md, 'A transaction held open'"
#: Seconds between two warnings about the same held transaction.
REPEAT_EVERY = 300.0


def queue_tables() -> dict[str, list[str]]:
    """Return ``{alias: [table, …]}``: every table of ours (and of each task loop model), by the
    database it is written on."""
    models = [*apps.get_app_config("django_taskloop").get_models(), *loop_models()]
    tables: dict[str, list[str]] = {}
    for model in models:
        names = tables.setdefault(router.db_for_write(model), [])
        if model._meta.db_table not in names:
            names.append(model._meta.db_table)
    return tables


def database_cleanup(tables: dict[str, list[str]] | None = None) -> dict[str, Cleanup]:
    """Return ``{alias: Cleanup}`` for every database of ``tables`` (default
    :func:`queue_tables`) that keeps old row versions (not SQLite)."""
    found: dict[str, Cleanup] = {}
    for alias, names in (queue_tables() if tables is None else tables).items():
        read = cleanup(alias, names)
        if read is not None:
            found[alias] = read
    return found


def vacuum_queue_tables(using: str | None = None, *, reindex: bool = False) -> list[str]:
    """VACUUM (and with ``reindex`` rebuild the indexes of) every queue table, on ``using`` or
    on each database they live on; return what was done, a line per database."""
    lines = []
    for alias, names in queue_tables().items():
        if using is not None and alias != using:
            continue
        sent = vacuum(alias, names, reindex=reindex)
        if sent:
            verbs = list(dict.fromkeys(_verb(sql) for sql in sent))
            lines.append(f"database {alias}: {' and '.join(verbs)} on {len(names)} tables")
        else:
            lines.append(f"database {alias}: nothing to do ({nothing_to_vacuum(alias)})")
    return lines


def _verb(sql: str) -> str:
    """``VACUUM (ANALYZE) "t"`` → ``VACUUM (ANALYZE)``: the statement less its table."""
    return sql.rsplit(" ", 1)[0]


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


class CleanupWatch:
    """Say, in log lines, when a transaction holds back cleanup of the queue tables."""

    def __init__(self, aliases: Iterable[str] | None = None) -> None:
        self.aliases = None if aliases is None else set(aliases)
        # alias → (when we last warned, monotonic; how long the holder had been open then)
        self.warned: dict[str, tuple[float, float]] = {}

    @staticmethod
    def threshold() -> float:
        """Seconds a transaction may stay open before the watch warns (0: never warn)."""
        return float(setting("HORIZON_WARNING") or 0)

    def every(self) -> float:
        """Seconds between two looks (each one statement): the warning comes at most half the
        threshold late."""
        return min(60.0, max(1.0, self.threshold() / 2))

    def look(self) -> list[tuple[str, str]]:
        """Read each database once; return ``(level, message)`` lines to log (``"warning"`` or
        ``"info"``)."""
        limit = self.threshold()
        if limit <= 0:
            return []
        tables = queue_tables()
        if self.aliases is not None:
            tables = {alias: names for alias, names in tables.items() if alias in self.aliases}
        lines = []
        for alias, read in database_cleanup(tables).items():
            line = self._line(alias, read, limit)
            if line is not None:
                lines.append(line)
        return lines

    def _line(self, alias: str, read: Cleanup, limit: float) -> tuple[str, str] | None:
        holder, now = read.holder, time.monotonic()
        if holder is None or holder.seconds < limit:
            if alias not in self.warned:
                return None
            _, seconds = self.warned.pop(alias)
            return "info", (
                f"database {alias!r}: the transaction that held back cleanup "
                f"(open {_minutes(seconds)} or more) has ended"
            )
        last = self.warned.get(alias)
        if last is not None and now - last[0] < REPEAT_EVERY:
            return None
        self.warned[alias] = (now, holder.seconds)
        backlog = _backlog(read)
        return "warning", (
            f"database {alias!r}: a transaction open for {_minutes(holder.seconds)} holds back cleanup "
            f"of the queue tables ({holder.describe()}){backlog}; claims slow down until it ends: "
            f"see {ADVICE}"
        )


def _backlog(read: Cleanup) -> str:
    if read.purge_backlog is not None:
        return f"; InnoDB purge backlog {read.purge_backlog:,} undo records"
    dead = sum(read.dead_rows.values())
    return f"; {dead:,} dead row versions in them" if dead else ""
