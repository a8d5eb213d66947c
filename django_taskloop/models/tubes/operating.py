"""A tube's producer and operator side: put tasks (and their async twins), and look at and
change the tube and its tasks from outside: peek, edit, kick, pause and resume, delete,
truncate, drop and statistics."""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Sequence
from typing import Any, cast

from asgiref.sync import sync_to_async
from django.db import IntegrityError, connections, models, transaction
from django.db.models import Q

from ... import engine, wakeup
from ...exceptions import TubeError
from ...validation import (
    MAX_SECONDS,
    check_aware,
    check_count,
    check_json,
    check_key_limit,
    check_key_rate,
    check_rate,
    check_seconds,
    check_text,
)
from .. import operating as queues  # models/operating.py: the pauses of every kind of queue
from . import limits
from .core import TubeCore
from .definitions import (
    BURIED,
    DELAYED,
    DONE,
    READY,
    TAKE_ORDER,
    TAKEN,
    check_lifetime,
    check_pri,
)
from .records import Task, TubeStart, TubeStat, TubeWaiter, calls_from, check_task_id


def _check_put_options(pri: Any, ttl: Any, ttr: Any, delay: Any, utube: Any) -> tuple[Any, ...]:
    """Check the options of ``put``/``put_many``; return them as ``(pri, ttl, ttr, delay, utube)``."""
    pri = check_pri(pri)
    ttl = check_lifetime(ttl, "ttl")
    ttr = check_lifetime(ttr, "ttr")
    delay = check_seconds(delay, "delay", allow_none=True)
    if utube is not None:
        utube = check_text(str(utube), "utube")
        if len(utube) > 255:
            raise ValueError(f"utube must be at most 255 characters, not {len(utube)}")
    return pri, ttl, ttr, delay, utube


def _task_layout() -> tuple[list[str], list[Any]]:
    """``Task``'s fields in the order ``Task(*values)`` takes them, and a new task's values
    (``Task()``'s: its defaults), made once."""
    global _TASK_LAYOUT
    if _TASK_LAYOUT is None:
        fields = Task._meta.concrete_fields
        blank = Task()
        _TASK_LAYOUT = (
            [field.attname for field in fields],
            [getattr(blank, field.attname) for field in fields],
        )
    return _TASK_LAYOUT


_TASK_LAYOUT: tuple[list[str], list[Any]] | None = None


