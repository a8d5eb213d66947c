"""What holds back cleanup of the queue tables: a transaction held open in another connection
shows in ``database_cleanup()``, the metrics and a worker's log, and goes when it ends; dead
rows show on PostgreSQL and ``reap_locks --vacuum`` clears them (issue 30)."""

from __future__ import annotations

import io
import json
import subprocess
import threading
import time
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.urls import reverse

from django_taskloop.health import CleanupWatch, database_cleanup, queue_tables
from django_taskloop.metrics import render_metrics
from django_taskloop.models import Tube

from .held_util import held_transaction
from .workers_util import ROOT, child_env, wait_until, workers_command

pytestmark = pytest.mark.django_db(transaction=True)

# SQLite keeps no old row versions (see the SQLite test).
servers_only = pytest.mark.vendors("mysql", "postgresql")
# The server's oldest transaction must be the test's own: no other test may hold one meanwhile.
alone = pytest.mark.alone


def gauge(text: str, name: str, **labels: str) -> float | None:
    inner = ",".join(f'{key}="{value}"' for key, value in labels.items())
    for line in text.splitlines():
        if line.startswith(f"{name}{{{inner}}} "):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_sqlite_has_nothing_to_clean_up():
    if connection.vendor != "sqlite":
        assert "default" in database_cleanup()
        return
    assert database_cleanup() == {}
    assert "taskloop_db_" not in render_metrics()
    assert CleanupWatch().look() == []


def test_queue_tables_name_ours_by_database():
    tables = queue_tables()
    assert "taskloop_task" in tables["default"]
    assert "taskloop_job" in tables["default"]


def _oldest_is(pid: int) -> Any:
    """The database's look, once the oldest other transaction it sees is ``pid``'s.

    MariaDB's look is the server's (InnoDB's purge is): a transaction another run holds on
    the same server (CI runs two test streams at once) may be older than ours a while."""
    read = database_cleanup()["default"]
    return read if read.holder is not None and read.holder.pid == pid else None


@servers_only
@alone
def test_a_held_transaction_shows_and_goes():
    with held_transaction() as pid:
        time.sleep(1.1)
        read = wait_until(lambda: _oldest_is(pid))
        assert read.holder.seconds >= 1.0
        assert read.holder.state == "idle in transaction"
        assert f"pid {pid}" in read.holder.describe()
        age = gauge(render_metrics(), "taskloop_db_oldest_transaction_seconds", database="default")
        assert age is not None and age >= 1.0
    # Ended: nothing of it is left (MariaDB's INNODB_TRX is a copy up to 0.1 s old).
    wait_until(lambda: _gone(pid))
    wait_until(lambda: _gauge_not_ours(pid))


def _gauge_not_ours(pid: int) -> bool:
    """The oldest-transaction gauge no longer counts ``pid``'s: it is under a second, or the
    look names another transaction (another run's on the same MariaDB server)."""
    age = gauge(render_metrics(), "taskloop_db_oldest_transaction_seconds", database="default")
    holder = database_cleanup()["default"].holder
    return age is not None and (age < 1.0 or (holder is not None and holder.pid != pid))


def _gone(pid: int) -> bool:
    holder = database_cleanup()["default"].holder
    return holder is None or holder.pid != pid


@servers_only
@alone
def test_the_dashboard_shows_the_held_transaction_and_then_not(admin_client, settings):
    settings.TASKLOOP = {**settings.TASKLOOP, "HORIZON_WARNING": 1}
    url = reverse("admin:django_taskloop_dashboard")
    with held_transaction() as pid:
        time.sleep(1.1)
        wait_until(lambda: _oldest_is(pid))
        page = admin_client.get(url).content.decode()
        assert "Database cleanup" in page and f"pid {pid}" in page, page
        assert "holds back cleanup" in page and "reap_locks --vacuum" in page
        assert ("dead row versions" if connection.vendor == "postgresql" else "purge backlog") in page
    wait_until(lambda: _gone(pid))
    page = admin_client.get(url).content.decode()
    assert "Database cleanup" in page and f"pid {pid}" not in page
    if database_cleanup()["default"].holder is None:  # (another run's, on a shared MariaDB)
        assert "holds back cleanup" not in page


