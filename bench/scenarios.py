"""Our system's benchmark scenarios, each on the database ``DATABASE_URL`` names.

    DATABASE_URL=postgres:///bench_taskloop python bench/scenarios.py drain --jobs 20000 --processes 4

Scenarios (each prints one ``BENCH {json}`` line for ``bench/run.py``):

- ``setup``: create the tables (``migrate --run-syncdb``: the app's migrations when it has
  them, else its models as they are).
- ``drain``: fill the ``bench`` tube (a ``fifottl`` tube, the ``@tube`` default) with
  ``--jobs`` no-op tasks, run ``manage.py workers --burst --processes N --only bench`` until
  it exits, check every task ran exactly once; the workers' CPU time (user + system, start-up
  included) per job, in µs.
- ``kinds``: ``drain`` on a queue of ``--kind``: a ``fifo``, ``fifottl``, ``utube`` or
  ``utubettl`` tube (keyed ones over 500 keys), or Django Tasks, ``tasks`` or ``tasks-keyed``
  (enqueued one at a time first); boards and loops have scenarios of their own below.
- ``enqueue``: ``tube.put`` one at a time (``--jobs`` puts, each its own transaction),
  ``put_many`` of them all ("bulk"), the puts inside one ``transaction.atomic()``, and a
  Django Task's ``enqueue()`` one at a time.
- ``latency``: a running (not burst) ``manage.py workers --only bench``, idle; ``--samples``
  puts ``--gap`` seconds apart; put → handler start; and, before the puts, what the idle
  worker costs the database per second (``common.idle_cost``).
- ``loop``: ``--processes`` processes ``claim(100)`` + ``did`` on ``--jobs`` loop ids.
- ``board``: post ``--jobs`` no-op jobs on the ``bench-board`` board, run ``manage.py workers
  --burst --processes N --only bench-board`` (``@board(batch=100)``: ``claim_many`` +
  ``consume_many``) until it exits, check every job ran exactly once.
- ``board_verbs``: ``--processes`` forked processes calling the facade directly on ``--jobs``
  posted jobs: ``claim_next`` + ``consume`` (``--batch 1``, one job per claim: the measurement
  before ``claim_many`` existed) or ``claim_many(--batch)`` + ``consume_many``.
- ``growth``: claim latency, ``take(0)``, on the tube as it grows through ``--sizes`` ready
  tasks (median and p95 of ``--samples`` takes at each size; each take is followed by an
  ``ack``, timed apart, and a ``put`` that keeps the size, not timed).
- ``startup``: with one task already queued on an idle machine, spawn ``manage.py workers``
  (not burst) and time spawn → the handler's start, import time included: ``--only bench``
  for a tube task, and plain ``manage.py workers`` (every handler) for a Django Task; median
  and max of ``--samples`` spawns each. For reference, ``import_ms``: spawn → the end of
  ``django.setup()`` and the worker's import in a process that does nothing else (the floor).
  The checkout is byte-compiled first, as a pip install is.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROJECT = HERE / "project"
sys.path[:0] = [str(PROJECT), str(HERE.parent), str(HERE)]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")

import django  # noqa: E402

django.setup()

import statement_log  # noqa: E402
from benchapp.models import BenchLoop  # noqa: E402
from common import (  # noqa: E402
    RECORD_DIR_ENV,
    check_once,
    children_cpu,
    drain_rate,
    emit,
    fresh_dir,
    idle_cost,
    latencies,
    percentile,
    read_records,
    record,
    spaced_puts,
    wait_for_records,
)
from django.db import connection, connections, transaction  # noqa: E402

from django_taskloop.engine import db_now  # noqa: E402
from django_taskloop.models import Job, JobBoard, Task, Tube  # noqa: E402

TUBE = "bench"
#: The board of the ``@board`` handler in benchapp/taskloop.py (handler names are unique, so
#: not "bench", the tube's).
BOARD = "bench-board"


def bench_tube() -> Tube:
    # The type the @tube decorator gives it by default, so the worker finds it as it expects.
    return Tube.objects.create_tube(TUBE, "fifottl", if_not_exists=True)


def empty_tube() -> Tube:
    tube = bench_tube()
    tube.truncate()
    return tube


def fill(tube: Tube, ns: range) -> None:
    """Add ready tasks fast (plain bulk INSERTs of the rows ``put`` would write).

    The drain measures the workers, not the filling; tubes have no bulk ``put`` (see the
    ``enqueue`` scenario for ``put`` itself).
    """
    batch = 2000
    ns = list(ns)
    for start in range(0, len(ns), batch):
        Task.objects.bulk_create(
            [Task(tube_id=tube.pk, data=n, state="r", pri=tube.pri or 0) for n in ns[start : start + batch]]
        )


def workers_command(processes: int, burst: bool, only: str = TUBE) -> list[str]:
    cmd = [
        sys.executable,
        str(PROJECT / "manage.py"),
        "workers",
        "--processes",
        str(processes),
        "--only",
        only,
    ]
    return [*cmd, "--burst"] if burst else cmd


def run_workers(
    processes: int, burst: bool, record_dir: Path, only: str = TUBE, **extra_env: str
) -> subprocess.Popen:
    env = {**os.environ, RECORD_DIR_ENV: str(record_dir), **extra_env}
    log = open(record_dir / "worker.out", "ab")  # noqa: SIM115
    return subprocess.Popen(
        workers_command(processes, burst, only),
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stop(proc: subprocess.Popen, grace: float = 30.0) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def burst(
    processes: int, record_dir: Path, timeout: float, only: str = TUBE
) -> tuple[subprocess.Popen, float, float]:
    """Run ``workers --burst`` until it exits; return it, its wall seconds and the worker
    processes' own CPU seconds (start-up included, once the supervisor has reaped them all)."""
    connections.close_all()
    started = time.perf_counter()
    cpu = children_cpu()
    proc = run_workers(processes, burst=True, record_dir=record_dir, only=only)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        stop(proc)
    return proc, time.perf_counter() - started, children_cpu() - cpu


