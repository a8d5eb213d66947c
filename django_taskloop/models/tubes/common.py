"""What the tube modules share: states, counters, per-process state, option checks."""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import zlib
from typing import Any

from django.db import models
from django.db.models import Case, F, Q, Value, When
from django.db.models.functions import Concat, Least

from ... import engine
from ...validation import (
    MAX_SECONDS,
    check_owner,
    check_seconds,
    check_text,
)

logger = logging.getLogger("django_taskloop.tubes")


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
_COLUMN = {name: ("deleted" if name == "delete" else name) for name in CALLS}

#: Counter rows per tube. Processes spread over them by identity, so that two consumers
#: rarely wait for each other's counter row, while statistics() sums only a few rows.
SLOTS = 16


# How often one process re-checks for dead consumers on its own takes (seconds); peek,
# statistics, drop and the reaper always check.
_STALE_CHECK_EVERY = 1.0
# How often one process writes a consumer's heartbeat at most (seconds); at most a quarter of
# CONSUMER_TIMEOUT, so that a consumer that takes is never near its death. A worker's heartbeat
# thread beats too (every HEARTBEAT_INTERVAL), which spares its takes the write.
_BEAT_EVERY = 5.0
# How often a worker's batches probe for ended delays and ttrs (seconds); a plain take always does.
_WORKER_DUE_CHECK_EVERY = 0.25
# What a worker's batch adds to its counter slot (engine.delete_and_claim): takes are the
# claimed rows, acks and done the deleted ones.
_BATCH_COUNTERS = {"take": "claimed", "ack": "deleted", "done": "deleted"}


#: The order in which takes hand tasks out (see Tube._order, TaskQuerySet.in_claim_order).
_TAKE_ORDER = ("pri", "id")


def default_consumer() -> str:
    """Return this process's and thread's consumer identity, ``"<host>:<pid>:<thread id>"``."""
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


def _slot(using: str = "default") -> int:
    """This process's and thread's counter row of a tube on database ``using``.

    One of the slots of the server's share (``engine.node_share``): on a Galera cluster each
    node's processes update slots of their own, so that two nodes never write the same
    counter row (a conflict at certification); within a share, by host, pid and thread."""
    index, count = engine.node_share(using)
    mine = range(index % SLOTS, SLOTS, count if count <= SLOTS else SLOTS)  # (more nodes than slots: one)
    who = f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"
    return mine[zlib.crc32(who.encode()) % len(mine)]


# -- database clock arithmetic -------------------------------------------------------------


def _touched(increment: float) -> dict[str, Any]:
    """What a touch writes: ``increment`` more seconds of ttr, and every deadline moved by it."""
    return {
        "ttl_at": engine.Shifted(increment, F("ttl_at")),
        "event_at": engine.Shifted(increment, F("event_at")),
        "ttr": F("ttr") + increment,
    }


def _taken_deadline() -> Any:
    """``min(now + ttr, ttl deadline)`` with NULL meaning infinite on either side."""
    return Case(
        When(ttr__isnull=True, then=F("ttl_at")),
        When(ttl_at__isnull=True, then=engine.Shifted(F("ttr"))),
        default=Least(engine.Shifted(F("ttr")), F("ttl_at")),
        output_field=models.DateTimeField(),
    )


def _taken_key() -> Any:
    """The value of ``taken_key`` for a taken utube task: unique per (tube, sub-queue)."""
    return Case(
        When(utube__isnull=True, then=Value("")),
        default=Concat(Value("."), F("utube")),
        output_field=models.CharField(),
    )


def _alive() -> Q:
    """Tasks whose ttl deadline has not passed (NULL: never)."""
    return Q(ttl_at__isnull=True) | Q(ttl_at__gt=engine.DbNow())


def _expired() -> Q:
    """Tasks whose ttl deadline has passed: the single definition of "expired"."""
    return Q(ttl_at__lte=engine.DbNow())


# -- validation helpers --------------------------------------------------------------------


def _check_pri(value: Any, name: str = "pri", allow_none: bool = True) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if not -(2**31) <= value < 2**31:
        raise ValueError(f"{name} must fit in 32 bits, not {value!r}")
    return value


def _check_lifetime(value: Any, name: str) -> float | None:
    """ttl/ttr: ``None`` (the default), or seconds > 0; ``math.inf`` is not accepted."""
    return check_seconds(value, name, allow_none=True, positive=True)


def _check_put_options(pri: Any, ttl: Any, ttr: Any, delay: Any, utube: Any) -> tuple[Any, ...]:
    """Check the options of ``put``/``put_many``; return them as ``(pri, ttl, ttr, delay, utube)``."""
    pri = _check_pri(pri)
    ttl = _check_lifetime(ttl, "ttl")
    ttr = _check_lifetime(ttr, "ttr")
    delay = check_seconds(delay, "delay", allow_none=True)
    if utube is not None:
        utube = check_text(str(utube), "utube")
        if len(utube) > 255:
            raise ValueError(f"utube must be at most 255 characters, not {len(utube)}")
    return pri, ttl, ttr, delay, utube


def _check_consumer(consumer: Any) -> str:
    if consumer is None:
        return default_consumer()
    return check_owner(consumer, "consumer")


def _check_timeout(timeout: Any) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(
            f"timeout must be an int or float number of seconds or None, not {type(timeout).__name__}"
        )
    if isinstance(timeout, float) and not math.isfinite(timeout):
        raise ValueError(f"timeout must be finite (None waits forever), not {timeout!r}")
    return min(max(0.0, float(timeout)), float(MAX_SECONDS))
