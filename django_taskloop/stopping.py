"""An event that a signal handler may set.

``threading.Event.set()`` takes the lock of the event's condition, which ``wait()`` also holds
for a moment, in the same thread when the waiter is the main thread (where Python runs signal
handlers). A stop signal arriving in that moment blocks its handler on a lock its own thread
holds: the process never stops (seen once in CI, a ``taskloop status --watch`` that ignored
Ctrl-C). :class:`StopEvent` is set by a flag and one byte written to a pipe, neither of which
takes a lock; its waiters wait on the pipe.
"""

from __future__ import annotations

import math
import os
import select
import weakref


class StopEvent:
    """A one-way event (set, never cleared): ``set()``, ``is_set()``, ``wait(timeout)``, as
    ``threading.Event``'s, and ``set()`` safe in a signal handler. Any number of threads may
    wait on it."""

    def __init__(self) -> None:
        self._set = False
        self._pid = -1
        self._pipe()

    def _pipe(self) -> int:
        """The pipe's read end. A forked child gets a pipe of its own: sharing its parent's,
        it would see the parent's byte with its own flag unset, and never wait again."""
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._read, self._write = os.pipe()
            os.set_blocking(self._write, False)
            weakref.finalize(self, _close, self._read, self._write)
            if self._set:
                os.write(self._write, b"!")
        return self._read

    def set(self) -> None:
        if self._set:
            return
        self._set = True
        self._pipe()
        try:
            os.write(self._write, b"!")
        except BlockingIOError:  # (a byte is there already)
            pass

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the event is set or ``timeout`` seconds have passed; return whether it
        is set. (The byte stays in the pipe: every later wait returns at once.)"""
        if not self._set:
            # poll, not select: select refuses descriptors past 1,023 (a process with many open).
            poller = select.poll()
            poller.register(self._pipe(), select.POLLIN)
            poller.poll(None if timeout is None else math.ceil(max(0.0, timeout) * 1000))
        return self._set


def _close(*fds: int) -> None:
    for fd in fds:
        os.close(fd)
