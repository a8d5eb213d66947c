"""What the parts of :class:`~django_taskloop.backends.TaskloopBackend` share: the backend as
they see it, and the tube of each queue (made on first use, kept per process), where an
enqueue, a retry and an attempt put back after its backoff put the call."""

from __future__ import annotations

from functools import partial
from typing import Protocol

from django.db import connections, transaction

from ..models import Tube
from ..task_calls import keyed_tube_name, tube_name

__all__ = ["Backend", "queue_tube"]


class Backend(Protocol):
    """What the backend's parts (enqueue, results, the worker's side) read of the
    ``TaskloopBackend`` they serve."""

    #: Its name in ``TASKS``.
    alias: str

    @property
    def databases(self) -> list[str] | None:
        """The shards of its queues (``OPTIONS["DATABASES"]``), or ``None``."""


#: The tube of each queue, by (database alias, queue name): enqueue looks it up once per process.
_tubes: dict[tuple[str, str], Tube] = {}


def queue_tube(using: str, queue_name: str, fresh: bool = False, keyed: bool = False) -> Tube:
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