def drain(jobs: int, processes: int, record_dir: Path, timeout: float) -> dict:
    tube = empty_tube()
    fill(tube, range(jobs))
    proc, wall, cpu = burst(processes, record_dir, timeout)
    records = read_records(record_dir)
    left = tube.statistics()["tasks"]
    return {
        "rate": drain_rate(records),
        "wall_rate": jobs / wall,
        "cpu_us_per_job": cpu / jobs * 1e6 if jobs else None,
        "exit_code": proc.returncode,
        "left": {k: v for k, v in left.items() if k in ("ready", "taken", "buried") and v},
        **check_once(records, range(jobs)),
    }


#: The ``kinds`` scenario's queues: the tube (or Django Tasks queue) and ``--only`` of each.
KINDS = {
    "fifo": "bench-fifo",
    "fifottl": TUBE,
    "utube": "bench-utube",
    "utubettl": "bench-utubettl",
    "tasks": "kinds",
    "tasks-keyed": "kinds",
}
#: Keyed kinds spread their tasks over this many keys (one sub-queue each).
KEYS = 500


def drain_kind(kind: str, jobs: int, processes: int, record_dir: Path, timeout: float) -> dict:
    """``drain`` on a queue of each kind: a tube of each type (keyed ones over :data:`KEYS`
    keys) and Django Tasks, plain and keyed, each drained by ``workers --burst --only <it>``.
    Keyed kinds are the ones a server's defaults (PostgreSQL's JIT) once made 20–40× slower."""
    from benchapp.taskloop import kinds_keyed_task, kinds_task

    from django_taskloop.models import TaskRecord

    only = KINDS[kind]
    for name in ("tasks.kinds", "tasks-keyed.kinds"):
        for tube in Tube.objects.filter(name=name):
            tube.truncate()
    TaskRecord.objects.all()._raw_delete(TaskRecord.objects.db)
    if kind.startswith("tasks"):
        enqueue_one = kinds_keyed_task.enqueue if kind == "tasks-keyed" else kinds_task.enqueue
        for n in range(jobs):
            enqueue_one(n)
    else:
        tube = Tube.objects.create_tube(only, kind, if_not_exists=True)
        tube.truncate()
        keyed = kind.startswith("utube")
        for start in range(0, jobs, 2000):
            Task.objects.bulk_create(
                [
                    Task(tube_id=tube.pk, data=n, state="r", pri=0, utube=f"k{n % KEYS}" if keyed else None)
                    for n in range(start, min(jobs, start + 2000))
                ]
            )
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE taskloop_task")
    proc, wall, cpu = burst(processes, record_dir, timeout, only)
    records = read_records(record_dir)
    return {
        "rate": drain_rate(records),
        "wall_rate": jobs / wall,
        "cpu_us_per_job": cpu / jobs * 1e6 if jobs else None,
        "exit_code": proc.returncode,
        **check_once(records, range(jobs)),
    }


