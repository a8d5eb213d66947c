"""The supervisor of ``manage.py workers --processes N``: it keeps N worker processes running."""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import wait as wait_for_sentinels
from typing import Any

from django.db import connections

from ..conf import setting
from . import Handler
from .drivers import make_driver

__all__ = ["STOP_SIGNALS", "Supervisor"]

logger = logging.getLogger("django_taskloop.workers")

#: The signals that stop workers; the supervisor blocks them while it starts a child.
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


class Supervisor:
    """Keep ``processes`` worker processes running; restart the ones that die.

    After the first stop signal no child is started again, every live child gets each
    signal, and the supervisor exits once they all have (status 0 unless a child failed by
    itself); a child that outlives its grace period by far is stopped hard.
    """

    #: Seconds past the grace period after which children still running get a second signal
    #: (stop now), and as long again after which they are killed.
    OVERDUE = 10.0

    def __init__(
        self,
        handlers: Sequence[Handler],
        processes: int,
        burst: bool,
        schedule: bool = True,
        *,
        child: Callable[[list[str], bool, bool], None],
    ) -> None:
        self.handlers = list(handlers)
        # What a child process runs: (handler names, burst, schedule); it never returns.
        self.child = child
        self.names = [h.name for h in handlers]
        self.processes = processes
        self.burst = burst
        self.schedule = schedule
        self.signals: list[int] = []
        self.stopped_at: float | None = None
        self.context = multiprocessing.get_context("fork")
        self.children: dict[int, Any] = {}
        # When each slot's child was last restarted; how far the stop has escalated (0: not
        # at all, 1: told to stop now, 2: killed); the grace period, read once per run.
        self.restarts: dict[int, float] = {}
        self.escalated = 0
        self.grace = 0.0

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.signals.append(signum)
        if self.stopped_at is None:
            self.stopped_at = time.monotonic()
        self._tell_children(signum)

    def _tell_children(self, signum: int) -> None:
        for process in list(self.children.values()):
            if process.pid and process.exitcode is None:
                try:
                    os.kill(process.pid, signum)
                except ProcessLookupError:
                    pass

    def _start(self, slot: int) -> None:
        """Start a child in ``slot`` unless a stop has come; never lose a signal meanwhile.

        Stop signals are blocked from the check to the child's registration, so a signal
        that arrives in between is handled once the child is in ``self.children`` (and is
        passed on to it); the child unblocks them itself after resetting its handlers.
        """
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            if self.signals:
                return
            # Children must not share the parent's database connections.
            connections.close_all()
            process = self.context.Process(
                target=self.child,
                args=(self.names, self.burst, self.schedule),
                name=f"taskloop-worker-{slot}",
            )
            process.start()
            self.children[slot] = process
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)

    def run(self) -> int:
        """Start the children, restart those that die, stop them at a signal; return the exit
        status (0 unless a child failed by itself)."""
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        # Create tubes and boards once, here, rather than racing to create them in every child.
        for handler in self.handlers:
            if not self.signals:
                make_driver(handler, "supervisor").prepare()
        for slot in range(self.processes):
            self._start(slot)
        status = 0
        self.grace = float(setting("GRACE_PERIOD"))
        while self.children:
            wait_for_sentinels([p.sentinel for p in self.children.values()], timeout=0.5)
            if self.stopped_at is not None:
                self._escalate(time.monotonic() - self.stopped_at - self.grace)
            for slot, process in list(self.children.items()):
                if process.exitcode is not None:
                    status = max(status, self._ended(slot, process))
        logger.info("all worker processes stopped")
        if self.signals:
            # The stop is done: one sent again while this process exits must not kill it with
            # -15 (Python's exit hands its signal handlers back to the default, die).
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        return status

    def _escalate(self, overdue: float) -> None:
        """Children still running ``overdue`` seconds after the grace period: past
        :attr:`OVERDUE`, tell them to stop now; past twice that, kill them."""
        if self.escalated == 0 and overdue > self.OVERDUE:
            logger.warning("worker processes still running %gs after the grace period: stop now", overdue)
            self.escalated = 1
            self._tell_children(signal.SIGTERM)
        elif self.escalated == 1 and overdue > 2 * self.OVERDUE:
            logger.error("worker processes still running: killing them")
            self.escalated = 2
            self._tell_children(signal.SIGKILL)

    def _ended(self, slot: int, process: Any) -> int:
        """Deal with the child in ``slot`` that has exited: restart it unless the work is over;
        return 1 if it failed by itself at the end, else 0."""
        process.join()
        code = process.exitcode
        del self.children[slot]
        if self.signals or (self.burst and code == 0):
            # A child killed by a signal (the stop itself, or kill -9 just before it)
            # is no failure of the command; one that exited with an error is.
            return 1 if code > 0 else 0
        logger.error("worker process %s (pid %s) died with status %s; restarting it", slot, process.pid, code)
        # A child that dies at once again and again would spin: slow the restarts
        # down (a stop meanwhile cuts the wait short and cancels the restart).
        last = self.restarts.get(slot, 0.0)
        if time.monotonic() - last < 1.0:
            deadline = time.monotonic() + 1.0
            while not self.signals and time.monotonic() < deadline:
                time.sleep(0.05)
        self.restarts[slot] = time.monotonic()
        self._start(slot)
        return 0
