"""Claims: lock rows that no rival holds and write a lease on them, in one short transaction
(:func:`claim`); what a worker does between two batches, acknowledging and claiming in one
statement (:func:`delete_and_claim`); and locking rows for a change of one's own
(:func:`lock_free`).

Claiming follows the candidate-then-lock pattern: (1) a plain, index-ordered read finds
candidate primary keys outside any transaction; (2) a short transaction locks those of them
that are still claimable with ``FOR UPDATE SKIP LOCKED``, (3) writes the lease, and (4) commits.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from django.db import DatabaseError, connections
from django.db.models import Model, Q, QuerySet

from . import compiler, kept
from .cursor import ClaimCursor, Resume
from .transactions import discard_if_broken, run_in_transaction
from .vendor import features

#: The largest ``limit`` a claim passes to the database (more rows than any table holds).
MAX_LIMIT = 2**31 - 1


def claim(
    queryset: QuerySet[Any],
    *,
    limit: int,
    claimable: Q | Callable[[], Q],
    order_by: Sequence[Any],
    changes: dict[str, Any] | Callable[[], dict[str, Any]],
    fetch: bool = False,
    overfetch: int = 2,
    direct: bool = False,
    key: Hashable | None = None,
    later: bool = False,
    cursor: ClaimCursor | None = None,
    cursor_on: Sequence[str] | None = None,
    index: str | None = None,
    sub_index: str | None = None,
) -> Any:
    """Claim up to ``limit`` rows of ``queryset`` that match ``claimable``, best first.

    ``order_by`` is the claim order (it must end in a unique column, and an index should serve
    it); ``changes`` is what the claim writes (the lease: owner, deadline via :class:`DbNow`,
    counters via ``F()``). Return the claimed primary keys in claim order, or the model
    instances as they are after the claim when ``fetch`` is true.

    ``direct`` skips the candidate read (step 1): the locking read scans the queue itself,
    skipping what rivals hold. For small claims under contention (one row at a time), where
    every claimer's candidates would be the same head of the queue and all but one claimer
    would lose them and scan anyway.

    ``key`` (with ``direct`` and ``fetch``): a name for everything the statement depends on
    besides ``limit`` and the database (the queryset, ``claimable``, ``order_by``,
    ``changes``). Where the database updates with ``RETURNING`` (PostgreSQL, SQLite) the claim
    is then one statement, ``UPDATE … WHERE pk IN (SELECT pk … ORDER BY … LIMIT n FOR UPDATE
    SKIP LOCKED) RETURNING …``, compiled the first time and kept under ``key``: a worker's
    batches pay neither the ORM's query building nor a second round trip. Where it does not
    (MySQL/MariaDB) the claim is two statements kept the same way: a locking read of the rows
    whole, with what ``changes`` make of them and the clock read beside, and the ``UPDATE``
    pinned to that clock (:class:`.kept.LockedClaimStatement`). ``claimable`` and ``changes``
    may then be given as functions that build them, called only when needed.

    ``later`` (with ``fetch``): return a :class:`Claimed`, whose instances the caller makes
    once its transaction has committed. Turning a batch of rows into instances costs more
    than the statement that claimed them; on SQLite, every other writer waits while it
    happens inside the transaction.

    ``cursor`` (with ``fetch``): a consumer's :class:`~.cursor.ClaimCursor` (see there); its
    position stands on ``cursor_on``, the end of ``order_by`` that ``claimable`` pins to no
    one value (an index range starts at a row comparison only there; default: ``order_by``).
    ``index``: the name of the index that serves ``order_by``. A claim from a cursor's
    position names it where the database takes hints (:attr:`Features.index_hint`): MariaDB
    otherwise reads a long backlog after the position by the index's equal prefix from the
    head, through every entry that purge has not removed yet.

    ``sub_index``: the index serving the correlated subqueries of ``claimable`` on the claimed
    table itself (Django's alias ``U0``: a keyed tube's "nothing of this key ahead"), hinted
    where the database takes hints. MariaDB's optimizer, by statistics that a burst of puts
    left stale, read the whole table once per candidate instead: 100–250 ms a claim of 100
    from a keyed tube of 3,000 tasks, 2 ms hinted (as after an ANALYZE TABLE).
    """
    if limit <= 0:
        return Claimed([]) if later else []
    # A limit beyond any table's size means "all of them"; larger ones overflow SQL's LIMIT
    # (a 64-bit integer, doubled below for the candidates) and fail inside the database.
    limit = min(limit, MAX_LIMIT)
    using = queryset.db
    resume = Resume(cursor if fetch else None, queryset, cursor_on or order_by)
    hints = _hint(using, index) if resume.start is not None else None, _hint(using, sub_index)
    if key is not None and direct and fetch and keeps_claims(using):
        statement = kept.kept_claim(queryset, limit, claimable, order_by, changes, key, resume, hints)
        if statement is not None:
            return _claim_kept(queryset.model, using, statement, resume, later, limit)
    claimable = _and(claimable, resume.condition(using))
    rows = _claim_through_orm(queryset, limit, claimable, order_by, changes, fetch, overfetch, direct, *hints)
    resume.claimed(rows if fetch else [])
    return Claimed(rows) if later else rows


def keeps_claims(using: str) -> bool:
    """Whether a direct claim on database ``using`` can be kept statements (see :func:`claim`):
    one ``UPDATE … RETURNING``, or where there is none, a locking read and an ``UPDATE``."""
    found = features(using)
    return found.update_returning or found.skip_locked


def _claim_kept(
    model: type[Model],
    using: str,
    statement: kept.ClaimStatement | kept.LockedClaimStatement,
    resume: Resume,
    later: bool,
    limit: int,
) -> Any:
    """:func:`claim` as the kept statement(s), of up to ``limit`` rows."""
    # One statement that writes: SQLite's write lock needs no taking first.
    # (Pinned where it needs it: then the pin leads the claim's text, one round trip for both.)
    send: Callable[..., list[Any]]
    if isinstance(statement, kept.ClaimStatement):
        send, led = statement.rows, lambda lead: statement.rows(using, resume.start, lead, limit)
    else:
        send, led = statement.lock, None
    rows = run_in_transaction(
        model,
        using,
        lambda: send(using, resume.start, limit=limit),
        savepoint=False,
        lock_first=False,
        pin=True,
        led=led,
    )
    claimed = Claimed(rows, _finisher(statement, resume, using))
    return claimed if later else claimed.instances()


def _hint(using: str, index: str | None) -> str | None:
    """The index hint naming ``index`` on database ``using`` (``None``: none)."""
    template = features(using).index_hint
    if not template or index is None:
        return None
    return template.format(connections[using].ops.quote_name(index))


def _and(claimable: Q | Callable[[], Q], more: Q | None) -> Q | Callable[[], Q]:
    """``claimable`` and ``more`` (a function that builds it if ``claimable`` is one)."""
    if more is None:
        return claimable
    if callable(claimable):
        build = claimable
        return lambda: build() & more
    return claimable & more


def _claim_through_orm(
    queryset: QuerySet[Any],
    limit: int,
    claimable: Q | Callable[[], Q],
    order_by: Sequence[Any],
    changes: dict[str, Any] | Callable[[], dict[str, Any]],
    fetch: bool,
    overfetch: int,
    direct: bool,
    hint: str | None = None,
    sub_hint: str | None = None,
) -> list[Any]:
    """:func:`claim` in the ORM's statements: the candidate read, the locking read and the
    lease ``UPDATE`` (SQLite: the read and the ``UPDATE`` under the write lock). ``hint``:
    the index hint of a direct claim's locking read; ``sub_hint``: of the reads' correlated
    subqueries on the same table (see :func:`claim`'s ``sub_index``)."""
    model = queryset.model
    using = queryset.db
    claimable = claimable() if callable(claimable) else claimable
    base = queryset.filter(claimable).order_by(*order_by)
    lease = _Lease(queryset, changes() if callable(changes) else changes, fetch, hint, sub_hint)

    if features(using).write_lock_first:
        # SQLite: nobody else can write while we hold the lock, so read and write at once.
        return run_in_transaction(
            model,
            using,
            lambda: lease.write(list(base.values_list("pk", flat=True)[:limit])),
            savepoint=False,
        )
    if direct:
        return run_in_transaction(
            model, using, lambda: lease.lock_and_write(base, base, limit), savepoint=False
        )

    # (1) Candidates, read outside the transaction: a few more than needed, so that a rival
    # holding some of them does not leave us empty-handed.
    try:
        keys = base.values_list("pk", flat=True)[: limit * overfetch]
        candidates = compiler.read_hinted(keys, None, sub_hint) if sub_hint else list(keys)
    except DatabaseError as error:
        # The first query after the server restarted is the one that fails: leave a fresh
        # connection for the next call rather than a dead one.
        discard_if_broken(using, error)
        raise
    if not candidates:
        return []
    # The locking read repeats the caller's whole filter, not only ``claimable``: a rival may
    # have changed a candidate since step (1) — e.g. reviewed and released it — so that it no
    # longer belongs to the queryset although its lease is free (seed 004: the
    # ``SELECT … FOR UPDATE SKIP LOCKED`` carries the whole WHERE).
    recheck = base.filter(pk__in=candidates)
    claimed = run_in_transaction(
        model, using, lambda: lease.lock_and_write(recheck, base, limit), savepoint=False
    )
    if claimed or len(candidates) < limit * overfetch:
        return claimed
    # Rivals held every candidate (they all read the same head of the queue). Let the index
    # scan itself skip what is locked: it finds free rows whenever there are any.
    return run_in_transaction(model, using, lambda: lease.lock_and_write(base, base, limit), savepoint=False)


class _Lease:
    """Steps (2) and (3) of a claim through the ORM: lock what is still claimable, and write
    the lease on it."""

    def __init__(
        self,
        queryset: QuerySet[Any],
        changes: dict[str, Any],
        fetch: bool,
        hint: str | None = None,
        sub_hint: str | None = None,
    ) -> None:
        self.using = queryset.db
        self.rows = queryset.model._base_manager.db_manager(self.using)
        self.changes = changes
        self.fetch = fetch
        self.of = ("self",) if features(self.using).for_update_of else ()
        self.hint = hint
        self.sub_hint = sub_hint

    def write(self, pks: list[Any]) -> list[Any]:
        """(3) Write the lease on ``pks``; return them, or the rows as the claim left them."""
        if not pks:
            return []
        if self.fetch and features(self.using).update_returning:
            # The rows as the claim left them, from the UPDATE itself: no second read.
            by_pk = {obj.pk: obj for obj in update_returning(self.rows.filter(pk__in=pks), self.changes)}
            return [by_pk[pk] for pk in pks]
        self.rows.filter(pk__in=pks).update(**self.changes)
        if not self.fetch:
            return pks
        by_pk = {obj.pk: obj for obj in compiler.read_instances(self.rows.filter(pk__in=pks))}
        return [by_pk[pk] for pk in pks]

    def lock_and_write(self, locking: QuerySet[Any], base: QuerySet[Any], limit: int) -> list[Any]:
        """(2) Lock what is still claimable of ``locking``, skipping rows another claimer
        holds; (3) write the lease; (4) commit on leaving run_in_transaction.

        A locking read that locks only this table (``OF``) rechecks a row that a rival changed
        meanwhile against the row's newest version, but reads the other tables it joins or
        subqueries as of the statement's start: a row whose joined data left the filter after
        that start would pass. Such claims read their filter (``base``) again, in a statement
        of their own (which sees everything committed before the rows were locked), and lease
        what passes.
        """
        keys = locking.select_for_update(skip_locked=True, of=self.of).values_list("pk", flat=True)[:limit]
        hinted = self.hint or self.sub_hint
        locked = compiler.read_hinted(keys, self.hint, self.sub_hint) if hinted else list(keys)
        if self.of and locked and compiler.reads_other_tables(base):
            still = set(base.filter(pk__in=locked).values_list("pk", flat=True))
            locked = [pk for pk in locked if pk in still]
        return self.write(locked)


class Claimed:
    """Claimed rows (see :func:`claim`'s ``later``): ``len()`` at once, ``instances()``, made
    the first time it is called and then kept, in the claim's order."""

    __slots__ = ("_rows", "_finish", "_objs")

    def __init__(
        self, rows: Sequence[Any], finish: Callable[[Sequence[Any]], list[Any]] | None = None
    ) -> None:
        self._rows = rows
        self._finish = finish
        self._objs: list[Any] | None = None if finish is not None else list(rows)

    def __len__(self) -> int:
        return len(self._rows)

    def instances(self) -> list[Any]:
        if self._objs is None:
            assert self._finish is not None
            self._objs = self._finish(self._rows)
        return self._objs


def update_returning(queryset: QuerySet[Any], changes: dict[str, Any]) -> list[Any]:
    """``queryset.update(**changes)`` in one ``UPDATE … RETURNING`` statement; return the
    updated rows as model instances (only where :attr:`Features.update_returning`)."""
    sql, params, update = compiler.compile_update(queryset, changes)
    sql += compiler.returning(queryset.model, connections[queryset.db])
    rows = compiler.execute(queryset.db, sql, params)
    return compiler.Instances(queryset.model, update).make(queryset.db, rows)


def lock_free(queryset: QuerySet[Any], limit: int | None = None) -> list[Any]:
    """Lock, for the current transaction, the rows of ``queryset`` (in its order; at most
    ``limit``) that no rival holds, and return them: ``FOR UPDATE SKIP LOCKED`` where the
    database has row locks, and under the write lock already taken on SQLite. A rival that
    holds a row is changing it: it applies the change, or the caller does next time."""
    rows = queryset.select_for_update(skip_locked=features(queryset.db).skip_locked)
    return list(rows if limit is None else rows[: min(limit, MAX_LIMIT)])


def lock_rows(
    rows: Callable[[], QuerySet[Any]], fields: Sequence[str], using: str, key: Hashable
) -> list[tuple[Any, ...]]:
    """Lock the rows of the queryset ``rows()`` builds for the current transaction, waiting for
    a rival that holds one, and return their ``fields`` (raw values: for plain columns such as
    numbers): ``FOR NO KEY UPDATE`` on PostgreSQL (rows that name them by foreign key are
    written on meanwhile: a put into a tube whose row is locked so does not wait), ``FOR
    UPDATE`` on MySQL/MariaDB, and under the write lock already taken on SQLite. What
    serializes the writers that look at a parent row before they change its children. The
    statement is compiled once, kept under ``key`` (all it depends on, its parameters too):
    ``rows`` is called only then."""
    connection = connections[using]

    def build() -> tuple[str, tuple[Any, ...]]:
        no_key = bool(connection.features.has_select_for_no_key_update)
        return compiler.compile_select(rows().select_for_update(no_key=no_key).values_list(*fields))

    sql, params = kept.keep(("lock rows", key, using), build)
    return [tuple(row) for row in compiler.send(connection, sql, params)]


def count_rows(rows: Callable[[], QuerySet[Any]], using: str, key: Hashable) -> int:
    """How many rows the queryset ``rows()`` builds has now: one ``SELECT COUNT(*)``, compiled
    once and kept under ``key`` (all it depends on, its parameters too)."""

    def build() -> tuple[str, tuple[Any, ...]]:
        inner, params = compiler.compile_select(rows().order_by().values_list("pk"))
        return f"SELECT COUNT(*) FROM ({inner}) counted", params

    sql, params = kept.keep(("count rows", key, using), build)
    return int(compiler.send(connections[using], sql, params, "one")[0])


def delete_and_claim(
    queryset: QuerySet[Any],
    pks: Sequence[Any],
    *,
    where: Q | Callable[[], Q],
    delete_key: Hashable,
    limit: int,
    claimable: Q | Callable[[], Q],
    order_by: Sequence[Any],
    changes: dict[str, Any] | Callable[[], dict[str, Any]],
    key: Hashable,
    counters: tuple[type[Model], dict[str, Any], dict[str, str]],
    cursor: ClaimCursor | None = None,
    cursor_on: Sequence[str] | None = None,
    later: bool = False,
    lead: str = "",
) -> tuple[int, Any, bool] | None:
    """What a worker does between two batches, as one statement: ``delete_pks(queryset, pks,
    where=…, key=delete_key)``, ``claim(queryset, limit=…, …, direct=True, fetch=True,
    key=key)``, and the counter ``UPDATE`` — ``counters`` is ``(model, match, {field:
    "deleted" | "claimed"})``: add to each field how many rows the statement deleted or
    claimed, on the row of ``model`` that ``match`` names.

    PostgreSQL runs the three as data-modifying ``WITH`` parts of one statement (atomic by
    itself; in the caller's transaction if there is one): the deleted rows
    (taken ones) and the claimed rows (ready ones) must be different rows, since the parts
    share one snapshot. Returns ``(deleted, claimed, counted)``: ``counted`` is false when no
    counter row matched (the caller adds the counts its own way). ``None`` where it cannot be
    one statement (other databases, or a claim or filter that is not kept): the caller runs
    the parts one by one. ``later``: the claimed rows as a :class:`Claimed` (see
    :func:`claim`), to be made instances after the commit. ``lead``: see :func:`.compiler.send`.
    """
    using = queryset.db
    if not features(using).modifying_with or not pks:
        return None
    resume = Resume(cursor, queryset, cursor_on or order_by)
    claim_statement = kept.kept_claim(queryset, limit, claimable, order_by, changes, key, resume)
    kept_where = kept.kept_where(queryset, where, delete_key)
    if not isinstance(claim_statement, kept.ClaimStatement) or kept_where is None or kept_where.empty:
        return None
    model, match, counted = counters
    connection = connections[using]
    # The keys as one array parameter (PostgreSQL's = ANY): the statement's text is the same
    # from batch to batch, with few enough parameters for the driver to keep it parsed.
    shape = (model, tuple(match), tuple(counted), resume.start is not None)
    sql = kept.keep(
        # (The claim's limit is its parameter, unless its text has it: see kept.kept_claim.)
        ("delete-and-claim", key, delete_key, using, claim_statement.limit, shape),
        lambda: _delete_and_claim_sql(kept_where, claim_statement, counters, using),
    )
    prepared = list(kept_where.prepared(pks, connection))
    params = [prepared, *kept_where.params, *claim_statement.bound(resume.start, limit), *match.values()]
    result = compiler.send(connection, sql, params, made_into_instances=True, lead=lead)
    deleted, counted_rows = result[0][0], result[0][1]
    # No claimed row: the LEFT JOIN's one row, all NULL.
    claimed = Claimed(
        [row[2:] for row in result if row[2] is not None], _finisher(claim_statement, resume, using)
    )
    return deleted, claimed if later else claimed.instances(), bool(counted_rows)


def _finisher(
    statement: kept.ClaimStatement | kept.LockedClaimStatement, resume: Resume, using: str
) -> Callable[[Sequence[Any]], list[Any]]:
    """What makes a kept claim's rows instances (and moves its cursor), for :class:`Claimed`."""

    def finish(rows: Sequence[Any]) -> list[Any]:
        objs = statement.finish(using, rows)
        resume.claimed(objs)
        return objs

    return finish


def _delete_and_claim_sql(
    kept_where: kept.Where,
    claim_statement: kept.ClaimStatement,
    counters: tuple[type[Model], dict[str, Any], dict[str, str]],
    using: str,
) -> str:
    """The statement of :func:`delete_and_claim`: ``d`` deletes, ``c`` claims, ``s`` counts."""
    model, match, counted = counters
    qn = connections[using].ops.quote_name
    sets = ", ".join(
        f"{qn(compiler.column(model, name))} = {qn(compiler.column(model, name))} + "
        f"(SELECT COUNT(*) FROM {'d' if what == 'deleted' else 'c'})"
        for name, what in counted.items()
    )
    match_sql = " AND ".join(f"{qn(compiler.column(model, name))} = %s" for name in match)
    return (
        f"WITH d AS ({kept_where.head} = ANY(%s){kept_where.tail} RETURNING 1), "
        f"c AS ({claim_statement.sql}), s AS (UPDATE {qn(model._meta.db_table)} SET {sets} WHERE {match_sql} "
        "RETURNING 1) SELECT (SELECT COUNT(*) FROM d), (SELECT COUNT(*) FROM s), c.* "
        "FROM (SELECT 1) AS one LEFT JOIN c ON TRUE"
    )


@dataclass(frozen=True)
class ClaimSpec:
    """A claim as :func:`claim` takes it (``fetch=True``), for :meth:`run` and
    :func:`ack_and_claim`: the engine decides how it is sent.

    ``claimable`` and ``changes`` may be functions that build them. :meth:`prepared` builds
    them at once unless the claim will be a kept statement (compiled once, when they are
    needed): a claim through the ORM should not build its filter inside the transaction,
    where locks (on SQLite, the whole database) wait on it. ``key=None``: never kept.
    """

    queryset: QuerySet[Any]
    limit: int
    claimable: Q | Callable[[], Q]
    order_by: Sequence[Any]
    changes: dict[str, Any] | Callable[[], dict[str, Any]]
    key: Hashable | None = None
    direct: bool = False
    #: A consumer's claim cursor (see :mod:`.cursor`), or ``None``: every claim from the head.
    cursor: ClaimCursor | None = None
    #: The columns the cursor's position stands on (see :func:`claim`).
    cursor_on: Sequence[str] | None = None
    #: The index that serves ``order_by`` (see :func:`claim`).
    index: str | None = None
    #: The index that serves ``claimable``'s subqueries on the same table (see :func:`claim`).
    sub_index: str | None = None

    def kept(self) -> bool:
        """Whether the claim is one statement, compiled once and kept under :attr:`key`."""
        return self.key is not None and self.direct and keeps_claims(self.queryset.db)

    def prepared(self) -> ClaimSpec:
        """This spec, its filter and changes built now unless the claim is kept."""
        if self.kept():
            return self
        claimable = self.claimable() if callable(self.claimable) else self.claimable
        changes = self.changes() if callable(self.changes) else self.changes
        return replace(self, claimable=claimable, changes=changes)

    def limited_to(self, limit: int) -> ClaimSpec:
        """This spec, claiming at most ``limit`` rows (its statement kept apart, by limit)."""
        return replace(self, limit=limit)

    def run(self, *, later: bool = False) -> Any:
        """:func:`claim` of this spec (``fetch=True``)."""
        return claim(
            self.queryset,
            limit=self.limit,
            claimable=self.claimable,
            order_by=self.order_by,
            changes=self.changes,
            fetch=True,
            direct=self.direct,
            key=self.key,
            later=later,
            cursor=self.cursor,
            cursor_on=self.cursor_on,
            index=self.index,
            sub_index=self.sub_index,
        )


def ack_and_claim(
    spec: ClaimSpec,
    pks: Sequence[Any],
    *,
    where: Q | Callable[[], Q],
    delete_key: Hashable,
    counters: tuple[type[Model], dict[str, Any], dict[str, str]],
) -> tuple[int, list[Any], bool] | None:
    """:func:`delete_and_claim` of ``pks`` and ``spec`` where the database makes them one
    statement (a kept claim, on PostgreSQL), in the caller's transaction or in one of its own
    that pins the statement's plans first (``run_in_transaction(pin=True)``); ``None``
    elsewhere (the caller runs the parts one by one)."""
    if not pks or not spec.kept() or not features(spec.queryset.db).modifying_with:
        return None
    key = spec.key
    assert key is not None

    def work(lead: str = "") -> tuple[int, Any, bool] | None:
        return delete_and_claim(
            spec.queryset,
            pks,
            where=where,
            delete_key=delete_key,
            limit=spec.limit,
            claimable=spec.claimable,
            order_by=spec.order_by,
            changes=spec.changes,
            key=key,
            counters=counters,
            cursor=spec.cursor,
            cursor_on=spec.cursor_on,
            later=True,
            lead=lead,
        )

    # The pin leads the statement's text where the driver allows: one round trip for both.
    done = run_in_transaction(spec.queryset.model, spec.queryset.db, work, alone=True, pin=True, led=work)
    if done is None:
        return None
    deleted, claimed, counted = done
    # The instances after the commit (PostgreSQL: in a transaction when its plans are pinned).
    return deleted, claimed.instances(), counted
