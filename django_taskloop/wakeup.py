"""Prompt wake-ups for ``take(timeout)``: waiting without hammering the database.

A waiting consumer sleeps on this process's wake-up condition. Three things wake it:

* a change committed by this process (``notify`` runs on commit, any thread);
* on PostgreSQL, a ``NOTIFY`` sent in the committing transaction of any process, heard by
  this process's one listener: a ``LISTEN`` connection per database, opened at the first wait
  and kept for the life of the process (reopened after a fork or an error), whose thread
  passes each notification on as ``notify`` does;
* on SQLite, a change of the database's files (a commit by any process), seen by looking at
  them every ``FILE_POLL`` seconds (a ``stat``, not a query);
* otherwise its own poll timer, with backoff from ``POLL_MIN`` up to a ceiling: ``POLL_MAX``
  where nothing else wakes it (MySQL/MariaDB, a PostgreSQL listener that is down), which
  bounds how late it notices a change made by another process there; ``CLOCK_POLL`` where
  every change wakes it, to catch what only the clock makes ready (a delay or ttr running
  out, a dead consumer), which must show within a second.
"""

from __future__ import annotations

import logging
import os
import selectors
import threading
import time
from collections.abc import Iterable
from typing import Any

from . import engine
from .conf import setting
from .engine import data_files, features

__all__ = [
    "channel",
    "notify",
    "wake_at",
    "woken_at",
    "send_notify",
    "Waiter",
    "keep_listeners",
    "close_listeners",
    "CLOCK_POLL",
]

logger = logging.getLogger("django_taskloop.wakeup")

#: Seconds between two polls of a waiter that a listener wakes on every change: what only the
#: clock makes ready (delays, ttr, dead consumers) must be noticed within a second.
CLOCK_POLL = 0.75

#: Seconds between two looks at an SQLite database's files (a ``stat`` each, no query).
FILE_POLL = 0.01

#: Seconds before a listener that failed is opened again.
RECONNECT_AFTER = 1.0

_lock = threading.Lock()
# One condition for the whole process: a waiter sleeps on it and looks at the generations of
# the tubes it waits for (a wake-up meant for another tube costs it a look, no query).
_changed = threading.Condition(_lock)
_generations: dict[tuple[str, int], int] = {}
# When a tube's waiters are to be woken by the clock (wake_at), by (database, tube id):
# monotonic seconds.
_timers: dict[tuple[str, int], float] = {}


def _bump(keys: Any) -> None:
    with _changed:
        for key in keys:
            _generations[key] = _generations.get(key, 0) + 1
        _changed.notify_all()


def notify(using: str, tube_id: int) -> None:
    """Wake this process's consumers waiting on tube ``tube_id`` of database ``using``."""
    _bump([(using, tube_id)])


def wake_at(using: str, tube_id: int, seconds: float) -> None:
    """Wake this process's consumers waiting on tube ``tube_id`` of database ``using`` in
    ``seconds`` (a tube's rate lets a take claim again then), unless a wake-up is set sooner."""
    key, now = (using, tube_id), time.monotonic()
    at = now + max(0.0, seconds)
    with _changed:
        set_at = _timers.get(key)
        if set_at is None or set_at <= now or at < set_at:  # (one past is spent)
            _timers[key] = at
            _changed.notify_all()


def woken_at(using: str, tube_id: int) -> float | None:
    """When :func:`wake_at` is set to wake tube ``tube_id``'s waiters (``time.monotonic()``
    seconds, still to come), or ``None``."""
    at = _timers.get((using, tube_id))
    return at if at is not None and at > time.monotonic() else None


def _ring(keys: Iterable[tuple[str, int]], now: float) -> float:
    # (Under _changed.) Turn the timers of ``keys`` that are due into wake-ups; return when the
    # next of them is due.
    following = float("inf")
    for key in keys:
        at = _timers.get(key)
        if at is None:
            continue
        if at <= now:
            del _timers[key]
            _generations[key] = _generations.get(key, 0) + 1
        else:
            following = min(following, at)
    return following


def channel(tube_id: int) -> str:
    """Return the PostgreSQL ``NOTIFY`` channel of tube ``tube_id``."""
    return f"taskloop_tube_{int(tube_id)}"


def send_notify(using: str, tube_id: int) -> None:
    """Inside a transaction on PostgreSQL, wake other processes' waiters at its commit."""
    engine.send_notify(using, channel(tube_id))


