"""A worker's heartbeat thread: it renews the leases of the work in hand, beats for each queue
and for the worker process (its row on the dashboard), writes the throughput counts and the
handlers' progress, claims the schedules' due ticks, runs the reaper's upkeep and watches for a
transaction that holds back cleanup. At a stop it gives back at once what was claimed and not
started. Its every chore may fail without stopping the worker: the next beat, or the lease,
covers a missed one."""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
from collections.abc import Sequence

from django.db import connections

from .. import progress, schedules
from ..conf import setting
from ..engine import local_clock
from ..engine.deadline import bound_connects, bounded
from ..health import CleanupWatch
from ..models import WorkerProcess
from ..reaper import format_report, reap
from .batches import Chores, ThroughputCounts
from .drivers import AnyDriver
from .holdings import Holdings
from .outage import Outages, Parked, drop_broken_connections
from .settling import Settler
from .stop import Stop

__all__ = ["REAP_EVERY", "THROUGHPUT_EVERY", "Heart"]

logger = logging.getLogger("django_taskloop.workers")

#: Seconds between two runs of the reaper in a long-running worker process.
REAP_EVERY = 60.0
#: Seconds between two writes of a worker's throughput counts (the dashboard's per-minute rows).
THROUGHPUT_EVERY = 1.0


