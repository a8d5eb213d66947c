"""Task loops (doloop): keep a set of ids refreshed forever.

One model is one loop. Workers ``claim`` the most overdue ids, which locks them for
``lock_for`` seconds, do their work, and mark them ``did`` (done: back of the queue) or
``unlock`` them (keep their place). ``bump`` makes ids urgent. Every time is the database's.

A row is in one of four states:

* **new**: ``lock_until`` and ``last_updated`` are NULL;
* **idle**: ``lock_until`` is NULL, ``last_updated`` is set;
* **locked**: ``lock_until`` is in the future;
* **bumped** (this includes expired locks): ``lock_until`` is now or in the past.

``claim`` takes bumped rows first (oldest ``lock_until`` first, then ``last_updated`` with
never-updated first, then id), then new rows (by id), then idle rows not updated for
``min_loop_time`` seconds (longest idle first, then id). Locked rows are never claimed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Self, TypeVar, cast

from django.core.exceptions import ValidationError
from django.db import models, transaction
from django.db.models import Count, F, Max, Min, Q, QuerySet
from django.db.models.base import ModelBase

from .. import engine
from ..validation import as_id_list, check_count, check_seconds
from .operating import is_paused, pause, resume

__all__ = ["TaskLoop", "TaskLoopManager", "TaskLoopQuerySet"]

T = TypeVar("T")

ONE_HOUR = 3600

# doloop's claim order, which the claim index (below) holds: oldest ``lock_until`` first, then
# never-updated rows (NULLs first on every database), then oldest ``last_updated``, then id.
CLAIM_ORDER = ("lock_until", F("last_updated").asc(nulls_first=True), "pk")


class TaskLoopIndex(engine.NullsFirstIndex):
    """The index behind the claim order: ``(lock_until, last_updated NULLS FIRST, id)``.

    On databases that sort NULLs last by default (PostgreSQL), ``last_updated`` is indexed
    ``NULLS FIRST`` so that the index matches :data:`CLAIM_ORDER` exactly (see
    :class:`engine.NullsFirstIndex`).
    """

    nulls_first = ("last_updated",)


class TaskLoopBase(ModelBase):
    """Metaclass of :class:`TaskLoop`: its default ``id`` yields to a subclass's own key,
    and every concrete loop gets the claim index, whatever its ``Meta`` says.
    """

    def __new__(mcs, name: str, bases: tuple[type, ...], attrs: dict[str, Any], **kwargs: Any) -> Any:
        # Like Django's automatic primary key: the default big integer ``id`` is only added when
        # the loop declares no primary key of its own (e.g. a OneToOneField to what it loops over).
        if "id" not in attrs and any(
            isinstance(value, models.Field) and value.primary_key for value in attrs.values()
        ):
            attrs = {**attrs, "id": None}
        cls = super().__new__(mcs, name, bases, attrs, **kwargs)
        opts = cast("type[models.Model]", cls)._meta
        if not opts.abstract and not opts.proxy and opts.get_field("lock_until").model is cls:
            # Added here rather than in TaskLoop.Meta.indexes: a subclass that writes its own
            # ``class Meta`` without inheriting TaskLoop.Meta would silently lose it.
            # The second index serves the admin's date-range filter on last_updated, which
            # otherwise scans a million-row loop when few rows match.
            for fields, index_class in (
                (["lock_until", "last_updated", opts.pk.name], TaskLoopIndex),
                (["last_updated"], models.Index),
            ):
                if not any(list(index.fields) == fields for index in opts.indexes):
                    index = index_class(fields=fields)
                    index.set_name_with_model(cls)
                    opts.indexes = [*opts.indexes, index]
                    # Migrations read the indexes of a model only if its Meta declared some.
                    opts.original_attrs["indexes"] = opts.indexes
        return cls


class TaskLoopQuerySet(models.QuerySet[Any]):
    """doloop's verbs. Those that read or change existing rows honour the queryset's filters."""

    # -- helpers -------------------------------------------------------------------------

    def _refuse_sliced(self, verb: str) -> None:
        if self.query.is_sliced:
            raise TypeError(f"{verb}() cannot be used on a sliced queryset")

    def _ids(self, id_or_ids: Any) -> list[Any]:
        """Return the ids as the primary key's Python type, unique, sorted where possible."""
        pk = self.model._meta.pk
        # A relation (a OneToOneField key): the field it points to says what an id is.
        target = getattr(pk, "target_field", pk) if pk.is_relation else pk
        ids: dict[Any, None] = {}
        for value in as_id_list(id_or_ids, "id_or_ids"):
            try:
                value = target.to_python(value)
                target.run_validators(value)
                # Some backends (SQLite) set no range on integer fields: bound them here, so that
                # an id too big for a 64-bit column is a ValueError, not a database error.
                if isinstance(value, int) and not -(2**63) <= value < 2**63:
                    raise ValidationError("out of the 64-bit integer range")
            except ValidationError as error:
                raise ValueError(
                    f"id_or_ids: {value!r} is not a valid id of {self.model._meta.label}: {'; '.join(error.messages)}"
                ) from None
            except (OverflowError, ValueError, TypeError) as error:  # e.g. int(math.inf)
                raise ValueError(
                    f"id_or_ids: {value!r} is not a valid id of {self.model._meta.label}: {error}"
                ) from None
            ids.setdefault(value, None)
        result = list(ids)
        try:
            # The same order in every transaction keeps concurrent writers from deadlocking.
            result.sort()
        except TypeError:
            pass
        return result

    def _run(self, work: Callable[[], T], dry_run: bool) -> T:
        """Run ``work()`` in one write transaction; roll it back when ``dry_run``."""
        if dry_run:
            with engine.write_transaction(self.model, self.db):
                result = work()
                transaction.set_rollback(True, using=self.db)
            return result
        return engine.run_in_transaction(self.model, self.db, work)

    def _batches(self, ids: list[Any], per_row: int = 1) -> Iterator[Sequence[Any]]:
        return engine.batched(ids, self.db, per_row=per_row)

    def _insert(self, ids: list[Any], *, updated: bool = False, mostly_present: bool = False) -> int:
        """Insert the ids that are not in the loop yet; return how many were new.

        ``mostly_present`` (did, unlock, bump): look first, insert only what is missing.
        """
        opts = self.model._meta
        pk = opts.pk
        # Only the key, and the columns that must not be left to NULL (a subclass's own fields
        # with defaults): their value is the same for every row, worked out once.
        extra = [f for f in opts.local_concrete_fields if f is not pk and (f.has_default() or not f.null)]
        extra = [f for f in extra if f.name != "last_updated" or not updated]
        rows = engine.MissingRows(self.model, self.db, extra, now="last_updated" if updated else None)
        new = 0
        for batch in self._batches(ids, per_row=rows.per_row):
            batch = self._not_present(batch) if mostly_present else batch
            batch = self._known(batch)
            if batch:
                new += rows.insert(batch)
        return new

    def _not_present(self, batch: Sequence[Any]) -> Sequence[Any]:
        """The ids of ``batch`` not in the loop. A plain read, which takes no lock, spares the
        insert: on MySQL an INSERT IGNORE would share-lock every existing row, and two
        transactions upgrading those to write locks (did's UPDATE) deadlock."""
        rows = self.model._base_manager.using(self.db)
        present = set(rows.filter(pk__in=batch).values_list("pk", flat=True))
        return [value for value in batch if value not in present]

    def _known(self, batch: Sequence[Any]) -> Sequence[Any]:
        """The ids of ``batch`` that exist in the table the loop's key points to (all of them
        if it points nowhere). MySQL's INSERT IGNORE would skip a missing one while PostgreSQL
        and SQLite fail at commit: skip it everywhere, as doloop's users expect of ids that no
        longer exist."""
        pk = self.model._meta.pk
        if not batch or pk is None or not pk.is_relation or pk.remote_field is None:
            return batch
        target = getattr(pk, "target_field", pk)  # the field the relation points to
        known = set(
            pk.remote_field.model._base_manager.using(self.db)
            .filter(**{f"{target.attname}__in": batch})
            .values_list(target.attname, flat=True)
        )
        return [value for value in batch if value in known]

    def _update(self, ids: list[Any], *, auto_add: bool, condition: Q | None = None, **changes: Any) -> int:
        """Optionally add missing ids, then update the matching rows; return the rows matched."""
        if auto_add and condition is None:
            # The common case is that every id is there: update first, and look for missing
            # ids only when fewer rows matched than ids were given (one query less per did).
            matched = self._update(ids, auto_add=False, **changes)
            if matched == len(ids):
                return matched
            rows = self.model._base_manager.using(self.db)
            present = {
                pk
                for batch in self._batches(ids)
                for pk in rows.filter(pk__in=batch).values_list("pk", flat=True)
            }
            missing = [value for value in ids if value not in present]
            if not missing:
                return matched
            return matched + self._update(missing, auto_add=True, condition=Q(), **changes)
        if auto_add:
            self._insert(ids, mostly_present=True)
        matched = 0
        for batch in self._batches(ids):
            queryset = self.filter(pk__in=batch)
            if condition is not None:
                queryset = queryset.filter(condition)
            # Django's MySQL backend sets CLIENT.FOUND_ROWS: the count is rows matched on every
            # database, not rows whose values changed.
            matched += queryset.update(**changes)
        return matched

    # -- verbs ---------------------------------------------------------------------------

    def add(self, id_or_ids: Any, updated: bool = False, dry_run: bool = False) -> int:
        """Add ids to the loop and return how many were new.

        Ids already in the loop are left alone. With ``updated``, new ids start as done now
        (at the back of the queue) rather than never updated (at the front).
        """
        ids = self._ids(id_or_ids)
        if not ids:
            return 0
        return self._run(lambda: self._insert(ids, updated=bool(updated)), bool(dry_run))

    def remove(self, id_or_ids: Any, dry_run: bool = False) -> int:
        """Remove ids from the loop and return how many were removed."""
        ids = self._ids(id_or_ids)
        self._refuse_sliced("remove")
        if not ids:
            return 0
        label = self.model._meta.label

        def work() -> int:
            removed = 0
            for batch in self._batches(ids):
                removed += self.filter(pk__in=batch).order_by().delete()[1].get(label, 0)
            return removed

        return self._run(work, bool(dry_run))

    def claim(
        self, limit: int, lock_for: float = ONE_HOUR, min_loop_time: float = ONE_HOUR, dry_run: bool = False
    ) -> list[Any]:
        """Lock up to ``limit`` ids for ``lock_for`` seconds and return them, most overdue first.

        First rows whose lock expired or that were bumped (by ``lock_until``, then
        ``last_updated`` with never-updated first, then id), then never-updated rows (by id),
        then rows not updated for at least ``min_loop_time`` seconds (by ``last_updated``, then
        id). Locked rows are skipped: two workers never hold the same id at the same time,
        unless someone bumps an id while it is held (doloop's locks have no owner).
        """
        # doloop's order of checks: lock_for, min_loop_time, then limit.
        lock_for = check_seconds(lock_for, "lock_for", positive=True)
        min_loop_time = check_seconds(min_loop_time, "min_loop_time")
        limit = check_count(limit, "limit")
        self._refuse_sliced("claim")
        if limit == 0:
            return []
        if dry_run:
            return self._run(lambda: self._claim(limit, lock_for, min_loop_time), True)
        # Not wrapped in a transaction: engine.claim keeps its candidate read outside one and
        # retries deadlocks only when it runs the outermost transaction itself.
        return self._claim(limit, lock_for, min_loop_time)

    def _claim_groups(self, min_loop_time: float = ONE_HOUR) -> list[tuple[Q, tuple[Any, ...]]]:
        """Return the claim groups, best first, as (claimable rows, their order).

        Each group is one range of the claim index, read in index order, so a claim reads
        only the rows it hands out, however large and however idle the loop. (One query with
        ``OR`` would make the databases scan every idle row when nothing is due.)
        """
        # Within the groups of unlocked rows, lock_until (and in the second, last_updated) is
        # NULL throughout: leaving it out of the ORDER BY changes no result. Whether it must
        # be left out, or repeated, for the index to deliver the order is the planner's call.
        repeat = engine.features(self.db).order_by_repeats_null_prefix
        return [
            # Bumped, or locked by a claim that has expired.
            (Q(lock_until__lte=engine.DbNow()), CLAIM_ORDER),
            # Never updated.
            (
                Q(lock_until__isnull=True, last_updated__isnull=True),
                CLAIM_ORDER if repeat else ("pk",),
            ),
            # Idle for at least min_loop_time.
            (
                Q(lock_until__isnull=True, last_updated__lte=engine.DbNow(-min_loop_time)),
                CLAIM_ORDER if repeat else CLAIM_ORDER[1:],
            ),
        ]

    def _claim(self, limit: int, lock_for: float, min_loop_time: float) -> list[Any]:
        queryset = self.order_by()
        changes = {"lock_until": engine.DbNow(lock_for)}
        # engine.claim reads 2 x the limit as candidates and re-checks them with an IN list:
        # keep each call within what one statement may bind.
        most = max(1, engine.features(self.db).max_params // 4)
        claimed: dict[Any, None] = {}
        for claimable, order in self._claim_groups(min_loop_time):
            while len(claimed) < limit:
                want = min(limit - len(claimed), most)
                got = engine.claim(queryset, limit=want, claimable=claimable, order_by=order, changes=changes)
                before = len(claimed)
                claimed.update(dict.fromkeys(got))
                # Fewer than wanted can mean rivals hold part of this group, not that it is
                # spent: go on with it until a call brings nothing new. (Nothing new also
                # ends the loop when locks shorter than a round trip hand back the same ids.)
                if len(claimed) == before:
                    break
        return list(claimed)

    def did(self, id_or_ids: Any, auto_add: bool = True, dry_run: bool = False) -> int:
        """Mark ids as done now and unlock them; return the number of rows updated.

        With ``auto_add``, ids not in the loop are added first (and counted).
        """
        ids = self._ids(id_or_ids)
        self._refuse_sliced("did")
        if not ids:
            return 0
        return self._run(
            lambda: self._update(ids, auto_add=bool(auto_add), last_updated=engine.DbNow(), lock_until=None),
            bool(dry_run),
        )

    def unlock(self, id_or_ids: Any, auto_add: bool = True, dry_run: bool = False) -> int:
        """Unlock ids without marking them done; return the number of rows updated.

        The ids keep their place in the queue. With ``auto_add``, missing ids are added first.
        """
        ids = self._ids(id_or_ids)
        self._refuse_sliced("unlock")
        if not ids:
            return 0
        return self._run(lambda: self._update(ids, auto_add=bool(auto_add), lock_until=None), bool(dry_run))

    def bump(self, id_or_ids: Any, lock_for: float = 0, auto_add: bool = True, dry_run: bool = False) -> int:
        """Make ids claimable ``lock_for`` seconds from now, ahead of everything else.

        A bump only ever brings ``lock_until`` forward (or sets it on an unlocked id), so
        repeated bumps cannot postpone an id. A negative ``lock_for`` ranks the id as if it had
        been bumped that many seconds ago. Bumping an id a worker holds with ``lock_for <= 0``
        lets another worker claim it at once. Return the number of ids bumped.
        """
        lock_for = check_seconds(lock_for, "lock_for")
        ids = self._ids(id_or_ids)
        self._refuse_sliced("bump")
        if not ids:
            return 0
        deadline = engine.DbNow(lock_for)
        return self._run(
            lambda: self._update(
                ids,
                auto_add=bool(auto_add),
                condition=Q(lock_until__isnull=True) | Q(lock_until__gt=deadline),
                lock_until=deadline,
            ),
            bool(dry_run),
        )

    def renew(self, id_or_ids: Any, lock_for: float = ONE_HOUR) -> int:
        """Lock ids that are still locked for ``lock_for`` seconds from now; return how many.

        doloop has no renew: a claim is ``lock_until = now + lock_for``, so renewing is writing
        it again, here on the ids a worker still holds (ids unlocked meanwhile, by ``did`` or
        ``unlock``, have no lock and stay untouched). A worker's heartbeat for its ids in flight.
        """
        lock_for = check_seconds(lock_for, "lock_for", positive=True)
        ids = self._ids(id_or_ids)
        self._refuse_sliced("renew")
        if not ids:
            return 0
        deadline = engine.DbNow(lock_for)
        chunks = list(self._batches(ids))

        def work() -> int:
            return sum(
                self.filter(pk__in=chunk, lock_until__isnull=False).update(lock_until=deadline)
                for chunk in chunks
            )

        # Through the engine: retried when the database is busy, and on SQLite in the writers'
        # turn (see JobBoard.extend_many).
        return engine.run_in_transaction(self.model, self.db, work, alone=len(chunks) == 1)

    def status(self, id_or_ids: Any) -> dict[Any, tuple[float | None, float | None]]:
        """Return ``{id: (since_updated, locked_for)}`` for the ids that are in the loop.

        ``since_updated`` is the number of seconds since the id was last done (``None`` if
        never); ``locked_for`` the seconds until its lock ends: positive while locked, zero
        or negative once bumped or expired, ``None`` when unlocked.
        """
        ids = self._ids(id_or_ids)
        self._refuse_sliced("status")
        result: dict[Any, tuple[float | None, float | None]] = {}
        for batch in self._batches(ids):
            rows = (
                self.filter(pk__in=batch)
                .order_by()
                .annotate(taskloop_now=engine.DbNow())
                .values_list("pk", "last_updated", "lock_until", "taskloop_now")
            )
            for pk, last_updated, lock_until, now in rows:
                result[pk] = (
                    None if last_updated is None else (now - last_updated).total_seconds(),
                    None if lock_until is None else (lock_until - now).total_seconds(),
                )
        return result

    def stats(self) -> dict[str, Any]:
        """Return doloop's ten statistics of the loop (or of this queryset's rows).

        ``locked`` and ``bumped`` count rows; ``min_id``/``max_id`` are ``None`` when there are
        no rows; the ``*_time`` values are float seconds, ``0.0`` when nothing is measured:
        ``min/max_lock_time`` until locks end, ``min/max_bump_time`` since bumps or expiries,
        ``min/max_update_time`` since ids were last done (never-done ids are left out).
        """
        self._refuse_sliced("stats")
        now, read = self._stats_read()
        locked, bumped = read["locked"], read["bumped"]

        def since(value: Any) -> float:
            return 0.0 if value is None else float((now - value).total_seconds())

        def until(value: Any) -> float:
            return 0.0 if value is None else float((value - now).total_seconds())

        ends = (locked["min_updated"], locked["max_updated"], bumped["min_updated"], bumped["max_updated"])
        updated = [value for value in (*ends, read["idle_oldest"], read["idle_newest"]) if value is not None]
        return {
            "locked": locked["count"],
            "bumped": bumped["count"],
            "min_id": read["min_id"],
            "max_id": read["max_id"],
            "min_lock_time": until(locked["min_lock"]),
            "max_lock_time": until(locked["max_lock"]),
            "min_bump_time": since(bumped["max_lock"]),
            "max_bump_time": since(bumped["min_lock"]),
            "min_update_time": since(max(updated) if updated else None),
            "max_update_time": since(min(updated) if updated else None),
        }

    def _stats_read(self) -> tuple[Any, dict[str, Any]]:
        """What :meth:`stats` reports on, read in one transaction at one clock reading."""
        using = self.db
        queryset = self.order_by()
        summary = {
            "count": Count("pk"),
            "min_updated": Min("last_updated"),
            "max_updated": Max("last_updated"),
            "min_lock": Min("lock_until"),
            "max_lock": Max("lock_until"),
        }
        with transaction.atomic(using=using):
            # One clock reading for every figure, as doloop does.
            now = engine.db_now(using)
            ids = queryset.values_list("pk", flat=True)
            oldest_idle, newest_idle = self._idle_ends()
            return now, {
                "min_id": ids.order_by("pk").first(),
                "max_id": ids.order_by("-pk").first(),
                # Locked and bumped rows are few (about workers x batch size): aggregate them.
                "locked": queryset.filter(lock_until__gt=now).aggregate(**summary),
                "bumped": queryset.filter(lock_until__lte=now).aggregate(**summary),
                "idle_oldest": oldest_idle.first(),
                "idle_newest": newest_idle.first(),
            }

    def _idle_ends(self) -> tuple[QuerySet[Any], QuerySet[Any]]:
        """Return the ``last_updated`` of idle rows, oldest first and newest first.

        Idle rows are most of the loop: each end is one read of the claim index
        (lock_until, last_updated NULLS FIRST, id), forward and backward, never a sort.
        """
        idle = (
            self.order_by()
            .filter(lock_until__isnull=True, last_updated__isnull=False)
            .values_list("last_updated", flat=True)
        )
        if engine.features(self.db).order_by_repeats_null_prefix:
            # PostgreSQL reads the index in order only if the ORDER BY repeats lock_until, in
            # the index's own direction: forward (ASC NULLS LAST), or wholly backward.
            return (
                idle.order_by("lock_until", F("last_updated").asc(nulls_first=True)),
                idle.order_by(
                    F("lock_until").desc(nulls_first=True), F("last_updated").desc(nulls_last=True)
                ),
            )
        return (
            idle.order_by(F("last_updated").asc(nulls_first=True)),
            idle.order_by(F("last_updated").desc(nulls_last=True)),
        )

    # -- named states, read with the database's clock ------------------------------------

    #: A row's states (the module's docstring): each one range of the claim index.
    STATES = ("new", "idle", "locked", "bumped")

    @staticmethod
    def state_condition(name: str) -> Q:
        """Return state ``name`` as a ``Q`` (for a filter, or an aggregate's ``filter=``)."""
        if name == "new":
            return Q(lock_until__isnull=True, last_updated__isnull=True)
        if name == "idle":
            return Q(lock_until__isnull=True, last_updated__isnull=False)
        if name == "locked":
            return Q(lock_until__gt=engine.DbNow())
        if name == "bumped":
            return Q(lock_until__lte=engine.DbNow())
        raise ValueError(f"name must be one of {', '.join(TaskLoopQuerySet.STATES)}, not {name!r}")

    def new(self) -> Self:
        """Rows never done and not locked: claimed after the bumped ones."""
        return self.filter(self.state_condition("new"))

    def idle(self) -> Self:
        """Rows done before and not locked (claimed once idle for ``min_loop_time``)."""
        return self.filter(self.state_condition("idle"))

    def locked(self) -> Self:
        """Rows under a lock that has not ended (a bump into the future is such a lock)."""
        return self.filter(self.state_condition("locked"))

    def bumped(self) -> Self:
        """Rows bumped or whose lock has ended: first in line."""
        return self.filter(self.state_condition("bumped"))

    def in_state(self, name: str) -> Self:
        """The rows in state ``name``, one of :attr:`STATES`."""
        return self.filter(self.state_condition(name))

    def state_counts(self) -> dict[str, int]:
        """Return ``{state: number of rows}`` for every name of :attr:`STATES` (one read)."""
        self._refuse_sliced("state_counts")
        counts = self.order_by().aggregate(
            **{name: Count("pk", filter=self.state_condition(name)) for name in self.STATES}
        )
        return {name: int(counts[name] or 0) for name in self.STATES}


TaskLoopManagerBase = models.Manager.from_queryset(TaskLoopQuerySet)


class TaskLoopManager(TaskLoopManagerBase[Any]):
    """Manager of :class:`TaskLoop` models: ``add``, ``remove``, ``claim``, ``did``,
    ``unlock``, ``bump``, ``status`` and ``stats``; ``pause``/``resume``/``paused`` for workers."""

    def pause(self) -> None:
        """Make workers claim nothing from this loop until :meth:`resume` (twice: a no-op).

        ``claim()`` called by your own code is not affected: the pause is for the loop's
        ``@loop`` handlers in ``manage.py workers``.
        """
        pause("loop", self.model._meta.label_lower, self.db)

    def resume(self) -> None:
        """Let workers claim from this loop again."""
        resume("loop", self.model._meta.label_lower, self.db)

    def paused(self) -> bool:
        """Whether workers leave this loop alone (read from the database)."""
        return is_paused("loop", self.model._meta.label_lower, self.db)


class TaskLoop(models.Model, metaclass=TaskLoopBase):
    """Abstract model of a task loop: one row per id to keep refreshed.

    The primary key is the id: a big integer by default. Declare another primary key to loop
    over strings, UUIDs, or the rows of another model::

        class FeedLoop(TaskLoop):
            feed = models.OneToOneField(Feed, primary_key=True, on_delete=models.CASCADE)
    """

    id = models.BigIntegerField(primary_key=True)
    #: When the id was last done (``did``); NULL if never.
    last_updated = models.DateTimeField(null=True, blank=True, editable=False)
    #: NULL: not locked. Future: locked until then. Now or past: bumped or lock expired.
    lock_until = models.DateTimeField(null=True, blank=True, editable=False)

    objects = TaskLoopManager()

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return str(self.pk)
