"""Test code that enqueues Django Tasks, with no worker: in the test's thread and transaction.

Two ways, on the same machinery a worker uses (the tube handlers of
:func:`~django_taskloop.backends.task_handlers`, driven through the tubes' public verbs), so that
results read as they would in production:

- :func:`run_queued` runs what the code under test queued, now, and returns how many ran::

      result = send_digest.enqueue(7)
      assert run_queued() == 1
      assert send_digest.get_result(result.id).status == "SUCCESSFUL"

- :class:`ImmediateBackend` (a ``TASKS`` backend; :func:`immediate` switches every
  ``TaskloopBackend`` to it for a test) runs each task as it is enqueued.

Both run in the caller's thread, on its connection and inside its transaction: they work in
``django.test.TestCase`` and with pytest-django's ``db`` fixture, and never meet a lock that a
worker process or a heartbeat thread would hold (SQLite's "database table is locked"). They
write no log lines of their own. Django's ``task_started``/``task_finished`` signals are sent as a
worker sends them (Django logs them). The worker's bookkeeping is left out: no ``Failure`` rows,
no throughput counts, no lease renewal (a task that runs longer than its ``ttr`` loses its lease
and runs again, as it would under a worker that stopped beating).

Time that code under test waits for on the database's clock (a ``run_after``, a retry's
backoff, a tube task's delay, ttl or ttr, a job's claim, a lock's expiry) need not pass:
:func:`advance_clock` moves this process's view of that clock forward, and
:func:`reset_clock` (or the block of :func:`controlled_clock`) puts it back.

pytest users: ``pytest_plugins = ["django_taskloop.pytest_plugin"]`` in ``conftest.py`` adds the
fixtures ``taskloop_run_queued``, ``taskloop_immediate`` and ``taskloop_clock``.
"""

from __future__ import annotations

import os
import socket
import threading
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connections, router, transaction
from django.test import TestCase, override_settings
from django.utils.module_loading import import_string

from . import engine
from .backends import (
    TaskloopBackend,
    result_id_of,
    task_handlers,
    task_path_of,
    taskloop_backend,
    taskloop_backends,
)
from .compat import TASKS_AVAILABLE, DjangoTask, DjangoTaskResult, TaskResultDoesNotExist
from .exceptions import TaskloopError
from .models import Task as TubeTask
from .models import TaskRecord, Tube
from .task_options import TaskloopTask
from .validation import check_count
from .workers import FailedForGood, Handler
from .workers.drivers import TubeDriver

__all__ = [
    "ImmediateBackend",
    "RunawayTasks",
    "Ran",
    "LIMIT",
    "run_queued",
    "commit_and_run_queued",
    "immediate",
    "Clock",
    "advance_clock",
    "reset_clock",
    "controlled_clock",
]

#: Most tasks one :func:`run_queued` (or one enqueue in immediate mode) runs before it stops
#: with :class:`RunawayTasks`: more is a task that enqueues itself, as a rule.
LIMIT = 1000

#: The consumer the helpers take tube tasks as (one per process; a test runs in one thread).
CONSUMER = f"{socket.gethostname()}:{os.getpid()}:testing"


class RunawayTasks(TaskloopError):
    """Tasks kept coming after ``limit`` runs: a task that enqueues itself, or its twin."""


@dataclass
class Ran:
    """How many tasks :func:`commit_and_run_queued` ran (set when its block ends)."""

    count: int = 0


#: The drain running in this thread, if any: an enqueue in immediate mode made by a task it
#: runs joins it (the task runs after the one running now, not inside it).
_local = threading.local()


def run_queued(
    queue_name: str | None = None,
    backend: str = "default",
    include_delayed: bool = False,
    limit: int = LIMIT,
) -> int:
    """Run the Django Tasks queued in ``backend``'s queues (or its queue ``queue_name``) now,
    in this thread and transaction, and return how many ran (each attempt counts).

    It goes on until nothing is ready: what the tasks enqueue runs too, and so does a failed
    attempt's retry whose ``backoff`` is 0. A task delayed by ``run_after`` or by a retry's
    backoff waits, as it would for a worker, unless ``include_delayed``: then it runs now (a
    retry's backoff is skipped too, until its ``max_attempts`` are spent). Paused queues and
    keys held by a running task are honoured as a worker honours them. More than ``limit``
    runs raise :class:`RunawayTasks`, with the rest left queued.
    """
    queues = _queues(queue_name, backend, include_delayed, limit)
    if getattr(_local, "drain", None) is not None:
        raise TaskloopError("run_queued() was called from a task that run_queued() is running")
    return _Drain(queues, include_delayed, limit).run()


