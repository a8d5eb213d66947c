"""Benchmark task loops: claim(100)+did throughput, and claim latency against loop size.

Run from the repository root (it makes and drops its own test database)::

    DATABASE_URL=mysql://root@127.0.0.1:3306/test /root/venv311/bin/python bench/loops_bench.py
    DATABASE_URL=mysql://... python bench/loops_bench.py --throughput 100000 --processes 1 4
    DATABASE_URL=mysql://... python bench/loops_bench.py --latency 10000 1000000

Throughput: ``--processes`` workers drain a loop of ``--throughput`` never-done ids with
``claim(100)`` then ``did(ids)``; ids/s is ids done per wall-clock second.
Latency: for each loop size, the time of one ``claim(100)`` when the ids due are
never-done ids, idle ids past ``min_loop_time`` (the steady state), and when nothing is due.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "testproject")]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
os.environ.setdefault("TASKLOOP_TEST_SUFFIX", "bench_loops")


class _NoMigrations(dict):
    """Create every table from the models, as ``pytest --no-migrations`` does."""

    def __contains__(self, item: object) -> bool:
        return True

    def __getitem__(self, item: str) -> None:
        return None


def setup() -> None:
    import django
    from django.conf import settings

    settings.MIGRATION_MODULES = _NoMigrations()
    django.setup()


def loop_model():
    from tests.testapp.models import IntLoop

    return IntLoop


def fill(n: int, state: str) -> None:
    """Empty the loop and put ``n`` ids in it, in ``state``: new, due or idle.

    Inserts only, into a truncated table: a mass UPDATE or DELETE would leave InnoDB a
    backlog of delete-marked index entries to purge, and claims would pay for skipping them.
    """
    from django.db import connection

    model = loop_model()
    table = connection.ops.quote_name(model._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {table}" if connection.vendor == "sqlite" else f"TRUNCATE TABLE {table}")
    if state == "new":
        model.objects.add(range(n))
    else:
        # Last updates spread over the past two hours: with min_loop_time=3600 about half of
        # the loop is due ("due"); or over the past 50 minutes, so that none is ("idle").
        span = 7200 if state == "due" else 3000
        ago = {
            "mysql": "UTC_TIMESTAMP(6) - INTERVAL %s SECOND",
            "postgresql": "STATEMENT_TIMESTAMP() - make_interval(secs => %s)",
            "sqlite": "STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'now', '-' || %s || ' seconds')",
        }[connection.vendor]
        step = 5000
        with connection.cursor() as cursor:
            for start in range(0, n, step):
                ids = range(start, min(n, start + step))
                values = ", ".join(f"(%s, {ago})" for _ in ids)
                params = [p for i in ids for p in (i, (i * 7919) % span)]
                cursor.execute(f"INSERT INTO {table} (id, last_updated) VALUES {values}", params)
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute(f"ANALYZE TABLE {table}")
            cursor.fetchall()
        else:
            cursor.execute(f"ANALYZE {table}")


def _drain(barrier, queue) -> None:
    from django.db import connections

    model = loop_model()
    done = 0
    barrier.wait()
    while True:
        ids = model.objects.claim(100, lock_for=600)
        if not ids:
            break
        done += model.objects.did(ids)
    connections.close_all()
    queue.put(done)


def throughput(n: int, processes: int) -> float:
    from django.db import connections

    fill(n, "new")
    connections.close_all()
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(processes + 1)
    queue = ctx.Queue()
    workers = [ctx.Process(target=_drain, args=(barrier, queue)) for _ in range(processes)]
    for worker in workers:
        worker.start()
    barrier.wait()
    start = time.perf_counter()
    done = sum(queue.get() for _ in workers)
    elapsed = time.perf_counter() - start
    for worker in workers:
        worker.join()
    assert done >= n, (done, n)
    assert not loop_model().objects.filter(last_updated__isnull=True).exists()
    return n / elapsed


def latency(n: int, state: str, rounds: int = 40) -> tuple[float, float]:
    """Return the median and 90th percentile milliseconds of claim(100) on ``n`` ids."""
    model = loop_model()
    fill(n, state)
    model.objects.claim(100)  # warm up the connection and the caches
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        got = model.objects.claim(100)
        times.append((time.perf_counter() - start) * 1000)
        assert len(got) == (0 if state == "idle" else 100), (state, len(got))
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.9) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--throughput", type=int, default=100_000, help="ids in the throughput loop (0: skip)"
    )
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--latency", type=int, nargs="*", default=[10_000, 1_000_000], help="loop sizes")
    args = parser.parse_args()
    setup()
    from django.db import connection

    creation = connection.creation
    name = creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
    try:
        print(f"database: {connection.vendor} {connection.Database.__name__} ({name})")
        if args.throughput:
            for processes in args.processes:
                rate = throughput(args.throughput, processes)
                print(f"claim(100)+did, {args.throughput} ids, {processes} process(es): {rate:,.0f} ids/s")
        for n in args.latency:
            for state in ("new", "due", "idle"):
                median, p90 = latency(n, state)
                print(
                    f"claim(100) latency, {n:>9,} ids, {state:>4}: median {median:6.2f} ms, p90 {p90:6.2f} ms"
                )
    finally:
        connection.close()
        creation.destroy_test_db(name, verbosity=0)


if __name__ == "__main__":
    main()
