"""The enqueue side of :class:`~django_taskloop.backends.TaskloopBackend`: what it checks of a
task, and how a call goes into its queue's tube (on its shard), with its options.

A plain call is one INSERT: the tube task carries the call and the result reads from it until a
worker starts the task. A ``unique`` call, or an ``enqueue_on_commit`` one inside a
transaction, writes its result's record first (two rows).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping
from datetime import datetime
from functools import partial
from typing import Any, TypeGuard, cast

from django.db import IntegrityError, connections, router, transaction
from django.utils.module_loading import import_string

from .. import engine, shards
from ..compat import DjangoTask, DjangoTaskResult, InvalidTask, normalize_json, task_enqueued
from ..exceptions import NotFound
from ..models import Task as TubeTask
from ..models import TaskRecord, TaskRecordStatus, Tube
from ..models.tubes import DELAYED, READY
from ..task_calls import keyed_tube_name, record_of, tube_name, waiting_record
from ..task_options import TaskloopTask, check_ttr, function_path, task_key
from ..validation import check_handler, check_name
from .queues import Backend, queue_tube
from .results import Results, task_result

__all__ = ["Enqueuer", "check_task"]

#: What a tube task carries (JSON): a call (path, arguments, options) or its record's id.
Call = dict[str, Any]


#: The types normalize_json gives back as they are (exactly these: a subclass may not be).
_SCALARS = frozenset({str, int, float, bool, type(None)})


class Enqueuer:
    """Put a backend's calls in their queues' tubes and return their results."""

    def __init__(self, backend: Backend, results: Results) -> None:
        self.backend = backend
        self.results = results

    def enqueue(
        self, task: DjangoTask, args: Iterable[object], kwargs: Mapping[str, object]
    ) -> DjangoTaskResult:
        """The put of ``TaskloopBackend.enqueue`` (``task`` checked already)."""
        args, kwargs = list(args), dict(kwargs)
        call: Call = {
            "task": task.module_path,
            # Arguments that are all plain values are their own normal form (no call per value).
            "args": args if _SCALARS.issuperset(map(type, args)) else normalize_json(args),
            "kwargs": kwargs if _SCALARS.issuperset(map(type, kwargs.values())) else normalize_json(kwargs),
            "backend": self.backend.alias,
            "queue": task.queue_name,
        }
        # Sharded: a key's (or a unique call's) shard, else the next in turn; the id says which.
        databases = self.backend.databases  # (unsharded: no key to work out on this hot path)
        using, mark = shards.shard_for(databases, TaskRecord, databases and shards.call_key(task, call))
        call["id"] = secrets.token_hex(6) + mark
        if task.run_after is not None:
            call["run_after"] = task.run_after.isoformat()
        if task.takes_context:
            call["context"] = True
        key = None
        if _has_options(task):
            if task.unique or (task.enqueue_on_commit and shards.in_transaction(using, TaskRecord)):
                return self._enqueue_with_options(task, using, call)
            key, options = _call_options(task, call["args"], call["kwargs"])
            if options:
                call["options"] = options
        queued = self._put(call, task, using, key)
        # (As to_result(waiting_record(queued, call)) reads it, without a model instance.)
        result = task_result(
            task,
            self.backend.alias,
            id=f"{queued.pk}-{call['id']}",
            status="READY",
            enqueued_at=queued.created,
            args=call["args"],
            kwargs=call["kwargs"],
        )
        self._announce(result, using)
        return result

    def _announce(self, result: DjangoTaskResult, using: str) -> None:
        """Send ``task_enqueued`` for ``result`` when its rows are committed (at once outside
        a transaction, as on_commit would, less its cost on the hot path)."""
        sender = type(self.backend)
        if connections[using].in_atomic_block:
            transaction.on_commit(lambda: task_enqueued.send(sender, task_result=result), using=using)
        else:
            task_enqueued.send(sender, task_result=result)

    def _put(self, call: Call, task: DjangoTask, using: str, key: str | None) -> TubeTask:
        """Put ``call`` in its queue's tube (its keyed tube for a key); return the tube task."""
        for attempt in range(2):
            tube = queue_tube(using, task.queue_name, fresh=attempt > 0, keyed=key is not None)
            try:
                # checked: Django's Task checked priority and run_after, normalize_json the
                # arguments, _call_options the options.
                return tube.put(
                    call,
                    100 - task.priority,
                    ttr=_task_ttr(task),
                    utube=key,
                    run_at=task.run_after,
                    checked=True,
                )
            except NotFound:
                # The queue's tube was dropped since this process looked it up: once more,
                # with a tube made afresh. The INSERT, which writes only if the tube is
                # there, wrote nothing, so even a caller's transaction goes on.
                if attempt:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _enqueue_with_options(self, task: TaskloopTask, using: str, call: Call) -> DjangoTaskResult:
        """Enqueue a ``unique`` task, or an ``enqueue_on_commit`` one inside a transaction:
        its result's record first, with the tube task pointing at it (two rows).

        The tube task's data carries what a worker needs at run time (``max_attempts``,
        ``ttl``, ``ttr``, ``key``, a numeric ``backoff``), so that ``using()`` for one call
        holds for its retries too; a callable ``backoff`` is read from the task's definition.
        """
        key, options = _call_options(task, call["args"], call["kwargs"])
        record = record_of(call, options, task.priority)
        _, mark, place = call["id"].rpartition("@")
        if mark:  # sharded: 96 random bits and the shard's mark fit the id's 32 characters
            record.id = f"{secrets.token_hex(12)}@{place}"
        data: Call = {"result": record.id, "task": call["task"]}
        if options:
            data["options"] = options
        unique_on = task.unique_on

        def enqueue_now() -> DjangoTaskResult:
            # Enqueued now (at the caller's commit, for enqueue_on_commit).
            record.enqueued_at = engine.DbNow()
            return self._insert_with_options(record, task, using, data, key, unique_on)

        if task.enqueue_on_commit and shards.in_transaction(using, TaskRecord):
            # The record's id is known now; the rows are written when the caller commits
            # (the caller's database: a shard's transaction is not the caller's).
            record.enqueued_at = None
            result = self.results.to_result(record, task)
            home = using if connections[using].in_atomic_block else router.db_for_write(TaskRecord)
            transaction.on_commit(enqueue_now, using=home)
            return result
        return enqueue_now()

    def _insert_with_options(
        self,
        record: TaskRecord,
        task: TaskloopTask,
        using: str,
        data: Call,
        key: str | None,
        unique_on: str | None,
    ) -> DjangoTaskResult:
        """INSERT the record and its tube task (or find the waiting twin); return the result."""

        def work(tube: Tube) -> TaskRecord | None:
            if unique_on is not None:
                twin = self._waiting_twin(tube, record, key, unique_on, using)
                if twin is not None:
                    return twin
            engine.insert([record], using, returning=["enqueued_at"])
            # checked: the options were checked by task_options and enqueue() above.
            tube.put(data, 100 - task.priority, ttr=task.ttr, utube=key, run_at=task.run_after, checked=True)
            return None

        for attempt in range(2):
            tube = queue_tube(using, task.queue_name, fresh=attempt > 0, keyed=key is not None)
            try:
                # unique: the look for a twin and the insert must be one step. SQLite's
                # write lock taken first serialises them; elsewhere _waiting_twin locks
                # the tube's row.
                twin = engine.run_in_transaction(
                    TaskRecord, using, partial(work, tube), lock_first=unique_on is not None
                )
                break
            except (IntegrityError, NotFound) as error:
                # The queue's tube was dropped since this process looked it up (see enqueue;
                # a NotFound rolled back to run_in_transaction's savepoint).
                if attempt or (isinstance(error, IntegrityError) and connections[using].in_atomic_block):
                    raise
                record.enqueued_at = engine.DbNow()
        if twin is not None:
            return self.results.to_result(twin, task)
        result = self.results.to_result(record, task)
        self._announce(result, using)
        return result

    def _waiting_twin(
        self, tube: Tube, record: TaskRecord, key: str | None, unique_on: str, using: str
    ) -> TaskRecord | None:
        """Return the oldest waiting (READY) record that ``record`` would duplicate, or None.

        A twin is a record, or a one-row enqueue that no worker has started (its call in its
        tube task: ``using(unique=False)`` enqueues one), read as :func:`_waiting` reads it.
        Locks the tube's row first, so that two enqueues of twins at once take turns (on
        SQLite the write lock that the transaction took first has done that already).
        """
        if not engine.features(using).write_lock_first:
            list(Tube.objects.using(using).select_for_update().filter(pk=tube.pk).values_list("pk"))
        waiting = TaskRecord.objects.using(using).filter(
            backend=record.backend,
            queue_name=record.queue_name,
            task_path=record.task_path,
            status=TaskRecordStatus.READY,
        )
        queued = TubeTask.objects.using(using).filter(state__in=[READY, DELAYED]).order_by("pk")
        if unique_on == "key":
            queued = queued.filter(tube_id=tube.pk, utube=key)
            calls = list(queued)
            ids = [
                task.data["result"] for task in calls if isinstance(task.data, dict) and "result" in task.data
            ]
            waiting = waiting.filter(pk__in=ids) if ids else waiting.none()
        else:
            waiting = waiting.filter(args=record.args, kwargs=record.kwargs)
            # The arguments are compared here, not in SQL (a JSON key's equality differs by
            # vendor): only the one-row calls of this task wait in its queue's tubes.
            queued = queued.filter(
                tube__name__in=[tube_name(record.queue_name), keyed_tube_name(record.queue_name)],
                data__task=record.task_path,
            ).exclude(data__has_key="result")
            calls = [
                task
                for task in queued
                if isinstance(task.data, dict)
                and task.data.get("args") == record.args
                and task.data.get("kwargs") == record.kwargs
            ]
        twin = waiting.order_by("enqueued_at", "pk").first()
        one_row = next(filter(None, (self._waiting_call(task, record.task_path) for task in calls)), None)
        if one_row is not None and (
            # (A one-row call's enqueue time is its tube task's, never None.)
            twin is None or twin.enqueued_at is None or cast(datetime, one_row.enqueued_at) < twin.enqueued_at
        ):
            return one_row
        return twin

    def _waiting_call(self, queued: TubeTask, path: str) -> TaskRecord | None:
        """Return the record of ``queued``, a one-row enqueue of this backend's task ``path``,
        as it reads until a worker starts it (None: ``queued`` is not one)."""
        call = queued.data
        if (
            not isinstance(call, dict)
            or "result" in call
            or "id" not in call
            or (call.get("task"), call.get("backend")) != (path, self.backend.alias)
        ):
            return None
        record = waiting_record(queued, call)
        record._state.db = queued._state.db
        return record


