"""Every use of Django's private query, compiler and backend machinery, in one module.

The engine builds its statements with Django's own compiler (so that they are what the ORM
would send) and sends the hot ones on a kept cursor; both reach below Django's public API. A
Django upgrade that changes those internals should touch this file alone.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Callable, Sequence
from typing import Any, Literal, cast, overload

from django.conf import settings
from django.core.exceptions import EmptyResultSet, FullResultSet
from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import BooleanField, Expression, F, Field, Index, Model, Q, QuerySet, Value, signals
from django.db.models.base import ModelState
from django.db.models.constants import OnConflict
from django.db.models.expressions import RawSQL
from django.db.models.sql import InsertQuery, Query, UpdateQuery
from django.db.models.sql.compiler import SQLCompiler
from django.utils.asyncio import async_unsafe
from django.utils.dateparse import parse_datetime

#: A compiled statement's converters: (column index, converter functions, column).
Converters = list[tuple[int, list[Any], Any]]


# -- sending ---------------------------------------------------------------------------------


#: What :func:`send` and :func:`execute` return: a statement's rows, its first row, or its row count.
Fetch = Literal["all", "one", "rowcount"]


@overload
def send(
    connection: BaseDatabaseWrapper,
    sql: str,
    params: Sequence[Any],
    fetch: Literal["all"] = "all",
    *,
    made_into_instances: bool = False,
    lead: str = "",
) -> list[tuple[Any, ...]]: ...
@overload
def send(
    connection: BaseDatabaseWrapper,
    sql: str,
    params: Sequence[Any],
    fetch: Literal["one"],
    *,
    made_into_instances: bool = False,
    lead: str = "",
) -> Any: ...
@overload
def send(
    connection: BaseDatabaseWrapper,
    sql: str,
    params: Sequence[Any],
    fetch: Literal["rowcount"],
    *,
    made_into_instances: bool = False,
    lead: str = "",
) -> int: ...
@async_unsafe
def send(
    connection: BaseDatabaseWrapper,
    sql: str,
    params: Sequence[Any],
    fetch: Fetch = "all",
    *,
    made_into_instances: bool = False,
    lead: str = "",
) -> Any:
    """Send a kept statement on Django connection ``connection``; return ``fetch``: its rows
    (``"all"``), its first row (``"one"``) or its row count (``"rowcount"``).

    As ``connection.cursor()`` would, less the cost of a cursor and its wrapper per statement
    (a sixth of a put's client CPU on PostgreSQL): the backend's own cursor, kept per
    connection, with Django's checks and error translation. Whenever anyone watches the
    queries (``DEBUG``, ``CaptureQueriesContext``, ``execute_wrapper``) or the connection is
    due a health check, it goes through ``connection.cursor()`` so that they see it.

    ``made_into_instances``: the rows are only ever made into instances by
    :class:`Instances`, which gives their datetimes Django's time zone itself; on psycopg 3
    they are then read on a kept cursor of their own that parses ``timestamptz`` with
    psycopg's C loader (see :func:`_with_fast_timestamps`).

    ``lead``: a statement to send before this one in the same text, one round trip for both
    (see :func:`.vendor.lead_with`, which says where it can); what is returned is this one's.
    """
    if (
        connection.queries_logged
        or connection.execute_wrappers
        or connection.connection is None
        # (Django 5.1+ health checks: django-stubs does not know these attributes yet.)
        or (connection.health_check_enabled and not connection.health_check_done)  # type: ignore[attr-defined]
    ):
        with connection.cursor() as cursor:
            if lead:
                return _led(cursor.execute, cursor, lead, sql, params, fetch)
            cursor.execute(sql, params)
            return _fetched(cursor, fetch)
    slot = "_taskloop_rows_cursor" if made_into_instances else "_taskloop_cursor"
    kept = getattr(connection, slot, None)
    if kept is None or kept[0] is not connection.connection:
        with connection.wrap_database_errors:
            cursor = connection.create_cursor()
            if made_into_instances:
                _with_fast_timestamps(cursor)
            kept = (connection.connection, cursor, _executor(cursor))
            setattr(connection, slot, kept)  # our own slot on the wrapper
    connection.validate_no_broken_transaction()
    with connection.wrap_database_errors:
        if lead:
            return _led(kept[2], kept[1], lead, sql, params, fetch)
        kept[2](sql, params)
        return _fetched(kept[1], fetch)


def _led(
    execute: Callable[[str, Sequence[Any]], Any],
    cursor: Any,
    lead: str,
    sql: str,
    params: Sequence[Any],
    fetch: Fetch,
) -> Any:
    """Send ``lead`` and ``sql`` as one text; return ``fetch`` of ``sql``'s result."""
    from django.db.backends.postgresql.psycopg_any import is_psycopg3  # (only PostgreSQL leads)

    execute(lead + sql, params)
    if is_psycopg3:
        cursor.nextset()  # psycopg 3 gives each statement's result in turn (psycopg2: the last)
    return _fetched(cursor, fetch)


def _executor(cursor: Any) -> Callable[[str, Sequence[Any]], Any]:
    """How :func:`send` runs a statement on the kept ``cursor``: its ``execute``, but on
    Django's SQLite cursor, whose ``execute`` turns each statement's ``%s`` into ``?`` with a
    regular expression every time it is sent (a put's 400-character INSERT: 5 µs of its 60 of
    client CPU), the turned statement kept per statement text (:data:`_QMARK`) and given to
    ``sqlite3``'s own ``execute``. Parameters by name (a mapping) go through Django's."""
    import sqlite3

    from django.db.backends.sqlite3.base import SQLiteCursorWrapper

    if type(cursor) is not SQLiteCursorWrapper:  # (a subclass may do more in its execute)
        return cast(Callable[[str, Sequence[Any]], Any], cursor.execute)
    own, convert, turned = sqlite3.Cursor.execute, cursor.convert_query, _QMARK

    def execute(sql: str, params: Sequence[Any]) -> Any:
        if params is None or not isinstance(params, (list, tuple)):
            return cursor.execute(sql, params)
        query = turned.get(sql)
        if query is None:
            if len(turned) >= 512:  # (statements with IN lists of every length, a put_many's sizes)
                turned.clear()
            query = turned[sql] = convert(sql)
        return own(cursor, query, params)

    return execute


#: SQLite: statements as :func:`send` sends them, ``?`` for ``%s`` (see :func:`_executor`).
_QMARK: dict[str, str] = {}


def _with_fast_timestamps(cursor: Any) -> None:
    """On psycopg 3, make ``cursor`` parse ``timestamptz`` with psycopg's own loader (C where
    psycopg has it): 0.18 µs a value against 3.1 for Django's (``psycopg_any.BaseTzLoader``,
    a subclass of psycopg's pure-Python one), and a claimed row has two or three. Django's
    adds only ``replace(tzinfo=<its time zone>)`` after psycopg's parse (the session's time
    zone is Django's); :class:`Instances` does that instead, so the cursor's rows must reach
    nothing else. A loader that is not Django's (a project's own) is left as it is."""
    adapters = getattr(cursor, "adapters", None)
    if adapters is None:
        return  # (psycopg2)
    import psycopg
    from psycopg.pq import Format

    oid = psycopg.adapters.types["timestamptz"].oid
    current = adapters.get_loader(oid, Format.TEXT)
    fast = psycopg.adapters.get_loader(oid, Format.TEXT)
    if (
        fast is not None
        and current is not None
        and current.__module__ == "django.db.backends.postgresql.psycopg_any"
    ):
        adapters.register_loader(oid, fast)


def _fetched(cursor: Any, fetch: Fetch) -> Any:
    if fetch == "all":
        return cursor.fetchall()
    if fetch == "one":
        return cursor.fetchone()
    return cursor.rowcount


@overload
def execute(
    using: str, sql: str, params: Sequence[Any] = (), fetch: Literal["all"] = "all"
) -> list[tuple[Any, ...]]: ...
@overload
def execute(using: str, sql: str, params: Sequence[Any], fetch: Literal["one"]) -> Any: ...
@overload
def execute(using: str, sql: str, params: Sequence[Any], fetch: Literal["rowcount"]) -> int: ...
def execute(using: str, sql: str, params: Sequence[Any] = (), fetch: Fetch = "all") -> Any:
    """Send ``sql`` through ``connection.cursor()`` (seen by every query watcher); return as
    :func:`send` does."""
    with connections[using].cursor() as cursor:
        cursor.execute(sql, params)
        return _fetched(cursor, fetch)


# -- reading a query -------------------------------------------------------------------------


def joins(query: Query) -> bool:
    """Whether ``query`` joins a table besides its model's own."""
    return any(alias != query.base_table and query.alias_refcount[alias] for alias in query.alias_map)


def reads_other_tables(queryset: QuerySet[Any]) -> bool:
    """Whether ``queryset``'s filter reads a table besides its model's own (a join or a
    subquery)."""
    query = queryset.query
    if joins(query):
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


def plain(queryset: QuerySet[Any]) -> bool:
    """Whether ``queryset`` is one table's filter: no join, slice, ``DISTINCT`` or union."""
    query = queryset.query
    return not (joins(query) or query.is_sliced or query.distinct or query.combinator)


# -- compiling -------------------------------------------------------------------------------


def column(model: type[Model], name: str) -> str:
    """The column of ``model``'s concrete field ``name``."""
    field = model._meta.get_field(name)
    assert isinstance(field, Field) and field.column is not None, field
    return field.column


def returning(model: type[Model], connection: BaseDatabaseWrapper) -> str:
    """`` RETURNING`` every concrete column of ``model`` (in field order).

    On SQLite a ``DateTimeField``'s column comes back as its text (``CAST … AS TEXT``, which
    changes no stored text): the column as it is would be parsed by the converter Django
    registers with ``sqlite3`` for its declared type, two Python calls a value, where the
    backend's converter, run a column at a time (:func:`_aware_datetimes`), parses it in C."""
    qn = connection.ops.quote_name
    table = model._meta.db_table
    text = connection.vendor == "sqlite"
    columns = []
    for field in model._meta.concrete_fields:
        name = f"{qn(table)}.{qn(column(model, field.name))}"
        columns.append(
            f"CAST({name} AS TEXT)" if text and field.get_internal_type() == "DateTimeField" else name
        )
    return " RETURNING " + ", ".join(columns)


def compile_update(
    queryset: QuerySet[Any], changes: dict[str, Any], *, for_update: bool = False
) -> tuple[str, tuple[Any, ...], SQLCompiler]:
    """``queryset.update(**changes)`` as SQL, and its compiler. ``for_update``: the queryset
    locks (``FOR UPDATE``), which Django compiles only inside a transaction."""
    query = cast(UpdateQuery, queryset.query.chain(UpdateQuery))
    query.add_update_values(changes)
    compiler = query.get_compiler(queryset.db)
    if for_update:
        with transaction.atomic(using=queryset.db, savepoint=False):
            sql, params = compiler.as_sql()
    else:
        sql, params = compiler.as_sql()
    return sql, tuple(params), compiler


def read_hinted(queryset: QuerySet[Any], hint: str | None, sub_hint: str | None = None) -> list[Any]:
    """The values of ``queryset`` (a flat ``values_list`` of one column of its model's table),
    read with the index hint ``hint`` on that table (``FORCE INDEX (…)``: Django has none),
    and ``sub_hint`` on that table in its subqueries (Django's alias ``U0``)."""
    sql, params = queryset.query.get_compiler(using=queryset.db).as_sql()
    sql = _hinted(queryset, sql, hint, sub_hint)
    return [row[0] for row in execute(queryset.db, sql, params)]


class ChangedRows:
    """A read of a queryset's rows whole (every concrete column; a locking read, say) that
    also computes, beside each row, what ``update(**changes)`` will make of it, and reads the
    clock ``now`` once: compiled once, then :meth:`make` turns its rows into instances holding
    the rows as that ``UPDATE`` leaves them, given the ``UPDATE`` runs on the same rows, still
    locked, with its clock pinned to :meth:`moment` (``vendor.pin_clock``). Where the database
    cannot return an ``UPDATE``'s rows (MySQL/MariaDB), a claim is then this read and the
    ``UPDATE``, not the ``UPDATE`` between two reads. Hints as :func:`read_hinted`'s."""

    def __init__(
        self,
        queryset: QuerySet[Any],
        changes: dict[str, Any],
        now: Expression,
        hint: str | None = None,
        sub_hint: str | None = None,
    ) -> None:
        model = self.model = queryset.model
        fields = {name: model._meta.get_field(name) for name in changes}
        aliases = {name: f"taskloop_set_{at}" for at, name in enumerate(changes)}
        annotations: dict[str, Any] = {"taskloop_now": now}
        for name, value in changes.items():
            if not hasattr(value, "resolve_expression"):
                value = Value(value, output_field=fields[name])
            annotations[aliases[name]] = value
        select = queryset.annotate(**annotations).query.get_compiler(using=queryset.db)
        # Django compiles FOR UPDATE only inside a transaction; a kept read may be compiled first
        # outside one.
        with transaction.atomic(using=queryset.db, savepoint=False):
            sql, params = select.as_sql()
        self.sql = _hinted(queryset, sql, hint, sub_hint)
        self.params = tuple(params)
        at = select.annotation_col_map
        self.moment_at = at["taskloop_now"]
        found = select.get_converters([column[0] for column in select.select])
        self.converters: Converters = [(index, list(funcs), col) for index, (funcs, col) in found.items()]
        assert select.klass_info is not None
        self.columns = list(select.klass_info["select_fields"])
        self.names = [field.attname for field in model._meta.concrete_fields]
        assert len(self.columns) == len(self.names), "ChangedRows reads every concrete column"
        self.changed = [
            (self.names.index(fields[name].attname), at[alias]) for name, alias in aliases.items()
        ]
        pk = model._meta.pk
        assert pk is not None
        #: Where each row has its primary key.
        self.pk_at = self.columns[self.names.index(pk.attname)]

    def moment(self, rows: Sequence[Sequence[Any]]) -> Any:
        """The read's clock, as the cursor gave it (rows: not empty)."""
        return rows[0][self.moment_at]

    def make(self, using: str, rows: Sequence[Sequence[Any]]) -> list[Model]:
        if self.converters:
            rows = convert_rows(rows, self.converters, connections[using])
        columns, changed = self.columns, self.changed
        values = []
        for row in rows:
            own = [row[index] for index in columns]
            for place, index in changed:
                own[place] = row[index]
            values.append(own)
        return Instances.build(self.model, self.names, using, values)


def _hinted(queryset: QuerySet[Any], sql: str, hint: str | None, sub_hint: str | None) -> str:
    """``sql`` (compiled from ``queryset``) with :func:`read_hinted`'s index hints."""
    connection = connections[queryset.db]
    table = f"FROM {connection.ops.quote_name(queryset.model._meta.db_table)}"
    if sub_hint:
        # (Django 6 quotes the subquery's alias: `U0`.)
        for alias in ("U0", connection.ops.quote_name("U0")):
            sql = sql.replace(f"{table} {alias} ", f"{table} {alias} {sub_hint} ")
    if hint:
        at = sql.index(table) + len(table)
        sql = f"{sql[:at]} {hint}{sql[at:]}"
    return sql


_PK_IN_SUBQUERY = re.compile(r'WHERE ("[^"]+")\.("[^"]+") IN \(SELECT (\w+|"\w+")\.\2 AS "pk" FROM ')


def by_row_address(sql: str) -> str:
    """A compiled ``UPDATE … WHERE pk IN (SELECT pk … FOR UPDATE SKIP LOCKED)`` (PostgreSQL)
    that finds the rows its subquery locked by their address instead (``ctid = ANY(ARRAY(
    SELECT ctid …))``, a TID scan): the planner cannot pick an index for that lookup. Looked
    up by key, it may pick any index with the key in it: after an ANALYZE that counted few
    live rows in a bloated table it chose the claim index, whose key is its last column —
    a scan of the whole index per claimed row, seconds a claim until the next ANALYZE. The
    subquery returns each locked row's newest version, which no one else can change until
    the statement ends. ``sql`` unchanged if it is not of that shape."""
    match = _PK_IN_SUBQUERY.search(sql)
    if match is None or not sql.endswith(")"):
        return sql
    table, _, alias = match.groups()
    head = f"WHERE {table}.ctid = ANY(ARRAY(SELECT {alias}.ctid FROM "
    return sql[: match.start()] + head + sql[match.end() :] + ")"


def compile_where(queryset: QuerySet[Any]) -> tuple[str, tuple[Any, ...]] | None:
    """``queryset``'s ``WHERE`` (``""`` for every row), or ``None`` if it matches no row."""
    query = queryset.query
    compiler = query.get_compiler(queryset.db)
    try:
        where, params = compiler.compile(query.where)
    except EmptyResultSet:
        return None
    except FullResultSet:
        return "", ()
    return where, tuple(params)


def compile_select(queryset: QuerySet[Any]) -> tuple[str, tuple[Any, ...]]:
    """``queryset``'s ``SELECT`` and its parameters, as Django would send it."""
    sql, params = queryset.query.get_compiler(queryset.db).as_sql()
    return sql, tuple(params)


def by_keys(queryset: QuerySet[Any], pks: Sequence[Any]) -> QuerySet[Any]:
    """The rows of ``queryset`` whose primary key is in ``pks``, found by those keys alone:
    ``queryset``'s filter is checked on the rows they find, as ``(…) IS TRUE``, which no index
    can serve (see :class:`~.kept.Where`: a settle's few rows, never a claim index's range)."""
    model = queryset.model
    keyed: QuerySet[Any] = model._base_manager.using(queryset.db).filter(pk__in=pks)
    compiled = compile_where(queryset)
    if compiled is None:
        return keyed.none()
    where, params = compiled
    if not where:
        return keyed
    return keyed.filter(RawSQL(f"({where}) IS TRUE", params, output_field=BooleanField()))


class _RowAfter(Expression):
    """``(a, b, …) > (%s, %s, …)`` (``<`` descending): the rows after a position in one
    range of an index on those columns."""

    conditional = True

    def __init__(self, names: Sequence[str], values: Sequence[Any], descending: bool) -> None:
        super().__init__(output_field=BooleanField())
        self.columns: list[Any] = [F(name) for name in names]
        self.values = list(values)
        self.descending = descending

    def get_source_expressions(self) -> list[Any]:
        return self.columns

    def set_source_expressions(self, exprs: Sequence[Any]) -> None:
        self.columns = list(exprs)

    def as_sql(self, compiler: Any, connection: BaseDatabaseWrapper) -> Any:
        parts: list[str] = []
        params: list[Any] = []
        for column in self.columns:
            sql, column_params = compiler.compile(column)
            parts.append(sql)
            params.extend(column_params)
        # PostgreSQL: each value as a scalar subquery, which the planner does not read when it
        # estimates. A cursor stands at the newest rows, past the histogram of the last
        # ANALYZE: read as a constant, the planner counted a few rows after it and chose to
        # read them all and sort them — the whole backlog, every claim, until the next ANALYZE.
        mark = "(SELECT %s)" if connection.vendor == "postgresql" else "%s"
        marks = ", ".join([mark] * len(self.values))
        return f"({', '.join(parts)}) {'<' if self.descending else '>'} ({marks})", [*params, *self.values]


def after(using: str, order: Sequence[tuple[str, bool]], values: Sequence[Any]) -> Q:
    """The rows after ``values`` in ``order`` ((attribute, descending) pairs), as a filter one
    range of an index on those columns serves: a row comparison on PostgreSQL and SQLite (its
    values may be stand-ins a kept statement replaces); on MySQL/MariaDB, whose range optimizer
    reads no row comparison, ``a > x OR (a = x AND b > y)``, which it reads as one range."""
    directions = {descending for _, descending in order}
    if connections[using].vendor != "mysql" and len(directions) == 1:
        return Q(_RowAfter([name for name, _ in order], values, directions.pop()))
    condition: Q | None = None
    for (name, descending), value in reversed(list(zip(order, values, strict=True))):
        beyond = Q(**{f"{name}__{'lt' if descending else 'gt'}": value})
        condition = beyond if condition is None else beyond | (Q(**{name: value}) & condition)
    assert condition is not None
    return condition


def compile_expression(model: type[Model], using: str, expression: Expression) -> tuple[str, list[Any]]:
    """``expression`` as SQL for a statement on ``model``'s table."""
    sql, params = InsertQuery(model).get_compiler(using=using).compile(expression)
    return sql, list(params)


def compile_insert(obj: Model, using: str, fields: list[Any], returned: list[Any]) -> tuple[str, SQLCompiler]:
    """The one-row ``INSERT … [RETURNING returned]`` of ``obj`` that ``save()`` would send."""
    query = InsertQuery(type(obj))
    query.insert_values(fields, [obj])
    compiler = query.get_compiler(using=using)
    compiler.returning_fields = returned
    ((sql, _params),) = compiler.as_sql()
    return sql, compiler


def execute_insert(
    objs: Sequence[Model],
    using: str,
    fields: list[Any],
    returned: list[Any],
    wrap: Callable[[str, Any], tuple[str, list[Any]]] | None = None,
) -> list[Any]:
    """INSERT ``objs`` as ``bulk_create`` does; return the ``returned`` values per row.
    ``wrap(sql, params)``: another statement around each INSERT (e.g. one that notifies)."""
    query = InsertQuery(type(objs[0]))
    query.insert_values(fields, list(objs))
    compiler = query.get_compiler(using=using)
    if wrap is not None:
        statements = compiler.as_sql
        compiler.as_sql = lambda: [
            wrap(sql, params) for sql, params in statements()
        ]  # the compiler has no hook for this
    return list(compiler.execute_sql(returned))


def converters(compiler: SQLCompiler, model: type[Model], fields: Sequence[Any]) -> Converters:
    """The converters of ``fields`` of ``model`` as ``compiler`` reads them."""
    table = model._meta.db_table
    found = compiler.get_converters([field.get_col(table) for field in fields])
    return [(index, list(funcs), col) for index, (funcs, col) in found.items()]


def convert(row: Sequence[Any], converters: Converters, connection: BaseDatabaseWrapper) -> list[Any]:
    """``row``'s values as the model's fields hold them (e.g. aware datetimes)."""
    values = list(row)
    for index, funcs, col in converters:
        for converter in funcs:
            values[index] = converter(values[index], col, connection)
    return values


def convert_rows(
    rows: Sequence[Sequence[Any]], converters: Converters, connection: BaseDatabaseWrapper
) -> list[list[Any]]:
    """:func:`convert` of every row in ``rows``, a column at a time; a backend's own
    ``DateTimeField`` converter of SQLite and MySQL/MariaDB (a claimed row has up to three
    datetimes) done as :func:`_aware_datetimes` does it, for the whole column at once."""
    values = [list(row) for row in rows]
    for index, funcs, col in converters:
        for converter in funcs:
            func = getattr(converter, "__func__", converter)
            column = _COLUMN_CONVERTERS.get(
                (getattr(func, "__module__", ""), getattr(func, "__qualname__", ""))
            )
            if column is not None:
                column(values, index, connection, converter, col)
                continue
            for row in values:
                row[index] = converter(row[index], col, connection)
    return values


def _aware_datetimes(
    values: list[list[Any]], index: int, connection: BaseDatabaseWrapper, converter: Any, col: Any
) -> None:
    """What SQLite's and MySQL's ``convert_datetimefield_value`` do to column ``index`` of
    ``values`` (text parsed on SQLite; made aware in the connection's time zone where
    ``USE_TZ``, as ``timezone.make_aware`` does, refusing a value that is aware already on
    MySQL), with the settings read once for the column instead of once a value."""
    text = connection.vendor == "sqlite"
    zone = connection.timezone if settings.USE_TZ or not text else None
    parse = dt.datetime.fromisoformat
    for row in values:
        value = row[index]
        if value is None:
            continue
        if text and not isinstance(value, dt.datetime):
            try:
                value = parse(value)  # (what parse_datetime tries first, less its call)
            except ValueError:
                value = parse_datetime(value)
        if zone is not None:
            if value.utcoffset() is not None:
                if text:
                    row[index] = value
                    continue
                raise ValueError(f"make_aware expects a naive datetime, got {value}")
            value = value.replace(tzinfo=zone)
        row[index] = value


def _zoned(values: list[list[Any]], columns: list[int], zone: Any) -> None:
    """What Django's PostgreSQL ``timestamptz`` loader adds to psycopg's parse, to ``columns``
    of ``values``: the tzinfo of Django's time zone (``None`` without ``USE_TZ``: naive)."""
    for row in values:
        for at in columns:
            value = row[at]
            if value is not None:
                row[at] = value.replace(tzinfo=zone)


def _json_values(
    values: list[list[Any]], index: int, connection: BaseDatabaseWrapper, converter: Any, col: Any
) -> None:
    """What ``JSONField.from_db_value`` does to column ``index`` of ``values`` (a claimed
    task's ``data``), less its three Python calls a value: the text as one JSON document is
    read by ``json``'s own scanner (C), as ``json.loads`` reads it; anything else (surrounding
    whitespace, text that is no JSON, bytes) goes to ``from_db_value`` itself, as does every
    value of a field with its own decoder."""
    if getattr(converter.__self__, "decoder", None) is not None:
        for row in values:
            row[index] = converter(row[index], col, connection)
        return
    scan = _SCAN
    for row in values:
        value = row[index]
        if value is None:
            continue
        if type(value) is str:
            try:
                found, end = scan(value, 0)
            except StopIteration:  # (what the scanner says of text that starts no JSON value)
                end = -1
            if end == len(value):
                row[index] = found
                continue
        row[index] = converter(value, col, connection)


#: ``json.loads``' scanner: one JSON value from a position in a text (its end too).
_SCAN: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]