class Waiter:
    """Sleep until tube ``tube_id`` (or any of several) may have a task ready, polling with
    backoff as a floor.

    Create it after a first try came back empty and try once more before the first sleep:
    a change committed in between is then seen by that try or wakes the sleep. On PostgreSQL
    the process's listener ``LISTEN``s on the tubes' channels before the constructor returns.
    """

    def __init__(self, using: str, tube_id: int | Iterable[int]) -> None:
        tube_ids = [tube_id] if isinstance(tube_id, int) else list(tube_id)
        self.keys = [(using, pk) for pk in tube_ids]
        with _changed:
            self.seen = {key: _generations.setdefault(key, 0) for key in self.keys}
        self.interval = float(setting("POLL_MIN"))
        self.listener: _Listener | None = None
        self.files: list[str] = []
        if features(using).notify:
            self.listener = _listener(using)
            try:
                for pk in tube_ids:
                    self.listener.listen(pk)
            except BaseException:
                self.close()
                raise
        else:
            self.files = data_files(using)
            self.stamp = _stamp(self.files)

    def ceiling(self) -> float:
        """The longest sleep between two polls now."""
        if self.files or (self.listener is not None and self.listener.healthy):
            return max(float(setting("POLL_MAX")), CLOCK_POLL)
        return float(setting("POLL_MAX"))

    def _notified(self) -> set[int]:
        # (Under _changed.)
        return {key[1] for key in self.keys if _generations[key] != self.seen[key]}

    def sleep(self, limit: float | None) -> set[int]:
        """Sleep until woken, the next poll, or ``limit`` seconds, whichever comes first.

        Return the tubes a change to them woke it for; an empty set when the clock (or, on
        SQLite, a commit somewhere in the database) ended the sleep: then a poll must say
        whether anything is worth a take.
        """
        interval = self.interval
        if limit is not None:
            interval = max(0.0, min(interval, limit))
        self.interval = min(self.ceiling(), self.interval * float(setting("POLL_FACTOR")))
        deadline = time.monotonic() + interval
        with _changed:
            while True:
                now = time.monotonic()
                following = _ring(self.keys, now)  # (a timer due rings as a change would)
                if notified := self._notified():
                    break
                left = min(deadline, following) - now
                if left <= 0:
                    break
                if not self.files:
                    _changed.wait(left)
                    continue
                _changed.wait(min(left, FILE_POLL))
                stamp = _stamp(self.files)
                if stamp != self.stamp:
                    self.stamp = stamp
                    break
            for key in self.keys:
                self.seen[key] = _generations[key]
        if notified:
            # Woken by a put: poll quickly again in case a rival takes what woke us.
            self.interval = float(setting("POLL_MIN"))
        # A change to SQLite's files ends this sleep (one poll says whether it was a put) but
        # keeps the backoff: any commit in the database changes them (the site's own writes,
        # heartbeats), and the next one wakes us again at once anyway. (Resetting it cost an
        # idle worker 38 reads a second beside five writes a second.)
        return notified

    def close(self) -> None:
        """Done waiting: the process's listener closes too, unless a worker keeps it."""
        if self.listener is not None:
            _release(self.listener)
            self.listener = None


def _stamp(files: list[str]) -> list[tuple[int, int, int] | None]:
    """What the files look like now (size, modification time, inode); ``None``: missing."""
    stamps: list[tuple[int, int, int] | None] = []
    for name in files:
        try:
            st = os.stat(name)
        except OSError:
            stamps.append(None)
        else:
            stamps.append((st.st_size, st.st_mtime_ns, st.st_ino))
    return stamps


