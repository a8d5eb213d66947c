"""Tubes (Tarantool's ``queue``): ``Tube`` and ``Task``, drivers fifo, fifottl, utube, utubettl.

A tube is a row; its tasks are rows of one narrow table. Taking a task is a claim through
:func:`django_taskloop.engine.claim` in the driver's order (``id`` for fifo/utube, ``pri, id``
for fifottl/utubettl), served by one index for both orders.

Time-driven transitions (a delay ending, a ttr running out, a ttl expiring, a consumer that
stopped beating) are applied by :meth:`Tube.tidy`, which every call that can observe them runs
first when something is due, so they are right whether or not a reaper ever ran.

Counters (``statistics()["calls"]`` and ``tasks.done``) live in :class:`TubeStat`: a few slot
rows per tube, each process and thread writing the slot its identity hashes to, in the same
transaction as the change. No single row is written by every take and ack, and
``statistics()`` sums the slots. ``put`` is not counted but derived (:func:`calls_from`), so
that a put is one statement: its INSERT.
"""

from __future__ import annotations

from .base import (
    _callbacks as _callbacks,
)
from .base import (
    _stale_checks as _stale_checks,
)
from .common import (
    _COLUMN as _COLUMN,
)
from .common import (
    BURIED,
    CALLS,
    DELAYED,
    DONE,
    READY,
    SLOTS,
    STORED_STATES,
    TAKEN,
    TASK_STATES,
    TTL_TYPES,
    TUBE_TYPES,
    UTUBE_TYPES,
    default_consumer,
)
from .common import (
    _slot as _slot,
)
from .consuming import worth_trying
from .records import (
    Consumer,
    ConsumerQuerySet,
    Task,
    TaskQuerySet,
    TubeStat,
    TubeStatQuerySet,
    TubeWaiter,
    TubeWaiterQuerySet,
    calls_from,
)
from .records import (
    _beats as _beats,
)
from .tube import Tube, TubeManager

__all__ = [
    "Tube",
    "Task",
    "TaskQuerySet",
    "TubeManager",
    "TubeStat",
    "Consumer",
    "TubeWaiter",
    "default_consumer",
    "worth_trying",
    "calls_from",
    "ConsumerQuerySet",
    "TubeStatQuerySet",
    "TubeWaiterQuerySet",
    "TUBE_TYPES",
    "TTL_TYPES",
    "UTUBE_TYPES",
    "READY",
    "TAKEN",
    "DONE",
    "BURIED",
    "DELAYED",
    "STORED_STATES",
    "TASK_STATES",
    "CALLS",
    "SLOTS",
]
