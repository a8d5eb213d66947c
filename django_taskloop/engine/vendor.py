"""Everything that differs between SQLite, MySQL/MariaDB and PostgreSQL, decided in one place.

The rest of the package asks :func:`features` what a connection can do and uses
:class:`DbNow` for the database clock; no other module looks at ``connection.vendor``.
"""

from __future__ import annotations

import datetime as dt
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from typing import Any, TypeVar

from django.conf import settings
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import DateTimeField, Expression, Index, Q, Value
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from . import compiler

try:
    import fcntl
except ImportError:  # not a POSIX system: SQLite's busy handler alone
    fcntl = None  # type: ignore[assignment]


@dataclass(frozen=True)
class Features:
    """What the claim engine needs to know about one database."""

    vendor: str
    #: ``SELECT … FOR UPDATE SKIP LOCKED`` exists (MySQL 8.0.1+, MariaDB 10.6+, PostgreSQL).
    skip_locked: bool
    #: ``FOR UPDATE OF <table>`` exists (PostgreSQL, MySQL 8; not MariaDB).
    for_update_of: bool
    #: No row locks: a write lock on the whole database must be taken first (SQLite).
    write_lock_first: bool
    #: ``LISTEN``/``NOTIFY`` wake-ups are available (PostgreSQL).
    notify: bool
    #: Largest number of bound parameters worth putting in one statement.
    max_params: int
    #: An index is read in ORDER BY order only if the ORDER BY repeats the leading index
    #: columns that the WHERE pins with ``IS NULL`` (PostgreSQL does not count ``IS NULL`` as
    #: an equality). MySQL/MariaDB need those columns left out of the ORDER BY: there, such a
    #: column in it makes the planner sort. SQLite takes either.
    order_by_repeats_null_prefix: bool = False
    #: ``UPDATE … RETURNING`` exists (PostgreSQL, SQLite 3.35+; not MariaDB 10 or MySQL).
    update_returning: bool = False
    #: ``INSERT``/``UPDATE``/``DELETE`` may be parts of a ``WITH`` (PostgreSQL).
    modifying_with: bool = False
    #: A row's index entries outlive its claim or delete until a cleanup that a transaction
    #: held open elsewhere holds back (PostgreSQL's VACUUM, InnoDB's purge): a consumer's
    #: claims start after its last (see :mod:`.cursor`). SQLite removes them with the row.
    dead_entries_linger: bool = False
    #: A statement that pins, for the rest of the transaction, the plans that claims and
    #: acknowledgements need ("" where none is needed): see ``run_in_transaction(pin=True)``.
    pin_plans: str = ""
    #: The index hint that makes a claim read a named index's range ("" where claims need
    #: none): MySQL/MariaDB, whose optimizer reads a cursor claim behind a long backlog by the
    #: index's equal prefix from the head instead (see :func:`~.claim.claim`'s ``index``).
    index_hint: str = ""


#: PostgreSQL: no sequential scan, bitmap scan or sort in the rest of the transaction. After an
#: ANALYZE that counted few live rows in a table full of dead ones (a busy queue table, more so
#: while a transaction is held open elsewhere), the planner costs every index as if nearly empty
#: and picks by hair's breadth: a claim that sorts every ready row after its start, an
#: acknowledgement that reads the whole table (both seen in bench/held_horizon.py, a minute
#: long each, until the next ANALYZE). What is left are index scans: a claim's ordered scan
#: that stops at the limit. (Not enough for an acknowledgement alone: by the same statistics a
#: scan of a whole index whose last column is the key looked as cheap as a primary-key lookup
#: per row, a minute in steady churn; the tube's indexes are therefore such that a settle's
#: filter implies the predicate of none but the primary key: see ``Task.Meta.indexes``.)
#:
#: And no JIT compilation in those transactions: a plan that still needs a disabled node (a
#: keyed claim's subquery) is priced at about 1e10, far above ``jit_above_cost``, so at
#: PostgreSQL's default ``jit = on`` LLVM compiled every keyed claim and settle, 0.3–0.7 s each
#: for statements that run in a millisecond (tests/test_jit_plans.py). Ours are short; JIT never
#: pays for them. All four are ``is_local``: the user's other transactions keep their settings.
PIN_POSTGRESQL_PLANS = (
    "SELECT set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true), "
    "set_config('enable_sort', 'off', true), set_config('jit', 'off', true)"
)


