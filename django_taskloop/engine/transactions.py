"""Write transactions: the write lock first (SQLite), retries of deadlocks and lock timeouts
(:class:`DatabaseBusy` when they cannot be retried), and dropping a connection the server
left broken."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from django.db import DatabaseError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Model

from ..conf import setting
from ..exceptions import DatabaseBusy, TaskloopError
from . import compiler
from .vendor import features, is_connection_lost, is_retryable, lead_with, take_write_lock, writers_in_turn

T = TypeVar("T")


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
    pin: bool = False,
    connection: BaseDatabaseWrapper | None = None,
    led: Callable[[str], T] | None = None,
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

    ``pin``: ``work`` claims or acknowledges queue rows; where the database needs it
    (``Features.pin_plans``, PostgreSQL) the transaction first pins the plans that such
    statements need. Only in a transaction of our own: inside a caller's it would change the
    caller's later statements. Work that is one statement then runs in a transaction too.
    ``led``: the same work, for one whose first statement is a kept one
    (:func:`.compiler.send`), given the text to send as that statement's lead: the pin and
    the statement then go in one round trip where the driver allows (:func:`.vendor.lead_with`).
    ``connection``: ``using``'s, where the caller has it already (each look-up costs calls).
    """
    connection = connections[using] if connection is None else connection
    outermost = not connection.in_atomic_block
    if pin and outermost and features(using).pin_plans:
        work, alone = _pinned(using, work, led, connection), False
    attempt = 0
    while True:
        try:
            return _run_once(model, using, work, outermost, savepoint, alone, lock_first, connection)
        except (DatabaseError, DatabaseBusy) as raised:
            _give_up_unless_retryable(raised, using, outermost, attempt)
            attempt += 1
            # Jitter keeps the retrying processes from colliding again in step.
            time.sleep(min(0.5, 0.01 * 2**attempt) * random.uniform(0.5, 1.5))


def _pinned(
    using: str, work: Callable[[], T], led: Callable[[str], T] | None, connection: BaseDatabaseWrapper
) -> Callable[[], T]:
    """``work`` after the statement that pins the plans (``Features.pin_plans``): that
    statement as the lead of ``led``'s first where the driver allows, else a round trip of its
    own. (Decided in the transaction, whose connection is open by then.)"""
    pin = features(using).pin_plans

    def pinned() -> T:
        lead = lead_with(connection, pin) if led is not None else ""
        if lead:
            assert led is not None
            return led(lead)
        compiler.send(connection, pin, [], "one")
        return work()

    return pinned


def _run_once(
    model: type[Model],
    using: str,
    work: Callable[[], T],
    outermost: bool,
    savepoint: bool,
    alone: bool,
    lock_first: bool,
    connection: BaseDatabaseWrapper,
) -> T:
    """One try of :func:`run_in_transaction`."""
    if alone:
        if not outermost:
            # As save() does: inside a caller's transaction an error marks it for rollback.
            with transaction.mark_for_rollback_on_error(using):
                return work()
        # (Outside one that marks nothing: autocommit.)
        with writers_in_turn(using, connection):
            return work()
    if not outermost:
        with write_transaction(model, using, savepoint=savepoint, lock_first=lock_first):
            return work()
    # SQLite: our own writers queue for the write lock (see writers_in_turn), and the
    # next one's turn comes at the commit, before the on_commit hooks run.
    with writers_in_turn(using, connection) as let_go, write_transaction(model, using, lock_first=lock_first):
        transaction.on_commit(let_go, using=using)
        return work()


def _give_up_unless_retryable(
    raised: DatabaseError | DatabaseBusy, using: str, outermost: bool, attempt: int
) -> None:
    """Return if a try that raised ``raised`` may be retried; else raise what the caller gets.

    A :class:`DatabaseBusy` from work nested inside (an inner run_in_transaction, which never
    retries) is retried by the outermost one, the one layer that can replay the transaction.
    """
    error = raised.__cause__ if isinstance(raised, DatabaseBusy) else raised
    if not isinstance(error, DatabaseError) or not is_retryable(error, using):
        if outermost:
            discard_if_broken(using, error)
        raise raised
    if not outermost:
        if isinstance(raised, DatabaseBusy):
            raise raised
        raise DatabaseBusy(_in_callers_transaction(using, error)) from error
    if attempt >= setting("RETRIES"):
        tries = "1 try" if attempt == 0 else f"{attempt + 1} tries"
        raise DatabaseBusy(
            f"database {using!r} stayed locked or deadlocked after {tries} "
            f"({error}); on SQLite, raise OPTIONS['timeout'] or use fewer writers"
        ) from error


def _in_callers_transaction(using: str, error: DatabaseError) -> str:
    """Return the message of a lock met inside a caller's transaction: tried once, not retried."""
    message = (
        f"database {using!r} was locked or deadlocked inside the caller's transaction "
        f"(atomic()) after 1 try ({error}); it was not retried: a retry would have to replay "
        "the caller's whole transaction, which only the caller can do. Retry the whole "
        "transaction, or write outside it: enqueue after atomic() returns, or at its commit "
        "(transaction.on_commit, or a Django Task's enqueue_on_commit=True)"
    )
    if connections[using].vendor == "sqlite":
        # A deferred transaction that has read cannot wait for the lock: SQLite refuses at once.
        message += (
            "; on SQLite a longer OPTIONS['timeout'] does not help a transaction that read before it wrote"
        )
    return message


def discard_if_broken(using: str, error: BaseException | None = None) -> None:
    """Close the connection ``using`` if an error (``error``, when known) left it unusable:
    the server went away, or it is a Galera node that is not ready (error 1047).

    Django drops such connections between requests; a worker or a script that keeps calling
    verbs would otherwise get "server has gone away" from every later call. Closing it lets the
    next call reconnect. Only for use outside any transaction.
    """
    connection = connections[using]
    if connection.connection is not None and connection.errors_occurred and not connection.in_atomic_block:
        if (error is not None and is_connection_lost(error, using)) or not connection.is_usable():
            connection.close()


def poll(until: Callable[[], bool], timeout: float | None, *, using: str, what: str) -> bool:
    """Call ``until()`` with backoff (``POLL_MIN`` up to ``POLL_MAX``) until it is true
    (``True``) or ``timeout`` seconds pass (``False``; ``None``: never): a wait for what other
    transactions commit. The state is checked before the clock, so a zero timeout still looks
    once. Waiting (a timeout other than 0) inside a transaction of database ``using`` raises
    :class:`TaskloopError` naming ``what``: it would never see the commit it waits for."""
    if (timeout is None or timeout > 0) and connections[using].in_atomic_block:
        raise TaskloopError(
            f"{what} with a timeout cannot run inside atomic(): it would never see the commit it waits for"
        )
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = setting("POLL_MIN")
    while True:
        if until():
            return True
        left = math.inf if deadline is None else deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(delay, left))
        delay = min(delay * setting("POLL_FACTOR"), setting("POLL_MAX"))
