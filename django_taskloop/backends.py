"""A Django Tasks backend whose tasks wait in tubes and run in ``manage.py workers``.

    TASKS = {"default": {"BACKEND": "django_taskloop.backends.TaskloopBackend", "QUEUES": ["default"]}}

Each queue name is a ``fifottl`` tube named ``tasks.<queue_name>`` (created on first use);
Django's priority orders the tube (``pri = 100 - priority``: higher runs sooner) and
``run_after`` becomes the put's ``delay``, measured on the database's clock. The result lives
in a :class:`~django_taskloop.models.TaskRecord` row. Works with Django 6's ``django.tasks``
and with the ``django-tasks`` backport (``django_tasks``) on Django 5.2.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
import secrets
import socket
from functools import cache, partial
from traceback import format_exception
from typing import Any, NoReturn

from django.apps import apps
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, connections, router, transaction
from django.db.models import Manager
from django.utils.module_loading import import_string

from . import engine, shards
from .compat import (
    TASKS_AVAILABLE,
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    normalize_json,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from .exceptions import NotFound
from .models import Task as TubeTask
from .models import TaskRecord, TaskRecordStatus, Tube
from .models.tubes import DELAYED, READY
from .runtime import FailedForGood, StopNow, backoff, run_interruptibly
from .task_calls import (
    KEYED_TUBE_PREFIX,
    TUBE_PREFIX,
    called_record,
    carrier,
    keyed_tube_name,
    record_of,
    result_id_of,
    short_result_id,
    task_path_of,
    tube_name,
    waiting_record,
    waiting_results,
)
from .task_options import TaskloopTask, check_ttr, function_path, task_key
from .validation import check_handler, check_name, check_seconds
from .workers import Handler

__all__ = [
    "TaskloopBackend",
    "TUBE_PREFIX",
    "KEYED_TUBE_PREFIX",
    "tube_name",
    "keyed_tube_name",
    "task_handlers",
    "taskloop_backend",
    "taskloop_backends",
    "result_id_of",
    "task_path_of",
    "waiting_results",
    "short_result_id",
]

logger = logging.getLogger("django_taskloop.tasks")

#: The manager of one database's task records (what the worker's steps pass each other).
Records = Manager[TaskRecord]


if TASKS_AVAILABLE:

    class TaskloopBackend(BaseTaskBackend):
        """Enqueue Django Tasks into tubes; ``manage.py workers`` runs them."""

        supports_defer = True
        supports_async_task = True
        supports_get_result = True
        supports_priority = True

        #: ``@task(max_attempts=…, backoff=…, ttl=…, ttr=…, key=…, unique=…, enqueue_on_commit=…)``
        task_class = TaskloopTask

        def _refuse_if_not_installed(self) -> None:
            # Django 6 checks backends only once django.tasks is imported: fail clearly at use too.
            if (error := self._not_installed()) is not None:
                raise ImproperlyConfigured(f"{error.msg} {error.hint}")

        def _not_installed(self) -> Any:
            if apps.is_installed("django_taskloop"):
                return None
            return checks.Error(
                f"TASKS[{self.alias!r}] uses TaskloopBackend, but 'django_taskloop' is not in "
                "INSTALLED_APPS.",
                hint="Add 'django_taskloop' to INSTALLED_APPS and run migrate: the backend keeps "
                "its tasks and results in django_taskloop's tables.",
                id="taskloop.E003",
            )

        def check(self, **kwargs: Any) -> Any:
            """taskloop.E003: the backend's models and workers need ``django_taskloop`` installed;
            taskloop.E004: ``OPTIONS["DATABASES"]`` names the shards, aliases of ``DATABASES``."""
            yield from super().check(**kwargs)
            if (error := self._not_installed()) is not None:
                yield error
            try:
                _ = self.databases
            except (TypeError, ValueError) as problem:
                yield checks.Error(f"TASKS[{self.alias!r}]: {problem}", id="taskloop.E004")

        @property
        def databases(self) -> list[str] | None:
            """The shards of this backend's queues (``OPTIONS["DATABASES"]``), or ``None``."""
            return shards.backend_databases(self.options.get("DATABASES"))

        def _db(self, result_id: Any) -> str:  # the shard that holds it (its id says which)
            return shards.database_of(self.databases, TaskRecord, result_id)

        def validate_task(self, task: Any) -> None:
            super().validate_task(task)
            # Checked once per queue name and function (enqueue validates every call).
            if (task.queue_name, task.func) in _valid:
                return
            # The queue name becomes part of a tube name: check it here, at definition time.
            try:
                check_name(tube_name(task.queue_name), "queue_name")
                # A generator function would return an iterator unrun: refused here, not
                # recorded SUCCESSFUL by a worker that never ran its body.
                check_handler(task.func, "task function")
            except (TypeError, ValueError) as error:
                raise InvalidTask(str(error)) from None
            _valid.add((task.queue_name, task.func))

        def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
            """Put the call in its queue's tube and return its ``TaskResult`` (READY).

            One INSERT: the tube task carries the call (path, arguments, options) and the
            result reads from it until a worker starts the task, which writes the result's
            :class:`~django_taskloop.models.TaskRecord` (its id is ``"<tube task id>-<secret>"``).
            Two rows, all or nothing, only where the result must exist before the put: a
            ``unique`` task (its twin is found among the results) and an
            ``enqueue_on_commit`` task enqueued inside a transaction (its id is known now,
            its rows are written at commit). ``run_after`` is the task's "not before" on the
            database's clock, as a put's delay would be.
            """
            self._refuse_if_not_installed()
            self.validate_task(task)
            call: dict[str, Any] = {
                "task": task.module_path,
                "args": normalize_json(list(args)),
                "kwargs": normalize_json(dict(kwargs)),
                "backend": self.alias,
                "queue": task.queue_name,
            }
            # Sharded: a key's (or a unique call's) shard, else the next in turn; the id says which.
            databases = self.databases  # (unsharded: no key to work out on this hot path)
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
            # (As _to_result(waiting_record(queued, call)) reads it, without a model instance.)
            result = _task_result(
                task,
                self.alias,
                id=f"{queued.pk}-{call['id']}",
                status="READY",
                enqueued_at=queued.created,
                args=call["args"],
                kwargs=call["kwargs"],
            )
            self._announce(result, using)
            return result

        def _announce(self, result: Any, using: str) -> None:
            """Send ``task_enqueued`` for ``result`` when its rows are committed (at once outside
            a transaction, as on_commit would, less its cost on the hot path)."""
            if connections[using].in_atomic_block:
                transaction.on_commit(lambda: task_enqueued.send(type(self), task_result=result), using=using)
            else:
                task_enqueued.send(type(self), task_result=result)

        def _put(self, call: dict[str, Any], task: Any, using: str, key: str | None) -> TubeTask:
            """Put ``call`` in its queue's tube (its keyed tube for a key); return the tube task."""
            for attempt in range(2):
                tube = _tube(using, task.queue_name, fresh=attempt > 0, keyed=key is not None)
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

        def _enqueue_with_options(self, task: Any, using: str, call: dict[str, Any]) -> Any:
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
            data: dict[str, Any] = {"result": record.id, "task": call["task"]}
            if options:
                data["options"] = options
            unique_on = task.unique_on

            def enqueue_now() -> Any:
                # Enqueued now (at the caller's commit, for enqueue_on_commit).
                record.enqueued_at = engine.DbNow()
                return self._insert_with_options(record, task, using, data, key, unique_on)

            if task.enqueue_on_commit and shards.in_transaction(using, TaskRecord):
                # The record's id is known now; the rows are written when the caller commits
                # (the caller's database: a shard's transaction is not the caller's).
                record.enqueued_at = None
                result = self._to_result(record, task)
                home = using if connections[using].in_atomic_block else router.db_for_write(TaskRecord)
                transaction.on_commit(enqueue_now, using=home)
                return result
            return enqueue_now()

        def _insert_with_options(
            self, record: Any, task: Any, using: str, data: Any, key: str | None, unique_on: str | None
        ) -> Any:
            """INSERT the record and its tube task (or find the waiting twin); return the result."""

            def work(tube: Tube) -> Any:
                if unique_on is not None:
                    twin = self._waiting_twin(tube, record, key, unique_on, using)
                    if twin is not None:
                        return twin
                engine.insert([record], using, returning=["enqueued_at"])
                # checked: the options were checked by task_options and enqueue() above.
                tube.put(
                    data, 100 - task.priority, ttr=task.ttr, utube=key, run_at=task.run_after, checked=True
                )
                return None

            for attempt in range(2):
                tube = _tube(using, task.queue_name, fresh=attempt > 0, keyed=key is not None)
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
                return self._to_result(twin, task)
            result = self._to_result(record, task)
            self._announce(result, using)
            return result

        def _waiting_twin(self, tube: Any, record: Any, key: str | None, unique_on: str, using: str) -> Any:
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
                    task.data["result"]
                    for task in calls
                    if isinstance(task.data, dict) and "result" in task.data
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
                twin is None or twin.enqueued_at is None or one_row.enqueued_at < twin.enqueued_at
            ):
                return one_row
            return twin

        def _waiting_call(self, queued: TubeTask, path: str) -> Any:
            """Return the record of ``queued``, a one-row enqueue of this backend's task ``path``,
            as it reads until a worker starts it (None: ``queued`` is not one)."""
            call = queued.data
            if (
                not isinstance(call, dict)
                or "result" in call
                or "id" not in call
                or (call.get("task"), call.get("backend")) != (path, self.alias)
            ):
                return None
            record = waiting_record(queued, call)
            record._state.db = queued._state.db
            return record

        def get_result(self, result_id: str) -> Any:
            """Return the ``TaskResult`` of ``result_id`` as it is now.

            A task past its ``ttl`` reads FAILED (``TaskExpired``) at once, as the worker that
            reaches it will record it (:meth:`TaskRecord.expiry`), not READY until then.
            """
            record = self._record(result_id)
            if record is None:
                raise TaskResultDoesNotExist(result_id)
            expired = None
            if record.ttl_deadline() is not None:
                expired = record.expiry(engine.db_now(record._state.db or "default"))
            return self._to_result(record, expired=expired)

        def _record(self, result_id: Any) -> TaskRecord | None:
            """Return ``result_id``'s record; one no worker started yet is read off its tube task."""
            records = TaskRecord.objects.using(self._db(result_id)).filter(backend=self.alias)
            try:
                record = records.filter(pk=result_id).first()
            except (ValueError, TypeError):
                return None
            if record is not None:
                return record
            waiting = self._waiting_record(str(result_id))
            # Neither: a worker may have started it (and acknowledged its tube task) between
            # the two reads; its record is there now.
            return waiting if waiting is not None else records.filter(pk=result_id).first()

        def _waiting_record(self, result_id: str) -> TaskRecord | None:
            """The record of a one-row enqueue that no worker has started, read off its tube task."""
            using = self._db(result_id)
            queued = carrier(result_id, using)
            call: Any = queued.data if queued is not None else None
            if queued is None or call.get("backend") != self.alias:
                return None
            record = waiting_record(queued, call)
            record._state.db = using
            return record

        def _to_result(self, record: Any, task: Any = None, expired: BaseException | None = None) -> Any:
            """Return ``record`` as a ``TaskResult``; ``expired``: it is past its ttl (FAILED)."""
            if task is None:
                try:
                    task = self._stored_task(record)
                except (ImportError, TypeError):
                    # The code changed since the task was enqueued: the result still reads,
                    # with a stand-in that refuses to run.
                    task = _stand_in(record, self.alias)
            status, finished_at, errors = record.status, record.finished_at, record.errors
            if expired is not None:
                # What the worker will record when it reaches the task (see execute).
                status, finished_at = "FAILED", record.ttl_deadline()
                errors = [*errors, _error_entry(expired)]
            return _task_result(
                task,
                self.alias,
                id=record.id,
                status=status,
                enqueued_at=record.enqueued_at,
                started_at=record.started_at,
                finished_at=finished_at,
                last_attempted_at=record.last_attempted_at,
                args=record.args,
                kwargs=record.kwargs,
                errors=[TaskError(**error) for error in errors],
                worker_ids=list(record.worker_ids),
                return_value=record.return_value,
            )

        def execute(self, result_id: str, worker_id: str, queued: Any = None) -> None:
            """Run the task ``result_id`` and record how it ended (called by the worker).

            Whatever the task raises — ``SystemExit`` and ``KeyboardInterrupt`` included — ends
            it FAILED with that exception's class and traceback, and the worker carries on;
            so does a stored path that no longer names a Task (the callable is never called).
            Only a hard stop of the worker interrupts it: then it is READY again and its tube
            task goes back to run later (Django Tasks have no retry of their own, so FAILED
            would lose work that merely met a deploy). Raises :class:`FailedForGood` after
            recording a failure, so that the worker counts it as failed, not done.

            ``queued`` is the tube task that brought the call (its data carries the options of
            :mod:`.task_options`): a task with ``max_attempts`` left is READY again and put back
            after its backoff (a new tube task, the same record: its ``errors`` list every
            attempt); one with a ``ttl`` that was not started in time ends FAILED with
            :class:`~django_taskloop.exceptions.TaskExpired` and is never called.
            """
            using = queued._state.db if queued is not None else self._db(result_id)
            manager = TaskRecord.objects.db_manager(using)
            if queued is None:
                # Called with the result id alone: a task no worker has started is read off
                # the tube task that carries its call.
                queued = carrier(result_id, using)
            data = getattr(queued, "data", None)
            options: dict[str, Any] = data.get("options", {}) if isinstance(data, dict) else {}
            record = self._start(manager, result_id, worker_id, options, using, queued)
            if record is None:
                return
            task = self._runnable(manager, record)
            result = self._to_result(record, task)
            task_started.send(type(self), task_result=result)
            try:
                value = normalize_json(self._call(task, record, result))
            except StopNow:
                # A hard stop of the worker: the task runs again (its tube task is given back).
                manager.filter(pk=result_id, status=TaskRecordStatus.RUNNING).update(
                    status=TaskRecordStatus.READY
                )
                raise
            except BaseException as error:  # SystemExit and KeyboardInterrupt end the task too
                self._failed(manager, record, task, options, queued, error, using)
            self._finish(manager, record, TaskRecordStatus.SUCCESSFUL, value, None)

        def _start(
            self,
            manager: Records,
            result_id: str,
            worker_id: str,
            options: dict[str, Any],
            using: str,
            queued: Any = None,
        ) -> TaskRecord | None:
            """Mark the record RUNNING for this attempt and return it; ``None`` if it finished
            already (or another worker started it). A record past its ttl ends FAILED here
            (:class:`FailedForGood`). The first start of a one-row enqueue writes the record
            from what ``queued`` carries."""
            expired: list[BaseException] = []
            # A plain read first: a locking read of a missing key would lock the gap it falls
            # in (InnoDB), and two workers starting new records would deadlock on it.
            fresh = not manager.filter(pk=result_id).exists()

            def start() -> TaskRecord | None:
                # (Built anew on each try: a retried transaction starts from scratch.)
                record = called_record(queued, result_id) if fresh else None
                if not fresh:
                    record = manager.select_for_update().filter(pk=result_id).first()
                if record is None or record.status in (TaskRecordStatus.SUCCESSFUL, TaskRecordStatus.FAILED):
                    # Finished already: the worker that ran it died before acknowledging.
                    return None
                now = engine.db_now(using)
                # The ttl counts from the enqueue, or from run_after (a delay extends it, as in
                # the tube), on the database's clock like every deadline: TaskRecord.expiry,
                # which get_result() reads too. (The option in the data: records stored
                # before TaskRecord.ttl existed.)
                error = record.expiry(now, ttl=options.get("ttl"))
                if error is not None:
                    expired.append(error)
                else:
                    record.status = TaskRecordStatus.RUNNING
                    record.started_at = record.started_at or now
                    record.last_attempted_at = now
                    record.worker_ids = [*record.worker_ids, worker_id]
                if fresh:
                    record.save(using=using, force_insert=True)
                elif not expired:
                    record.save(update_fields=["status", "started_at", "last_attempted_at", "worker_ids"])
                return record

            try:
                record = engine.run_in_transaction(TaskRecord, using, start)
            except IntegrityError:
                if not fresh:
                    raise
                return None  # another worker wrote the record first: it runs the task
            if record is not None and expired:
                # It ended at its deadline, as get_result() has said since then.
                deadline = record.ttl_deadline(options.get("ttl"))
                self._finish(manager, record, TaskRecordStatus.FAILED, None, expired[0], finished_at=deadline)
                raise FailedForGood(f"task {record.id} ({record.task_path}) expired") from expired[0]
            return record

        def _runnable(self, manager: Records, record: TaskRecord) -> Any:
            """Return the Task ``record`` names; one that no longer imports ends FAILED."""
            try:
                return self._stored_task(record)
            except (ImportError, TypeError) as error:
                # The path no longer names a Task: nothing can run, and nothing will later.
                self._finish(manager, record, TaskRecordStatus.FAILED, None, error)
                raise FailedForGood(f"task {record.id}: {record.task_path} is not a Task") from error

        def _call(self, task: Any, record: TaskRecord, result: Any) -> Any:
            """Call the task's function with the record's arguments; return what it returned."""
            # An async def task's coroutine is awaited on the worker's event loop in this
            # thread (run_interruptibly), where a hard stop can interrupt and cancel it;
            # Task.call's async_to_sync would run it in a thread of its own, out of reach.
            call = task.func if inspect.iscoroutinefunction(task.func) else task.call
            if task.takes_context:
                return run_interruptibly(call, TaskContext(task_result=result), *record.args, **record.kwargs)
            return run_interruptibly(call, *record.args, **record.kwargs)

        def _failed(
            self,
            manager: Records,
            record: TaskRecord,
            task: Any,
            options: dict[str, Any],
            queued: Any,
            error: BaseException,
            using: str,
        ) -> NoReturn:
            """Put a failed attempt back after its backoff, or end the task FAILED; raise
            :class:`FailedForGood` either way (called while ``error`` is being handled)."""
            attempt = len(record.worker_ids)
            # What the enqueue asked (``using(max_attempts=1)`` included), never the definition's:
            # a call enqueued without options asked for one attempt.
            most = int(options.get("max_attempts", 1))
            if queued is not None:
                # The runner numbers the Failure row by its item's attempts: this record's
                # attempt, not the take count of this attempt's own tube task.
                queued.attempts = attempt
            if attempt < most:
                delay = self._retry(manager, record, task, options, attempt, error, using)
                raise FailedForGood(
                    f"task {record.id} ({record.task_path}) failed (attempt {attempt} of {most}), "
                    f"retrying in {delay:g} s"
                ) from error
            # task_finished is sent inside the caller's except block: its receivers log with
            # logger.exception(), which needs the exception being handled.
            self._finish(manager, record, TaskRecordStatus.FAILED, None, error)
            suffix = f" (attempt {attempt} of {most})" if most > 1 else ""
            raise FailedForGood(f"task {record.id} ({record.task_path}) failed{suffix}") from error

        def _retry(
            self,
            manager: Any,
            record: Any,
            task: Any,
            options: dict[str, Any],
            attempt: int,
            error: BaseException,
            using: str,
        ) -> float:
            """Make ``record`` READY again with ``error`` kept, and put it back after its backoff.

            One transaction: the record and a new tube task (``put`` with ``delay``) in its
            queue's tube (its key's sub-queue for a keyed task). Returns the delay.
            """
            if "backoff_path" in options:
                delay = (
                    check_seconds(
                        import_string(options["backoff_path"])(attempt), "backoff(attempt)", non_negative=True
                    )
                    or 0.0
                )
            elif "backoff" in options:
                delay = backoff(attempt) if options["backoff"] is None else float(options["backoff"])
            elif isinstance(task, TaskloopTask):
                delay = task.retry_delay(attempt)
            else:  # the definition lost its options since: the worker's backoff
                delay = backoff(attempt)
            errors = [*record.errors, _error_entry(error)]
            key = options.get("key")
            data: dict[str, Any] = {"result": record.id, "task": record.task_path}
            if options:
                data["options"] = options

            def work() -> None:
                manager.filter(pk=record.pk).update(status=TaskRecordStatus.READY, errors=errors)
                tube = _tube(using, record.queue_name, keyed=key is not None)
                tube.put(data, pri=100 - record.priority, ttr=options.get("ttr"), delay=delay, utube=key)

            engine.run_in_transaction(TaskRecord, using, work, lock_first=False)
            return delay

        def retry(self, result_id: str) -> Any:
            """Run the FAILED task ``result_id`` once more; return its ``TaskResult`` (READY).

            A new attempt of the same result, not a new result: its ``errors`` and
            ``worker_ids`` keep the attempts so far, its id stays the one callers hold. The
            task goes back to its queue (its key's sub-queue for a keyed task) at once, with
            no ``ttl`` (an operator asked for it now). One attempt only: if it fails again it
            is FAILED again, whatever ``max_attempts`` says. Raises
            ``TaskResultDoesNotExist`` for an unknown id and ``ValueError`` if the task is not
            FAILED or its path no longer names a Task.
            """
            using = self._db(result_id)
            manager = TaskRecord.objects.db_manager(using)

            def work() -> Any:
                record = manager.select_for_update().filter(pk=result_id, backend=self.alias).first()
                if record is None:
                    raise TaskResultDoesNotExist(result_id)
                if record.status != TaskRecordStatus.FAILED:
                    raise ValueError(f"only a FAILED task can be retried; {record.id} is {record.status}")
                try:
                    task = self._stored_task(record)
                except (ImportError, TypeError) as error:
                    raise ValueError(f"{record.task_path} no longer names a Task: {error}") from None
                key = task_key(task, record.args, record.kwargs) if isinstance(task, TaskloopTask) else None
                options: dict[str, Any] = {"key": key} if key is not None else {}
                ttr = getattr(task, "ttr", None)
                if ttr is not None:
                    options["ttr"] = ttr
                data: dict[str, Any] = {"result": record.id, "task": record.task_path}
                if options:
                    data["options"] = options
                manager.filter(pk=record.pk).update(
                    status=TaskRecordStatus.READY, finished_at=None, return_value=None, ttl=None
                )
                tube = _tube(using, record.queue_name, keyed=key is not None)
                tube.put(data, pri=100 - record.priority, ttr=ttr, utube=key)
                return record

            record = engine.run_in_transaction(TaskRecord, using, work)
            record.refresh_from_db()
            return self._to_result(record)

        def _stored_task(self, record: Any) -> Any:
            """Return the Task that ``record`` names (ImportError, or TypeError if not a Task)."""
            task = import_string(record.task_path)
            if not isinstance(task, Task):
                raise TypeError(f"{record.task_path} is a {type(task).__name__}, not a Task")
            task = task.using(priority=record.priority, queue_name=record.queue_name, backend=self.alias)
            if record.run_after is not None:
                task = task.using(run_after=record.run_after)
            return task

        def _finish(
            self,
            manager: Any,
            record: Any,
            status: str,
            value: Any,
            error: BaseException | None,
            finished_at: Any = None,
        ) -> None:
            """Record how the task ended (``finished_at``: default now) and send ``task_finished``."""
            errors = list(record.errors)
            if error is not None:
                errors.append(_error_entry(error))
            manager.filter(pk=record.pk).update(
                status=status,
                return_value=value,
                errors=errors,
                finished_at=finished_at if finished_at is not None else engine.DbNow(),
            )
            record.refresh_from_db()
            task_finished.send(type(self), task_result=self._to_result(record))

