"""The practical limit: a queue in raw SQL, with the database drivers and nothing else.

    python bench/raw_baseline.py drain --url mysql://root@127.0.0.1:3306/bench_raw --jobs 20000 --processes 4 --batch 100
    python bench/raw_baseline.py latency --url postgres:///bench_raw --samples 50

Each worker loops over two short transactions, as any queue that survives a crash must: the
claim (``SELECT id, n … WHERE state = 0 ORDER BY id LIMIT batch FOR UPDATE SKIP LOCKED``, then
``UPDATE … SET state = 1``, ``COMMIT``), the no-op handler on each row, and the acknowledgement
(``DELETE``, ``COMMIT``). SQLite takes the write lock first (``BEGIN IMMEDIATE``) instead of
row locks. No ORM, no lease deadline, no retries, no heartbeat: what is left is the cost of the
round trips themselves, the most any database queue can do here. The idle worker polls every
5 ms.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    RECORD_DIR_ENV,
    check_once,
    db_vendor,
    drain_rate,
    emit,
    fresh_dir,
    idle_cost,
    latencies,
    mysql_connect,
    read_records,
    record,
    spaced_puts,
    wait_for_records,
)

TABLE = "raw_jobs"


def connect(url: str):
    """Open an autocommit-off connection with the vendor's own driver."""
    vendor = db_vendor(url)
    if vendor == "sqlite":
        import sqlite3

        path = url.split("///", 1)[1] if "///" in url else "/tmp/bench_raw.sqlite3"
        # isolation_level=None: we issue BEGIN IMMEDIATE ourselves (the write lock first).
        conn = sqlite3.connect(path, timeout=30, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        return conn
    if vendor == "mysql":
        return mysql_connect(url)
    import psycopg

    return psycopg.connect(url.replace("postgres://", "postgresql://", 1), autocommit=False)


def setup(url: str, jobs: int) -> None:
    """Create the table afresh and fill it with ``jobs`` ready rows (n = 0 … jobs-1)."""
    vendor = db_vendor(url)
    conn = connect(url)
    cur = conn.cursor()
    cur.execute(f"DROP TABLE IF EXISTS {TABLE}")
    if vendor == "sqlite":
        cur.execute(
            f"CREATE TABLE {TABLE} (id INTEGER PRIMARY KEY AUTOINCREMENT, state INT NOT NULL DEFAULT 0, n INTEGER NOT NULL)"
        )
    elif vendor == "mysql":
        cur.execute(
            f"CREATE TABLE {TABLE} (id BIGINT AUTO_INCREMENT PRIMARY KEY, state SMALLINT NOT NULL DEFAULT 0, n INT NOT NULL) ENGINE=InnoDB"
        )
    else:
        cur.execute(
            f"CREATE TABLE {TABLE} (id BIGSERIAL PRIMARY KEY, state SMALLINT NOT NULL DEFAULT 0, n INT NOT NULL)"
        )
    # The claim order's index: ready rows by id.
    cur.execute(f"CREATE INDEX {TABLE}_ready ON {TABLE} (state, id)")
    if vendor == "sqlite":
        cur.execute("BEGIN")
    put_many(conn, vendor, range(jobs))
    conn.commit() if vendor != "sqlite" else cur.execute("COMMIT")
    conn.close()


def put_many(conn, vendor: str, ns) -> None:
    mark = "?" if vendor == "sqlite" else "%s"
    ns = list(ns)
    cur = conn.cursor()
    for start in range(0, len(ns), 5000):
        chunk = ns[start : start + 5000]
        cur.execute(f"INSERT INTO {TABLE} (n) VALUES " + ",".join(f"({mark})" for _ in chunk), chunk)


def work_once(conn, vendor: str, batch: int) -> int:
    """Claim up to ``batch`` jobs, run them, acknowledge them; return how many."""
    cur = conn.cursor()
    mark = "?" if vendor == "sqlite" else "%s"
    try:
        if vendor == "sqlite":
            cur.execute("BEGIN IMMEDIATE")
            cur.execute(f"SELECT id, n FROM {TABLE} WHERE state = 0 ORDER BY id LIMIT ?", (batch,))
        else:
            cur.execute(
                f"SELECT id, n FROM {TABLE} WHERE state = 0 ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED",
                (batch,),
            )
        rows = cur.fetchall()
        if rows:
            cur.execute(
                f"UPDATE {TABLE} SET state = 1 WHERE id IN ({','.join(mark for _ in rows)})",
                [r[0] for r in rows],
            )
        cur.execute("COMMIT") if vendor == "sqlite" else conn.commit()
    except Exception as error:
        # A deadlock (MariaDB) or a busy database: nothing was claimed, try again.
        if "deadlock" not in str(error).lower() and "locked" not in str(error).lower():
            raise
        cur.execute("ROLLBACK") if vendor == "sqlite" else conn.rollback()
        return 1
    if not rows:
        return 0
    for _, n in rows:
        record(n)
    if vendor == "sqlite":
        cur.execute("BEGIN IMMEDIATE")
    cur.execute(f"DELETE FROM {TABLE} WHERE id IN ({','.join(mark for _ in rows)})", [r[0] for r in rows])
    cur.execute("COMMIT") if vendor == "sqlite" else conn.commit()
    return len(rows)


def worker(url: str, batch: int, stop_when_empty: bool, stop_file: str | None) -> None:
    vendor = db_vendor(url)
    conn = connect(url)
    while True:
        if work_once(conn, vendor, batch):
            continue
        if stop_when_empty or (stop_file and os.path.exists(stop_file)):
            break
        time.sleep(0.005)
    conn.close()


def drain(url: str, jobs: int, processes: int, batch: int, record_dir: str) -> dict:
    setup(url, jobs)
    os.environ[RECORD_DIR_ENV] = str(fresh_dir(record_dir))
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=worker, args=(url, batch, True, None)) for _ in range(processes)]
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
        "jobs": jobs,
        **check_once(records, range(jobs)),
    }


