"""The tube's rows besides its own: its tasks, counter slots, consumers' heartbeats and waiters."""

from __future__ import annotations

import time
from typing import Any

from django.db import IntegrityError, models, transaction
from django.db.models import Count, Exists, OuterRef, Q, Sum

from ... import engine
from ...conf import setting
from .definitions import (
    BURIED,
    CALLS,
    COLUMN,
    DELAYED,
    DONE,
    READY,
    STORED_STATES,
    TAKE_ORDER,
    TAKEN,
    TASK_STATES,
    alive_tasks,
    expired_tasks,
)

#: The index of the claim order (ready tasks; MySQL/MariaDB: all tasks).
CLAIM_INDEX = "taskloop_task_claim"
#: The index of a sub-queue's tasks in order: what a keyed claim's "nothing of this key
#: ahead" reads (hinted on MariaDB, see engine.claim's ``sub_index``).
UTUBE_INDEX = "taskloop_task_utube"


class TaskQuerySet(models.QuerySet["Task"]):
    """Named states of tasks, read with the database's clock: the single definition of each,
    used by ``statistics()``, the admin and the metrics.

    A task past its ttl deadline is :meth:`expired` whatever state it is stored in (a taken
    one's ttr deadline is never later than its ttl: it would go back to ready, then be
    removed), and in no other state.
    """

    def ready(self) -> TaskQuerySet:
        """Tasks a take may get (utube: if their sub-queue is free)."""
        return self.filter(alive_tasks(), state=READY)

    def taken(self) -> TaskQuerySet:
        return self.filter(alive_tasks(), state=TAKEN)

    def delayed(self) -> TaskQuerySet:
        return self.filter(alive_tasks(), state=DELAYED)

    def buried(self) -> TaskQuerySet:
        return self.filter(alive_tasks(), state=BURIED)

    def expired(self) -> TaskQuerySet:
        """Tasks past their ttl deadline, not removed yet (the next call on the tube does)."""
        return self.filter(expired_tasks())

    def overdue(self) -> TaskQuerySet:
        """Taken or delayed tasks whose ttr or delay ran out, not applied yet (the next call
        on the tube makes them ready)."""
        return self.filter(alive_tasks(), state__in=[TAKEN, DELAYED], event_at__lte=engine.DbNow())

    def in_claim_order(self) -> TaskQuerySet:
        """These tasks in the order takes hand them out: priority, then id (put order)."""
        return self.order_by(*TAKE_ORDER)

    def in_state(self, name: str) -> TaskQuerySet:
        """The tasks in state ``name``, one of :data:`TASK_STATES`."""
        if name not in TASK_STATES:
            raise ValueError(f"name must be one of {', '.join(TASK_STATES)}, not {name!r}")
        tasks: TaskQuerySet = getattr(self, name)()
        return tasks

    def state_counts(self) -> dict[str, int]:
        """Return ``{state: number of tasks}`` for every name of :data:`TASK_STATES` (one read)."""
        counts = dict.fromkeys(TASK_STATES, 0)
        names = {code: name for name, code in STORED_STATES.items()}

        def by_state(tasks: TaskQuerySet) -> Any:
            counted = tasks.order_by().values("state")
            return counted.annotate(n=Count("pk"), expired=Count("pk", filter=expired_tasks())).values_list(
                "state", "n", "expired"
            )

        # Ready and the rest apart: each half by its own index (split where indexes are partial).
        rows = by_state(self.filter(state=READY)).union(by_state(self.exclude(state=READY)), all=True)
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
    tube = models.ForeignKey(
        "django_taskloop.Tube", on_delete=models.CASCADE, related_name="tasks", db_index=False
    )
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
        # Not "Tasks": beside "Django task results" in the admin, a tube's task says what it is.
        verbose_name = "tube task"
        indexes = [
            # The claim order of every driver: (pri, id) for fifottl/utubettl, and id for
            # fifo/utube whose tasks all have pri 0; also kick's order. Split by readiness
            # (PostgreSQL, SQLite; MySQL has the whole index): a settle's filter implies
            # neither half, so the primary key is the only index that can serve it, whatever
            # statistics taken among many dead rows say (issue 30).
            engine.PartialIndex(
                fields=["tube", "state", "pri", "id"], name=CLAIM_INDEX, where=Q(state=READY)
            ),
            engine.PartialIndex(
                fields=["tube", "state", "pri", "id"],
                name="taskloop_task_state",
                where=~Q(state=READY),
                only_partial=True,
            ),
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
                fields=["tube", "utube", "id"], name=UTUBE_INDEX, where=Q(utube__isnull=False)
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


def check_task_id(task_id: Any, name: str = "task_id") -> int:
    if isinstance(task_id, Task):
        task_id = task_id.pk
    if isinstance(task_id, bool) or not isinstance(task_id, int):
        raise TypeError(f"{name} must be an int or a Task, not {type(task_id).__name__}")
    # No task has an id its 64-bit column cannot hold; SQLite, which bounds no integer column,
    # would fail with OverflowError where an id list meets it.
    if not -(2**63) <= task_id < 2**63:
        raise ValueError(f"{name}: {task_id!r} is out of the 64-bit integer range of task ids")
    return task_id


def calls_from(sums: dict[str, int], rows: int) -> dict[str, int]:
    """Return ``statistics()["calls"]`` from a tube's summed counters and its number of tasks.

    ``put`` is derived rather than counted, so that a put writes nothing but its task: every
    task put is still in the tube, or was removed by a count of ``done`` (ack, delete, ttl), or
    by ``truncate`` (counted apart, since truncate changes no call counter). A put rolled back
    leaves no task, so no count either.
    """
    calls = {name: sums[COLUMN[name]] for name in CALLS if name != "put"}
    calls["put"] = rows + sums["done"] + sums["truncated"]
    return {name: calls[name] for name in CALLS}


class TubeStatQuerySet(models.QuerySet["TubeStat"]):
    def sums(self) -> dict[str, int]:
        """Sum the counter slots: every call counter but ``put``, ``done`` and ``truncated``."""
        columns = [COLUMN[name] for name in CALLS if name != "put"] + ["done", "truncated"]
        sums = self.aggregate(**{column: Sum(column) for column in columns})
        return {column: int(value or 0) for column, value in sums.items()}


class TubeStat(models.Model):
    """One counter slot of a tube; ``statistics()`` sums a tube's slots."""

    tube = models.ForeignKey(
        "django_taskloop.Tube", on_delete=models.CASCADE, related_name="+", db_index=False
    )
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


class TubeStart(models.Model):
    """``n`` tasks of a tube with a rate taken by one claim at ``at`` (the database's clock):
    the log a take counts its rate's window in (:mod:`.limits`). With a ``key``: one task of
    that key taken, the log of the tube's key rate. Rows older than the window are removed by
    the takes."""

    tube = models.ForeignKey(
        "django_taskloop.Tube", on_delete=models.CASCADE, related_name="+", db_index=False
    )
    at = models.DateTimeField()
    n = models.PositiveIntegerField()
    key = models.CharField(max_length=255, null=True, blank=True)

    class Meta:
        app_label = "django_taskloop"
        db_table = "taskloop_tube_start"
        # A rate's window: (tube, key IS NULL, at > …); a key rate's: (tube, key = …, at > …).
        indexes = [models.Index(fields=["tube", "key", "at"], name="taskloop_tube_start_key_at")]

    def __str__(self) -> str:
        return f"{self.n} taken from tube {self.tube_id} at {self.at}"


#: When this process last wrote each consumer's heartbeat, by (database, consumer).
_beats: dict[tuple[str, str], float] = {}


class ConsumerQuerySet(models.QuerySet["Consumer"]):
    def dead(self) -> ConsumerQuerySet:
        """Consumers whose last heartbeat is older than ``CONSUMER_TIMEOUT``."""
        return self.filter(last_seen__lt=engine.DbNow(-float(setting("CONSUMER_TIMEOUT"))))

    def dead_names(self, most: int = 1000) -> list[str] | models.QuerySet[Any]:
        """The dead consumers' names, read now: a list (usually empty, so that a caller skips
        looking for their tasks at all), or the query itself if there are more than ``most``."""
        names = list(self.dead().values_list("name", flat=True)[: most + 1])
        return names if len(names) <= most else self.dead().values("name")

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
    def register(self, tube: models.Model, consumer: str, timeout: float | None) -> _Registration:
        registration = _Registration(None, timeout, self.db)  # type: ignore[arg-type]  # its row is made next, from its lease
        registration.row = self.create(
            tube_id=tube.pk, consumer=consumer, until=engine.DbNow(registration._lease())
        )
        return registration

    def waiting(self, tube_id: int) -> TubeWaiterQuerySet:
        return self.filter(tube_id=tube_id, until__gt=engine.DbNow())


class TubeWaiter(models.Model):
    """A consumer blocked in ``take(timeout)``; ``drop()`` refuses while there are any."""

    tube = models.ForeignKey(
        "django_taskloop.Tube", on_delete=models.CASCADE, related_name="+", db_index=False
    )
    consumer = models.CharField(max_length=255)
    until = models.DateTimeField()

    objects = TubeWaiterQuerySet.as_manager()

    class Meta:
        app_label = "django_taskloop"
        db_table = "taskloop_tube_waiter"
        indexes = [models.Index(fields=["tube", "until"], name="taskloop_tube_waiter_until")]

    def __str__(self) -> str:
        return f"{self.consumer} waiting on tube {self.tube_id}"
