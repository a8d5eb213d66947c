"""``manage.py reap_locks``: return expired locks and claims, dead consumers' tasks; prune."""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from django_taskloop.reaper import format_report, reap


class Command(BaseCommand):
    help = (
        "Reap every loop, board and tube once (or every SECONDS with --every): expired claims, "
        "dead consumers' tasks, ttl/ttr/delay transitions, old history; print what was done."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--every", type=float, metavar="SECONDS", help="Repeat every SECONDS until stopped."
        )
        parser.add_argument("--database", help="Database alias to reap (default: each model's routed alias).")

    def handle(self, *args: Any, every: float | None, database: str | None, **options: Any) -> None:
        if every is not None and not every > 0:
            raise CommandError("--every must be a positive number of seconds")
        if database is not None and database not in connections:
            raise CommandError(
                f"--database {database!r} is not a database alias; known: {', '.join(connections)}"
            )
        try:
            while True:
                started = time.monotonic()
                for line in format_report(reap(database)):
                    self.stdout.write(line)
                if every is None:
                    return
                self.stdout.flush()
                time.sleep(max(0.0, every - (time.monotonic() - started)))
        except KeyboardInterrupt:
            return
