"""The database server dies and comes back in the middle of a drain: nothing lost or acked twice.

Workers drain a tube on a throwaway server (MariaDB on MariaDB runs, PostgreSQL on the others:
SQLite has no server to restart). Mid-drain the test kills the server outright (``SIGKILL`` /
``pg_ctl -m immediate``, a crash, not a clean shutdown), keeps it down for a few seconds and
starts it again. The workers log the outage, come back (the supervisor restarts a worker whose
connection failed, with a pause between restarts), and finish: every task done, each
acknowledged exactly once; only tasks in flight at the crash may run twice.
"""

from __future__ import annotations

import time

import pytest

from .conftest import DB_NAME, django_env, run_remote
from .workers import OVERRIDES, SETTINGS, Workers, wait_until

pytestmark = pytest.mark.slow

TASKS = 3_000


def remaining(server) -> int | None:
    try:
        return server.execute("SELECT COUNT(*) FROM taskloop_task")[0][0]
    except server.driver_errors():
        return None


def test_server_crash_mid_drain_loses_nothing(throwaway, capsys):
    assert run_remote(throwaway.url(), "tests.reliability.scenarios:fill_tube", TASKS) == TASKS
    env = django_env(throwaway.url(), DJANGO_SETTINGS_MODULE=SETTINGS, TASKLOOP_OVERRIDES=OVERRIDES)
    workers = Workers.start("--only", "r-tube", "--processes", "2", env=env)
    try:
        wait_until(lambda: (remaining(throwaway) or TASKS) < TASKS * 0.8, 120, what="a fifth of the drain")
        throwaway.stop(crash=True)
        down_at = time.monotonic()
        time.sleep(3)
        throwaway.start()
        outage = time.monotonic() - down_at
        wait_until(
            lambda: remaining(throwaway) == 0, 180, every=0.5, what="the drain to finish after the restart"
        )
    finally:
        output = workers.stop()
    assert workers.process.returncode == 0, output
    # The outage is in the log: the workers saw the database unreachable and waited for it,
    # one line per try (or met another error and retried, or died and were restarted).
    said = ("is unreachable", "database error", "restarting it")
    assert any(words in output for words in said), output[-3000:]
    report = run_remote(throwaway.url(), "tests.reliability.scenarios:tube_report")
    assert report["stats"]["tasks"]["total"] == 0
    assert report["stats"]["tasks"]["done"] == TASKS
    assert report["stats"]["calls"]["ack"] == TASKS  # each acknowledged exactly once
    assert report["keys"] == TASKS  # every task ran
    # Only work in flight at the crash runs again: two workers, at most a batch of 50 each.
    assert report["runs"] - TASKS <= 2 * 50, report["runs"]
    with capsys.disabled():
        print(
            f"\n[reliability] {throwaway.vendor} crash+restart mid-drain: down {outage:.1f} s, "
            f"{report['runs'] - TASKS} re-runs, database {DB_NAME}"
        )
