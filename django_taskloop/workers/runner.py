"""The worker loop (one process) and the supervisor that keeps ``--processes N`` of them running.

Stopping is two-stage, as in django-tasks: the first SIGTERM/SIGINT stops claiming and lets the
work in hand finish within ``TASKLOOP["GRACE_PERIOD"]`` seconds, then gives back whatever is
left; a second signal (or the end of the grace period) interrupts the handler and gives
everything back at once.

The :class:`Worker` runs rounds and idles between them. Its parts: :mod:`.stop` (the stop
signals), :mod:`.running` (a batch's life), :mod:`.settling` (acknowledgements, failures, what
goes back), :mod:`.heartbeat` (the heartbeat thread) and :mod:`.holdings` (what they share).
"""

from __future__ import annotations

import functools
import logging
import os
import random
import signal
import socket
import sys
import time
from collections.abc import Sequence

from django.db import DatabaseError, connections

from .. import progress, schedules, wakeup
from ..conf import setting
from ..engine import local_clock
from ..engine.deadline import bound_connects
from ..exceptions import DatabaseBusy
from ..validation import check_count
from . import Handler, get_handlers, serving, shard_handlers
from .batches import Tally, ThroughputCounts, progress_key
from .drivers import AnyDriver, TubeDriver, make_driver, tubes_worth_trying
from .heartbeat import Heart
from .holdings import Holdings
from .outage import Outages, Parked, check_databases, refuse_unmigrated
from .running import BatchRunner
from .settling import Settler
from .stop import Stop
from .supervisor import STOP_SIGNALS, Supervisor

__all__ = ["Worker", "run_workers"]

logger = logging.getLogger("django_taskloop.workers")

#: Database errors in a row after which a worker gives up (its supervisor restarts it).
MAX_CONSECUTIVE_ERRORS = 10
#: Longest wait of an idle one-tube worker in one take (a stop ends it within a poll).
IDLE_WAIT = 30.0


