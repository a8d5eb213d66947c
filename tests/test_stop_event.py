"""StopEvent: what stop signals' handlers set (workers, reap_locks, taskloop status --watch).

A ``threading.Event`` set by a handler can deadlock the main thread: its ``set()`` takes the
lock its ``wait()`` holds for a moment, and the handler runs in the thread that holds it (CI
once saw ``taskloop status --watch`` never stop on Ctrl-C). StopEvent takes no lock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from django_taskloop.stopping import StopEvent


def test_a_handler_that_sets_it_ends_a_wait_at_once():
    event = StopEvent()
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: event.set())
    try:
        started = time.monotonic()
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        assert event.wait(30) is True
        assert time.monotonic() - started < 5
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert event.is_set() and event.wait() is True  # set for good: every later wait returns


def test_it_times_out_unset_and_wakes_every_waiting_thread():
    event = StopEvent()
    started = time.monotonic()
    assert event.wait(0.1) is False and not event.is_set()
    assert time.monotonic() - started >= 0.09
    woke: list[bool] = []
    waiters = [threading.Thread(target=lambda: woke.append(event.wait(30))) for _ in range(3)]
    for waiter in waiters:
        waiter.start()
    time.sleep(0.1)
    event.set()
    event.set()  # twice: nothing more happens
    for waiter in waiters:
        waiter.join(10)
    assert woke == [True, True, True]


ROUNDS = """
import signal, sys, threading, time
from django_taskloop.stopping import StopEvent
make = threading.Event if sys.argv[1] == "threading" else StopEvent
for _ in range(3000):
    event = make()
    signal.signal(signal.SIGALRM, lambda signum, frame, event=event: event.set())
    signal.setitimer(signal.ITIMER_REAL, 0.001)
    while not event.wait(0):
        pass
print("all rounds ended")
"""


def test_handlers_set_it_many_times_while_the_main_thread_waits_in_short_waits():
    """The moment that deadlocks a threading.Event: signals landing while the main thread
    goes in and out of waits. Run with ``threading`` instead of ``stop-event``, a
    threading.Event hung here in every try; every round must end at its signal."""
    done = subprocess.run(
        [sys.executable, "-c", ROUNDS, "stop-event"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "all rounds ended" in done.stdout, done.stderr


def test_a_forked_child_waits_on_a_pipe_of_its_own():
    event = StopEvent()
    pid = os.fork()
    if pid == 0:  # the child: the parent's set() must not end its waits
        time.sleep(0.3)
        started = time.monotonic()
        ok = event.wait(0.3) is False and time.monotonic() - started >= 0.25
        os._exit(0 if ok else 1)
    event.set()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
