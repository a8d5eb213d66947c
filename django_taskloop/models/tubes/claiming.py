"""A tube's consumer side: how a claim works, and what a consumer does with what it holds.

A take (:meth:`TubeClaiming.take`, :meth:`~TubeClaiming.take_many`, a worker's
:meth:`~TubeClaiming.ack_and_take`) runs :meth:`TubeClaiming._take`: it beats for its consumer
(at most every few seconds per process, :meth:`~TubeClaiming._beat`), hands out nothing while
the tube is paused, applies the transitions that are due (:meth:`~TubeClaiming._tidy_for_take`:
a dead consumer's tasks about once a second, ended delays and ttrs), then claims through
:func:`django_taskloop.engine.claim` what :meth:`~TubeClaiming._claim_spec` describes: the
claimable rows (:func:`_claimable_of`: ready and alive; for utube drivers only the
head of each sub-queue), in the claim order, with the lease it writes (taken, the owner, one
more attempt, the ttr deadline; utube: the sub-queue's ``taken_key``). Its counters are
written in the same transaction, and a utube claim that the unique ``taken_key`` refuses is
looked for again. A worker's batch first acknowledges what it finished, in the same
transaction (on PostgreSQL in the same statement), and may start from its
:class:`~django_taskloop.engine.ClaimCursor` instead of the head of the claim index.

A take that waits registers a :class:`TubeWaiter` row (``drop`` refuses while there is one)
and sleeps on :mod:`django_taskloop.wakeup` until a change wakes it (a put, a release, a kick,
a resume: ``_wake``) or the clock may have made something ready; one read
(:func:`worth_trying`) then says whether another try may find something. An idle worker asks the same read for all of its tubes at once.

What a consumer holds it settles here too: :meth:`~TubeClaiming.ack` (and ``ack_many``),
:meth:`~TubeClaiming.release`, :meth:`~TubeClaiming.touch` (a worker's heartbeat for its tasks
in flight: ``touch_many``) and :meth:`~TubeClaiming.bury`.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from django.db import IntegrityError, connections, models
from django.db.models import Case, Exists, F, OuterRef, Q, Value, When
from django.db.models.functions import Concat, Least

from ... import engine, wakeup
from ...conf import setting
from ...exceptions import NotFound, NotTaken, TaskloopError, TubeError
from ...validation import (
    check_count,
    check_owner,
    check_seconds,
    check_timeout,
)
from .. import operating
from . import limits
from .core import TubeCore, _callbacks
from .definitions import (
    BURIED,
    DELAYED,
    DONE,
    READY,
    TAKE_ORDER,
    TAKEN,
    alive_tasks,
    default_consumer,
    slot,
)
from .records import (
    CLAIM_INDEX,
    UTUBE_INDEX,
    Consumer,
    Task,
    TubeStart,
    TubeStat,
    TubeWaiter,
    _beats,
    check_task_id,
)

# -- per-process state ---------------------------------------------------------------------

#: When this process last looked for dead consumers' tasks of each tube, by (database, tube id).
_stale_checks: dict[tuple[str, int], float] = {}
#: When a worker's batches of this process last probed each tube for ended delays and ttrs.
_due_checks: dict[tuple[str, int], float] = {}


def _reset_after_fork() -> None:
    # A child is a new consumer: it must beat on its own, and check for the dead afresh.
    _beats.clear()
    _stale_checks.clear()
    _due_checks.clear()


os.register_at_fork(after_in_child=_reset_after_fork)


def _forget_checks() -> None:
    # The database's clock moved (a test's advance): what was not due when last looked may be
    # now, and this process's consumers beat again on their next call (their last heartbeat is
    # old on the moved clock: they are alive, not dead).
    _beats.clear()
    _stale_checks.clear()
    _due_checks.clear()


engine.on_clock_change(_forget_checks)


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


# -- what a claim and a touch write (on the database's clock) -----------------------------


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


def _sub_queue_heads(tube_id: int, has_ttl: bool, first: int, key_rate: tuple[int, float] | None = None) -> Q:
    """utube: the tasks claimable by their sub-queue. Only the head of a sub-queue is
    claimable: no task of it is taken, and no ready one comes before it. Two consumers then aim
    at the same row (one wins under SKIP LOCKED) instead of at two rows of one sub-queue, which
    the unique taken_key would refuse only after one waited for the other's commit. A key limit
    of ``first`` above 1 (``Tube.set_key_limit``): fewer than ``first`` of the sub-queue taken
    or ready before it, so one claim takes at most the first ``first`` less those taken; such
    takes are serialized by the tube row's lock (limits.room), and the count is the guard. A key
    rate of ``(count, seconds)`` (``Tube.set_key_rate``; ``seconds`` its window): one task of a
    key a claim, the key's first ready one, while the key's start log over ``seconds`` holds
    fewer than ``count`` rows (a row a task: limits.claim_within writes them)."""
    alive = alive_tasks() if has_ttl else Q()
    before = Q(pri__lt=OuterRef("pri")) | Q(pri=OuterRef("pri"), id__lt=OuterRef("id"))
    ahead = Q(state=TAKEN) | Q(alive, before, state=READY)
    siblings = Task.objects.filter(tube_id=tube_id)
    keyed: Any = Q(utube__isnull=False) & ~Exists(
        siblings.filter(ahead, utube=OuterRef("utube"))[first - 1 : first]
    )
    if key_rate is not None:
        count, seconds = key_rate
        starts = TubeStart.objects.filter(
            tube_id=tube_id, key=OuterRef("utube"), at__gt=engine.DbNow(-seconds)
        )
        keyed &= ~Exists(siblings.filter(alive, before, state=READY, utube=OuterRef("utube")))
        keyed &= ~Exists(starts[count - 1 : count])
    heads: Q = (
        Q(utube__isnull=True) & ~Exists(siblings.filter(ahead, utube__isnull=True)[first - 1 : first]) | keyed
    )
    return heads


def _claimable_of(tube: TubeClaiming, by_rate: bool = True) -> Q:
    """The tasks of ``tube`` a take may claim (``by_rate=False``: a look's, without the key
    rate, as a look leaves the tube's rate out: a take it refuses sets the wake-up)."""
    claimable = Q(state=READY)
    if tube._has_ttl:
        claimable &= alive_tasks()
    else:
        # fifo/utube tasks all have pri 0: saying so lets the (tube, state, pri, id) index
        # serve the id order.
        claimable &= Q(pri=0)
    if tube._is_utube:
        key_rate = _key_rate_window(tube) if by_rate else None
        claimable &= _sub_queue_heads(tube.pk, tube._has_ttl, tube.key_limit or 1, key_rate)
    return claimable


def _key_rate_window(tube: TubeClaiming) -> tuple[int, float] | None:
    """``tube``'s key rate's count and the seconds its window counts (``None``: none)."""
    if tube.key_rate_count is None or tube.key_rate_period is None:
        return None
    return int(tube.key_rate_count), limits.window(float(tube.key_rate_period))


def _taken_key() -> Any:
    """The value of ``taken_key`` for a taken utube task: unique per (tube, sub-queue)."""
    return Case(
        When(utube__isnull=True, then=Value("")),
        default=Concat(Value("."), F("utube")),
        output_field=models.CharField(),
    )


# -- argument checks -----------------------------------------------------------------------


def _check_consumer(consumer: Any) -> str:
    if consumer is None:
        return default_consumer()
    return check_owner(consumer, "consumer")


def _check_task_ids(task_ids: Any) -> list[int]:
    """Return one task id (or Task) or an iterable of them as a list without duplicates."""
    if isinstance(task_ids, (int, Task)):
        task_ids = [task_ids]
    ids = task_ids if type(task_ids) is list else list(task_ids)
    # A worker's acknowledgement: plain ints (no bool), in range, checked with no call an id.
    if ids and set(map(type, ids)) == {int} and -(2**63) <= min(ids) and max(ids) < 2**63:
        return list(dict.fromkeys(ids))
    return list(dict.fromkeys(check_task_id(t, "task_ids") for t in ids))


def worth_trying(
    tubes: Sequence[TubeClaiming], cursors: Mapping[int, engine.ClaimCursor | None] | None = None
) -> dict[int, str]:
    """Say, in one read, which of ``tubes`` (of one database) a take may find something in now.

    For waiting takes and idle workers. Return ``{tube id: what}`` for the tubes that still
    exist: ``"due"`` if a transition is due (a delay or ttr ran out; about once a second per
    tube, a dead consumer holds a task: the take applies it first), else ``"ready"`` if
    something is claimable (the take may skip its own checks: ``_take(checked=True)``), else
    ``""``; always ``""`` for a paused tube. ``cursors``: ``{tube id: the consumer's claim
    cursor}`` (see :meth:`TubeClaiming.take_many`): a tube's look starts where its takes do.
    """
    if not tubes:
        return {}
    using = tubes[0].using
    now = time.monotonic()
    stale: set[int] = set()
    whens = []
    resumes: dict[int, engine.Resume] = {}
    for tube in tubes:
        key = (using, tube.pk)
        if now - _stale_checks.get(key, -math.inf) >= _STALE_CHECK_EVERY:
            _stale_checks[key] = now
            stale.add(tube.pk)
        cursor = (cursors or {}).get(tube.pk)
        if cursor is not None and not tube._is_utube:
            resumes[tube.pk] = engine.Resume(cursor, Task.objects.using(using), tube._cursor_on())
        due, ready = tube._worth(tube.pk in stale, resumes.get(tube.pk))
        if due is not None:
            whens.append(When(due, then=Value("due")))
        whens.append(When(ready, then=Value("ready")))
    rows = (
        type(tubes[0])
        ._default_manager.using(using)
        .filter(pk__in=[tube.pk for tube in tubes])
        .annotate(worth=Case(*whens, default=Value(""), output_field=models.CharField()))
        .order_by()
        .values_list("pk", "worth")
    )
    worth = {pk: what or "" for pk, what in rows}
    for pk, resume in resumes.items():
        # Due: the take's tidy may make tasks behind the cursor ready.
        resume.looked(found=bool(worth.get(pk)))
    for pk in stale:
        if worth.get(pk):
            # Maybe a dead consumer's tasks: the take's tidy must look for itself at once.
            _stale_checks.pop((using, pk), None)
    return worth


class TubeClaiming(TubeCore):
    """A tube's consumer side: take (and wait for) tasks, then ack, release, touch or bury
    them (see the module's text, and :class:`Tube`)."""

    _claimable = _claimable_of  # (what a take claims: ``tube._claimable()``)

    class Meta:
        abstract = True

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
        cursor: engine.ClaimCursor | None = None,
    ) -> Task | None:
        """``take(timeout, consumer)`` that also ends its wait, with ``None``, as soon as
        ``stop()`` returns true (asked after each wake-up): a worker's wait for its next task.
        ``cursor``: see :meth:`take_many`."""
        timeout = check_timeout(timeout)
        consumer = _check_consumer(consumer)
        using = self.using
        if (timeout is None or timeout > 0) and connections[using].in_atomic_block:
            raise TaskloopError(
                "take(timeout > 0) cannot wait inside a transaction: it would never see the commit "
                "it waits for; use take(0) there"
            )
        return self._wait_take(timeout, consumer, stop, cursor)

    def _wait_take(
        self,
        timeout: float | None,
        consumer: str,
        stop: Callable[[], bool] | None = None,
        cursor: engine.ClaimCursor | None = None,
    ) -> Task | None:
        """``take(timeout)``; a worker passes ``stop``, which ends the wait when it says so. A
        worker's tries are each bounded (``engine.bounded``): a server that hangs is met as one
        that went away, not waited on for as long as it hangs."""
        using = self.using
        step = (lambda: engine.bounded(using)) if stop is not None else contextlib.nullcontext
        end = None if timeout is None else time.monotonic() + timeout
        with step():
            tasks: list[Task] = self._take(1, consumer, cursor=cursor)
        if tasks or timeout == 0:
            return tasks[0] if tasks else None
        waiter = wakeup.Waiter(using, self.pk)
        try:
            with step():
                registration = TubeWaiter.objects.using(using).register(self, consumer, timeout)
            try:
                # One more try now that the waiter listens: a task made ready since the first
                # try is either taken here or wakes the sleep below.
                with step():
                    tasks = self._take(1, consumer, cursor=cursor)
                while not tasks:
                    left = None if end is None else end - time.monotonic()
                    if (left is not None and left <= 0) or (stop is not None and stop()):
                        return None
                    waiter.sleep(left)
                    with step():
                        registration.refresh()
                        # Woken by a change or by the clock: one cheap read says whether a take
                        # may find something (or has due transitions to apply).
                        worth = self._worth_trying(cursor)
                        if worth:
                            tasks = self._take(1, consumer, checked=worth == "ready", cursor=cursor)
                return tasks[0]
            finally:
                with step():
                    registration.close()
        finally:
            waiter.close()

    def _worth_trying(self, cursor: engine.ClaimCursor | None = None) -> str:
        """Say whether a take may find something now: one read, for waiting takes (see
        :func:`worth_trying`). Raises :class:`NotFound` if the tube is gone."""
        worth = worth_trying([self], {self.pk: cursor} if cursor is not None else None)
        if self.pk not in worth:
            raise self._gone()
        return worth[self.pk]

    def _worth(self, stale: bool, resume: engine.Resume | None = None) -> tuple[Q | None, Q]:
        """On tube rows: this tube, not paused, with a transition due (a delay or ttr ran out;
        with ``stale``, a dead consumer holds a task; ``None`` if nothing can be); the same with
        something claimable (after ``resume``'s start, if it has one)."""
        tasks = Task.objects.filter(tube_id=self.pk)
        due: list[Q | Exists] = []
        if self._has_ttl:
            # (What _tidy_for_take applies: a ready task past its ttl is not worth a take.)
            due.append(Exists(tasks.filter(state__in=[DELAYED, TAKEN], event_at__lte=engine.DbNow())))
        if stale:
            # Consumers first: usually none is dead, and then the taken tasks are not looked at
            # (a range that a transaction held open elsewhere fills with dead index entries).
            # In the CASE of one read (see worth_trying), AND stops at the first false.
            dead = Consumer.objects.dead()
            due.append(Q(Exists(dead)) & Q(Exists(tasks.filter(state=TAKEN, owner__in=dead.values("name")))))
        paused = operating.PausedQueue.objects.filter(kind="task", queue=self.name)
        this = Q(pk=self.pk) & ~Q(Exists(paused))
        after = resume.condition(self.using) if resume is not None else None
        ready = this & Q(
            Exists(tasks.filter(_claimable_of(self, by_rate=False), *([after] if after is not None else [])))
        )
        return (this & Q(*due, _connector=Q.OR) if due else None), ready

    def take_many(
        self,
        limit: int,
        consumer: str | None = None,
        *,
        checked: bool = False,
        cursor: engine.ClaimCursor | None = None,
    ) -> list[Task]:
        """Take up to ``limit`` ready tasks at once for ``consumer`` (no waiting).

        ``checked``: the caller has just read :func:`worth_trying` for this tube and got
        ``"ready"`` (not paused, no transition due), so the take skips those two looks.

        ``cursor``: a consumer that takes batch after batch (a worker) keeps one
        :class:`~django_taskloop.engine.ClaimCursor` per tube and gives it to every take and
        look: on PostgreSQL and MySQL/MariaDB a take then starts after its last, instead of
        walking the index entries that claimed and finished tasks leave behind until the
        database cleans them up (a transaction held open anywhere holds that back). A task
        made ready behind it (released, kicked, a delay run out, a higher priority put after)
        waits for the cursor's next look from the head: at most a second, or twenty times what
        such a look takes. Not for utube tubes, whose claimable tasks lie behind.
        """
        limit = check_count(limit, "limit", minimum=1)
        tasks: list[Task] = self._take(limit, _check_consumer(consumer), checked=bool(checked), cursor=cursor)
        return tasks

    def _cursor_on(self) -> list[str]:
        """The columns of the claim order that a claim cursor stands on: fifo's claims pin pri
        to 0, and the index range starts at the id."""
        return list(TAKE_ORDER) if self._has_ttl else ["id"]

    def ack_and_take(
        self,
        task_ids: Iterable[int],
        limit: int,
        consumer: str | None = None,
        *,
        cursor: engine.ClaimCursor | None = None,
    ) -> tuple[int, list[Task]]:
        """Finish the tasks of ``task_ids`` that ``consumer`` holds and take up to ``limit``
        ready ones, in one transaction: what a worker does between two batches (one commit and
        one counter write instead of two of each). Return ``(acknowledged, taken)``.
        ``cursor``: see :meth:`take_many`."""
        ids = _check_task_ids(task_ids)
        limit = check_count(limit, "limit")
        consumer = _check_consumer(consumer)
        both: tuple[int, list[Task]] = self._take(
            limit, consumer, ack=ids, due_every=_WORKER_DUE_CHECK_EVERY, cursor=cursor
        )
        return both

    def _take(
        self,
        limit: int,
        consumer: str,
        ack: list[int] | None = None,
        due_every: float = 0.0,
        checked: bool = False,
        cursor: engine.ClaimCursor | None = None,
    ) -> Any:
        """Take up to ``limit`` tasks and return them (a list); with ``ack``, first finish those
        and return both (``(acknowledged, taken)``). ``checked``: a read of worth_trying() just
        found the tube not paused and nothing due, so neither needs another look."""
        self._beat(consumer)
        if not limit or (not checked and operating.is_paused("task", self.name, self.using, fresh=False)):
            # Paused: hand out nothing (a waiting take keeps waiting, polling the pause).
            if ack is None:
                self._ensure_exists()
                return []
            return self.ack_many(ack, consumer), []
        if not checked:
            self._tidy_for_take(due_every)
        spec = self._claim_spec(limit, consumer, cursor).prepared()
        watched = (self.using, self.pk) in _callbacks
        if (
            self.running_limit is not None
            or self.rate_count is not None
            or self.key_limit is not None
            or self.key_rate_count is not None
        ):  # (inline: the hot path's budget counts calls)
            # A running limit, a rate, a key limit or rate: counted under the tube row's lock.
            return self._claim_with_retries(spec, consumer, ack, watched)
        if ack and not watched:
            # PostgreSQL: the acknowledgement, the claim and the counters as one statement.
            together = self._ack_and_claim_at_once(spec, ack, consumer)
            if together is not None:
                return together
        return self._claim_with_retries(spec, consumer, ack, watched)

    def _claim_spec(
        self, limit: int, consumer: str, cursor: engine.ClaimCursor | None = None
    ) -> engine.ClaimSpec:
        """What a take claims and writes. A claim may be one kept statement (the engine's
        choice): its filter and changes are then built once, when it is compiled. utube: the
        claimable rows are the sub-queue heads, so one batch never holds two tasks of one
        sub-queue. A claim scans the claim index itself (no candidate read first): with SKIP
        LOCKED it finds free rows past what rivals hold. So does a claim of one task (a
        ``take``; a worker whose handler runs longer than its ``batch_time`` claims one at a
        time), which through the ORM's statements cost 3-4x the round trips and 3-7x the
        client CPU of a kept one."""

        def changes() -> dict[str, Any]:
            # attempts counts takes, so that a worker can bury a task that keeps failing.
            changes: dict[str, Any] = {"state": TAKEN, "owner": consumer, "attempts": F("attempts") + 1}
            if self._has_ttl:
                changes["event_at"] = _taken_deadline()
            if self._is_utube and not self.key_limit:
                # (A key limit's count is its guard: no unique key for N taken at once.)
                changes["taken_key"] = _taken_key()
            return changes

        return engine.ClaimSpec(
            self._tasks(),
            limit=limit,
            claimable=self._claimable,
            order_by=list(TAKE_ORDER),
            changes=changes,
            key=self._kept_key("take", consumer),
            direct=True,
            # utube: a sub-queue's next task lies behind the cursor when its head is finished.
            cursor=None if self._is_utube else cursor,
            cursor_on=self._cursor_on(),
            index=CLAIM_INDEX,
            sub_index=UTUBE_INDEX if self._is_utube else None,
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
            counters=(TubeStat, {"tube_id": self.pk, "slot": slot(self.using)}, _BATCH_COUNTERS),
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
        when utube's unique ``taken_key`` refuses a claim; a limited tube's claim takes at most
        what its running limit and its rate leave (:mod:`.limits`)."""

        def work() -> tuple[int, engine.Claimed]:
            acked = self._ack_rows(ack, consumer) if ack else 0
            limited = (
                self.running_limit is not None
                or self.rate_count is not None
                or self.key_limit is not None
                or self.key_rate_count is not None
            )
            claimed = (
                limits.claim_within(self, spec, lambda: self._claim_spec(spec.limit, consumer).prepared())
                if limited
                else spec.run(later=True)
            )
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
                acked, claimed = self._run(work, lock_first=not writes_first, pin=True)
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

    # -- before a claim --------------------------------------------------------------------

    def _beat(self, consumer: str, register: bool = True) -> None:
        """Record that ``consumer`` is alive, unless this process did so lately (see _BEAT_EVERY).

        ``register=False`` (ack, release, touch and their batches) only refreshes a consumer
        already known: one with no row holds no task, so the call will do nothing for it, and
        a refused call must leave no row behind.
        """
        every = min(_BEAT_EVERY, float(setting("CONSUMER_TIMEOUT")) / 4)
        if time.monotonic() - _beats.get((self.using, consumer), -math.inf) < every:
            return
        Consumer.objects.using(self.using).beat(consumer, register=register)

    def _tidy_for_take(self, every: float = 0.0) -> None:
        """Before a take: apply due transitions if there are any (one cheap indexed read).

        ``every``: probe for ended delays and ttrs at most that often per process (a worker's
        batches: the clock's transitions need to show within a second, not within a batch).
        """
        key = (self.using, self.pk)
        now = time.monotonic()
        stale = now - _stale_checks.get(key, -math.inf) >= _STALE_CHECK_EVERY
        if stale:
            _stale_checks[key] = now
            # Usually no consumer is dead: then no look at the taken tasks at all (a range that
            # a transaction held open elsewhere fills with dead index entries).
            dead = Consumer.objects.using(self.using).dead_names()
            if dead and self._tasks().filter(state=TAKEN, owner__in=dead).exists():
                self.tidy(stale=True)
                return
        if not self._has_ttl or (every and now - _due_checks.get(key, -math.inf) < every):
            return
        _due_checks[key] = now
        if self._tasks().filter(state__in=[DELAYED, TAKEN], event_at__lte=engine.DbNow()).exists():
            self.tidy(stale=False)

    # -- what a consumer holds: ack, release, touch, bury -------------------------------------

    def ack(self, task_id: int, consumer: str | None = None) -> Task:
        """Finish the task ``consumer`` holds: remove it and return it with state ``"-"``."""
        task_id = check_task_id(task_id)
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
            limits.freed(self, 1)
            task.state, task.owner, task.taken_key = DONE, None, None
            self._emit(task, "delete")
            return task

        return self._run(work)

    def _kept_key(self, what: str, consumer: str) -> tuple[Any, ...]:
        """The name of an engine-kept statement of this tube for ``consumer`` ("take": the
        claim, "held": the acknowledgement's filter): everything it depends on, the type
        deciding the rest."""
        # (The key rate's window, called only for a tube that has one: the hot path counts calls.)
        key_rate = self.key_rate_count and _key_rate_window(self)
        return ("tube", what, self.pk, self.type, self.key_limit, key_rate, consumer)

    def _held(self, consumer: str) -> Q:
        """Tasks ``consumer`` holds now (for ttl drivers: whose ttr has not run out).

        By owner alone: only a taken task has one. A filter naming the state would imply the
        predicate of the index of tasks not ready, by which a planner misled by statistics
        could read every taken task's dead entry instead of the ids' primary keys."""
        held = Q(owner=consumer)
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

        return self._run(work, pin=True)

    def _ack_rows(self, ids: list[int], consumer: str) -> int:
        """Delete the tasks of ``ids`` that ``consumer`` holds (in the current transaction)."""
        if (self.using, self.pk) not in _callbacks:
            # The hot path of a worker's batches: one DELETE whose filter is compiled once.
            acked: int = engine.delete_pks(
                self._tasks(), ids, where=lambda: self._held(consumer), key=self._kept_key("held", consumer)
            )
            return limits.freed(self, acked)
        held = self._held(consumer)
        total = 0
        for chunk in engine.batched(ids, self.using):
            tasks = list(engine.by_keys(self._tasks().filter(held), chunk).select_for_update())
            total += engine.delete_rows(engine.by_keys(self._tasks(), [t.pk for t in tasks]))
            for task in tasks:
                task.state, task.owner, task.taken_key = DONE, None, None
                self._emit(task, "delete")
        return limits.freed(self, total)

    def release(self, task_id: int, delay: float | None = None, consumer: str | None = None) -> Task:
        """Give back the task ``consumer`` holds: ready again, or delayed by ``delay`` seconds."""
        task_id = check_task_id(task_id)
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
            task.refresh_from_db(using=self.using)
            if task.state == READY:
                self._wake()
            else:
                limits.freed(self, 1)  # (delayed: a slot of the tube's limit is free)
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
            for chunk in engine.batched(ids, self.using):
                tasks = list(engine.by_keys(self._tasks().filter(held), chunk).select_for_update())
                total += engine.by_keys(self._tasks(), [t.pk for t in tasks]).update(
                    state=READY, owner=None, taken_key=None, event_at=None
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

        return self._run(work, pin=True)

    def touch(self, task_id: int, increment: float | None, consumer: str | None = None) -> Task:
        """Give the task ``consumer`` holds ``increment`` more seconds of ttr and ttl.

        ``None``, 0 or a negative increment returns the task unchanged (no ownership check).
        """
        task_id = check_task_id(task_id)
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
            task.refresh_from_db(using=self.using)
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
        if (self.using, self.pk) in _callbacks:
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
                engine.by_keys(self._tasks().filter(held), chunk).update(**_touched(increment))
                for chunk in engine.batched(task_ids, self.using)
            )
            self._count(touch=touched)
            return touched

        return self._run(work, lock_first=False, pin=True)

    def _owned(self, task_id: int, consumer: str) -> Task:
        """Return the locked task if ``consumer`` holds it; else raise (NotFound first)."""
        row = self._row(task_id, lock=True)
        if row is None or row.state != TAKEN or row.owner != consumer:
            self._ensure_exists()
            raise NotTaken(f"task {task_id} is not taken by consumer {consumer!r}")
        return row

    def bury(self, task_id: int) -> Task:
        """Bury the task (any state, no ownership needed) and return it."""
        task_id = check_task_id(task_id)

        def work() -> Task:
            task = self._existing(task_id, lock=True)
            if task.state == BURIED:
                return task
            self._tasks().filter(pk=task.pk).update(state=BURIED, owner=None, taken_key=None, event_at=None)
            self._count(bury=1)
            if self._is_utube:
                self._wake()  # its sub-queue may be free now
            elif task.state == TAKEN:
                limits.freed(self, 1)
            task.state, task.owner, task.taken_key, task.event_at = BURIED, None, None, None
            self._emit(task, "bury")
            return task

        return self._run(work)
