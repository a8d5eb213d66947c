"""Let a running handler say how far it is: ``progress.report(0.4, "copied 400 of 1000 files")``.

The worker sets, around each handler call, which item runs (a context variable, so async
handlers and code run with a copy of the context see it too). :func:`report` only notes the
value in memory and never touches the database: the worker's heartbeat thread writes the
latest values of the process at most once every :data:`WRITE_EVERY` seconds (its own
connection, outside any transaction of the handler) and, with that write, renews the leases
of the queues that reported. Outside a worker (a test, a shell, Django's ImmediateBackend)
:func:`report` checks its arguments and does nothing else.

Imports nothing of the package: handlers at any floor may import it.
"""

from __future__ import annotations

import contextvars
import math
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar

__all__ = ["MAX_MESSAGE", "WRITE_EVERY", "Board", "Report", "areport", "report"]

#: Longest message kept; a longer one is cut to this many characters (the last one "…").
MAX_MESSAGE = 200
#: Fewest seconds between two progress writes of one worker process.
WRITE_EVERY = 1.0

#: What runs an item (the worker's driver): what its lease is renewed through.
Owner = TypeVar("Owner", bound=Hashable)
#: What names an item in the progress store: ``(kind, queue, item)`` as Failure rows name it.
Key = tuple[str, str, str]


@dataclass(frozen=True)
class Report:
    """The latest progress of one running item."""

    fraction: float
    message: str


class _Running(NamedTuple):
    """The item the current handler call works on, and the board of its worker (a named
    tuple: one is made per item a worker runs, and a frozen dataclass costs three times as
    much to make)."""

    board: Board[Any]
    owner: Any
    item: Any


_running: contextvars.ContextVar[_Running | None] = contextvars.ContextVar("taskloop_progress", default=None)


def _checked(fraction: Any, message: Any) -> tuple[float, str]:
    """Return ``(fraction, message)`` as stored, or raise ValueError/TypeError for bad input."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
        raise TypeError(f"fraction must be a number from 0 to 1, not {type(fraction).__name__}")
    if math.isnan(fraction) or not 0 <= fraction <= 1:
        raise ValueError(f"fraction must be from 0 to 1, not {fraction!r}")
    if not isinstance(message, str):
        raise TypeError(f"message must be a str, not {type(message).__name__}")
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 1] + "…"
    return float(fraction), message


def report(fraction: float, message: str = "") -> bool:
    """Note how far the running handler is: ``fraction`` from 0 to 1 and a short ``message``.

    Return True when a worker runs the caller (the value is written within a second or so),
    False outside a worker (nothing is recorded). Bad input raises ValueError or TypeError and
    records nothing. Cheap enough for a tight loop: no database access here.
    """
    fraction, message = _checked(fraction, message)
    running = _running.get()
    if running is None:
        return False
    running.board.note(running.owner, running.item, Report(fraction, message))
    return True


async def areport(fraction: float, message: str = "") -> bool:
    """:func:`report`, for ``async def`` handlers (it never blocks, so this only forwards)."""
    return report(fraction, message)


class Board(Generic[Owner]):
    """What one worker process's handlers reported and its heartbeat has not written yet.

    ``key(owner, item)`` names an item ``(kind, queue, item)``; ``owner`` is what runs it
    (the worker's driver), whose leases the heartbeat renews with each write. ``clock`` is
    ``time.monotonic`` (a test passes its own).
    """

    def __init__(
        self,
        key: Callable[[Owner, Any], Key],
        every: float = WRITE_EVERY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._key = key
        self._every = every
        self._clock = clock
        self._lock = threading.Lock()
        self._reports: dict[Key, tuple[Owner, Report]] = {}
        self._changed = False
        self._written_at = -math.inf

    @contextmanager
    def running(self, owner: Owner, item: Any) -> Iterator[None]:
        """Let :func:`report` calls inside this block report on ``item`` (run by ``owner``)."""
        token = self.enter(owner, item)
        try:
            yield
        finally:
            self.leave(token, owner, item)

    def enter(self, owner: Owner, item: Any) -> contextvars.Token[Any]:
        """:meth:`running` without its generator, for the worker's hot path: from here until
        :meth:`leave` (in a ``finally``) with what this returns, :func:`report` reports on
        ``item``."""
        return _running.set(_Running(self, owner, item))

    def leave(self, token: contextvars.Token[Any], owner: Owner, item: Any) -> None:
        """End what :meth:`enter` began: ``item`` no longer runs; its progress is dropped."""
        _running.reset(token)
        # A report on this item was noted before the handler returned (by code it ran or
        # waited for), so when nothing is kept there is nothing of its to drop: no lock for
        # a handler that never reported. (A report that comes after this was as late before.)
        if self._reports:
            self._forget(owner, item)

    def note(self, owner: Owner, item: Any, value: Report) -> None:
        """Keep ``value`` as ``item``'s latest progress, for the next write."""
        key = self._key(owner, item)
        with self._lock:
            self._reports[key] = (owner, value)
            self._changed = True

    def _forget(self, owner: Owner, item: Any) -> None:
        """Drop a finished item's progress (the next write removes it from the store)."""
        with self._lock:
            if not self._reports:
                return
            key = self._key(owner, item)
            if self._reports.pop(key, None) is not None:
                self._changed = True

    def due(self) -> tuple[dict[Key, Report], set[Owner]] | None:
        """Return what to write now — the latest progress of every running item that reported,
        and the owners that run them — or None: nothing changed, or the last write was less
        than ``every`` seconds ago. A write that fails is retried after :meth:`unwritten`."""
        with self._lock:
            now = self._clock()
            if not self._changed or now - self._written_at < self._every:
                return None
            self._changed, self._written_at = False, now
            reports = {key: value for key, (_owner, value) in self._reports.items()}
            return reports, {owner for owner, _value in self._reports.values()}

    def unwritten(self) -> None:
        """Say that the last write failed: the next :meth:`due` (after ``every``) retries."""
        with self._lock:
            self._changed = True