class TubeOperating(TubeCore):
    """A tube's producer and operator side (see the module's text, and :class:`Tube`)."""

    class Meta:
        abstract = True

    # -- put -------------------------------------------------------------------------------

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
        using, pk = self.using, self.pk
        chunks = _chunks(tasks, using)
        ready = any(task.state == READY for task in tasks)
        returning = ["ttl_at", "event_at"] if self._has_ttl else []
        channel = wakeup.channel(pk) if ready else None
        connection = connections[using]
        inside = connection.in_atomic_block
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
                if not engine.insert(
                    chunk, using, returning=returning, notify=channel, only_if=guard, connection=connection
                ):
                    return False
            return True

        try:
            written = engine.run_in_transaction(Task, using, work, alone=alone, connection=connection)
        except IntegrityError:
            self._ensure_exists()
            raise
        if not written:
            raise self._gone()
        if ready and inside:
            transaction.on_commit(lambda: wakeup.notify(using, pk), using=using)
        elif ready:  # (as on_commit would, at once, less its cost on a put's hot path)
            wakeup.notify(using, pk)
        for task in tasks:
            self._emit(task, "put")

    def _new_task(self, data: Any, pri: Any, ttl: Any, ttr: Any, delay: Any, utube: Any) -> Task:
        """Build (not save) a task as ``put`` makes it (deadlines on the database's clock)."""
        names, blank = _task_layout()
        values = dict(zip(names, blank, strict=True))
        values["tube_id"], values["data"] = self.pk, data
        if self._is_utube:
            values["utube"] = utube
        if self._has_ttl:
            values["pri"] = pri if pri is not None else (self.pri or 0)
            ttl = ttl if ttl is not None else self.ttl
            # The default ttr is the tube's ttr, else the tube's ttl (not the task's ttl).
            values["ttr"] = ttr if ttr is not None else (self.ttr if self.ttr is not None else self.ttl)
            delay = delay if delay and delay > 0 else 0.0
            if delay:
                values["state"] = DELAYED
                values["event_at"] = engine.DbNow(min(delay, MAX_SECONDS))
            if ttl is not None:
                # A delay extends the lifetime: a delayed task lives delay + ttl.
                values["ttl_at"] = engine.DbNow(min(ttl + delay, MAX_SECONDS))
        # Every field given, as from_db does: no field's default is asked for.
        return cast(Task, engine.unsaved(Task, values))

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

    # -- look at and change the tube and its tasks -----------------------------------------

    def edit_task(self, task_id: int, **changes: Any) -> int:
        """Write ``changes`` (``pri``, ``data``) to a task of this tube unless it is taken;
        return 1, or 0 if it is taken or gone.

        Tarantool has no verb for this (the admin's edit form and priority action use it). The
        state check and the write happen under one write lock, so that a take cannot slip in
        between: a consumer never sees its task change.
        """
        task_id = check_task_id(task_id)
        unknown = set(changes) - {"pri", "data"}
        if unknown:
            raise TypeError(f"edit_task() can change pri and data, not {', '.join(sorted(unknown))}")
        if "pri" in changes:
            check_pri(changes["pri"], allow_none=False)
        if "data" in changes:
            check_json(changes["data"], "data")

        def work() -> int:
            return self._tasks().filter(~Q(state=TAKEN), pk=task_id).update(**changes)

        return self._run(work)

    def kick(self, count: int = 1) -> int:
        """Return up to ``count`` buried tasks to ready, best first; return how many. Each is
        queued again: a new count of attempts (a worker buries a task after ``MAX_ATTEMPTS``
        takes: a kicked one gets as many again), and ``created`` is the kick's time, so that a
        queue's latency counts from it (its failures keep its history)."""
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
                order_by=list(TAKE_ORDER),
                changes={"state": READY, "attempts": 0, "created": engine.DbNow()},
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
        """Return the chosen buried task to ready, queued again (as :meth:`kick`: a new count of
        attempts, ``created`` the kick's time), and return it (``TubeError`` if not buried)."""
        task_id = check_task_id(task_id)

        def work() -> Task:
            task = self._existing(task_id, lock=True)
            if task.state != BURIED:
                raise TubeError(f"task {task_id} of tube {self.name!r} is not buried (state {task.state!r})")
            self._tasks().filter(pk=task.pk).update(state=READY, attempts=0, created=engine.DbNow())
            self._count(kick=1)
            task.state, task.attempts = READY, 0
            task.refresh_from_db(fields=["created"])  # (the database's clock set it)
            self._emit(task, "kick")
            self._wake()
            return task

        return self._run(work)

    def pause(self) -> None:
        """Stop handing out tasks (take/take_many give nothing, workers claim nothing) until
        :meth:`resume`; put, ack, release and every other verb still work. Twice is a no-op."""
        self._ensure_exists()
        queues.pause("task", self.name, self.using)

    def resume(self) -> None:
        """Hand out tasks again after :meth:`pause`."""
        queues.resume("task", self.name, self.using)
        self._wake()

    @property
    def paused(self) -> bool:
        """Whether the tube is paused (read from the database)."""
        return queues.is_paused("task", self.name, self.using)

    def set_limit(self, limit: int | None) -> None:
        """Let at most ``limit`` of this tube's tasks be taken at once, by every consumer on
        every host together (``None``: no limit). The database holds it: each take of a
        limited tube locks the tube's row, counts the tasks taken and still held (a ttr run
        out, or a consumer found dead, gives its slot back) and takes at most what is left.
        Tasks taken already stay taken; a lower limit lets new takes wait until enough are
        finished. Consumers see the limit from their next take on (a worker that had this tube
        unlimited when it started: from its next start; ``@tube(limit=…)`` sets it at each)."""
        if limit is not None:
            limit = check_count(limit, "limit", minimum=1)
        rows = type(self)._default_manager.using(self.using).filter(pk=self.pk)
        if not self._run(lambda: rows.update(running_limit=limit)):
            raise self._gone()
        self.running_limit = limit

    def set_rate(self, rate: Any) -> None:
        """Let at most ``rate`` of this tube's tasks be taken in any period, by every consumer
        on every host together: ``"100/m"``, ``"60/s"``, ``"10/5s"`` (units s, m, h, d) or a
        ``(count, seconds)`` pair; ``None``: no rate. The database holds it: each take of the
        tube locks its row, sums the takes logged over the last period (plus ``RATE_MARGIN``
        seconds) and takes at most what is left. A running limit (:meth:`set_limit`) holds
        beside it. Consumers see it from their next take on (a worker that had this tube
        without a rate or limit when it started: from its next start)."""
        rate = check_rate(rate, "rate")
        count, period = (None, None) if rate is None else rate
        rows = type(self)._default_manager.using(self.using).filter(pk=self.pk)
        if not self._run(lambda: rows.update(rate_count=count, rate_period=period)):
            raise self._gone()
        self.rate_count, self.rate_period = count, period

    def set_key_limit(self, limit: int | None) -> None:
        """utube and utubettl: let at most ``limit`` tasks of one key (one sub-queue) be taken
        at once, by every consumer on every host together (``None`` or 1: one at a time, the
        utube's own rule, which also keeps a key's tasks finishing in order). A key's tasks
        still start in order, its first ready task first; with more than one taken at once
        they may finish in another. The database holds it: each take locks the tube's row and
        claims a key's task only while fewer than ``limit`` of the key are taken or ready
        before it. Consumers see it from their next take on (a worker that had this tube
        without a key limit, a running limit or a rate when it started: from its next start;
        ``@tube(key_limit=…)`` sets it at each)."""
        limit = check_key_limit(limit, self.type)
        rows = type(self)._default_manager.using(self.using).filter(pk=self.pk)
        if not self._run(lambda: rows.update(key_limit=limit)):
            raise self._gone()
        self.key_limit = limit

    def set_key_rate(self, rate: Any) -> None:
        """utube and utubettl: let at most ``rate`` tasks of one key be taken in any period, by
        every consumer on every host together: ``"10/m"``, ``"2/s"`` or a ``(count, seconds)``
        pair, as :meth:`set_rate` reads them; ``None``: no key rate. Tasks put without a key
        have none. The database holds it: each take locks the tube's row, claims at most one
        task of a key and only while the key's takes logged over the last period (plus
        ``RATE_MARGIN``) leave room, and logs what it took by key. A take it holds back tells
        this process's waiters when the key log's oldest start leaves the window. Consumers see
        it from their next take on (as :meth:`set_rate`)."""
        rate = check_key_rate(rate, self.type)
        count, period = (None, None) if rate is None else rate
        rows = type(self)._default_manager.using(self.using).filter(pk=self.pk)
        if not self._run(lambda: rows.update(key_rate_count=count, key_rate_period=period)):
            raise self._gone()
        self.key_rate_count, self.key_rate_period = count, period

    def rate_used(self) -> int | None:
        """How many of this tube's tasks were taken in its rate's window up to now: the rate's
        period and ``RATE_MARGIN`` (``None``: the tube has no rate). Read, not locked."""
        return limits.started(self)

    def delete_task(self, task_id: int) -> Task:
        """Remove the task (any state, no ownership needed); return it with state ``"-"``."""
        task_id = check_task_id(task_id)

        def work() -> Task:
            task = self._existing(task_id, lock=True)
            engine.delete_rows(self._tasks().filter(pk=task.pk))
            self._count(delete=1, done=1)
            if task.state == TAKEN and self._is_utube:
                self._wake()  # its sub-queue is free now
            elif task.state == TAKEN:
                limits.freed(self, 1)
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
            if (
                type(self)._default_manager.using(self.using).select_for_update().filter(pk=self.pk).first()
                is None
            ):
                raise self._gone()
            if self._tasks().filter(state=TAKEN).exists():
                raise TubeError(f"there are taken tasks in tube {self.name!r}")
            if TubeWaiter.objects.using(self.using).waiting(self.pk).exists():
                raise TubeError(f"there are consumers waiting on tube {self.name!r}")
            engine.delete_rows(self._tasks())
            engine.delete_rows(TubeStat.objects.using(self.using).filter(tube_id=self.pk))
            engine.delete_rows(TubeWaiter.objects.using(self.using).filter(tube_id=self.pk))
            engine.delete_rows(TubeStart.objects.using(self.using).filter(tube_id=self.pk))
            engine.delete_rows(type(self)._default_manager.using(self.using).filter(pk=self.pk))
            return True

        self._run(work)
        self.on_task_change(None)
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
        sums = TubeStat.objects.using(self.using).filter(tube_id=self.pk).sums()
        tasks = {name: counts[name] for name in ("taken", "buried", "ready", "delayed")}
        tasks["done"] = sums["done"]
        tasks["total"] = tasks["taken"] + tasks["buried"] + tasks["ready"] + tasks["delayed"]
        if not apply_transitions:
            # Still rows, so still in calls.put, but counted in no state: the next call removes them.
            tasks["expired"] = counts["expired"]
            tasks["overdue"] = self._tasks().overdue().order_by().count()
        return {"tasks": tasks, "calls": calls_from(sums, tasks["total"] + counts["expired"])}

    # -- async twins of the producer verbs (for async views) ----------------------------------

    async def aput(
        self,
        data: Any,
        pri: int | None = None,
        ttl: float | None = None,
        ttr: float | None = None,
        delay: float | None = None,
        utube: Any = None,
        *,
        run_at: datetime.datetime | None = None,
    ) -> Task:
        """``await tube.aput(...)``: :meth:`put` from async code (an async view, a consumer).

        The same arguments, checks, errors and result as :meth:`put`; it runs in Django's
        thread for synchronous code (``sync_to_async(thread_sensitive=True)``, as Django's own
        ``acreate`` does), so it uses that thread's connection and joins its transaction, and
        never raises ``SynchronousOnlyOperation``.
        """
        return await sync_to_async(self.put, thread_sensitive=True)(
            data, pri=pri, ttl=ttl, ttr=ttr, delay=delay, utube=utube, run_at=run_at
        )

    async def aput_many(
        self,
        items: Iterable[Any],
        pri: int | None = None,
        ttl: float | None = None,
        ttr: float | None = None,
        delay: float | None = None,
        utube: Any = None,
    ) -> list[Task]:
        """``await tube.aput_many(...)``: :meth:`put_many` from async code, as :meth:`aput` is
        :meth:`put` (the same arguments, errors and result; all or nothing)."""
        return await sync_to_async(self.put_many, thread_sensitive=True)(
            items, pri=pri, ttl=ttl, ttr=ttr, delay=delay, utube=utube
        )


def _chunks(tasks: list[Task], using: str) -> list[Sequence[Task]]:
    """Split ``tasks`` into INSERTs within the database's limits (one task, a put: one chunk,
    without asking the database)."""
    if len(tasks) == 1:
        return [tasks]
    return list(engine.batched(tasks, using, per_row=len(Task._meta.concrete_fields)))