def latency(url: str, samples: int, gap: float, record_dir: str) -> dict:
    setup(url, 0)
    os.environ[RECORD_DIR_ENV] = str(fresh_dir(record_dir))
    stop_file = str(Path(record_dir) / "stop")
    Path(stop_file).unlink(missing_ok=True)
    ctx = multiprocessing.get_context("fork")
    proc = ctx.Process(target=worker, args=(url, 1, False, stop_file))
    vendor = db_vendor(url)
    conn = connect(url)

    def put(n: int) -> None:
        if vendor == "sqlite":
            conn.cursor().execute("BEGIN IMMEDIATE")
        put_many(conn, vendor, [n])
        conn.commit() if vendor != "sqlite" else conn.cursor().execute("COMMIT")

    proc.start()
    try:
        time.sleep(1.0)
        idle = idle_cost(url, 3.0)
        put_times = spaced_puts(put, samples, gap)
        wait_for_records(record_dir, samples, timeout=30)
    finally:
        Path(stop_file).touch()
        proc.join(30)
        if proc.is_alive():
            proc.kill()
    records = read_records(record_dir)
    return {**latencies(records, put_times), "idle": idle, **check_once(records, range(samples))}


def enqueue(url: str, jobs: int) -> dict:
    """One single-row INSERT per job in autocommit, as a web request's enqueue would send it:
    one statement and one durable commit per call, the limit for any enqueue that returns
    only once its job is stored (no Python framework at all)."""
    setup(url, 0)
    vendor = db_vendor(url)
    conn = connect(url)
    if vendor == "mysql":
        conn.autocommit(True)
    elif vendor == "postgres":
        conn.autocommit = True
    # SQLite: the connection has no implicit transactions (isolation_level=None).
    cur = conn.cursor()
    mark = "?" if vendor == "sqlite" else "%s"
    sql = f"INSERT INTO {TABLE} (n) VALUES ({mark})"
    started = time.perf_counter()
    for n in range(jobs):
        cur.execute(sql, [n])
    rate = jobs / (time.perf_counter() - started)
    cur.execute(f"SELECT COUNT(*) FROM {TABLE}")
    stored = cur.fetchone()[0]
    conn.close()
    return {"rate": rate, "exactly_once": stored == jobs}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("scenario", choices=["drain", "latency", "enqueue"])
    parser.add_argument("--url", default="sqlite:////tmp/bench_raw.sqlite3")
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--samples", type=int, default=50)
    parser.add_argument("--gap", type=float, default=0.2)
    parser.add_argument("--record-dir", default="/tmp/bench_records_raw")
    args = parser.parse_args()
    if args.scenario == "drain":
        result = drain(args.url, args.jobs, args.processes, args.batch, args.record_dir)
    elif args.scenario == "enqueue":
        result = enqueue(args.url, args.jobs)
    else:
        result = latency(args.url, args.samples, args.gap, args.record_dir)
    emit({"system": "raw", "scenario": args.scenario, **vars(args), **result})


if __name__ == "__main__":
    main()
