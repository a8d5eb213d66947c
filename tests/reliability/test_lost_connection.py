"""A claim whose connection or process dies half-way leaves no half-made lease.

To catch the claim in the middle, a trigger on the claimed table stops the claim's ``UPDATE``
after it has written the first row's lease and before the second: on MariaDB and PostgreSQL it
waits for a lock this test holds, on SQLite it calls a function that parks the process. Then
the connection is killed from the server side (``KILL``, ``pg_terminate_backend``), or the
process with ``kill -9``, and the rows must be exactly as before the claim, and claimable.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from typing import Any

import pytest
from django.db import DatabaseError, connection, connections

from tests.reliability.conftest import SUFFIX
from tests.testapp.models import Ticket

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

TABLE = Ticket._meta.db_table
# MariaDB's named locks are the server's, not a database's: a run of its own (CI runs two
# test streams at once on one server; one once took the other's lock and its claim never
# paused).
LOCK_NAME = f"taskloop_reliab_pause_{SUFFIX}"[:64]
LOCK_KEY = 4_242_009


def _install_pause_trigger(vendor: str) -> None:
    qn = connection.ops.quote_name
    with connection.cursor() as cursor:
        if vendor == "mysql":
            cursor.execute(
                f"CREATE TRIGGER taskloop_reliab_pause BEFORE UPDATE ON {qn(TABLE)} FOR EACH ROW "
                f"BEGIN IF NEW.{qn('rank')} = 1 THEN SET @taskloop_pause = GET_LOCK('{LOCK_NAME}', 120); END IF; END"
            )
        elif vendor == "postgresql":
            cursor.execute(
                "CREATE FUNCTION taskloop_reliab_pause() RETURNS trigger LANGUAGE plpgsql AS $$ "
                f"BEGIN IF NEW.rank = 1 THEN PERFORM pg_advisory_lock({LOCK_KEY}); "
                f"PERFORM pg_advisory_unlock({LOCK_KEY}); END IF; RETURN NEW; END $$"
            )
            cursor.execute(
                f"CREATE TRIGGER taskloop_reliab_pause BEFORE UPDATE ON {qn(TABLE)} "
                "FOR EACH ROW EXECUTE FUNCTION taskloop_reliab_pause()"
            )


def _drop_pause_trigger(vendor: str) -> None:
    qn = connection.ops.quote_name
    with connection.cursor() as cursor:
        if vendor == "mysql":
            cursor.execute("DROP TRIGGER IF EXISTS taskloop_reliab_pause")
        elif vendor == "postgresql":
            cursor.execute(f"DROP TRIGGER IF EXISTS taskloop_reliab_pause ON {qn(TABLE)}")
            cursor.execute("DROP FUNCTION IF EXISTS taskloop_reliab_pause()")
        else:
            cursor.execute("DROP TRIGGER IF EXISTS taskloop_reliab_pause")


def _session_id() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT CONNECTION_ID()" if connection.vendor == "mysql" else "SELECT pg_backend_pid()"
        )
        return int(cursor.fetchone()[0])


def _wait_until_paused(session: int, outcome: dict[str, Any] | None = None) -> None:
    """Wait until session ``session`` sits on the pause lock, half-way through its UPDATE."""
    if connection.vendor == "mysql":
        sql = "SELECT state FROM information_schema.processlist WHERE id = %s"
        paused = ("User lock",)
    else:
        sql = "SELECT wait_event FROM pg_stat_activity WHERE pid = %s"
        paused = ("advisory",)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute(sql, [session])
            row = cursor.fetchone()
        if row and row[0] in paused:
            return
        time.sleep(0.02)
    raise AssertionError(f"the claim never reached the pause (last state {row!r}; the claim: {outcome!r})")


def _wait_until_gone(session: int) -> None:
    """Wait until the killed session ``session`` has left the server (its rollback is done).

    ``KILL``/``pg_terminate_backend`` return before the victim's transaction has rolled back;
    until it has, its row locks stand, and the next attempt's ``SKIP LOCKED`` claim would
    rightly skip those rows and claim nothing instead of reaching the pause.
    """
    if connection.vendor == "mysql":
        sql = "SELECT state FROM information_schema.processlist WHERE id = %s"
    else:
        sql = "SELECT state FROM pg_stat_activity WHERE pid = %s"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute(sql, [session])
            if cursor.fetchone() is None:
                return
        time.sleep(0.02)
    raise AssertionError(f"the killed session {session} is still on the server after 30 s")


def _assert_untouched_and_claimable() -> None:
    assert list(Ticket.objects.filter(locked_by__isnull=False)) == []
    assert list(Ticket.objects.filter(lock_expires_at__isnull=False)) == []
    # The killed transaction's row locks are gone too: everything is claimable at once.
    assert sorted(t.rank for t in Ticket.objects.claim("survivor", 10, lock_for=60)) == [0, 1, 2]


@pytest.fixture
def paused_table(vendor):
    Ticket.objects.bulk_create([Ticket(rank=i) for i in range(3)])
    _install_pause_trigger(vendor)
    yield
    connections.close_all()
    _drop_pause_trigger(vendor)


@pytest.mark.vendors("mysql", "postgresql")  # SQLite is embedded: no server connection to kill
@pytest.mark.parametrize("attempts", [1, 3])
def test_connection_killed_by_the_server_mid_claim_rolls_back(paused_table, vendor, attempts):
    for attempt in range(attempts):
        # Hold the pause lock, so that the claim stops after its first row's lease.
        _hold_pause_lock(vendor, True)
        outcome: dict[str, Any] = {}
        ready = threading.Event()

        def victim(outcome: dict[str, Any] = outcome, ready: threading.Event = ready) -> None:
            try:
                outcome["session"] = _session_id()
                ready.set()
                outcome["claimed"] = Ticket.objects.claim("victim", 3, lock_for=600)
            except BaseException as error:  # what the user of claim() sees
                outcome["error"] = error
            finally:
                ready.set()
                connection.close()  # this thread's own connection, whatever state it is in

        thread = threading.Thread(target=victim)
        thread.start()
        assert ready.wait(30)
        _wait_until_paused(outcome["session"], outcome)
        with connection.cursor() as cursor:
            if vendor == "mysql":
                cursor.execute(f"KILL {outcome['session']}")
            else:
                cursor.execute("SELECT pg_terminate_backend(%s)", [outcome["session"]])
        thread.join(60)
        assert not thread.is_alive()
        _wait_until_gone(outcome["session"])
        _hold_pause_lock(vendor, False)
        assert "claimed" not in outcome, "the claim went through its own connection's death"
        assert isinstance(outcome["error"], DatabaseError), repr(outcome["error"])
        if attempt == attempts - 1:
            _assert_untouched_and_claimable()
        else:
            assert not Ticket.objects.filter(locked_by__isnull=False).exists()


@pytest.mark.vendors("mysql", "postgresql")  # SQLite is embedded: no server connection to kill
def test_next_call_after_a_lost_connection_reconnects(vendor):
    """The engine drops a connection the server killed: the caller's next call just works."""
    Ticket.objects.bulk_create([Ticket(rank=i) for i in range(4)])
    outcome: dict[str, Any] = {}
    killed = threading.Event()
    session_known = threading.Event()

    def caller() -> None:
        try:
            outcome["session"] = _session_id()
            session_known.set()
            assert killed.wait(30)
            # Idle connection killed: the first call fails (nothing could have saved it) ...
            try:
                Ticket.objects.claim("again", 1, lock_for=60)
            except DatabaseError as error:
                outcome["first"] = error
            # ... and the same thread's next calls get a fresh connection.
            outcome["second"] = [t.rank for t in Ticket.objects.claim("again", 2, lock_for=60)]
            outcome["third"] = [t.rank for t in Ticket.objects.claim("again", 3, lock_for=60)]
        except BaseException as error:
            outcome["error"] = error
        finally:
            session_known.set()
            connection.close()

    thread = threading.Thread(target=caller)
    thread.start()
    assert session_known.wait(30)
    with connection.cursor() as cursor:
        if vendor == "mysql":
            cursor.execute(f"KILL {outcome['session']}")
        else:
            cursor.execute("SELECT pg_terminate_backend(%s)", [outcome["session"]])
    killed.set()
    thread.join(60)
    assert "error" not in outcome, outcome["error"]
    assert isinstance(outcome["first"], DatabaseError)
    assert outcome["second"] == [0, 1]
    assert outcome["third"] == [0, 1, 2]  # its own two renewed, one more


