"""Where one Django Task ``enqueue()`` spends its time, against its own statement.

    DATABASE_URL=postgres:///bench_taskloop bench/.venvs/taskloop/bin/python bench/profile_enqueue.py [--n 300] [--rounds 5]

Prints the statements one ``enqueue()`` sends (through the bench project's ``noop_task``),
then, interleaved round by round on one connection, the median µs per call (min–max) of:

- ``enqueue()``;
- ``its statement, driver`` (PostgreSQL, where it is one statement): the exact SQL and
  parameters an enqueue sends, through the driver's own cursor (a fresh result id each time);
- ``… without the NOTIFY`` (PostgreSQL).

``bench/profile_two_rows.py`` gives the floor under any enqueue that writes two rows.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE / "project"), str(HERE.parent), str(HERE)]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")
os.environ.setdefault("BENCH_RECORD_DIR", "/tmp")

import django  # noqa: E402

django.setup()

from benchapp.taskloop import noop_task  # noqa: E402
from django.db import connection  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    noop_task.enqueue(-1)  # the first enqueue of a process makes the queue's tube
    seen: list[tuple[str, list]] = []

    def spy(execute, sql, params, many, context):
        seen.append((sql, list(params or [])))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(spy):
        noop_task.enqueue(-1)
    print(f"{connection.vendor}: an enqueue sends")
    for sql, params in seen:
        print(f"  {sql}\n  {params}")
    print()
    variants = {"enqueue()": lambda: noop_task.enqueue(1)}
    if connection.vendor == "postgresql" and len(seen) == 1:
        ((sql, params),) = seen
        cursor = connection.connection.cursor()

        def statement() -> None:
            cursor.execute(sql, [uuid.uuid4().hex, *params[1:]])
            cursor.fetchall()

        cut = sql.rindex(", (SELECT pg_notify")
        quiet = sql[:cut] + sql[sql.rindex(" FROM ") :]

        def no_notify() -> None:
            cursor.execute(quiet, [uuid.uuid4().hex, *params[1:-1]])
            cursor.fetchall()

        variants["its statement, driver"] = statement
        variants["… without the NOTIFY"] = no_notify
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, call in variants.items():
            started = time.perf_counter()
            for _ in range(args.n):
                call()
            times[name].append((time.perf_counter() - started) / args.n * 1e6)
    load = os.getloadavg()
    width = max(map(len, variants))
    for name, values in times.items():
        print(f"{name:<{width}}  {statistics.median(values):6.0f} ({min(values):.0f}–{max(values):.0f}) µs")
    print(f"\nload average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()
