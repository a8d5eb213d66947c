"""The claim/lease engine under every facade (loops, job boards, tubes, Lockable).

One primitive: a row with a lease (an owner and a deadline on the database's clock), claimed
under ``SELECT … FOR UPDATE SKIP LOCKED`` (SQLite: under a write lock taken first). The
facades hold only their domain's policy: which rows are claimable, in which order, and what a
claim writes.

Claiming follows the candidate-then-lock pattern: (1) a plain, index-ordered read finds
candidate primary keys outside any transaction; (2) a short transaction locks those of them
that are still claimable with ``FOR UPDATE SKIP LOCKED``, (3) writes the lease, and (4) commits.
"""

from __future__ import annotations

import datetime
import random
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from django.core.exceptions import EmptyResultSet, FullResultSet
from django.db import DatabaseError, connections, transaction
from django.db.models import AutoField, Model, Q, QuerySet, signals
from django.db.models.base import ModelState
from django.db.models.fields import DateField, DateTimeField, Field
from django.db.models.sql import InsertQuery, Query, UpdateQuery
from django.utils.asyncio import async_unsafe

from ..conf import setting
from ..exceptions import DatabaseBusy
from .vendor import (
    DbNow,
    PartialIndex,
    data_files,
    db_now,
    features,
    is_retryable,
    notifying,
    take_write_lock,
    to_datetime,
    writers_in_turn,
)

__all__ = [
    "DbNow",
    "PartialIndex",
    "db_now",
    "data_files",
    "to_datetime",
    "features",
    "write_transaction",
    "run_in_transaction",
    "insert",
    "insert_together",
    "claim",
    "Claimed",
    "delete_pks",
    "delete_and_claim",
    "add_to",
    "batched",
    "discard_if_broken",
]

T = TypeVar("T")

#: The largest ``limit`` a claim passes to the database (more rows than any table holds).
MAX_LIMIT = 2**31 - 1

#: How many compiled statements a process keeps.
KEPT_STATEMENTS = 256
_kept: dict[Hashable, Any] = {}


@async_unsafe
def _send(connection: Any, sql: str, params: Sequence[Any], fetch: str = "all") -> Any:
    """Send a kept statement on Django connection ``connection``; return ``fetch``: its rows
    (``"all"``), its first row (``"one"``) or its row count (``"rowcount"``).

    As ``connection.cursor()`` would, less the cost of a cursor and its wrapper per statement
    (a sixth of a put's client CPU on PostgreSQL): the backend's own cursor, kept per
    connection, with Django's checks and error translation. Whenever anyone watches the
    queries (``DEBUG``, ``CaptureQueriesContext``, ``execute_wrapper``) or the connection is
    due a health check, it goes through ``connection.cursor()`` so that they see it.
    """
    if (
        connection.queries_logged
        or connection.execute_wrappers
        or connection.connection is None
        or (connection.health_check_enabled and not connection.health_check_done)
    ):
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return _fetched(cursor, fetch)
    kept = getattr(connection, "_taskloop_cursor", None)
    if kept is None or kept[0] is not connection.connection:
        with connection.wrap_database_errors:
            kept = connection._taskloop_cursor = (connection.connection, connection.create_cursor())
    connection.validate_no_broken_transaction()
    with connection.wrap_database_errors:
        kept[1].execute(sql, params)
        return _fetched(kept[1], fetch)


def _fetched(cursor: Any, fetch: str) -> Any:
    if fetch == "all":
        return cursor.fetchall()
    if fetch == "one":
        return cursor.fetchone()
    return cursor.rowcount


def _keep(key: Hashable, build: Callable[[], T]) -> T:
    """The statement kept under ``key``; ``build()`` makes it the first time (``None``: this
    shape has no kept statement, and the caller takes the ORM's way)."""
    try:
        return _kept[key]
    except KeyError:
        pass
    value = build()
    if len(_kept) >= KEPT_STATEMENTS:
        _kept.clear()
    _kept[key] = value
    return value


@contextmanager
def write_transaction(
    model: type[Model], using: str, savepoint: bool = True, lock_first: bool = True
) -> Iterator[None]:
    """Open ``atomic(using)`` whose first statement takes the write lock where that matters.

    On SQLite the whole database is the lock: taking it first turns a lock-upgrade deadlock
    into an ordinary wait bounded by the busy timeout. On other databases this is ``atomic``.
    ``lock_first=False`` for work whose first statement writes anyway (it takes the lock).
    """
    with transaction.atomic(using=using, savepoint=savepoint):
        if lock_first:
            take_write_lock(connections[using], model._meta.db_table)
        yield


