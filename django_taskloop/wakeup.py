"""Prompt wake-ups for ``take(timeout)``: waiting without hammering the database.

A waiting consumer sleeps on a per-process condition for the tube. Three things wake it:

* a change committed by this process (``notify`` runs on commit, any thread);
* on PostgreSQL, a ``NOTIFY`` sent in the committing transaction of any process, heard on a
  ``LISTEN`` connection the waiter opens for as long as it waits;
* otherwise its own poll timer, with backoff between ``POLL_MIN`` and ``POLL_MAX`` (the conf
  settings), which bounds how late it notices a change made by another process on SQLite and
  MySQL/MariaDB, and a task made ready by the clock (a delay or ttr running out).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from django.db import connections

from .conf import setting
from .engine import features

__all__ = ["channel", "notify", "send_notify", "Waiter"]

_lock = threading.Lock()
_conditions: dict[tuple[str, int], threading.Condition] = {}
_generations: dict[tuple[str, int], int] = {}


def _condition(key: tuple[str, int]) -> threading.Condition:
    with _lock:
        condition = _conditions.get(key)
        if condition is None:
            condition = _conditions[key] = threading.Condition()
            _generations[key] = 0
        return condition


def notify(using: str, tube_id: int) -> None:
    """Wake this process's consumers waiting on tube ``tube_id`` of database ``using``."""
    key = (using, tube_id)
    condition = _condition(key)
    with condition:
        _generations[key] += 1
        condition.notify_all()


def channel(tube_id: int) -> str:
    """Return the PostgreSQL ``NOTIFY`` channel of tube ``tube_id``."""
    return f"taskloop_tube_{int(tube_id)}"


def send_notify(using: str, tube_id: int) -> None:
    """Inside a transaction on PostgreSQL, wake other processes' waiters at its commit."""
    if features(using).notify:
        with connections[using].cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, '')", [channel(tube_id)])


class Waiter:
    """Sleep until tube ``tube_id`` may have a task ready, polling with backoff as a floor.

    Create it after a first try came back empty and try once more before the first sleep:
    a change committed in between is then seen by that try or wakes the sleep. On PostgreSQL
    the waiter ``LISTEN``s on a connection of its own for as long as it waits; ``close()``
    it when done.
    """

    def __init__(self, using: str, tube_id: int) -> None:
        self.key = (using, tube_id)
        self.condition = _condition(self.key)
        with self.condition:
            self.seen = _generations[self.key]
        self.interval = float(setting("POLL_MIN"))
        # Each poll is one cheap indexed read; half of POLL_MAX keeps the typical wake-up by
        # another process well inside the promised 100 ms.
        self.ceiling = float(setting("POLL_MAX")) / 2
        self.listener: Any = None
        if features(using).notify:
            self.listener = _listen(using, channel(tube_id))
            # NOTIFY wakes us at once; polling is left to catch the clock's transitions
            # (delays, ttr), which must show within a second.
            self.ceiling = max(float(setting("POLL_MAX")), 0.25)

    def sleep(self, limit: float | None) -> None:
        """Sleep until woken, the next poll, or ``limit`` seconds, whichever comes first."""
        interval = self.interval
        if limit is not None:
            interval = max(0.0, min(interval, limit))
        self.interval = min(self.ceiling, self.interval * float(setting("POLL_FACTOR")))
        if self.listener is not None:
            woken = False
            for _ in self.listener.notifies(timeout=interval, stop_after=1):
                woken = True
            if woken:
                self.interval = float(setting("POLL_MIN"))
            return
        deadline = time.monotonic() + interval
        with self.condition:
            while _generations[self.key] == self.seen:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self.condition.wait(left)
            self.seen = _generations[self.key]
            # Woken by a change: poll quickly again in case a rival takes what woke us.
            self.interval = float(setting("POLL_MIN"))

    def close(self) -> None:
        """Stop listening (PostgreSQL)."""
        if self.listener is not None:
            self.listener.close()
            self.listener = None


def _listen(using: str, name: str) -> Any:
    import psycopg

    params = dict(connections[using].get_connection_params())
    for key in ("cursor_factory", "context", "prepare_threshold", "server_side_binding"):
        params.pop(key, None)
    conn = psycopg.connect(**params, autocommit=True)
    conn.execute(f'LISTEN "{name}"')
    return conn


def _reset_after_fork() -> None:
    # A forked child starts with no waiter; a lock held by another thread at the fork would
    # never be released in the child.
    global _lock
    _lock = threading.Lock()
    _conditions.clear()
    _generations.clear()


os.register_at_fork(after_in_child=_reset_after_fork)
