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

import copy
import datetime
import logging
import math
import os
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from django.db import IntegrityError, connections, models, transaction
from django.db.models import Case, Count, Exists, F, OuterRef, Q, Sum, Value, When
from django.db.models.functions import Concat, Least

from .. import engine, wakeup
from ..conf import setting
from ..exceptions import NotFound, NotTaken, TaskloopError, TubeError
from ..validation import (
    MAX_SECONDS,
    check_aware,
    check_bool,
    check_count,
    check_json,
    check_name,
    check_owner,
    check_seconds,
    check_text,
)
from . import operating

logger = logging.getLogger("django_taskloop.tubes")

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


def _slot() -> int:
    return zlib.crc32(f"{os.getpid()}:{threading.get_ident()}".encode()) % SLOTS


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


# -- per-process state ---------------------------------------------------------------------

_callbacks: dict[tuple[str, int], Callable[[Task, str], Any]] = {}
_beats: dict[tuple[str, str], float] = {}
_stale_checks: dict[tuple[str, int], float] = {}
_due_checks: dict[tuple[str, int], float] = {}
#: Each tube's base queryset of its tasks, by (database, tube id) (see Tube._tasks).
_task_querysets: dict[tuple[str, int], models.QuerySet[Task]] = {}


def _reset_after_fork() -> None:
    # A child is a new consumer: it must beat on its own, and check for the dead afresh.
    _beats.clear()
    _stale_checks.clear()
    _due_checks.clear()


os.register_at_fork(after_in_child=_reset_after_fork)


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


def _check_task_id(task_id: Any, name: str = "task_id") -> int:
    if isinstance(task_id, Task):
        task_id = task_id.pk
    if isinstance(task_id, bool) or not isinstance(task_id, int):
        raise TypeError(f"{name} must be an int or a Task, not {type(task_id).__name__}")
    # No task has an id its 64-bit column cannot hold; SQLite, which bounds no integer column,
    # would fail with OverflowError where an id list meets it.
    if not -(2**63) <= task_id < 2**63:
        raise ValueError(f"{name}: {task_id!r} is out of the 64-bit integer range of task ids")
    return task_id


def _check_task_ids(task_ids: Any) -> list[int]:
    """Return one task id (or Task) or an iterable of them as a list without duplicates."""
    if isinstance(task_ids, (int, Task)):
        task_ids = [task_ids]
    return list(dict.fromkeys(_check_task_id(t, "task_ids") for t in task_ids))


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


# -- models --------------------------------------------------------------------------------


def worth_trying(tubes: Sequence[Tube]) -> dict[int, str]:
    """Say, in one read, which of ``tubes`` (of one database) a take may find something in now.

    For waiting takes and idle workers. Return ``{tube id: what}`` for the tubes that still
    exist: ``"due"`` if a transition is due (a delay or ttr ran out; about once a second per
    tube, a dead consumer holds a task: the take applies it first), else ``"ready"`` if
    something is claimable (the take may skip its own checks: ``_take(checked=True)``), else
    ``""``; always ``""`` for a paused tube.
    """
    if not tubes:
        return {}
    using = tubes[0]._using
    now = time.monotonic()
    stale: set[int] = set()
    whens = []
    for tube in tubes:
        key = (using, tube.pk)
        if now - _stale_checks.get(key, -math.inf) >= _STALE_CHECK_EVERY:
            _stale_checks[key] = now
            stale.add(tube.pk)
        due, ready = tube._worth(tube.pk in stale)
        if due is not None:
            whens.append(When(due, then=Value("due")))
        whens.append(When(ready, then=Value("ready")))
    rows = (
        Tube.objects.using(using)
        .filter(pk__in=[tube.pk for tube in tubes])
        .annotate(worth=Case(*whens, default=Value(""), output_field=models.CharField()))
        .order_by()
        .values_list("pk", "worth")
    )
    worth = {pk: what or "" for pk, what in rows}
    for pk in stale:
        if worth.get(pk):
            # Maybe a dead consumer's tasks: the take's tidy must look for itself at once.
            _stale_checks.pop((using, pk), None)
    return worth


class TubeManager(models.Manager["Tube"]):
    """Create tubes and look at all of them: ``create_tube``, ``statistics``, ``reap``."""

    def create_tube(
        self,
        name: str,
        type: str,
        if_not_exists: bool = False,
        ttl: float | None = None,
        ttr: float | None = None,
        pri: int | None = None,
        on_task_change: Callable[[Task, str], Any] | None = None,
    ) -> Tube:
        """Create the tube ``name`` of driver ``type`` and return it.

        An existing name raises :class:`TubeError`, unless ``if_not_exists`` is true and the
        existing tube has the same type (then it is returned). ``ttl``, ``ttr`` and ``pri``
        are the defaults of the tube's tasks (ignored by fifo and utube, but type-checked).
        """
        name = check_name(name)
        if not isinstance(type, str):
            raise TypeError(f"type must be a str, not {builtins_type(type).__name__}")
        if type not in TUBE_TYPES:
            raise ValueError(f"type must be one of {', '.join(TUBE_TYPES)}, not {type!r}")
        if_not_exists = check_bool(if_not_exists, "if_not_exists")
        ttl = _check_lifetime(ttl, "ttl")
        ttr = _check_lifetime(ttr, "ttr")
        pri = _check_pri(pri)
        if on_task_change is not None and not callable(on_task_change):
            raise TypeError("on_task_change must be callable or None")
        using = self.db

        def make() -> Tube:
            tube = self.model(name=name, type=type, ttl=ttl, ttr=ttr, pri=pri)
            tube.save(using=using, force_insert=True)
            TubeStat.objects.using(using).bulk_create([TubeStat(tube=tube, slot=s) for s in range(SLOTS)])
            return tube

        existing = self.filter(name=name).first()
        if existing is None:
            try:
                tube = engine.run_in_transaction(self.model, using, make)
            except IntegrityError:
                # A rival created it between our look and our insert.
                existing = self.filter(name=name).first()
                if existing is None:
                    raise
        if existing is not None:
            if not if_not_exists:
                raise TubeError(f"tube {name!r} already exists")
            if existing.type != type:
                raise TubeError(f"tube {name!r} exists with type {existing.type!r}, not {type!r}")
            asked = {"ttl": ttl, "ttr": ttr, "pri": pri}
            differ = {
                key: value
                for key, value in asked.items()
                if value is not None and value != getattr(existing, key)
            }
            if differ:
                # The stored tube wins (its tasks were put under its options), but silently
                # handing back other options than the code asked for hides a real mistake,
                # e.g. a worker's @tube("emails") having created it first with the defaults.
                logger.warning(
                    "tube %r already exists with %s; create_tube(if_not_exists=True) asked for %s: "
                    "the stored options stay (drop and re-create the tube, or change the code to match)",
                    name,
                    ", ".join(f"{key}={getattr(existing, key)!r}" for key in differ),
                    ", ".join(f"{key}={value!r}" for key, value in differ.items()),
                )
            tube = existing
        if on_task_change is not None:
            _callbacks[(using, tube.pk)] = on_task_change
        return tube

    def statistics(self) -> dict[str, dict[str, dict[str, int]]]:
        """Return ``{tube name: tube.statistics()}`` for every tube."""
        return {tube.name: tube.statistics() for tube in self.order_by("name")}

    def reap(self) -> dict[str, int]:
        """Apply every due transition of every tube; return the counts per kind.

        Kinds: ``delay`` (delayed → ready), ``ttr`` (taken → ready), ``ttl`` (removed),
        ``release`` (a dead consumer's task → ready), ``consumers`` (dead consumers forgotten).
        """
        totals = {"delay": 0, "ttr": 0, "ttl": 0, "release": 0, "consumers": 0}
        for tube in self.all():
            try:
                done = tube.tidy(stale=True)
            except NotFound:
                continue
            for kind, n in done.items():
                totals[kind] += n
        totals["consumers"] = Consumer.objects.using(self.db).forget_dead()
        return totals


