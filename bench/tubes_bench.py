"""Tube throughput and wake-up latency (issue 5's numbers).

    DATABASE_URL=mysql://root@127.0.0.1:3306/test /root/venv311/bin/python bench/tubes_bench.py
    DATABASE_URL=postgres:///test /root/venv311/bin/python bench/tubes_bench.py --only latency

Uses its own database (the test database named by ``TASKLOOP_TEST_SUFFIX``, default
``tubesbench``), with the tube tables created afresh. Measures, for a fifo tube:
take+ack one at a time (1 and 4 processes), take_many/ack_many in batches of 100 (1 and 4
processes), and the time from ``put`` (returned, i.e. committed) to a ``take(timeout=5)``
waiting in another process returning the task.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "testproject")]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
os.environ.setdefault("TASKLOOP_TEST_SUFFIX", "tubesbench")

import django  # noqa: E402

django.setup()

from django.db import connection, connections  # noqa: E402

from django_taskloop.models.tubes import Consumer, Task, Tube, TubeStat, TubeWaiter  # noqa: E402

MODELS = [Tube, Task, TubeStat, Consumer, TubeWaiter]


def setup_database() -> None:
    connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=True, serialize=False)
    existing = set(connection.introspection.table_names())
    with connection.schema_editor() as editor:
        for model in reversed(MODELS):
            if model._meta.db_table in existing:
                editor.delete_model(model)
        for model in MODELS:
            editor.create_model(model)


def fill(tube: Tube, n: int) -> None:
    Task.objects.bulk_create([Task(tube=tube, data={"n": i}) for i in range(n)], batch_size=1000)


def drain(tube_id: int, batch: int) -> int:
    tube = Tube.objects.get(pk=tube_id)
    done = 0
    while True:
        if batch == 1:
            task = tube.take(0)
            if task is None:
                break
            tube.ack(task.pk)
            done += 1
        else:
            tasks = tube.take_many(batch)
            if not tasks:
                break
            done += tube.ack_many([t.pk for t in tasks])
    connections.close_all()
    return done


def throughput(n: int, processes: int, batch: int) -> float:
    Tube.objects.filter(name="bench").exists() and Tube.objects.get(name="bench").drop()
    tube = Tube.objects.create_tube("bench", "fifo")
    fill(tube, n)
    connections.close_all()
    ctx = multiprocessing.get_context("fork")
    started = time.perf_counter()
    with ctx.Pool(processes) as pool:
        done = sum(pool.starmap(drain, [(tube.pk, batch)] * processes))
    elapsed = time.perf_counter() - started
    assert done == n, (done, n)
    stats = tube.statistics()
    assert stats["calls"]["ack"] == n and stats["tasks"]["total"] == 0, stats
    tube.drop()
    return n / elapsed


def _waiting_taker(tube_id: int, rounds: int, queue: multiprocessing.Queue) -> None:
    tube = Tube.objects.get(pk=tube_id)
    for _ in range(rounds):
        task = tube.take(timeout=5, consumer="waiter")
        queue.put(time.time())
        if task is not None:
            tube.ack(task.pk, consumer="waiter")
    connections.close_all()


def latency(rounds: int) -> list[float]:
    Tube.objects.filter(name="wake").exists() and Tube.objects.get(name="wake").drop()
    tube = Tube.objects.create_tube("wake", "fifo")
    connections.close_all()
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_waiting_taker, args=(tube.pk, rounds, queue))
    child.start()
    out = []
    for i in range(rounds):
        time.sleep(0.4)  # let the taker settle into its wait (and its poll backoff)
        tube.put(i)
        put_at = time.time()
        out.append(queue.get(timeout=10) - put_at)
    child.join()
    tube.drop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--only", choices=["throughput", "latency"])
    args = parser.parse_args()
    setup_database()
    vendor = connection.vendor
    print(f"database: {vendor} {connection.settings_dict['NAME']}")
    if args.only in (None, "throughput"):
        for processes, batch in ((1, 1), (4, 1), (1, 100), (4, 100)):
            rate = throughput(args.tasks, processes, batch)
            print(f"take+ack  processes={processes} batch={batch:<3}  {rate:8.0f} tasks/s")
    if args.only in (None, "latency"):
        values = latency(args.rounds)
        print(
            f"put -> waiting take(timeout=5): median {statistics.median(values) * 1000:.1f} ms, "
            f"p90 {sorted(values)[int(len(values) * 0.9) - 1] * 1000:.1f} ms, max {max(values) * 1000:.1f} ms"
        )


if __name__ == "__main__":
    main()