def run_in_transaction(
    model: type[Model],
    using: str,
    work: Callable[[], T],
    savepoint: bool = True,
    alone: bool = False,
    lock_first: bool = True,
) -> T:
    """Run ``work()`` in a write transaction, retrying deadlocks and lock timeouts.

    Retries happen only when this is the outermost transaction: inside a caller's
    ``atomic()`` a deadlock has already spoiled the caller's transaction, so it surfaces as
    :class:`DatabaseBusy` for the caller to retry whole. ``savepoint=False`` saves the two
    round trips of a savepoint when nested, for work that raises only database errors (which
    spoil the enclosing transaction anyway). ``alone=True`` is for work that is one statement:
    a statement is atomic by itself, so outside a caller's transaction it runs in autocommit
    (no BEGIN and COMMIT round trips), and inside one it simply joins it. ``lock_first``: see
    :func:`write_transaction`.
    """
    outermost = not connections[using].in_atomic_block
    retries = setting("RETRIES")
    attempt = 0
    while True:
        try:
            if alone:
                # As save() does: inside a caller's transaction an error marks it for rollback.
                with transaction.mark_for_rollback_on_error(using):
                    if not outermost:
                        return work()
                    with writers_in_turn(using):
                        return work()
            if not outermost:
                with write_transaction(model, using, savepoint=savepoint, lock_first=lock_first):
                    return work()
            # SQLite: our own writers queue for the write lock (see writers_in_turn), and the
            # next one's turn comes at the commit, before the on_commit hooks run.
            with writers_in_turn(using) as let_go, write_transaction(model, using, lock_first=lock_first):
                transaction.on_commit(let_go, using=using)
                return work()
        except (DatabaseError, DatabaseBusy) as raised:
            # A DatabaseBusy from work nested inside (an inner run_in_transaction, which never
            # retries) is retried here, the one layer that can replay the whole transaction.
            error = raised.__cause__ if isinstance(raised, DatabaseBusy) else raised
            if not isinstance(error, DatabaseError) or not is_retryable(error, using):
                if outermost:
                    discard_if_broken(using)
                raise
            if not outermost:
                if isinstance(raised, DatabaseBusy):
                    raise
                raise DatabaseBusy(
                    f"database {using!r} was locked or deadlocked inside a transaction of the "
                    f"caller's ({error}); it is the caller's to retry whole"
                ) from error
            if attempt >= retries:
                tries = "1 try" if attempt == 0 else f"{attempt + 1} tries"
                raise DatabaseBusy(
                    f"database {using!r} stayed locked or deadlocked after {tries} "
                    f"({error}); on SQLite, raise OPTIONS['timeout'] or use fewer writers"
                ) from error
            attempt += 1
            # Jitter keeps the retrying processes from colliding again in step.
            time.sleep(min(0.5, 0.01 * 2**attempt) * random.uniform(0.5, 1.5))


def insert(
    objs: Sequence[Model],
    using: str,
    *,
    returning: Sequence[str] = (),
    notify: str | None = None,
    only_if: Model | None = None,
) -> bool:
    """INSERT ``objs`` (instances of one model) in one statement, as ``save()`` would write them.

    Sets each instance's primary key and the ``returning`` fields — values the database
    computes, such as deadlines given as :class:`DbNow` — from what the statement returns
    (``INSERT … RETURNING`` on PostgreSQL, MariaDB 10.5+ and SQLite 3.35+; elsewhere one
    INSERT per row and a read-back). ``notify``: a channel to ``NOTIFY`` within the same
    statement where the database has them (PostgreSQL), so that listeners hear of the rows
    when they commit. Runs in the caller's transaction if there is one; the caller keeps
    the rows within one statement's size (:func:`batched`).

    ``only_if``: a saved instance (of any model) that must still exist for the one row of
    ``objs`` to be written, checked by the INSERT itself (``INSERT … SELECT … FROM`` its table).
    Returns whether the rows were written. Inside a transaction, where foreign keys are checked
    only at commit (PostgreSQL, SQLite) or a failed statement spoils it (PostgreSQL), this says
    at once that a parent is gone, and writes nothing, without a look-up before the INSERT or a
    savepoint around it. (On MySQL/MariaDB an ``INSERT … SELECT`` takes the table's
    auto-increment lock for the statement: outside a transaction the foreign key does the job.)
    """
    if not objs:
        return True
    if only_if is not None and len(objs) != 1:
        raise ValueError(f"only_if guards one row, not {len(objs)}")
    model = type(objs[0])
    opts = model._meta
    connection = connections[using]
    fields, returned = _insert_fields(model, returning)
    one_statement = connection.features.can_return_rows_from_bulk_insert or (
        len(objs) == 1 and connection.features.can_return_columns_from_insert
    )
    if one_statement:
        return _insert_returning(objs, using, fields, returned, notify, only_if)
    # MySQL: no RETURNING. One INSERT per row for its key, then read back what the database
    # computed.
    for obj in objs:
        if not _insert_returning([obj], using, fields, [opts.pk], notify, only_if):
            return False  # (only_if holds one row)
    if returning:
        by_pk = model._base_manager.db_manager(using).only(*returning).in_bulk([obj.pk for obj in objs])
        for obj in objs:
            for name in returning:
                setattr(obj, name, getattr(by_pk[obj.pk], name))
    return True


def _exists(obj: Model, using: str) -> bool:
    return type(obj)._base_manager.db_manager(using).filter(pk=obj.pk).exists()