def _queues(queue_name: str | None, backend: str, include_delayed: bool, limit: int) -> set[str]:
    """Check :func:`run_queued`'s arguments; return the names of the queues to run."""
    check_count(limit, "limit", minimum=1)
    if not isinstance(include_delayed, bool):
        raise TypeError(f"include_delayed must be a bool, not {type(include_delayed).__name__}")
    chosen = taskloop_backend(backend)
    if queue_name is None:
        return set(chosen.queues)
    if queue_name not in chosen.queues:
        raise ValueError(
            f"queue_name {queue_name!r} is not one of TASKS[{backend!r}]['QUEUES'] "
            f"({', '.join(sorted(chosen.queues))})"
        )
    return {queue_name}


@contextmanager
def commit_and_run_queued(
    queue_name: str | None = None,
    backend: str = "default",
    include_delayed: bool = False,
    limit: int = LIMIT,
    using: str = "default",
) -> Iterator[Ran]:
    """Run the block, then what a commit would run (its ``on_commit`` callbacks, where
    ``enqueue_on_commit`` tasks are written), then :func:`run_queued`; the :class:`Ran` it
    yields holds how many tasks ran once the block ends.

    Inside a ``TestCase`` (whose transaction never commits) this is the request that commits
    and the worker that runs what it queued, in one ``with``.
    """
    _queues(queue_name, backend, include_delayed, limit)  # a bad argument: before the block runs
    ran = Ran()
    with TestCase.captureOnCommitCallbacks(using=using, execute=True):
        yield ran
    ran.count = run_queued(queue_name, backend, include_delayed, limit)


def immediate(*aliases: str) -> override_settings:
    """Return ``override_settings`` that turns ``TASKS[alias]`` (each ``TaskloopBackend`` of
    ``TASKS`` if none is named) into an :class:`ImmediateBackend` with the same queues and
    options: a decorator for a test or a ``TestCase``, or a context manager."""
    tasks: dict[str, Any] = {alias: dict(config) for alias, config in getattr(settings, "TASKS", {}).items()}
    chosen = list(aliases) or [alias for alias, config in tasks.items() if _is_taskloop(config)]
    if not chosen:
        raise ValueError("TASKS has no TaskloopBackend to run immediately")
    for alias in chosen:
        if alias not in tasks:
            raise ValueError(f"TASKS has no backend {alias!r}")
        if not _is_taskloop(tasks[alias]):
            raise ValueError(f"TASKS[{alias!r}] is a {tasks[alias].get('BACKEND')}, not a TaskloopBackend")
        tasks[alias]["BACKEND"] = f"{__name__}.ImmediateBackend"
    return override_settings(TASKS=tasks)


def _is_taskloop(config: dict[str, Any]) -> bool:
    """Whether a ``TASKS`` entry names a ``TaskloopBackend`` (or a subclass)."""
    try:
        backend = import_string(config.get("BACKEND", ""))
    except ImportError:
        return False
    return isinstance(backend, type) and TaskloopBackend is not None and issubclass(backend, TaskloopBackend)


def advance_clock(seconds: float) -> float:
    """Move this process's view of the database's clock ``seconds`` forward (more than 0, may
    be fractional; calls add up) and return how far it is ahead now.

    Every deadline of django-taskloop is written and compared by the database's clock; from
    now on each statement this process sends reads that clock plus the sum of the advances,
    so a delay, a ttl or ttr, a claim's or lock's expiry, a ``run_after`` or a retry's backoff
    ends without waiting for it. Rows written before the advance keep the times they were
    written with (they now look older), rows written after it are written on the moved clock.

    It moves **only this process's** clock: worker subprocesses, other hosts and the database
    itself (its defaults, its triggers) still read the real one, and a worker started as
    another process will not see the time pass. Nothing is slept; Python's own clocks
    (``time``, ``timezone.now()``) do not move either.

    It stays moved until :func:`reset_clock`: reset it after each test (the block of
    :func:`controlled_clock` or the pytest fixture ``taskloop_clock`` does), or every later
    test runs in the future.
    """
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise TypeError(f"seconds must be a number, not {type(seconds).__name__}")
    if not seconds > 0:
        raise ValueError(f"seconds must be more than 0, not {seconds!r}")
    engine.set_clock_offset(engine.clock_offset() + seconds)
    return engine.clock_offset()


def reset_clock() -> None:
    """Put this process's view of the database's clock back on the real clock (undo every
    :func:`advance_clock`)."""
    engine.set_clock_offset(0.0)