class Worker:
    """Run ``handlers`` in this process until stopped (or, with ``burst``, until idle).

    The worker runs rounds and idles between them; its parts do the rest: :class:`~.stop.Stop`
    hears the stop signals, :class:`~.running.BatchRunner` runs each batch,
    :class:`~.settling.Settler` settles what the batches claimed, and :class:`~.heartbeat.Heart`
    beats in a thread of its own. :class:`~.holdings.Holdings` is what they share: the items
    held, under one lock.
    """

    def __init__(
        self,
        handlers: Sequence[Handler],
        *,
        burst: bool = False,
        identity: str | None = None,
        supervised: bool = False,
        schedule: bool = True,
        concurrency: int | None = None,
    ) -> None:
        self.identity = identity or f"{socket.gethostname()}:{os.getpid()}:worker"
        # A tube spread over several databases (SHARDS): one driver per shard.
        self.drivers: list[AnyDriver] = [
            make_driver(handler, self.identity) for handler in shard_handlers(handlers)
        ]
        self.burst = burst
        self.tallies = {driver.handler.name: Tally() for driver in self.drivers}
        self.stop = Stop(self.identity, supervised=supervised)
        self.holdings = Holdings()
        # The databases found down: the thread that met the outage says so, the others keep quiet.
        self.outages = Outages()
        # Serving several databases (shards): those found down wait, the others go on.
        self.parked = Parked(self.drivers)
        # Done / failed / given back per driver, not yet written: the heartbeat writes them.
        throughput = ThroughputCounts(self.holdings.lock)
        # What the running handlers report (progress.report): the heartbeat writes it.
        board: progress.Board[AnyDriver] = progress.Board(progress_key)
        self.settler = Settler(
            self.identity,
            holdings=self.holdings,
            parked=self.parked,
            outages=self.outages,
            tallies=self.tallies,
            throughput=throughput,
        )
        self.batches = self._batch_runner(throughput, board, concurrency)
        self.heart = Heart(
            self.identity,
            self.drivers,
            burst=burst,
            schedule=schedule,
            stop=self.stop,
            holdings=self.holdings,
            settler=self.settler,
            parked=self.parked,
            outages=self.outages,
            throughput=throughput,
            board=board,
        )

    def _batch_runner(
        self, throughput: ThroughputCounts, board: progress.Board[AnyDriver], concurrency: int | None
    ) -> BatchRunner:
        """The runner of this worker's batches, ``concurrency`` items at a time (``None``:
        ``TASKLOOP["CONCURRENCY"]``) unless a handler says otherwise."""
        return BatchRunner(
            stop=self.stop,
            holdings=self.holdings,
            settler=self.settler,
            tallies=self.tallies,
            throughput=throughput,
            board=board,
            concurrency=concurrency_of(concurrency),
            serving_several=len(self.drivers) > 1,
        )

    # The loop ----------------------------------------------------------------------------

    def run(self) -> int:
        """Work until stopped; return the process exit status (0 when all went well)."""
        bound_connects()
        while True:
            try:
                self._prepare()
                break
            except (DatabaseError, DatabaseBusy):
                connections.close_all()
                if not self.outages.wait(self._databases(), time.sleep, lambda: False):
                    refuse_unmigrated(self.drivers)  # one line instead of "no such table"
                    raise
        previous = self.stop.install_signals()
        self.heart.start()
        started = time.monotonic()
        try:
            self._work()
        finally:
            self._wind_down()
            self.log_summary(time.monotonic() - started)
            connections.close_all()
            wakeup.close_listeners()
            self.stop.restore_signals(previous)
        return 0

    def _prepare(self) -> None:
        """Create what the handlers serve; in a burst, run the schedules' ticks due now."""
        self.parked.prepare(self.drivers)
        self.heart.prepare()
        # One LISTEN session (PostgreSQL) for the life of this worker, not one per wait.
        wakeup.keep_listeners()

    def _work(self) -> None:
        """Run rounds until a stop (or, in a burst, until a round finds nothing and nothing
        is claimable in its tubes); idle between them as cheaply as the handlers allow."""
        idle = float(setting("POLL_MIN"))
        tubes = [driver for driver in self.drivers if isinstance(driver, TubeDriver)]
        # Tubes that the last poll found nothing in: the round after it does not claim there.
        skip: set[AnyDriver] = set()
        errors = 0
        while not self.stop.stopping:
            try:
                worked = self._round(skip)
                skip, errors = set(), 0
            except (DatabaseError, DatabaseBusy):
                errors = self._database_error(errors)
                continue
            if worked:
                idle = float(setting("POLL_MIN"))
                continue
            if self.burst:
                if self._burst_over(tubes):
                    break
                self.stop.wake.wait(idle)
                idle = min(idle * float(setting("POLL_FACTOR")), float(setting("POLL_MAX")))
                continue
            if self.stop.supervisor_gone():
                logger.warning("worker %s: supervisor gone, stopping", self.identity)
                break
            if len(tubes) == len(self.drivers) and len({driver.using for driver in tubes}) == 1:
                errors = self._block(tubes, errors)
            else:
                skip = self._poll(tubes, idle)
                idle = min(idle * float(setting("POLL_FACTOR")), float(setting("POLL_MAX")))

    def _burst_over(self, tubes: list[TubeDriver]) -> bool:
        """Say whether a burst whose last round found nothing is over: its tubes have nothing
        claimable by a plain read. A claim skips the rows other transactions hold (a rival's
        claim in flight may leave them ready), so an empty claim alone proves nothing; nor does a
        look from the claim cursor (a task a rival held as we claimed past it may be back)."""
        try:
            return len(self._not_worth_trying(tubes, from_head=True)) == len(tubes)
        except (DatabaseError, DatabaseBusy):
            return False

    def _round(self, skip: set[AnyDriver]) -> int:
        """Settle what earlier rounds kept, then run a batch of each driver (but those in
        ``skip``, unless a batch of theirs is claimed ahead); return how many items ran."""
        worked = 0
        self.settler.settle_pending()
        for driver in self.drivers:
            if self.stop.stopping:
                break
            if not self.parked.ready(driver):  # its database is a shard found down: its queue waits
                continue
            if driver in self.holdings.prefetched or driver not in skip:
                try:
                    worked += self.batches.run(driver, self.holdings.prefetched.pop(driver, ()))
                except (DatabaseError, DatabaseBusy):
                    if not self.parked.park_queue(driver):
                        raise
        return worked

    # Idle --------------------------------------------------------------------------------

    def _block(self, tubes: list[TubeDriver], errors: int) -> int:
        """Idle, every handler a tube of one database: block until a put wakes them (NOTIFY
        on PostgreSQL, a backed-off poll elsewhere), a stop, or ``IDLE_WAIT`` seconds, and run
        what came. Return the count of database errors in a row."""
        try:
            if len(tubes) == 1:
                self._wait_one(tubes[0])
            else:
                self._wait_tubes(tubes)
        except (DatabaseError, DatabaseBusy):
            return self._database_error(errors)
        return errors

    def _wait_one(self, driver: TubeDriver) -> None:
        """One tube: block in take(timeout), which costs one cheap read per poll; run the task
        it brings at once (latency matters more than the batch; the next round claims in bulk)."""
        first = driver.wait_one(IDLE_WAIT, stop=self._idle_over)
        if first:
            # Taken a moment ago, at the end of the wait.
            self.batches.run(driver, first, claimed_at=local_clock())

    def _poll(self, tubes: list[TubeDriver], idle: float) -> set[AnyDriver]:
        """Idle: wait ``idle`` seconds (polls spaced out up to POLL_MAX; one indexed query per
        loop and board), then return the tubes not worth a take (one read for all of them)."""
        self.stop.wake.wait(idle)
        try:
            return self._not_worth_trying(tubes)
        except (DatabaseError, DatabaseBusy):
            return set()  # the round claims from them, and deals with the error

    def _wait_tubes(self, tubes: list[TubeDriver]) -> int:
        """Idle, every handler a tube of one database: sleep on their wake-ups together, with
        one read per poll for all of them, until some are worth a take (run a batch of each,
        return how many ran), a stop, or ``IDLE_WAIT`` seconds."""
        by_pk = {driver.tube.pk: driver for driver in tubes}
        waiter = wakeup.Waiter(tubes[0].using, list(by_pk))
        try:
            end = time.monotonic() + IDLE_WAIT
            # First a read now that the waiter listens: a put since the last round shows here.
            while not self._idle_over():
                worth = tubes_worth_trying(tubes)
                worked = 0
                for pk, driver in by_pk.items():
                    if worth.get(pk) and not self.stop.stopping:
                        at = local_clock()
                        items = driver.claim(self.batches.batch_size(driver), checked=worth[pk] == "ready")
                        if items:
                            worked += self.batches.run(driver, items, claimed_at=at)
                left = end - time.monotonic()
                if worked or left <= 0:
                    return worked
                waiter.sleep(left)
            return 0
        finally:
            waiter.close()

    def _not_worth_trying(self, tubes: list[TubeDriver], from_head: bool = False) -> set[AnyDriver]:
        """Return the tube drivers whose tube has nothing worth a take now (a read per database;
        ``from_head``: each tube read from its head, not from where the claims stand)."""
        skip: set[AnyDriver] = set()
        for using in {driver.using for driver in tubes}:
            mine = [driver for driver in tubes if driver.using == using]
            if any([not self.parked.ready(driver) for driver in mine]):  # each prepared once it is back
                skip.update(mine)
                continue
            try:
                worth = tubes_worth_trying(mine, from_head=from_head)
            except (DatabaseError, DatabaseBusy):
                if self.parked.park_queue(mine[0]):
                    skip.update(mine)
                    continue
                raise
            skip.update(driver for driver in mine if not worth.get(driver.tube.pk, True))
        return skip

    def _idle_over(self) -> bool:
        """Say whether an idle wait must end: a stop came, or the supervisor is gone."""
        return self.stop.stopping or self.stop.supervisor_gone()

    # Errors and the end ------------------------------------------------------------------

    def _database_error(self, errors: int) -> int:
        """Deal with the database error being handled: wait out an outage (one line per try,
        however long), else log it, reconnect and back off; re-raise when it persists.

        The database went away or stayed locked: what this worker held comes back when its
        lease ends, so going on after a reconnect loses nothing.
        """
        connections.close_all()
        if self.outages.wait(self._databases(), self.stop.wake.wait, self._idle_over):
            return 0  # it was down and is back (or a stop came): no error of ours to count
        errors += 1
        if errors >= MAX_CONSECUTIVE_ERRORS:
            raise
        logger.exception("worker %s: database error (%d in a row), retrying", self.identity, errors)
        # Jitter keeps workers that met the same outage from coming back in step.
        self.stop.wake.wait(min(5.0, 0.1 * 2**errors) * random.uniform(0.5, 1.5))
        return errors

    def _databases(self) -> list[str]:
        """The aliases of the databases this worker's queues live on."""
        return list(dict.fromkeys(driver.using for driver in self.drivers))

    def _wind_down(self) -> None:
        """Give back and settle what is left, then stop the heartbeat thread."""
        self.stop.disarm()
        self.batches.close()
        self.settler.give_back_prefetched()
        self.settler.settle_at_stop(self.stop.stop_by)
        self.heart.finish()

    def log_summary(self, elapsed: float) -> None:
        """Log one line per queue: a Django Tasks queue's plain and keyed handlers are one."""
        merged: dict[str, Tally] = {}
        # Once per handler name: the shards of one tube share their tally.
        for name, title in dict.fromkeys(
            (driver.handler.name, driver.handler.title) for driver in self.drivers
        ):
            tally = self.tallies[name]
            into = merged.setdefault(title, Tally())
            for field in ("batches", "done", "failed", "given_back", "seconds"):
                setattr(into, field, getattr(into, field) + getattr(tally, field))
        for title, tally in merged.items():
            rate = tally.done / elapsed if elapsed > 0 else 0.0
            logger.info(
                "summary %s: %d done, %d failed, %d given back in %d batches; %.1f s, %.0f/s",
                title,
                tally.done,
                tally.failed,
                tally.given_back,
                tally.batches,
                elapsed,
                rate,
            )