builtins_type = type


class Tube(models.Model):
    """A named queue of tasks with a driver: ``fifo``, ``fifottl``, ``utube`` or ``utubettl``."""

    name = models.CharField(max_length=100, unique=True)
    type = models.CharField(max_length=10, choices=[(t, t) for t in TUBE_TYPES])
    ttl = models.FloatField(null=True, blank=True, help_text="Default time to live of a task (seconds).")
    ttr = models.FloatField(null=True, blank=True, help_text="Default time to run of a taken task (seconds).")
    pri = models.IntegerField(null=True, blank=True, help_text="Default priority (lower first).")
    created = models.DateTimeField(auto_now_add=True)

    objects = TubeManager()

    class Meta:
        app_label = "django_taskloop"
        db_table = "taskloop_tube"
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.type})"

    # -- helpers ---------------------------------------------------------------------------

    @property
    def _using(self) -> str:
        return self._state.db or "default"

    @property
    def using(self) -> str:
        """The alias of the database this tube and its tasks live on."""
        return self._state.db or "default"

    @property
    def _has_ttl(self) -> bool:
        return self.type in TTL_TYPES

    @property
    def _is_utube(self) -> bool:
        return self.type in UTUBE_TYPES

    def _tasks(self) -> models.QuerySet[Task]:
        """This tube's tasks: a fresh queryset each call (``all()`` of one built once; a
        worker's batches ask for it twice each, and building the filter costs more than
        the statements it names)."""
        key = (self._using, self.pk)
        base = _task_querysets.get(key)
        if base is None:
            if len(_task_querysets) >= 1024:
                _task_querysets.clear()
            # Never evaluated itself (only its clones are), so it holds no rows.
            base = _task_querysets[key] = Task.objects.using(key[0]).filter(tube_id=key[1])
        return base.all()

    def _exists(self) -> bool:
        return Tube.objects.using(self._using).filter(pk=self.pk).exists()

    def _gone(self) -> NotFound:
        return NotFound(f"tube {self.name!r} does not exist (dropped?)")

    def _ensure_exists(self) -> None:
        if not self._exists():
            raise self._gone()

    def _run(self, work: Callable[[], Any], lock_first: bool = True) -> Any:
        """Run ``work`` in a write transaction, retrying deadlocks when outermost (the engine
        retries the whole transaction, claim and counters, once per deadlock: one layer).

        ``lock_first=False``: ``work``'s first statement writes (see ``engine.write_transaction``).
        """
        return engine.run_in_transaction(Task, self._using, work, lock_first=lock_first)

    def _count(self, **deltas: int) -> None:
        """Add ``deltas`` to this process's counter slot, in the current transaction."""
        deltas = {_COLUMN.get(k, k): n for k, n in deltas.items() if n}
        if not deltas:
            return
        slot = {"tube_id": self.pk, "slot": _slot()}
        if engine.add_to(TubeStat, self._using, slot, deltas):
            return
        # No slot rows: the tube was dropped, or made without create_tube (admin, fixtures).
        self._ensure_exists()
        TubeStat.objects.using(self._using).bulk_create(
            [TubeStat(tube_id=self.pk, slot=s) for s in range(SLOTS)], ignore_conflicts=True
        )
        engine.add_to(TubeStat, self._using, slot, deltas)

    def _emit(self, task: Task, event: str) -> None:
        callback = _callbacks.get((self._using, self.pk))
        if callback is None:
            return
        snapshot = copy.copy(task)
        transaction.on_commit(lambda: callback(snapshot, event), using=self._using)

    def _wake(self) -> None:
        """Tell waiting consumers (here at commit, elsewhere via NOTIFY) that a task is ready."""
        using, pk = self._using, self.pk
        wakeup.send_notify(using, pk)
        transaction.on_commit(lambda: wakeup.notify(using, pk), using=using)

    def _beat(self, consumer: str, register: bool = True) -> None:
        """Record that ``consumer`` is alive, unless this process did so lately (see _BEAT_EVERY).

        ``register=False`` (ack, release, touch and their batches) only refreshes a consumer
        already known: one with no row holds no task, so the call will do nothing for it, and
        a refused call must leave no row behind.
        """
        every = min(_BEAT_EVERY, float(setting("CONSUMER_TIMEOUT")) / 4)
        if time.monotonic() - _beats.get((self._using, consumer), -math.inf) < every:
            return
        Consumer.objects.using(self._using).beat(consumer, register=register)

    def _due(self, stale: bool = True) -> Q:
        """Rows with a transition due now (a delay, ttr or ttl ran out, or the holder died)."""
        due = Q(state__in=[DELAYED, TAKEN], event_at__lte=engine.DbNow())
        if stale:
            due |= Q(state=TAKEN, owner__in=Consumer.objects.using(self._using).dead().values("name"))
        return due | Q(state__in=[READY, BURIED], ttl_at__lte=engine.DbNow())

    def _existing(self, task_id: int, *, lock: bool) -> Task:
        """Return the task as it is now; :class:`NotFound` (or the tube's own) if there is none."""
        task = self._row(task_id, lock=lock)
        if task is None:
            self._ensure_exists()
            raise NotFound(f"task {task_id} not found")
        return task

    def _row(self, task_id: int, *, lock: bool) -> Task | None:
        """Return the task as it is now (due transitions applied), or ``None``."""
        for _ in range(2):
            rows = self._tasks().filter(pk=task_id)
            if lock:
                rows = rows.select_for_update()
            row = rows.annotate(
                _is_due=models.ExpressionWrapper(self._due(), output_field=models.BooleanField())
            ).first()
            if row is None or not row._is_due:
                if row is not None:
                    del row._is_due
                return row
            self.tidy()
        return row

    def _owned(self, task_id: int, consumer: str) -> Task:
        """Return the locked task if ``consumer`` holds it; else raise (NotFound first)."""
        row = self._row(task_id, lock=True)
        if row is None or row.state != TAKEN or row.owner != consumer:
            self._ensure_exists()
            raise NotTaken(f"task {task_id} is not taken by consumer {consumer!r}")
        return row

    # -- time-driven transitions -----------------------------------------------------------

    def tidy(self, stale: bool = True) -> dict[str, int]:
        """Apply this tube's due transitions now; return the counts per kind.

        Delayed tasks whose delay ran out and taken tasks whose ttr ran out become ready;
        with ``stale``, so do the tasks of consumers whose heartbeat is older than
        ``CONSUMER_TIMEOUT``; ready and buried tasks whose ttl ran out are removed.
        """
        done = {"delay": 0, "ttr": 0, "ttl": 0, "release": 0}
        if not self._tasks().filter(self._due(stale)).exists():
            # Nothing due: a plain read instead of a write transaction (on SQLite, the lock).
            self._ensure_exists()
            return done

        def work() -> None:
            self._ensure_exists()
            self._ready_again(stale, done)
            done["ttl"] = self._remove_expired()
            self._count(
                delay=done["delay"],
                ttr=done["ttr"],
                release=done["release"],
                ttl=done["ttl"],
                delete=done["ttl"],
                done=done["ttl"],
            )

        self._run(work)
        return done

    def _ready_again(self, stale: bool, done: dict[str, int]) -> None:
        """Make ready the tasks whose delay or ttr ran out (with ``stale``, and those that dead
        consumers hold), adding them to ``done`` by kind. Rows a rival is changing are
        skipped (engine.lock_free): it applies the transition, or we do next time."""
        tasks = self._tasks()
        back = engine.lock_free(
            tasks.filter(state__in=[DELAYED, TAKEN], event_at__lte=engine.DbNow()).order_by("pk")
        )
        dead_held: list[Task] = []
        if stale:
            dead = Consumer.objects.using(self._using).dead().values("name")
            dead_held = engine.lock_free(
                tasks.filter(state=TAKEN, owner__in=dead).exclude(pk__in=[t.pk for t in back]).order_by("pk")
            )
            back += dead_held
        if not back:
            return
        tasks.filter(pk__in=[t.pk for t in back]).update(
            state=READY, owner=None, taken_key=None, event_at=None
        )
        due = len(back) - len(dead_held)
        for i, task in enumerate(back):
            kind = "release" if i >= due else "delay" if task.state == DELAYED else "ttr"
            done[kind] += 1
            task.state, task.owner, task.taken_key, task.event_at = READY, None, None, None
            self._emit(task, kind)
        self._wake()

    def _remove_expired(self) -> int:
        """Remove the ready and buried tasks whose ttl ran out; return how many."""
        tasks = self._tasks()
        expired = engine.lock_free(
            tasks.filter(state__in=[READY, BURIED], ttl_at__lte=engine.DbNow()).order_by("pk")
        )
        if expired:
            engine.delete_rows(tasks.filter(pk__in=[t.pk for t in expired]))
            for task in expired:
                task.state = DONE
                self._emit(task, "delete")
                self._emit(task, "ttl")
        return len(expired)

    def _tidy_for_take(self, every: float = 0.0) -> None:
        """Before a take: apply due transitions if there are any (one cheap indexed read).

        ``every``: probe for ended delays and ttrs at most that often per process (a worker's
        batches: the clock's transitions need to show within a second, not within a batch).
        """
        key = (self._using, self.pk)
        now = time.monotonic()
        stale = now - _stale_checks.get(key, -math.inf) >= _STALE_CHECK_EVERY
        if stale:
            _stale_checks[key] = now
            dead = Consumer.objects.using(self._using).dead().values("name")
            if self._tasks().filter(state=TAKEN, owner__in=dead).exists():
                self.tidy(stale=True)
                return
        if not self._has_ttl or (every and now - _due_checks.get(key, -math.inf) < every):
            return
        _due_checks[key] = now
        if self._tasks().filter(state__in=[DELAYED, TAKEN], event_at__lte=engine.DbNow()).exists():
            self.tidy(stale=False)

    # -- the verbs -------------------------------------------------------------------------

    def put(
        self,
        data: Any,
        pri: int | None = None,
        ttl: float | None = None,
        ttr: float | None = None,
        delay: float | None = None,
        utube: Any = None,
        *,
        run_at: datetime.datetime | None = None,
        with_row: tuple[models.Model, list[str]] | None = None,
        checked: bool = False,
    ) -> Task:
        """Add a task holding ``data`` (any JSON value) and return it (ready, or delayed).

        ``run_at``: an aware datetime before which the task stays delayed (ttl tubes, like
        ``delay``; its ttl still counts from now). ``with_row``: ``(instance, fields)``, an
        unsaved row of another model to write with the task, all or nothing (one statement
        on PostgreSQL), ``fields`` read back from the database into it. ``checked``: the
        caller has already checked ``data`` and the options (the Tasks backend's enqueue, a
        hot path), so put does not check them again.
        """
        if not checked:
            check_json(data, "data")
            options = _check_put_options(pri, ttl, ttr, delay, utube)
            if run_at is not None:
                check_aware(run_at, "run_at")
            task = self._new_task(data, *options)
        else:
            task = self._new_task(data, pri, ttl, ttr, delay, utube)
        if run_at is not None and self._has_ttl:
            task.state, task.event_at = DELAYED, run_at
        # One task: _insert writes it only if the tube is still there, whatever check_exists.
        self._insert([task], along=() if with_row is None else (with_row,))
        return task

    def _insert(
        self,
        tasks: list[Task],
        check_exists: bool = True,
        along: Sequence[tuple[models.Model, list[str]]] = (),
    ) -> None:
        """Write new ``tasks`` as ``put`` does: INSERT … RETURNING (the deadlines the database
        computed) with the wake-up in the same statement. One statement needs no transaction of
        its own, and inside a caller's transaction it simply joins it: one task's INSERT writes
        only if the tube is still there (``engine.insert(only_if=…)``), so it needs no look-up
        first and no savepoint, and a dropped tube raises :class:`NotFound` having written
        nothing. More tasks (a large ``put_many``) share one transaction, all or nothing. No
        counter is written: ``calls.put`` is derived (see :meth:`statistics`).
        ``check_exists=False``: the caller knows the tube exists (for several tasks inside a
        transaction, where a dropped tube would otherwise show only at commit). ``along``: rows
        of other models, each with the fields to read back, written with one task, all or
        nothing (:func:`engine.insert_together`: one statement on PostgreSQL)."""
        using, pk = self._using, self.pk
        chunks = list(engine.batched(tasks, using, per_row=len(Task._meta.concrete_fields)))
        ready = any(task.state == READY for task in tasks)
        returning = ["ttl_at", "event_at"] if self._has_ttl else []
        channel = wakeup.channel(pk) if ready else None
        inside = connections[using].in_atomic_block
        # Outside a transaction the foreign key says at once that the tube is gone (below).
        guard = self if len(tasks) == 1 and inside else None
        check_exists = check_exists and guard is None and inside
        alone = len(chunks) == 1 and not check_exists

        def work() -> bool:
            if check_exists:
                # Foreign keys are checked at commit (Django makes them deferrable): inside a
                # transaction, a put into a dropped tube would fail only at the caller's commit.
                self._ensure_exists()
            if along:
                (task,) = tasks
                rows = [row for row, _ in along]
                names = [names for _, names in along]
                return engine.insert_together(
                    [*rows, task], using, returning=[*names, returning], notify=channel, only_if=guard
                )
            for chunk in chunks:
                if not engine.insert(chunk, using, returning=returning, notify=channel, only_if=guard):
                    return False
            return True

        try:
            written = engine.run_in_transaction(Task, using, work, alone=alone)
        except IntegrityError:
            self._ensure_exists()
            raise
        if not written:
            raise self._gone()
        if ready:
            transaction.on_commit(lambda: wakeup.notify(using, pk), using=using)
        for task in tasks:
            self._emit(task, "put")

    def _new_task(self, data: Any, pri: Any, ttl: Any, ttr: Any, delay: Any, utube: Any) -> Task:
        """Build (not save) a task as ``put`` makes it (deadlines on the database's clock)."""
        task = Task(tube_id=self.pk, data=data, state=READY)
        if self._is_utube:
            task.utube = utube
        if self._has_ttl:
            task.pri = pri if pri is not None else (self.pri or 0)
            ttl = ttl if ttl is not None else self.ttl
            # The default ttr is the tube's ttr, else the tube's ttl (not the task's ttl).
            task.ttr = ttr if ttr is not None else (self.ttr if self.ttr is not None else self.ttl)
            delay = delay if delay and delay > 0 else 0.0
            if delay:
                task.state = DELAYED
                task.event_at = engine.DbNow(min(delay, MAX_SECONDS))
            if ttl is not None:
                # A delay extends the lifetime: a delayed task lives delay + ttl.
                task.ttl_at = engine.DbNow(min(ttl + delay, MAX_SECONDS))
        return task

    def put_many(
        self,
        items: Iterable[Any],
        pri: int | None = None,
        ttl: float | None = None,
        ttr: float | None = None,
        delay: float | None = None,
        utube: Any = None,
    ) -> list[Task]:
        """Add one task per item of ``items`` (JSON values) and return them in ``items``' order.

        The same as one ``put`` per item — same options, validation, events and counters — but
        written with multi-row inserts in one transaction: all or nothing. Nothing is written
        if any item is bad. Deadlines are the database clock read once for the whole batch.
        """
        if isinstance(items, (str, bytes, dict)) or not isinstance(items, Iterable):
            raise TypeError(
                f"items must be a list (or another iterable) of task data, not {type(items).__name__}"
            )
        items = list(items)
        for index, data in enumerate(items):
            check_json(data, f"items[{index}]")
        options = _check_put_options(pri, ttl, ttr, delay, utube)
        if not items:
            return []
        tasks = [self._new_task(data, *options) for data in items]
        self._insert(tasks)
        return tasks

    def take(self, timeout: float | None = 0, consumer: str | None = None) -> Task | None:
        """Take the best ready task for ``consumer`` and return it, or ``None``.

        Always tries once at once; then waits up to ``timeout`` seconds (``None``: forever)
        and wakes promptly when a task becomes ready.
        """
        return self.wait_take(timeout, consumer)

    def wait_take(
        self,
        timeout: float | None = 0,
        consumer: str | None = None,
        *,
        stop: Callable[[], bool] | None = None,
    ) -> Task | None:
        """``take(timeout, consumer)`` that also ends its wait, with ``None``, as soon as
        ``stop()`` returns true (asked after each wake-up): a worker's wait for its next task."""
        timeout = _check_timeout(timeout)
        consumer = _check_consumer(consumer)
        using = self._using
        if (timeout is None or timeout > 0) and connections[using].in_atomic_block:
            raise TaskloopError(
                "take(timeout > 0) cannot wait inside a transaction: it would never see the commit "
                "it waits for; use take(0) there"
            )
        return self._wait_take(timeout, consumer, stop)

    def _wait_take(
        self, timeout: float | None, consumer: str, stop: Callable[[], bool] | None = None
    ) -> Task | None:
        """``take(timeout)``; a worker passes ``stop``, which ends the wait when it says so."""
        using = self._using
        end = None if timeout is None else time.monotonic() + timeout
        tasks = self._take(1, consumer)
        if tasks or timeout == 0:
            return tasks[0] if tasks else None
        waiter = wakeup.Waiter(using, self.pk)
        try:
            registration = TubeWaiter.objects.using(using).register(self, consumer, timeout)
            try:
                # One more try now that the waiter listens: a task made ready since the first
                # try is either taken here or wakes the sleep below.
                tasks = self._take(1, consumer)
                while not tasks:
                    left = None if end is None else end - time.monotonic()
                    if (left is not None and left <= 0) or (stop is not None and stop()):
                        return None
                    waiter.sleep(left)
                    registration.refresh()
                    # Woken by a change or by the clock: one cheap read says whether a take
                    # may find something (or has due transitions to apply).
                    worth = self._worth_trying()
                    if worth:
                        tasks = self._take(1, consumer, checked=worth == "ready")
                return tasks[0]
            finally:
                registration.close()
        finally:
            waiter.close()

    def _worth_trying(self) -> str:
        """Say whether a take may find something now: one read, for waiting takes (see
        :func:`worth_trying`). Raises :class:`NotFound` if the tube is gone."""
        worth = worth_trying([self])
        if self.pk not in worth:
            raise self._gone()
        return worth[self.pk]

    def _worth(self, stale: bool) -> tuple[Q | None, Q]:
        """On tube rows: this tube, not paused, with a transition due (a delay or ttr ran out;
        with ``stale``, a dead consumer holds a task; ``None`` if nothing can be); the same with
        something claimable."""
        tasks = Task.objects.filter(tube_id=self.pk)
        due = []
        if self._has_ttl:
            # (What _tidy_for_take applies: a ready task past its ttl is not worth a take.)
            due.append(Exists(tasks.filter(state__in=[DELAYED, TAKEN], event_at__lte=engine.DbNow())))
        if stale:
            dead = Consumer.objects.dead().values("name")
            due.append(Exists(tasks.filter(state=TAKEN, owner__in=dead)))
        paused = operating.PausedQueue.objects.filter(kind="task", queue=self.name)
        this = Q(pk=self.pk) & ~Q(Exists(paused))
        ready = this & Q(Exists(tasks.filter(self._claimable())))
        return (this & Q(*due, _connector=Q.OR) if due else None), ready

    def take_many(self, limit: int, consumer: str | None = None, *, checked: bool = False) -> list[Task]:
        """Take up to ``limit`` ready tasks at once for ``consumer`` (no waiting).

        ``checked``: the caller has just read :func:`worth_trying` for this tube and got
        ``"ready"`` (not paused, no transition due), so the take skips those two looks.
        """
        limit = check_count(limit, "limit", minimum=1)
        return self._take(limit, _check_consumer(consumer), checked=bool(checked))

    def _claimable(self) -> Q:
        claimable = Q(state=READY)
        if self._has_ttl:
            claimable &= _alive()
        else:
            # fifo/utube tasks all have pri 0: saying so lets the (tube, state, pri, id) index
            # serve the id order.
            claimable &= Q(pri=0)
        if self._is_utube:
            # Only the head of a sub-queue is claimable: no task of it is taken, and no ready
            # one comes before it. Two consumers then aim at the same row (one wins under
            # SKIP LOCKED) instead of at two rows of one sub-queue, which the unique
            # taken_key would refuse only after one waited for the other's commit.
            alive = _alive() if self._has_ttl else Q()
            before = Q(pri__lt=OuterRef("pri")) | Q(pri=OuterRef("pri"), id__lt=OuterRef("id"))
            ahead = Q(state=TAKEN) | Q(alive, before, state=READY)
            siblings = Task.objects.filter(tube_id=self.pk)
            claimable &= Q(utube__isnull=True) & ~Exists(siblings.filter(ahead, utube__isnull=True)) | Q(
                utube__isnull=False
            ) & ~Exists(siblings.filter(ahead, utube=OuterRef("utube")))
        return claimable

    def _order(self) -> list[str]:
        # fifo/utube tasks all have pri 0, so this is their id order; saying pri too lets the
        # claim index serve it (PostgreSQL would otherwise walk the primary key and filter).
        return list(_TAKE_ORDER)

    def ack_and_take(
        self, task_ids: Iterable[int], limit: int, consumer: str | None = None
    ) -> tuple[int, list[Task]]:
        """Finish the tasks of ``task_ids`` that ``consumer`` holds and take up to ``limit``
        ready ones, in one transaction: what a worker does between two batches (one commit and
        one counter write instead of two of each). Return ``(acknowledged, taken)``."""
        ids = _check_task_ids(task_ids)
        limit = check_count(limit, "limit")
        consumer = _check_consumer(consumer)
        return self._take(limit, consumer, ack=ids, due_every=_WORKER_DUE_CHECK_EVERY)

    def _take(
        self,
        limit: int,
        consumer: str,
        ack: list[int] | None = None,
        due_every: float = 0.0,
        checked: bool = False,
    ) -> Any:
        """Take up to ``limit`` tasks; with ``ack``, first finish those (and return both).
        ``checked``: a read of worth_trying() just found the tube not paused and nothing due,
        so neither needs another look."""
        self._beat(consumer)
        if not limit or (not checked and operating.is_paused("task", self.name, self._using, fresh=False)):
            # Paused: hand out nothing (a waiting take keeps waiting, polling the pause).
            if ack is None:
                self._ensure_exists()
                return []
            return self.ack_many(ack, consumer), []
        if not checked:
            self._tidy_for_take(due_every)
        spec = self._claim_spec(limit, consumer).prepared()
        watched = (self._using, self.pk) in _callbacks
        if ack and not watched:
            # PostgreSQL: the acknowledgement, the claim and the counters as one statement.
            together = self._ack_and_claim_at_once(spec, ack, consumer)
            if together is not None:
                return together
        return self._claim_with_retries(spec, consumer, ack, watched)

    def _claim_spec(self, limit: int, consumer: str) -> engine.ClaimSpec:
        """What a take claims and writes. A batch claim of a fifo tube may be one kept
        statement (the engine's choice): its filter and changes are then built once, when
        it is compiled. utube: the claimable rows are the sub-queue heads, so one batch never
        holds two tasks of one sub-queue. A batch claim scans the claim index itself (no
        candidate read first): with SKIP LOCKED it finds free rows past what rivals hold."""

        def changes() -> dict[str, Any]:
            # attempts counts takes, so that a worker can bury a task that keeps failing.
            changes: dict[str, Any] = {"state": TAKEN, "owner": consumer, "attempts": F("attempts") + 1}
            if self._has_ttl:
                changes["event_at"] = _taken_deadline()
            if self._is_utube:
                changes["taken_key"] = _taken_key()
            return changes

        return engine.ClaimSpec(
            self._tasks(),
            limit=limit,
            claimable=self._claimable,
            order_by=self._order(),
            changes=changes,
            key=None if self._is_utube else self._kept_key("take", consumer),
            direct=limit > 1,
        )

    def _ack_and_claim_at_once(
        self, spec: engine.ClaimSpec, ack: list[int], consumer: str
    ) -> tuple[int, list[Task]] | None:
        """Acknowledge ``ack`` and claim ``spec`` in one statement where the engine can;
        ``None`` where it cannot."""
        together = engine.ack_and_claim(
            spec,
            ack,
            where=lambda: self._held(consumer),
            delete_key=self._kept_key("held", consumer),
            counters=(TubeStat, {"tube_id": self.pk, "slot": _slot()}, _BATCH_COUNTERS),
        )
        if together is None:
            return None
        acked, tasks, counted = together
        if not counted:
            # No counter rows (a tube made without create_tube): make them, and count.
            self._count(take=len(tasks), ack=acked, done=acked)
        if not tasks and not acked:
            self._ensure_exists()
        return acked, tasks

    def _claim_with_retries(
        self, spec: engine.ClaimSpec, consumer: str, ack: list[int] | None, watched: bool
    ) -> Any:
        """Acknowledge ``ack`` (if any) and claim ``spec`` in one transaction, looking again
        when utube's unique ``taken_key`` refuses a claim."""

        def work() -> tuple[int, engine.Claimed]:
            acked = self._ack_rows(ack, consumer) if ack else 0
            claimed = spec.run(later=True)
            self._count(take=len(claimed), ack=acked, done=acked)
            if watched:
                for task in claimed.instances():
                    self._emit(task, "take")
            # Otherwise the rows become Task instances after the commit (engine.claim's later).
            return acked, claimed

        # An acknowledgement that deletes at once writes first: no write lock to take before it.
        writes_first = bool(ack) and not watched
        for attempt in range(5):
            try:
                acked, claimed = self._run(work, lock_first=not writes_first)
            except IntegrityError:
                # utube: a rival took another task of the same sub-queue first (the unique
                # taken_key refused ours), or a stale holder still blocks it. Look again.
                if attempt >= 1:
                    self.tidy()
                continue
            tasks = claimed.instances()
            if not tasks and not acked:
                self._ensure_exists()
            return tasks if ack is None else (acked, tasks)
        return [] if ack is None else (self.ack_many(ack, consumer), [])

    def ack(self, task_id: int, consumer: str | None = None) -> Task:
        """Finish the task ``consumer`` holds: remove it and return it with state ``"-"``."""
        task_id = _check_task_id(task_id)
        consumer = _check_consumer(consumer)
        self._beat(consumer, register=False)

        def work() -> Task:
            # Fast path: the row as read, then a delete that re-checks the hold itself (the
            # data it returns cannot change while the task is taken).
            task = self._tasks().filter(pk=task_id).first()
            if task is None or not engine.delete_rows(self._tasks().filter(self._held(consumer), pk=task_id)):
                # Not held (or a timer is due): the slow path applies what is due and says why.
                task = self._owned(task_id, consumer)
                engine.delete_rows(self._tasks().filter(pk=task.pk))
            self._count(ack=1, done=1)
            task.state, task.owner, task.taken_key = DONE, None, None
            self._emit(task, "delete")
            return task

        return self._run(work)

    def _kept_key(self, what: str, consumer: str) -> tuple[Any, ...]:
        """The name of an engine-kept statement of this tube for ``consumer`` ("take": the
        claim, "held": the acknowledgement's filter): everything it depends on, the type
        deciding the rest."""
        return ("tube", what, self.pk, self.type, consumer)

    def _held(self, consumer: str) -> Q:
        """Tasks ``consumer`` holds now (for ttl drivers: whose ttr has not run out)."""
        held = Q(state=TAKEN, owner=consumer)
        if self._has_ttl:
            held &= Q(event_at__isnull=True) | Q(event_at__gt=engine.DbNow())
        return held

    def ack_many(self, task_ids: Iterable[int], consumer: str | None = None) -> int:
        """Finish every task of ``task_ids`` that ``consumer`` holds; return how many."""
        ids = _check_task_ids(task_ids)
        consumer = _check_consumer(consumer)
        if not ids:
            return 0
        self._beat(consumer, register=False)

        def work() -> int:
            total = self._ack_rows(ids, consumer)
            if total:
                self._count(ack=total, done=total)
            else:
                self._ensure_exists()
            return total

        return self._run(work)

    def _ack_rows(self, ids: list[int], consumer: str) -> int:
        """Delete the tasks of ``ids`` that ``consumer`` holds (in the current transaction)."""
        if (self._using, self.pk) not in _callbacks:
            # The hot path of a worker's batches: one DELETE whose filter is compiled once.
            return engine.delete_pks(
                self._tasks(),
                ids,
                where=lambda: self._held(consumer),
                key=self._kept_key("held", consumer),
            )
        held = self._held(consumer)
        total = 0
        for chunk in engine.batched(ids, self._using):
            tasks = list(self._tasks().filter(held, pk__in=chunk).select_for_update())
            total += engine.delete_rows(self._tasks().filter(pk__in=[t.pk for t in tasks]))
            for task in tasks:
                task.state, task.owner, task.taken_key = DONE, None, None
                self._emit(task, "delete")
        return total

    def release(self, task_id: int, delay: float | None = None, consumer: str | None = None) -> Task:
        """Give back the task ``consumer`` holds: ready again, or delayed by ``delay`` seconds."""
        task_id = _check_task_id(task_id)
        delay = check_seconds(delay, "delay", allow_none=True)
        consumer = _check_consumer(consumer)
        self._beat(consumer, register=False)

        def work() -> Task:
            task = self._owned(task_id, consumer)
            changes: dict[str, Any] = {"state": READY, "owner": None, "taken_key": None, "event_at": None}
            if self._has_ttl and delay and delay > 0:
                changes["state"] = DELAYED
                changes["event_at"] = engine.DbNow(delay)
                # The delay extends the lifetime, as at put.
                changes["ttl_at"] = engine.Shifted(delay, F("ttl_at"))
            self._tasks().filter(pk=task.pk).update(**changes)
            self._count(release=1)
            task.refresh_from_db(using=self._using)
            if task.state == READY:
                self._wake()
            self._emit(task, "release")
            return task

        return self._run(work)

    def release_many(self, task_ids: Iterable[int], consumer: str | None = None) -> int:
        """Give back (ready, no delay) every task of ``task_ids`` that ``consumer`` holds."""
        ids = _check_task_ids(task_ids)
        consumer = _check_consumer(consumer)
        if not ids:
            return 0
        self._beat(consumer, register=False)
        held = self._held(consumer)

        def work() -> int:
            total = 0
            for chunk in engine.batched(ids, self._using):
                tasks = list(self._tasks().filter(held, pk__in=chunk).select_for_update())
                total += (
                    self._tasks()
                    .filter(pk__in=[t.pk for t in tasks])
                    .update(state=READY, owner=None, taken_key=None, event_at=None)
                )
                for task in tasks:
                    task.state, task.owner, task.taken_key, task.event_at = READY, None, None, None
                    self._emit(task, "release")
            if total:
                self._count(release=total)
                self._wake()
            else:
                self._ensure_exists()
            return total

        return self._run(work)

    def touch(self, task_id: int, increment: float | None, consumer: str | None = None) -> Task:
        """Give the task ``consumer`` holds ``increment`` more seconds of ttr and ttl.

        ``None``, 0 or a negative increment returns the task unchanged (no ownership check).
        """
        task_id = _check_task_id(task_id)
        increment = check_seconds(increment, "increment", allow_none=True)
        consumer = _check_consumer(consumer)
        if not increment or increment <= 0:
            return self.peek(task_id)
        self._beat(consumer, register=False)

        def work() -> Task:
            task = self._owned(task_id, consumer)
            if not self._has_ttl:
                raise TubeError(f"{self.type} tube does not support touch")
            self._tasks().filter(pk=task.pk).update(**_touched(increment))
            self._count(touch=1)
            task.refresh_from_db(using=self._using)
            self._emit(task, "touch")
            return task

        return self._run(work)

    def touch_many(self, task_ids: Iterable[int], increment: float, consumer: str | None = None) -> int:
        """:meth:`touch` each task of ``task_ids`` that ``consumer`` still holds by ``increment``
        seconds, in one statement: a worker's heartbeat for its tasks in flight. Tasks it no
        longer holds are left alone, no error; on fifo/utube tubes (no ttr) and with ``None``,
        0 or a negative increment nothing is touched. Return how many were touched."""
        ids = _check_task_ids(task_ids)
        seconds = check_seconds(increment, "increment", allow_none=True)
        consumer = _check_consumer(consumer)
        if seconds is None or seconds <= 0:
            return 0  # as touch(): no increment is no change
        return self._touch_held(ids, seconds, consumer)

    def _touch_held(self, task_ids: list[int], increment: float, consumer: str) -> int:
        """:meth:`touch` each task of ``task_ids`` that ``consumer`` still holds by
        ``increment`` seconds, in one statement: a worker's heartbeat for its tasks in flight.
        Tasks it no longer holds (acknowledged, released, or whose ttr ran out) are left
        alone. Return how many were touched."""
        if not task_ids or not self._has_ttl:
            return 0
        if (self._using, self.pk) in _callbacks:
            # Watched: each touch is told, with the task as it is after it.
            touched = 0
            for task_id in task_ids:
                try:
                    self.touch(task_id, increment, consumer=consumer)
                    touched += 1
                except (NotTaken, NotFound):
                    pass
            return touched
        self._beat(consumer)
        held = self._held(consumer)

        def work() -> int:
            touched = sum(
                self._tasks().filter(held, pk__in=chunk).update(**_touched(increment))
                for chunk in engine.batched(task_ids, self._using)
            )
            self._count(touch=touched)
            return touched

        return self._run(work, lock_first=False)

    def edit_task(self, task_id: int, **changes: Any) -> int:
        """Write ``changes`` (``pri``, ``data``) to a task of this tube unless it is taken;
        return 1, or 0 if it is taken or gone.

        Tarantool has no verb for this (the admin's edit form and priority action use it). The
        state check and the write happen under one write lock, so that a take cannot slip in
        between: a consumer never sees its task change.
        """
        task_id = _check_task_id(task_id)
        unknown = set(changes) - {"pri", "data"}
        if unknown:
            raise TypeError(f"edit_task() can change pri and data, not {', '.join(sorted(unknown))}")
        if "pri" in changes:
            _check_pri(changes["pri"], allow_none=False)
        if "data" in changes:
            check_json(changes["data"], "data")

        def work() -> int:
            return self._tasks().filter(~Q(state=TAKEN), pk=task_id).update(**changes)

        return self._run(work)

    def peek(self, task_id: int) -> Task:
        """Return the task as it is now; :class:`NotFound` if there is none."""
        task_id = _check_task_id(task_id)
        return self._existing(task_id, lock=False)

    def bury(self, task_id: int) -> Task:
        """Bury the task (any state, no ownership needed) and return it."""
        task_id = _check_task_id(task_id)

        def work() -> Task:
            task = self._existing(task_id, lock=True)
            if task.state == BURIED:
                return task
            self._tasks().filter(pk=task.pk).update(state=BURIED, owner=None, taken_key=None, event_at=None)
            self._count(bury=1)
            task.state, task.owner, task.taken_key, task.event_at = BURIED, None, None, None
            if self._is_utube:
                self._wake()  # its sub-queue may be free now
            self._emit(task, "bury")
            return task

        return self._run(work)

    def kick(self, count: int = 1) -> int:
        """Return up to ``count`` buried tasks to ready, best first; return how many."""
        count = check_count(count, "count")
        if count == 0:
            self._ensure_exists()
            return 0

        def work() -> int:
            self._ensure_exists()
            # Best first, skipping buried tasks a rival is changing; each comes back ready.
            tasks = engine.claim(
                self._tasks().buried(),
                limit=count,
                claimable=Q(),
                order_by=self._order(),
                changes={"state": READY},
                fetch=True,
                direct=True,
            )
            if not tasks:
                return 0
            self._count(kick=len(tasks))
            for task in tasks:
                self._emit(task, "kick")
            self._wake()
            return len(tasks)

        return self._run(work)

    def kick_task(self, task_id: int) -> Task:
        """Return the chosen buried task to ready and return it (``TubeError`` if not buried)."""
        task_id = _check_task_id(task_id)

        def work() -> Task:
            task = self._existing(task_id, lock=True)
            if task.state != BURIED:
                raise TubeError(f"task {task_id} of tube {self.name!r} is not buried (state {task.state!r})")
            self._tasks().filter(pk=task.pk).update(state=READY)
            self._count(kick=1)
            task.state = READY
            self._emit(task, "kick")
            self._wake()
            return task

        return self._run(work)

    def pause(self) -> None:
        """Stop handing out tasks (take/take_many give nothing, workers claim nothing) until
        :meth:`resume`; put, ack, release and every other verb still work. Twice is a no-op."""
        self._ensure_exists()
        operating.pause("task", self.name, self._using)

    def resume(self) -> None:
        """Hand out tasks again after :meth:`pause`."""
        operating.resume("task", self.name, self._using)
        self._wake()

    @property
    def paused(self) -> bool:
        """Whether the tube is paused (read from the database)."""
        return operating.is_paused("task", self.name, self._using)

    def delete_task(self, task_id: int) -> Task:
        """Remove the task (any state, no ownership needed); return it with state ``"-"``."""
        task_id = _check_task_id(task_id)

        def work() -> Task:
            task = self._existing(task_id, lock=True)
            engine.delete_rows(self._tasks().filter(pk=task.pk))
            self._count(delete=1, done=1)
            if task.state == TAKEN and self._is_utube:
                self._wake()
            task.state, task.owner, task.taken_key = DONE, None, None
            self._emit(task, "delete")
            return task

        return self._run(work)

    def truncate(self) -> int:
        """Remove every task (taken ones too, with their ownership); return how many."""
        self.tidy(stale=False)

        def work() -> int:
            self._ensure_exists()
            removed = engine.delete_rows(self._tasks())
            # Not a call counter: it keeps the derived calls.put right (see statistics()).
            self._count(truncated=removed)
            return removed

        return self._run(work)

    def drop(self) -> bool:
        """Remove the tube, its tasks and its counters; refuse while tasks are taken or
        consumers wait."""
        self.tidy()

        def work() -> bool:
            if Tube.objects.using(self._using).select_for_update().filter(pk=self.pk).first() is None:
                raise self._gone()
            if self._tasks().filter(state=TAKEN).exists():
                raise TubeError(f"there are taken tasks in tube {self.name!r}")
            if TubeWaiter.objects.using(self._using).waiting(self.pk).exists():
                raise TubeError(f"there are consumers waiting on tube {self.name!r}")
            engine.delete_rows(self._tasks())
            engine.delete_rows(TubeStat.objects.using(self._using).filter(tube_id=self.pk))
            engine.delete_rows(TubeWaiter.objects.using(self._using).filter(tube_id=self.pk))
            engine.delete_rows(Tube.objects.using(self._using).filter(pk=self.pk))
            return True

        self._run(work)
        _callbacks.pop((self._using, self.pk), None)
        return True

    def statistics(self, *, apply_transitions: bool = True) -> dict[str, dict[str, int]]:
        """Return Tarantool's statistics: ``{"tasks": {...}, "calls": {...}}``.

        Like Tarantool, it first applies the transitions that are due (delays and ttrs that ran
        out, dead consumers' tasks). ``apply_transitions=False`` only reads — what a page view
        wants: tasks whose delay or ttr ran out are then still counted where they are, and
        ``tasks["overdue"]`` says how many of them there are; tasks past their ttl are counted
        in no state but in ``tasks["expired"]`` (the next call removes them).
        """
        if apply_transitions:
            self.tidy()
        counts = self._tasks().state_counts()
        sums = TubeStat.objects.using(self._using).filter(tube_id=self.pk).sums()
        tasks = {name: counts[name] for name in ("taken", "buried", "ready", "delayed")}
        tasks["done"] = sums["done"]
        tasks["total"] = tasks["taken"] + tasks["buried"] + tasks["ready"] + tasks["delayed"]
        if not apply_transitions:
            # Still rows, so still in calls.put, but counted in no state: the next call removes them.
            tasks["expired"] = counts["expired"]
            tasks["overdue"] = self._tasks().overdue().order_by().count()
        return {"tasks": tasks, "calls": calls_from(sums, tasks["total"] + counts["expired"])}

    def on_task_change(
        self, callback: Callable[[Task, str], Any] | None
    ) -> Callable[[Task, str], Any] | None:
        """Call ``callback(task, event)`` after each committed change made by this process;
        return the previous callback. ``None`` clears it."""
        if callback is not None and not callable(callback):
            raise TypeError("callback must be callable or None")
        key = (self._using, self.pk)
        previous = _callbacks.get(key)
        if callback is None:
            _callbacks.pop(key, None)
        else:
            _callbacks[key] = callback
        return previous