class Clock:
    """This process's view of the database's clock in a test (see :func:`controlled_clock`)."""

    def advance(self, seconds: float) -> float:
        """:func:`advance_clock`: move the clock ``seconds`` forward; return how far it is ahead."""
        return advance_clock(seconds)

    @property
    def offset(self) -> float:
        """How many seconds this process's database clock is ahead of the real one."""
        return engine.clock_offset()

    def reset(self) -> None:
        """:func:`reset_clock`: back on the real clock."""
        reset_clock()


@contextmanager
def controlled_clock() -> Iterator[Clock]:
    """Yield a :class:`Clock` whose ``advance(seconds)`` moves this process's view of the
    database's clock forward (see :func:`advance_clock`: worker subprocesses do not see it);
    the clock is back on the real one when the block ends, however it ends::

        with controlled_clock() as clock:
            tube.put("x", delay=60)
            clock.advance(61)
            assert tube.take(timeout=0) is not None
    """
    try:
        yield Clock()
    finally:
        reset_clock()


if TASKS_AVAILABLE:

    class ImmediateBackend(TaskloopBackend):
        """A ``TaskloopBackend`` that runs each task as it is enqueued, in the caller's thread
        and transaction, the way a worker runs it (every option holds).

        ``enqueue()`` writes the task as ``TaskloopBackend`` does, runs what is ready in the
        backend's queues (:func:`run_queued`) and returns the result as it then is:
        SUCCESSFUL, or FAILED after ``max_attempts``. A retry's ``backoff`` is not waited for:
        the attempts run one after the other (between them the result is READY with the
        errors so far, as in production). A task with ``run_after`` in the future is not run:
        it waits, READY, for ``run_queued(include_delayed=True)``. An ``enqueue_on_commit``
        task inside a transaction runs when that transaction commits (in a ``TestCase``:
        ``captureOnCommitCallbacks(execute=True)`` or :func:`commit_and_run_queued`). A task
        that a running task enqueues runs right after it, not inside it (as a worker would
        take it next), and its ``enqueue()`` returns it READY. ``retry()`` runs the task again
        at once too. ``OPTIONS["LIMIT"]`` (default
        :data:`LIMIT`): the most tasks one enqueue runs before :class:`RunawayTasks`.
        """

        def __init__(self, alias: str, params: dict[str, Any]) -> None:
            super().__init__(alias, params)
            try:
                #: OPTIONS["LIMIT"]: most tasks one enqueue runs (RunawayTasks beyond).
                self.limit = check_count(self.options.get("LIMIT", LIMIT), "LIMIT", minimum=1)
            except (TypeError, ValueError) as error:
                raise ImproperlyConfigured(f"TASKS[{alias!r}]['OPTIONS']: {error}") from None

        def enqueue(
            self, task: DjangoTask, args: Iterable[object], kwargs: Mapping[str, object]
        ) -> DjangoTaskResult:
            result = super().enqueue(task, args, kwargs)
            using = router.db_for_write(TaskRecord)
            if (
                isinstance(task, TaskloopTask)
                and task.enqueue_on_commit
                and connections[using].in_atomic_block
            ):
                # Written at commit (an on_commit callback of the enqueue): run it after that.
                transaction.on_commit(self.run_ready, using=using)
                return result
            if self.run_ready():
                return self.get_result(result.id)
            return result

        def retry(self, result_id: str) -> DjangoTaskResult:
            """Run the FAILED task ``result_id`` once more, now (see ``TaskloopBackend.retry``);
            return its result as it then is."""
            result = super().retry(result_id)
            return self.get_result(result.id) if self.run_ready() else result

        def run_ready(self) -> bool:
            """Run what is ready in this backend's queues; return False if a drain running in
            this thread (a task enqueued this one) will run it instead, after its task."""
            active: _Drain | None = getattr(_local, "drain", None)
            if active is not None:
                active.add(self.queues)
                return False
            _Drain(set(self.queues), include_delayed=False, limit=self.limit).run()
            return True

else:  # pragma: no cover - neither django.tasks nor the backport is installed
    ImmediateBackend = None  # type: ignore[assignment,misc]