def concurrency_of(asked: int | None) -> int:
    """The items a worker process runs at once of a handler that sets no ``concurrency``: as
    asked (``--concurrency``), else ``TASKLOOP["CONCURRENCY"]``."""
    return int(setting("CONCURRENCY")) if asked is None else check_count(asked, "concurrency", minimum=1)


def _child(names: list[str], burst: bool, schedule: bool = True, concurrency: int | None = None) -> None:
    # Own process group: a Ctrl-C in the terminal reaches the supervisor alone, which passes
    # it on once; otherwise every child would see it twice and stop at once.
    os.setpgrp()
    # Forget the supervisor's signal handlers, then take the stop signals that the supervisor
    # blocked while forking: a SIGTERM before the Worker installs its own must stop this child
    # (it holds nothing yet), not run the parent's handler here.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    connections.close_all()
    handlers = get_handlers(names)
    sys.exit(Worker(handlers, burst=burst, supervised=True, schedule=schedule, concurrency=concurrency).run())


def run_workers(
    only: Sequence[str] | None = None,
    *,
    processes: int = 1,
    burst: bool = False,
    schedule: bool = True,
    concurrency: int | None = None,
) -> int:
    """Run the handlers (all, or those named in ``only``) in ``processes`` worker processes;
    with ``schedule``, each also claims the due ticks of the cron schedules. Each process runs
    up to ``concurrency`` items at once (``None``: ``TASKLOOP["CONCURRENCY"]``) of a handler
    that sets no ``concurrency`` of its own.

    With one process the worker runs in this one. With more, this process supervises: it
    restarts a child that dies (``kill -9``, a crash) and passes signals on to the children.
    Return the exit status. A database the handlers use that lacks their tables raises
    :class:`~.outage.NotMigrated` before anything starts; no handler at all, a ``ValueError``
    saying what to configure (a process manager must not restart it forever).
    """
    handlers = serving(only)
    if schedule:
        schedules.configured()  # a bad schedule stops the command here, before any process starts
    check_databases(shard_handlers(handlers), processes)
    at_once = concurrency_of(concurrency)
    logger.info(
        "starting %d worker process(es)%s%s for: %s",
        processes,
        f", {at_once} items at a time each" if at_once > 1 else "",
        " (burst)" if burst else "",
        # A Django Tasks queue once, by its Django name (its plain and keyed handlers).
        ", ".join(dict.fromkeys(handler.described for handler in handlers)),
    )
    if processes == 1:
        return Worker(handlers, burst=burst, schedule=schedule, concurrency=concurrency).run()
    return Supervisor(
        handlers, processes, burst, schedule, child=functools.partial(_child, concurrency=concurrency)
    ).run()
