"""Throughput of a job board's claim and consume verbs, with real worker processes.

    DATABASE_URL=mysql://root@127.0.0.1:3306/test python bench/boards_bench.py --processes 4 --jobs 5000
    python bench/boards_bench.py --batch 100      # claim_many(100) + consume_many (what @board workers do)

``--batch 1`` (the default) measures ``claim_next`` + ``consume``, one job at a time; a larger
``--batch`` measures ``claim_many(batch)`` + ``consume_many``.

It builds a throw-away test database (suffix ``TASKLOOP_TEST_SUFFIX``, default ``boardsbench``)
from the models, posts ``--jobs`` jobs, lets ``--processes`` workers drain the board, and prints
jobs per second of wall time (from the moment every worker is ready to the last consume).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "testproject")]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
os.environ.setdefault("TASKLOOP_TEST_SUFFIX", "boardsbench")


def work(board_id: int, worker: str, batch: int, barrier, queue) -> None:
    from django.db import connections

    from django_taskloop.models import JobBoard

    board = JobBoard.objects.get(pk=board_id)
    barrier.wait()
    done = 0
    if batch == 1:
        while (job := board.claim_next(worker, expiry=600)) is not None:
            board.consume(job, worker)
            done += 1
    else:
        while jobs := board.claim_many(worker, batch, expiry=600):
            done += board.consume_many(jobs, worker)
    queue.put((done, time.monotonic()))
    connections.close_all()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument(
        "--batch", type=int, default=1, help="1: claim_next + consume; N: claim_many(N) + consume_many"
    )
    args = parser.parse_args()

    import django

    django.setup()
    from django.conf import settings
    from django.db import connections
    from django.test.utils import setup_databases, teardown_databases

    from django_taskloop.engine import db_now
    from django_taskloop.models import Job, JobBoard

    # Tables straight from the models, as the test suite's --no-migrations does.
    settings.MIGRATION_MODULES = {app.split(".")[-1]: None for app in settings.INSTALLED_APPS}
    old = setup_databases(verbosity=0, interactive=False, aliases={"default"})
    try:
        board = JobBoard.objects.create_board("bench")
        now = db_now()
        Job.objects.bulk_create(
            [
                Job(board=board, uuid=str(uuid.uuid4()), name=f"j{i}", created_on=now, last_modified=now)
                for i in range(args.jobs)
            ],
            batch_size=1000,
        )
        connections.close_all()
        ctx = multiprocessing.get_context("fork")
        barrier = ctx.Barrier(args.processes + 1)
        queue = ctx.Queue()
        procs = [
            ctx.Process(target=work, args=(board.pk, f"w{i}", args.batch, barrier, queue))
            for i in range(args.processes)
        ]
        for proc in procs:
            proc.start()
        barrier.wait()
        start = time.monotonic()
        results = [queue.get(timeout=600) for _ in procs]
        for proc in procs:
            proc.join()
        elapsed = max(end for _, end in results) - start
        total = sum(done for done, _ in results)
        vendor = connections["default"].vendor
        verbs = "claim_next + consume" if args.batch == 1 else f"claim_many({args.batch}) + consume_many"
        print(
            f"{vendor} [{verbs}]: {args.processes} processes consumed {total} of {args.jobs} jobs in {elapsed:.2f} s "
            f"= {total / elapsed:.0f} jobs/s (per process: {sorted(done for done, _ in results)})"
        )
        assert total == args.jobs and not Job.objects.exists()
    finally:
        connections.close_all()
        teardown_databases(old, verbosity=0)


if __name__ == "__main__":
    main()
