"""``manage.py reap_locks``: return expired locks and claims, dead consumers' tasks; prune.

A database that cannot be reached (a shard whose server is down) is skipped and the others
reaped; one line on stderr names it. Run once, the command then exits with
:data:`SKIPPED_A_DATABASE` (3): the rest was done, and a timer or cron job still sees that
something was left (1 stays "nothing was done": a traceback, the router's database down).
``--every`` says it each round and goes on, as workers wait out an outage.
"""

from __future__ import annotations

import signal
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from django_taskloop.health import vacuum_queue_tables
from django_taskloop.management.terminal.trouble import checked_databases
from django_taskloop.reaper import format_report, reap
from django_taskloop.stopping import StopEvent
from django_taskloop.workers.outage import describe

#: Seconds a stopped ``--every`` loop may take to finish its round before the process ends anyway.
STOP_WITHIN = 20
#: The exit status of a run that reaped every database it could reach and skipped one or more.
SKIPPED_A_DATABASE = 3


class Command(BaseCommand):
    help = (
        "Reap every loop, board and tube once (or every SECONDS with --every): expired claims, "
        "dead consumers' tasks, ttl/ttr/delay transitions, old history; print what was done."
    )

    def check(self, *args: Any, **kwargs: Any) -> None:
        """Django's system checks on the databases that answer (a shard that is down is reaped
        around, and named, not a traceback: see :func:`checked_databases`)."""
        kwargs["databases"] = checked_databases(kwargs.get("databases"))
        super().check(*args, **kwargs)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--every", type=float, metavar="SECONDS", help="Repeat every SECONDS until stopped."
        )
        parser.add_argument("--database", help="Database alias to reap (default: each model's routed alias).")
        parser.add_argument(
            "--vacuum",
            action="store_true",
            help="After an incident (a transaction held open for long): VACUUM the queue tables "
            "(PostgreSQL) so that their dead row versions' space is reused; then exit.",
        )
        parser.add_argument(
            "--reindex",
            action="store_true",
            help="With --vacuum: also rebuild their indexes without blocking the queue (PostgreSQL: "
            "REINDEX CONCURRENTLY; MariaDB/MySQL: OPTIMIZE TABLE).",
        )

    def handle(
        self,
        *args: Any,
        every: float | None,
        database: str | None,
        vacuum: bool = False,
        reindex: bool = False,
        **options: Any,
    ) -> None:
        if every is not None and not every > 0:
            raise CommandError("--every must be a positive number of seconds")
        if database is not None and database not in connections:
            raise CommandError(
                f"--database {database!r} is not a database alias; known: {', '.join(connections)}"
            )
        if reindex and not vacuum:
            raise CommandError("--reindex goes with --vacuum")
        if vacuum:
            if every is not None:
                raise CommandError("--vacuum runs once: leave out --every")
            for line in vacuum_queue_tables(database, reindex=reindex):
                self.stdout.write(line)
            return
        if every is None:
            skipped = self.round(database)
            if skipped:
                raise CommandError(skipped, returncode=SKIPPED_A_DATABASE)
            return
        # Stop between two rounds, never in the middle of one: the first SIGINT/SIGTERM ends the
        # sleep at once or lets the round in hand finish; a second one (or a round still stuck
        # STOP_WITHIN seconds later, e.g. on a locked SQLite file) ends the process.
        stop = StopEvent()  # (not a threading.Event: a handler sets it; see StopEvent)

        def on_signal(signum: int, frame: Any) -> None:
            if stop.is_set():
                raise SystemExit(128 + signum)
            stop.set()
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            signal.alarm(STOP_WITHIN)

        # Explicitly ours: a process started in the background of a shell (or by a parent that
        # had them blocked) inherits SIGINT ignored or both blocked, and would never stop.
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, on_signal)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
        while not stop.is_set():
            started = time.monotonic()
            skipped = self.round(database)
            if skipped:
                self.stderr.write(skipped)
            self.stdout.flush()
            stop.wait(max(0.0, every - (time.monotonic() - started)))
        signal.alarm(0)

    def round(self, database: str | None) -> str:
        """Reap once and print what was done; return the line that names the databases
        skipped because they could not be reached (``""``: none)."""
        down: dict[str, str] = {}
        for line in format_report(reap(database, down)):
            self.stdout.write(line)
        if not down:
            return ""
        which = "; ".join(f"{describe(alias)}: {reason}" for alias, reason in down.items())
        return f"skipped unreachable {'databases' if len(down) > 1 else 'database'} {which} (the others were reaped)"