def _claim_and_park(parked: Any, sessions: Any, go: Any) -> None:
    from django.db import connection

    from tests.testapp.models import Ticket

    connection.ensure_connection()
    if connection.vendor == "sqlite":
        # A connection-local trigger that parks this process half-way through the UPDATE.
        def pause() -> int:
            parked.set()
            time.sleep(120)
            return 0

        connection.connection.create_function("taskloop_reliab_pause", 0, pause)
        with connection.cursor() as cursor:
            cursor.execute(
                f'CREATE TEMP TRIGGER taskloop_reliab_pause BEFORE UPDATE ON "{TABLE}" '
                "WHEN NEW.rank = 1 BEGIN SELECT taskloop_reliab_pause(); END"
            )
    else:
        sessions.put(_session_id())  # the server-side trigger parks us; the parent watches
        assert go.wait(30)  # until the parent holds the pause lock
    Ticket.objects.claim("victim", 3, lock_for=600)


def _hold_pause_lock(vendor: str, hold: bool) -> None:
    """Take (or let go of) the lock the trigger waits for; taking it must succeed, or the claim
    would not pause (wait for a killed client's session that the server let take it)."""
    with connection.cursor() as cursor:
        if vendor == "mysql":
            if hold:
                cursor.execute("SELECT GET_LOCK(%s, 60)", [LOCK_NAME])
                assert cursor.fetchone()[0] == 1, "another session kept the pause lock for 60 s"
            else:
                cursor.execute("SELECT RELEASE_LOCK(%s)", [LOCK_NAME])
        else:
            cursor.execute(
                "SELECT pg_advisory_lock(%s)" if hold else "SELECT pg_advisory_unlock(%s)", [LOCK_KEY]
            )


