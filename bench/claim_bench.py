"""Claim throughput of the engine through ``Lockable.claim`` (rows/s), 1 and 4 processes.

    DATABASE_URL=mysql://root@127.0.0.1:3306/test python bench/claim_bench.py [--rows 20000] [--batch 100]

Creates its own table (``testapp_ticket``) in the named database, fills it, and lets N
processes claim batches and mark them done until none is left. Checks every row was claimed once.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "testproject")]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django  # noqa: E402

django.setup()

from django.db import connection, connections  # noqa: E402

from tests.testapp.models import Ticket  # noqa: E402


def reset(rows: int) -> None:
    with connection.schema_editor() as editor:
        if Ticket._meta.db_table in connection.introspection.table_names():
            editor.delete_model(Ticket)
        editor.create_model(Ticket)
    Ticket.objects.bulk_create([Ticket(rank=i) for i in range(rows)], batch_size=5000)


def work(name: str, batch: int, queue) -> None:
    claimed = []
    while True:
        got = Ticket.objects.filter(queue="a").claim(name, batch, lock_for=600)
        if not got:
            break
        pks = [t.pk for t in got]
        Ticket.objects.filter(pk__in=pks).update(queue="done")
        claimed.extend(pks)
    connections.close_all()
    queue.put(claimed)


def run(processes: int, rows: int, batch: int) -> float:
    reset(rows)
    connections.close_all()
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=work, args=(f"w{i}", batch, queue)) for i in range(processes)]
    started = time.perf_counter()
    for p in procs:
        p.start()
    results = [queue.get() for _ in procs]
    elapsed = time.perf_counter() - started
    for p in procs:
        p.join()
    everything = [pk for r in results for pk in r]
    assert len(everything) == len(set(everything)) == rows, "a row was claimed twice or lost"
    return rows / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--processes", type=int, nargs="*", default=[1, 4])
    args = parser.parse_args()
    print(f"database: {connection.vendor}, rows: {args.rows}, batch: {args.batch}")
    for n in args.processes:
        print(f"{n} process(es): {run(n, args.rows, args.batch):,.0f} rows/s")
    with connection.schema_editor() as editor:
        editor.delete_model(Ticket)


if __name__ == "__main__":
    main()
