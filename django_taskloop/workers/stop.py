"""A worker's stop, in two stages, as in django-tasks.

The first SIGTERM/SIGINT stops claiming and lets the work in hand finish within
``TASKLOOP["GRACE_PERIOD"]`` seconds; a second signal (or the end of the grace period, an
alarm) interrupts the handler and gives everything back at once. The handlers run in the main
thread between two bytecodes: they set flags and a :class:`~.stopping.StopEvent` (no lock),
and raise :class:`~django_taskloop.runtime.StopNow` only inside the user's code.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable
from types import FrameType
from typing import Any, TypeAlias

from ..conf import setting
from ..stopping import StopEvent
from . import StopNow, inside_user_code
from .supervisor import STOP_SIGNALS

__all__ = ["SignalHandler", "Stop"]

logger = logging.getLogger("django_taskloop.workers")

#: What ``signal.getsignal`` returns: a Python handler, ``SIG_DFL``/``SIG_IGN``, or ``None``
#: (a handler not installed from Python).
SignalHandler: TypeAlias = Callable[[int, FrameType | None], Any] | int | None


class Stop:
    """Whether, and how hard, the worker ``identity`` is stopping; read by its every thread.

    A stop signal sets :attr:`stopping` (then nothing new starts), a second one or the end of
    the grace period :attr:`aborting` too. A supervised child's loop also ends when its
    supervisor is gone (:meth:`supervisor_gone`)."""

    def __init__(self, identity: str, *, supervised: bool = False) -> None:
        self.identity = identity
        # A supervised child stops when its supervisor is gone (kill -9 of the supervisor);
        # a worker run on its own may well outlive the shell that started it.
        self._parent = os.getppid() if supervised else None
        self.stopping = False
        self.aborting = False
        #: When the grace period of a stop signal ends (monotonic; ``inf`` until one comes).
        self.stop_by = float("inf")
        # Set by the stop signals' handlers: not a threading.Event (see StopEvent).
        self.wake = StopEvent()

    def install_signals(self) -> dict[int, SignalHandler]:
        """Install the stop handlers; return the previous ones (for :meth:`restore_signals`)."""
        previous: dict[int, SignalHandler] = {
            sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM)
        }
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGALRM, self._on_alarm)
        # A worker started with them blocked (by a parent that had them so) would never hear
        # a stop: the handlers above are the whole story.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        return previous

    def restore_signals(self, previous: dict[int, SignalHandler]) -> None:
        """Put back the handlers :meth:`install_signals` found.

        Run in-process (call_command), the caller gets its own handlers back. But after a
        stop, the default (die) is ignoring: the stop is done, and one sent again while the
        process exits (a supervisor's, a process manager's) must not turn 0 into -15.
        """
        for sig, handler in previous.items():
            stopped = self.stopping and handler == signal.SIG_DFL
            signal.signal(sig, signal.SIG_IGN if stopped else handler)

    def supervisor_gone(self) -> bool:
        """Say whether this supervised child has lost its supervisor (kill -9 of it)."""
        return self._parent is not None and os.getppid() != self._parent

    def disarm(self) -> None:
        """Cancel the alarm of the grace period (the work in hand is over)."""
        signal.setitimer(signal.ITIMER_REAL, 0)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
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

    def _on_alarm(self, signum: int, frame: FrameType | None) -> None:
        if self.stopping:
            if not self.aborting:
                logger.warning("worker %s: grace period over, giving back what is left", self.identity)
            self._abort(frame)

    def _abort(self, frame: FrameType | None) -> None:
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
