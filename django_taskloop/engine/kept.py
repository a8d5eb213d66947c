"""Statements compiled once and kept: a worker's claim, its acknowledgement's ``DELETE``, a
put's ``INSERT``, the counters' ``UPDATE``.

A worker sends the same few statements batch after batch; building them through the ORM
costs more client CPU than the database spends running them. These are compiled once per
shape (with Django's own compiler, see :mod:`.compiler`) and kept.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Callable, Hashable, Sequence
from functools import partial
from operator import attrgetter
from typing import Any, TypeVar

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.base.operations import BaseDatabaseOperations
from django.db.models import DateField, DateTimeField, Expression, Field, JSONField, Model, Q, QuerySet

from . import compiler
from .cursor import Resume, order_attributes
from .vendor import DbNow, batched, features, notifying, on_clock_change, pin_clock

T = TypeVar("T")

#: How many compiled statements a process keeps.
KEPT_STATEMENTS = 256
_kept: dict[Hashable, Any] = {}
# A kept statement holds the database's clock as it was compiled (a test may move it).
on_clock_change(_kept.clear)


def keep(key: Hashable, build: Callable[[], T]) -> T:
    """The statement kept under ``key``; ``build()`` makes it the first time (``None``: this
    shape has no kept statement, and the caller takes the ORM's way)."""
    try:
        kept: T = _kept[key]  # (what build() made under this key)
        return kept
    except KeyError:
        pass
    value = build()
    if len(_kept) >= KEPT_STATEMENTS:
        _kept.clear()
    _kept[key] = value
    return value


# -- the claim -------------------------------------------------------------------------------


class ClaimStatement:
    """``UPDATE … WHERE pk IN (SELECT pk … ORDER BY … LIMIT n FOR UPDATE SKIP LOCKED)
    RETURNING *``: a claim in one statement (databases with ``UPDATE … RETURNING``)."""

    def __init__(
        self,
        sql: str,
        params: Sequence[Any],
        instances: compiler.Instances,
        order: list[tuple[str, bool]],
        limit: int | None = None,
    ):
        self.sql = sql
        self.params = tuple(params)
        self.instances = instances
        self.order = order
        #: The limit written in the text; ``None``: the limit is a parameter (see _limit_param).
        self.limit = limit
        #: (place in params, value index) of each stand-in the sends fill in.
        self._places = _places_of(self.params)

    def bound(self, values: Sequence[Any] | None = None, limit: int | None = None) -> tuple[Any, ...]:
        """The statement's parameters, its stand-ins replaced: a claim after a cursor's
        position by ``values``, the limit by ``limit``."""
        return _bound(self.params, self._places, values, limit)

    @classmethod
    def build(
        cls,
        queryset: QuerySet[Any],
        limit: int | None,
        claimable: Q | Callable[[], Q],
        order_by: Sequence[Any],
        changes: dict[str, Any] | Callable[[], dict[str, Any]],
        after: tuple[int, Callable[[Sequence[Any]], Q | None]] | None = None,
    ) -> ClaimStatement | None:
        """The statement, or ``None`` where the claim needs more than one (a filter that reads
        other tables is read again after the lock; an order on a nullable or computed value
        cannot be restored in Python). ``after``: how many values a cursor's position has, and
        the filter for rows after it, given stand-ins for them (:meth:`bound` fills them in).
        ``limit``: ``None`` for the limit as a parameter (see :func:`_limit_param`)."""
        model = queryset.model
        using = queryset.db
        claimable = claimable() if callable(claimable) else claimable
        changes = changes() if callable(changes) else changes
        order = order_attributes(model, order_by)
        if order is None:
            return None
        if after is not None:
            count, condition = after
            claimable &= condition([_StandIn(index) for index in range(count)]) or Q()
        base = queryset.filter(claimable).order_by(*order_by)
        if compiler.reads_other_tables(base) or queryset.query.is_sliced or queryset.query.distinct:
            return None
        if features(using).skip_locked:
            base = base.select_for_update(skip_locked=True)
        compiled_limit = _COMPILED_LIMIT if limit is None else limit
        rows = model._base_manager.db_manager(using).filter(pk__in=base.values("pk")[:compiled_limit])
        # Django compiles FOR UPDATE only inside a transaction; PostgreSQL's batch statement
        # runs in autocommit (engine.delete_and_claim), and may be the first to need this one.
        sql, params, update = compiler.compile_update(rows, changes, for_update=True)
        if connections[using].vendor == "postgresql":
            sql = compiler.by_row_address(sql)
        sql += compiler.returning(model, connections[using])
        if limit is None:
            (sql, params), limit = _limit_param(sql, params)
        return cls(sql, params, compiler.Instances(model, update), order, limit)

    def rows(
        self, using: str, values: Sequence[Any] | None = None, lead: str = "", limit: int | None = None
    ) -> list[tuple[Any, ...]]:
        """Send the claim (``values``, ``limit``: see :meth:`bound`; ``lead``: see
        :func:`.compiler.send`); return its rows as the database gives them (see :meth:`finish`)."""
        # (fetch="all": rows, made into instances by finish() alone)
        return compiler.send(
            connections[using], self.sql, self.bound(values, limit), made_into_instances=True, lead=lead
        )

    def finish(self, using: str, rows: Sequence[Sequence[Any]]) -> list[Model]:
        """The claimed rows as instances, in the claim's order (``RETURNING`` gives them in
        no particular order)."""
        objs = self.instances.make(using, rows)
        for name, descending in reversed(self.order):
            objs.sort(key=attrgetter(name), reverse=descending)
        return objs


def kept_claim(
    queryset: QuerySet[Any],
    limit: int,
    claimable: Q | Callable[[], Q],
    order_by: Sequence[Any],
    changes: dict[str, Any] | Callable[[], dict[str, Any]],
    key: Hashable,
    resume: Resume | None = None,
    hints: tuple[str | None, str | None] = (None, None),
) -> ClaimStatement | LockedClaimStatement | None:
    """The claim kept under ``key`` (see :func:`engine.claim`), or ``None``; with a ``resume``
    that starts after a position, its variant that starts there. One ``UPDATE … RETURNING``
    (:class:`ClaimStatement`) where the database has it, else a locking read and an
    ``UPDATE`` (:class:`LockedClaimStatement`, with ``hints``: the read's index hint, and its
    subqueries')."""
    using = queryset.db
    locked = not features(using).update_returning

    def build(
        limit: int | None, after: tuple[int, Callable[[Sequence[Any]], Q | None]] | None
    ) -> ClaimStatement | LockedClaimStatement | None:
        if locked:
            return LockedClaimStatement.build(queryset, limit, claimable, order_by, changes, after, *hints)
        return ClaimStatement.build(queryset, limit, claimable, order_by, changes, after)

    kind = "locked claim" if locked else "claim"
    after = None
    if resume is not None and resume.start is not None:
        kind, condition, count = f"{kind} after", resume.condition, len(resume.start)
        after = (count, lambda values: condition(using, values))
    # One statement whatever the limit, which is its parameter: a worker's claims grow from
    # one item to its batch, and follow its handler's measured time (each limit its own
    # statement cost an ORM compile, milliseconds, and a place among the kept ones).
    statement = keep((kind, key, using), lambda: build(None, after))
    if statement is not None and statement.limit is not None:
        # (The text did not take the limit as a parameter: one statement per limit.)
        statement = keep((kind, key, using, limit), lambda: build(limit, after))
    return statement


class LockedClaimStatement:
    """A claim where the database cannot return an ``UPDATE``'s rows (MySQL/MariaDB), as
    two statements compiled once: ``SELECT <every column>, <what the lease makes of it>,
    <the clock> … ORDER BY … LIMIT n FOR UPDATE SKIP LOCKED``, then ``UPDATE … SET <the
    lease, its clock pinned to the read's> WHERE pk IN (<the rows read>)``. The rows are
    locked in between, so the instances made from the read hold what the ``UPDATE`` wrote:
    no read after it (three statements, each built by the ORM every batch, before)."""

    def __init__(
        self, read: compiler.ChangedRows, set_sql: str, set_params: Sequence[Any], limit: int | None = None
    ) -> None:
        self.read = read
        #: As :attr:`ClaimStatement.limit`.
        self.limit = limit
        #: The stand-ins of a claim after a cursor's position, in the read's parameters.
        self._places = _places_of(read.params)
        #: ``UPDATE … WHERE pk IN`` without the keys; the pinned clock's places in its parameters.
        self.set_sql = set_sql
        self.set_params = tuple(set_params)
        self._moments = [at for at, param in enumerate(self.set_params) if param is _MOMENT]

    @classmethod
    def build(
        cls,
        queryset: QuerySet[Any],
        limit: int | None,
        claimable: Q | Callable[[], Q],
        order_by: Sequence[Any],
        changes: dict[str, Any] | Callable[[], dict[str, Any]],
        after: tuple[int, Callable[[Sequence[Any]], Q | None]] | None = None,
        hint: str | None = None,
        sub_hint: str | None = None,
    ) -> LockedClaimStatement | None:
        """The statements, or ``None`` where the claim takes the ORM's way (a filter that
        reads other tables, a queryset that is not plain). ``after`` as
        :meth:`ClaimStatement.build`'s; ``hint``, ``sub_hint``: the read's index hints."""
        model = queryset.model
        using = queryset.db
        claimable = claimable() if callable(claimable) else claimable
        changes = changes() if callable(changes) else changes
        if after is not None:
            count, condition = after
            claimable &= condition([_Param(_StandIn(index)) for index in range(count)]) or Q()
        base = queryset.filter(claimable).order_by(*order_by)
        if (
            not compiler.is_plain(queryset)
            or compiler.reads_other_tables(base)
            or queryset.query.is_sliced
            or queryset.query.distinct
        ):
            return None
        locking = base.select_for_update(skip_locked=True)[: _COMPILED_LIMIT if limit is None else limit]
        read = compiler.ChangedRows(locking, changes, DbNow(), hint, sub_hint)
        if limit is None:
            (read.sql, read.params), limit = _limit_param(read.sql, read.params)
        pinned = {name: pin_clock(value, _MOMENT) for name, value in changes.items()}
        rows = model._base_manager.db_manager(using).filter(pk__in=[0])
        sql, params, _ = compiler.compile_update(rows, pinned)
        if not sql.endswith(" IN (%s)") or params[-1] != 0:
            return None  # (not the shape this splits)
        return cls(read, sql[: -len("(%s)")], params[:-1], limit)

    def lock(
        self, using: str, values: Sequence[Any] | None = None, limit: int | None = None
    ) -> list[tuple[Any, ...]]:
        """Send the locking read (``values``, ``limit``: see :meth:`ClaimStatement.bound`), then
        the lease's ``UPDATE`` on what it locked; return the read's rows (see :meth:`finish`)."""
        connection = connections[using]
        rows = compiler.send(connection, self.read.sql, _bound(self.read.params, self._places, values, limit))
        if rows:
            head = list(self.set_params)
            moment = self.read.moment(rows)
            for at in self._moments:
                head[at] = moment
            pks = [row[self.read.pk_at] for row in rows]
            marks = ", ".join(["%s"] * len(pks))
            compiler.send(connection, f"{self.set_sql}({marks})", [*head, *pks], "rowcount")
        return rows

    def finish(self, using: str, rows: Sequence[Sequence[Any]]) -> list[Model]:
        """The claimed rows as instances, in the claim's order (the read's)."""
        return self.read.make(using, rows)


class _Param(Expression):
    """A stand-in as the right-hand side of a lookup (``%s``, the stand-in its parameter):
    the ORM prepares a plain value for its field, which a stand-in is not."""

    def __init__(self, stand_in: _StandIn) -> None:
        super().__init__()
        self.stand_in = stand_in

    def as_sql(self, compiler: Any, connection: Any) -> Any:
        return "%s", [self.stand_in]


#: Where the pinned clock goes in a :class:`LockedClaimStatement`'s ``UPDATE``.
_MOMENT = object()


def _places_of(params: Sequence[Any]) -> list[tuple[int, int]]:
    """(place in ``params``, value index) of each :class:`_StandIn` there."""
    return [(at, param.index) for at, param in enumerate(params) if isinstance(param, _StandIn)]


def _bound(
    params: tuple[Any, ...],
    places: list[tuple[int, int]],
    values: Sequence[Any] | None,
    limit: int | None = None,
) -> tuple[Any, ...]:
    """``params`` with the stand-ins at ``places`` replaced by ``values`` (a cursor's
    position) and ``limit`` (:data:`_LIMIT`'s place); ``params`` itself where there are none."""
    if not places:
        return params
    bound = list(params)
    for at, index in places:
        if index < 0:
            assert limit is not None, "this claim's limit is a parameter: give it"
            bound[at] = limit
        else:
            assert values is not None, "this claim starts after a position: give its values"
            bound[at] = values[index]
    return tuple(bound)


class _StandIn:
    """A place in a kept statement's parameters that each send fills in."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


#: The stand-in of a claim's limit (:func:`_limit_param`).
_LIMIT = _StandIn(-1)

#: The limit a claim is compiled with when its limit is to be a parameter: a number no
#: other part of the text holds (Django writes a slice's limit into the text).
_COMPILED_LIMIT = 1_987_654_321

#: A placeholder, or an escaped percent sign, in a statement's text.
_MARKS = re.compile("%[%s]")


def _limit_param(sql: str, params: Sequence[Any]) -> tuple[tuple[str, tuple[Any, ...]], int | None]:
    """``((sql, params), None)``: a statement compiled with :data:`_COMPILED_LIMIT`, its limit
    made a parameter (the stand-in :data:`_LIMIT`, in its place among ``params``); or, where
    the text does not hold that limit once as a plain ``LIMIT``, ``((sql, params),
    _COMPILED_LIMIT)`` unchanged (the caller compiles one statement per limit instead)."""
    literal = f" LIMIT {_COMPILED_LIMIT}"
    at = sql.find(literal)
    marks = [mark for mark in _MARKS.findall(sql) if mark == "%s"]
    if at < 0 or sql.find(literal, at + 1) >= 0 or len(marks) != len(params):
        return (sql, tuple(params)), _COMPILED_LIMIT
    before = sum(1 for mark in _MARKS.findall(sql, 0, at) if mark == "%s")
    sql = f"{sql[:at]} LIMIT %s{sql[at + len(literal) :]}"
    return (sql, (*params[:before], _LIMIT, *params[before:])), None


# -- DELETE by keys --------------------------------------------------------------------------


class Where:
    """A single-table queryset's ``WHERE``, compiled once: ``DELETE`` by primary keys."""

    def __init__(self, queryset: QuerySet[Any]) -> None:
        model = queryset.model
        qn = connections[queryset.db].ops.quote_name
        table = qn(model._meta.db_table)
        pk = model._meta.pk
        assert pk is not None
        self.plain_pk = pk.get_internal_type() in ("AutoField", "BigAutoField", "SmallAutoField")
        self.pk_field = pk
        compiled = compiler.compile_where(queryset)
        #: The filter matches no row at all: nothing to send.
        self.empty = compiled is None
        where, params = compiled or ("", ())
        self.params = params
        #: ``DELETE FROM … WHERE <pk>``: the caller adds ``IN (…)`` or ``= ANY(…)``, then
        #: :attr:`tail`, and sends the keys before :attr:`params`.
        self.head = f"DELETE FROM {table} WHERE {table}.{qn(pk.column)}"
        #: The filter, checked on the rows the keys find and never used to find them: ``(…) IS
        #: TRUE`` is no condition an index can serve. A settle deletes a handful of rows among
        #: millions, and without it a planner may prefer a range of the claim index (a tube's
        #: taken tasks, say) to the keys; a transaction held open elsewhere fills that range with
        #: dead entries, and the settle then reads thousands of pages for a few rows.
        self.tail = f" AND ({where}) IS TRUE" if where else ""

    @classmethod
    def build(cls, queryset: QuerySet[Any]) -> Where | None:
        return cls(queryset) if compiler.plain(queryset) else None

    def prepared(self, pks: Sequence[Any], connection: BaseDatabaseWrapper) -> Sequence[Any]:
        """``pks`` as the database takes them (integer keys go as they are)."""
        if self.plain_pk:
            return pks
        return [self.pk_field.get_db_prep_value(pk, connection) for pk in pks]


def kept_where(queryset: QuerySet[Any], where: Q | Callable[[], Q] | None, key: Hashable) -> Where | None:
    """The ``WHERE`` of ``queryset`` and ``where`` kept under ``key`` (see :func:`delete_pks`),
    or ``None`` where it cannot be kept (a join)."""
    return keep(("delete", key, queryset.db), lambda: Where.build(filtered(queryset, where)))


def filtered(queryset: QuerySet[Any], where: Q | Callable[[], Q] | None) -> QuerySet[Any]:
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
    signals, no cascades in Python: :func:`delete_rows`); return how many. ``key`` names the
    filter (``where`` may then be a function that builds it), which is compiled once and kept:
    the keys change from call to call, the filter not."""
    if not pks:
        return 0
    using = queryset.db
    kept = kept_where(queryset, where, key) if key is not None else None
    if kept is None:
        rows = filtered(queryset, where)
        return sum(delete_rows(rows.filter(pk__in=chunk)) for chunk in batched(pks, using))
    if kept.empty:
        return 0
    connection = connections[using]
    total = 0
    for chunk in batched(pks, using):
        chunk = kept.prepared(chunk, connection)
        sql = f"{kept.head} IN ({', '.join(['%s'] * len(chunk))}){kept.tail}"
        total += compiler.send(connection, sql, [*chunk, *kept.params], "rowcount")
    return total


def delete_rows(queryset: QuerySet[Any]) -> int:
    """DELETE every row of ``queryset`` in one statement, on its database (no signals, no
    cascades in Python: the database's own foreign keys cascade); return how many."""
    return compiler.raw_delete(queryset)


# -- counters ----------------------------------------------------------------------------------


def add_to(model: type[Model], using: str, match: dict[str, Any], deltas: dict[str, int]) -> int:
    """Add ``deltas`` (field name: number) to the rows of ``model`` whose fields equal
    ``match`` (plain values); return how many rows. One ``UPDATE``, its SQL kept per shape."""

    def build() -> str:
        qn = connections[using].ops.quote_name
        columns = [qn(compiler.column(model, name)) for name in deltas]
        sets = ", ".join(f"{column} = {column} + %s" for column in columns)
        where = " AND ".join(f"{qn(compiler.column(model, name))} = %s" for name in match)
        return f"UPDATE {qn(model._meta.db_table)} SET {sets} WHERE {where}"

    sql = keep(("add", model, using, tuple(match), tuple(deltas)), build)
    return compiler.send(
        connections[using], sql, [*deltas.values(), *match.values()], "rowcount"
    )  # fetch="rowcount": an int


# -- a one-row INSERT ---------------------------------------------------------------------------


def _only_if(sql: str, connection: BaseDatabaseWrapper, guard: type[Model]) -> str:
    """Turn a one-row ``INSERT … VALUES (…) [RETURNING …]`` into ``INSERT … SELECT … FROM
    <guard's table> WHERE <its key> = %s [RETURNING …]``: the same statement, which writes
    its row only while that row exists (one more parameter, after the statement's own). The
    same text on every database; it costs the planner less than ``WHERE EXISTS (…)``."""
    start = sql.index(" VALUES (")
    end = sql.find(" RETURNING ")
    close = sql.rindex(")", 0, len(sql) if end < 0 else end)
    values = sql[start + len(" VALUES (") : close]
    qn = connection.ops.quote_name
    pk = guard._meta.pk
    assert pk is not None
    table, key = qn(guard._meta.db_table), qn(compiler.column(guard, pk.name))
    return f"{sql[:start]} SELECT {values} FROM {table} WHERE {table}.{key} = %s{sql[close + 1 :]}"


class OneRowInsert:
    """A one-row ``INSERT … RETURNING`` as Django's compiler writes it for one shape of row
    (which fields hold :class:`DbNow` values, and whether those have an offset), kept with the
    converters of what it returns. Building the statement costs about as much as a round trip
    to a local server; a put sends the same few shapes all its life. ``guard``: the model
    of :func:`engine.insert`'s ``only_if`` (its row's key is the statement's last parameter)."""

    def __init__(
        self,
        obj: Model,
        using: str,
        fields: list[Any],
        returned: list[Any],
        notify: bool,
        guard: type[Model] | None = None,
    ) -> None:
        sql, insert = compiler.compile_insert(obj, using, fields, returned)
        connection = insert.connection
        if guard is not None:
            sql = _only_if(sql, connection, guard)
        self.sql = notifying(sql, [], "")[0] if notify else sql
        # Held so that their ids, part of this statement's key, are not reused.
        self.field_lists = (fields, returned)
        # Per field: its DbNow shape, whether it reads its value through pre_save (auto_now
        # dates and fields that override it), whether it stores None as NULL as is, the type
        # of value it sends as it is (None: every value goes through the field), and what
        # turns a JSON value into what it sends (a JSONField; see _json_adapter).
        self.fields = [
            (
                field,
                _shape_of(field, obj),
                field.attname,
                _own_pre_save(field),
                field.get_db_prep_save(None, connection) is None,
                _sent_as_is(field, connection),
                _json_adapter(field, connection),
            )
            for field in fields
        ]
        self.converters = compiler.converters(insert, type(obj), returned)
        #: ``INSERT … VALUES`` and ``… RETURNING …`` around the one row's ``(…)``, for the
        #: statements of several rows (:meth:`many`); None where the row cannot be told apart.
        self._around = _around_the_row(self.sql)
        self._many: dict[int, str] = {}
        #: PostgreSQL: the statement of any number of rows as ``INSERT … SELECT * FROM
        #: UNNEST(<an array a column>)``, as Django's compiler writes a bulk insert of plain
        #: values there (a VALUES row a task cost 3× the server's time and 1.7× the client's);
        #: None where the rows cannot go as arrays (see :func:`_unnest`).
        self.unnest = _unnest(self._around, fields, connection)

    def many(self, count: int) -> str | None:
        """The statement for ``count`` rows of this shape (their parameters one row's after
        another's, then the channel's, if it notifies); None if it has none. ``RETURNING`` gives
        the rows in the order of ``VALUES``, as ``bulk_create`` takes it on these databases."""
        if self._around is None:
            return None
        sql = self._many.get(count)
        if sql is None:
            if len(self._many) >= 16:  # a few sizes recur (full chunks, the last one)
                self._many.clear()
            head, row, tail = self._around
            sql = self._many[count] = f"{head}{', '.join([row] * count)}{tail}"
        return sql

    def params(self, obj: Model, connection: BaseDatabaseWrapper, only_if: Model | None = None) -> list[Any]:
        """The statement's parameters for ``obj`` (and the guard's key), as the compiler would
        prepare them."""
        params: list[Any] = []
        values = obj.__dict__
        json_types = _JSON_TYPES
        for field, now, attname, pre_save, none_is_null, as_is, to_json in self.fields:
            if now is None:
                if pre_save:
                    value = field.pre_save(obj, True)
                else:
                    value = values[attname]
                    # The common case costs no call: a value the field would send unchanged.
                    if (value is None and none_is_null) or type(value) is as_is:
                        params.append(value)
                        continue
                    # A JSON document: the backend's adapter alone (the field's three calls
                    # before it change no plain JSON value).
                    if to_json is not None and type(value) in json_types:
                        params.append(to_json(value))
                        continue
                params.append(
                    None if value is None and none_is_null else field.get_db_prep_save(value, connection)
                )
            else:
                value = values[attname]
                params.extend(getattr(value, f"as_{connection.vendor}")(None, connection)[1])
        if only_if is not None:
            pk = only_if._meta.pk
            assert pk is not None
            params.append(pk.get_db_prep_value(only_if.pk, connection))
        return params

    def convert(self, row: Sequence[Any], connection: BaseDatabaseWrapper) -> list[Any]:
        """The returned values as the model's fields hold them (e.g. aware datetimes)."""
        return compiler.convert(row, self.converters, connection)


def _unnest(
    around: tuple[str, str, str] | None, fields: list[Any], connection: BaseDatabaseWrapper
) -> str | None:
    """The ``UNNEST`` form of a one-row ``INSERT`` (``around``: see :func:`_around_the_row`)
    on PostgreSQL, where Django's compiler would take it for several rows: each value a plain
    parameter (no expression, no field's own placeholder), each field of a type the backend
    knows. Its parameters are one list a column, then the statement's own after the row."""
    if around is None or connection.vendor != "postgresql":
        return None
    head, row, tail = around
    if row != f"({', '.join(['%s'] * len(fields))})" or not head.endswith(" VALUES "):
        return None
    for field in fields:
        own = field.target_field if field.is_relation else field
        if hasattr(field, "get_placeholder") or own.get_internal_type() not in connection.data_types:
            return None
    # (Django's own: the type without its parameters, no truncation: varchar[], not varchar(50)[].)
    arrays = ", ".join(f"(%s)::{field.db_type(connection).split('(')[0]}[]" for field in fields)
    return f"{head[: -len(' VALUES ')]} SELECT * FROM UNNEST({arrays}){tail}"


def _around_the_row(sql: str) -> tuple[str, str, str] | None:
    """(what comes before the row, the row, what comes after) of a one-row ``INSERT … VALUES
    (…) …``, the row's parentheses matched; None for any other form."""
    start = sql.find(" VALUES (")
    if start < 0 or sql.find(" VALUES (", start + 1) >= 0:
        return None
    start += len(" VALUES ")
    depth, at, quoted = 0, start, False
    while at < len(sql):
        char = sql[at]
        if char == "'":
            quoted = not quoted  # ('' inside a literal: out and in again)
        elif quoted:
            pass
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth == 0:
                return sql[:start], sql[start : at + 1], sql[at + 1 :]
        at += 1
    return None


_one_row_inserts: dict[tuple[Any, ...], OneRowInsert] = {}
on_clock_change(_one_row_inserts.clear)


#: A sample value of each type a field may send unchanged (see :func:`_sent_as_is`).
_SAMPLES: tuple[Any, ...] = (12345, "taskloop", 1.5, True)


def _sent_as_is(field: Any, connection: BaseDatabaseWrapper) -> type | None:
    """The type of value ``field`` sends to ``connection`` unchanged, if any: the one whose
    sample its ``get_db_prep_save`` gives back as the very same object (an integer field and an
    int, a char field and a str, …), so that a put can send such a value without the field's
    calls. ``None``: none (a date, a JSON document), or a field whose class changes
    ``get_db_prep_save`` or ``get_db_prep_value`` beyond Django's own."""
    kind = type(field)
    methods = ("get_db_prep_save", "get_db_prep_value", "get_prep_value", "to_python")
    if not all(getattr(kind, name).__module__.startswith("django.db.models.") for name in methods):
        return None  # a field of someone's own may change a value as it likes
    for sample in _SAMPLES:
        try:
            if field.get_db_prep_save(sample, connection) is sample and type(field.to_python(sample)) is type(
                sample
            ):
                return type(sample)
        except Exception:  # (a value of another kind: ValidationError, TypeError, ValueError)
            continue
    return None


#: The types of plain JSON values: what JSONField's get_db_prep_save and get_prep_value hand
#: to the backend's adapt_json_value unchanged (no expression, no lazy text).
_JSON_TYPES = frozenset({dict, list, str, int, float, bool})


def _json_adapter(field: Any, connection: BaseDatabaseWrapper) -> Callable[[Any], Any] | None:
    """What ``field.get_db_prep_save`` comes to for a plain JSON value (:data:`_JSON_TYPES`),
    for Django's own ``JSONField`` alone (not a subclass, which may change a value as it
    likes): ``connection.ops.adapt_json_value(value, field.encoder)``, which is ``json.dumps``
    itself where the backend keeps the base one and the field has no encoder (SQLite, MySQL)."""
    if type(field) is not JSONField:
        return None
    ops = connection.ops
    if type(ops).adapt_json_value is BaseDatabaseOperations.adapt_json_value and field.encoder is None:
        return json.dumps
    return partial(ops.adapt_json_value, encoder=field.encoder)


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
    :class:`DbNow` has an offset, its own or the test clock's (which adds a parameter). Other
    expressions raise TypeError."""
    value = getattr(obj, field.attname)
    if value is None or type(value) in _PLAIN:
        return None
    if isinstance(value, DbNow):
        return bool(value.total)
    if hasattr(value, "resolve_expression"):
        raise TypeError(value)
    return None


def one_row_insert(
    obj: Model,
    using: str,
    fields: list[Any],
    returned: list[Any],
    notify: bool,
    only_if: Model | None = None,
) -> OneRowInsert | None:
    """The kept statement for ``obj``'s shape; None if a value is an expression other than
    :class:`DbNow` (the compiler handles those)."""
    values = obj.__dict__
    # The shape, field by field: a call only for a value that is not plain (a DbNow).
    plain = _PLAIN
    try:
        nows = tuple(
            [
                None
                if (value := values[field.attname]) is None or type(value) in plain
                else _shape_of(field, obj)
                for field in fields
            ]
        )
    except TypeError:
        return None
    guard = None if only_if is None else type(only_if)
    # The fields are the lists insert_fields keeps: their names are the same as long as
    # they are (and a kept statement holds them, so their ids are not reused).
    shape = (using, type(obj), id(fields), id(returned), nows, notify, guard)
    statement = _one_row_inserts.get(shape)
    if statement is None:
        statement = _one_row_inserts[shape] = OneRowInsert(obj, using, fields, returned, notify, guard)
    return statement