def lead_with(connection: BaseDatabaseWrapper, statement: str) -> str:
    """``statement`` as the lead of the next kept statement sent on ``connection`` (the text
    to put before it, for :func:`.compiler.send`'s ``lead``), or ``""`` where the two cannot
    be one text. One text is one round trip: PostgreSQL's simple query protocol runs each of
    its statements in turn, and plans each one as it comes to it, so a ``set_config`` in the
    lead holds for the planning of the statement after it. psycopg2 sends every text that
    way, psycopg 3 with client-side binding (Django's default); with server-side binding
    (``OPTIONS["server_side_binding"]``) a text with parameters is one prepared statement,
    which holds one statement only. (Not connected yet: ``""``, the pin its own round trip.)"""
    if connection.vendor != "postgresql" or connection.connection is None:
        return ""
    assert "%" not in statement  # (the driver formats the whole text with the parameters)
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    if is_psycopg3:
        import psycopg

        if not issubclass(connection.connection.cursor_factory, psycopg.ClientCursor):
            return ""
    return f"{statement}; "


@cache
def _features(alias: str, vendor: str, skip_locked: bool, of: bool, returning: bool) -> Features:
    return Features(
        vendor=vendor,
        skip_locked=skip_locked,
        for_update_of=of,
        write_lock_first=vendor == "sqlite",
        notify=vendor == "postgresql",
        # SQLite's default limit is 32766 (3.32+); MySQL and PostgreSQL take 65535.
        max_params=30_000 if vendor == "sqlite" else 60_000,
        order_by_repeats_null_prefix=vendor == "postgresql",
        update_returning=returning and vendor in ("postgresql", "sqlite"),
        modifying_with=vendor == "postgresql",
        dead_entries_linger=vendor in ("postgresql", "mysql"),
        pin_plans=PIN_POSTGRESQL_PLANS if vendor == "postgresql" else "",
        index_hint="FORCE INDEX ({})" if vendor == "mysql" else "",
    )


def features(using: str) -> Features:
    """Return the :class:`Features` of database alias ``using``."""
    return features_of(connections[using])


def features_of(connection: BaseDatabaseWrapper) -> Features:
    """Return the :class:`Features` of Django connection ``connection`` (:func:`features`, for a
    caller that has the connection already)."""
    skip = False
    of = False
    if connection.vendor != "sqlite":
        # These flags need the server version, which needs a connection.
        connection.ensure_connection()
        skip = bool(connection.features.has_select_for_update_skip_locked)
        of = bool(connection.features.has_select_for_update_of)
    # SQLite has RETURNING (for UPDATE too) where Django says it can return insert columns.
    returning = bool(connection.features.can_return_columns_from_insert)
    return _features(connection.alias, connection.vendor, skip, of, returning)


# -- the test clock ------------------------------------------------------------------------------

#: Seconds this process adds to the database's clock: 0 but in tests (see
#: :func:`set_clock_offset`; ``django_taskloop.testing.advance_clock`` is its public door).
_clock_offset = 0.0
#: What :func:`set_clock_offset` calls: the caches of statements compiled with the clock in them.
_clock_listeners: list[Callable[[], None]] = []


def clock_offset() -> float:
    """The seconds this process adds to the database's clock (0 in production)."""
    return _clock_offset


class ClockShift:
    """The seconds :func:`set_clock_offset` moved this process's clock, as an attribute
    (``clock_shift.seconds``): for a loop that reads :func:`local_clock` per item without a
    call (``time.monotonic() + clock_shift.seconds``)."""

    seconds = 0.0


clock_shift = ClockShift()


def local_clock() -> float:
    """This process's monotonic clock, moved as its view of the database's clock is
    (:func:`set_clock_offset`): for local estimates of deadlines the database keeps (a worker
    knows until when its leases surely hold without asking), which the test clock must move too."""
    return time.monotonic() + _clock_offset