def enqueue(jobs: int) -> dict:
    """Enqueue rates: ``put`` one at a time (each its own transaction, as a view makes it), a
    Django Task's ``enqueue()`` one at a time, ``put_many`` of all the jobs in one call (the bulk
    column), and, for reference, the puts inside one ``transaction.atomic()``."""
    from benchapp.taskloop import noop_task

    from django_taskloop.models import TaskRecord

    tube = empty_tube()
    started = time.perf_counter()
    for n in range(jobs):
        tube.put(n)
    single = jobs / (time.perf_counter() - started)
    tube.truncate()
    statement = put_statement_rate(tube, jobs)
    tube.truncate()
    started = time.perf_counter()
    tube.put_many(range(jobs))
    bulk = jobs / (time.perf_counter() - started)
    tube.truncate()
    started = time.perf_counter()
    with transaction.atomic():
        for n in range(jobs):
            tube.put(n)
    atomic = jobs / (time.perf_counter() - started)
    tube.truncate()
    noop_task.enqueue(-1)  # the first enqueue of a process makes the queue's tube
    started = time.perf_counter()
    for n in range(jobs):
        noop_task.enqueue(n)
    tasks = jobs / (time.perf_counter() - started)
    Tube.objects.get(name="tasks.default").truncate()
    TaskRecord.objects.all()._raw_delete(TaskRecord.objects.db)
    return {
        "rate": single,
        "bulk_rate": bulk,
        "atomic_rate": atomic,
        "task_rate": tasks,
        "statement_rate": statement,
    }


def statements_of(call) -> list[tuple[str, list]]:
    """The SQL and parameters of each statement ``call()`` sends on the default database."""
    seen: list[tuple[str, list]] = []

    def spy(execute, sql, params, many, context):
        seen.append((sql, list(params or [])))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(spy):
        call()
    return seen


def put_statement(tube: Tube) -> tuple[str, list]:
    """The SQL and parameters one ``tube.put`` sends (it puts one task, ``-1``)."""
    (statement,) = statements_of(lambda: tube.put(-1))
    return statement


def put_statement_rate(tube: Tube, jobs: int) -> float:
    """Puts/s of a put's own statement alone: the exact SQL and parameters ``tube.put`` sends,
    sent ``jobs`` times through the driver's cursor in autocommit, with no Python above the
    driver. Whatever a put does, it cannot beat this: it is the floor under ``put``."""
    sql, params = put_statement(tube)
    if connection.vendor == "sqlite":
        sql = sql.replace("%s", "?")
    cursor = connection.connection.cursor()
    started = time.perf_counter()
    for _ in range(jobs):
        cursor.execute(sql, params)
        cursor.fetchall()
    rate = jobs / (time.perf_counter() - started)
    cursor.close()
    return rate