#: (queue name, function) pairs that check_task has checked.
#: (queue name, function) of every task checked already: enqueue validates every call.
CHECKED: set[tuple[str, object]] = set()


def check_task(task: DjangoTask) -> None:
    """What ``TaskloopBackend.validate_task`` adds to Django's checks: the queue name (part of a
    tube name) and the function. Checked once per queue name and function (enqueue validates
    every call)."""
    if (task.queue_name, task.func) in CHECKED:
        return
    # The queue name becomes part of a tube name: check it here, at definition time.
    try:
        check_name(tube_name(task.queue_name), "queue_name")
        # A generator function would return an iterator unrun: refused here, not
        # recorded SUCCESSFUL by a worker that never ran its body.
        check_handler(task.func, "task function")
    except (TypeError, ValueError) as error:
        raise InvalidTask(str(error)) from None
    CHECKED.add((task.queue_name, task.func))


def _has_options(task: DjangoTask) -> TypeGuard[TaskloopTask]:
    """Say whether ``task`` uses any django-taskloop option (a plain enqueue stays two INSERTs)."""
    return isinstance(task, TaskloopTask) and (
        task.max_attempts != 1
        or task.backoff is not None
        or task.ttl is not None
        or task.ttr is not None
        or task.key is not None
        or bool(task.unique)
        or task.enqueue_on_commit
    )


