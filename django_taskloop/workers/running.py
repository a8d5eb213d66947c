"""A batch's life in a worker: claimed (as many items as fit the handler's ``batch_time``), run
item by item, then settled, the next batch claimed in the same transaction. After a stop
signal nothing more is started: the items not started go back at once, and only the one
running gets the grace period.

With ``workers --concurrency N`` (or a handler's ``concurrency``) up to N items of the batch run
at once, in :mod:`.slots`; as slots come free the batch is topped up: what finished is
acknowledged and more is claimed, in one transaction, so that a long item holds up only its
own slot."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from django.db import DatabaseError

from .. import progress
from ..conf import setting
from ..engine import clock_shift, local_clock
from ..exceptions import DatabaseBusy
from . import FailedForGood, StopNow
from .batches import Batch, Tally, ThroughputCounts
from .drivers import AnyDriver
from .holdings import Holdings
from .settling import Settler
from .slots import Outcome, Slots
from .stop import Stop

__all__ = ["BatchRunner"]

logger = logging.getLogger("django_taskloop.workers")


class BatchRunner:
    """Claim, run and settle the batches of a worker's drivers, and size their claims."""

    def __init__(
        self,
        *,
        stop: Stop,
        holdings: Holdings,
        settler: Settler,
        tallies: dict[str, Tally],
        throughput: ThroughputCounts,
        board: progress.Board[AnyDriver],
        concurrency: int = 1,
        serving_several: bool = False,
    ) -> None:
        self.stop = stop
        self.holdings = holdings
        self.settler = settler
        self.tallies = tallies
        self.throughput = throughput
        # What the running handlers report (progress.report): the heartbeat writes it.
        self.board = board
        # Batch sizing: each handler's measured seconds per item, and the size of its last claim.
        self.per_item: dict[AnyDriver, float] = {}
        self.sizes: dict[AnyDriver, int] = {}
        # --concurrency: the items a process runs at once unless a handler says otherwise; the
        # slots are made when a handler first runs more than one.
        self.concurrency = concurrency
        self.slots: Slots | None = None
        # Whether the worker serves more than one queue (a batch in slots then stops topping up
        # after a while: the others' turn).
        self.serving_several = serving_several

    def slots_of(self, driver: AnyDriver) -> int:
        """How many items of ``driver`` this process runs at once: its handler's
        ``concurrency``, else ``--concurrency``."""
        return driver.handler.concurrency or self.concurrency

    def batch_size(self, driver: AnyDriver) -> int:
        """Return how many items to claim for ``driver`` now: what fits the handler's
        ``batch_time`` at its measured time per item, at least one, at most its ``batch``.

        Before anything is measured a worker claims one item, and the size at most doubles
        from claim to claim: a slow handler never hoards work that idle workers could start,
        a fast one reaches its full batch within a few claims.
        """
        handler = driver.handler
        target = self._batch_time(driver)
        slots = self.slots_of(driver)
        if driver.paced:
            # A rate counts a task when it is claimed: claim what starts at once.
            return slots
        if slots > 1:
            # One process's rule per slot, at most the batch or the slots, whichever is more.
            most = max(handler.batch, slots)
            if target <= 0:
                return most
            # (Doubling from claim to claim, never below one item a slot: a top-up that filled
            # one free slot is no slow start.)
            grown = max(slots, 2 * self.sizes.get(driver, slots))
            return max(1, min(most, slots * self._per_slot(driver), grown))
        if target <= 0:
            return handler.batch
        per_item = self.per_item.get(driver)
        if per_item is None:
            return 1
        fits = int(target / per_item) if per_item > 0 else handler.batch
        return max(1, min(handler.batch, fits, 2 * self.sizes.get(driver, 1)))

    def _per_slot(self, driver: AnyDriver) -> int:
        """How many of ``driver``'s items one slot gets in a claim (``--concurrency``): what fits
        ``batch_time`` of one item's own measured time, at least one (one before anything is
        measured; the handler's ``batch`` shared out among its slots when ``batch_time`` is 0)."""
        if driver.paced:
            return 1  # (see batch_size)
        target = self._batch_time(driver)
        if target <= 0:
            return max(1, driver.handler.batch // self.slots_of(driver))
        per_item = self.per_item.get(driver)  # seconds one item runs, in its slot
        return max(1, int(target / per_item)) if per_item else 1

    def _batch_time(self, driver: AnyDriver) -> float:
        """The seconds of work ``driver``'s claims aim at: its handler's, else BATCH_TIME."""
        handler = driver.handler
        return handler.batch_time if handler.batch_time is not None else float(setting("BATCH_TIME"))

    def measured(self, driver: AnyDriver, started: int, seconds: float) -> None:
        """Fold a batch's handler time into ``driver``'s time per item."""
        if not started:
            return
        sample = seconds / started
        last = self.per_item.get(driver)
        self.per_item[driver] = sample if last is None else 0.5 * last + 0.5 * sample

    def run(self, driver: AnyDriver, first: Sequence[Any] = (), claimed_at: float | None = None) -> int:
        """Claim one batch for ``driver``, run its handler on each item, settle; return the size.

        ``first`` holds items already claimed that start the batch: by a blocking wait or a
        take whose statement was sent at ``claimed_at`` (:func:`~django_taskloop.engine.local_clock`),
        or ahead, by the last batch's settle (``None``: then recorded already). After a stop
        signal nothing more is started: the items not started go back at once, and only the
        one running gets the grace period. An item whose lease may have lapsed meanwhile is
        started only if the database says it is still this worker's (:meth:`_still_held`).
        """
        started_at = time.monotonic()
        if first and claimed_at is not None:
            self.holdings.claimed(driver, first, claimed_at)
        items = self._claim(driver, list(first))
        if not items:
            return 0
        batch = Batch(driver, items, started_at, trace=logger.isEnabledFor(logging.DEBUG))
        self.holdings.start_batch(driver, items)
        slots = self.slots_of(driver)
        if slots > 1:
            try:
                self._run_in_slots(batch, slots)
            finally:
                self._end(batch)
            return len(batch.items)
        sure_until, shift, monotonic = self.holdings.sure_until, clock_shift, time.monotonic
        paced = driver.paced
        try:
            while (item := self.holdings.next_to_start(driver, self.stop)) is not None:
                # local_clock(), without a call per item (the hot path's budget counts them).
                if monotonic() + shift.seconds >= sure_until.get(driver, 0.0) and not self._still_held(
                    batch, item
                ):
                    continue
                if paced and self._late_for_the_rate(driver, item):
                    continue
                self._run_item(batch, item)
        except StopNow:
            pass
        finally:
            self._end(batch)
        return len(items)

    def _still_held(self, batch: Batch, item: Any) -> bool:
        """Ask the database whether this worker still holds ``item``, whose lease may have
        lapsed (its renewals came late); renew it if so. One it lost is not started: another
        worker may have taken it, and run it, meanwhile. It is left to whoever holds it (the
        settle's give-back skips what is not this worker's). A database error: not started."""
        driver = batch.driver
        try:
            if driver.confirm(item):
                return True
        except (DatabaseError, DatabaseBusy):
            logger.warning("%s: could not make sure it is still held; not started", driver.describe(item))
            return False
        self.holdings.drop(driver, driver.key(item))
        # Not this worker's to give back either: a loop's unlock would end a rival's lock.
        batch.settled.add(driver.key(item))
        logger.warning(
            "%s: its lease had run out before it started (the heartbeat came too late); "
            "left to whoever holds it now",
            driver.describe(item),
        )
        return False

    def _late_for_the_rate(self, driver: AnyDriver, item: Any) -> bool:
        """Say whether ``item`` of a queue with a rate comes too late to start: its claim began
        more than ``RATE_MARGIN`` seconds ago (a commit that hung; a machine too busy to run
        the thread). The rate counted it at its claim, so a late start could put more starts
        in one period than the rate allows: it is not started, and goes back with the batch's
        end (to run at a later claim)."""
        sent, margin = driver.claim_sent_at(), float(setting("RATE_MARGIN"))
        late = 0.0 if sent is None else time.monotonic() - sent
        if late <= margin or not margin:  # (0: the period alone, whatever the delay)
            return False
        logger.warning(
            "%s: could not start within RATE_MARGIN (%.0f ms) of its claim (%.0f ms); given back, so "
            "that the rate holds (raise RATE_MARGIN if this is frequent)",
            driver.describe(item),
            margin * 1000,
            late * 1000,
        )
        return True

    def _claim(self, driver: AnyDriver, items: list[Any]) -> list[Any]:
        """Return the batch to run: ``items`` (brought by a blocking wait), else a new claim.

        After a blocking wait brought one item, it runs at once: latency matters more than the
        batch there, and the next round claims a full batch anyway. A stop that arrived while
        we waited sends what the wait brought in straight back (and returns nothing).
        """
        if self.stop.stopping:
            self.settler.give_back(driver, items)
            self.tallies[driver.handler.name].given_back += len(items)
            return []
        if not items:
            at = local_clock()
            items = driver.claim(self.batch_size(driver))
            if items:
                self.holdings.claimed(driver, items, at)
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
        board = self.board
        try:
            token = board.enter(driver, item)  # (board.running(), less a generator per item)
            try:
                driver.call(item)
            finally:
                board.leave(token, driver, item)
        except StopNow:
            raise
        except FailedForGood as error:
            self.settler.failed_for_good(batch, item, error)
        except Exception as error:
            self.settler.failed(batch, item, error)
        else:
            batch.finished.append(item)
            batch.settled.add(driver.key(item))
            batch.done += 1
            if name:
                logger.debug("%s: done", name)

    # Many at a time (--concurrency) -----------------------------------------------------------

    def _run_in_slots(self, batch: Batch, size: int) -> None:
        """Run ``batch`` with up to ``size`` of its items at once, in slots; top it up as slots
        come free (what finished acknowledged and more claimed, in one transaction) until a
        stop, or until nothing more is claimable and every item has ended.

        Slots are topped up once half of them are free (or none runs), else every
        ``POLL_MAX`` seconds; a top-up that finds nothing backs off as an idle worker's polls
        do. Serving several queues, a batch stops topping up after ``POLL_MAX`` seconds, so
        that the other queues get their turn. Everything but the handler's call stays in this
        thread: outcomes are settled here as :meth:`_run_item` settles them. A hard stop
        interrupts the running handlers and gives back what they have not finished."""
        driver = batch.driver
        if self.slots is None:
            self.slots = Slots(self.board)
        slots, monotonic = self.slots, time.monotonic
        poll_min, poll_max = float(setting("POLL_MIN")), float(setting("POLL_MAX"))
        running, topping, limited, paced = 0, True, driver.limited, driver.paced
        last_top_up = next_top_up = monotonic()
        wait = poll_min
        top_up_until = last_top_up + poll_max if self.serving_several else float("inf")
        while True:
            running = self._start_in_slots(batch, size, running)
            free = size - running
            now = monotonic()
            topping = topping and not self.stop.stopping and now < top_up_until
            due = (
                next_top_up if (2 * free >= size or not running) else max(next_top_up, last_top_up + poll_max)
            )
            if topping and free and now >= due:
                more, topping = self._top_up(batch, free)
                last_top_up = monotonic()
                if more:
                    next_top_up, wait = last_top_up, poll_min
                    continue
                next_top_up = last_top_up + wait
                wait = min(wait * float(setting("POLL_FACTOR")), poll_max)
                if paced and (free_at := driver.paced_until()) is not None:
                    # The rate is used up until then: try again at that moment, not before.
                    next_top_up, wait = max(next_top_up, free_at), poll_min
                due = next_top_up
            if not running:  # and the last top-up found nothing (or a stop came): the batch is over
                return
            timeout = min(0.1, max(0.001, due - monotonic())) if topping and free else 0.1
            for outcome in slots.wait(timeout):
                running -= 1
                self._ended_in_slot(batch, outcome)
                if limited:
                    # Its acknowledgement frees a slot of the queue's limit, which the top-up
                    # that sends it can take at once: no backoff.
                    next_top_up, wait = monotonic(), poll_min
            if self.stop.aborting and running:
                self._stop_slots(batch)
                return

    def _start_in_slots(self, batch: Batch, size: int, running: int) -> int:
        """Start ``batch``'s items that are waiting in free slots (while ``running`` of its
        ``size`` run), but one whose lease may have lapsed and its database denies, or one too
        late for its queue's rate; return how many run now."""
        driver, slots, sure_until = batch.driver, self.slots, self.holdings.sure_until
        assert slots is not None
        paced = driver.paced
        while running < size and (item := self.holdings.next_to_start(driver, self.stop)) is not None:
            if time.monotonic() + clock_shift.seconds >= sure_until.get(driver, 0.0) and not self._still_held(
                batch, item
            ):
                continue
            if paced and self._late_for_the_rate(driver, item):
                continue
            batch.started += 1
            if batch.trace:
                logger.debug("%s: started", driver.describe_fully(item))
            slots.submit(driver, item)
            running += 1
        return running

    def _top_up(self, batch: Batch, free: int) -> tuple[list[Any], bool]:
        """Acknowledge what finished in ``batch`` and claim more for ``free`` slots; return what
        came and whether to go on topping up (not after a database error)."""
        driver = batch.driver
        finished, batch.finished = batch.finished, []
        more, settled = self.settler.top_up(
            driver, finished, min(free * self._per_slot(driver), max(driver.handler.batch, free))
        )
        if finished:
            # Acknowledged, or kept to settle in the next round: this batch is done with them.
            self.holdings.acknowledged(driver, {driver.key(item) for item in finished})
        if more:
            batch.items.extend(more)
            self.sizes[driver] = len(more)
        return more, settled

    def _ended_in_slot(self, batch: Batch, outcome: Outcome) -> None:
        """Settle one item that ended in a slot, as :meth:`_run_item` settles one it ran."""
        driver, item, error, seconds = outcome
        last = self.per_item.get(driver)
        self.per_item[driver] = seconds if last is None else 0.5 * last + 0.5 * seconds
        if error is None:
            batch.finished.append(item)
            batch.settled.add(driver.key(item))
            batch.done += 1
            if batch.trace:
                logger.debug("%s: done", driver.describe_fully(item))
        elif isinstance(error, StopNow) or self.stop.aborting:
            pass  # interrupted by a hard stop (or cancelled by it): given back at the batch's end
        elif isinstance(error, FailedForGood):
            self.settler.failed_for_good(batch, item, error)
        elif isinstance(error, Exception):
            self.settler.failed(batch, item, error)
        else:  # SystemExit, KeyboardInterrupt raised by a handler in its slot: a failure too
            self.settler.failed(batch, item, RuntimeError(f"{type(error).__name__}: {error}"))

    def _stop_slots(self, batch: Batch) -> None:
        """A hard stop: interrupt the handlers running in slots, hear what they say for a
        moment, then give back (at the batch's end) what still runs."""
        slots = self.slots
        assert slots is not None
        deadline = time.monotonic() + 1.0
        while slots.busy and time.monotonic() < deadline:
            slots.interrupt()
            for outcome in slots.wait(0.01):
                self._ended_in_slot(batch, outcome)
        for _driver, item in slots.abandon():
            logger.warning("%s: still running at the hard stop; given back", batch.driver.describe(item))

    def close(self) -> None:
        """End the slots' threads (the worker is stopping)."""
        if self.slots is not None:
            self.slots.close()

    def _end(self, batch: Batch) -> None:
        """Settle ``batch``, count it and log it; raise the database error its settling met.

        What finished is acknowledged even when stopping: nothing done is run twice. Unless
        stopping, the next batch is claimed in the same transaction.
        """
        driver = batch.driver
        batch.ran_at = time.monotonic()
        if self.slots_of(driver) == 1:  # (in slots, each item's own time is measured as it ends)
            self.measured(driver, batch.started, batch.ran_at - batch.running_at)
        returned = self.holdings.end_batch(driver)
        batch.settled |= returned
        left = [item for item in batch.items if driver.key(item) not in batch.settled]
        # A queue with a rate claims nothing ahead: what it claims must start at once (the
        # next round may run other queues' batches first).
        ahead = not (self.stop.stopping or self.stop.aborting or left or driver.paced)
        claim_next = self.batch_size(driver) if ahead else 0
        _more, error = self.settler.settle(driver, batch.finished, left, claim_next)
        if batch.trace:
            for item in left:
                logger.debug("%s: given back", driver.describe(item))
        self._count(batch, given_back=len(left) + len(returned))
        if error is not None:
            # The run loop reconnects and backs off; the next round settles what is kept.
            raise error

    def _count(self, batch: Batch, given_back: int) -> None:
        """Add a settled batch to the throughput and the tally; log its line."""
        driver = batch.driver
        self.throughput.add(driver, batch.done, batch.failed, given_back)
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