class Heart:
    """The heartbeat thread of the worker ``identity`` serving ``drivers``: :meth:`start` it,
    :meth:`finish` it when the work is over."""

    def __init__(
        self,
        identity: str,
        drivers: Sequence[AnyDriver],
        *,
        burst: bool,
        schedule: bool,
        stop: Stop,
        holdings: Holdings,
        settler: Settler,
        parked: Parked,
        outages: Outages,
        throughput: ThroughputCounts,
        board: progress.Board[AnyDriver],
    ) -> None:
        self.identity = identity
        self.drivers = list(drivers)
        self.burst = burst
        self.stop = stop
        self.holdings = holdings
        self.settler = settler
        self.parked = parked
        self.outages = outages
        # Done / failed / given back per driver, not yet written: written once a second
        # (THROUGHPUT_EVERY), off the batches' path.
        self.throughput = throughput
        # What the running handlers reported (progress.report): written at most once a second.
        self.progress = board
        # Cron schedules (@periodic, TASKLOOP["SCHEDULE"]): claimed by the heartbeat thread.
        self.ticker = schedules.ticker() if schedule else None
        # A transaction held open elsewhere: the heartbeat thread warns while it lasts.
        self.watch = CleanupWatch()
        # Set when the work is over: the thread's last writes, then it ends.
        self.beating = threading.Event()
        self.thread: threading.Thread | None = None

    def prepare(self) -> None:
        """Prepare the schedules; a burst runs what is due now (the heartbeat claims no ticks
        in a burst)."""
        if self.ticker is not None:
            self.ticker.prepare()
            if self.burst:
                self.tick()

    def start(self) -> None:
        self.thread = threading.Thread(
            target=self._heartbeat, args=(self.beating,), name="taskloop-heartbeat", daemon=True
        )
        self.thread.start()

    def finish(self) -> None:
        """Stop the heartbeat thread and wait for its last writes (throughput, goodbye)."""
        self.beating.set()
        self.stop.wake.set()  # the heartbeat may be waiting on it (no stop came: a burst's end)
        if self.thread is None:
            return
        # Its last writes within what is left of a stop's grace period: each is bounded
        # (DATABASE_TIMEOUT), but a database that hangs makes several add up.
        self.thread.join(timeout=min(30.0, max(1.0, self.stop.stop_by - time.monotonic())))

    def _heartbeat(self, stop: threading.Event) -> None:
        """Renew the leases of the work in hand and record that this worker is alive."""
        chores = Chores(
            drivers={driver: 0.0 for driver in self.drivers},
            # Long-running workers also do the reaper's upkeep (history and result pruning,
            # dead consumers), spread out so that N processes do not all reap at once.
            reap=time.monotonic() + REAP_EVERY * random.uniform(0.5, 1.0),
            flush=time.monotonic() + THROUGHPUT_EVERY,
            tick=0.0 if self.ticker is not None and not self.burst else float("inf"),
            cleanup=time.monotonic() + self.watch.every(),
        )
        bound_connects()
        try:
            while True:
                # A beat that met a dropped connection must not leave this thread's connection
                # broken for good (Django reconnects only at request boundaries).
                drop_broken_connections()
                if self.stop.stopping:
                    self.settler.give_back_unstarted()
                self._do_chores(chores)
                pause = chores.next_due() - time.monotonic()
                # Until a stop comes, the wait ends at the stop signal too (Stop.wake), so that
                # what was claimed and not started goes back at once.
                (stop if self.stop.stopping else self.stop.wake).wait(max(0.01, pause))
                if stop.is_set():
                    return
        finally:
            self.flush_throughput()
            self._say_goodbye()
            connections.close_all()

    def _do_chores(self, chores: Chores) -> None:
        """Do the heartbeat's chores that are due, and note when each is due next: the leases
        first, so that no other chore (a tick's enqueue, the reaper) delays their renewal."""
        self._beat_drivers(chores.drivers)
        if time.monotonic() >= chores.flush:
            chores.flush = time.monotonic() + THROUGHPUT_EVERY
            self.flush_throughput()
            self.write_progress()
        if time.monotonic() >= chores.process:
            chores.process = time.monotonic() + self._process_pace()
            try:
                self._beat_as_process()
            except Exception:
                self.outages.log_error("worker %s: heartbeat of the process failed", self.identity)
        if not self.burst and time.monotonic() >= chores.reap:
            chores.reap = time.monotonic() + REAP_EVERY * random.uniform(0.75, 1.25)
            self._reap()
        if time.monotonic() >= chores.tick:
            chores.tick = time.monotonic() + self.tick()
        if time.monotonic() >= chores.cleanup:
            chores.cleanup = time.monotonic() + self.watch.every()
            self._watch_cleanup()

    def flush_throughput(self) -> None:
        """Write the counts gathered since the last flush; a parked shard's wait for it."""
        self.throughput.flush(
            self.parked.quiet,
            lambda driver: self.outages.log_error(
                "could not record the throughput of %s", driver.describe_queue()
            ),
        )

    def write_progress(self) -> None:
        """Write what the handlers reported (at most once a second) and renew the leases of
        the queues that reported, as a beat does."""
        due = self.progress.due()
        if due is None:
            return
        reports, drivers = due
        entries = [
            {"kind": kind, "queue": queue, "item": item, "fraction": r.fraction, "message": r.message}
            for (kind, queue, item), r in reports.items()
        ]
        try:
            with bounded(WorkerProcess.objects.db):
                WorkerProcess.objects.report_progress(self.identity, entries)
            for driver in drivers:
                driver.renew(self.holdings.held(driver))
        except Exception:
            self.progress.unwritten()
            logger.exception("worker %s: could not write the progress of its handlers", self.identity)

    def _beat_as_process(self) -> None:
        """Say that this worker process is alive, what it serves and what it holds now."""
        holding = self.holdings.holding()
        with bounded(WorkerProcess.objects.db):
            WorkerProcess.objects.beat(
                self.identity,
                host=socket.gethostname(),
                pid=os.getpid(),
                queues=[f"{d.queue_kind}:{d.queue}" for d in self.drivers],
                holding=holding,
            )

    def _process_pace(self) -> float:
        """Seconds until the next beat of the process: every 5 s while holding work (the
        dashboard shows what); an idle worker has nothing new to say: HEARTBEAT_INTERVAL."""
        holding = self.holdings.any_inflight()
        pace = float(setting("HEARTBEAT_INTERVAL"))
        return min(pace, 5.0) if holding else pace

    def _reap(self) -> None:
        """Run the reaper once; its failure is logged, never fatal."""
        try:
            for line in format_report(reap()):
                logger.debug("reaper: %s", line)
        except Exception:
            self.outages.log_error("periodic reap failed")

    def _watch_cleanup(self) -> None:
        """Warn while a transaction elsewhere holds back cleanup of the queue tables."""
        try:
            for level, message in self.watch.look():
                logger.log(
                    logging.WARNING if level == "warning" else logging.INFO,
                    "worker %s: %s",
                    self.identity,
                    message,
                )
        except Exception:
            logger.debug("worker %s: could not read the databases' cleanup", self.identity, exc_info=True)

    def _beat_drivers(self, due: dict[AnyDriver, float]) -> None:
        """Renew the leases of each driver whose beat is ``due``, and beat it."""
        for driver in self.drivers:
            now = time.monotonic()
            if now < due[driver] or self.parked.quiet(driver):
                continue
            # Each driver beats at its own pace: a ttr tube's touch increment is its
            # interval, so beating it more often would push its deadline ever further.
            due[driver] = now + driver.beat_every
            # Finished items not yet acknowledged are renewed too: they must not
            # come back to run again while this worker retries their settle.
            held, generation = self.holdings.held_for_renewal(driver)
            at = local_clock()
            try:
                every_one = driver.renew(held)
                driver.beat()
                if every_one:
                    # What is not started yet may start without asking for a while longer.
                    self.holdings.renewed(driver, generation, held, at)
            except Exception:
                # A missed beat is not fatal: the next one, or the lease, covers it.
                self.outages.log_error("heartbeat of %s failed", driver.describe_queue())

    def _say_goodbye(self) -> None:
        """Remove this worker's process row (the dashboard's list of live workers)."""
        try:
            with bounded(WorkerProcess.objects.db):
                WorkerProcess.objects.gone(self.identity)
        except Exception:
            self.outages.log_error("worker %s: could not say goodbye", self.identity)

    def tick(self) -> float:
        """Claim the schedules' due ticks; return the seconds until the next look."""
        if self.ticker is None:
            return float("inf")
        try:
            return self.ticker.tick()
        except Exception:
            self.outages.log_error("worker %s: schedules could not be read", self.identity)
            return schedules.REFRESH