class TaskQuerySet(models.QuerySet["Task"]):
    """Named states of tasks, read with the database's clock: the single definition of each,
    used by ``statistics()``, the admin and the metrics.

    A task past its ttl deadline is :meth:`expired` whatever state it is stored in (a taken
    one's ttr deadline is never later than its ttl: it would go back to ready, then be
    removed), and in no other state.
    """

    def ready(self) -> TaskQuerySet:
        """Tasks a take may get (utube: if their sub-queue is free)."""
        return self.filter(_alive(), state=READY)

    def taken(self) -> TaskQuerySet:
        return self.filter(_alive(), state=TAKEN)

    def delayed(self) -> TaskQuerySet:
        return self.filter(_alive(), state=DELAYED)

    def buried(self) -> TaskQuerySet:
        return self.filter(_alive(), state=BURIED)

    def expired(self) -> TaskQuerySet:
        """Tasks past their ttl deadline, not removed yet (the next call on the tube does)."""
        return self.filter(_expired())

    def overdue(self) -> TaskQuerySet:
        """Taken or delayed tasks whose ttr or delay ran out, not applied yet (the next call
        on the tube makes them ready)."""
        return self.filter(_alive(), state__in=[TAKEN, DELAYED], event_at__lte=engine.DbNow())

    def in_claim_order(self) -> TaskQuerySet:
        """These tasks in the order takes hand them out: priority, then id (put order)."""
        return self.order_by(*_TAKE_ORDER)

    def in_state(self, name: str) -> TaskQuerySet:
        """The tasks in state ``name``, one of :data:`TASK_STATES`."""
        if name not in TASK_STATES:
            raise ValueError(f"name must be one of {', '.join(TASK_STATES)}, not {name!r}")
        return getattr(self, name)()

    def state_counts(self) -> dict[str, int]:
        """Return ``{state: number of tasks}`` for every name of :data:`TASK_STATES` (one read)."""
        counts = dict.fromkeys(TASK_STATES, 0)
        names = {code: name for name, code in STORED_STATES.items()}
        rows = (
            self.order_by()
            .values("state")
            .annotate(n=Count("pk"), expired=Count("pk", filter=_expired()))
            .values_list("state", "n", "expired")
        )
        for state, n, expired in rows:
            counts["expired"] += expired
            if state in names:
                counts[names[state]] += n - expired
        return counts