ColumnConverter = Callable[[list[list[Any]], int, BaseDatabaseWrapper, Any, Any], None]

#: Converters done a column at a time (:func:`convert_rows`), by their function's module and
#: name (a backend or a field class that overrides one keeps its own).
_COLUMN_CONVERTERS: dict[tuple[str, str], ColumnConverter] = {
    **{
        (f"django.db.backends.{vendor}.operations", "DatabaseOperations.convert_datetimefield_value"): (
            _aware_datetimes
        )
        for vendor in ("sqlite3", "mysql")
    },
    ("django.db.models.fields.json", "JSONField.from_db_value"): _json_values,
}


class Instances:
    """Rows holding every concrete column of a model, turned into instances as
    ``Model.from_db`` would (converters applied)."""

    def __init__(self, model: type[Model], compiler: SQLCompiler) -> None:
        self.model = model
        fields = model._meta.concrete_fields
        self.names = [field.attname for field in fields]
        self.converters = converters(compiler, model, fields)
        #: PostgreSQL: the datetime columns, given Django's time zone here (rows read on
        #: psycopg's own loader: see ``send(made_into_instances=True)``).
        self.zoned = (
            [at for at, field in enumerate(fields) if field.get_internal_type() == "DateTimeField"]
            if compiler.connection.vendor == "postgresql"
            else []
        )

    def make(self, using: str, rows: Sequence[Sequence[Any]]) -> list[Model]:
        if self.converters or self.zoned:
            connection = connections[using]
            rows = convert_rows(rows, self.converters, connection)
            if self.zoned:
                _zoned(rows, self.zoned, connection.timezone)
        return self.build(self.model, self.names, using, rows)

    @staticmethod
    def build(model: type[Model], names: list[str], using: str, rows: Sequence[Sequence[Any]]) -> list[Model]:
        """Instances of ``model`` from ``rows`` of converted values of the columns ``names``."""
        if _init_heard(model):
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