def insert_together(
    objs: Sequence[Model],
    using: str,
    *,
    returning: Sequence[Sequence[str]],
    notify: str | None = None,
    only_if: Model | None = None,
) -> bool:
    """INSERT ``objs`` — one row each, of any models — all or nothing, as :func:`insert` would
    one by one (``returning[i]`` for ``objs[i]``). On PostgreSQL that is one statement (its
    INSERTs as data-modifying ``WITH`` parts, the ``NOTIFY`` beside them): one round trip,
    no transaction of its own. Elsewhere the INSERTs share a transaction (the caller's, if
    there is one, with no savepoint: an error there spoils the caller's transaction, as
    ``save()``'s does). ``only_if``: as for :func:`insert`, for all the rows (none is written
    if it is gone); returns whether they were written."""
    connection = connections[using]
    statements = []
    if features(using).notify and connection.features.can_return_columns_from_insert:
        for obj, names in zip(objs, returning, strict=True):
            fields, returned = _insert_fields(type(obj), names)
            statement = _one_row_insert(obj, using, fields, returned, False, only_if)
            if statement is None:
                break
            statements.append((obj, statement, returned))
    if len(statements) != len(objs):

        def work() -> bool:
            for index, (obj, names) in enumerate(zip(objs, returning, strict=True)):
                # The first INSERT checks the guard: if it writes nothing, nothing is written.
                guard = only_if if index == 0 else None
                if not insert([obj], using, returning=names, notify=notify, only_if=guard):
                    return False
            return True

        # The first statement writes: no need to take SQLite's write lock before it.
        return run_in_transaction(type(objs[0]), using, work, savepoint=False, lock_first=False)
    parts, params, columns = [], [], []
    for index, (obj, statement, returned) in enumerate(statements):
        parts.append(f"r{index} AS ({statement.sql})")
        params.extend(statement.params(obj, connection, only_if))
        columns.extend(f"r{index}.{connection.ops.quote_name(field.column)}" for field in returned)
    if notify is not None:
        columns.append("(SELECT pg_notify(%s, ''))")
        params.append(notify)
    tables = ", ".join(f"r{index}" for index in range(len(statements)))
    sql = f"WITH {', '.join(parts)} SELECT {', '.join(columns)} FROM {tables}"
    row = _send(connection, sql, params, "one")
    if row is None:
        # Guarded and the guard is gone: every part saw the same snapshot, none wrote.
        return False
    start = 0
    for obj, statement, returned in statements:
        values = row[start : start + len(returned)]
        start += len(returned)
        _set_returned(obj, using, statement.convert(values, connection), returned)
    return True


def _insert_fields(model: type[Model], returning: Sequence[str]) -> tuple[list[Any], list[Any]]:
    """The fields an INSERT of ``model`` writes, and those it returns (the key first); kept
    per model (a put asks every time)."""

    def build() -> tuple[list[Any], list[Any]]:
        opts = model._meta
        fields = [f for f in opts.concrete_fields if not isinstance(f, AutoField) and not f.generated]
        return fields, [opts.pk, *(opts.get_field(name) for name in returning)]

    return _keep(("insert-fields", model, tuple(returning)), build)


def _insert_returning(
    objs: Sequence[Model],
    using: str,
    fields: list[Any],
    returned: list[Any],
    notify: str | None,
    only_if: Model | None = None,
) -> bool:
    connection = connections[using]
    notify = notify if notify is not None and features(using).notify else None
    statement = None
    if len(objs) == 1 and connection.features.can_return_columns_from_insert:
        # The hot path (a put): the statement Django would build, compiled once per shape.
        statement = _one_row_insert(objs[0], using, fields, returned, notify is not None, only_if)
    if statement is not None:
        obj = objs[0]
        params = statement.params(obj, connection, only_if)
        if notify is not None:
            params.append(notify)
        row = _send(connection, statement.sql, params, "one")
        if row is None:
            return False  # guarded, and the guard is gone: nothing written
        _set_returned(obj, using, statement.convert(row, connection), returned)
        return True
    if only_if is not None and not _exists(only_if, using):
        return False
    query = InsertQuery(type(objs[0]))
    query.insert_values(fields, objs)
    compiler = query.get_compiler(using=using)
    if notify is not None:
        plain = compiler.as_sql
        compiler.as_sql = lambda: [notifying(sql, params, notify) for sql, params in plain()]  # type: ignore[method-assign]
    rows = compiler.execute_sql(returned)
    for obj, row in zip(objs, rows, strict=False):
        _set_returned(obj, using, row, returned)
    return True


def _set_returned(obj: Model, using: str, row: Sequence[Any], returned: list[Any]) -> None:
    for field, value in zip(returned, row, strict=False):
        setattr(obj, field.attname, value)
    obj._state.adding = False
    obj._state.db = using


