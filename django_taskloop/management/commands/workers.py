"""``manage.py workers``: run the registered loop, board and tube handlers."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_taskloop.health import queue_tables
from django_taskloop.workers.outage import NotMigrated, Outages
from django_taskloop.workers.reload import reloading
from django_taskloop.workers.runner import run_workers


class Command(BaseCommand):
    help = (
        "Run the handlers registered with @loop, @tube and @board in installed apps' taskloop.py "
        "(and the queues of the Django Tasks backend). SIGTERM/SIGINT once: finish and stop; twice: stop now."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--processes", type=int, default=1, help="Worker processes to run (default 1).")
        parser.add_argument(
            "--only",
            action="append",
            metavar="NAME",
            help="Run only this handler (a tube's or board's name, a loop's model label, a Django Tasks "
            "queue's name); repeatable.",
        )
        parser.add_argument(
            "--concurrency",
            type=int,
            default=None,
            metavar="N",
            help="Items each process runs at once, each in a thread of its own (async def handlers on "
            "that thread's event loop); a handler's own concurrency= wins. Default: "
            "TASKLOOP['CONCURRENCY'], 1.",
        )
        parser.add_argument("--burst", action="store_true", help="Drain the work that is ready, then exit.")
        parser.add_argument(
            "--no-schedule",
            action="store_false",
            dest="schedule",
            help="Do not run the cron schedules (@periodic functions, TASKLOOP['SCHEDULE']).",
        )
        parser.add_argument(
            "--reload",
            action="store_true",
            help="Start the workers again when a Python file changes, once running work has finished "
            "(Django's autoreloader, as runserver's). Default: on when DEBUG is true, except with --burst.",
        )
        parser.add_argument(
            "--noreload", action="store_false", dest="reload", help="Do not reload on code changes."
        )
        parser.set_defaults(reload=None)

    def check(self, *args: Any, **kwargs: Any) -> None:
        """Django's system checks, once the queues' databases can be reached: Django 6 runs
        the model checks against them (MySQL's read its server's version), and a database down
        at start would be a traceback instead of one line per try."""
        _logger()
        try:
            Outages().wait(queue_tables(), time.sleep, lambda: False)
        except KeyboardInterrupt:
            sys.exit(130)
        super().check(*args, **kwargs)

    def handle(
        self,
        *args: Any,
        processes: int,
        concurrency: int | None,
        only: list[str] | None,
        burst: bool,
        schedule: bool,
        reload: bool | None,
        **options: Any,
    ) -> None:
        if processes < 1:
            raise CommandError("--processes must be at least 1")
        log = _logger()
        if options["verbosity"] >= 2:
            # -v 2 names every item as it starts and ends, with the traceback of each failure.
            log.setLevel(logging.DEBUG)
            for handler in log.handlers:
                handler.setLevel(logging.DEBUG)

        def work() -> int:
            return _work(only, processes, burst, schedule, concurrency)

        status = reloading(work) if reload_wanted(reload, burst) else work()
        if status:
            sys.exit(status)


def reload_wanted(asked: bool | None, burst: bool) -> bool:
    """Whether to reload on code changes: as asked (--reload, --noreload), else under DEBUG, as
    runserver does; not for a burst unless asked (it drains and exits: nothing to reload)."""
    if asked is not None:
        return asked
    return bool(settings.DEBUG) and not burst


def _work(
    only: list[str] | None, processes: int, burst: bool, schedule: bool, concurrency: int | None = None
) -> int:
    """Run the workers; return the exit status."""
    try:
        return run_workers(only, processes=processes, burst=burst, schedule=schedule, concurrency=concurrency)
    except NotMigrated as error:
        # One line instead of the traceback of the first missing table.
        raise CommandError(str(error), returncode=2)
    except ValueError as error:
        raise CommandError(str(error))
    except KeyboardInterrupt:
        # Ctrl-C while waiting for a database at start (the workers handle their own).
        sys.exit(130)


def _logger() -> logging.Logger:
    """django-taskloop's logger, with a stderr handler if nobody configured logging."""
    log = logging.getLogger("django_taskloop")
    if not log.hasHandlers():
        # Nobody configured logging: say what happens on stderr anyway.
        stderr = logging.StreamHandler(sys.stderr)
        stderr.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        log.addHandler(stderr)
        log.setLevel(logging.INFO)
    return log
