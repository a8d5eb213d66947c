"""INSERT: a put's one statement (``INSERT … RETURNING``, the ``NOTIFY`` in it), several rows
all or nothing, and rows by key that skip the keys already there."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import AutoField, Field, Model

from . import compiler, kept
from .transactions import run_in_transaction
from .vendor import DbNow, features, features_of, notifying


def insert(
    objs: Sequence[Model],
    using: str,
    *,
    returning: Sequence[str] = (),
    notify: str | None = None,
    only_if: Model | None = None,
    connection: BaseDatabaseWrapper | None = None,
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
    ``connection``: ``using``'s, where the caller has it already (a put: a look-up costs calls).
    """
    if not objs:
        return True
    if only_if is not None and len(objs) != 1:
        raise ValueError(f"only_if guards one row, not {len(objs)}")
    model = type(objs[0])
    opts = model._meta
    connection = connections[using] if connection is None else connection
    fields, returned = insert_fields(model, returning)
    one_statement = connection.features.can_return_rows_from_bulk_insert or (
        len(objs) == 1 and connection.features.can_return_columns_from_insert
    )
    if one_statement:
        return _insert_returning(objs, using, fields, returned, notify, only_if, connection)
    # MySQL: no RETURNING. One INSERT per row for its key, then read back what the database
    # computed.
    for obj in objs:
        if not _insert_returning([obj], using, fields, [opts.pk], notify, only_if, connection):
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
    statements: list[tuple[Model, kept.OneRowInsert, list[Any]]] = []
    if features(using).notify and connection.features.can_return_columns_from_insert:
        for obj, names in zip(objs, returning, strict=True):
            fields, returned = insert_fields(type(obj), names)
            statement = kept.one_row_insert(obj, using, fields, returned, False, only_if)
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
    return _insert_in_one_statement(statements, using, notify, only_if)


def _insert_in_one_statement(
    statements: list[tuple[Model, kept.OneRowInsert, list[Any]]],
    using: str,
    notify: str | None,
    only_if: Model | None,
) -> bool:
    """:func:`insert_together` on PostgreSQL: the kept INSERTs as parts of one ``WITH``."""
    connection = connections[using]
    parts: list[str] = []
    params: list[Any] = []
    columns: list[str] = []
    for index, (obj, statement, returned) in enumerate(statements):
        parts.append(f"r{index} AS ({statement.sql})")
        params.extend(statement.params(obj, connection, only_if))
        columns.extend(f"r{index}.{connection.ops.quote_name(field.column)}" for field in returned)
    if notify is not None:
        columns.append("(SELECT pg_notify(%s, ''))")
        params.append(notify)
    tables = ", ".join(f"r{index}" for index in range(len(statements)))
    sql = f"WITH {', '.join(parts)} SELECT {', '.join(columns)} FROM {tables}"
    row = compiler.send(connection, sql, params, "one")
    if row is None:
        # Guarded and the guard is gone: every part saw the same snapshot, none wrote.
        return False
    start = 0
    for obj, statement, returned in statements:
        values = row[start : start + len(returned)]
        start += len(returned)
        _set_returned(obj, using, statement.convert(values, connection), returned)
    return True


def insert_fields(model: type[Model], returning: Sequence[str]) -> tuple[list[Any], list[Any]]:
    """The fields an INSERT of ``model`` writes, and those it returns (the key first); kept
    per model (a put asks every time)."""

    def build() -> tuple[list[Any], list[Any]]:
        opts = model._meta
        fields = [f for f in opts.concrete_fields if not isinstance(f, AutoField) and not f.generated]
        return fields, [opts.pk, *(opts.get_field(name) for name in returning)]

    return kept.keep(("insert-fields", model, tuple(returning)), build)