else:  # pragma: no cover - neither django.tasks nor the backport is installed
    # A class, or None without a framework (mypy sees the framework of its Python version).
    TaskloopBackend = None  # type: ignore[assignment,misc]


def _has_options(task: Any) -> bool:
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


def _call_options(task: Any, args: Any, kwargs: Any) -> tuple[str | None, dict[str, Any]]:
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
    options: dict[str, Any] = {}
    if task.max_attempts != 1:
        options["max_attempts"] = task.max_attempts  # absent: 1 (see _failed)
    options.update(_backoff_option(task))
    for name, value in (("ttl", task.ttl), ("ttr", task.ttr), ("key", key)):
        if value is not None:
            options[name] = value
    return key, options


def _backoff_option(task: Any) -> dict[str, Any]:
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


def _task_ttr(task: Any) -> float | None:
    return getattr(task, "ttr", None)


def _task_result(
    task: Any,
    backend: str,
    *,
    id: str,
    status: str,
    enqueued_at: Any,
    args: Any,
    kwargs: Any,
    started_at: Any = None,
    finished_at: Any = None,
    last_attempted_at: Any = None,
    errors: Any = (),
    worker_ids: Any = (),
    return_value: Any = None,
) -> Any:
    """Return a ``TaskResult`` of ``task`` holding ``return_value`` (the one place results are
    built: at enqueue, and from a record)."""
    result: TaskResult[Any] = TaskResult(
        task=task,
        id=id,
        status=TaskResultStatus[status],
        enqueued_at=enqueued_at,
        started_at=started_at,
        finished_at=finished_at,
        last_attempted_at=last_attempted_at,
        args=args,
        kwargs=kwargs,
        backend=backend,
        errors=list(errors),
        worker_ids=list(worker_ids),
    )
    object.__setattr__(result, "_return_value", return_value)
    return result


