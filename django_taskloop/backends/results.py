"""The results side of :class:`~django_taskloop.backends.TaskloopBackend`: a result read off its
:class:`~django_taskloop.models.TaskRecord` (or, until a worker starts it, off the tube task that
carries its call) as Django's ``TaskResult``, ``get_result()`` and ``retry()``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from datetime import datetime
from functools import cache
from traceback import format_exception
from typing import Any

from django.utils.module_loading import import_string

from .. import engine, shards
from ..compat import (
    DjangoTask,
    DjangoTaskResult,
    Task,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
)
from ..models import TaskRecord, TaskRecordStatus
from ..task_calls import carrier, waiting_record
from ..task_options import TaskloopTask, task_key
from .queues import Backend, queue_tube

__all__ = ["Results", "task_result", "error_entry"]


class Results:
    """Read a backend's results, and run a FAILED one again."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def database_of(self, result_id: object) -> str:
        """The shard that holds ``result_id`` (its id says which)."""
        return shards.database_of(self.backend.databases, TaskRecord, result_id)

    def get_result(self, result_id: str) -> DjangoTaskResult:
        """See ``TaskloopBackend.get_result``."""
        record = self.record(result_id)
        if record is None:
            raise TaskResultDoesNotExist(result_id)
        expired = None
        if record.ttl_deadline() is not None:
            expired = record.expiry(engine.db_now(record._state.db or "default"))
        return self.to_result(record, expired=expired)

    def record(self, result_id: str) -> TaskRecord | None:
        """Return ``result_id``'s record; one no worker started yet is read off its tube task."""
        records = TaskRecord.objects.using(self.database_of(result_id)).filter(backend=self.backend.alias)
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
        using = self.database_of(result_id)
        queued = carrier(result_id, using)
        # (carrier returns only a tube task whose data is a dict that carries a call.)
        if (
            queued is None
            or not isinstance(queued.data, dict)
            or queued.data.get("backend") != self.backend.alias
        ):
            return None
        record = waiting_record(queued, queued.data)
        record._state.db = using
        return record

    def to_result(
        self, record: TaskRecord, task: DjangoTask | None = None, expired: BaseException | None = None
    ) -> DjangoTaskResult:
        """Return ``record`` as a ``TaskResult``; ``expired``: it is past its ttl (FAILED)."""
        if task is None:
            try:
                task = self.stored_task(record)
            except (ImportError, TypeError):
                # The code changed since the task was enqueued: the result still reads,
                # with a stand-in that refuses to run.
                task = _stand_in(record, self.backend.alias)
        status, finished_at, errors = record.status, record.finished_at, record.errors
        if expired is not None:
            # What the worker will record when it reaches the task (see execute).
            status, finished_at = "FAILED", record.ttl_deadline()
            errors = [*errors, error_entry(expired)]
        return task_result(
            task,
            self.backend.alias,
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

    def retry(self, result_id: str) -> DjangoTaskResult:
        """See ``TaskloopBackend.retry``."""
        using = self.database_of(result_id)
        manager = TaskRecord.objects.db_manager(using)

        def work() -> TaskRecord:
            record = manager.select_for_update().filter(pk=result_id, backend=self.backend.alias).first()
            if record is None:
                raise TaskResultDoesNotExist(result_id)
            if record.status != TaskRecordStatus.FAILED:
                raise ValueError(f"only a FAILED task can be retried; {record.id} is {record.status}")
            try:
                task = self.stored_task(record)
            except (ImportError, TypeError) as error:
                raise ValueError(f"{record.task_path} no longer names a Task: {error}") from None
            key = task_key(task, record.args, record.kwargs) if isinstance(task, TaskloopTask) else None
            # One more attempt (max_attempts is not carried: 1), which its worker says is a retry.
            options: dict[str, object] = {"retried": True}
            if key is not None:
                options["key"] = key
            ttr = getattr(task, "ttr", None)
            if ttr is not None:
                options["ttr"] = ttr
            data: dict[str, object] = {"result": record.id, "task": record.task_path, "options": options}
            manager.filter(pk=record.pk).update(
                status=TaskRecordStatus.READY, finished_at=None, return_value=None, ttl=None
            )
            tube = queue_tube(using, record.queue_name, keyed=key is not None)
            tube.put(data, pri=100 - record.priority, ttr=ttr, utube=key)
            return record

        record = engine.run_in_transaction(TaskRecord, using, work)
        record.refresh_from_db()
        return self.to_result(record)

    def stored_task(self, record: TaskRecord) -> DjangoTask:
        """Return the Task that ``record`` names (ImportError, or TypeError if not a Task)."""
        task = import_string(record.task_path)
        if not isinstance(task, Task):
            raise TypeError(f"{record.task_path} is a {type(task).__name__}, not a Task")
        task = task.using(priority=record.priority, queue_name=record.queue_name, backend=self.backend.alias)
        if record.run_after is not None:
            task = task.using(run_after=record.run_after)
        return task


def task_result(
    task: DjangoTask,
    backend: str,
    *,
    id: str,
    status: str,
    enqueued_at: datetime | None,
    args: list[object],
    kwargs: dict[str, object],
    started_at: datetime | None = None,
    finished_at: datetime | None = None,
    last_attempted_at: datetime | None = None,
    errors: Iterable[TaskError] = (),
    worker_ids: Iterable[str] = (),
    return_value: object = None,
) -> DjangoTaskResult:
    """Return a ``TaskResult`` of ``task`` holding ``return_value`` (the one place results are
    built: at enqueue, and from a record)."""
    result: DjangoTaskResult = TaskResult(
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


def error_entry(error: BaseException) -> dict[str, str]:
    """Return ``error`` as one entry of ``TaskRecord.errors`` (Django's ``TaskError`` fields)."""
    kind = type(error)
    return {
        "exception_class_path": f"{kind.__module__}.{kind.__qualname__}",
        "traceback": "".join(format_exception(error)),
    }


def _stand_in(record: TaskRecord, backend: str) -> DjangoTask:
    """Return the Task that ``record``'s result reads with when its stored path no longer names
    one (see ``Results.to_result``): :func:`_missing`'s function, with the record's priority,
    queue and ``run_after``.

    Given only the fields this framework's ``Task`` has: Django 6.0 requires ``run_after``
    (no default), 6.1 and the django-tasks backport default it; none of them knows another
    field than these that a stand-in could fill in.
    """
    known: dict[str, Any] = {
        "func": _missing(record.task_path),
        "priority": record.priority,
        "queue_name": record.queue_name,
        "backend": backend,
        "run_after": record.run_after,
    }
    fields = {field.name for field in dataclasses.fields(Task) if field.init}
    task: DjangoTask = Task(**{name: value for name, value in known.items() if name in fields})
    return task


@cache
def _missing(path: str) -> Callable[..., None]:
    """Return a stand-in for a stored task path that no longer imports (see ``Results.to_result``):
    named by that path (logs and ``TaskResult.task`` say which task it was), refusing to run.
    One per path: the backend's ``validate_task`` keeps each function it has checked."""

    def missing(*args: object, **kwargs: object) -> None:
        raise TypeError(f"{path} no longer names a Task")

    module, _, name = path.rpartition(".")
    missing.__module__, missing.__name__, missing.__qualname__ = module or __name__, name, name
    return missing
