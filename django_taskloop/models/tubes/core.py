"""The core of a tube, what both of its sides stand on: its row, the helpers every verb uses
(its tasks, its transaction, its counters, its events and wake-ups), a task as it is now
(``peek``), and the tube's time-driven transitions (``tidy``).

Its two sides are :class:`~.claiming.TubeClaiming` (a consumer's verbs: take, ack, release,
touch, bury) and :class:`~.operating.TubeOperating` (a producer's and an operator's: put, kick,
pause, delete, drop, statistics); :class:`~.tube.Tube` is both. What they use of the core is
its fields, :attr:`TubeCore.using`, ``peek``, ``tidy``, ``on_task_change`` and these helpers:
``_has_ttl`` and ``_is_utube`` (the driver), ``_tasks`` (the tube's tasks), ``_run`` (a write
transaction), ``_count`` (the counters), ``_emit`` and ``_wake`` (a change's event and wake-up),
``_gone`` and ``_ensure_exists`` (a dropped tube), ``_row`` and ``_existing`` (a task as it is
now), and ``_callbacks`` (whether this process watches a tube's changes).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, TypeVar

from django.core.validators import MinValueValidator
from django.db import models, transaction
from django.db.models import Q

from ... import engine, wakeup
from ...exceptions import NotFound
from ...validation import Rate
from .definitions import (
    BURIED,
    COLUMN,
    DELAYED,
    DONE,
    READY,
    SLOTS,
    TAKEN,
    TTL_TYPES,
    TUBE_TYPES,
    UTUBE_TYPES,
    slot,
)
from .records import Consumer, Task, TaskQuerySet, TubeStat, check_task_id

T = TypeVar("T")

# -- per-process state ---------------------------------------------------------------------

#: Each tube's ``on_task_change`` callback, by (database, tube id).
_callbacks: dict[tuple[str, int], Callable[[Task, str], Any]] = {}
#: Each tube's base queryset of its tasks, by (database, tube id) (see TubeCore._tasks).
_task_querysets: dict[tuple[str, int], TaskQuerySet] = {}


class TubeCore(models.Model):
    """A tube's row, the helpers of its verbs and its time-driven transitions (see :class:`Tube`)."""

    name = models.CharField(max_length=100, unique=True)
    type = models.CharField(max_length=10, choices=[(t, t) for t in TUBE_TYPES])
    ttl = models.FloatField(null=True, blank=True, help_text="Default time to live of a task (seconds).")
    ttr = models.FloatField(null=True, blank=True, help_text="Default time to run of a taken task (seconds).")
    pri = models.IntegerField(null=True, blank=True, help_text="Default priority (lower first).")
    created = models.DateTimeField(auto_now_add=True)
    running_limit = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="At most this many of its tasks taken at once, by every consumer together "
        "(empty: no limit). A worker sets its handler's limit when it starts. See Tube.set_limit.",
    )
    rate_count = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="At most this many of its tasks taken in any rate period, by every consumer "
        "together (empty: no rate). See Tube.set_rate.",
    )
    rate_period = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0.001)],
        help_text="The rate's period (seconds).",
    )
    key_limit = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="utube and utubettl: at most this many of one key's tasks taken at once, by "
        "every consumer together (empty: one at a time, in order). See Tube.set_key_limit.",
    )
    key_rate_count = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="utube and utubettl: at most this many of one key's tasks taken in any key rate "
        "period, by every consumer together (empty: no key rate). See Tube.set_key_rate.",
    )
    key_rate_period = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0.001)],
        help_text="The key rate's period (seconds).",
    )

    #: ``time.monotonic()`` when this object's last take of a tube with a running limit or a
    #: rate had the tube's lock (``None``: none yet): a worker starts a rate's tasks no later
    #: than ``RATE_MARGIN`` seconds after it (the rate counted them just after).
    claim_sent_at: float | None = None
    #: The tubes this object's last limited take counted together (``limits.group``: a Django
    #: Tasks queue's pair), kept for the acknowledgements until its next take; ``None``: no
    #: such take yet.
    limit_group: tuple[int, ...] | None = None

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return f"{self.name} ({self.type})"

    @property
    def rate(self) -> Rate | None:
        """The tube's rate (:meth:`Tube.set_rate`): at most ``rate.count`` tasks taken in any
        ``rate.period`` seconds; ``None``: no rate. ``str(tube.rate)`` reads ``100/m``."""
        if self.rate_count is None or self.rate_period is None:
            return None
        return Rate(self.rate_count, self.rate_period)

    @property
    def key_rate(self) -> Rate | None:
        """The tube's key rate (:meth:`Tube.set_key_rate`): at most ``key_rate.count`` tasks of
        one key taken in any ``key_rate.period`` seconds; ``None``: none."""
        if self.key_rate_count is None or self.key_rate_period is None:
            return None
        return Rate(self.key_rate_count, self.key_rate_period)

    # -- helpers ---------------------------------------------------------------------------

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

    def _tasks(self) -> TaskQuerySet:
        """This tube's tasks: a fresh queryset each call (``all()`` of one built once; a
        worker's batches ask for it twice each, and building the filter costs more than
        the statements it names)."""
        key = (self.using, self.pk)
        base = _task_querysets.get(key)
        if base is None:
            if len(_task_querysets) >= 1024:
                _task_querysets.clear()
            # Never evaluated itself (only its clones are), so it holds no rows.
            base = _task_querysets[key] = Task.objects.using(key[0]).filter(tube_id=key[1])
        return base.all()

    def _exists(self) -> bool:
        return type(self)._default_manager.using(self.using).filter(pk=self.pk).exists()

    def _gone(self) -> NotFound:
        return NotFound(f"tube {self.name!r} does not exist (dropped?)")

    def _ensure_exists(self) -> None:
        if not self._exists():
            raise self._gone()

    def _run(self, work: Callable[[], T], lock_first: bool = True, pin: bool = False) -> T:
        """Run ``work`` in a write transaction, retrying deadlocks when outermost (the engine
        retries the whole transaction, claim and counters, once per deadlock: one layer).

        ``lock_first=False``: ``work``'s first statement writes (see ``engine.write_transaction``).
        ``pin``: ``work`` claims or settles tasks by the batch (see ``engine.run_in_transaction``).
        """
        return engine.run_in_transaction(Task, self.using, work, lock_first=lock_first, pin=pin)

    def _count(self, **deltas: int) -> None:
        """Add ``deltas`` to this process's counter slot, in the current transaction."""
        deltas = {COLUMN.get(k, k): n for k, n in deltas.items() if n}
        if not deltas:
            return
        mine = {"tube_id": self.pk, "slot": slot(self.using)}
        if engine.add_to(TubeStat, self.using, mine, deltas):
            return
        # No slot rows: the tube was dropped, or made without create_tube (admin, fixtures).
        self._ensure_exists()
        TubeStat.objects.using(self.using).bulk_create(
            [TubeStat(tube_id=self.pk, slot=s) for s in range(SLOTS)], ignore_conflicts=True
        )
        engine.add_to(TubeStat, self.using, mine, deltas)

    def _emit(self, task: Task, event: str) -> None:
        callback = _callbacks.get((self.using, self.pk))
        if callback is None:
            return
        snapshot = copy.copy(task)
        transaction.on_commit(lambda: callback(snapshot, event), using=self.using)

    def _wake(self) -> None:
        """Tell waiting consumers (here at commit, elsewhere via NOTIFY) that a task is ready."""
        using, pk = self.using, self.pk
        wakeup.send_notify(using, pk)
        transaction.on_commit(lambda: wakeup.notify(using, pk), using=using)

    def on_task_change(
        self, callback: Callable[[Task, str], Any] | None
    ) -> Callable[[Task, str], Any] | None:
        """Call ``callback(task, event)`` after each committed change made by this process;
        return the previous callback. ``None`` clears it."""
        if callback is not None and not callable(callback):
            raise TypeError("callback must be callable or None")
        key = (self.using, self.pk)
        previous = _callbacks.get(key)
        if callback is None:
            _callbacks.pop(key, None)
        else:
            _callbacks[key] = callback
        return previous

    # -- a task as it is now ---------------------------------------------------------------

    def peek(self, task_id: int) -> Task:
        """Return the task as it is now; :class:`NotFound` if there is none."""
        task_id = check_task_id(task_id)
        return self._existing(task_id, lock=False)

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
            if row is None or not row.__dict__["_is_due"]:
                if row is not None:
                    del row.__dict__["_is_due"]
                return row
            self.tidy()
        return row

    # -- time-driven transitions -----------------------------------------------------------

    def _due(self, stale: bool = True) -> Q:
        """Rows with a transition due now (a delay, ttr or ttl ran out, or the holder died)."""
        due = Q(state__in=[DELAYED, TAKEN], event_at__lte=engine.DbNow())
        if stale:
            due |= Q(state=TAKEN, owner__in=Consumer.objects.using(self.using).dead().values("name"))
        return due | Q(state__in=[READY, BURIED], ttl_at__lte=engine.DbNow())

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
            dead = Consumer.objects.using(self.using).dead().values("name")
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