def set_clock_offset(seconds: float) -> None:
    """Make every :class:`DbNow` of this process (and so :class:`Shifted` and :func:`db_now`)
    read the database's clock plus ``seconds``: time passes in the database, as this process's
    statements see it, without waiting. For tests only. Other processes (workers started as
    subprocesses, other hosts) still read the real clock. Every kept statement is forgotten, so
    that none keeps the clock as it was compiled. 0 puts the real clock back; at 0 every
    statement is the same as with no test clock at all."""
    global _clock_offset
    seconds = float(seconds)
    if seconds == _clock_offset:
        return
    _clock_offset = clock_shift.seconds = seconds
    for forget in _clock_listeners:
        forget()


def on_clock_change(forget: Callable[[], None]) -> None:
    """Call ``forget`` whenever :func:`set_clock_offset` moves the clock (a cache of statements
    compiled with :class:`DbNow` in them clears itself)."""
    _clock_listeners.append(forget)


class DbNow(Expression):
    """The database's clock, plus ``seconds`` (may be negative or fractional).

    Deadlines are computed and compared by the database so that workers on many hosts agree.
    The value is the time of the statement, not of the transaction's start. In tests, the
    clock may be moved forward for this process (:func:`set_clock_offset`): the offset is
    added when the expression is compiled.
    """

    output_field = DateTimeField()

    def __init__(self, seconds: float = 0.0) -> None:
        super().__init__(output_field=DateTimeField())
        self.seconds = float(seconds)

    def __repr__(self) -> str:
        return f"DbNow({self.seconds!r})"

    @property
    def total(self) -> float:
        """``seconds`` plus this process's test clock offset (0 in production)."""
        return self.seconds + _clock_offset if _clock_offset else self.seconds

    def as_sql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, tuple[Any, ...]]:
        raise NotImplementedError(f"django-taskloop does not support the {connection.vendor} database")

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list[Any]]:
        seconds = self.total
        if not seconds:
            return "STATEMENT_TIMESTAMP()", []
        return "(STATEMENT_TIMESTAMP() + make_interval(secs => %s))", [seconds]

    def as_mysql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list[Any]]:
        # Django stores UTC in DATETIME(6) columns when USE_TZ is on; UTC_TIMESTAMP matches that
        # whatever the session's time zone is.
        seconds = self.total
        if not seconds:
            return "UTC_TIMESTAMP(6)", []
        return "(UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND)", [round(seconds * 1_000_000)]

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list[Any]]:
        # SQLite keeps datetimes as text and compares them as text. Its clock has milliseconds;
        # padding to six digits matches what Django writes for Python datetimes, so both sort
        # alike within the same millisecond.
        return "(STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s) || '000')", [f"{self.total:+.3f} seconds"]


class Shifted(Expression):
    """``base`` (a datetime expression, default the database clock) plus ``seconds``.

    ``seconds`` is a number or a float expression (a column). ``DbNow(seconds)`` takes only a
    constant; a tube task's deadline at take time is now plus *its own* ttr, and touch moves
    stored deadlines, so these need a column on either side.
    """

    output_field = DateTimeField()

    def __init__(self, seconds: Any, base: Any = None) -> None:
        super().__init__(output_field=DateTimeField())
        self.base = base if base is not None else DbNow()
        self.seconds = seconds if hasattr(seconds, "resolve_expression") else Value(float(seconds))

    def get_source_expressions(self) -> list[Any]:
        return [self.base, self.seconds]

    def set_source_expressions(self, exprs: Sequence[Any]) -> None:
        self.base, self.seconds = exprs

    def _parts(self, compiler: Any) -> tuple[str, str, list[Any]]:
        base_sql, base_params = compiler.compile(self.base)
        sec_sql, sec_params = compiler.compile(self.seconds)
        return base_sql, sec_sql, [*base_params, *sec_params]

    def as_sql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, tuple[Any, ...]]:
        raise NotImplementedError(f"django-taskloop does not support the {connection.vendor} database")

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list[Any]]:
        base, sec, params = self._parts(compiler)
        return f"({base} + make_interval(secs => ({sec})::double precision))", params

    def as_mysql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list[Any]]:
        base, sec, params = self._parts(compiler)
        return f"({base} + INTERVAL ROUND(({sec}) * 1000000) MICROSECOND)", params

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list[Any]]:
        base, sec, params = self._parts(compiler)
        return f"STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', {base}, printf('%%+.3f seconds', {sec}))", params


