"""``manage.py workers --reload``: start the workers again when a Python file changes, as
``runserver`` does, with Django's own autoreloader (:mod:`django.utils.autoreload`).

Django's protocol: a parent process runs the same command again as a child, with
``RUN_MAIN=true`` in its environment, and runs it again each time that child exits with status
3. The child watches the files of its modules with Django's reloader (``StatReloader``, or
``WatchmanReloader`` where Watchman runs), whose ``trigger_reload`` ends in ``sys.exit(3)``
once a file changed and no ``file_changed`` receiver took the change (a template's, say).

Two things differ from ``runserver``'s ``run_with_reloader``, so that running work finishes
before the restart:

- In the child the workers run in the main thread, where their stop signals, the grace
  period's alarm and the interruption of a handler must be, and the reloader in a thread of
  its own. Its ``sys.exit(3)`` ends only that thread; it is caught there, and it sends the
  main thread a SIGTERM: the graceful stop (unstarted items go back, running handlers finish
  within the grace period; a supervisor passes it to its children). Once the workers have
  returned, the child exits with status 3.
- The parent passes a stop signal on to the child and waits for it (``run_with_reloader``'s
  parent exits at once, and its ``subprocess.run`` kills the child on the way out). The child
  runs in a process group of its own, so that a signal to the parent's whole group (a
  terminal's Ctrl-C, ``timeout``, ``kill -TERM -PGID``) reaches the parent alone: the one the
  parent passes on is the child's only one, never a second (the hard stop).

With ``--processes N`` the child is the supervisor, and each worker process it forks watches
as well: it may import modules that the supervisor never does (a Django Task's, run by path).
It tells the child what changed, through a pipe; the child stops the supervisor, which passes
the stop on to its worker processes.

One stop, never two (a second SIGTERM is the hard stop): the parent puts one byte in a pipe
that the child shares, its *token*. A change stops the workers only if the child reads the
byte first; a stop signal that the parent receives takes it first, or finds the workers
stopping already for a reload and is not passed on.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
from collections.abc import Callable
from typing import Any

from django.db import connections
from django.utils import autoreload

__all__ = ["RELOAD", "reloading"]

logger = logging.getLogger("django_taskloop.workers")

#: The exit status by which a child asks Django's reloader parent to start it again.
RELOAD = 3
#: The environment variable that gives the child the descriptor of its parent's token.
TOKEN = "TASKLOOP_RELOAD_TOKEN"


def reloading(main: Callable[[], int]) -> int:
    """Run ``main`` (the workers; it returns an exit status), started again whenever a Python
    file it uses changes, after running work has finished; return the exit status."""
    if os.environ.get(autoreload.DJANGO_AUTORELOAD_ENV) == "true":
        return _Child().run(main)
    # The parent runs no worker: it keeps no connection open while its children come and go.
    connections.close_all()
    return _Parent().run()


def _token() -> int:
    """A new token: the read end of a pipe that holds one byte, non-blocking."""
    read, write = os.pipe()
    os.write(write, b"!")
    os.close(write)
    os.set_blocking(read, False)
    return read


def _take(token: int) -> bool:
    """Take the token; say whether it was there (one process at most ever does)."""
    try:
        return os.read(token, 1) == b"!"
    except BlockingIOError:
        return False


class _Parent:
    """Run this command again as a child until it exits with another status than
    :data:`RELOAD`; pass the stop signals on to it."""

    #: Seconds between two looks at the child; a stop signal is passed on at the next look.
    POLL = 0.1

    def __init__(self) -> None:
        # Each stop signal received; how many were passed on (or found the workers reloading).
        self.signals: list[int] = []
        self.passed = 0

    def _on_signal(self, signum: int, frame: Any) -> None:
        # Only noted: the loop passes it on (a handler that sent it could run twice at once).
        self.signals.append(signum)

    def run(self) -> int:
        args = autoreload.get_child_arguments()
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        status = 0
        while not self.signals:
            token = _token()
            os.set_inheritable(token, True)
            env = {**os.environ, autoreload.DJANGO_AUTORELOAD_ENV: "true", TOKEN: str(token)}
            try:
                # Its own process group: a signal to this one's group is not the child's too.
                child = subprocess.Popen(args, env=env, close_fds=False, process_group=0)
                status = self._wait(child, token)
            finally:
                os.close(token)
            if status != RELOAD:
                break
        if self.signals and (status == RELOAD or status < 0):
            # The stop passed on ended it: while reloading, or before its own handlers were in.
            return 0
        return status if status >= 0 else 128 - status

    def _wait(self, child: subprocess.Popen[bytes], token: int) -> int:
        """Wait for ``child`` to exit, passing the stop signals on; return its status."""
        while True:
            for signum in self.signals[self.passed :]:
                # The first stop takes the token, so that no change stops the workers after it;
                # if a change took it, they are stopping already (gracefully).
                reloading = self.passed == 0 and not _take(token)
                self.passed += 1
                if not reloading:
                    child.send_signal(signum)
            try:
                return child.wait(timeout=self.POLL)
            except subprocess.TimeoutExpired:
                pass


class _Child:
    """Run the workers in the main thread, with Django's reloader in another one (and one in
    each worker process of ``--processes N``): a change stops the workers as a SIGTERM does,
    and the child then exits with :data:`RELOAD`."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.reloader = autoreload.get_reloader()
        self.changed = "a file"
        self.reloading = False
        # The parent's token (a child started otherwise has one of its own); not passed on to
        # the processes that this one starts.
        token = os.environ.pop(TOKEN, "")
        self.token = int(token) if token else _token()
        # What the worker processes of --processes N saw change: a path a line.
        self.changes, self.tell = os.pipe()

    def run(self, main: Callable[[], int]) -> int:
        # Until the workers have put in their stop handlers (and once they have put these back),
        # a stop ends the child at once: it holds nothing.
        signal.signal(signal.SIGTERM, self._on_stop)
        autoreload.file_changed.connect(self._note, weak=False)
        os.register_at_fork(after_in_child=self._forked)
        logger.info("watching for file changes with %s", type(self.reloader).__name__)
        for target in (self._watch, self._listen):
            threading.Thread(target=target, name="taskloop-reloader", daemon=True).start()
        try:
            status = main()
        finally:
            self.reloader.stop()
            autoreload.file_changed.disconnect(self._note)
        _take(self.token)  # a change from now on must not stop workers that are gone
        return RELOAD if self.reloading else status

    def _on_stop(self, signum: int, frame: Any) -> None:
        raise SystemExit(RELOAD if self.reloading else 0)

    def _note(self, sender: Any, file_path: Any, **kwargs: Any) -> None:
        # Sent before trigger_reload, which tells no receiver about the file.
        self.changed = str(file_path)

    def _forked(self) -> None:
        # A worker process of the supervisor (not a process that one of them forks).
        if os.getppid() == self.pid:
            self.reloader = autoreload.get_reloader()
            threading.Thread(target=self._watch, name="taskloop-reloader", daemon=True).start()

    def _watch(self) -> None:
        """The reloader's loop (``BaseReloader.run`` without loading the URLconf, which a
        worker does not serve); a change stops the workers, gracefully."""
        try:
            autoreload.autoreload_started.send(sender=self.reloader)
            self.reloader.run_loop()
        except SystemExit as exit:
            if exit.code != RELOAD:
                raise
            if os.getpid() == self.pid:
                self._reload(self.changed)
            else:
                os.write(self.tell, f"{self.changed}\n".encode())
        except Exception:
            logger.exception("the reloader failed: a code change no longer reloads the workers")

    def _listen(self) -> None:
        """Reload for what the worker processes saw change."""
        with open(self.changes, encoding="utf-8", errors="replace") as changes:
            for line in changes:
                self._reload(line.rstrip("\n"))

    def _reload(self, changed: str) -> None:
        """Stop the workers (the supervisor, with ``--processes N``) for a reload, unless a stop
        or another change came first: a SIGTERM to the main thread."""
        if not _take(self.token):
            return
        self.reloading = True
        logger.info("%s changed: reloading the workers after running work finishes", changed)
        main = threading.main_thread().ident
        if main is not None:
            signal.pthread_kill(main, signal.SIGTERM)
