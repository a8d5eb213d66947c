"""``workers --concurrency N``: up to N items of one process running at once, each in a slot.

A slot is a thread that runs one item at a time, start to end, as the main thread runs one
without ``--concurrency``: the handler through :meth:`~.drivers.Driver.call` (an ``async def``
handler's coroutine on the slot's own event loop), its progress reports on the worker's board.
Everything else stays in the main thread: claiming, settling, retrying, giving back. A slot
hands each outcome back (:meth:`Slots.wait`), and the main thread settles it as it settles an
item it ran itself. So the database work of a batch is the same whatever the concurrency, and
a slot holds a database connection only while the handler talks to the database: the slot
closes what the handler opened once the item has ended.

A hard stop (a second signal, the end of the grace period) interrupts each slot's handler
the way it interrupts the main thread's (:class:`~django_taskloop.runtime.StopNow`, raised
only inside the user's code; an ``async def`` handler's coroutine is then cancelled). A
handler that does not return to Python (a long C call) cannot be interrupted: it is given
back all the same, and its thread dies with the process.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

from django.db import connections

from .. import progress
from ..runtime import interrupt_thread
from .drivers import AnyDriver

__all__ = ["Outcome", "Slots"]

#: What a slot hands back: the driver, the item, the error it raised (``None``: it returned),
#: and the seconds the handler ran.
Outcome = tuple[AnyDriver, Any, "BaseException | None", float]


class _Slot:
    """One thread that runs the items it is given, one at a time."""

    def __init__(self, slots: Slots, number: int) -> None:
        self.slots = slots
        self.work: queue.SimpleQueue[tuple[AnyDriver, Any] | None] = queue.SimpleQueue()
        # What runs now (under Slots.lock): the driver and item, or None; and whether a hard stop
        # has interrupted it (once: a second StopNow would cut its cleanup short).
        self.running: tuple[AnyDriver, Any] | None = None
        self.interrupted = False
        self.thread = threading.Thread(target=self._serve, name=f"taskloop-slot-{number}", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while (work := self.work.get()) is not None:
            driver, item = work
            error: BaseException | None = None
            began = time.monotonic()
            try:
                token = self.slots.board.enter(driver, item)
                try:
                    driver.call(item)
                finally:
                    self.slots.board.leave(token, driver, item)
            except BaseException as raised:  # handed back: the main thread decides what it means
                error = raised
            seconds = time.monotonic() - began
            # A slot holds a connection only while its handler talks to the database.
            connections.close_all()
            self.slots.ended(self, (driver, item, error, seconds))


class Slots:
    """The slots of a worker process, the items they run, and the outcomes not yet handed back.
    A slot is made when an item finds none free: the runner keeps as many items running as the
    handler's concurrency allows, so there are never more slots than the largest of those."""

    def __init__(self, board: progress.Board[AnyDriver]) -> None:
        self.board = board
        self.lock = threading.Lock()
        self._outcomes: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
        self._all: list[_Slot] = []
        self._idle: list[_Slot] = []
        # Items given back at a hard stop while their handler still ran: what they say later
        # is not heard (they are not this worker's any more).
        self._abandoned: set[int] = set()

    @property
    def busy(self) -> int:
        """How many slots run an item now."""
        return len(self._all) - len(self._idle)

    def submit(self, driver: AnyDriver, item: Any) -> None:
        """Start ``item`` in a free slot, made if none is."""
        with self.lock:
            slot = self._idle.pop() if self._idle else None
            if slot is None:
                slot = _Slot(self, len(self._all) + 1)
                self._all.append(slot)
            slot.running, slot.interrupted = (driver, item), False
        slot.work.put((driver, item))

    def ended(self, slot: _Slot, outcome: Outcome) -> None:
        """(The slot's thread) its item ended: hand the outcome to the main thread."""
        with self.lock:
            slot.running = None
            self._idle.append(slot)
            if id(slot) in self._abandoned:
                self._abandoned.discard(id(slot))
                return
        self._outcomes.put(outcome)

    def wait(self, timeout: float) -> list[Outcome]:
        """Return the outcomes of the items that ended: at least one, unless ``timeout`` seconds
        pass first (then none)."""
        try:
            outcomes = [self._outcomes.get(timeout=timeout)]
        except queue.Empty:
            return []
        while True:
            try:
                outcomes.append(self._outcomes.get_nowait())
            except queue.Empty:
                return outcomes

    def interrupt(self) -> None:
        """A hard stop: raise :class:`~django_taskloop.runtime.StopNow` in each slot whose
        handler runs the user's code now and was not interrupted yet
        (:func:`~django_taskloop.runtime.interrupt_thread`; one at the edge of the call is looked
        at again on the next call). Once only: the handler's cleanup (an ``except``, a
        cancelled coroutine's) then runs undisturbed."""
        with self.lock:
            running = [slot for slot in self._all if slot.running is not None and not slot.interrupted]
        for slot in running:
            if slot.thread.ident is not None and interrupt_thread(slot.thread.ident):
                slot.interrupted = True

    def abandon(self) -> list[tuple[AnyDriver, Any]]:
        """A hard stop that the handlers outlast: return what the slots still run, whose outcomes
        will not be heard from now on (the caller gives the items back)."""
        with self.lock:
            running = [slot for slot in self._all if slot.running is not None]
            self._abandoned.update(id(slot) for slot in running)
            return [slot.running for slot in running if slot.running is not None]

    def close(self) -> None:
        """End the idle slots' threads (the busy ones end with the process)."""
        with self.lock:
            for slot in self._idle:
                slot.work.put(None)
            self._all = [slot for slot in self._all if slot not in self._idle]
            self._idle = []
