"""Where one Django Task ``enqueue()`` spends its time, against its own statement.

    DATABASE_URL=postgres:///bench_taskloop bench/.venvs/taskloop/bin/python bench/profile_enqueue.py [--n 300] [--rounds 5]

Prints the statements one ``enqueue()`` sends (through the bench project's ``noop_task``),
then, interleaved round by round on one connection, the median µs per call (min–max) and
the client CPU per call of:

- ``enqueue()``;
- ``its statement, driver`` (PostgreSQL, where it is one statement): the exact SQL and
  parameters an enqueue sends, through the driver's own cursor (a fresh result id each time);
- ``… without the NOTIFY`` (PostgreSQL).

``bench/profile_two_rows.py`` gives the floor under any enqueue that writes two rows.
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("BENCH_RECORD_DIR", "/tmp")

import scenarios  # noqa: E402  (sets Django up with the bench project)
from benchapp.taskloop import noop_task  # noqa: E402
from common import interleave, print_interleaved  # noqa: E402
from django.db import connection  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    noop_task.enqueue(-1)  # the first enqueue of a process makes the queue's tube
    seen = scenarios.statements_of(lambda: noop_task.enqueue(-1))
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
    wall, cpu = interleave(variants, args.n, args.rounds)
    print_interleaved(wall, cpu)


if __name__ == "__main__":
    main()
