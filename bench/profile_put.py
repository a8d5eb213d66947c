"""Where one ``put`` outside a transaction spends its time, against raw SQL, on one connection.

    DATABASE_URL=postgres:///bench_taskloop python bench/profile_put.py [--n 300] [--rounds 7]

Each variant runs ``--n`` times per round, the variants interleaved round by round (so a
noisy minute hurts them all alike); it prints the median µs per call over the rounds and the
load average, and the client CPU (user + system) per call, which CI or other load
hardly moves. Variants (each one autocommitted statement per call):

- ``put``: ``tube.put(1)``.
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
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("BENCH_RECORD_DIR", "/tmp")

import scenarios  # noqa: E402  (sets Django up with the bench project)
from common import interleave, print_interleaved  # noqa: E402
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

    def put() -> None:
        tube.put(1)

    def django_cursor() -> None:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            cursor.fetchall()

    driver_sql = sql.replace("%s", "?") if vendor == "sqlite" else sql
    cursor = raw.cursor()

    def driver() -> None:
        cursor.execute(driver_sql, params)
        cursor.fetchall()

    def raw_insert() -> None:
        cursor.execute(f"INSERT INTO raw_put (n) VALUES ({mark})", [1])

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

        def no_notify() -> None:
            cursor.execute(inner, inner_params)
            cursor.fetchall()

        def no_returning() -> None:
            cursor.execute(bare, inner_params)

        def prepared() -> None:
            server.execute(sql, params, prepare=True)
            server.fetchall()

        def prepared_no_notify() -> None:
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
    wall, cpu = interleave(variants, args.n, args.rounds, after_round=tube.truncate)
    print_interleaved(wall, cpu)
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE raw_put")


if __name__ == "__main__":
    main()