class Task(models.Model):
    """A task of a tube: ``state`` is ``"r"`` ready, ``"t"`` taken, ``"!"`` buried, ``"~"`` delayed
    (``"-"`` done, on the objects that ack and delete_task return)."""

    STATES = [(READY, "ready"), (TAKEN, "taken"), (DONE, "done"), (BURIED, "buried"), (DELAYED, "delayed")]

    id = models.BigAutoField(primary_key=True)
    # No separate index: every composite index below starts with the tube.
    tube = models.ForeignKey(Tube, on_delete=models.CASCADE, related_name="tasks", db_index=False)
    state = models.CharField(max_length=1, choices=STATES, default=READY)
    pri = models.IntegerField(default=0)
    utube = models.CharField(max_length=255, null=True, blank=True)
    #: The consumer holding the task (taken tasks only).
    owner = models.CharField(max_length=255, null=True, blank=True)
    #: Set only while a utube task is taken; unique per tube, so a sub-queue can never have two
    #: taken tasks, whatever the isolation level or the race.
    taken_key = models.CharField(max_length=256, null=True, blank=True, editable=False)
    #: When the task expires (ttl drivers; NULL: never).
    ttl_at = models.DateTimeField(null=True, blank=True)
    #: The next timer: when a delayed task becomes ready, or a taken one's ttr runs out.
    event_at = models.DateTimeField(null=True, blank=True)
    #: Time to run of a take (seconds; NULL: infinite).
    ttr = models.FloatField(null=True, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    data = models.JSONField(null=True, blank=True)
    #: Times the task has been taken (workers bury it after TASKLOOP["MAX_ATTEMPTS"] failures).
    attempts = models.PositiveIntegerField(default=0, editable=False)

    objects = TaskQuerySet.as_manager()

    class Meta:
        app_label = "django_taskloop"
        db_table = "taskloop_task"
        indexes = [
            # The claim order of every driver: (pri, id) for fifottl/utubettl, and id for
            # fifo/utube whose tasks all have pri 0; also kick's order.
            models.Index(fields=["tube", "state", "pri", "id"], name="taskloop_task_claim"),
            # Due timers: delayed and taken tasks by event_at. Partial (PostgreSQL, SQLite), as
            # the next two: a task without a timer, a ttl or a sub-queue is not in them, and
            # its put, take and ack write no entry there.
            engine.PartialIndex(
                fields=["tube", "state", "event_at"],
                name="taskloop_task_event",
                where=Q(event_at__isnull=False),
            ),
            engine.PartialIndex(
                fields=["tube", "ttl_at"], name="taskloop_task_ttl", where=Q(ttl_at__isnull=False)
            ),
            # A utube task's siblings, for "is it the head of its sub-queue?".
            engine.PartialIndex(
                fields=["tube", "utube", "id"], name="taskloop_task_utube", where=Q(utube__isnull=False)
            ),
            # The admin's date-range filter on created: without it a range that matches few
            # rows scans the whole table (1.5 s at a million tasks on MariaDB).
            models.Index(fields=["created"], name="taskloop_task_created"),
            # One taken task per utube sub-queue. Only taken utube tasks have a taken_key:
            # partial (PostgreSQL, SQLite), the others write no entry when put or acknowledged.
            engine.PartialIndex(
                fields=["tube", "taken_key"],
                name="taskloop_task_utube_taken",
                where=Q(taken_key__isnull=False),
                unique=True,
            ),
        ]

    def __str__(self) -> str:
        names = {READY: "ready", TAKEN: "taken", DELAYED: "delayed", BURIED: "buried", DONE: "done"}
        return f"task {self.pk} ({names.get(self.state, self.state)})"

    def current_state(self, now: Any = None) -> str:
        """Return what the task is at ``now`` (default: the database's clock): a name of
        :data:`TASK_STATES` (as :class:`TaskQuerySet` defines them), or ``"done"``."""
        if self.state == DONE:
            return "done"
        if self.ttl_at is not None:
            if now is None:
                now = engine.db_now(self._state.db or "default")
            if self.ttl_at <= now:
                return "expired"
        return {code: name for name, code in STORED_STATES.items()}.get(self.state, self.state)


def calls_from(sums: dict[str, int], rows: int) -> dict[str, int]:
    """Return ``statistics()["calls"]`` from a tube's summed counters and its number of tasks.

    ``put`` is derived rather than counted, so that a put writes nothing but its task: every
    task put is still in the tube, or was removed by a count of ``done`` (ack, delete, ttl), or
    by ``truncate`` (counted apart, since truncate changes no call counter). A put rolled back
    leaves no task, so no count either.
    """
    calls = {name: sums[_COLUMN[name]] for name in CALLS if name != "put"}
    calls["put"] = rows + sums["done"] + sums["truncated"]
    return {name: calls[name] for name in CALLS}


class TubeStatQuerySet(models.QuerySet["TubeStat"]):
    def sums(self) -> dict[str, int]:
        """Sum the counter slots: every call counter but ``put``, ``done`` and ``truncated``."""
        columns = [_COLUMN[name] for name in CALLS if name != "put"] + ["done", "truncated"]
        sums = self.aggregate(**{column: Sum(column) for column in columns})
        return {column: int(value or 0) for column, value in sums.items()}


class TubeStat(models.Model):
    """One counter slot of a tube; ``statistics()`` sums a tube's slots."""

    tube = models.ForeignKey(Tube, on_delete=models.CASCADE, related_name="+", db_index=False)
    slot = models.PositiveSmallIntegerField()
    ack = models.BigIntegerField(default=0)
    bury = models.BigIntegerField(default=0)
    deleted = models.BigIntegerField(default=0)
    kick = models.BigIntegerField(default=0)
    release = models.BigIntegerField(default=0)
    take = models.BigIntegerField(default=0)
    touch = models.BigIntegerField(default=0)
    ttl = models.BigIntegerField(default=0)
    ttr = models.BigIntegerField(default=0)
    delay = models.BigIntegerField(default=0)
    done = models.BigIntegerField(default=0)
    #: Tasks removed by truncate (which counts no call): keeps the derived ``put`` right.
    truncated = models.BigIntegerField(default=0)

    objects = TubeStatQuerySet.as_manager()

    class Meta:
        app_label = "django_taskloop"
        db_table = "taskloop_tube_stat"
        constraints = [models.UniqueConstraint(fields=["tube", "slot"], name="taskloop_tube_stat_slot")]

    def __str__(self) -> str:
        return f"counters of tube {self.tube_id}, slot {self.slot}"


class ConsumerQuerySet(models.QuerySet["Consumer"]):
    def dead(self) -> ConsumerQuerySet:
        """Consumers whose last heartbeat is older than ``CONSUMER_TIMEOUT``."""
        return self.filter(last_seen__lt=engine.DbNow(-float(setting("CONSUMER_TIMEOUT"))))

    def beat(self, name: str, register: bool = True) -> None:
        """Record a heartbeat of consumer ``name`` (database time). Without ``register``, only
        refresh the heartbeat of a consumer already known: one never seen is not added."""
        key, now = (self.db, name), time.monotonic()
        # Remember the beat only once it is durable: a rolled-back beat must be written again.
        remember = lambda: _beats.__setitem__(key, now)  # noqa: E731
        # Usually the row is there: one UPDATE on its own (an idle worker beats on and on).
        update = lambda: self.filter(name=name).update(last_seen=engine.DbNow())  # noqa: E731
        if engine.run_in_transaction(self.model, self.db, update, alone=True):
            transaction.on_commit(remember, using=self.db)
            return
        if not register:
            return

        def work() -> None:
            if self.filter(name=name).update(last_seen=engine.DbNow()):
                return
            try:
                with transaction.atomic(using=self.db):
                    self.create(name=name, last_seen=engine.DbNow())
            except IntegrityError:
                self.filter(name=name).update(last_seen=engine.DbNow())

        # Through the engine: on SQLite many writers can keep the database locked for a while,
        # and a heartbeat must be retried like any other write, not fail the caller's take().
        engine.run_in_transaction(self.model, self.db, work)
        transaction.on_commit(remember, using=self.db)

    def forget_dead(self) -> int:
        """Delete dead consumers that hold no task; return how many."""
        holding = Task.objects.using(self.db).filter(state=TAKEN, owner=OuterRef("name"))
        return self.dead().filter(~Exists(holding)).delete()[0]


class Consumer(models.Model):
    """A tube consumer's heartbeat: its taken tasks go back to ready once it stops beating."""

    name = models.CharField(max_length=255, unique=True)
    last_seen = models.DateTimeField(db_index=False)

    objects = ConsumerQuerySet.as_manager()

    class Meta:
        app_label = "django_taskloop"
        db_table = "taskloop_consumer"
        indexes = [models.Index(fields=["last_seen"], name="taskloop_consumer_seen")]

    def __str__(self) -> str:
        return self.name


class _Registration:
    """A waiting take's row in :class:`TubeWaiter`, refreshed while it waits."""

    #: Seconds a registration lasts without refresh: a crashed waiter blocks drop this long.
    LEASE = 30.0

    def __init__(self, row: TubeWaiter, timeout: float | None, using: str) -> None:
        self.row, self.using = row, using
        self.end = None if timeout is None else time.monotonic() + timeout
        self.refreshed = time.monotonic()

    def _lease(self) -> float:
        left = self.LEASE if self.end is None else self.end - time.monotonic()
        return max(0.001, min(self.LEASE, left))

    def refresh(self) -> None:
        if time.monotonic() - self.refreshed > self.LEASE / 3:
            self.refreshed = time.monotonic()
            TubeWaiter.objects.using(self.using).filter(pk=self.row.pk).update(
                until=engine.DbNow(self._lease())
            )

    def close(self) -> None:
        engine.delete_rows(TubeWaiter.objects.using(self.using).filter(pk=self.row.pk))


class TubeWaiterQuerySet(models.QuerySet["TubeWaiter"]):
    def register(self, tube: Tube, consumer: str, timeout: float | None) -> _Registration:
        registration = _Registration(None, timeout, self.db)  # type: ignore[arg-type]
        registration.row = self.create(
            tube_id=tube.pk, consumer=consumer, until=engine.DbNow(registration._lease())
        )
        return registration

    def waiting(self, tube_id: int) -> TubeWaiterQuerySet:
        return self.filter(tube_id=tube_id, until__gt=engine.DbNow())


class TubeWaiter(models.Model):
    """A consumer blocked in ``take(timeout)``; ``drop()`` refuses while there are any."""

    tube = models.ForeignKey(Tube, on_delete=models.CASCADE, related_name="+", db_index=False)
    consumer = models.CharField(max_length=255)
    until = models.DateTimeField()

    objects = TubeWaiterQuerySet.as_manager()

    class Meta:
        app_label = "django_taskloop"
        db_table = "taskloop_tube_waiter"
        indexes = [models.Index(fields=["tube", "until"], name="taskloop_tube_waiter_until")]

    def __str__(self) -> str:
        return f"{self.consumer} waiting on tube {self.tube_id}"
