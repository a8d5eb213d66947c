"""Where a tube batch's time goes, statement by statement, and what a leaner shape would give.

    DATABASE_URL=mysql://root@127.0.0.1:3306/bench_taskloop python bench/profile_tube.py [--processes 4]

1. ``take_many(100)`` + ``ack_many`` (what ``manage.py workers`` does per batch): the
   statements of one batch, with their share of the database time, and the client CPU per job.
2. The same work in the shape the report suggests, written with the ORM on the same table:
   acknowledge the previous batch and claim the next one in **one** transaction (one commit
   per batch instead of two), claim with one ``FOR UPDATE SKIP LOCKED`` read that fetches the
   columns the handler needs (no candidate read, no savepoint, no second ``SELECT``), and one
   counter ``UPDATE`` per batch. Throughput of both with ``--processes`` processes.

It uses the benchmark project (``bench/project``) and its ``bench`` tube.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import sys
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE / "project"), str(HERE.parent), str(HERE)]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")
os.environ.setdefault("BENCH_RECORD_DIR", "/tmp")

import django  # noqa: E402

django.setup()

import scenarios  # noqa: E402
from django.db import connection, connections  # noqa: E402
from django.db.models import F  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402

from django_taskloop import engine  # noqa: E402
from django_taskloop.models import Task  # noqa: E402
from django_taskloop.models.tubes import TubeStat, _slot  # noqa: E402


def statements(batches: int = 30) -> None:
    tube = scenarios.empty_tube()
    scenarios.fill(tube, range((batches + 5) * 100))
    for _ in range(3):  # warm up: the consumer row, the counter slot
        tasks = tube.take_many(100, consumer="profile")
        tube.ack_many([t.pk for t in tasks], consumer="profile")
    times: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    cpu0, wall0 = os.times(), time.perf_counter()
    with CaptureQueriesContext(connection) as captured:
        for _ in range(batches):
            tasks = tube.take_many(100, consumer="profile")
            tube.ack_many([t.pk for t in tasks], consumer="profile")
    wall, cpu1 = time.perf_counter() - wall0, os.times()
    for q in captured.captured_queries:
        # Savepoint names differ per call: group them under one name.
        key = " ".join(re.sub(r"[`\"]s\d+_x\d+[`\"]", "<savepoint>", q["sql"]).split()[:4])[:70]
        times[key] += float(q["time"])
        counts[key] += 1
    db = sum(times.values())
    jobs = batches * 100
    print(
        f"{connection.vendor}: take_many(100) + ack_many, one process: {jobs / wall:,.0f} jobs/s; "
        f"{len(captured.captured_queries) / batches:.1f} statements and {wall / batches * 1000:.1f} ms per batch "
        f"({db / batches * 1000:.1f} ms waiting for the database); client CPU "
        f"{((cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)) / jobs * 1e6:.0f} µs per job"
    )
    for key, spent in sorted(times.items(), key=lambda kv: -kv[1]):
        print(f"  {spent / batches * 1000:6.2f} ms  ×{counts[key] / batches:3.1f}  {key}")
    tube.truncate()


def _lean_worker(tube_id: int, consumer: str, queue) -> None:
    """Ack the previous batch and claim the next in one transaction; one counter write."""
    connections.close_all()
    using = Task.objects.db
    rows = Task.objects.filter(tube_id=tube_id)
    of = ("self",) if engine.features(using).for_update_of else ()
    done = 0
    previous: list[int] = []
    while True:
        with engine.write_transaction(Task, using):
            if previous:
                rows.filter(pk__in=previous, owner=consumer)._raw_delete(using)
                TubeStat.objects.filter(tube_id=tube_id, slot=_slot()).update(
                    ack=F("ack") + len(previous),
                    done=F("done") + len(previous),
                    take=F("take") + len(previous),
                )
            claimed = list(
                rows.filter(state="r")
                .order_by("pri", "id")
                .select_for_update(skip_locked=True, of=of)
                .values_list("id", "data")[:100]
            )
            if claimed:
                rows.filter(pk__in=[pk for pk, _ in claimed]).update(state="t", owner=consumer)
        previous = [pk for pk, _ in claimed]
        if not claimed:
            break
        done += len(claimed)
    connections.close_all()
    queue.put(done)


def _current_worker(tube_id: int, consumer: str, queue) -> None:
    connections.close_all()
    tube = scenarios.bench_tube()
    done = 0
    while True:
        tasks = tube.take_many(100, consumer=consumer)
        if not tasks:
            break
        tube.ack_many([t.pk for t in tasks], consumer=consumer)
        done += len(tasks)
    connections.close_all()
    queue.put(done)


def throughput(target, processes: int, jobs: int) -> float:
    tube = scenarios.empty_tube()
    scenarios.fill(tube, range(jobs))
    connections.close_all()
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=target, args=(tube.pk, f"profile-{i}", queue)) for i in range(processes)]
    started = time.perf_counter()
    for p in procs:
        p.start()
    total = sum(queue.get() for _ in procs)
    elapsed = time.perf_counter() - started
    for p in procs:
        p.join()
    assert total == jobs, f"{total} of {jobs} claimed"
    return jobs / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=10000)
    args = parser.parse_args()
    statements()
    for n in sorted({1, args.processes}):
        now = throughput(_current_worker, n, args.jobs)
        lean = throughput(_lean_worker, n, args.jobs)
        print(
            f"{n} process(es): take_many + ack_many {now:,.0f} jobs/s; one transaction per batch {lean:,.0f} jobs/s"
        )


if __name__ == "__main__":
    main()
