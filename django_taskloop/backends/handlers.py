"""The worker's entry to the backends of ``TASKS``: a tube handler for each of their queues,
which hands a claimed tube task to its backend's :meth:`TaskloopBackend.execute`."""

from __future__ import annotations

import logging
import os
import socket

from ..models import Task as TubeTask
from ..models import TaskRecord
from ..task_calls import keyed_tube_name, result_id_of, tube_name
from ..workers import Handler
from .backend import taskloop_backend, taskloop_backends

__all__ = ["task_handlers"]

logger = logging.getLogger("django_taskloop.tasks")


def task_handlers() -> list[Handler]:
    """Return a tube handler for every queue of every ``TaskloopBackend`` in ``TASKS``."""
    handlers = []
    for backend in taskloop_backends():
        limits, key_limits, key_rates = (
            backend.queue_limits(),
            backend.queue_key_limits(),
            backend.queue_key_rates(),
        )
        for queue in sorted(backend.queues):
            # OPTIONS["LIMITS"]/["RATES"]: set on both of its tubes, which count together;
            # OPTIONS["KEY_LIMITS"]/["KEY_RATES"] on its keyed tube.
            limit, rate = limits.get(queue, (None, None))
            for name, kind, key_limit, key_rate in (
                (tube_name(queue), "fifottl", None, None),
                (keyed_tube_name(queue), "utubettl", key_limits.get(queue), key_rates.get(queue)),
            ):
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
                        limit=limit,
                        rate=rate,
                        key_limit=key_limit,
                        key_rate=key_rate,
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