def _only_if(sql: str, connection: Any, guard: type[Model]) -> str:
    """Turn a one-row ``INSERT … VALUES (…) [RETURNING …]`` into ``INSERT … SELECT … FROM
    <guard's table> WHERE <its key> = %s [RETURNING …]``: the same statement, which writes
    its row only while that row exists (one more parameter, after the statement's own). The
    same text on every database; it costs the planner less than ``WHERE EXISTS (…)``."""
    start = sql.index(" VALUES (")
    end = sql.find(" RETURNING ")
    close = sql.rindex(")", 0, len(sql) if end < 0 else end)
    values = sql[start + len(" VALUES (") : close]
    qn = connection.ops.quote_name
    table, key = qn(guard._meta.db_table), qn(guard._meta.pk.column)
    return f"{sql[:start]} SELECT {values} FROM {table} WHERE {table}.{key} = %s{sql[close + 1 :]}"


class _OneRowInsert:
    """A one-row ``INSERT … RETURNING`` as Django's compiler writes it for one shape of row
    (which fields hold :class:`DbNow` values, and whether those have an offset), kept with the
    converters of what it returns. Building the statement costs about as much as a round trip
    to a local server; a put sends the same few shapes all its life. ``guard``: the model
    of :func:`insert`'s ``only_if`` (its row's key is the statement's last parameter)."""

    def __init__(
        self,
        obj: Model,
        using: str,
        fields: list[Any],
        returned: list[Any],
        notify: bool,
        guard: type[Model] | None = None,
    ) -> None:
        query = InsertQuery(type(obj))
        query.insert_values(fields, [obj])
        compiler = query.get_compiler(using=using)
        compiler.returning_fields = returned
        ((sql, _params),) = compiler.as_sql()
        if guard is not None:
            sql = _only_if(sql, compiler.connection, guard)
        self.sql = notifying(sql, [], "")[0] if notify else sql
        # Held so that their ids, part of this statement's key, are not reused.
        self.field_lists = (fields, returned)
        connection = compiler.connection
        # Per field: its DbNow shape, whether it reads its value through pre_save (auto_now
        # dates and fields that override it), and whether it stores None as NULL as is.
        self.fields = [
            (
                field,
                _shape_of(field, obj),
                field.attname,
                _own_pre_save(field),
                field.get_db_prep_save(None, connection) is None,
            )
            for field in fields
        ]
        table = type(obj)._meta.db_table
        cols = [field.get_col(table) for field in returned]
        self.converters = [
            (index, converters, col) for index, (converters, col) in compiler.get_converters(cols).items()
        ]

    def params(self, obj: Model, connection: Any, only_if: Model | None = None) -> list[Any]:
        """The statement's parameters for ``obj`` (and the guard's key), as the compiler would
        prepare them."""
        params: list[Any] = []
        for field, now, attname, pre_save, none_is_null in self.fields:
            if now is None:
                value = field.pre_save(obj, True) if pre_save else getattr(obj, attname)
                params.append(
                    None if value is None and none_is_null else field.get_db_prep_save(value, connection)
                )
            else:
                value = getattr(obj, attname)
                params.extend(getattr(value, f"as_{connection.vendor}")(None, connection)[1])
        if only_if is not None:
            params.append(only_if._meta.pk.get_db_prep_value(only_if.pk, connection))
        return params

    def convert(self, row: Sequence[Any], connection: Any) -> list[Any]:
        """The returned values as the model's fields hold them (e.g. aware datetimes)."""
        values = list(row)
        for index, converters, col in self.converters:
            for converter in converters:
                values[index] = converter(values[index], col, connection)
        return values


_one_row_inserts: dict[tuple[Any, ...], _OneRowInsert] = {}


def _own_pre_save(field: Any) -> bool:
    """Whether ``field.pre_save`` may give other than the instance's value (auto_now and
    auto_now_add dates, and fields whose classes override it)."""
    if getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False):
        return True
    return type(field).pre_save not in (Field.pre_save, DateField.pre_save, DateTimeField.pre_save)


#: Types of values that are never expressions (most of a row's values).
_PLAIN = frozenset({int, str, float, bool, dict, list, datetime.datetime})


def _shape_of(field: Any, obj: Model) -> bool | None:
    """A field's part of a statement's shape: None for a plain value, else whether its
    :class:`DbNow` has an offset (which adds a parameter). Other expressions raise TypeError."""
    value = getattr(obj, field.attname)
    if value is None or type(value) in _PLAIN:
        return None
    if isinstance(value, DbNow):
        return bool(value.seconds)
    if hasattr(value, "resolve_expression"):
        raise TypeError(value)
    return None


def _one_row_insert(
    obj: Model,
    using: str,
    fields: list[Any],
    returned: list[Any],
    notify: bool,
    only_if: Model | None = None,
) -> _OneRowInsert | None:
    """The kept statement for ``obj``'s shape; None if a value is an expression other than
    :class:`DbNow` (the compiler handles those)."""
    try:
        nows = tuple([_shape_of(field, obj) for field in fields])
    except TypeError:
        return None
    guard = None if only_if is None else type(only_if)
    # The fields are the lists _insert_fields keeps: their names are the same as long as
    # they are (and a kept statement holds them, so their ids are not reused).
    shape = (using, type(obj), id(fields), id(returned), nows, notify, guard)
    statement = _one_row_inserts.get(shape)
    if statement is None:
        statement = _one_row_inserts[shape] = _OneRowInsert(obj, using, fields, returned, notify, guard)
    return statement