def latency(samples: int, gap: float, record_dir: Path, idle_seconds: float = 3.0) -> dict:
    tube = empty_tube()
    connections.close_all()
    log = record_dir / "statements"
    for old in record_dir.glob("statements.*"):
        old.unlink()
    proc = run_workers(1, burst=False, record_dir=record_dir, **{statement_log.ENV: str(log)})
    try:
        # Let it start and go idle: we measure pickup by a worker that was waiting, and what
        # the waiting costs the database.
        time.sleep(2.5)
        started = time.time()
        idle = idle_cost(os.environ.get("DATABASE_URL", ""), idle_seconds)
        if idle is None:
            time.sleep(idle_seconds)
            idle = {}
        ended = time.time()
        put_times = spaced_puts(tube.put, samples, gap)
        wait_for_records(record_dir, samples, timeout=30)
    finally:
        stop(proc)
    # What the worker sent meanwhile, as it counted it: exact, whoever else uses the server.
    notes = [note for note in statement_log.read(str(log)) if started <= note[0] < ended]
    transactions = sum(
        1
        for _, kind, _, atomic in notes
        if kind in ("commit", "rollback") or (kind == "statement" and not atomic)
    )
    idle["sent_per_s"] = len(notes) / (ended - started)
    idle["sent_xacts_per_s"] = transactions / (ended - started)
    records = read_records(record_dir)
    return {**latencies(records, put_times), "idle": idle, **check_once(records, range(samples))}


def _spawn_until_record(record_dir: Path, n: int, only: str | None, timeout: float) -> float:
    """Spawn ``manage.py workers`` (``--only`` ``only``, or every handler), wait for job ``n``'s
    handler start, stop the worker; return spawn → start in milliseconds."""
    connections.close_all()
    cmd = workers_command(1, burst=False, only=only or "")
    if only is None:
        cmd = cmd[: cmd.index("--only")]
    log = open(record_dir / "worker.out", "ab")  # noqa: SIM115
    spawned = time.time()
    proc = subprocess.Popen(
        cmd,
        env={**os.environ, RECORD_DIR_ENV: str(record_dir)},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        if not wait_for_records(record_dir, 1, timeout, poll=0.005):
            raise RuntimeError(f"job {n} did not start within {timeout} s (see {record_dir / 'worker.out'})")
    finally:
        stop(proc)
    ((seen, started),) = read_records(record_dir)
    assert seen == n, (seen, n)
    return (started - spawned) * 1000


def _import_floor() -> float:
    """Spawn → the end of ``django.setup()`` and the worker's import, in a process that does
    nothing else: milliseconds (the floor under any start-up of ``manage.py workers``)."""
    code = "import django, time; django.setup(); import django_taskloop.workers.runner; print(time.time())"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PROJECT), str(HERE.parent)])}
    spawned = time.time()
    done = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True)
    return (float(done.stdout.split()[-1]) - spawned) * 1000


def startup(samples: int, record_dir: Path, timeout: float) -> dict:
    """Spawn ``manage.py workers`` with one task already queued: spawn → handler start (ms)."""
    # As an installed package is (pip byte-compiles what it installs): this checkout's bytecode
    # written once, which PYTHONDONTWRITEBYTECODE (common in containers) would otherwise leave
    # every spawn to compile afresh, ~50 modules, 0.2 s of CPU (a py-spy/cProfile finding).
    import compileall

    from benchapp.taskloop import startup_task

    from django_taskloop.models import TaskRecord

    for tree in (HERE.parent / "django_taskloop", PROJECT):
        compileall.compile_dir(str(tree), quiet=1)
    tube = empty_tube()
    tube_ms, task_ms, floor_ms = [], [], []
    for n in range(samples):
        fresh_dir(record_dir)
        tube.put(n)
        tube_ms.append(_spawn_until_record(record_dir, n, TUBE, timeout))
        fresh_dir(record_dir)
        startup_task.enqueue(n)
        task_ms.append(_spawn_until_record(record_dir, n, None, timeout))
        floor_ms.append(_import_floor())
    TaskRecord.objects.all()._raw_delete(TaskRecord.objects.db)
    return {
        "median_ms": statistics.median(tube_ms),
        "max_ms": max(tube_ms),
        "task_median_ms": statistics.median(task_ms),
        "task_max_ms": max(task_ms),
        "import_ms": statistics.median(floor_ms),
        "tube_samples_ms": tube_ms,
        "task_samples_ms": task_ms,
        "load": open("/proc/loadavg").read().split()[:3] if Path("/proc/loadavg").exists() else None,
    }


