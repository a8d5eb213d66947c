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

from ...engine import ClaimCursor as ClaimCursor

# Importable from here as before the split (the tube's modules, its admin, tests and benches
# use them), but not part of ``django_taskloop.models``' names: see __all__.
from .base import _callbacks as _callbacks
from .base import _stale_checks as _stale_checks
from .common import _COLUMN as _COLUMN
from .common import BURIED as BURIED
from .common import CALLS as CALLS
from .common import DELAYED as DELAYED
from .common import DONE as DONE
from .common import READY as READY
from .common import SLOTS as SLOTS
from .common import STORED_STATES as STORED_STATES
from .common import TAKEN as TAKEN
from .common import TASK_STATES as TASK_STATES
from .common import TTL_TYPES as TTL_TYPES
from .common import TUBE_TYPES as TUBE_TYPES
from .common import UTUBE_TYPES as UTUBE_TYPES
from .common import _slot as _slot
from .common import default_consumer
from .consuming import worth_trying as worth_trying
from .records import Consumer, Task, TaskQuerySet, TubeStat, TubeWaiter
from .records import ConsumerQuerySet as ConsumerQuerySet
from .records import TubeStatQuerySet as TubeStatQuerySet
from .records import TubeWaiterQuerySet as TubeWaiterQuerySet
from .records import _beats as _beats
from .records import calls_from as calls_from
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
]