def discard_if_broken(using: str) -> None:
    """Close the connection ``using`` if an error left it unusable (the server went away).

    Django drops such connections between requests; a worker or a script that keeps calling
    verbs would otherwise get "server has gone away" from every later call. Closing it lets the
    next call reconnect. Only for use outside any transaction.
    """
    connection = connections[using]
    if connection.connection is not None and connection.errors_occurred and not connection.in_atomic_block:
        if not connection.is_usable():
            connection.close()


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
    batches pay neither the ORM's query building nor a second round trip. ``claimable`` and
    ``changes`` may then be given as functions that build them, called only when needed.

    ``later`` (with ``fetch``): return a :class:`Claimed`, whose instances the caller makes
    once its transaction has committed. Turning a batch of rows into instances costs more
    than the statement that claimed them; on SQLite, every other writer waits while it
    happens inside the transaction.
    """
    if limit <= 0:
        return Claimed([]) if later else []
    # A limit beyond any table's size means "all of them"; larger ones overflow SQL's LIMIT
    # (a 64-bit integer, doubled below for the candidates) and fail inside the database.
    limit = min(limit, MAX_LIMIT)
    using = queryset.db
    statement = None
    if key is not None and direct and fetch and features(using).update_returning:
        statement = _kept_claim(queryset, limit, claimable, order_by, changes, key)
    if statement is not None:
        # One statement that writes: SQLite's write lock needs no taking first.
        rows = run_in_transaction(
            queryset.model, using, lambda: statement.rows(using), savepoint=False, lock_first=False
        )
        return (
            Claimed(rows, lambda rows: statement.finish(using, rows))
            if later
            else statement.finish(using, rows)
        )
    claimed = _claim_through_orm(queryset, limit, claimable, order_by, changes, fetch, overfetch, direct)
    return Claimed(claimed) if later else claimed


def _claim_through_orm(
    queryset: QuerySet[Any],
    limit: int,
    claimable: Q | Callable[[], Q],
    order_by: Sequence[Any],
    changes: dict[str, Any] | Callable[[], dict[str, Any]],
    fetch: bool,
    overfetch: int,
    direct: bool,
) -> list[Any]:
    """:func:`claim` in the ORM's statements: the candidate read, the locking read and the
    lease ``UPDATE`` (SQLite: the read and the ``UPDATE`` under the write lock)."""
    model = queryset.model
    using = queryset.db
    claimable = claimable() if callable(claimable) else claimable
    changes = changes() if callable(changes) else changes
    base = queryset.filter(claimable).order_by(*order_by)
    rows = model._base_manager.db_manager(using)

    def write(pks: list[Any]) -> list[Any]:
        if not pks:
            return []
        if fetch and features(using).update_returning:
            # The rows as the claim left them, from the UPDATE itself: no second read.
            by_pk = {obj.pk: obj for obj in update_returning(rows.filter(pk__in=pks), changes)}
            return [by_pk[pk] for pk in pks]
        rows.filter(pk__in=pks).update(**changes)
        if not fetch:
            return pks
        by_pk = rows.in_bulk(pks)
        return [by_pk[pk] for pk in pks]

    if features(using).write_lock_first:
        # SQLite: nobody else can write while we hold the lock, so read and write at once.
        return run_in_transaction(
            model, using, lambda: write(list(base.values_list("pk", flat=True)[:limit])), savepoint=False
        )

    of = ("self",) if features(using).for_update_of else ()

    # A locking read that locks only this table (``OF``) rechecks a row that a rival changed
    # meanwhile against the row's newest version, but reads the other tables it joins or
    # subqueries as of the statement's start: a row whose joined data left the filter after
    # that start would pass. Such claims read their filter again, in a statement of its own
    # (which sees everything committed before the rows were locked), and lease what passes.
    recheck_after_lock = bool(of) and _reads_other_tables(base)

    def lock_and_write(locking: QuerySet[Any]) -> list[Any]:
        # (2) Lock what is still claimable, skipping rows another claimer holds;
        # (3) write the lease; (4) commit on leaving run_in_transaction.
        locked = list(locking.select_for_update(skip_locked=True, of=of).values_list("pk", flat=True)[:limit])
        if recheck_after_lock and locked:
            still = set(base.filter(pk__in=locked).values_list("pk", flat=True))
            locked = [pk for pk in locked if pk in still]
        return write(locked)

    if direct:
        return run_in_transaction(model, using, lambda: lock_and_write(base), savepoint=False)

    # (1) Candidates, read outside the transaction: a few more than needed, so that a rival
    # holding some of them does not leave us empty-handed.
    try:
        candidates = list(base.values_list("pk", flat=True)[: limit * overfetch])
    except DatabaseError:
        # The first query after the server restarted is the one that fails: leave a fresh
        # connection for the next call rather than a dead one.
        discard_if_broken(using)
        raise
    if not candidates:
        return []
    # The locking read repeats the caller's whole filter, not only ``claimable``: a rival may
    # have changed a candidate since step (1) — e.g. reviewed and released it — so that it no
    # longer belongs to the queryset although its lease is free (seed 004: the
    # ``SELECT … FOR UPDATE SKIP LOCKED`` carries the whole WHERE).
    recheck = base.filter(pk__in=candidates)
    claimed = run_in_transaction(model, using, lambda: lock_and_write(recheck), savepoint=False)
    if claimed or len(candidates) < limit * overfetch:
        return claimed
    # Rivals held every candidate (they all read the same head of the queue). Let the index
    # scan itself skip what is locked: it finds free rows whenever there are any.
    return run_in_transaction(model, using, lambda: lock_and_write(base), savepoint=False)


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


def _joins(query: Query) -> bool:
    """Whether ``query`` joins a table besides its model's own."""
    return any(alias != query.base_table and query.alias_refcount[alias] for alias in query.alias_map)


