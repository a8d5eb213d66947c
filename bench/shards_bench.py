"""One tube over three shards against the same tube in one database (issue 31's bench row).

    DATABASE_URL=mysql://root@127.0.0.1:3306/test .venv/bin/python bench/shards_bench.py
    DATABASE_URL=postgres:///test .venv/bin/python bench/shards_bench.py --rounds 5

Three databases on the server of ``DATABASE_URL`` (``bench_shard0..2``, made afresh and
migrated) are the shards. Each round drains ``--tasks`` tasks of a ``fifottl`` tube with
``--processes`` worker processes (the real ``Worker``, in a burst, batch 100, a handler that
does nothing): once from ``bench_shard0`` alone (``SHARDS`` naming one database), once spread
over the three (``SHARDS`` naming all three). The variants alternate round by round, so that a
noisy minute hurts both alike.

Printed per variant: the drain rate, the workers' CPU per job (user + system of the worker
processes) and the database server's CPU per job (mariadbd, or the postmaster with every
backend), medians over the rounds, then the load average.

Beside them, in the same rounds, the same pattern in plain SQL through Django's cursors (no
taskloop): each process runs ``--raw`` transactions of a batch's shape (read 100 rows, update
one row of its own, commit), on one database or taking the three in turn. Their ratio is what
going round three connections costs a process on this machine by itself, whatever runs the
SQL; taskloop's ratio over it is what the shards cost beyond that. On one machine the shards share
its cores, so three shards cannot drain faster than one here; what they must not do is drain
slower. What N shards on N servers give follows from the server CPU per job (see
docs/benchmarks.md, "Shards").
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
os.environ.setdefault("TASKLOOP_TEST_SUFFIX", "shardsbench")

import django  # noqa: E402
from django.conf import settings  # noqa: E402

SHARDS = [f"shard{n}" for n in range(3)]
TUBE = "bench-shards"

django.setup()
for _n, _alias in enumerate(SHARDS):
    _default = settings.DATABASES["default"]
    _name = (
        f"{Path(str(_default['NAME'])).parent}/bench_shard{_n}.sqlite3"
        if "sqlite" in _default["ENGINE"]
        else f"bench_shard{_n}"
    )
    settings.DATABASES[_alias] = {**_default, "NAME": _name, "TEST": {"NAME": _name}}

from django.core.management import call_command  # noqa: E402
from django.db import connections, transaction  # noqa: E402
from django.test.utils import override_settings  # noqa: E402

from django_taskloop.models import Task, Tube  # noqa: E402
from django_taskloop.workers import Handler  # noqa: E402
from django_taskloop.workers.runner import Worker  # noqa: E402


def make_databases() -> None:
    """Create (afresh) and migrate the three shard databases, and a fourth that is the
    workers' ``default`` (their process rows, throughput and failures)."""
    default = connections["default"]
    vendor = default.vendor
    home = str(settings.DATABASES[SHARDS[0]]["NAME"]).replace("shard0", "home")
    for name in [*(settings.DATABASES[alias]["NAME"] for alias in SHARDS), home]:
        if vendor == "sqlite":
            Path(name).unlink(missing_ok=True)
        else:
            with default.cursor() as cursor:
                cursor.execute(f"DROP DATABASE IF EXISTS {name}")
                cursor.execute(f"CREATE DATABASE {name}")
    default.close()
    default.settings_dict["NAME"] = settings.DATABASES["default"]["NAME"] = home
    for alias in ["default", *SHARDS]:
        call_command("migrate", database=alias, verbosity=0)
    for alias in SHARDS:  # the plain-SQL rounds' table: 1,000 rows
        with connections[alias].cursor() as cursor:
            cursor.execute("CREATE TABLE bench_raw (id integer PRIMARY KEY, n integer NOT NULL)")
            cursor.executemany("INSERT INTO bench_raw (id, n) VALUES (%s, 0)", [(i,) for i in range(1000)])
    connections.close_all()


def fill(databases: list[str], tasks: int) -> None:
    """Put ``tasks`` ready tasks on the tube, spread evenly over ``databases`` (bulk rows, as
    ``put_many`` writes them)."""
    for n, alias in enumerate(databases):
        tube = Tube.objects.db_manager(alias).create_tube(TUBE, "fifottl", if_not_exists=True)
        count = tasks // len(databases) + (1 if n < tasks % len(databases) else 0)
        Task.objects.using(alias).bulk_create(
            [Task(tube=tube, data={"n": i}, state="r", pri=0) for i in range(count)], batch_size=2000
        )
        # Statistics for the planner, as a live table has: a table just filled in bulk has
        # none until autovacuum gets to it, and its first drain would read a worse plan
        # than the shard used the round before (the first runs of this bench did).
        if connections[alias].vendor != "sqlite":
            with connections[alias].cursor() as cursor:
                cursor.execute(
                    "ANALYZE TABLE taskloop_task"
                    if connections[alias].vendor == "mysql"
                    else "ANALYZE taskloop_task"
                )
                if connections[alias].vendor == "mysql":
                    cursor.fetchall()
    connections.close_all()


def left(databases: list[str]) -> int:
    return sum(Task.objects.using(alias).filter(tube__name=TUBE).count() for alias in databases)


def work(ready) -> None:
    ready.wait()
    handler = Handler("tube", TUBE, lambda task: None, TUBE, batch=100, create={"type": "fifottl"})
    Worker([handler], burst=True, schedule=False).run()
    connections.close_all()


