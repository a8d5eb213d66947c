"""What runs around a handler's call: the stop exceptions, the interruptible call, the backoff.

Imports nothing of the package but :mod:`django_taskloop.conf` (a leaf that reads settings),
so that any floor may raise :class:`StopNow`/:class:`FailedForGood` or call user code through
:func:`run_interruptibly` without importing the workers.
"""

from __future__ import annotations

import asyncio
import ctypes
import inspect
import sys
import threading
from collections.abc import Awaitable, Callable
from types import FrameType
from typing import Any

from .conf import setting

__all__ = [
    "StopNow",
    "FailedForGood",
    "run_interruptibly",
    "event_loop",
    "interrupt_thread",
    "inside_user_code",
    "backoff",
]


def backoff(attempt: int) -> float:
    """Return the retry delay after the ``attempt``-th failure (1-based): exponential, capped."""
    base = float(setting("RETRY_BACKOFF"))
    delay: float = min(base * 2 ** max(0, attempt - 1), float(setting("RETRY_BACKOFF_MAX")))
    return delay


class StopNow(BaseException):
    """Raised inside a running handler by the second signal or the end of the grace period.

    A ``BaseException`` so that a handler's ``except Exception`` does not swallow it. Code that
    catches ``BaseException`` around user code (the Django Tasks backend) must re-raise it: the
    worker gives the item back.
    """


class FailedForGood(Exception):
    """Raise from a handler when the item failed and must not be retried.

    The worker settles it as it settles success (the tube task is acknowledged, the job
    consumed, the loop id marked done), counts it as failed and logs ``__cause__``. The Django
    Tasks backend raises it after recording a task as FAILED.
    """


def run_interruptibly(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call user code that a hard stop may interrupt (with :class:`StopNow`); return its result.

    The worker interrupts only code running *inside* this call: once ``func`` has returned, a
    hard stop no longer interrupts it, so what finished is settled as finished and never run
    again (see :func:`inside_user_code`). Drivers call each handler through it; code that runs
    user code inside a handler of its own (the Django Tasks backend) calls it around that code.

    An ``async def`` function (or any call that returns an awaitable) is run to completion on
    this thread's event loop (the main thread's, or a ``--concurrency`` slot's), here, so that a
    hard stop interrupts it the same way (the coroutine is then cancelled) and nothing is settled
    before it has finished.
    """
    result = func(*args, **kwargs)
    if result is not None and inspect.isawaitable(result):  # (most handlers return None)
        loop = event_loop()
        future = asyncio.ensure_future(result, loop=loop)
        try:
            # Awaited in this frame, not a helper's: a signal that finds the main thread here
            # (not deeper) is at the edge, before the run or after it returned.
            result = loop.run_until_complete(future)
        except BaseException:
            _cancel(loop, future)
            raise
    return result


#: Each thread's event loop, by thread id.
_loops: dict[int, asyncio.AbstractEventLoop] = {}


def event_loop() -> asyncio.AbstractEventLoop:
    """Return this thread's event loop for ``async def`` handlers (made on first use): the main
    thread's, or that of one of the slots of ``workers --concurrency``, each of which runs one
    item at a time."""
    ident = threading.get_ident()
    loop = _loops.get(ident)
    if loop is None or loop.is_closed():
        loop = _loops[ident] = asyncio.new_event_loop()
    return loop


def interrupt_thread(ident: int) -> bool:
    """A hard stop, for the thread ``ident`` (a slot of ``workers --concurrency``): raise
    :class:`StopNow` in it if it runs user code now (:func:`inside_user_code`, as the signal
    handler decides for the main thread); say whether it did.

    The exception is raised when the thread next runs Python code: at once in a handler that
    computes, once the wait is over in one that waits in a C call (``time.sleep``). A thread
    that waits in its event loop (an ``async def`` handler) is woken to hear it, and its
    coroutine is then cancelled by :func:`run_interruptibly`."""
    if not inside_user_code(sys._current_frames().get(ident)):
        return False
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(StopNow))
    loop = _loops.get(ident)
    if loop is not None and loop.is_running():
        loop.call_soon_threadsafe(lambda: None)
    return True


def _cancel(loop: asyncio.AbstractEventLoop, future: Awaitable[Any]) -> None:
    """Cancel a coroutine a stop interrupted, and let it run its cleanup (a second at most)."""
    if not isinstance(future, asyncio.Future) or future.done():
        return
    future.cancel()
    try:
        loop.run_until_complete(asyncio.wait([future], timeout=1.0))
    except BaseException:  # a further stop: leave the rest of its cleanup undone
        pass


def inside_user_code(frame: FrameType | None) -> bool | None:
    """Tell where a signal found the main thread: ``True`` inside user code, ``False`` outside.

    ``None`` means at the edge, in :func:`run_interruptibly`'s own frame: user code is about
    to start or has just returned, and which one cannot be told; the worker looks again a
    moment later. Deciding from the stack rather than from a flag set after the call closes
    the window in which a handler had returned (its work committed) but the flag still said
    "running", where a hard stop gave finished work back to be run again.
    """
    code = run_interruptibly.__code__
    if frame is not None and frame.f_code is code:
        return None
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False