def _reads_other_tables(queryset: QuerySet[Any]) -> bool:
    """Whether ``queryset``'s filter reads a table besides its model's own (a join or a
    subquery)."""
    query = queryset.query
    if _joins(query):
        return True

    def has_subquery(node: Any) -> bool:
        if isinstance(node, (Query, QuerySet)) or getattr(node, "subquery", False):
            return True
        children = list(getattr(node, "children", ()))
        for side in ("lhs", "rhs"):
            if hasattr(node, side):
                children.append(getattr(node, side))
        if hasattr(node, "get_source_expressions"):
            children.extend(node.get_source_expressions())
        if isinstance(node, (list, tuple)):
            children.extend(node)
        return any(has_subquery(child) for child in children if child is not None)

    return has_subquery(query.where)


def update_returning(queryset: QuerySet[Any], changes: dict[str, Any]) -> list[Any]:
    """``queryset.update(**changes)`` in one ``UPDATE … RETURNING`` statement; return the
    updated rows as model instances (only where :attr:`Features.update_returning`)."""
    model = queryset.model
    using = queryset.db
    connection = connections[using]
    query = queryset.query.chain(UpdateQuery)
    query.add_update_values(changes)
    compiler = query.get_compiler(using)
    sql, params = compiler.as_sql()
    fields = model._meta.concrete_fields
    qn = connection.ops.quote_name
    table = model._meta.db_table
    sql += " RETURNING " + ", ".join(f"{qn(table)}.{qn(field.column)}" for field in fields)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    converters = compiler.get_converters([field.get_col(table) for field in fields])
    if converters:
        rows = compiler.apply_converters(rows, converters)
    names = [field.attname for field in fields]
    return [model.from_db(using, names, row) for row in rows]


# -- statements compiled once ----------------------------------------------------------------
#
# A worker sends the same few statements batch after batch; building them through the ORM
# costs more client CPU than the database spends running them. These are compiled once per
# shape and kept (see _keep).


class _Instances:
    """Rows holding every concrete column of a model, turned into instances as
    ``Model.from_db`` would (converters applied)."""

    def __init__(self, model: type[Model], compiler: Any) -> None:
        self.model = model
        fields = model._meta.concrete_fields
        self.names = [field.attname for field in fields]
        table = model._meta.db_table
        self.converters = list(compiler.get_converters([field.get_col(table) for field in fields]).items())

    def make(self, using: str, rows: Sequence[Sequence[Any]]) -> list[Model]:
        connection = connections[using]
        if self.converters:
            converted = []
            for row in rows:
                row = list(row)
                for index, (converters, col) in self.converters:
                    value = row[index]
                    for converter in converters:
                        value = converter(value, col, connection)
                    row[index] = value
                converted.append(row)
            rows = converted
        model, names = self.model, self.names
        if signals.pre_init.has_listeners(model) or signals.post_init.has_listeners(model):
            return [model.from_db(using, names, row) for row in rows]
        # What from_db does, without __init__'s per-field setattr (a third of a claimed row's
        # cost): nobody listens for the init signals that would tell the difference.
        objs = []
        new = model.__new__
        for row in rows:
            obj = new(model)
            obj.__dict__.update(zip(names, row, strict=True))
            state = obj._state = ModelState()
            state.adding = False
            state.db = using
            objs.append(obj)
        return objs