class DbAt(Expression):
    """A reading of the database's clock taken earlier (``moment``, as the cursor returned it
    for a :class:`DbNow`, the test clock offset already in it), plus ``seconds``: what a
    :class:`DbNow` in a later statement of the same claim compiles to (:func:`pin_clock`), so
    that both statements see one moment. MySQL/MariaDB only (see ``_Lease``)."""

    output_field = DateTimeField()

    def __init__(self, moment: Any, seconds: float = 0.0) -> None:
        super().__init__(output_field=DateTimeField())
        self.moment = moment
        self.seconds = float(seconds)

    def __repr__(self) -> str:
        return f"DbAt({self.moment!r}, {self.seconds!r})"

    def as_sql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, tuple[Any, ...]]:
        raise NotImplementedError("DbAt stands in for DbNow in MySQL/MariaDB's claim only")

    def as_mysql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list[Any]]:
        if not self.seconds:
            return "CAST(%s AS DATETIME(6))", [self.moment]
        return "(CAST(%s AS DATETIME(6)) + INTERVAL %s MICROSECOND)", [
            self.moment,
            round(self.seconds * 1_000_000),
        ]


def pin_clock(value: Any, moment: Any) -> Any:
    """``value`` (a change's value: an expression or a plain one) with every :class:`DbNow`
    in it replaced by :class:`DbAt` at ``moment``; ``value`` itself where it has none."""
    if isinstance(value, DbNow):
        return DbAt(moment, value.seconds)
    sources = getattr(value, "get_source_expressions", None)
    if sources is None:
        return value
    old = sources()
    new = [pin_clock(source, moment) for source in old]
    if all(a is b for a, b in zip(old, new, strict=True)):
        return value
    value = value.copy()
    value.set_source_expressions(new)
    return value


def to_datetime(value: Any) -> dt.datetime:
    """Turn what a cursor returns for a :class:`DbNow` into an aware (if ``USE_TZ``) datetime."""
    if isinstance(value, str):
        value = parse_datetime(value)
    if settings.USE_TZ and timezone.is_naive(value):
        value = timezone.make_aware(value, dt.UTC)
    moment: dt.datetime = value
    return moment


def db_now(using: str = "default") -> dt.datetime:
    """Return the database server's current time."""
    connection = connections[using]
    sql, params = _now_sql(connection)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {sql}", params)
        return to_datetime(cursor.fetchone()[0])


def _now_sql(connection: Any) -> tuple[str, list[Any]]:
    method = getattr(DbNow(), f"as_{connection.vendor}", None)
    if method is None:
        raise NotImplementedError(f"django-taskloop does not support the {connection.vendor} database")
    sql: tuple[str, list[Any]] = method(None, connection)
    return sql


def data_files(using: str, connection: BaseDatabaseWrapper | None = None) -> list[str]:
    """Return the files that change when any connection commits to database ``using``.

    SQLite: the database file and its write-ahead log (a commit writes one of them), which a
    waiter can watch for changes made by other processes without asking the database.
    Elsewhere (a server), or for an in-memory database: none. ``connection``: ``using``'s,
    where the caller has it already.
    """
    connection = connections[using] if connection is None else connection
    if connection.vendor != "sqlite":
        return []
    name = str(connection.settings_dict["NAME"] or "")
    if not name or name == ":memory:" or "mode=memory" in name:
        return []
    if name.startswith("file:"):
        name = name[len("file:") :].split("?", 1)[0]
    return [name, f"{name}-wal"]


#: This thread's open turn files (SQLite), by path, for the process that opened them.
_turn_files = threading.local()


