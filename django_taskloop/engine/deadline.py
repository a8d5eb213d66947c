"""Round trips of our own that a hung server cannot hold forever.

A server that hangs (stopped, swapping, behind a network that drops packets without a reset)
keeps its connections open: the kernel still acknowledges what is sent, so neither a
statement timeout (the server enforces it: it is the one stopped) nor TCP keepalives end the
wait. A worker blocked there serves nothing, not even the other shards.

:func:`bounded` gives a stretch of our own database work (a claim, a settle, a heartbeat, a
put on a shard) a deadline on the client: past it, a watchdog thread shuts the connection's
socket down, so that the driver's blocked read returns at once with a lost connection, which
the callers already treat as a server that went away (the worker parks the shard or waits
the outage out; a put goes to the next shard). Nothing sent after the deadline can commit: a
transaction whose ``COMMIT`` was never sent is rolled back by the server when it reads the
end of the stream. The user's own statements (a handler's) are never bounded: only the
stretches the package wraps.

SQLite has no socket: its waits are bounded by its busy timeout.
"""

from __future__ import annotations

import functools
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.db import DatabaseError, connections

from ..conf import setting

__all__ = [
    "DeadlinePassed",
    "bound_connects",
    "bounded",
    "bounded_raw",
    "connect_timeout",
    "limit",
    "raw_socket",
]


class DeadlinePassed(DatabaseError):
    """The database did not answer within the deadline: its connection was shut down."""


