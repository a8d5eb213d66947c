"""Run one benchmark scenario on one peer, inside that peer's own virtualenv.

    PEER=tasksdb DATABASE_URL=postgres:///bench_tasksdb bench/.venvs/tasksdb/bin/python bench/peers/driver.py drain --jobs 2000 --processes 4

Scenarios (each prints one ``BENCH {json}`` line for ``bench/run.py``):

- ``setup``: apply the peer's migrations.
- ``drain``: empty the queue, enqueue ``--jobs`` no-op jobs in bulk (timed), start the peer's
  own worker with ``--processes`` processes, wait until every job has started, stop it,
  check that every job ran exactly once.
- ``enqueue``: time ``--jobs`` enqueues one at a time.
- ``latency``: start an idle worker, enqueue ``--samples`` jobs ``--gap`` seconds apart,
  measure put → handler start.

Workers, with the peers' defaults except where said:

- django-tasks-db: ``--processes`` × ``manage.py db_worker`` (``--batch`` to drain; polling
  ``--interval 0.1`` while draining, its default of 1 s in the latency scenario);
- django-q2: ``manage.py qcluster`` with ``workers = --processes`` on the ORM broker (its
  default poll, 0.2 s);
- dj-queue: ``manage.py dj_queue --only-work --skip-recurring`` with ``processes =
  --processes`` and one thread each (its default poll, 0.1 s, plus LISTEN/NOTIFY on
  PostgreSQL).

Bulk enqueue: dj-queue's ``enqueue_all``; django-tasks-db and django-q2 have no bulk API, so
their "bulk" is the one-at-a-time calls inside one ``transaction.atomic()``.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")

from common import (  # noqa: E402
    RECORD_DIR_ENV,
    check_once,
    drain_rate,
    emit,
    fresh_dir,
    idle_cost,
    latencies,
    read_records,
    spaced_puts,
    wait_for_records,
)

PEER = os.environ["PEER"]


def django_setup() -> None:
    import django

    django.setup()


def flush() -> None:
    """Empty every table (TRUNCATE where the database has it): a fresh queue for each run."""
    from django.core.management import call_command

    call_command("flush", interactive=False, verbosity=0)


def enqueue_one(n: int) -> None:
    if PEER == "q2":
        from django_q.tasks import async_task

        async_task("benchpeer.jobs.noop", n)
    else:
        from benchpeer.jobs import noop_task

        noop_task.enqueue(n)


def enqueue_bulk(ns: range) -> None:
    from django.db import transaction

    if PEER == "djqueue":
        from benchpeer.jobs import noop_task

        backend = noop_task.get_backend()
        calls = [(noop_task, [n], {}) for n in ns]
        for start in range(0, len(calls), 1000):
            backend.enqueue_all(calls[start : start + 1000])
        return
    with transaction.atomic():
        for n in ns:
            enqueue_one(n)


def worker_commands(processes: int, burst: bool) -> list[list[str]]:
    manage = [sys.executable, str(HERE / "manage.py")]
    if PEER == "tasksdb":
        flags = ["--no-startup-delay", "--no-reload"]
        flags += ["--batch", "--interval", "0.1"] if burst else []
        return [[*manage, "db_worker", *flags] for _ in range(processes)]
    if PEER == "q2":
        return [[*manage, "qcluster"]]
    return [[*manage, "dj_queue", "--only-work", "--skip-recurring"]]


def start_workers(processes: int, burst: bool, record_dir: Path) -> list[subprocess.Popen]:
    env = {**os.environ, RECORD_DIR_ENV: str(record_dir), "BENCH_PROCESSES": str(processes)}
    log = open(record_dir / "worker.out", "ab")  # noqa: SIM115
    return [
        subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        for cmd in worker_commands(processes, burst)
    ]


def stop_workers(procs: list[subprocess.Popen], grace: float = 3.0) -> None:
    """Stop the workers (the whole process group: qcluster and dj_queue fork children).

    Every job has been seen by then, so a short grace is enough: the stop is not measured.
    """
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()


def drain(jobs: int, processes: int, record_dir: Path, timeout: float) -> dict:
    flush()
    started = time.perf_counter()
    enqueue_bulk(range(jobs))
    enqueue_seconds = time.perf_counter() - started
    from django.db import connections

    connections.close_all()
    procs = start_workers(processes, burst=True, record_dir=record_dir)
    try:
        done = wait_for_records(record_dir, jobs, timeout)
        # Let a duplicate (if any) show before the check.
        time.sleep(0.5)
    finally:
        stop_workers(procs)
    records = read_records(record_dir)
    return {
        "rate": drain_rate(records),
        "completed": done,
        "bulk_enqueue_rate": jobs / enqueue_seconds,
        **check_once(records, range(jobs)),
    }


def enqueue(jobs: int) -> dict:
    flush()
    started = time.perf_counter()
    for n in range(jobs):
        enqueue_one(n)
    return {"rate": jobs / (time.perf_counter() - started)}


def latency(samples: int, gap: float, record_dir: Path) -> dict:
    flush()
    from django.db import connections

    connections.close_all()
    procs = start_workers(1, burst=False, record_dir=record_dir)
    try:
        # Let it start and go idle: we measure pickup by a worker that was waiting, and what
        # the waiting costs the database.
        time.sleep(2.5)
        idle = idle_cost(os.environ.get("DATABASE_URL", ""), 3.0)
        put_times = spaced_puts(enqueue_one, samples, gap)
        wait_for_records(record_dir, samples, timeout=30)
    finally:
        stop_workers(procs)
    records = read_records(record_dir)
    return {**latencies(records, put_times), "idle": idle, **check_once(records, range(samples))}


def startup(samples: int, record_dir: Path) -> dict:
    """Spawn the peer's worker with one job already queued: spawn → handler start (ms)."""
    import statistics

    from django.db import connections

    flush()
    times = []
    for n in range(samples):
        fresh_dir(record_dir)
        enqueue_one(n)
        connections.close_all()
        spawned = time.time()
        procs = start_workers(1, burst=False, record_dir=record_dir)
        try:
            if not wait_for_records(record_dir, 1, timeout=60, poll=0.005):
                raise RuntimeError(f"job {n} did not start within 60 s")
        finally:
            stop_workers(procs)
        ((_, started),) = read_records(record_dir)
        times.append((started - spawned) * 1000)
    return {
        "median_ms": statistics.median(times),
        "max_ms": max(times),
        "tube_samples_ms": times,
        "load": open("/proc/loadavg").read().split()[:3],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("scenario", choices=["setup", "drain", "enqueue", "latency", "startup"])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--samples", type=int, default=50)
    parser.add_argument("--gap", type=float, default=0.2)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--record-dir", default=f"/tmp/bench_records_{PEER}")
    args = parser.parse_args()
    record_dir = fresh_dir(args.record_dir)
    (record_dir / "worker.out").unlink(missing_ok=True)
    django_setup()
    if args.scenario == "setup":
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        result: dict = {}
    elif args.scenario == "drain":
        result = drain(args.jobs, args.processes, record_dir, args.timeout)
    elif args.scenario == "enqueue":
        result = enqueue(args.jobs)
    elif args.scenario == "startup":
        result = startup(args.samples, record_dir)
    else:
        result = latency(args.samples, args.gap, record_dir)
    emit({"system": PEER, "scenario": args.scenario, **vars(args), **result})


if __name__ == "__main__":
    main()