def _loop_worker(batch: int) -> None:
    connections.close_all()
    while True:
        ids = BenchLoop.objects.claim(batch, lock_for=600)
        if not ids:
            break
        for i in ids:
            record(i)
        BenchLoop.objects.did(ids)
    connections.close_all()


def loop(jobs: int, processes: int, batch: int, record_dir: Path) -> dict:
    ids = BenchLoop.objects.all()
    if ids.count() == jobs and ids.filter(pk__gte=jobs).count() == 0:
        # A repeat: make every id new again (faster than adding 100,000 rows afresh).
        ids.update(lock_until=None, last_updated=None)
    else:
        ids._raw_delete(BenchLoop.objects.db)
        for start in range(0, jobs, 10000):
            BenchLoop.objects.add(range(start, min(jobs, start + 10000)))
    connections.close_all()
    return _fork_run(_loop_worker, (batch,), processes, jobs, record_dir)


def fill_board(jobs: int) -> JobBoard:
    """Empty the bench board and post ``jobs`` no-op jobs (``details={"n": n}``) on it.

    Plain bulk INSERTs of the rows ``post`` would write: the scenarios measure the claims.
    """
    board = JobBoard.objects.create_board(BOARD, if_not_exists=True)
    Job.objects.filter(board_id=board.pk)._raw_delete(Job.objects.db)
    now = db_now()
    for start in range(0, jobs, 2000):
        Job.objects.bulk_create(
            [
                Job(board=board, uuid=str(uuid.uuid4()), name=f"job-{n}", details={"n": n},
                    created_on=now, last_modified=now)
                for n in range(start, min(jobs, start + 2000))
            ]
        )  # fmt: skip
    return board


def board(jobs: int, processes: int, record_dir: Path, timeout: float) -> dict:
    """``@board`` workers (``manage.py workers --burst``) drain the board."""
    fill_board(jobs)
    connections.close_all()
    started = time.perf_counter()
    proc = run_workers(processes, burst=True, record_dir=record_dir, only=BOARD)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        stop(proc)
    wall = time.perf_counter() - started
    records = read_records(record_dir)
    return {
        "verbs": "@board workers (claim_many + consume_many)",
        "rate": drain_rate(records),
        "wall_rate": jobs / wall,
        "exit_code": proc.returncode,
        "left": Job.objects.filter(board__name=BOARD).count(),
        **check_once(records, range(jobs)),
    }


def _board_worker(who: str, batch: int) -> None:
    connections.close_all()
    board = JobBoard.objects.get(name=BOARD)
    if batch == 1:
        while (job := board.claim_next(who)) is not None:
            record(job.details["n"])
            board.consume(job, who)
    else:
        while jobs := board.claim_many(who, batch):
            for job in jobs:
                record(job.details["n"])
            board.consume_many(jobs, who)
    connections.close_all()


def board_verbs(jobs: int, processes: int, batch: int, record_dir: Path) -> dict:
    """Forked processes call the facade: ``claim_next`` + ``consume``, or the batch verbs."""
    fill_board(jobs)
    connections.close_all()
    result = _fork_run(
        _board_worker, None, processes, jobs, record_dir, args_of=lambda i: (f"bench-{i}", batch)
    )
    verbs = "claim_next + consume" if batch == 1 else f"claim_many({batch}) + consume_many"
    return {"verbs": verbs, **result, "left": Job.objects.filter(board__name=BOARD).count()}


def _fork_run(target, args, processes: int, jobs: int, record_dir: Path, args_of=None) -> dict:
    os.environ[RECORD_DIR_ENV] = str(record_dir)
    ctx = multiprocessing.get_context("fork")
    procs = [
        ctx.Process(
            target=target,
            args=args if args is not None else (args_of(i) if args_of is not None else (f"bench-{i}",)),
        )
        for i in range(processes)
    ]
    started = time.perf_counter()
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    wall = time.perf_counter() - started
    records = read_records(record_dir)
    return {
        "rate": drain_rate(records),
        "wall_rate": jobs / wall,
        "exit_codes": [p.exitcode for p in procs],
        **check_once(records, range(jobs)),
    }


