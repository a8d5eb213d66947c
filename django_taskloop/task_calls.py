"""Django Tasks calls waiting in tubes: the tubes' names, and how a call that a one-row
enqueue left in its tube task reads as a result until a worker starts it.

``enqueue()`` of :class:`~django_taskloop.backends.TaskloopBackend` is one INSERT: the queue's
tube task carries the call (path, arguments, options) and no result record exists until a
worker starts the task. The backend, the admin and the worker read such calls here.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db import router
from django.db.models import Q

from .models import Task as TubeTask
from .models import TaskRecord
from .models.operating import TASKS_TUBE_PREFIXES

__all__ = [
    "TUBE_PREFIX",
    "KEYED_TUBE_PREFIX",
    "tube_name",
    "keyed_tube_name",
    "record_of",
    "waiting_record",
    "carrier",
    "called_record",
    "waiting_results",
    "short_result_id",
    "result_id_of",
    "task_path_of",
]

#: Tubes that hold Django Tasks are named ``TUBE_PREFIX + queue_name``; tasks enqueued with a
#: ``key`` wait in a ``utubettl`` tube named ``KEYED_TUBE_PREFIX + queue_name`` (one sub-queue
#: per key: one task of a key runs at a time). Spelled once, beside the Failure rows that
#: name them (``models.operating.TASKS_TUBE_PREFIXES``).
TUBE_PREFIX, KEYED_TUBE_PREFIX = TASKS_TUBE_PREFIXES


def tube_name(queue_name: str) -> str:
    """Return the name of the tube that holds the tasks of ``queue_name``."""
    return f"{TUBE_PREFIX}{queue_name}"


def keyed_tube_name(queue_name: str) -> str:
    """Return the name of the tube that holds the keyed tasks of ``queue_name``."""
    return f"{KEYED_TUBE_PREFIX}{queue_name}"


def record_of(
    call: dict[str, Any], options: dict[str, Any], priority: int, result_id: str | None = None
) -> TaskRecord:
    """Return the (unsaved, READY) record of the call a tube task carries (see
    ``TaskloopBackend.enqueue``)."""
    run_after = call.get("run_after")
    record = TaskRecord(
        backend=call["backend"],
        queue_name=call["queue"],
        task_path=call["task"],
        priority=priority,
        run_after=dt.datetime.fromisoformat(run_after) if run_after else None,
        takes_context=bool(call.get("context")),
        args=call["args"],
        kwargs=call["kwargs"],
        ttl=options.get("ttl"),
    )
    if result_id is not None:
        record.id = result_id
    return record


def waiting_record(queued: TubeTask, call: Any) -> TaskRecord:
    """Return the record of a one-row enqueue as it reads until a worker starts it (unsaved):
    its id is ``"<tube task id>-<secret>"``, its enqueue time the tube task's."""
    record = record_of(call, call.get("options", {}), 100 - queued.pri, f"{queued.pk}-{call['id']}")
    record.enqueued_at = queued.created
    return record


def carrier(result_id: str, using: str) -> TubeTask | None:
    """Return the tube task that carries the call of the one-row enqueue ``result_id``
    (``"<tube task id>-<secret>"``), if it is still there."""
    pk, _, secret = str(result_id).partition("-")
    if not secret or not pk.isdigit() or len(pk) > 18:
        return None
    queued = TubeTask.objects.using(using).filter(pk=int(pk)).first()
    if queued is None or not isinstance(queued.data, dict) or "result" in queued.data:
        return None
    return queued if queued.data.get("id") == secret and "task" in queued.data else None


def called_record(queued: Any, result_id: str) -> TaskRecord | None:
    """Return the record to write as a worker first starts the one-row enqueue ``queued``
    (None if ``queued`` carries no call, or another)."""
    data = getattr(queued, "data", None)
    if not isinstance(data, dict) or "task" not in data or "result" in data:
        return None
    record = waiting_record(queued, data)
    return record if record.id == result_id else None


def waiting_results(
    limit: int = 20,
    result_id: str | None = None,
    cap: int | None = None,
    queue_name: str | None = None,
    task_path: str | None = None,
) -> tuple[int, list[TaskRecord]]:
    """Return how many Django Tasks no worker has started yet wait in the queues' tubes (their
    calls carried by their tube tasks: one-row enqueues, not in ``TaskRecord`` until a worker
    starts them), and the newest ``limit`` of them as unsaved records, as ``get_result()``
    reads them; ``result_id``: only that one. ``cap``: count no further than that (a page that
    says "more than" rather than read every waiting row). ``queue_name``, ``task_path``: only
    the tasks of that queue, of that task."""
    using = router.db_for_read(TaskRecord)
    queued = TubeTask.objects.using(using).filter(
        Q(tube__name__startswith=TUBE_PREFIX) | Q(tube__name__startswith=KEYED_TUBE_PREFIX)
    )
    if result_id is not None:
        found = carrier(result_id, using)
        records = [] if found is None else [waiting_record(found, found.data)]
        return len(records), records
    if queue_name is not None:
        queued = queued.filter(tube__name__in=[tube_name(queue_name), keyed_tube_name(queue_name)])
    if task_path is not None:
        queued = queued.filter(data__task=task_path)
    # A tube task that points at its record ("result") is listed with the records.
    queued = queued.exclude(data__has_key="result")
    records = [waiting_record(t, t.data) for t in queued.order_by("-pk")[:limit] if isinstance(t.data, dict)]
    return (queued.count() if cap is None else queued[:cap].count()), records


def short_result_id(result_id: str) -> str:
    """Return ``result_id`` shortened for lists and logs: ``"4017-9f2c"`` of ``"4017-9f2c1a0b3c4d"``
    (a one-row enqueue's tube task id, the secret's first 4 digits), else its first 8 digits."""
    pk, dash, secret = result_id.partition("-")
    return f"{pk}-{secret[:4]}" if dash else result_id[:8]


def result_id_of(task: TubeTask) -> str | None:
    """Return the Django Task result id a tube task of the backend carries (``None``: not one)."""
    data = task.data if isinstance(task.data, dict) else {}
    result = data.get("result")
    if result is not None:  # the record was written first (see enqueue)
        return str(result)
    if "task" in data and "id" in data:  # a one-row enqueue: the tube task carries the call
        return f"{task.pk}-{data['id']}"
    return None


def task_path_of(task: TubeTask) -> str | None:
    """Return the dotted path of the Django Task a tube task of the backend carries, if it says."""
    data = task.data if isinstance(task.data, dict) else {}
    path = data.get("task")
    return str(path) if path is not None else None
