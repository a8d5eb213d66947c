"""What a worker says and does when a database cannot be reached or has no tables yet: one line
per backoff step naming the alias and host until the database is back (then one line), and one
line that says to run ``migrate`` instead of the traceback of the first missing table."""

from __future__ import annotations

import logging
import random
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from django.db import DatabaseError, connections, router
from django.db.migrations.executor import MigrationExecutor

from ..engine.reach import unreachable
from ..exceptions import DatabaseBusy
from ..models import JobBoard, Tube
from . import Handler
from .drivers import AnyDriver, make_driver

logger = logging.getLogger("django_taskloop.workers")

__all__ = [
    "NotMigrated",
    "Outages",
    "check_databases",
    "describe",
    "drop_broken_connections",
    "refuse_unmigrated",
    "first_line",
    "not_migrated",
    "tables_missing",
    "unreachable",
]

#: Longest wait between two tries to reach a database that is down (seconds).
LONGEST_STEP = 5.0


class NotMigrated(Exception):
    """A database the handlers use lacks migrations their tables need (``manage.py migrate``)."""


def describe(alias: str) -> str:
    """Name database ``alias`` with where it lives: ``'default' (db.example:5432)``."""
    settings = connections[alias].settings_dict
    host = settings.get("HOST")
    # No host: a local socket (PostgreSQL, MySQL) or a file (SQLite): its name says more.
    where = (
        (f"{host}:{settings['PORT']}" if settings.get("PORT") else str(host))
        if host
        else settings.get("NAME")
    )
    return f"{alias!r} ({where})"