def _init_heard(model: type[Model]) -> bool:
    """Whether anyone listens for ``model``'s ``pre_init`` or ``post_init``: then its instances
    are made by ``__init__``, which sends them; else :class:`Instances` and :func:`unsaved`
    fill ``__dict__`` themselves. No receiver at all (the common case) is told with no call."""
    pre, post = signals.pre_init, signals.post_init
    return bool(pre.receivers or post.receivers) and (pre.has_listeners(model) or post.has_listeners(model))


def unsaved(model: type[Model], values: dict[str, Any]) -> Model:
    """A new (unsaved) instance of ``model``: ``values`` holds a value for each concrete
    field, by attname and in the fields' order. ``model(*values.values())``, less
    ``__init__``'s per-field ``setattr`` (a put's task: 7 of its 13 µs) when nobody listens
    for the init signals that would tell the difference (:func:`_init_heard`, asked only once
    some init receiver exists: a put's calls are counted against a budget)."""
    if signals.pre_init.receivers or signals.post_init.receivers:
        if _init_heard(model):
            return model(*values.values())
    obj = model.__new__(model)
    obj.__dict__.update(values)
    obj._state = ModelState()
    return obj


def is_plain(queryset: QuerySet[Any]) -> bool:
    """Whether ``queryset`` reads every concrete column of its model's table and nothing else
    (nothing deferred, annotated, joined by ``select_related`` or added by ``extra``)."""
    query = queryset.query
    return not (
        query.deferred_loading != (frozenset(), True)
        or query.select_related
        or query.annotations
        or query.extra
    )


