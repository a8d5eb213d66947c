"""Schedules (SPEC §7): one row per ``@periodic`` function or ``TASKLOOP["SCHEDULE"]`` entry.

A row says when the schedule's next tick is due (``next_run_at``, database time) and when a
worker last claimed one (``last_run_at``). Workers write the rows from what the code declares
(:func:`django_taskloop.schedules.sync`); the admin pauses, resumes and runs them now through
the manager's verbs.

Claiming a tick is one conditional ``UPDATE`` (:meth:`ScheduleManager.claim_tick`): it moves
``next_run_at`` to the first tick after the database's "now" only where the row is due and not
paused, so exactly one claimer of all processes and hosts changes the row, and ticks missed
while no worker ran collapse into one.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from django.db import models

from .. import engine
from ..cron import parse_cron

__all__ = ["Schedule", "SCHEDULE_KINDS"]

#: ``periodic``: a ``@periodic`` function; ``task``: a Django Task of ``TASKLOOP["SCHEDULE"]``.
SCHEDULE_KINDS = ("periodic", "task")


class ScheduleManager(models.Manager["Schedule"]):
    """The verbs on schedules: claim a tick, run now, pause, resume."""

    def claim_tick(
        self,
        name: str,
        cron: str,
        next_after: Callable[[dt.datetime], dt.datetime],
        then: Callable[[dt.datetime], Any],
        using: str = "default",
    ) -> bool:
        """Claim the due tick of schedule ``name`` and call ``then(now)`` in the same transaction.

        Return whether this caller claimed it. The row must be due (``next_run_at`` at or before
        the database's clock), not paused, and still have ``cron`` (a worker running older code
        claims nothing once a newer one changed the schedule). ``next_after(now)`` gives the
        next tick: counted from *now*, not from the missed tick, so that missed ticks run once.
        What ``then`` writes (a Django Task, a run of a ``@periodic`` function) commits with the
        claim or not at all: a crash can neither lose nor double a tick.
        """

        def work() -> bool:
            now = engine.db_now(using)
            claimed = (
                self.using(using)
                .filter(name=name, cron=cron, paused=False, next_run_at__lte=engine.DbNow())
                .update(
                    next_run_at=next_after(now),
                    last_run_at=engine.DbNow(),
                    runs=models.F("runs") + 1,
                )
            )
            if claimed:
                then(now)
            return bool(claimed)

        return engine.run_in_transaction(Schedule, using, work)

    def run_now(self, name: str, using: str = "default") -> None:
        """Make schedule ``name``'s next tick due now: the first worker to look runs it, once.

        ``LookupError`` for an unknown name, ``ValueError`` for a paused schedule (resume it
        first: a paused schedule runs nothing).
        """
        row = self.using(using).filter(name=name).only("paused").first()
        if row is None:
            raise LookupError(f"no schedule named {name!r}")
        if row.paused:
            raise ValueError(f"schedule {name!r} is paused: resume it to run it")
        self.using(using).filter(name=name, paused=False).update(next_run_at=engine.DbNow())

    def pause(self, name: str, using: str = "default") -> None:
        """Pause schedule ``name``: no tick runs until it is resumed. Pausing twice is a no-op."""
        if not self.using(using).filter(name=name).update(paused=True):
            raise LookupError(f"no schedule named {name!r}")

    def resume(self, name: str, using: str = "default") -> None:
        """Resume schedule ``name``; its next tick is the first one after now (the ticks missed
        while it was paused do not run). Resuming a running schedule is a no-op."""
        row = self.using(using).filter(name=name).first()
        if row is None:
            raise LookupError(f"no schedule named {name!r}")
        if not row.paused:
            return
        next_run = parse_cron(row.cron).next_after(engine.db_now(using), row.time_zone)
        self.using(using).filter(name=name, paused=True).update(paused=False, next_run_at=next_run)


class Schedule(models.Model):
    """A cron schedule that workers run once per tick across every process and host."""

    name = models.CharField(max_length=100, unique=True)
    kind = models.CharField(max_length=8, choices=[(k, k) for k in SCHEDULE_KINDS])
    #: The five-field cron expression.
    cron = models.CharField(max_length=255)
    #: The IANA time zone the cron expression is read in (``TASKLOOP["TIME_ZONE"]``).
    time_zone = models.CharField(max_length=64, default="UTC")
    #: The ``@periodic`` function's or the Django Task's dotted path.
    target = models.CharField(max_length=255)
    #: When the next tick is due (database time); claiming a tick moves it.
    next_run_at = models.DateTimeField()
    #: When a worker last claimed a tick (database time).
    last_run_at = models.DateTimeField(null=True, blank=True)
    #: Ticks claimed so far.
    runs = models.PositiveBigIntegerField(default=0)
    paused = models.BooleanField(default=False)
    #: The last error of a run or an enqueue, with its time; empty after a success.
    last_error = models.TextField(blank=True, default="")

    objects = ScheduleManager()

    class Meta:
        app_label = "django_taskloop"
        db_table = "taskloop_schedule"
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.cron})"