def _error_entry(error: BaseException) -> dict[str, str]:
    """Return ``error`` as one entry of ``TaskRecord.errors`` (Django's ``TaskError`` fields)."""
    kind = type(error)
    return {
        "exception_class_path": f"{kind.__module__}.{kind.__qualname__}",
        "traceback": "".join(format_exception(error)),
    }


def _stand_in(record: Any, backend: str) -> Any:
    """Return the Task that ``record``'s result reads with when its stored path no longer names
    one (see ``_to_result``): :func:`_missing`'s function, with the record's priority, queue and
    ``run_after``.

    Given only the fields this framework's ``Task`` has: Django 6.0 requires ``run_after``
    (no default), 6.1 and the django-tasks backport default it; none of them knows another
    field than these that a stand-in could fill in.
    """
    known = {
        "func": _missing(record.task_path),
        "priority": record.priority,
        "queue_name": record.queue_name,
        "backend": backend,
        "run_after": record.run_after,
    }
    fields = {field.name for field in dataclasses.fields(Task) if field.init}
    return Task(**{name: value for name, value in known.items() if name in fields})


@cache
def _missing(path: str) -> Any:
    """Return a stand-in for a stored task path that no longer imports (see ``_to_result``):
    named by that path (logs and ``TaskResult.task`` say which task it was), refusing to run.
    One per path: the backend's ``validate_task`` keeps each function it has checked."""

    def missing(*args: Any, **kwargs: Any) -> None:
        raise TypeError(f"{path} no longer names a Task")

    module, _, name = path.rpartition(".")
    missing.__module__, missing.__name__, missing.__qualname__ = module or __name__, name, name
    return missing