def _turn_file(database: str) -> int | None:
    """This thread's descriptor of the turn file beside SQLite database ``database`` (see
    :func:`writers_in_turn`), opened once per thread and process; ``None`` if it cannot be."""
    pid = os.getpid()
    if getattr(_turn_files, "pid", None) != pid:
        # A forked child must not share its parent's descriptors: a lock belongs to the open
        # file, and parent and child would both hold it at once.
        _turn_files.pid, _turn_files.fds = pid, {}
    fds: dict[str, int | None] = _turn_files.fds
    if database not in fds:
        try:
            fds[database] = os.open(f"{database}-taskloop-turn", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except OSError:
            fds[database] = None  # a read-only directory: SQLite's busy handler alone
    return fds[database]


def _let_go(fd: int | None) -> None:
    if fd is not None:
        fcntl.flock(fd, fcntl.LOCK_UN)


@contextmanager
def writers_in_turn(
    using: str, connection: BaseDatabaseWrapper | None = None
) -> Iterator[Callable[[], None]]:
    """On SQLite (a database file), hold an exclusive lock on a file beside the database for
    the time of a write transaction; elsewhere, nothing.

    SQLite lets one writer in at a time, and one that finds the write lock taken sleeps in its
    busy handler for 1, 2, 5 … up to 100 ms at a time, without knowing when the lock comes
    free. With several processes writing back to back, the lock is mostly taken: a sleeper
    keeps waking to a taken lock and sleeping longer, a batch that takes 2 ms waits hundreds,
    and four processes drain slower than one. Waiting for the turn file instead, the kernel
    wakes the next writer the moment the last one lets go. Writers that do not take turns
    (other programs, Django's own saves) still meet SQLite's busy handler, as before.

    It gives a function that lets go of the turn before the block ends (a transaction's
    first ``on_commit`` hook: the hooks after it run with the turn free); letting go twice
    is harmless.
    """
    files = data_files(using, connection) if fcntl is not None else []
    fd = _turn_file(files[0]) if files else None
    if fd is None:
        yield lambda: None
        return
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield lambda: _let_go(fd)
    finally:
        _let_go(fd)


def is_retryable(error: BaseException, using: str) -> bool:
    """Say whether ``error`` is a deadlock, lock timeout or busy database worth retrying."""
    vendor = connections[using].vendor
    if vendor == "mysql":
        # 1213: deadlock found; 1205: lock wait timeout exceeded.
        return bool(error.args) and error.args[0] in (1205, 1213)
    if vendor == "postgresql":
        sqlstate = getattr(error.__cause__, "sqlstate", None) or getattr(error, "sqlstate", None)
        return sqlstate in ("40P01", "40001", "55P03")
    if vendor == "sqlite":
        return "locked" in str(error) or "busy" in str(error)
    return False


#: MySQL/MariaDB errors after which the connection is no use: 2006 (server has gone away),
#: 2013 (lost connection during query), and 1047, a Galera node that is not ready (out of the
#: primary component, or joining): it refuses every statement that reads a table, yet its
#: connections still answer a ping, so Django's ``is_usable()`` keeps them.
_MYSQL_CONNECTION_LOST = (1047, 2006, 2013)


def is_connection_lost(error: BaseException, using: str) -> bool:
    """Say whether ``error`` means the connection cannot serve anything more (the server went
    away, or cannot serve now): drop it, so that the next call connects again — through a
    proxy, perhaps to another server. A ping says so for most such errors; not for these."""
    if connections[using].vendor == "mysql":
        return bool(error.args) and error.args[0] in _MYSQL_CONNECTION_LOST
    return False


def node_share(using: str) -> tuple[int, int]:
    """Return ``(index, count)``: which of ``count`` shares of the writers the server behind
    ``using``'s connection is, so that rows every process updates (counter slots, throughput
    minutes) can be picked per server and two servers never write the same row.

    A Galera node's share is its ``auto_increment_offset`` among ``auto_increment_increment``
    (``wsrep_auto_increment_control`` sets them per node, the cluster's size apart), read once
    per connection; a lone server (and every other database) is ``(0, 1)``. Two nodes writing
    the same row conflict at certification (error 1213 at COMMIT): retried, yet wasted work.
    """
    connection = connections[using]
    if connection.vendor != "mysql":
        return 0, 1
    connection.ensure_connection()
    raw = connection.connection
    known = getattr(connection, "_taskloop_node_share", None)
    if known is None or known[0] is not raw:
        offset, increment = compiler.send(
            connection, "SELECT @@auto_increment_offset, @@auto_increment_increment", [], "one"
        )
        count = max(1, int(increment))
        known = (raw, (int(offset) - 1) % count, count)
        connection._taskloop_node_share = known  # type: ignore[attr-defined]  # our own slot on the wrapper
    return known[1], known[2]


def notifying(sql: str, params: Any, channel: str) -> tuple[str, list[Any]]:
    """Wrap a data-changing statement with ``RETURNING`` so that it also sends a PostgreSQL
    ``NOTIFY`` on ``channel`` (once, at its commit): one round trip for both."""
    return (
        f"WITH changed AS ({sql}) SELECT changed.*, (SELECT pg_notify(%s, '')) FROM changed",
        [*params, channel],
    )


def take_write_lock(connection: Any, table: str) -> None:
    """On SQLite, make the transaction's first statement a write.

    SQLite has no row locks. A transaction that reads first and writes later can find another
    writer ahead of it and fail at once with "database is locked" (a lock upgrade deadlock,
    where the busy timeout does not help). A no-op ``UPDATE`` first takes the write lock, and
    while waiting for it SQLite honours the busy timeout.
    """
    if connection.vendor == "sqlite":
        qn = connection.ops.quote_name
        with connection.cursor() as cursor:
            cursor.execute(f"UPDATE {qn(table)} SET rowid = rowid WHERE 0")


#: What a schema editor runs for an index a database does not get (MySQL's statement that
#: does nothing; an index's SQL cannot be None).
NO_INDEX = "DO 0"


class PartialIndex(Index):
    """An index of the rows matching ``where``, where the database has partial indexes
    (PostgreSQL, SQLite), and of every row elsewhere (MySQL/MariaDB).

    Rows outside it cost nothing to insert, update or delete: on PostgreSQL an update that
    changes an indexed column (a take changes ``state``) adds an entry to every index the row
    belongs to. Unlike ``Index(condition=...)``, MySQL gets the plain index without a system
    check warning (models.W037). Queries it serves must imply ``where`` (``x = …``, ``x <= …``
    imply ``x IS NOT NULL``).

    ``unique=True``: a unique index, for a uniqueness that matters only among the rows
    matching ``where`` — e.g. a column that is NULL in most rows: NULLs never collide, yet on
    every database each of them is an index entry to write. (A ``UniqueConstraint`` with a
    ``condition`` would give MySQL no index at all.)

    ``only_partial=True``: no index at all where partial indexes are missing — for the other
    half of a table split by ``where``, whose first half is there a whole index already.
    """

    def __init__(
        self, *args: Any, where: Q, unique: bool = False, only_partial: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.where = where
        self.unique = unique
        self.only_partial = only_partial

    def deconstruct(self) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
        path, args, kwargs = super().deconstruct()
        kwargs["where"] = self.where
        if self.unique:
            kwargs["unique"] = True
        if self.only_partial:
            kwargs["only_partial"] = True
        return path, tuple(args), kwargs

    def __eq__(self, other: object) -> bool:
        return (
            super().__eq__(other)
            and getattr(other, "where", None) == self.where
            and getattr(other, "unique", False) == self.unique
            and getattr(other, "only_partial", False) == self.only_partial
        )

    __hash__ = Index.__hash__

    def _absent(self, schema_editor: Any) -> bool:
        return self.only_partial and not schema_editor.connection.features.supports_partial_indexes

    def remove_sql(self, model: Any, schema_editor: Any, **kwargs: Any) -> Any:
        if self._absent(schema_editor):
            return NO_INDEX
        return super().remove_sql(model, schema_editor, **kwargs)

    def create_sql(self, model: Any, schema_editor: Any, using: str = "", **kwargs: Any) -> Any:
        if self._absent(schema_editor):
            return NO_INDEX
        if self.unique:
            # The backend's own CREATE INDEX template (its USING, INCLUDE and WHERE parts).
            template = schema_editor.sql_create_index
            assert template.startswith("CREATE INDEX "), template
            kwargs["sql"] = "CREATE UNIQUE INDEX " + template[len("CREATE INDEX ") :]
        if not schema_editor.connection.features.supports_partial_indexes:
            return super().create_sql(model, schema_editor, using=using, **kwargs)
        self.condition = self.where
        try:
            return super().create_sql(model, schema_editor, using=using, **kwargs)
        finally:
            self.condition = None


class NullsFirstIndex(Index):
    """An index whose columns named in ``nulls_first`` sort NULLs first on every database.

    Where NULLs sort last by default (PostgreSQL) those columns are indexed ``NULLS FIRST``,
    so that an ``ORDER BY … NULLS FIRST`` reads the index in order. Plain column indexes
    everywhere else: MariaDB has no functional indexes, and SQLite and MySQL already sort
    NULLs first. A subclass names its columns (a class attribute, so that migrations need
    no new argument).
    """

    nulls_first: tuple[str, ...] = ()

    def create_sql(self, model: Any, schema_editor: Any, using: str = "", **kwargs: Any) -> Any:
        if schema_editor.connection.features.order_by_nulls_first:
            return super().create_sql(model, schema_editor, using=using, **kwargs)
        suffixes = dict.fromkeys(self.nulls_first, "NULLS FIRST")
        return compiler.index_sql(self, model, schema_editor, suffixes, using=using, **kwargs)


T = TypeVar("T")


def batched(values: Sequence[T], using: str, per_row: int = 1) -> Iterator[Sequence[T]]:
    """Yield ``values`` in slices small enough for one statement on database ``using``."""
    size = max(1, features(using).max_params // max(1, per_row))
    for start in range(0, len(values), size):
        yield values[start : start + size]


#: The databases django-taskloop runs on (``connection.vendor``).
SUPPORTED = ("sqlite", "mysql", "postgresql")


def supported(using: str) -> bool:
    """Say whether django-taskloop runs on database ``using`` at all (see :data:`SUPPORTED`;
    a server must also have ``SKIP LOCKED``: :attr:`Features.skip_locked`)."""
    return connections[using].vendor in SUPPORTED


# -- table statistics ---------------------------------------------------------------------------

#: What the servers that keep table statistics say about a table's row count; SQLite has none
#: worth reading (then a page counts, capped, instead).
_ROW_ESTIMATES = {
    # reltuples is -1 before the first VACUUM/ANALYZE: then we do not know.
    "postgresql": "SELECT reltuples FROM pg_class WHERE oid = to_regclass(%s)",
    "mysql": "SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() "
    "AND TABLE_NAME = %s",
}


def estimated_row_count(table: str, using: str) -> int | None:
    """Return the table statistics' row count of ``table`` on ``using``, or ``None`` if unknown."""
    connection = connections[using]
    sql = _ROW_ESTIMATES.get(connection.vendor)
    if sql is None:
        return None
    with connection.cursor() as cursor:
        cursor.execute(sql, [table])
        row = cursor.fetchone()
    return int(row[0]) if row and row[0] is not None and row[0] >= 0 else None


# -- LISTEN / NOTIFY (PostgreSQL) ----------------------------------------------------------------


def send_notify(using: str, channel: str) -> None:
    """Send a ``NOTIFY`` on ``channel`` in the current transaction (heard at its commit);
    nothing where the database has no notifications."""
    if features(using).notify:
        with connections[using].cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, '')", [channel])


def listen_params(using: str) -> dict[str, Any]:
    """What :func:`listen_connection` needs to open a connection to database ``using``."""
    params = dict(connections[using].get_connection_params())
    for key in ("cursor_factory", "context", "prepare_threshold", "server_side_binding"):
        params.pop(key, None)
    return params


def listen_connection(params: dict[str, Any]) -> Any:
    """Open a connection of its own (PostgreSQL, :func:`listen_params`) in autocommit, for
    :func:`listen` and its notifications (``conn.notifies()``)."""
    import psycopg

    return psycopg.connect(**params, autocommit=True)


def listen(conn: Any, channel: str) -> None:
    """``LISTEN`` on ``channel`` on ``conn`` (a :func:`listen_connection`)."""
    conn.execute(f'LISTEN "{channel}"')