def read_instances(queryset: QuerySet[Any]) -> list[Model]:
    """``list(queryset)`` of a plain queryset (every concrete column, nothing deferred,
    annotated or joined), one statement, its rows made into instances as :class:`Instances`
    makes them: without the ORM's iterator, whose ``Model.__init__`` per row cost more than the
    statement (a claim's fetch of its leased rows where the UPDATE cannot return them)."""
    if not is_plain(queryset):
        return list(queryset)
    query = queryset.query
    select = query.get_compiler(using=queryset.db)
    sql, params = select.as_sql()
    return Instances(queryset.model, select).make(queryset.db, execute(queryset.db, sql, params))


# -- deleting, indexes, conflicts -------------------------------------------------------------


def raw_delete(queryset: QuerySet[Any]) -> int:
    """DELETE ``queryset``'s rows in one statement (no signals, no cascades in Python: the
    database's foreign keys do that); return how many."""
    return queryset._raw_delete(queryset.db)  # Django's private one-statement DELETE


def index_sql(
    index: Index, model: type[Model], schema_editor: Any, suffixes: dict[str, str], **kwargs: Any
) -> Any:
    """``CREATE INDEX`` of ``index`` with ``suffixes`` (field name: e.g. ``"NULLS FIRST"``)
    after its columns."""
    fields = [model._meta.get_field(name) for name, _ in index.fields_orders]
    return schema_editor._create_index_sql(
        model,
        fields=fields,
        name=index.name,
        db_tablespace=index.db_tablespace,
        col_suffixes=[suffixes.get(field.name, "") for field in fields],
        **kwargs,
    )


def insert_ignore_sql(
    connection: BaseDatabaseWrapper, table: str, columns: list[Any], rows: list[list[str]]
) -> str:
    """``INSERT … VALUES rows`` that skips rows whose key is taken: ``ON CONFLICT DO
    NOTHING`` on PostgreSQL, ``INSERT IGNORE`` / ``INSERT OR IGNORE`` elsewhere."""
    ops = connection.ops
    head = (
        f"{ops.insert_statement(on_conflict=OnConflict.IGNORE)} {ops.quote_name(table)} "
        f"({', '.join(ops.quote_name(f.column) for f in columns)}) "
    )
    tail = ops.on_conflict_suffix_sql(columns, OnConflict.IGNORE, [], [])
    # (django-stubs types the rows of placeholders as strings; Django takes lists of them.)
    values = ops.bulk_insert_sql(columns, rows)  # type: ignore[arg-type]
    return head + values + (f" {tail}" if tail else "")