def first_line(error: BaseException) -> str:
    """Return ``Type: the first line of the message`` (drivers' errors run over several lines)."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


class Outages:
    """The databases this worker found down, shared by its threads: the thread that met the
    outage waits it out and says so; the others keep quiet about what it already said."""

    def __init__(self) -> None:
        self.down: set[str] = set()
        self.lock = threading.Lock()

    def any_down(self) -> bool:
        with self.lock:
            return bool(self.down)

    def log_error(self, message: str, *args: Any) -> None:
        """Log the error being handled after ``message``: a database error in one line (at
        debug level while a database is known down: the outage's lines say it already),
        anything else with its traceback."""
        error = sys.exc_info()[1]
        if not isinstance(error, (DatabaseError, DatabaseBusy)):
            logger.exception(message, *args)
            return
        level = logging.DEBUG if self.any_down() else logging.WARNING
        logger.log(level, message + ": %s", *args, first_line(error))

    def find_down(self, aliases: Iterable[str]) -> tuple[str, DatabaseError] | None:
        """Return the first of ``aliases`` that cannot be reached, with its error."""
        for alias in dict.fromkeys(aliases):
            error = unreachable(alias)
            if error is not None:
                return alias, error
        return None

    def wait(self, aliases: Iterable[str], pause: Callable[[float], Any], stop: Callable[[], bool]) -> bool:
        """Wait until every one of ``aliases`` can be reached, trying again with a growing
        delay (``pause(seconds)``) and one line per step; return ``False`` if nothing was down.
        A ``stop()`` ends the wait early."""
        aliases = list(aliases)
        found = self.find_down(aliases)
        if found is None:
            return False
        started, step = time.monotonic(), 0
        while found is not None and not stop():
            alias, error = found
            with self.lock:
                self.down.add(alias)
            step += 1
            # Jitter keeps the workers that met the same outage from coming back in step.
            delay = min(LONGEST_STEP, 0.25 * 2**step) * random.uniform(0.8, 1.2)
            logger.warning(
                "database %s is unreachable (%s); trying again in %.1f s",
                describe(alias),
                first_line(error),
                delay,
            )
            pause(delay)
            back = self.find_down([alias])
            if back is None:
                self._back(alias, time.monotonic() - started)
            found = back or self.find_down(aliases)
        return True

    def _back(self, alias: str, seconds: float) -> None:
        with self.lock:
            self.down.discard(alias)
        logger.warning("database %s is back after %.0f s", describe(alias), seconds)


def tables_missing(alias: str, tables: Iterable[str]) -> bool:
    """Say whether database ``alias`` lacks one of ``tables`` (one cheap look at its catalogue)."""
    return not set(tables) <= set(connections[alias].introspection.table_names())


def not_migrated(aliases: Iterable[str], apps: Iterable[str]) -> str | None:
    """Return the line that says which of ``aliases`` lacks migrations of ``apps`` (the tables
    the handlers need), or ``None`` when all are applied."""
    wanted = set(apps)
    for alias in dict.fromkeys(aliases):
        executor = MigrationExecutor(connections[alias])
        plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
        missing = [
            migration
            for migration, _backwards in plan
            if migration.app_label in wanted and router.allow_migrate(alias, migration.app_label)
        ]
        if missing:
            labels = sorted({migration.app_label for migration in missing})
            command = "manage.py migrate" + ("" if alias == "default" else f" --database {alias}")
            return (
                f"database {describe(alias)} lacks the tables of {', '.join(labels)} "
                f"({len(missing)} migration(s) not applied): run {command}"
            )
    return None


def drop_broken_connections() -> None:
    """Close this thread's connections that an error left unusable, so the next use reconnects."""
    for connection in connections.all(initialized_only=True):
        if connection.connection is None or not connection.errors_occurred or connection.in_atomic_block:
            continue
        if connection.is_usable():
            connection.errors_occurred = False
        else:
            connection.close()


def refuse_unmigrated(drivers: Sequence[AnyDriver]) -> None:
    """Raise :class:`NotMigrated` if a database of ``drivers`` lacks the tables they need (the
    migrations of django_taskloop and of the loops' apps)."""
    aliases = list(dict.fromkeys(driver.using for driver in drivers))
    loops = (driver.handler.target._meta.app_label for driver in drivers if driver.queue_kind == "loop")
    missing = not_migrated(aliases, {"django_taskloop", *loops})
    if missing is not None:
        raise NotMigrated(missing)


def check_databases(handlers: Sequence[Handler], processes: int) -> None:
    """Wait until the handlers' databases can be reached (one line per try); raise
    :class:`NotMigrated` if one lacks their tables. The look is one read of each database's
    table names; which migrations are missing is read (every migration file) only then, and
    when the worker's start meets a database error (a migration not applied since an upgrade)."""
    drivers = [make_driver(handler, "") for handler in handlers]
    aliases = list(dict.fromkeys(driver.using for driver in drivers))
    Outages().wait(aliases, time.sleep, lambda: False)
    tables = {model._meta.db_table for model in (Tube, JobBoard)}
    tables |= {driver.handler.target._meta.db_table for driver in drivers if driver.queue_kind == "loop"}
    if any(tables_missing(alias, tables) for alias in aliases):
        refuse_unmigrated(drivers)
    if processes > 1:
        connections.close_all()  # no connection of the supervisor's is shared with its children


class Parked:
    """The shards a worker serving several databases found down: their queues wait (looked at
    again every few seconds, and prepared once back) while the worker goes on with the others.
    A worker of one database waits its outage out instead (:meth:`Outages.wait`)."""

    def __init__(self, drivers: Sequence[AnyDriver] = ()) -> None:
        #: The drivers of the worker: serving one database, it waits an outage out instead.
        self.drivers = list(drivers)
        #: alias -> (when it was parked, when to look at it again) (monotonic)
        self.until: dict[str, tuple[float, float]] = {}
        #: Drivers not prepared yet: their database was down when the worker started.
        self.unprepared: set[AnyDriver] = set()

    def prepare(self, drivers: Sequence[AnyDriver]) -> None:
        """Prepare ``drivers``; with several databases, those of a database that is down wait
        (prepared by :meth:`ready` once it is back). Database errors propagate otherwise."""
        several = len({driver.using for driver in drivers}) > 1
        for driver in drivers:
            try:
                driver.prepare()
            except DatabaseError:
                if not (several and self.park(driver.using)):
                    raise
                self.unprepared.add(driver)

    def ready(self, driver: AnyDriver) -> bool:
        """Say whether ``driver`` may be used now: its database is not parked (or is back)
        and the driver is prepared (it is prepared here if need be)."""
        if self.until and self.skip(driver.using):
            return False
        if driver in self.unprepared:
            try:
                driver.prepare()
            except DatabaseError:
                if self.park(driver.using):
                    return False
                raise
            self.unprepared.discard(driver)
        return True

    def quiet(self, driver: AnyDriver) -> bool:
        """Say whether the heartbeat leaves ``driver`` alone (its database is parked, or it is
        not prepared yet): a beat there could only fail."""
        return driver.using in self.until or driver in self.unprepared

    def park_queue(self, driver: AnyDriver) -> bool:
        """After a database error on ``driver``'s database: if this worker serves several and
        that one cannot be reached, park it (the others go on) and return ``True``."""
        return len({each.using for each in self.drivers}) > 1 and self.park(driver.using)

    def park(self, alias: str) -> bool:
        """After a database error on ``alias``: park it if it cannot be reached (say so once);
        return whether it was parked."""
        error = unreachable(alias)
        if error is None:
            return False
        now = time.monotonic()
        if alias not in self.until:
            logger.warning(
                "database %s is unreachable (%s); its queues wait for it, the others go on",
                describe(alias),
                first_line(error),
            )
        since = self.until.get(alias, (now, now))[0]
        self.until[alias] = (since, now + LONGEST_STEP * random.uniform(0.8, 1.2))
        return True

    def skip(self, alias: str) -> bool:
        """Say whether ``alias`` is parked now; one due for a look is looked at (and let go,
        with a line, if it is back)."""
        parked = self.until.get(alias)
        if parked is None:
            return False
        since, until = parked
        if time.monotonic() < until:
            return True
        if self.park(alias):
            return True
        del self.until[alias]
        logger.warning("database %s is back after %.0f s", describe(alias), time.monotonic() - since)
        return False