class _Drain:
    """Take, run and settle the ready tube tasks of some queues, one at a time, as a worker's
    :class:`~django_taskloop.workers.drivers.TubeDriver` does, until none is ready."""

    def __init__(self, queues: Iterable[str], include_delayed: bool, limit: int) -> None:
        self.handlers: list[Handler] = []
        self.drivers: dict[str, TubeDriver] = {}
        self.include_delayed = include_delayed
        self.limit = limit
        self.ran: Counter[str] = Counter()
        # Queues of the ImmediateBackends in TASKS: a retry of their tasks runs at once.
        self.immediate = {
            queue
            for backend in taskloop_backends()
            if ImmediateBackend is not None and isinstance(backend, ImmediateBackend)
            for queue in backend.queues
        }
        self.add(queues)

    def add(self, queues: Iterable[str]) -> None:
        """Drain ``queues`` too (their plain and keyed tubes)."""
        queues = set(queues)
        known = {handler.name for handler in self.handlers}
        for handler in task_handlers():
            if handler.queue in queues and handler.name not in known:
                self.handlers.append(handler)
                known.add(handler.name)

    def run(self) -> int:
        """Run until nothing is ready (with ``include_delayed``: nor delayed); return how many
        ran. Meanwhile an enqueue in immediate mode in this thread joins this drain."""
        _local.drain = self
        try:
            while True:
                if self.run_one():
                    continue
                if not (self.include_delayed and self.promote()):
                    return sum(self.ran.values())
        finally:
            _local.drain = None

    def driver(self, handler: Handler) -> TubeDriver | None:
        """Return the driver of ``handler``'s tube, or ``None`` while the tube does not exist
        (nothing was ever put there: looked up again next time)."""
        driver = self.drivers.get(handler.name)
        if driver is None:
            tube = Tube.objects.filter(name=handler.target).first()
            if tube is None:
                return None
            driver = TubeDriver(handler, CONSUMER)
            driver.tube = tube
            # Tests see the exact order (priorities, retries at once): every claim from the head.
            driver.cursor = None
            self.drivers[handler.name] = driver
        return driver

    def run_one(self) -> bool:
        """Take one ready tube task (the first tube that has one), run it and settle it;
        return False if no tube had one."""
        for handler in list(self.handlers):
            driver = self.driver(handler)
            if driver is None:
                continue
            taken = driver.claim(1)
            if not taken:
                continue
            (item,) = taken
            if sum(self.ran.values()) >= self.limit:
                driver.give_back([item])
                raise self.runaway()
            self.ran[self.path_of(item)] += 1
            self.settle(driver, item, self.call(driver, item))
            return True
        return False

    def call(self, driver: TubeDriver, item: TubeTask) -> FailedForGood | None:
        """Run the handler on ``item`` as the worker does; return the :class:`FailedForGood`
        it raised (a task that failed: recorded, to be settled like a success).

        Inside a transaction the handler runs in a savepoint: a database error that it does
        not survive (on PostgreSQL it aborts the transaction) is rolled back to there, the
        tube task is given back and the error raised, with the test's transaction usable.
        """
        inside = connections[driver.using].in_atomic_block
        savepoint: AbstractContextManager[object] = (
            transaction.atomic(using=driver.using) if inside else nullcontext()
        )
        try:
            with savepoint:
                try:
                    driver.call(item)
                except FailedForGood as failed:
                    return failed
        except Exception as error:
            driver.give_back([item])
            error.add_note(
                f"django_taskloop.testing: running {self.path_of(item)} (result "
                f"{result_id_of(item)}) raised this outside the task's own code; its tube task "
                "was given back"
            )
            raise
        return None

    def settle(self, driver: TubeDriver, item: TubeTask, failed: FailedForGood | None) -> None:
        """Acknowledge ``item`` (finished, or failed for good: the worker settles both so);
        a retry of an immediate-mode task is made ready at once."""
        driver.done([item])
        if failed is not None and driver.handler.queue in self.immediate:
            self.promote(result_id_of(item))

    def promote(self, result_id: str | None = None) -> int:
        """Make the delayed tube tasks of the drained queues (those of ``result_id`` only, if
        given) ready now; return how many. Through public verbs: bury, then kick_task."""
        promoted = 0
        for handler in self.handlers:
            driver = self.driver(handler)
            if driver is None:
                continue
            tube = driver.tube
            for task in TubeTask.objects.filter(tube_id=tube.pk).delayed().in_claim_order():
                if result_id is None or result_id_of(task) == result_id:
                    tube.bury(task.id)
                    tube.kick_task(task.id)
                    promoted += 1
        return promoted

    def path_of(self, item: TubeTask) -> str:
        """Name the Django Task a tube task carries: its dotted path."""
        path = task_path_of(item)
        if path is not None:
            return path
        result_id = str(result_id_of(item))
        for backend in taskloop_backends():
            try:
                return str(backend.get_result(result_id).task.module_path)
            except TaskResultDoesNotExist:  # not this backend's result: the next one's
                continue
        return f"result {result_id}"

    def runaway(self) -> RunawayTasks:
        most = ", ".join(f"{path} ×{count}" for path, count in self.ran.most_common(3))
        return RunawayTasks(
            f"ran {self.limit} tasks and more are ready (most run: {most}): a task that "
            "enqueues itself? The rest is left queued; pass limit= to allow more"
        )
