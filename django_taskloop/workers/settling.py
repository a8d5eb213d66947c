"""What becomes of the items a worker claimed: acknowledged when done, retried (or buried,
trashed) when they fail, with a Failure row for the operator, or given back. What could not be
settled (a dropped connection, a deadlock that outlasted the engine's retries) is kept, and
settled in the next round or at stop: never stranded, never run twice."""

from __future__ import annotations

import logging
import math
import random
import time
from typing import Any

from django.db import DatabaseError, connections

from ..conf import setting
from ..engine import local_clock
from ..engine.deadline import bounded
from ..exceptions import DatabaseBusy
from ..models import Failure
from . import FailedForGood
from .batches import Batch, Tally, ThroughputCounts, count, outcome
from .drivers import AnyDriver
from .holdings import Holdings
from .outage import Outages, Parked, first_line

__all__ = ["Settler"]

logger = logging.getLogger("django_taskloop.workers")


class Settler:
    """Settle the items of the worker ``identity``: acknowledge, retry, give back, keep."""

    def __init__(
        self,
        identity: str,
        *,
        holdings: Holdings,
        parked: Parked,
        outages: Outages,
        tallies: dict[str, Tally],
        throughput: ThroughputCounts,
    ) -> None:
        self.identity = identity
        self.holdings = holdings
        self.parked = parked
        self.outages = outages
        self.tallies = tallies
        self.throughput = throughput

    # A handler's failure -------------------------------------------------------------------

    def failed_for_good(self, batch: Batch, item: Any, error: FailedForGood) -> None:
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

    def failed(self, batch: Batch, item: Any, error: Exception) -> None:
        """Record a handler's failure and let the facade retry the item (or bury, trash it).

        Finished items stay in flight until the batch's acknowledgement: their leases must not
        lapse meanwhile. A failed item leaves first, so that no heartbeat renews the lease that
        its retry delay is about to shorten.
        """
        driver = batch.driver
        key = driver.key(item)
        self.holdings.drop(driver, key)
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

    def _record_failure(self, driver: AnyDriver, item: Any, attempt: int, error: BaseException) -> None:
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
            self.outages.log_error("could not record the failure of %s", driver.describe(item))

    # A batch's end -------------------------------------------------------------------------

    def settle(
        self, driver: AnyDriver, finished: list[Any], left: list[Any], claim_next: int
    ) -> tuple[list[Any], BaseException | None]:
        """Settle a batch: acknowledge what finished (claiming the next batch in the same
        transaction when ``claim_next``) and give back ``left``.

        Return the next batch and the database error met, if any. What could not be settled
        is kept (:attr:`Holdings.unsettled`, :attr:`Holdings.unreturned`) for the next round,
        not stranded.
        """
        more: list[Any] = []
        error: BaseException | None = None
        at = local_clock()
        if finished:
            more, error = self._done_and_claim(driver, finished, claim_next)
        if left:
            try:
                self.give_back(driver, left, quiet=error is not None)
            except (DatabaseError, DatabaseBusy) as raised:
                error = error or raised
        self.holdings.settled(driver, more, at)
        return more, error

    def top_up(self, driver: AnyDriver, finished: list[Any], limit: int) -> tuple[list[Any], bool]:
        """A running batch's slots came free (``workers --concurrency``): acknowledge what has
        finished and claim up to ``limit`` more, in one transaction, as a batch's end does.

        Return the items claimed and whether the acknowledgement went through; when it did not,
        the finished items are kept (:attr:`Holdings.unsettled`) for the next round."""
        at = local_clock()
        more, error = self._done_and_claim(driver, finished, limit)
        if more:
            self.holdings.add_to_batch(driver, more, at)
        return more, error is None

    def _done_and_claim(
        self, driver: AnyDriver, finished: list[Any], limit: int
    ) -> tuple[list[Any], BaseException | None]:
        """Acknowledge ``finished`` and claim up to ``limit`` more in one transaction (nothing
        finished: the claim alone); return what came and the database error met. What could not
        be acknowledged is kept (:attr:`Holdings.unsettled`) for the next round."""
        try:
            return (driver.done_and_claim(finished, limit) if finished else driver.claim(limit)), None
        except (DatabaseError, DatabaseBusy) as raised:
            if finished:
                self.holdings.keep(self.holdings.unsettled, driver, finished)
                logger.warning(
                    "%s: could not settle %s (%s); settling them in the next round",
                    driver.describe_queue(),
                    count(len(finished), f"finished {driver.noun}"),
                    first_line(raised),
                )
            else:
                logger.warning("%s: could not claim more (%s)", driver.describe_queue(), first_line(raised))
            return [], raised

    def give_back(self, driver: AnyDriver, items: list[Any], quiet: bool = False) -> None:
        """Give ``items`` back; if that fails, keep them to give back in the next round."""
        if not items:
            return
        try:
            driver.give_back(items)
        except (DatabaseError, DatabaseBusy) as error:
            self.holdings.keep(self.holdings.unreturned, driver, items)
            if not quiet:
                logger.warning(
                    "%s: could not give back %s (%s); trying again in the next round",
                    driver.describe_queue(),
                    count(len(items), driver.noun),
                    first_line(error),
                )
            raise

    # What earlier rounds kept --------------------------------------------------------------

    def settle_pending(self) -> None:
        """Settle what earlier rounds could not: acknowledge finished items (alone, with no
        claim), give back the rest. A database error leaves the rest kept and propagates (the
        run loop reconnects and backs off, with jitter, before the next try)."""
        for kept, settle, verb in (
            (self.holdings.unsettled, "done", "settled"),
            (self.holdings.unreturned, "give_back", "gave back"),
        ):
            for driver in list(kept):
                if not self.parked.ready(driver):
                    continue
                items = kept[driver]
                try:
                    getattr(driver, settle)(items)
                except (DatabaseError, DatabaseBusy):
                    if not self.parked.park_queue(driver):
                        raise
                    continue
                self.holdings.forget(kept, driver)
                logger.info(
                    "%s: %s %s kept from an earlier round",
                    driver.describe_queue(),
                    verb,
                    count(len(items), driver.noun),
                )

    # At a stop -----------------------------------------------------------------------------

    def give_back_unstarted(self) -> None:
        """At a stop (heartbeat thread): give back at once what the running batches claimed and
        have not started, instead of when the item that runs has finished."""
        for driver, items in self.holdings.take_unstarted().items():
            try:
                driver.give_back(items)
            except Exception:
                self.outages.log_error(
                    "%s: could not give back %s at the stop",
                    driver.describe_queue(),
                    count(len(items), driver.noun),
                )
                self.holdings.keep(self.holdings.unreturned, driver, items)
                continue
            logger.info(
                "%s: gave back %s not started, at the stop",
                driver.describe_queue(),
                count(len(items), driver.noun),
            )

    def give_back_prefetched(self) -> None:
        """Batches claimed ahead that will not run now (a stop came first) go back with what
        is kept for settling: :meth:`settle_at_stop` gives them back, and retries if it fails."""
        for driver, items in list(self.holdings.prefetched.items()):
            self.holdings.keep(self.holdings.unreturned, driver, items)
            self.tallies[driver.handler.name].given_back += len(items)
            self.throughput.add(driver, 0, 0, len(items))
        self.holdings.let_go_prefetched()

    def settle_at_stop(self, stop_by: float = math.inf) -> None:
        """At stop, try a few times more to settle what is kept; what still fails is logged
        (its leases run out, or its consumer is found dead, and it runs again).

        One try always; another only if it can end before ``stop_by`` (the end of the grace
        period: a try against a database that hangs takes up to ``DATABASE_TIMEOUT``), so that
        a stop ends within the grace period however the database answers."""
        for attempt in range(3):
            if not (self.holdings.unsettled or self.holdings.unreturned):
                return
            if attempt and time.monotonic() + float(setting("DATABASE_TIMEOUT")) > stop_by:
                break
            try:
                self.settle_pending()
                return
            except (DatabaseError, DatabaseBusy):
                self.outages.log_error(
                    "worker %s: settling at stop failed (try %d of 3)", self.identity, attempt + 1
                )
                connections.close_all()
                time.sleep(0.2 * 2**attempt * random.uniform(0.5, 1.5))
        for kept, what in ((self.holdings.unsettled, "finished"), (self.holdings.unreturned, "unstarted")):
            for driver, items in kept.items():
                logger.error(
                    "%s: %s could not be settled before the worker stopped; they run again "
                    "once their lease runs out",
                    driver.describe_queue(),
                    count(len(items), f"{what} {driver.noun}"),
                )
