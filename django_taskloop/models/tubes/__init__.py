"""Tubes (Tarantool's ``queue``): ``Tube`` and ``Task``, drivers fifo, fifottl, utube, utubettl.

A tube is a row; its tasks are rows of one narrow table. Taking a task is a claim through
:func:`django_taskloop.engine.claim` in the driver's order (``id`` for fifo/utube, ``pri, id``
for fifottl/utubettl), served by one index for both orders.

Time-driven transitions (a delay ending, a ttr running out, a ttl expiring, a consumer that
stopped beating) are applied by :meth:`Tube.tidy`, which every call that can observe them runs
first when something is due, so they are right whether or not a reaper ever ran.

The package by job: :mod:`.definitions` (types, states, counters: what a tube and a task
are), :mod:`.records` (the rows: tasks, counter slots, consumers' heartbeats, waiting takes),
:mod:`.core` (the tube's row, the helpers of its verbs, its time-driven transitions),
:mod:`.claiming` (the consumer side: how a claim works; ack, release, touch, bury),
:mod:`.operating` (the producer and operator side: put, kick, pause, delete, drop,
statistics) and :mod:`.tube` (``Tube``, both sides on the core, and ``TubeManager``).

Counters (``statistics()["calls"]`` and ``tasks.done``) live in :class:`TubeStat`: a few slot
rows per tube, each process and thread writing the slot its identity hashes to, in the same
transaction as the change. No single row is written by every take and ack, and
``statistics()`` sums the slots. ``put`` is not counted but derived (:func:`calls_from`), so
that a put is one statement: its INSERT.
"""

from __future__ import annotations

from ...engine import ClaimCursor as ClaimCursor

# Importable from here as before the split (the tube's admin, tests and benches use them), but
# not part of ``django_taskloop.models``' names: see __all__.
from .claiming import _stale_checks as _stale_checks
from .claiming import worth_trying as worth_trying
from .core import _callbacks as _callbacks
from .definitions import BURIED as BURIED
from .definitions import CALLS as CALLS
from .definitions import COLUMN as COLUMN
from .definitions import DELAYED as DELAYED
from .definitions import DONE as DONE
from .definitions import READY as READY
from .definitions import SLOTS as SLOTS
from .definitions import STORED_STATES as STORED_STATES
from .definitions import TAKEN as TAKEN
from .definitions import TASK_STATES as TASK_STATES
from .definitions import TTL_TYPES as TTL_TYPES
from .definitions import TUBE_TYPES as TUBE_TYPES
from .definitions import UTUBE_TYPES as UTUBE_TYPES
from .definitions import default_consumer
from .definitions import slot as slot
from .records import Consumer, Task, TaskQuerySet, TubeStart, TubeStat, TubeWaiter
from .records import ConsumerQuerySet as ConsumerQuerySet
from .records import TubeStatQuerySet as TubeStatQuerySet
from .records import TubeWaiterQuerySet as TubeWaiterQuerySet
from .records import _beats as _beats
from .records import calls_from as calls_from
from .tube import Tube, TubeManager

#: Their names before the split (tests and benches import ``_slot``).
_COLUMN, _slot = COLUMN, slot

__all__ = [
    "Tube",
    "Task",
    "TaskQuerySet",
    "TubeManager",
    "TubeStat",
    "TubeStart",
    "Consumer",
    "TubeWaiter",
    "default_consumer",
]
