"""What a worker's statements read while a transaction is held open elsewhere (PostgreSQL).

    DATABASE_URL=postgres:///bench_taskloop bench/.venvs/taskloop/bin/python bench/held_horizon_statements.py [--tasks 300000] [--churn 100000]

Puts ``--tasks`` tasks into a ``fifottl`` tube, opens a REPEATABLE READ transaction in another
connection (what a long report or ``pg_dump`` does), takes and acknowledges ``--churn`` tasks
in batches of 100 as a worker does, then prints ``EXPLAIN (ANALYZE, BUFFERS)`` of each
statement shape below, before and after issue 30's change, each in a rolled-back transaction:

- the settle (a batch's acknowledgement): the tube's filter and the keys, against the keys
  with the filter checked on the rows (``(…) IS TRUE``, which no index serves);
- the once-a-second look for a dead consumer's tasks: one statement over the taken tasks,
  against a read of the consumers alone (the taken tasks are looked at only if one is dead).

The churn leaves the claim index full of entries of rows that the held transaction may still
see; buffer counts do not depend on the machine's load, timings do (the load average is printed).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("BENCH_RECORD_DIR", "/tmp")

import scenarios  # noqa: E402,F401  (sets Django up with the bench project)
from django.db import connection, connections  # noqa: E402

from django_taskloop.models import Consumer, Tube  # noqa: E402


def shapes(tube: Tube, ids: list[int]) -> dict[str, str]:
    keys = "'{" + ",".join(map(str, ids)) + "}'::bigint[]"
    held = (
        f"tube_id = {tube.pk} AND owner = 'w1' AND state = 't' "
        "AND (event_at IS NULL OR event_at > statement_timestamp())"
    )
    dead = "SELECT name FROM taskloop_consumer WHERE last_seen < now() - interval '60 s'"
    return {
        "settle, before: filter and keys": f"DELETE FROM taskloop_task WHERE ({held}) AND id = ANY({keys})",
        "settle, now: keys, then (filter) IS TRUE": (
            f"DELETE FROM taskloop_task WHERE id = ANY({keys}) AND ({held}) IS TRUE"
        ),
        "dead-consumer look, before": (
            f"SELECT 1 FROM taskloop_task WHERE tube_id = {tube.pk} AND state = 't' "
            f"AND owner IN ({dead}) LIMIT 1"
        ),
        "dead-consumer look, now: consumers only": f"{dead} LIMIT 1001",
        "idle poll's look, now: consumers first": (
            f"SELECT CASE WHEN EXISTS({dead}) AND EXISTS(SELECT 1 FROM taskloop_task "
            f"WHERE tube_id = {tube.pk} AND state = 't' AND owner IN ({dead})) THEN 'due' ELSE '' END"
        ),
    }


def explain(sql: str) -> tuple[str, str, str]:
    """Return (execution ms, the top node's buffers, the indexes used) of ``sql``, rolled back."""
    with connection.cursor() as cursor:
        cursor.execute("BEGIN")
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}")
        plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("ROLLBACK")
    buffers = next((line.strip() for line in plan.splitlines() if "Buffers:" in line), "")
    found = re.search(r"Execution Time: ([\d.]+)", plan)
    return (found.group(1) if found else "?"), buffers, ",".join(re.findall(r"using (\w+)", plan)) or "-"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", type=int, default=300_000)
    parser.add_argument("--churn", type=int, default=100_000)
    args = parser.parse_args()
    if connection.vendor != "postgresql":
        raise SystemExit("PostgreSQL only: set DATABASE_URL=postgres:///bench_taskloop")
    tube = Tube.objects.filter(name="held-horizon").first() or Tube.objects.create_tube(
        "held-horizon", "fifottl"
    )
    tube.truncate()
    Consumer.objects.all().delete()  # no dead consumer left by earlier runs: the usual case
    for _ in range(0, args.tasks, 10_000):
        tube.put_many(list(range(10_000)))
    other = connections.create_connection("default")
    other.set_autocommit(False)
    with other.cursor() as cursor:
        cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        cursor.execute("SELECT count(*) FROM taskloop_tube")
        cursor.fetchall()
    try:
        batch = tube.take_many(100, consumer="w1")
        for _ in range(args.churn // 100):
            _, batch = tube.ack_and_take([task.pk for task in batch], 100, consumer="w1")
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE taskloop_task")
        print(
            f"{args.tasks:,} tasks put, {args.churn:,} taken and acknowledged with a transaction held open:\n"
        )
        for name, sql in shapes(tube, [task.pk for task in batch]).items():
            ms, buffers, indexes = explain(sql)
            print(f"  {name:42} {ms:>9} ms  {buffers:28} index: {indexes}")
    finally:
        other.rollback()
        other.close()
    print("\nload average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
