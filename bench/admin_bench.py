"""Time every admin page of django-taskloop with 1,000,000 rows in a loop and in a tube.

    DATABASE_URL=postgres:///test python bench/admin_bench.py
    DATABASE_URL=mysql://root@127.0.0.1:3306/test python bench/admin_bench.py

It builds (once: ``--rebuild`` to start again) a database ``taskloop_admin_bench`` with the
test project's tables, fills ``testapp.IntLoop`` and one fifottl tube with ``--rows`` rows each
in a realistic mix of states, refreshes the table statistics, then renders each page with
Django's test client as a superuser and prints the median and worst of ``--runs`` renders
(after one warm-up) and the number of queries. Pages slower than ``--budget`` ms are flagged.
Not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "testproject")]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
os.environ.setdefault("TASKLOOP_TEST_SUFFIX", "admin_bench")

import django  # noqa: E402

DB_NAME = "taskloop_admin_bench"


def setup_database(rebuild: bool) -> None:
    """Create the bench database with every table (no migrations: the models as they are)."""
    from django.conf import settings
    from django.db import connection

    settings.MIGRATION_MODULES = {app.split(".")[-1]: None for app in settings.INSTALLED_APPS}
    settings.MIGRATION_MODULES.update({"auth": None, "contenttypes": None, "admin": None, "sessions": None})
    settings.DEBUG = False
    if connection.vendor == "sqlite":
        raise SystemExit(
            "Set DATABASE_URL to a MariaDB/MySQL or PostgreSQL database: SQLite is not benchmarked."
        )
    connection.settings_dict["TEST"]["NAME"] = DB_NAME
    connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=not rebuild, serialize=False)


def fill(rows: int) -> None:
    """Fill the loop and the tube with ``rows`` rows each, unless they already hold them."""
    from django.contrib.auth.models import User
    from django.db import connection

    from django_taskloop.models import JobBoard, Tube
    from tests.testapp.models import IntLoop

    if not User.objects.filter(username="bench").exists():
        User.objects.create_superuser("bench", "bench@example.com", "bench")
    tube = Tube.objects.filter(name="bench").first() or Tube.objects.create_tube("bench", "fifottl", ttr=600)
    Tube.objects.create_tube("small", "fifo", if_not_exists=True)
    board = JobBoard.objects.create_board("bench", if_not_exists=True)
    if not board.job_count:
        for n in range(200):
            board.post(f"job-{n}", {"n": n}, priority=["HIGH", "NORMAL", "LOW"][n % 3])
    loop_table = IntLoop._meta.db_table
    task_table = tube.tasks.model._meta.db_table
    have_loop = IntLoop.objects.count()
    have_tasks = tube.tasks.count()
    vendor = connection.vendor
    if vendor == "postgresql":
        series = "generate_series(1, %(rows)s) AS s(g)"
        ago = "NOW() - make_interval(secs => (g %% 86400))"
        ahead = "NOW() + make_interval(secs => (g %% 3600) + 60)"
        past = "NOW() - make_interval(secs => (g %% 600) + 1)"
        data = "json_build_object('n', g)::jsonb"
    else:
        series = f"seq_1_to_{int(rows)} AS s"
        ago = "UTC_TIMESTAMP(6) - INTERVAL (seq %% 86400) SECOND"
        ahead = "UTC_TIMESTAMP(6) + INTERVAL ((seq %% 3600) + 60) SECOND"
        past = "UTC_TIMESTAMP(6) - INTERVAL ((seq %% 600) + 1) SECOND"
        data = "JSON_OBJECT('n', seq)"
    g = "g" if vendor == "postgresql" else "seq"
    started = time.perf_counter()
    with connection.cursor() as cursor:
        if have_loop < rows:
            cursor.execute(f"DELETE FROM {loop_table}")
            # 90 % idle, 5 % new, 3 % locked, 2 % bumped (by id modulo 100).
            cursor.execute(
                f"INSERT INTO {loop_table} (id, last_updated, lock_until) SELECT {g}, "
                f"CASE WHEN {g} %% 100 < 95 THEN {ago} ELSE NULL END, "
                f"CASE WHEN {g} %% 100 >= 98 THEN {past} WHEN {g} %% 100 >= 95 AND {g} %% 100 < 98 "
                f"THEN {ahead} ELSE NULL END FROM {series}",
                {"rows": rows},
            )
        if have_tasks < rows:
            cursor.execute(f"DELETE FROM {task_table}")
            # 90 % ready, 5 % taken, 3 % delayed, 2 % buried; priorities 0-9; a ttl on a third.
            cursor.execute(
                f"INSERT INTO {task_table} (tube_id, state, pri, owner, ttl_at, event_at, ttr, created, data, attempts) "
                f"SELECT %(tube)s, CASE WHEN {g} %% 100 < 90 THEN 'r' WHEN {g} %% 100 < 95 THEN 't' "
                f"WHEN {g} %% 100 < 98 THEN '~' ELSE '!' END, {g} %% 10, "
                f"CASE WHEN {g} %% 100 >= 90 AND {g} %% 100 < 95 THEN CONCAT('worker-', {g} %% 8) ELSE NULL END, "
                f"CASE WHEN {g} %% 3 = 0 THEN {ahead} + INTERVAL '1 day' ELSE NULL END, "
                f"CASE WHEN {g} %% 100 >= 90 AND {g} %% 100 < 98 THEN {ahead} ELSE NULL END, "
                f"600, {ago}, {data}, {g} %% 4 FROM {series}".replace(
                    "INTERVAL '1 day'", "INTERVAL '1 day'" if vendor == "postgresql" else "INTERVAL 1 DAY"
                ),
                {"rows": rows, "tube": tube.pk},
            )
        if have_loop < rows or have_tasks < rows:
            print(f"filled {rows:,} loop rows and {rows:,} tasks in {time.perf_counter() - started:.0f} s")
        # What workers leave for the operator: 50,000 failures, two days of throughput, a few
        # live worker processes.
        from django_taskloop.models import Failure, Throughput, WorkerProcess

        if Failure.objects.count() < 50_000:
            import datetime as dt

            from django_taskloop.engine import db_now

            now = db_now()
            Failure.objects.bulk_create(
                [
                    Failure(
                        kind="task",
                        queue="bench",
                        item=str(n),
                        attempt=n % 5 + 1,
                        worker=f"host-{n % 4}:{1000 + n % 8}:worker",
                        error=["builtins.ConnectionError", "builtins.TimeoutError", "builtins.KeyError"][
                            n % 3
                        ],
                        message=f"failure {n}",
                        traceback="Traceback (most recent call last):\n  ...\nConnectionError: failure",
                        at=now - dt.timedelta(seconds=n % 86400),
                    )
                    for n in range(50_000)
                ],
                batch_size=2000,
            )
            Throughput.objects.bulk_create(
                [
                    Throughput(
                        kind="task",
                        queue="bench",
                        minute=(now - dt.timedelta(minutes=m)).replace(second=0, microsecond=0),
                        done=900,
                        failed=m % 7,
                    )
                    for m in range(2880)
                ],
                batch_size=2000,
                ignore_conflicts=True,
            )
            for n in range(8):
                WorkerProcess.objects.beat(
                    f"host-{n % 4}:{1000 + n}:worker",
                    host=f"host-{n % 4}",
                    pid=1000 + n,
                    queues=["task:bench", "loop:testapp.intloop"],
                    holding={"task:bench": n * 10},
                )
        for table in (loop_table, task_table):
            cursor.execute(f"ANALYZE {table}" if vendor == "postgresql" else f"ANALYZE TABLE {table}")
            if vendor != "postgresql":
                cursor.fetchall()


def pages() -> list[tuple[str, str]]:
    from django.urls import reverse

    from django_taskloop.models import JobBoard, Tube

    tube = Tube.objects.get(name="bench")
    board = JobBoard.objects.get(name="bench")
    first_task = tube.tasks.order_by("id").values_list("id", flat=True).first()
    loop = reverse("admin:testapp_intloop_changelist")
    tasks = reverse("admin:django_taskloop_task_changelist")
    t = f"tube__id__exact={tube.pk}"
    day = "2000-01-01"
    return [
        ("dashboard", reverse("admin:django_taskloop_dashboard")),
        ("loop: list", loop),
        ("loop: list page 200", f"{loop}?p=200"),
        ("loop: state=new", f"{loop}?state=new"),
        ("loop: state=idle", f"{loop}?state=idle"),
        ("loop: state=locked", f"{loop}?state=locked"),
        ("loop: state=bumped", f"{loop}?state=bumped"),
        (
            "loop: lock_until range",
            f"{loop}?lock_until__range__gte_0={day}&lock_until__range__gte_1=00:00:00",
        ),
        (
            "loop: last_updated range",
            f"{loop}?last_updated__range__gte_0={day}&last_updated__range__gte_1=00:00:00",
        ),
        (
            "loop: last_updated before 2000",
            f"{loop}?last_updated__range__lte_0={day}&last_updated__range__lte_1=00:00:00",
        ),
        ("loop: sort by lock_until", f"{loop}?o=5"),
        ("loop: search id", f"{loop}?q=654321"),
        ("loop: stats", reverse("admin:testapp_intloop_stats")),
        ("tasks: list", tasks),
        ("tasks: tube", f"{tasks}?{t}"),
        ("tasks: tube + ready", f"{tasks}?{t}&state=ready"),
        ("tasks: tube + taken", f"{tasks}?{t}&state=taken"),
        ("tasks: tube + delayed", f"{tasks}?{t}&state=delayed"),
        ("tasks: tube + buried", f"{tasks}?{t}&state=buried"),
        ("tasks: state=buried", f"{tasks}?state=buried"),
        ("tasks: pri 3..4", f"{tasks}?pri__range__gte=3&pri__range__lte=4"),
        ("tasks: created range", f"{tasks}?created__range__gte_0={day}&created__range__gte_1=00:00:00"),
        ("tasks: created before 2000", f"{tasks}?created__range__lte_0={day}&created__range__lte_1=00:00:00"),
        ("tasks: tube + pri 100..200", f"{tasks}?{t}&pri__range__gte=100&pri__range__lte=200"),
        ("tasks: event_at range", f"{tasks}?event_at__range__gte_0={day}&event_at__range__gte_1=00:00:00"),
        (
            "tasks: tube + event_at range",
            f"{tasks}?{t}&event_at__range__gte_0={day}&event_at__range__gte_1=00:00:00",
        ),
        (
            "tasks: tube + ttl_at range",
            f"{tasks}?{t}&ttl_at__range__gte_0={day}&ttl_at__range__gte_1=00:00:00",
        ),
        ("tasks: ttl_at range", f"{tasks}?ttl_at__range__gte_0={day}&ttl_at__range__gte_1=00:00:00"),
        ("tasks: search id", f"{tasks}?q=765432"),
        ("tasks: sort by id asc", f"{tasks}?o=1"),
        ("tube: list", reverse("admin:django_taskloop_tube_changelist")),
        ("tube: stats", reverse("admin:django_taskloop_tube_stats", args=[tube.pk])),
        ("jobs: list", reverse("admin:django_taskloop_job_changelist")),
        ("board: stats", reverse("admin:django_taskloop_jobboard_stats", args=[board.pk])),
        ("failures: list", reverse("admin:django_taskloop_failure_changelist")),
        ("failures: queue", reverse("admin:django_taskloop_failure_changelist") + "?queue=task:bench"),
        (
            "failures: error",
            reverse("admin:django_taskloop_failure_changelist") + "?error=builtins.KeyError",
        ),
        ("task: page with failures", reverse("admin:django_taskloop_task_change", args=[first_task])),
        ("workers", reverse("admin:django_taskloop_workerprocess_changelist")),
        ("metrics", "/taskloop/metrics"),
    ]


def measure(runs: int, budget: float) -> int:
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client()
    client.force_login(User.objects.get(username="bench"))
    slow = 0
    print(
        f"\n{connection.vendor} {connection.pg_version if connection.vendor == 'postgresql' else connection.mysql_version}"
    )
    # The machine's load changes these numbers more than anything else: say what it was.
    print("load average (1, 5, 15 min): " + ", ".join(f"{value:.1f}" for value in os.getloadavg()))
    print(f"{'page':34} {'median ms':>10} {'worst ms':>10} {'queries':>8}")
    for name, url in pages():
        response = client.get(url)  # warm-up (and a check that the page works)
        if response.status_code != 200:
            raise SystemExit(f"{name}: {url} answered {response.status_code}")
        times = []
        for _ in range(runs):
            with CaptureQueriesContext(connection) as queries:
                started = time.perf_counter()
                client.get(url)
                times.append((time.perf_counter() - started) * 1000)
        median = statistics.median(times)
        flag = "  <-- over budget" if median > budget else ""
        slow += bool(flag)
        print(f"{name:34} {median:10.1f} {max(times):10.1f} {len(queries):8d}{flag}")
    return slow


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--budget", type=float, default=500.0, help="milliseconds")
    parser.add_argument("--rebuild", action="store_true", help="drop and refill the bench database")
    options = parser.parse_args()
    django.setup()
    setup_database(options.rebuild)
    fill(options.rows)
    slow = measure(options.runs, options.budget)
    print("load average (1, 5, 15 min): " + ", ".join(f"{value:.1f}" for value in os.getloadavg()))
    print(
        f"\n{slow} page(s) over {options.budget:.0f} ms"
        if slow
        else f"\nevery page under {options.budget:.0f} ms"
    )


if __name__ == "__main__":
    main()