def test_the_dashboard_has_no_cleanup_section_on_sqlite(admin_client):
    page = admin_client.get(reverse("admin:django_taskloop_dashboard")).content.decode()
    assert ("Database cleanup" in page) == (connection.vendor != "sqlite")


@servers_only
@alone
def test_the_watch_warns_once_then_says_it_ended(settings):
    settings.TASKLOOP = {**settings.TASKLOOP, "HORIZON_WARNING": 1}
    # MariaDB's look is the server's: first wait out a transaction the other CI stream holds
    # (seen in CI: its test's idle transaction, a second old, warned before ours began).
    assert wait_until(lambda: CleanupWatch().look() == [])
    watch = CleanupWatch()
    with held_transaction() as pid:
        time.sleep(1.1)
        wait_until(lambda: _oldest_is(pid))
        (line,) = watch.look()
        assert line[0] == "warning"
        assert f"pid {pid}" in line[1] and "holds back cleanup" in line[1] and "'default'" in line[1]
        assert watch.look() == []  # not again at once: every few minutes while it lasts
    (line,) = wait_until(watch.look)
    assert line == ("info", line[1]) and "has ended" in line[1]
    assert watch.look() == []


@servers_only
def test_the_watch_is_off_at_zero(settings):
    settings.TASKLOOP = {**settings.TASKLOOP, "HORIZON_WARNING": 0}
    with held_transaction():
        time.sleep(0.2)
        assert CleanupWatch().look() == []


@pytest.mark.vendors("postgresql")  # dead row versions: PostgreSQL's count
def test_dead_rows_show_and_vacuum_clears_them():
    tube = Tube.objects.create_tube("cleanup-dead", "fifo")
    with held_transaction():
        tube.put_many(list(range(200)))
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM taskloop_task WHERE tube_id = %s", [tube.pk])
            cursor.execute("SELECT pg_stat_force_next_flush()")
        connection.close()  # the statistics are sent as the session ends
        assert wait_until(lambda: dead() >= 200)
        text = render_metrics()
        assert gauge(text, "taskloop_db_dead_rows", database="default", table="taskloop_task") >= 200
        # VACUUM cannot remove what the held transaction may still see.
    out = io.StringIO()
    call_command("reap_locks", "--vacuum", stdout=out)
    assert "database default: VACUUM (ANALYZE) on" in out.getvalue()
    assert wait_until(lambda: dead() < 200)


def test_vacuum_says_what_it_did_on_each_database():
    out = io.StringIO()
    call_command("reap_locks", "--vacuum", "--reindex", stdout=out)
    said = {"postgresql": "VACUUM (ANALYZE) and REINDEX TABLE CONCURRENTLY on", "mysql": "OPTIMIZE TABLE on"}
    expected = said.get(connection.vendor, "nothing to do (SQLite keeps no old row versions)")
    assert out.getvalue().startswith(f"database default: {expected}")


def test_reindex_needs_vacuum_and_vacuum_runs_once():
    with pytest.raises(CommandError, match="--reindex goes with --vacuum"):
        call_command("reap_locks", "--reindex")
    with pytest.raises(CommandError, match="runs once"):
        call_command("reap_locks", "--vacuum", "--every", "5")


def dead() -> int:
    """Dead row versions of the task table, as the statistics say now."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
    return database_cleanup()["default"].dead_rows.get("taskloop_task", 0)


@servers_only
@alone
def test_a_worker_logs_the_held_transaction_and_its_end():
    worker = subprocess.Popen(
        workers_command("--only", "w-noop", "--processes", "1"),
        env=child_env(
            DJANGO_SETTINGS_MODULE="tests.workers_settings",
            TASKLOOP_OVERRIDES=json.dumps({"HORIZON_WARNING": 1}),
        ),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(worker.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        with held_transaction() as pid:
            warning = wait_until(lambda: [line for line in lines if "holds back cleanup" in line], timeout=60)
            assert f"pid {pid}" in warning[0] and "WARNING" in warning[0].upper()
        wait_until(
            lambda: [line for line in lines if "held back cleanup" in line and "has ended" in line],
            timeout=60,
        )
    finally:
        worker.terminate()
        worker.wait(timeout=60)
        reader.join(timeout=10)
    assert sum("holds back cleanup" in line for line in lines) == 1, lines
