"""Where one ``put`` outside a transaction spends its time, against raw SQL, on one connection.

    DATABASE_URL=postgres:///bench_taskloop python bench/profile_put.py [--n 300] [--rounds 7]

Each variant runs ``--n`` times per round, the variants interleaved round by round (so a
noisy minute hurts them all alike); it prints the median µs per call over the rounds and the
load average, and the client CPU (user + system) per call, which CI or other load
hardly moves. Variants (each one autocommitted statement per call):

- ``put``: ``tube.put(n)``.
- ``put's statement, Django cursor``: the exact SQL and parameters a put sends, through
  ``connection.cursor()``.
- ``put's statement, driver``: the same through the driver's own cursor (no Django).
- ``… without the NOTIFY`` / ``… without RETURNING``: the INSERT alone (PostgreSQL).
- ``… prepared`` (PostgreSQL): the put's statement as a server-side prepared statement.
- ``raw one-column INSERT``: raw SQL's enqueue row (``raw_put``: id, state, n).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE / "project"), str(HERE.parent), str(HERE)]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")
os.environ.setdefault("BENCH_RECORD_DIR", "/tmp")

import django  # noqa: E402

django.setup()

import scenarios  # noqa: E402
from django.db import connection  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    tube = scenarios.empty_tube()
    sql, params = scenarios.put_statement(tube)
    vendor = connection.vendor
    connection.ensure_connection()
    raw = connection.connection
    mark = "?" if vendor == "sqlite" else "%s"
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS raw_put")
        key = {"sqlite": "INTEGER PRIMARY KEY AUTOINCREMENT", "mysql": "BIGINT AUTO_INCREMENT PRIMARY KEY"}
        cursor.execute(
            f"CREATE TABLE raw_put (id {key.get(vendor, 'BIGSERIAL PRIMARY KEY')}, "
            "state SMALLINT NOT NULL DEFAULT 0, n INT NOT NULL)"
        )
        cursor.execute("CREATE INDEX raw_put_ready ON raw_put (state, id)")
    print(f"{vendor}: a put sends\n  {sql}\n  {params}\n")

    def put(n: int) -> None:
        tube.put(n)

    def django_cursor(n: int) -> None:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            cursor.fetchall()

    driver_sql = sql.replace("%s", "?") if vendor == "sqlite" else sql
    cursor = raw.cursor()

    def driver(n: int) -> None:
        cursor.execute(driver_sql, params)
        cursor.fetchall()

    def raw_insert(n: int) -> None:
        cursor.execute(f"INSERT INTO raw_put (n) VALUES ({mark})", [n])

    variants = {
        "put": put,
        "put's statement, Django cursor": django_cursor,
        "put's statement, driver": driver,
    }
    if vendor == "postgresql":
        import psycopg

        inner = sql[sql.index("(") + 1 : sql.rindex(") SELECT changed.*")] if sql.startswith("WITH") else sql
        inner_params = params[:-1] if sql.startswith("WITH") else params
        bare = inner[: inner.index(" RETURNING ")]
        server = psycopg.Cursor(raw)

        def no_notify(n: int) -> None:
            cursor.execute(inner, inner_params)
            cursor.fetchall()

        def no_returning(n: int) -> None:
            cursor.execute(bare, inner_params)

        def prepared(n: int) -> None:
            server.execute(sql, params, prepare=True)
            server.fetchall()

        def prepared_no_notify(n: int) -> None:
            server.execute(inner, inner_params, prepare=True)
            server.fetchall()

        variants.update(
            {
                "… without the NOTIFY": no_notify,
                "… without RETURNING either": no_returning,
                "… prepared": prepared,
                "… prepared, without the NOTIFY": prepared_no_notify,
            }
        )
    variants["raw one-column INSERT"] = raw_insert
    times: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, call in variants.items():
            started, cpu_started = time.perf_counter(), time.process_time()
            for n in range(args.n):
                call(n)
            times[name].append((time.perf_counter() - started) / args.n * 1e6)
            cpu[name].append((time.process_time() - cpu_started) / args.n * 1e6)
        tube.truncate()
    load = os.getloadavg()
    width = max(map(len, variants))
    print(f"{'':<{width}}  wall µs per call (range)   client CPU µs")
    for name, values in times.items():
        print(
            f"{name:<{width}}  {statistics.median(values):7.0f} ({min(values):.0f}–{max(values):.0f})"
            f"  {statistics.median(cpu[name]):10.0f}"
        )
    print(f"\nload average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE raw_put")


if __name__ == "__main__":
    main()