def _call_options(task: DjangoTask, args: object, kwargs: object) -> tuple[str | None, Call]:
    """Return the key of a call of ``task`` and the options its worker needs at run time
    (``max_attempts``, ``ttl``, ``ttr``, ``key``, a numeric ``backoff``): carried by the tube
    task, so that ``using()`` for one call holds for its retries too; a callable ``backoff`` is
    read from the task's definition."""
    if not isinstance(task, TaskloopTask):
        return None, {}
    key = task_key(task, args, kwargs)
    # (Checked again here: HEARTBEAT_INTERVAL may have changed since the definition.)
    check_ttr(task.ttr)
    if key is not None:
        check_name(keyed_tube_name(task.queue_name), "queue_name")
    options: Call = {}
    if task.max_attempts != 1:
        options["max_attempts"] = task.max_attempts  # absent: 1 (see TaskRunner's _failed)
    options.update(_backoff_option(task))
    for name, value in (("ttl", task.ttl), ("ttr", task.ttr), ("key", key)):
        if value is not None:
            options[name] = value
    return key, options


def _backoff_option(task: TaskloopTask) -> Call:
    """Return how the worker finds ``task``'s backoff: a number as is, ``None`` for the worker's
    own (given per call over a definition's), a function given per call by its path; nothing
    where the definition's holds (the worker reads it there)."""
    given = task.backoff
    if given is not None and not callable(given):
        return {"backoff": given}
    try:
        defined = getattr(import_string(task.module_path), "backoff", None)
    except ImportError:
        defined = object()  # no definition to fall back on
    if given is defined:
        return {}
    if given is None:
        return {"backoff": None}
    path = function_path(given)
    if path is None:  # (using() refuses these; a task_class of one's own might not)
        raise ValueError(f"backoff {given!r} cannot reach the worker: give a module-level function")
    return {"backoff_path": path}


def _task_ttr(task: DjangoTask) -> float | None:
    ttr: float | None = getattr(task, "ttr", None)
    return ttr
