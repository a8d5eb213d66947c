"""What an idle ``manage.py workers`` costs the database (issue: an idle worker must cost almost
nothing), and that it still picks up a put promptly (SPEC §6).

Real worker processes on the test database. Their statements are counted as they send them
(``tests.statement_log``: the server-wide counters of a shared MariaDB server count every other
client too); on PostgreSQL the sessions are read from ``pg_stat_activity`` of the test database.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import Counter

import pytest
from django.db import connection, connections

from django_taskloop.models import Tube
from tests.testapp.models import WorkLog

from . import statement_log
from .workers_util import start_workers, stop, wait_until

# quiet: the pickup latency it measures is the machine's as much as the worker's.
pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.quiet]

#: Seconds over which an idle worker is watched.
WINDOW = 6.0


def _sessions() -> list[tuple[int, str, str]]:
    """PostgreSQL: the other sessions on the test database (pid, backend start, query)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid, backend_start::text, query FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return [tuple(row) for row in cursor.fetchall()]


class _SiteWrites(threading.Thread):
    """The rest of the site writing to the same database meanwhile (not puts): five rows a
    second. On SQLite each commit changes the files an idle worker watches; a write that is
    not a put must cost that worker one read at most, not a fresh series of quick polls."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.done = threading.Event()
        self.rows = 0
        self.pids: set[int] = set()  # PostgreSQL: its session, not the worker's

    def run(self) -> None:
        try:
            if connection.vendor == "postgresql":
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_backend_pid()")
                    self.pids.add(cursor.fetchone()[0])
            while not self.done.wait(0.2):
                WorkLog.objects.create(kind="site", key=str(self.rows), pid=0, at=time.time())
                self.rows += 1
        finally:
            connections.close_all()

    def __enter__(self) -> _SiteWrites:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.join()


def _pickups(tube: Tube, rounds: int, gap: float) -> list[float]:
    latencies = []
    for _ in range(rounds):
        time.sleep(gap)
        put_at = time.time()
        task = tube.put({})
        logged = wait_until(
            lambda key=str(task.id): WorkLog.objects.filter(kind="drain", key=key).first(), timeout=30
        )
        latencies.append(logged.at - put_at)
    return latencies


@pytest.mark.parametrize(
    "tubes", [["w-drain"], ["w-drain", "w-noop", "w-fail"]], ids=["one tube", "three tubes"]
)
def test_an_idle_worker_costs_almost_nothing_and_still_picks_up_promptly(vendor, tmp_path, tubes):
    tube = Tube.objects.create_tube("w-drain", "fifottl")
    log = str(tmp_path / "statements")
    worker = start_workers(
        *(arg for name in tubes for arg in ("--only", name)),
        DJANGO_SETTINGS_MODULE="tests.statement_log_settings",
        **{statement_log.ENV: log},
    )
    seen: dict[int, tuple[str, str]] = {}
    try:
        warm = tube.put({})
        wait_until(lambda: WorkLog.objects.filter(kind="drain", key=str(warm.id)).exists(), timeout=60)
        time.sleep(2.0)  # idle: any backoff reaches its ceiling
        started = time.time()
        with _SiteWrites() as site:
            while time.time() < started + WINDOW:
                if vendor == "postgresql":
                    for pid, backend_start, query in _sessions():
                        seen.setdefault(pid, (backend_start, query))
                        if query.startswith("LISTEN"):
                            seen[pid] = (backend_start, query)
                time.sleep(0.1)
        ended = time.time()
        assert site.rows >= WINDOW * 3, site.rows  # the site did write meanwhile
        latencies = _pickups(tube, 10, 0.3)
    finally:
        output = stop(worker)
    assert worker.returncode == 0, output

    notes = [note for note in statement_log.read(log) if started <= note[0] < ended]
    kinds = Counter(kind for _, kind, _, _ in notes)
    transactions = (
        kinds["commit"]
        + kinds["rollback"]
        + sum(1 for _, kind, _, atomic in notes if kind == "statement" and not atomic)
    )
    seconds = ended - started
    median = statistics.median(latencies)
    print(
        f"\n[{vendor}] idle worker ({len(tubes)} tubes) over {seconds:.1f} s: {len(notes) / seconds:.1f} round trips/s "
        f"({dict(kinds)}), {transactions / seconds:.1f} transactions/s; pickup median "
        f"{median * 1000:.1f} ms, max {max(latencies) * 1000:.1f} ms"
    )
    if vendor == "postgresql":
        seen = {pid: what for pid, what in seen.items() if pid not in site.pids}
        print(f"sessions seen: {seen}")
        # One LISTEN session for the life of the worker, and no session opened meanwhile.
        listening = [pid for pid, (_, query) in seen.items() if query.startswith("LISTEN")]
        assert len(listening) == 1, seen
        assert len(seen) <= 3, seen  # the worker's main and heartbeat connections, and LISTEN
        assert transactions / seconds <= 2.0
    else:
        # What the server counts as statements (MariaDB's Questions): at most 10 a second.
        assert len(notes) / seconds <= 10.0
    # SPEC: a put in another process wakes a waiting take within 100 ms (the issue: a median
    # of 50 ms, 15 ms on PostgreSQL). PostgreSQL's NOTIFY and SQLite's file watch wake the
    # worker at once; MariaDB's worker polls (every POLL_MAX once idle). Loose bounds for a
    # loaded 2-core machine, yet below what polling alone would give where it should not poll.
    assert median < {"postgresql": 0.1, "sqlite": 0.1}.get(vendor, 0.2)
