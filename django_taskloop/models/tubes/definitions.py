"""What a tube and its tasks are, for every tube module: the driver types, the task states and
what they mean on the database's clock, the claim order, the call counters and their slots,
the consumer's identity, and what a valid priority or lifetime is."""

from __future__ import annotations

import os
import socket
import threading
import zlib
from typing import Any

from django.db.models import Q

from ... import engine
from ...validation import check_seconds

TUBE_TYPES = ("fifo", "fifottl", "utube", "utubettl")
TTL_TYPES = ("fifottl", "utubettl")
UTUBE_TYPES = ("utube", "utubettl")

READY, TAKEN, DONE, BURIED, DELAYED = "r", "t", "-", "!", "~"

#: The stored state of a live task by its name. What a task *is* also depends on the clock:
#: see :class:`TaskQuerySet` and :meth:`Task.current_state`.
STORED_STATES = {"ready": READY, "taken": TAKEN, "delayed": DELAYED, "buried": BURIED}
#: What a task of a tube is now, read with the database's clock: a stored state, or
#: ``"expired"`` once its ttl deadline has passed (whatever it is stored as: the next call on
#: the tube removes it, as Tarantool's ttl does; a take never gets it, an ack of it fails).
TASK_STATES = ("ready", "taken", "delayed", "buried", "expired")

#: Tarantool's call counters, in the order statistics() lists them; ``delete`` is stored as
#: ``deleted`` so that the model does not shadow ``Model.delete()``.
CALLS = ("ack", "bury", "delete", "kick", "put", "release", "take", "touch", "ttl", "ttr", "delay")
#: The :class:`TubeStat` column of each call counter.
COLUMN = {name: ("deleted" if name == "delete" else name) for name in CALLS}

#: Counter rows per tube. Processes spread over them by identity, so that two consumers
#: rarely wait for each other's counter row, while statistics() sums only a few rows.
SLOTS = 16


#: The order in which takes hand tasks out (see TaskQuerySet.in_claim_order). fifo/utube tasks
#: all have pri 0, so this is their id order; saying pri too lets the claim index serve it
#: (PostgreSQL would otherwise walk the primary key and filter).
TAKE_ORDER = ("pri", "id")


def default_consumer() -> str:
    """Return this process's and thread's consumer identity, ``"<host>:<pid>:<thread id>"``."""
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


def slot(using: str = "default") -> int:
    """This process's and thread's counter row of a tube on database ``using``.

    One of the slots of the server's share (``engine.node_share``): on a Galera cluster each
    node's processes update slots of their own, so that two nodes never write the same
    counter row (a conflict at certification); within a share, by host, pid and thread."""
    index, count = engine.node_share(using)
    mine = range(index % SLOTS, SLOTS, count if count <= SLOTS else SLOTS)  # (more nodes than slots: one)
    who = f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"
    return mine[zlib.crc32(who.encode()) % len(mine)]


# -- what a state means on the database's clock ---------------------------------------------


def alive_tasks() -> Q:
    """Tasks whose ttl deadline has not passed (NULL: never)."""
    return Q(ttl_at__isnull=True) | Q(ttl_at__gt=engine.DbNow())


def expired_tasks() -> Q:
    """Tasks whose ttl deadline has passed: the single definition of "expired"."""
    return Q(ttl_at__lte=engine.DbNow())


# -- valid options (a tube's defaults and a task's) ------------------------------------------


def check_pri(value: Any, name: str = "pri", allow_none: bool = True) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if not -(2**31) <= value < 2**31:
        raise ValueError(f"{name} must fit in 32 bits, not {value!r}")
    return value


def check_lifetime(value: Any, name: str) -> float | None:
    """ttl/ttr: ``None`` (the default), or seconds > 0; ``math.inf`` is not accepted."""
    return check_seconds(value, name, allow_none=True, positive=True)