def raw_work(ready, databases: list[str], transactions: int, me: int) -> None:
    """Plain SQL of a batch's shape, through Django's cursors: read 100 rows, update one row of
    this process's own, commit; each transaction on the next of ``databases``."""
    ready.wait()
    for n in range(transactions):
        alias = databases[n % len(databases)]
        with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
            cursor.execute("SELECT id, n FROM bench_raw WHERE id >= %s ORDER BY id LIMIT 100", [n % 900])
            cursor.fetchall()
            cursor.execute("UPDATE bench_raw SET n = n + 1 WHERE id = %s", [me])
    connections.close_all()


def raw_round(databases: list[str], transactions: int, processes: int) -> float:
    """Transactions a second of ``processes`` running :func:`raw_work` over ``databases``."""
    connections.close_all()  # no connection of this process's is shared with its children
    context = multiprocessing.get_context("fork")
    ready = context.Event()
    children = [
        context.Process(target=raw_work, args=(ready, databases, transactions, me)) for me in range(processes)
    ]
    for child in children:
        child.start()
    time.sleep(0.5)
    started = time.perf_counter()
    ready.set()
    for child in children:
        child.join()
    return transactions * processes / (time.perf_counter() - started)


def server_cpu() -> float:
    """CPU seconds the database server has used so far (0 for SQLite)."""
    vendor = connections["default"].vendor
    tick = os.sysconf("SC_CLK_TCK")
    if vendor == "sqlite":
        return 0.0
    with connections["default"].cursor() as cursor:
        if vendor == "mysql":
            cursor.execute("SELECT @@pid_file")
            pid = int(Path(cursor.fetchone()[0]).read_text().split()[0])
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / tick
        cursor.execute("SELECT setting FROM pg_settings WHERE name = 'data_directory'")
        main = int((Path(cursor.fetchone()[0]) / "postmaster.pid").read_text().split()[0])
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, parent = int(stat.parent.name), int(fields[1])
        if pid == main:  # its waited-for backends too
            total += sum(int(value) for value in fields[11:15]) / tick
        elif parent == main:
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def drain(databases: list[str], tasks: int, processes: int) -> dict[str, float]:
    """Drain ``tasks`` spread over ``databases`` with ``processes`` workers; return the rate
    and the CPU per job of the workers and of the server."""
    with override_settings(TASKLOOP={"SHARDS": {TUBE: databases}}):
        fill(databases, tasks)
        context = multiprocessing.get_context("fork")
        ready = context.Event()
        children = [context.Process(target=work, args=(ready,)) for _ in range(processes)]
        for child in children:
            child.start()
        time.sleep(0.5)  # every worker started, its Django imported
        server_before = server_cpu()
        connections.close_all()
        workers_before = os.times()
        started = time.perf_counter()
        ready.set()
        for child in children:
            child.join()
        seconds = time.perf_counter() - started
        workers_after = os.times()
        server = server_cpu() - server_before
        assert left(databases) == 0, "the drain left tasks"
    workers = (workers_after.children_user - workers_before.children_user) + (
        workers_after.children_system - workers_before.children_system
    )
    return {"rate": tasks / seconds, "worker_us": workers / tasks * 1e6, "server_us": server / tasks * 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--raw", type=int, default=4000, help="plain-SQL transactions per process")
    args = parser.parse_args()
    make_databases()
    variants = {"1 shard": SHARDS[:1], "3 shards": SHARDS}
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    raw: dict[str, list[float]] = {name: [] for name in variants}
    load = os.getloadavg()
    for _ in range(args.rounds):
        for name, databases in variants.items():
            samples[name].append(drain(databases, args.tasks, args.processes))
            raw[name].append(raw_round(databases, args.raw, args.processes))
    vendor = connections["default"].vendor
    print(f"{vendor}: {args.tasks} tasks, {args.processes} worker processes, {args.rounds} rounds (medians)")
    print(f"{'':<9}  {'jobs/s':>8}  {'(range)':>17}  {'worker CPU µs/job':>18}  {'server CPU µs/job':>18}")
    for name, runs in samples.items():
        rates = [run["rate"] for run in runs]
        print(
            f"{name:<9}  {statistics.median(rates):8.0f}  ({min(rates):7.0f}–{max(rates):7.0f})"
            f"  {statistics.median(run['worker_us'] for run in runs):18.0f}"
            f"  {statistics.median(run['server_us'] for run in runs):18.0f}"
        )
    ratio = statistics.median(run["rate"] for run in samples["3 shards"]) / statistics.median(
        run["rate"] for run in samples["1 shard"]
    )
    after = os.getloadavg()
    plain = statistics.median(raw["3 shards"]) / statistics.median(raw["1 shard"])
    for name, rates in raw.items():
        print(
            f"plain SQL, {name}: {statistics.median(rates):8.0f} transactions/s ({min(rates):.0f}–{max(rates):.0f})"
        )
    print(
        f"3 shards / 1 shard: {ratio:.2f}x (plain SQL: {plain:.2f}x; taskloop over plain: {ratio / plain:.2f}x)"
    )
    print(
        f"load average at the start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, at the end {after[0]:.2f} {after[1]:.2f} {after[2]:.2f}"
    )


if __name__ == "__main__":
    main()
