"""What a worker holds, by driver: the items it claimed and has not settled yet.

The main thread runs and settles them; the heartbeat thread renews their leases, and at a stop
gives back those not started. Both go through :class:`Holdings`, under its one lock.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Hashable, Sequence
from typing import Any

from .drivers import AnyDriver
from .stop import Stop

__all__ = ["Holdings"]


class Holdings:
    """The items of each driver that this worker holds, shared by its threads under :attr:`lock`."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        # Items claimed and not yet finished, by driver: what the heartbeat renews and what a
        # stop gives back.
        self.inflight: dict[AnyDriver, list[Any]] = {}
        # The next batch, claimed in the transaction that acknowledged the last one.
        self.prefetched: dict[AnyDriver, list[Any]] = {}
        # Finished items whose settle failed (a dropped connection, a deadlock that outlasted
        # the engine's retries): kept, renewed by the heartbeat, and settled at the start of
        # the next round and at stop, never run again. Likewise items to give back.
        self.unsettled: dict[AnyDriver, list[Any]] = {}
        self.unreturned: dict[AnyDriver, list[Any]] = {}
        # Items of the running batch not started yet, and the keys of those of them that the
        # heartbeat gave back at a stop (at once: only what runs gets the grace period).
        self.unstarted: dict[AnyDriver, deque[Any]] = {}
        self.returned_early: dict[AnyDriver, set[Hashable]] = {}
        # Until when (engine.local_clock) the items of a driver not yet started are surely
        # leased, less a third of their lease: past it, the runner asks the database before it
        # starts one (its lease may have lapsed, the item gone to another worker). Set by a
        # claim, moved on by a heartbeat that renewed every item it held. A driver's holdings'
        # generation tells a renewal whether they changed while it ran.
        self.sure_until: dict[AnyDriver, float] = {}
        self.generation: dict[AnyDriver, int] = {}

    def keep(self, kept: dict[AnyDriver, list[Any]], driver: AnyDriver, items: Sequence[Any]) -> None:
        """Add ``items`` to what is ``kept`` (:attr:`unsettled` or :attr:`unreturned`)."""
        with self.lock:
            kept.setdefault(driver, []).extend(items)

    def forget(self, kept: dict[AnyDriver, list[Any]], driver: AnyDriver) -> None:
        """``driver``'s items ``kept`` are settled: drop them."""
        with self.lock:
            kept.pop(driver, None)

    def claimed(self, driver: AnyDriver, items: Sequence[Any], at: float) -> None:
        """``items`` of ``driver`` were claimed by a statement sent at ``at``
        (:func:`~django_taskloop.engine.local_clock`): their leases hold until at least ``at``
        plus their lease."""
        lease = driver.lease_of(items)
        with self.lock:
            self.sure_until[driver] = at + lease * (2 / 3)
            self.generation[driver] = self.generation.get(driver, 0) + 1

    def held_for_renewal(self, driver: AnyDriver) -> tuple[list[Any], int]:
        """:meth:`held`, and the generation to give :meth:`renewed` once they are renewed."""
        with self.lock:
            return [*self.inflight.get(driver, ()), *self.unsettled.get(driver, ())], self.generation.get(
                driver, 0
            )

    def renewed(self, driver: AnyDriver, generation: int, items: Sequence[Any], at: float) -> None:
        """A renewal sent at ``at`` renewed every one of ``items`` (what :meth:`held_for_renewal`
        gave with ``generation``): their leases hold until at least ``at`` plus their lease, unless
        a claim has changed what is held since."""
        lease = driver.lease_of(items)
        with self.lock:
            if self.generation.get(driver, 0) == generation:
                self.sure_until[driver] = max(self.sure_until.get(driver, at), at + lease * (2 / 3))

    def held(self, driver: AnyDriver) -> list[Any]:
        """What ``driver``'s leases must cover now: the items in flight and the finished ones
        not acknowledged yet."""
        with self.lock:
            return [*self.inflight.get(driver, ()), *self.unsettled.get(driver, ())]

    def holding(self) -> dict[str, int]:
        """How many items this worker runs now, by queue (``"task:emails": 3``)."""
        with self.lock:
            return {f"{d.queue_kind}:{d.queue}": len(items) for d, items in self.inflight.items() if items}

    def any_inflight(self) -> bool:
        """Say whether this worker runs anything now."""
        with self.lock:
            return any(self.inflight.values())

    def start_batch(self, driver: AnyDriver, items: Sequence[Any]) -> None:
        """Hold the batch ``items`` of ``driver``, none of them started yet."""
        with self.lock:
            self.inflight[driver] = list(items)
            self.unstarted[driver] = deque(items)
            self.returned_early[driver] = set()

    def add_to_batch(self, driver: AnyDriver, items: Sequence[Any], at: float) -> None:
        """Hold ``items`` of ``driver`` too, claimed for its running batch by a statement sent at
        ``at`` (``workers --concurrency``: slots that came free are topped up)."""
        with self.lock:
            self.inflight.setdefault(driver, []).extend(items)
            self.unstarted.setdefault(driver, deque()).extend(items)
        self.claimed(driver, items, at)

    def acknowledged(self, driver: AnyDriver, keys: set[Hashable]) -> None:
        """The items ``keys`` of ``driver``'s running batch are acknowledged: no longer held."""
        with self.lock:
            self.inflight[driver] = [i for i in self.inflight.get(driver, ()) if driver.key(i) not in keys]

    def has_unstarted(self, driver: AnyDriver) -> bool:
        """Say whether ``driver``'s running batch has items not started yet."""
        with self.lock:
            return bool(self.unstarted.get(driver))

    def next_to_start(self, driver: AnyDriver, stop: Stop) -> Any:
        """Return the batch's next item to start, or ``None``: none left, or a stop came (then
        nothing new starts). Taken under the lock the heartbeat gives unstarted items back
        under (:meth:`take_unstarted`), so an item is either started here or given back there,
        never both."""
        with self.lock:
            queue = self.unstarted.get(driver)
            if stop.stopping or not queue:
                return None
            return queue.popleft()

    def take_unstarted(self) -> dict[AnyDriver, list[Any]]:
        """At a stop (heartbeat thread): take what the running batches claimed and have not
        started, to give it back at once; their batches settle the rest."""
        with self.lock:
            taken = {driver: list(queue) for driver, queue in self.unstarted.items() if queue}
            for driver, items in taken.items():
                self.unstarted[driver].clear()
                keys = {driver.key(item) for item in items}
                self.returned_early.setdefault(driver, set()).update(keys)
                self.inflight[driver] = [
                    i for i in self.inflight.get(driver, ()) if driver.key(i) not in keys
                ]
        return taken

    def end_batch(self, driver: AnyDriver) -> set[Hashable]:
        """The batch of ``driver`` ran: return the keys of its items given back at a stop."""
        with self.lock:
            self.unstarted.pop(driver, None)
            return self.returned_early.pop(driver, set())

    def drop(self, driver: AnyDriver, key: Hashable) -> None:
        """The item ``key`` of ``driver`` failed: no heartbeat renews its lease from now on."""
        with self.lock:
            self.inflight[driver] = [i for i in self.inflight[driver] if driver.key(i) != key]

    def settled(self, driver: AnyDriver, more: list[Any], at: float) -> None:
        """The batch of ``driver`` is settled; ``more``, its next batch claimed ahead by the
        settle sent at ``at``, is held from now on (the heartbeat renews them until their batch
        runs)."""
        with self.lock:
            self.inflight.pop(driver, None)
            if more:
                self.inflight[driver] = list(more)
                self.prefetched[driver] = more
        if more:
            self.claimed(driver, more, at)

    def let_go_prefetched(self) -> None:
        """The batches claimed ahead will not run (a stop came first): nothing is in flight
        any more (they are kept, to give back, by then)."""
        self.prefetched.clear()
        with self.lock:
            self.inflight.clear()