#: (queue name, function) pairs that validate_task has checked.
_valid: set[tuple[str, Any]] = set()

#: The tube of each queue, by (database alias, queue name): enqueue looks it up once per process.
_tubes: dict[tuple[str, str], Tube] = {}


def _tube(using: str, queue_name: str, fresh: bool = False, keyed: bool = False) -> Tube:
    """Return the tube that holds ``queue_name``'s tasks (``keyed``: its keyed tasks), made on
    first use."""
    key = (using, keyed_tube_name(queue_name) if keyed else queue_name)
    tube = _tubes.get(key)
    # No look here whether a cached tube is still there: the task's INSERT writes only if it
    # is (Tube.put), and a NotFound brings the caller back with fresh=True.
    if fresh or tube is None:
        tube = Tube.objects.db_manager(using).create_tube(
            *((keyed_tube_name(queue_name), "utubettl") if keyed else (tube_name(queue_name), "fifottl")),
            if_not_exists=True,
        )
        if connections[using].in_atomic_block:
            # Kept once the caller commits: a tube made in a transaction that rolls back is
            # gone, and SQLite gives its id to the next tube made (another queue's), where a
            # kept copy would put this queue's tasks.
            _tubes.pop(key, None)
            transaction.on_commit(partial(_tubes.__setitem__, key, tube), using=using)
        else:
            _tubes[key] = tube
    return tube


