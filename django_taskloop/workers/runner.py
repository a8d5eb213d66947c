"""The worker loop (one process) and the supervisor that keeps ``--processes N`` of them running.

Stopping is two-stage, as in django-tasks: the first SIGTERM/SIGINT stops claiming and lets the
work in hand finish within ``TASKLOOP["GRACE_PERIOD"]`` seconds, then gives back whatever is
left; a second signal (or the end of the grace period) interrupts the handler and gives
everything back at once.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

from django.db import DatabaseError, connections

from .. import progress, schedules, wakeup
from ..conf import setting
from ..engine.deadline import bound_connects, bounded
from ..exceptions import DatabaseBusy
from ..health import CleanupWatch
from ..models import Failure, WorkerProcess
from ..reaper import format_report, reap
from . import FailedForGood, Handler, StopNow, get_handlers, inside_user_code, serving, shard_handlers
from .batches import Batch, Chores, Tally, ThroughputCounts, count, outcome, progress_key
from .drivers import Driver, TubeDriver, make_driver, tubes_worth_trying
from .outage import Outages, Parked, check_databases, drop_broken_connections, first_line, refuse_unmigrated
from .stopping import StopEvent
from .supervisor import STOP_SIGNALS, Supervisor

__all__ = ["Worker", "run_workers"]

logger = logging.getLogger("django_taskloop.workers")

#: Seconds between two runs of the reaper in a long-running worker process.
REAP_EVERY = 60.0
#: Seconds between two writes of a worker's throughput counts (the dashboard's per-minute rows).
THROUGHPUT_EVERY = 1.0
#: Database errors in a row after which a worker gives up (its supervisor restarts it).
MAX_CONSECUTIVE_ERRORS = 10
#: Longest wait of an idle one-tube worker in one take (a stop ends it within a poll).
IDLE_WAIT = 30.0


class Worker:
    """Run ``handlers`` in this process until stopped (or, with ``burst``, until idle)."""

    def __init__(
        self,
        handlers: Sequence[Handler],
        *,
        burst: bool = False,
        identity: str | None = None,
        supervised: bool = False,
        schedule: bool = True,
    ) -> None:
        self.identity = identity or f"{socket.gethostname()}:{os.getpid()}:worker"
        # A tube spread over several databases (SHARDS): one driver per shard.
        self.drivers: list[Driver] = [
            make_driver(handler, self.identity) for handler in shard_handlers(handlers)
        ]
        self.burst = burst
        self.tallies = {driver.handler.name: Tally() for driver in self.drivers}
        self.stopping = False
        self.aborting = False
        #: When the grace period of a stop signal ends (monotonic; ``inf`` until one comes).
        self.stop_by = float("inf")
        # Set by the stop signals' handlers: not a threading.Event (see StopEvent).
        self.wake = StopEvent()
        # Items claimed and not yet finished, by driver: what the heartbeat renews and what a
        # stop gives back.
        self.inflight: dict[Driver, list[Any]] = {}
        self.inflight_lock = threading.Lock()
        # The next batch, claimed in the transaction that acknowledged the last one.
        self.prefetched: dict[Driver, list[Any]] = {}
        # Finished items whose settle failed (a dropped connection, a deadlock that outlasted
        # the engine's retries): kept, renewed by the heartbeat, and settled at the start of
        # the next round and at stop, never run again. Likewise items to give back.
        self.unsettled: dict[Driver, list[Any]] = {}
        self.unreturned: dict[Driver, list[Any]] = {}
        # Items of the running batch not started yet, and those of them that the heartbeat
        # gave back at a stop (at once: only what runs gets the grace period).
        self.unstarted: dict[Driver, deque[Any]] = {}
        self.returned_early: dict[Driver, set[Any]] = {}
        # Batch sizing: each handler's measured seconds per item, and the size of its last claim.
        self.per_item: dict[Driver, float] = {}
        self.sizes: dict[Driver, int] = {}
        # Done / failed / given back per driver, not yet written: the heartbeat thread writes
        # them once a second (THROUGHPUT_EVERY), off the batches' path.
        self.throughput = ThroughputCounts(self.inflight_lock)
        # What the running handlers reported (progress.report): the heartbeat writes it.
        self.progress: progress.Board[Driver] = progress.Board(progress_key)
        # A supervised child stops when its supervisor is gone (kill -9 of the supervisor);
        # a worker run on its own may well outlive the shell that started it.
        self._parent = os.getppid() if supervised else None
        # Cron schedules (@periodic, TASKLOOP["SCHEDULE"]): claimed by the heartbeat thread.
        self.ticker = schedules.ticker() if schedule else None
        # A transaction held open elsewhere: the heartbeat thread warns while it lasts.
        self.watch = CleanupWatch()
        # The databases found down: the thread that met the outage says so, the others keep quiet.
        self.outages = Outages()
        # Serving several databases (shards): those found down wait, the others go on.
        self.parked = Parked()

    # Signals -----------------------------------------------------------------------------

    def install_signals(self) -> dict[int, Any]:
        """Install the stop handlers; return the previous ones (for :meth:`run` to restore)."""
        previous: dict[int, Any] = {
            sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM)
        }
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGALRM, self._on_alarm)
        # A worker started with them blocked (by a parent that had them so) would never hear
        # a stop: the handlers above are the whole story.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        return previous

    def _on_signal(self, signum: int, frame: Any) -> None:
        if not self.stopping:
            self.stopping = True
            self.wake.set()
            grace = float(setting("GRACE_PERIOD"))
            self.stop_by = time.monotonic() + grace
            logger.info(
                "worker %s: %s, finishing work in hand (up to %gs)",
                self.identity,
                signal.Signals(signum).name,
                grace,
            )
            signal.setitimer(signal.ITIMER_REAL, max(grace, 0.001))
            return
        if not self.aborting:
            logger.warning(
                "worker %s: second %s, giving everything back now", self.identity, signal.Signals(signum).name
            )
        self._abort(frame)

    def _on_alarm(self, signum: int, frame: Any) -> None:
        if self.stopping:
            if not self.aborting:
                logger.warning("worker %s: grace period over, giving back what is left", self.identity)
            self._abort(frame)

    def _abort(self, frame: Any) -> None:
        self.aborting = True
        self.wake.set()
        # Interrupt only the user's code: an exception raised in the middle of our own
        # database calls could leave the connection in a state nobody can clean up, and one
        # raised just after a handler returned would give back work that is finished.
        where = inside_user_code(frame)
        if where:
            raise StopNow
        if where is None:
            # At the edge of a handler call: look again in a moment, when it has either
            # started (interrupt it) or returned (settle it as finished).
            signal.setitimer(signal.ITIMER_REAL, 0.01)

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
        previous = self.install_signals()
        beating = threading.Event()
        heart = threading.Thread(
            target=self._heartbeat, args=(beating,), name="taskloop-heartbeat", daemon=True
        )
        heart.start()
        started = time.monotonic()
        try:
            self._work()
        finally:
            self._stop(beating, heart)
            self.log_summary(time.monotonic() - started)
            connections.close_all()
            wakeup.close_listeners()
            # Run in-process (call_command), the caller gets its own handlers back. But after a
            # stop, the default (die) is ignoring: the stop is done, and one sent again while the
            # process exits (a supervisor's, a process manager's) must not turn 0 into -15.
            for sig, handler in previous.items():
                stopped = self.stopping and handler == signal.SIG_DFL
                signal.signal(sig, signal.SIG_IGN if stopped else handler)
        return 0

    def _prepare(self) -> None:
        """Create what the handlers serve; in a burst, run the schedules' ticks due now."""
        self.parked.prepare(self.drivers)
        if self.ticker is not None:
            self.ticker.prepare()
            if self.burst:
                # A burst runs what is due now (the heartbeat claims no ticks in a burst).
                self._tick()
        # One LISTEN session (PostgreSQL) for the life of this worker, not one per wait.
        wakeup.keep_listeners()

    def _work(self) -> None:
        """Run rounds until a stop (or, in a burst, until a round finds nothing and nothing
        is claimable in its tubes); idle between them as cheaply as the handlers allow."""
        idle = float(setting("POLL_MIN"))
        tubes = [driver for driver in self.drivers if isinstance(driver, TubeDriver)]
        # Tubes that the last poll found nothing in: the round after it does not claim there.
        skip: set[Driver] = set()
        errors = 0
        while not self.stopping:
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
                self.wake.wait(idle)
                idle = min(idle * float(setting("POLL_FACTOR")), float(setting("POLL_MAX")))
                continue
            if self._supervisor_gone():
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

    def _round(self, skip: set[Driver]) -> int:
        """Settle what earlier rounds kept, then run a batch of each driver (but those in
        ``skip``, unless a batch of theirs is claimed ahead); return how many items ran."""
        worked = 0
        self._settle_pending()
        for driver in self.drivers:
            if self.stopping:
                break
            if self._parked(driver):
                continue
            if driver in self.prefetched or driver not in skip:
                try:
                    worked += self.run_batch(driver, self.prefetched.pop(driver, ()))
                except (DatabaseError, DatabaseBusy):
                    if not self._park(driver):
                        raise
        return worked

    def _parked(self, driver: Driver) -> bool:
        """Say whether ``driver``'s database is a shard found down (its queue waits)."""
        return not self.parked.ready(driver)

    def _park(self, driver: Driver) -> bool:
        """After a database error on ``driver``'s database: if this worker serves several and
        that one cannot be reached, park it (the others go on) and return ``True``."""
        return len(self._databases()) > 1 and self.parked.park(driver.using)

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
            self.run_batch(driver, first)

    def _poll(self, tubes: list[TubeDriver], idle: float) -> set[Driver]:
        """Idle: wait ``idle`` seconds (polls spaced out up to POLL_MAX; one indexed query per
        loop and board), then return the tubes not worth a take (one read for all of them)."""
        self.wake.wait(idle)
        try:
            return self._not_worth_trying(tubes)
        except (DatabaseError, DatabaseBusy):
            return set()  # the round claims from them, and deals with the error

    def _stop(self, beating: threading.Event, heart: threading.Thread) -> None:
        """Give back and settle what is left, then stop the heartbeat thread."""
        signal.setitimer(signal.ITIMER_REAL, 0)
        self._give_back_prefetched()
        self._settle_at_stop()
        beating.set()
        self.wake.set()  # the heartbeat may be waiting on it (no stop came: a burst's end)
        # Its last writes (throughput, goodbye) within what is left of a stop's grace period:
        # each is bounded (DATABASE_TIMEOUT), but a database that hangs makes several add up.
        heart.join(timeout=min(30.0, max(1.0, self.stop_by - time.monotonic())))

    def _give_back_prefetched(self) -> None:
        """Batches claimed ahead that will not run now (a stop came first) go back with what
        is kept for settling: :meth:`_settle_at_stop` gives them back, and retries if it fails."""
        for driver, items in list(self.prefetched.items()):
            self._keep(self.unreturned, driver, items)
            self.tallies[driver.handler.name].given_back += len(items)
            self._record_throughput(driver, 0, 0, len(items))
        self.prefetched.clear()
        with self.inflight_lock:
            self.inflight.clear()

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
                    if worth.get(pk) and not self.stopping:
                        items = driver.claim(self.batch_size(driver), checked=worth[pk] == "ready")
                        if items:
                            worked += self.run_batch(driver, items)
                left = end - time.monotonic()
                if worked or left <= 0:
                    return worked
                waiter.sleep(left)
            return 0
        finally:
            waiter.close()

    def _not_worth_trying(self, tubes: list[TubeDriver], from_head: bool = False) -> set[Driver]:
        """Return the tube drivers whose tube has nothing worth a take now (a read per database;
        ``from_head``: each tube read from its head, not from where the claims stand)."""
        skip: set[Driver] = set()
        for using in {driver.using for driver in tubes}:
            mine = [driver for driver in tubes if driver.using == using]
            if any([self._parked(driver) for driver in mine]):  # each prepared once it is back
                skip.update(mine)
                continue
            try:
                worth = tubes_worth_trying(mine, from_head=from_head)
            except (DatabaseError, DatabaseBusy):
                if self._park(mine[0]):
                    skip.update(mine)
                    continue
                raise
            skip.update(driver for driver in mine if not worth.get(driver.tube.pk, True))
        return skip

    def _idle_over(self) -> bool:
        """Say whether an idle wait must end: a stop came, or the supervisor is gone."""
        return self.stopping or self._supervisor_gone()

    def _supervisor_gone(self) -> bool:
        """Say whether this supervised child has lost its supervisor (kill -9 of it)."""
        return self._parent is not None and os.getppid() != self._parent

    def _database_error(self, errors: int) -> int:
        """Deal with the database error being handled: wait out an outage (one line per try,
        however long), else log it, reconnect and back off; re-raise when it persists.

        The database went away or stayed locked: what this worker held comes back when its
        lease ends, so going on after a reconnect loses nothing.
        """
        connections.close_all()
        if self.outages.wait(self._databases(), self.wake.wait, self._idle_over):
            return 0  # it was down and is back (or a stop came): no error of ours to count
        errors += 1
        if errors >= MAX_CONSECUTIVE_ERRORS:
            raise
        logger.exception("worker %s: database error (%d in a row), retrying", self.identity, errors)
        # Jitter keeps workers that met the same outage from coming back in step.
        self.wake.wait(min(5.0, 0.1 * 2**errors) * random.uniform(0.5, 1.5))
        return errors

    def _databases(self) -> list[str]:
        """The aliases of the databases this worker's queues live on."""
        return list(dict.fromkeys(driver.using for driver in self.drivers))

    def _log_error(self, message: str, *args: Any) -> None:
        """Log the error being handled after ``message``: a database error in one line (at
        debug level while a database is known down: the outage's lines say it already),
        anything else with its traceback."""
        error = sys.exc_info()[1]
        if not isinstance(error, (DatabaseError, DatabaseBusy)):
            logger.exception(message, *args)
            return
        level = logging.DEBUG if self.outages.any_down() else logging.WARNING
        logger.log(level, message + ": %s", *args, first_line(error))

    def batch_size(self, driver: Driver) -> int:
        """Return how many items to claim for ``driver`` now: what fits the handler's
        ``batch_time`` at its measured time per item, at least one, at most its ``batch``.

        Before anything is measured a worker claims one item, and the size at most doubles
        from claim to claim: a slow handler never hoards work that idle workers could start,
        a fast one reaches its full batch within a few claims.
        """
        handler = driver.handler
        target = handler.batch_time if handler.batch_time is not None else float(setting("BATCH_TIME"))
        if target <= 0:
            return handler.batch
        per_item = self.per_item.get(driver)
        if per_item is None:
            return 1
        fits = int(target / per_item) if per_item > 0 else handler.batch
        return max(1, min(handler.batch, fits, 2 * self.sizes.get(driver, 1)))

    def _measured(self, driver: Driver, started: int, seconds: float) -> None:
        """Fold a batch's handler time into ``driver``'s time per item."""
        if not started:
            return
        sample = seconds / started
        last = self.per_item.get(driver)
        self.per_item[driver] = sample if last is None else 0.5 * last + 0.5 * sample

    def run_batch(self, driver: Driver, first: Sequence[Any] = ()) -> int:
        """Claim one batch for ``driver``, run its handler on each item, settle; return the size.

        ``first`` holds items already claimed (by a blocking wait) that start the batch. After
        a stop signal nothing more is started: the items not started go back at once, and only
        the one running gets the grace period.
        """
        claimed_at = time.monotonic()
        items = self._claim_batch(driver, list(first))
        if not items:
            return 0
        batch = Batch(driver, items, claimed_at, trace=logger.isEnabledFor(logging.DEBUG))
        with self.inflight_lock:
            self.inflight[driver] = list(items)
            self.unstarted[driver] = deque(items)
            self.returned_early[driver] = set()
        try:
            while (item := self._next_to_start(driver)) is not None:
                self._run_item(batch, item)
        except StopNow:
            pass
        finally:
            self._end_batch(batch)
        return len(items)

    def _claim_batch(self, driver: Driver, items: list[Any]) -> list[Any]:
        """Return the batch to run: ``items`` (brought by a blocking wait), else a new claim.

        After a blocking wait brought one item, it runs at once: latency matters more than the
        batch there, and the next round claims a full batch anyway. A stop that arrived while
        we waited sends what the wait brought in straight back (and returns nothing).
        """
        if self.stopping:
            self._give_back(driver, items)
            self.tallies[driver.handler.name].given_back += len(items)
            return []
        if not items:
            items = driver.claim(self.batch_size(driver))
        if items:
            self.sizes[driver] = len(items)
        return items

    def _run_item(self, batch: Batch, item: Any) -> None:
        """Run the handler on one item of ``batch`` and note how it ended (a failure is dealt
        with at once; success waits for the batch's acknowledgement)."""
        driver = batch.driver
        batch.started += 1
        # -v 2: named in full (a Django Task by its result id and task path) as it starts and ends.
        name = driver.describe_fully(item) if batch.trace else ""
        if name:
            logger.debug("%s: started", name)
        try:
            with self.progress.running(driver, item):
                driver.call(item)
        except StopNow:
            raise
        except FailedForGood as error:
            self._failed_for_good(batch, item, error)
        except Exception as error:
            self._failed(batch, item, error)
        else:
            batch.finished.append(item)
            batch.settled.add(driver.key(item))
            batch.done += 1
            if name:
                logger.debug("%s: done", name)

    def _failed_for_good(self, batch: Batch, item: Any, error: FailedForGood) -> None:
        """Nothing to retry (the Django Tasks backend recorded it as FAILED): settled like a
        success, counted and logged as a failure."""
        driver = batch.driver
        batch.finished.append(item)
        batch.settled.add(driver.key(item))
        batch.failed += 1
        cause = error.__cause__ or error
        self._record_failure(driver, item, driver.attempt(item), cause)
        logger.warning(
            "%s failed%s: %s: %s",
            driver.describe_fully(item),
            outcome(error),
            type(cause).__name__,
            cause,
            exc_info=cause if batch.trace else None,
        )

    def _failed(self, batch: Batch, item: Any, error: Exception) -> None:
        """Record a handler's failure and let the facade retry the item (or bury, trash it).

        Finished items stay in flight until the batch's acknowledgement: their leases must not
        lapse meanwhile. A failed item leaves first, so that no heartbeat renews the lease that
        its retry delay is about to shorten.
        """
        driver = batch.driver
        key = driver.key(item)
        with self.inflight_lock:
            self.inflight[driver] = [i for i in self.inflight[driver] if driver.key(i) != key]
        self._record_failure(driver, item, driver.attempt(item), error)
        outcome = driver.failed(item, error)
        batch.settled.add(key)
        batch.failed += 1
        logger.warning(
            "%s failed %s: %s: %s",
            driver.describe_fully(item),
            outcome,
            type(error).__name__,
            error,
            exc_info=error if batch.trace else None,
        )

    def _end_batch(self, batch: Batch) -> None:
        """Settle ``batch``, count it and log it; raise the database error its settling met.

        What finished is acknowledged even when stopping: nothing done is run twice. Unless
        stopping, the next batch is claimed in the same transaction.
        """
        driver = batch.driver
        batch.ran_at = time.monotonic()
        self._measured(driver, batch.started, batch.ran_at - batch.running_at)
        with self.inflight_lock:
            self.unstarted.pop(driver, None)
            returned = self.returned_early.pop(driver, set())
        batch.settled |= returned
        left = [item for item in batch.items if driver.key(item) not in batch.settled]
        claim_next = 0 if (self.stopping or self.aborting or left) else self.batch_size(driver)
        _more, error = self._settle(driver, batch.finished, left, claim_next)
        if batch.trace:
            for item in left:
                logger.debug("%s: given back", driver.describe(item))
        self._count_batch(batch, given_back=len(left) + len(returned))
        if error is not None:
            # The run loop reconnects and backs off; the next round settles what is kept.
            raise error

    def _count_batch(self, batch: Batch, given_back: int) -> None:
        """Add a settled batch to the throughput and the tally; log its line."""
        driver = batch.driver
        self._record_throughput(driver, batch.done, batch.failed, given_back)
        settled_at = time.monotonic()
        tally = self.tallies[driver.handler.name]
        tally.batches += 1
        tally.done += batch.done
        tally.failed += batch.failed
        tally.given_back += given_back
        tally.seconds += settled_at - batch.claimed_at
        logger.info(
            "%s: %d claimed, %d done, %d failed, %d given back; claim %.1f ms, run %.1f ms, settle %.1f ms",
            driver.describe_queue(),
            len(batch.items),
            batch.done,
            batch.failed,
            given_back,
            (batch.running_at - batch.claimed_at) * 1000,
            (batch.ran_at - batch.running_at) * 1000,
            (settled_at - batch.ran_at) * 1000,
        )

    def _next_to_start(self, driver: Driver) -> Any:
        """Return the batch's next item to start, or ``None``: none left, or a stop came (then
        nothing new starts). Taken under the lock the heartbeat gives unstarted items back
        under, so an item is either started here or given back there, never both."""
        with self.inflight_lock:
            queue = self.unstarted.get(driver)
            if self.stopping or not queue:
                return None
            return queue.popleft()

    def _give_back_unstarted(self) -> None:
        """At a stop (heartbeat thread): give back at once what the running batches claimed and
        have not started, instead of when the item that runs has finished."""
        with self.inflight_lock:
            taken = {driver: list(queue) for driver, queue in self.unstarted.items() if queue}
            for driver, items in taken.items():
                self.unstarted[driver].clear()
                keys = {driver.key(item) for item in items}
                self.returned_early.setdefault(driver, set()).update(keys)
                self.inflight[driver] = [
                    i for i in self.inflight.get(driver, ()) if driver.key(i) not in keys
                ]
        for driver, items in taken.items():
            try:
                driver.give_back(items)
            except Exception:
                self._log_error(
                    "%s: could not give back %s at the stop",
                    driver.describe_queue(),
                    count(len(items), driver.noun),
                )
                self._keep(self.unreturned, driver, items)
                continue
            logger.info(
                "%s: gave back %s not started, at the stop",
                driver.describe_queue(),
                count(len(items), driver.noun),
            )

    def _settle(
        self, driver: Driver, finished: list[Any], left: list[Any], claim_next: int
    ) -> tuple[list[Any], BaseException | None]:
        """Settle a batch: acknowledge what finished (claiming the next batch in the same
        transaction when ``claim_next``) and give back ``left``.

        Return the next batch and the database error met, if any. What could not be settled
        is kept (:attr:`unsettled`, :attr:`unreturned`) for the next round, not stranded.
        """
        more: list[Any] = []
        error: BaseException | None = None
        if finished:
            try:
                more = driver.done_and_claim(finished, claim_next)
            except (DatabaseError, DatabaseBusy) as raised:
                error = raised
                self._keep(self.unsettled, driver, finished)
                logger.warning(
                    "%s: could not settle %s (%s); settling them in the next round",
                    driver.describe_queue(),
                    count(len(finished), f"finished {driver.noun}"),
                    first_line(raised),
                )
        if left:
            try:
                self._give_back(driver, left, quiet=error is not None)
            except (DatabaseError, DatabaseBusy) as raised:
                error = error or raised
        with self.inflight_lock:
            self.inflight.pop(driver, None)
            if more:
                # Held from now on: the heartbeat renews them until their batch runs.
                self.inflight[driver] = list(more)
                self.prefetched[driver] = more
        return more, error

    def _give_back(self, driver: Driver, items: list[Any], quiet: bool = False) -> None:
        """Give ``items`` back; if that fails, keep them to give back in the next round."""
        if not items:
            return
        try:
            driver.give_back(items)
        except (DatabaseError, DatabaseBusy) as error:
            self._keep(self.unreturned, driver, items)
            if not quiet:
                logger.warning(
                    "%s: could not give back %s (%s); trying again in the next round",
                    driver.describe_queue(),
                    count(len(items), driver.noun),
                    first_line(error),
                )
            raise

    def _keep(self, kept: dict[Driver, list[Any]], driver: Driver, items: list[Any]) -> None:
        with self.inflight_lock:
            kept.setdefault(driver, []).extend(items)

    def _settle_pending(self) -> None:
        """Settle what earlier rounds could not: acknowledge finished items (alone, with no
        claim), give back the rest. A database error leaves the rest kept and propagates (the
        run loop reconnects and backs off, with jitter, before the next try)."""
        for kept, settle, verb in (
            (self.unsettled, "done", "settled"),
            (self.unreturned, "give_back", "gave back"),
        ):
            for driver in list(kept):
                if self._parked(driver):
                    continue
                items = kept[driver]
                try:
                    getattr(driver, settle)(items)
                except (DatabaseError, DatabaseBusy):
                    if not self._park(driver):
                        raise
                    continue
                with self.inflight_lock:
                    kept.pop(driver, None)
                logger.info(
                    "%s: %s %s kept from an earlier round",
                    driver.describe_queue(),
                    verb,
                    count(len(items), driver.noun),
                )

    def _settle_at_stop(self) -> None:
        """At stop, try a few times more to settle what is kept; what still fails is logged
        (its leases run out, or its consumer is found dead, and it runs again)."""
        for attempt in range(3):
            if not (self.unsettled or self.unreturned):
                return
            try:
                self._settle_pending()
                return
            except (DatabaseError, DatabaseBusy):
                self._log_error(
                    "worker %s: settling at stop failed (try %d of 3)", self.identity, attempt + 1
                )
                connections.close_all()
                time.sleep(0.2 * 2**attempt * random.uniform(0.5, 1.5))
        for kept, what in ((self.unsettled, "finished"), (self.unreturned, "unstarted")):
            for driver, items in kept.items():
                logger.error(
                    "%s: %s could not be settled before the worker stopped; they run again "
                    "once their lease runs out",
                    driver.describe_queue(),
                    count(len(items), f"{what} {driver.noun}"),
                )

    def _record_failure(self, driver: Driver, item: Any, attempt: int, error: BaseException) -> None:
        """Keep what failed, with its traceback, for the operator (a Failure row)."""
        try:
            with bounded(driver.using):
                Failure.objects.record(
                    kind=driver.queue_kind,
                    queue=driver.queue,
                    item=driver.failure_item(item),
                    attempt=attempt,
                    worker=self.identity,
                    error=error,
                    using=driver.using,
                )
        except Exception:
            # The failure is in the log anyway; losing its row must not stop the worker.
            self._log_error("could not record the failure of %s", driver.describe(item))

    def _record_throughput(self, driver: Driver, done: int, failed: int, given_back: int) -> None:
        """Count what a batch settled; :meth:`_flush_throughput` writes it."""
        self.throughput.add(driver, done, failed, given_back)

    def _flush_throughput(self) -> None:
        """Write the counts gathered since the last flush; a parked shard's wait for it."""
        self.throughput.flush(
            self.parked.quiet,
            lambda driver: self._log_error("could not record the throughput of %s", driver.describe_queue()),
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
                with self.inflight_lock:
                    held = [*self.inflight.get(driver, ()), *self.unsettled.get(driver, ())]
                driver.renew(held)
        except Exception:
            self.progress.unwritten()
            logger.exception("worker %s: could not write the progress of its handlers", self.identity)

    def _beat_as_process(self) -> None:
        """Say that this worker process is alive, what it serves and what it holds now."""
        with self.inflight_lock:
            holding = {f"{d.queue_kind}:{d.queue}": len(items) for d, items in self.inflight.items() if items}
        with bounded(WorkerProcess.objects.db):
            WorkerProcess.objects.beat(
                self.identity,
                host=socket.gethostname(),
                pid=os.getpid(),
                queues=[f"{d.queue_kind}:{d.queue}" for d in self.drivers],
                holding=holding,
            )

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
                if self.stopping:
                    self._give_back_unstarted()
                self._do_chores(chores)
                pause = chores.next_due() - time.monotonic()
                # Until a stop comes, the wait ends at the stop signal too (self.wake), so that
                # what was claimed and not started goes back at once.
                (stop if self.stopping else self.wake).wait(max(0.01, pause))
                if stop.is_set():
                    return
        finally:
            self._flush_throughput()
            self._say_goodbye()
            connections.close_all()

    def _do_chores(self, chores: Chores) -> None:
        """Do the heartbeat's chores that are due, and note when each is due next."""
        if time.monotonic() >= chores.flush:
            chores.flush = time.monotonic() + THROUGHPUT_EVERY
            self._flush_throughput()
            self.write_progress()
        if time.monotonic() >= chores.process:
            chores.process = time.monotonic() + self._process_pace()
            try:
                self._beat_as_process()
            except Exception:
                self._log_error("worker %s: heartbeat of the process failed", self.identity)
        if not self.burst and time.monotonic() >= chores.reap:
            chores.reap = time.monotonic() + REAP_EVERY * random.uniform(0.75, 1.25)
            self._reap()
        if time.monotonic() >= chores.tick:
            chores.tick = time.monotonic() + self._tick()
        if time.monotonic() >= chores.cleanup:
            chores.cleanup = time.monotonic() + self.watch.every()
            self._watch_cleanup()
        self._beat_drivers(chores.drivers)

    def _process_pace(self) -> float:
        """Seconds until the next beat of the process: every 5 s while holding work (the
        dashboard shows what); an idle worker has nothing new to say: HEARTBEAT_INTERVAL."""
        with self.inflight_lock:
            holding = any(self.inflight.values())
        pace = float(setting("HEARTBEAT_INTERVAL"))
        return min(pace, 5.0) if holding else pace

    def _reap(self) -> None:
        """Run the reaper once; its failure is logged, never fatal."""
        try:
            for line in format_report(reap()):
                logger.debug("reaper: %s", line)
        except Exception:
            self._log_error("periodic reap failed")

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

    def _beat_drivers(self, due: dict[Driver, float]) -> None:
        """Renew the leases of each driver whose beat is ``due``, and beat it."""
        for driver in self.drivers:
            now = time.monotonic()
            if now < due[driver] or self.parked.quiet(driver):
                continue
            # Each driver beats at its own pace: a ttr tube's touch increment is its
            # interval, so beating it more often would push its deadline ever further.
            due[driver] = now + driver.beat_every
            with self.inflight_lock:
                # Finished items not yet acknowledged are renewed too: they must not
                # come back to run again while this worker retries their settle.
                held = [*self.inflight.get(driver, ()), *self.unsettled.get(driver, ())]
            try:
                driver.renew(held)
                driver.beat()
            except Exception:
                # A missed beat is not fatal: the next one, or the lease, covers it.
                self._log_error("heartbeat of %s failed", driver.describe_queue())

    def _say_goodbye(self) -> None:
        """Remove this worker's process row (the dashboard's list of live workers)."""
        try:
            with bounded(WorkerProcess.objects.db):
                WorkerProcess.objects.gone(self.identity)
        except Exception:
            self._log_error("worker %s: could not say goodbye", self.identity)

    def _tick(self) -> float:
        """Claim the schedules' due ticks; return the seconds until the next look."""
        if self.ticker is None:
            return float("inf")
        try:
            return self.ticker.tick()
        except Exception:
            self._log_error("worker %s: schedules could not be read", self.identity)
            return schedules.REFRESH

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


def _child(names: list[str], burst: bool, schedule: bool = True) -> None:
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
    sys.exit(Worker(handlers, burst=burst, supervised=True, schedule=schedule).run())


def run_workers(
    only: Sequence[str] | None = None, *, processes: int = 1, burst: bool = False, schedule: bool = True
) -> int:
    """Run the handlers (all, or those named in ``only``) in ``processes`` worker processes;
    with ``schedule``, each also claims the due ticks of the cron schedules.

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
    logger.info(
        "starting %d worker process(es)%s for: %s",
        processes,
        " (burst)" if burst else "",
        # A Django Tasks queue once, by its Django name (its plain and keyed handlers).
        ", ".join(dict.fromkeys(handler.described for handler in handlers)),
    )
    if processes == 1:
        return Worker(handlers, burst=burst, schedule=schedule).run()
    return Supervisor(handlers, processes, burst, schedule, child=_child).run()