class _ClaimStatement:
    """``UPDATE … WHERE pk IN (SELECT pk … ORDER BY … LIMIT n FOR UPDATE SKIP LOCKED)
    RETURNING *``: a claim in one statement (databases with ``UPDATE … RETURNING``)."""

    def __init__(self, sql: str, params: Sequence[Any], instances: _Instances, order: list[tuple[str, bool]]):
        self.sql = sql
        self.params = tuple(params)
        self.instances = instances
        self.order = order

    @classmethod
    def build(
        cls,
        queryset: QuerySet[Any],
        limit: int,
        claimable: Q | Callable[[], Q],
        order_by: Sequence[Any],
        changes: dict[str, Any] | Callable[[], dict[str, Any]],
    ) -> _ClaimStatement | None:
        """The statement, or ``None`` where the claim needs more than one (a filter that reads
        other tables is read again after the lock; an order on a nullable or computed value
        cannot be restored in Python)."""
        model = queryset.model
        using = queryset.db
        opts = model._meta
        claimable = claimable() if callable(claimable) else claimable
        changes = changes() if callable(changes) else changes
        base = queryset.filter(claimable).order_by(*order_by)
        if _reads_other_tables(base) or queryset.query.is_sliced or queryset.query.distinct:
            return None
        order = []
        for name in order_by:
            if not isinstance(name, str):
                return None
            field = opts.pk if name.lstrip("-") == "pk" else opts.get_field(name.lstrip("-"))
            if field.null or not field.concrete:
                return None
            order.append((field.attname, name.startswith("-")))
        if features(using).skip_locked:
            base = base.select_for_update(skip_locked=True)
        rows = model._base_manager.db_manager(using).filter(pk__in=base.values("pk")[:limit])
        query = rows.query.chain(UpdateQuery)
        query.add_update_values(changes)
        compiler = query.get_compiler(using)
        # Django compiles FOR UPDATE only inside a transaction; PostgreSQL's batch statement
        # runs in autocommit (engine.delete_and_claim), and may be the first to need this one.
        with transaction.atomic(using=using, savepoint=False):
            sql, params = compiler.as_sql()
        qn = connections[using].ops.quote_name
        table = opts.db_table
        sql += " RETURNING " + ", ".join(f"{qn(table)}.{qn(field.column)}" for field in opts.concrete_fields)
        return cls(sql, params, _Instances(model, compiler), order)

    def rows(self, using: str) -> list[tuple[Any, ...]]:
        """Send the claim; return its rows as the database gives them (see :meth:`finish`)."""
        return _send(connections[using], self.sql, self.params)

    def finish(self, using: str, rows: Sequence[Sequence[Any]]) -> list[Model]:
        """The claimed rows as instances, in the claim's order (``RETURNING`` gives them in
        no particular order)."""
        objs = self.instances.make(using, rows)
        for name, descending in reversed(self.order):
            objs.sort(key=lambda obj, name=name: getattr(obj, name), reverse=descending)
        return objs


class _Where:
    """A single-table queryset's ``WHERE``, compiled once: ``DELETE`` by primary keys."""

    def __init__(self, queryset: QuerySet[Any]) -> None:
        model = queryset.model
        using = queryset.db
        connection = connections[using]
        qn = connection.ops.quote_name
        query = queryset.query
        compiler = query.get_compiler(using)
        table = qn(model._meta.db_table)
        pk = model._meta.pk
        self.plain_pk = pk.get_internal_type() in ("AutoField", "BigAutoField", "SmallAutoField")
        self.pk_field = pk
        #: The filter matches no row at all: nothing to send.
        self.empty = False
        try:
            where, params = compiler.compile(query.where)
        except EmptyResultSet:
            self.empty = True
            where, params = "", []
        except FullResultSet:
            where, params = "", []
        self.params = tuple(params)
        #: ``DELETE FROM … WHERE (…) AND <pk>``: the caller adds ``IN (…)`` or ``= ANY(…)``.
        self.head = (
            f"DELETE FROM {table} WHERE " + (f"({where}) AND " if where else "") + f"{table}.{qn(pk.column)}"
        )
        self.delete = f"{self.head} IN "

    @classmethod
    def build(cls, queryset: QuerySet[Any]) -> _Where | None:
        query = queryset.query
        if _joins(query) or query.is_sliced or query.distinct or query.combinator:
            return None
        return cls(queryset)

    def prepared(self, pks: Sequence[Any], connection: Any) -> Sequence[Any]:
        """``pks`` as the database takes them (integer keys go as they are)."""
        if self.plain_pk:
            return pks
        return [self.pk_field.get_db_prep_value(pk, connection) for pk in pks]


def _kept_claim(
    queryset: QuerySet[Any],
    limit: int,
    claimable: Q | Callable[[], Q],
    order_by: Sequence[Any],
    changes: dict[str, Any] | Callable[[], dict[str, Any]],
    key: Hashable,
) -> _ClaimStatement | None:
    """The one-statement claim kept under ``key`` (see :func:`claim`), or ``None``."""
    return _keep(
        ("claim", key, queryset.db, limit),
        lambda: _ClaimStatement.build(queryset, limit, claimable, order_by, changes),
    )


def _kept_where(queryset: QuerySet[Any], where: Q | Callable[[], Q] | None, key: Hashable) -> _Where | None:
    """The ``WHERE`` of ``queryset`` and ``where`` kept under ``key`` (see :func:`delete_pks`),
    or ``None`` where it cannot be kept (a join)."""
    return _keep(("delete", key, queryset.db), lambda: _Where.build(_filtered(queryset, where)))


def _filtered(queryset: QuerySet[Any], where: Q | Callable[[], Q] | None) -> QuerySet[Any]:
    condition = where() if callable(where) else where
    return queryset if condition is None else queryset.filter(condition)