def taskloop_backends() -> list[TaskloopBackend]:
    """Return every ``TaskloopBackend`` of ``TASKS`` (none without a Tasks framework)."""
    if not TASKS_AVAILABLE:
        return []
    backends = [task_backends[alias] for alias in task_backends.settings]
    return [backend for backend in backends if isinstance(backend, TaskloopBackend)]


def taskloop_backend(alias: str) -> TaskloopBackend:
    """Return ``TASKS[alias]``, which must be a ``TaskloopBackend`` (``TypeError`` if not)."""
    backend = task_backends[alias]
    if not isinstance(backend, TaskloopBackend):
        raise TypeError(f"TASKS[{alias!r}] is a {type(backend).__name__}, not a TaskloopBackend")
    return backend


def task_handlers() -> list[Handler]:
    """Return a tube handler for every queue of every ``TaskloopBackend`` in ``TASKS``."""
    handlers = []
    for backend in taskloop_backends():
        for queue in sorted(backend.queues):
            for name, kind in ((tube_name(queue), "fifottl"), (keyed_tube_name(queue), "utubettl")):
                handlers.append(
                    Handler(
                        "tube",
                        name,
                        _run_stored,
                        name,
                        # At most 100 at once, as many as fit TASKLOOP["BATCH_TIME"] of the
                        # measured time per task: slow tasks go one at a time to idle workers.
                        batch=100,
                        lease=60,
                        create={"type": kind},
                        builtin=True,
                        queue=queue,
                        shards=tuple(backend.databases or ()),
                    )
                )
    return handlers


def _run_stored(task: TubeTask) -> None:
    """Run the Django Task a tube task points at (the tube handler of the backend's queues)."""
    data = task.data if isinstance(task.data, dict) else {}
    result_id = result_id_of(task)
    if result_id is None:
        logger.warning("tube task %s carries no Django task: dropped", task.pk)
        return
    alias = data.get("backend")
    if "result" in data:  # the record was written first: it names the backend
        alias = (
            TaskRecord.objects.using(task._state.db)
            .filter(pk=result_id)
            .values_list("backend", flat=True)
            .first()
        )
        if alias is None:
            logger.warning("Django task %s has no record any more: dropped", result_id)
            return
    taskloop_backend(str(alias)).execute(result_id, f"{socket.gethostname()}:{os.getpid()}", queued=task)