def _grow_to(tube: Tube, size: int) -> None:
    """Add ready tasks until the tube holds ``size`` of them (INSERT … SELECT: fast everywhere)."""
    have = Task.objects.filter(tube_id=tube.pk).count()
    if not have:
        fill(tube, range(min(size, 10000)))
        have = min(size, 10000)
    table = Task._meta.db_table
    columns = [f.column for f in Task._meta.concrete_fields if not f.primary_key]
    quoted = ", ".join(connection.ops.quote_name(c) for c in columns)
    while have < size:
        step = min(have, size - have)
        with connection.cursor() as cursor:
            # MySQL cannot read the table it inserts into in one statement without a derived table.
            cursor.execute(
                f"INSERT INTO {table} ({quoted}) SELECT {quoted} FROM "
                f"(SELECT {quoted} FROM {table} WHERE tube_id = %s ORDER BY id LIMIT %s) AS src",
                [tube.pk, step],
            )
        have += step
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {table}")


def growth(sizes: list[int], samples: int) -> dict:
    tube = empty_tube()
    out = {}
    for size in sizes:
        _grow_to(tube, size)
        times, both = [], []
        for _ in range(samples):
            started = time.perf_counter()
            task = tube.take(0)
            taken = time.perf_counter()
            tube.ack(task.pk)
            times.append((taken - started) * 1000)
            both.append((time.perf_counter() - started) * 1000)
            # Keep the size: put back what was taken (not timed).
            tube.put(task.data)
        out[str(size)] = {
            "median_ms": statistics.median(times),
            "p95_ms": percentile(times, 95),
            "take_ack_median_ms": statistics.median(both),
        }
    tube.truncate()
    return {"sizes": out}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "scenario",
        choices=[
            "setup",
            "drain",
            "kinds",
            "enqueue",
            "latency",
            "loop",
            "board",
            "board_verbs",
            "growth",
            "startup",
        ],
    )
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--kind", choices=sorted(KINDS), default="fifottl", help="kinds: the queue's kind")
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--samples", type=int, default=50)
    parser.add_argument("--gap", type=float, default=0.2)
    parser.add_argument("--idle-seconds", type=float, default=3.0, help="latency: idle cost window")
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--record-dir", default="/tmp/bench_records_taskloop")
    args = parser.parse_args()
    record_dir = fresh_dir(args.record_dir)
    (record_dir / "worker.out").unlink(missing_ok=True)
    if args.scenario == "setup":
        from django.core.management import call_command

        call_command("migrate", run_syncdb=True, verbosity=0)
        result: dict = {}
    elif args.scenario == "drain":
        result = drain(args.jobs, args.processes, record_dir, args.timeout)
    elif args.scenario == "kinds":
        result = drain_kind(args.kind, args.jobs, args.processes, record_dir, args.timeout)
    elif args.scenario == "enqueue":
        result = enqueue(args.jobs)
    elif args.scenario == "latency":
        result = latency(args.samples, args.gap, record_dir, args.idle_seconds)
    elif args.scenario == "loop":
        result = loop(args.jobs, args.processes, args.batch, record_dir)
    elif args.scenario == "board":
        result = board(args.jobs, args.processes, record_dir, args.timeout)
    elif args.scenario == "board_verbs":
        result = board_verbs(args.jobs, args.processes, args.batch, record_dir)
    elif args.scenario == "startup":
        result = startup(args.samples, record_dir, min(args.timeout, 60))
    else:
        result = growth([int(s) for s in args.sizes.split(",")], args.samples)
    emit(
        {"system": "taskloop", "scenario": args.scenario, "vendor": connection.vendor, **vars(args), **result}
    )


if __name__ == "__main__":
    main()