def delete_pks(
    queryset: QuerySet[Any],
    pks: Sequence[Any],
    *,
    where: Q | Callable[[], Q] | None = None,
    key: Hashable | None = None,
) -> int:
    """DELETE the rows of ``queryset`` (and ``where``) whose primary key is in ``pks`` (no
    signals, no cascades in Python: ``_raw_delete``); return how many. ``key`` names the
    filter (``where`` may then be a function that builds it), which is compiled once and kept:
    the keys change from call to call, the filter not."""
    if not pks:
        return 0
    using = queryset.db
    kept = _kept_where(queryset, where, key) if key is not None else None
    if kept is None:
        filtered = _filtered(queryset, where)
        return sum(filtered.filter(pk__in=chunk)._raw_delete(using) for chunk in batched(pks, using))
    if kept.empty:
        return 0
    connection = connections[using]
    total = 0
    for chunk in batched(pks, using):
        chunk = kept.prepared(chunk, connection)
        sql = f"{kept.delete}({', '.join(['%s'] * len(chunk))})"
        total += _send(connection, sql, [*kept.params, *chunk], "rowcount")
    return total


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
) -> tuple[int, list[Any], bool] | None:
    """What a worker does between two batches, as one statement: ``delete_pks(queryset, pks,
    where=…, key=delete_key)``, ``claim(queryset, limit=…, …, direct=True, fetch=True,
    key=key)``, and the counter ``UPDATE`` — ``counters`` is ``(model, match, {field:
    "deleted" | "claimed"})``: add to each field how many rows the statement deleted or
    claimed, on the row of ``model`` that ``match`` names.

    PostgreSQL runs the three as data-modifying ``WITH`` parts of one statement (one round
    trip, atomic by itself; in the caller's transaction if there is one): the deleted rows
    (taken ones) and the claimed rows (ready ones) must be different rows, since the parts
    share one snapshot. Returns ``(deleted, claimed, counted)``: ``counted`` is false when no
    counter row matched (the caller adds the counts its own way). ``None`` where it cannot be
    one statement (other databases, or a claim or filter that is not kept): the caller runs
    the parts one by one.
    """
    using = queryset.db
    if not features(using).modifying_with or not pks:
        return None
    claim_statement = _kept_claim(queryset, limit, claimable, order_by, changes, key)
    kept_where = _kept_where(queryset, where, delete_key)
    if claim_statement is None or kept_where is None or kept_where.empty:
        return None
    model, match, counted = counters
    connection = connections[using]
    pks = kept_where.prepared(pks, connection)

    def build() -> str:
        qn = connection.ops.quote_name
        opts = model._meta
        sets = ", ".join(
            f"{qn(opts.get_field(name).column)} = {qn(opts.get_field(name).column)} + "
            f"(SELECT COUNT(*) FROM {'d' if what == 'deleted' else 'c'})"
            for name, what in counted.items()
        )
        match_sql = " AND ".join(f"{qn(opts.get_field(name).column)} = %s" for name in match)
        return (
            f"c AS ({claim_statement.sql}), s AS (UPDATE {qn(opts.db_table)} SET {sets} WHERE {match_sql} "
            "RETURNING 1) SELECT (SELECT COUNT(*) FROM d), (SELECT COUNT(*) FROM s), c.* "
            "FROM (SELECT 1) AS one LEFT JOIN c ON TRUE"
        )

    # The keys as one array parameter (PostgreSQL's = ANY): the statement's text is the same
    # from batch to batch, with few enough parameters for the driver to keep it parsed.
    sql = _keep(
        ("delete-and-claim", key, delete_key, using, limit, model, tuple(match), tuple(counted)),
        lambda: f"WITH d AS ({kept_where.head} = ANY(%s) RETURNING 1), {build()}",
    )
    result = _send(connection, sql, [*kept_where.params, list(pks), *claim_statement.params, *match.values()])
    deleted, counted_rows = result[0][0], result[0][1]
    # No claimed row: the LEFT JOIN's one row, all NULL.
    claimed = [row[2:] for row in result if row[2] is not None]
    return deleted, claim_statement.finish(using, claimed), bool(counted_rows)


def add_to(model: type[Model], using: str, match: dict[str, Any], deltas: dict[str, int]) -> int:
    """Add ``deltas`` (field name: number) to the rows of ``model`` whose fields equal
    ``match`` (plain values); return how many rows. One ``UPDATE``, its SQL kept per shape."""

    def build() -> str:
        qn = connections[using].ops.quote_name
        opts = model._meta
        columns = [qn(opts.get_field(name).column) for name in deltas]
        sets = ", ".join(f"{column} = {column} + %s" for column in columns)
        where = " AND ".join(f"{qn(opts.get_field(name).column)} = %s" for name in match)
        return f"UPDATE {qn(opts.db_table)} SET {sets} WHERE {where}"

    sql = _keep(("add", model, using, tuple(match), tuple(deltas)), build)
    return _send(connections[using], sql, [*deltas.values(), *match.values()], "rowcount")


def batched(values: Sequence[T], using: str, per_row: int = 1) -> Iterator[Sequence[T]]:
    """Yield ``values`` in slices small enough for one statement on database ``using``."""
    size = max(1, features(using).max_params // max(1, per_row))
    for start in range(0, len(values), size):
        yield values[start : start + size]