class _Watchdog:
    """One daemon thread that shuts down the sockets of stretches past their deadline. It
    wakes when a deadline comes (or one sooner than it knew of is armed), not per stretch:
    in steady work about once per ``DATABASE_TIMEOUT``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.wake = threading.Condition(self.lock)
        #: token -> (deadline, what returns the socket to shut down, fired flag)
        self.armed: dict[int, tuple[float, Callable[[], int | None], list[bool]]] = {}
        self.token = 0
        self.thread: threading.Thread | None = None
        #: When the thread looks next (monotonic): a deadline armed before it needs a wake-up.
        self.wake_at = 0.0

    def arm(self, deadline: float, socket_of: Callable[[], int | None], fired: list[bool]) -> int:
        with self.lock:
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="taskloop-deadline", daemon=True)
                self.thread.start()
            self.token += 1
            self.armed[self.token] = (deadline, socket_of, fired)
            if deadline < self.wake_at:
                self.wake.notify()
            return self.token

    def disarm(self, token: int) -> None:
        with self.lock:
            self.armed.pop(token, None)

    def _run(self) -> None:
        with self.lock:
            while True:
                now = time.monotonic()
                due = [token for token, (deadline, _, _) in self.armed.items() if deadline <= now]
                for token in due:
                    _, socket_of, fired = self.armed.pop(token)
                    # Under the lock: the stretch cannot end, nor its connection close and its
                    # descriptor be reused, while we shut it down. Marked first: the driver's
                    # error may reach the stretch's end before this thread goes on.
                    fired[0] = True
                    fired[0] = _shut_down(socket_of())
                self.wake_at = min((deadline for deadline, _, _ in self.armed.values()), default=now + 60)
                self.wake.wait(max(0.0, self.wake_at - time.monotonic()))


_watchdog = _Watchdog()
# A forked child (a worker process) has no watchdog thread, and the lock may have been held by
# the parent's at the fork: it starts afresh.
os.register_at_fork(after_in_child=lambda: _Watchdog.__init__(_watchdog))


def raw_socket(raw: Any) -> int | None:
    """Return the file descriptor of a driver connection (psycopg 3 or 2, mysqlclient), or
    ``None`` (no connection, or one already closed)."""
    try:
        pgconn = getattr(raw, "pgconn", None)
        if pgconn is not None:
            return int(pgconn.socket)
        fileno = getattr(raw, "fileno", None)
        return int(fileno()) if callable(fileno) else None
    except Exception:  # closed: nothing to shut down
        return None


def _shut_down(descriptor: int | None) -> bool:
    if descriptor is None or descriptor < 0:
        return False
    try:
        # A second handle on the same socket: shutting it down ends the driver's wait; closing
        # ours leaves the driver's descriptor to the driver.
        with socket.socket(fileno=os.dup(descriptor)) as ours:
            ours.shutdown(socket.SHUT_RDWR)
    except Exception:  # closed meanwhile, or not a socket: nothing to end
        return False
    return True


@contextmanager
def bounded(using: str, seconds: float | None = None) -> Iterator[None]:
    """Give our database work on ``using`` inside the block ``seconds`` (default and most:
    ``TASKLOOP["DATABASE_TIMEOUT"]``, 0 there: unbounded) to finish; past them its connection
    is shut down and the driver's error surfaces as :class:`DeadlinePassed` (a lost
    connection). Nesting is fine: each block has its own deadline."""
    overall = float(setting("DATABASE_TIMEOUT"))
    seconds = overall if seconds is None else min(float(seconds), overall)
    wrapper = connections[using]
    if not seconds or wrapper.vendor == "sqlite":
        yield
        return
    if wrapper.connection is None:
        _connect(wrapper, seconds)
    # The socket is read here, in the thread that owns the connection (mysqlclient refuses a
    # call from another thread while a statement runs); the watchdog shuts it down only if the
    # connection is still the same one then (closed meanwhile, its descriptor may be another's).
    raw = wrapper.connection
    descriptor = raw_socket(raw)

    def socket_of() -> int | None:
        return descriptor if wrapper.connection is raw else None

    with bounded_raw(socket_of, f"database {using!r}", seconds, lambda: _close(wrapper)):
        yield


def bound_connects() -> None:
    """Give every connection this thread makes from now on a connect timeout of
    ``DATABASE_TIMEOUT`` (a worker's own threads): a server that hangs accepts the TCP
    connection and never answers its handshake, which no deadline on a socket can end (there
    is none yet). Only this thread's connections, without touching the settings."""
    seconds = limit()
    if not seconds:
        return
    for alias in connections:
        wrapper = connections[alias]
        if wrapper.vendor in ("postgresql", "mysql") and "get_connection_params" not in vars(wrapper):
            params = wrapper.get_connection_params
            wrapper.get_connection_params = functools.partial(_with_timeout, params, alias, seconds)  # type: ignore[method-assign]


def _with_timeout(params: Callable[[], dict[str, Any]], alias: str, seconds: float) -> dict[str, Any]:
    return {**params(), **connect_timeout(alias, seconds)}


def _connect(wrapper: Any, seconds: float) -> None:
    """Open ``wrapper``'s connection with a connect timeout of ``seconds`` (the driver's: a
    connection being made has no socket to shut down yet), without touching the settings: the
    wrapper is this thread's own, and only this connect sees the option. A connect that runs
    out of time raises :class:`DeadlinePassed`: the server hangs."""
    kept = vars(wrapper).get("get_connection_params")  # (bound_connects' own)
    params = getattr(kept, "args", (wrapper.get_connection_params,))[0]
    wrapper.get_connection_params = functools.partial(_with_timeout, params, wrapper.alias, seconds)
    started = time.monotonic()
    try:
        wrapper.ensure_connection()
    except DatabaseError as error:
        waited = connect_timeout(wrapper.alias, seconds)["connect_timeout"]
        if time.monotonic() - started < waited - 0.25:
            raise  # refused, or any other answer: the driver's error says it best
        raise DeadlinePassed(
            f"database {wrapper.alias!r} did not answer within {waited:g} s (a new connection: {error})"
        ) from error
    finally:
        if kept is None:
            del wrapper.get_connection_params
        else:
            wrapper.get_connection_params = kept


@contextmanager
def bounded_raw(
    socket_of: Callable[[], int | None], what: str, seconds: float, close: Callable[[], Any] = lambda: None
) -> Iterator[None]:
    """:func:`bounded` for the socket ``socket_of()`` returns when the deadline passes (``None``:
    nothing to shut down); ``what`` names it in the error; ``close()`` is called once it was
    shut down."""
    fired = [False]
    token = _watchdog.arm(time.monotonic() + seconds, socket_of, fired)
    try:
        yield
    except Exception as error:
        if fired[0]:
            close()
            raise DeadlinePassed(f"{what} did not answer within {seconds:g} s ({error})") from error
        raise
    finally:
        _watchdog.disarm(token)
    if fired[0]:
        close()  # it fired as the work ended: the connection is unusable now


def _close(wrapper: Any) -> None:
    try:
        wrapper.close()
    except Exception:  # noqa: S110  (a socket shut down may complain on close: it is gone anyway)
        wrapper.connection = None


def limit() -> float:
    """``TASKLOOP["DATABASE_TIMEOUT"]`` (0: unbounded)."""
    return float(setting("DATABASE_TIMEOUT"))


def connect_timeout(using: str, seconds: float | None = None) -> dict[str, Any]:
    """The driver's option that bounds a new connection to ``using`` to ``seconds`` (default
    ``DATABASE_TIMEOUT``; whole seconds, at least 2 as libpq wants), for connections of our
    own: ``{}`` on SQLite or when unbounded."""
    seconds = limit() if seconds is None else seconds
    vendor = connections[using].vendor
    if not seconds or vendor not in ("postgresql", "mysql"):
        return {}
    return {"connect_timeout": max(2, int(-(-seconds // 1)))}