def _insert_returning(
    objs: Sequence[Model],
    using: str,
    fields: list[Any],
    returned: list[Any],
    notify: str | None,
    only_if: Model | None = None,
    connection: BaseDatabaseWrapper | None = None,
) -> bool:
    connection = connections[using] if connection is None else connection
    notify = notify if notify is not None and features_of(connection).notify else None
    statement = None
    if len(objs) == 1 and connection.features.can_return_columns_from_insert:
        # The hot path (a put): the statement Django would build, compiled once per shape.
        statement = kept.one_row_insert(objs[0], using, fields, returned, notify is not None, only_if)
    if statement is not None:
        obj = objs[0]
        params = statement.params(obj, connection, only_if)
        if notify is not None:
            params.append(notify)
        row = compiler.send(connection, statement.sql, params, "one")
        if row is None:
            return False  # guarded, and the guard is gone: nothing written
        _set_returned(obj, using, statement.convert(row, connection), returned)
        return True
    elif len(objs) > 1 and only_if is None and connection.features.can_return_rows_from_bulk_insert:
        # Several rows (a put_many's chunk), each of one shape: the kept row, once per row.
        if _insert_many(objs, using, fields, returned, notify, connection):
            return True
    if only_if is not None and not _exists(only_if, using):
        return False
    channel = notify
    wrap = None if channel is None else (lambda sql, params: notifying(sql, params, channel))
    rows = compiler.execute_insert(objs, using, fields, returned, wrap)
    for obj, row in zip(objs, rows, strict=False):
        _set_returned(obj, using, row, returned)
    return True


def _insert_many(
    objs: Sequence[Model],
    using: str,
    fields: list[Any],
    returned: list[Any],
    notify: str | None,
    connection: BaseDatabaseWrapper,
) -> bool:
    """Write ``objs`` with the kept statement of their shape, one ``VALUES`` row each, as
    Django's compiler would (its per-row work is most of a ``put_many``'s); False, having sent
    nothing, if they are of several shapes or theirs has no kept statement."""
    statement = kept.one_row_insert(objs[0], using, fields, returned, notify is not None)
    if statement is None:
        return False
    for obj in objs:
        if kept.one_row_insert(obj, using, fields, returned, notify is not None) is not statement:
            return False
    params: list[Any] = []
    sql = statement.unnest
    if sql is not None:
        # An array a column (PostgreSQL): the rows' parameters, turned.
        params.extend(map(list, zip(*(statement.params(obj, connection) for obj in objs), strict=True)))
    else:
        sql = statement.many(len(objs))
        if sql is None:
            return False
        for obj in objs:
            params.extend(statement.params(obj, connection))
    if notify is not None:
        params.append(notify)
    rows = compiler.send(connection, sql, params)
    if len(rows) != len(objs):
        raise AssertionError(f"an INSERT of {len(objs)} rows returned {len(rows)}")
    for obj, row in zip(objs, rows, strict=True):
        _set_returned(obj, using, statement.convert(row, connection), returned)
    return True


def _set_returned(obj: Model, using: str, row: Sequence[Any], returned: list[Any]) -> None:
    for field, value in zip(returned, row, strict=False):
        setattr(obj, field.attname, value)
    obj._state.adding = False
    obj._state.db = using


class MissingRows:
    """``INSERT`` of rows by primary key that skips the keys already there (``ON CONFLICT DO
    NOTHING`` / ``INSERT IGNORE``), one statement per slice of keys, each row with the same
    values in ``fields`` (their defaults, as ``save()`` would write them) and, if ``now`` names
    a field, the database's clock in it.

    Built with the backend's own pieces rather than ``bulk_create(ignore_conflicts=True)``:
    that one cannot say how many rows were new, and spends most of its time preparing model
    instances. The statement's row count is the number inserted.
    """

    def __init__(
        self, model: type[Model], using: str, fields: Sequence[Field[Any, Any]], now: str | None = None
    ) -> None:
        self.model, self.using = model, using
        connection = connections[using]
        pk = model._meta.pk
        assert pk is not None
        self.pk = pk
        template = model()
        self.values = [f.get_db_prep_save(f.pre_save(template, add=True), connection) for f in fields]
        self.columns: list[Any] = [pk, *fields]
        self.row_sql = ["%s"] * len(self.columns)
        self.row_params: list[Any] = []
        if now is not None:
            now_sql, self.row_params = compiler.compile_expression(model, using, DbNow())
            self.columns.append(model._meta.get_field(now))
            self.row_sql.append(now_sql)
        #: Parameters per row: what keeps a slice of keys within one statement.
        self.per_row = len(self.row_sql) + len(self.row_params)

    def insert(self, keys: Sequence[Any]) -> int:
        """Insert a row for each of ``keys`` (one statement) that is not there; return how many were."""
        connection = connections[self.using]
        params: list[Any] = []
        for value in keys:
            params.append(self.pk.get_db_prep_save(value, connection))
            params.extend(self.values)
            params.extend(self.row_params)
        table = self.model._meta.db_table
        sql = compiler.insert_ignore_sql(connection, table, self.columns, [self.row_sql] * len(keys))
        return max(compiler.execute(self.using, sql, params, "rowcount"), 0)