def _session_alive(session: int) -> bool:
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute("SELECT COUNT(*) FROM information_schema.processlist WHERE id = %s", [session])
        else:
            cursor.execute("SELECT COUNT(*) FROM pg_stat_activity WHERE pid = %s", [session])
        return bool(cursor.fetchone()[0])


def test_process_killed_mid_claim_leaves_no_lease(paused_table, vendor):
    ctx = multiprocessing.get_context("fork")
    parked, go, sessions = ctx.Event(), ctx.Event(), ctx.Queue()
    connections.close_all()  # the child must not share our socket
    process = ctx.Process(target=_claim_and_park, args=(parked, sessions, go))
    process.start()
    try:
        if vendor == "sqlite":
            assert parked.wait(30)
            time.sleep(0.2)  # inside the trigger, with the lease on rank 0 already written
        else:
            session = sessions.get(timeout=30)
            _hold_pause_lock(vendor, True)
            go.set()
            _wait_until_paused(session)
        os.kill(process.pid, signal.SIGKILL)
        process.join(30)
        assert process.exitcode == -signal.SIGKILL
    finally:
        if process.is_alive():
            process.kill()
    if vendor != "sqlite":
        # The server learns of the dead client when it next talks to it: let the paused
        # statement finish, then the session must end with its transaction rolled back.
        _hold_pause_lock(vendor, False)
        deadline = time.monotonic() + 30
        while _session_alive(session):
            assert time.monotonic() < deadline, "the killed client's session never went away"
            time.sleep(0.05)
    _assert_untouched_and_claimable()
