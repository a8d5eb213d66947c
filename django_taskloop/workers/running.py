"""A batch's life in a worker: claimed (as many items as fit the handler's ``batch_time``), run
item by item, then settled, the next batch claimed in the same transaction. After a stop
signal nothing more is started: the items not started go back at once, and only the one
running gets the grace period."""

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

    def batch_size(self, driver: AnyDriver) -> int:
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
        sure_until, shift, monotonic = self.holdings.sure_until, clock_shift, time.monotonic
        try:
            while (item := self.holdings.next_to_start(driver, self.stop)) is not None:
                # local_clock(), without a call per item (the hot path's budget counts them).
                if monotonic() + shift.seconds >= sure_until.get(driver, 0.0) and not self._still_held(
                    batch, item
                ):
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

    def _end(self, batch: Batch) -> None:
        """Settle ``batch``, count it and log it; raise the database error its settling met.

        What finished is acknowledged even when stopping: nothing done is run twice. Unless
        stopping, the next batch is claimed in the same transaction.
        """
        driver = batch.driver
        batch.ran_at = time.monotonic()
        self.measured(driver, batch.started, batch.ran_at - batch.running_at)
        returned = self.holdings.end_batch(driver)
        batch.settled |= returned
        left = [item for item in batch.items if driver.key(item) not in batch.settled]
        claim_next = 0 if (self.stop.stopping or self.stop.aborting or left) else self.batch_size(driver)
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