class _Listener:
    """This process's ``LISTEN`` connection to one PostgreSQL database, and its thread.

    Only the thread touches the connection: it opens it, runs the ``LISTEN``s that waiters
    ask for (through a pipe that also wakes it), and turns each notification into
    :func:`notify`. After an error it wakes every waiter (a notification may have been lost),
    which then polls at ``POLL_MAX`` until the connection is back.
    """

    def __init__(self, using: str) -> None:
        self.using = using
        self.users = 0  # the waiters using it now
        self.params = engine.listen_params(using)
        self.conn: Any = None
        self.healthy = False
        # The last attempt to open the connection or to listen failed (until one succeeds).
        self.failing = False
        self.closing = False
        self.channels: dict[str, int] = {}  # channel → tube id, every one asked for
        self.listening: set[str] = set()  # those the current connection listens on
        self.changed = threading.Condition()
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        self.thread = threading.Thread(target=self._run, name=f"taskloop-listen-{using}", daemon=True)
        self.thread.start()

    def listen(self, tube_id: int, timeout: float = 5.0) -> bool:
        """Listen on tube ``tube_id``'s channel; return once it is in effect (or it cannot be)."""
        name = channel(tube_id)
        with self.changed:
            if name in self.listening and self.healthy:
                return True
            self.channels[name] = tube_id
        self._poke()
        deadline = time.monotonic() + timeout
        with self.changed:
            # Failing: the thread is reconnecting; the waiter polls meanwhile.
            while name not in self.listening and not self.failing:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(left)
            return name in self.listening

    def close(self) -> None:
        self.closing = True
        self._poke()
        self.thread.join(timeout=5)
        for fd in (self.read_fd, self.write_fd):
            try:
                os.close(fd)
            except OSError:
                pass

    def _poke(self) -> None:
        try:
            os.write(self.write_fd, b"x")
        except (BlockingIOError, OSError):
            pass  # the pipe is full (the thread will look anyway) or closed

    def _run(self) -> None:
        retry_at = 0.0
        while not self.closing:
            try:
                if self.conn is None:
                    pause = retry_at - time.monotonic()
                    if pause > 0:
                        self._wait_readable(None, pause)
                        continue
                    self._open()
                # Notifications that arrived while LISTEN ran wait in psycopg's backlog.
                if self._listen_pending() or self._wait_readable(self.conn.fileno(), None):
                    for notice in self.conn.notifies(timeout=0):
                        tube_id = self.channels.get(notice.channel)
                        if tube_id is not None:
                            notify(self.using, tube_id)
            except Exception as error:
                if self.closing:
                    break
                # Once per outage, in one line: the worker's outage lines say the rest.
                logger.log(
                    logging.DEBUG if self.failing else logging.WARNING,
                    "listener of database %r failed (%s: %s); reconnecting",
                    self.using,
                    type(error).__name__,
                    str(error).strip().split("\n", 1)[0],
                )
                self._drop()
                retry_at = time.monotonic() + RECONNECT_AFTER
        self._drop()

    def _wait_readable(self, fd: int | None, timeout: float | None) -> bool:
        """Wait until ``fd`` has data (return True) or the pipe is poked or ``timeout`` passes."""
        with selectors.DefaultSelector() as selector:
            selector.register(self.read_fd, selectors.EVENT_READ)
            if fd is not None:
                selector.register(fd, selectors.EVENT_READ)
            ready = {key.fd for key, _ in selector.select(timeout)}
        if self.read_fd in ready:
            try:
                while os.read(self.read_fd, 4096):
                    pass
            except BlockingIOError:
                pass
        return fd is not None and fd in ready

    def _open(self) -> None:
        conn = engine.listen_connection(self.params)
        with self.changed:
            self.conn = conn
            self.listening = set()

    def _listen_pending(self) -> bool:
        with self.changed:
            pending = [name for name in self.channels if name not in self.listening]
        if not pending:
            return False
        for name in pending:
            engine.listen(self.conn, name)
        with self.changed:
            recovered = self.failing
            self.listening.update(pending)
            self.healthy = True
            self.failing = False
            self.changed.notify_all()
        if recovered:
            # Back after a failure: what changed meanwhile sent notifications nobody heard.
            _bump([(self.using, tube_id) for tube_id in self.channels.values()])
        return True

    def _drop(self) -> None:
        conn = self.conn
        with self.changed:
            self.conn = None
            self.healthy = False
            self.failing = True
            self.listening = set()
            self.changed.notify_all()
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass
        # Waiters poll at POLL_MAX from now on, until the connection is back.
        _bump([(self.using, tube_id) for tube_id in list(self.channels.values())])


_listeners: dict[str, _Listener] = {}
# Listeners inherited through a fork: kept referenced, never closed, never used (their
# connection belongs to the parent).
_orphans: list[Any] = []
# Whether listeners stay open between waits (a worker process): otherwise the last waiter
# to leave closes its listener, so that a process that waits now and then (a web process, a
# test suite, which must then drop its database) keeps no connection open for nothing.
_keep = False


def _listener(using: str) -> _Listener:
    with _lock:
        listener = _listeners.get(using)
        if listener is None:
            listener = _listeners[using] = _Listener(using)
        listener.users += 1
        return listener


def _release(listener: _Listener) -> None:
    with _lock:
        listener.users -= 1
        if listener.users > 0 or _keep or _listeners.get(listener.using) is not listener:
            return
        del _listeners[listener.using]
    listener.close()


def keep_listeners() -> None:
    """Keep this process's ``LISTEN`` connections open between waits, until
    :func:`close_listeners` (a worker process: one session for its whole life)."""
    global _keep
    _keep = True


def close_listeners() -> None:
    """Close this process's ``LISTEN`` connections and stop keeping them (a worker, at exit)."""
    global _keep
    with _lock:
        _keep = False
        listeners = [listener for listener in _listeners.values() if listener.users == 0]
        for listener in listeners:
            del _listeners[listener.using]
    for listener in listeners:
        listener.close()


def _reset_after_fork() -> None:
    # A forked child starts with no waiter and no listener thread; a lock held by another
    # thread at the fork would never be released in the child.
    global _lock, _changed
    _lock = threading.Lock()
    _changed = threading.Condition(_lock)
    _generations.clear()
    _orphans.extend(_listeners.values())
    _listeners.clear()


os.register_at_fork(after_in_child=_reset_after_fork)
