"""What a second row costs an enqueue: one durable INSERT against two in one transaction.

    bench/.venvs/taskloop/bin/python bench/profile_two_rows.py [--n 300] [--rounds 7]

A Django Task's ``enqueue()`` writes two rows (the result record and the tube's task), all
or nothing; django-tasks-db's writes one. This times, with the bare drivers and no Python
above them, on MariaDB (``BENCH_MYSQL``, default ``mysql://root@127.0.0.1:3306``) and
PostgreSQL (``BENCH_POSTGRES``, default the local server), each in database
``bench_taskloop`` (a scratch table ``two_rows`` is made and dropped):

- ``one INSERT``: one single-row INSERT in autocommit (the floor of any one-row enqueue);
- ``two INSERTs, one transaction``: as Django's ``atomic()`` sends them (on MariaDB
  ``SET autocommit=0`` … ``COMMIT``, ``SET autocommit=1``; on PostgreSQL ``BEGIN`` … ``COMMIT``);
- ``… BEGIN/COMMIT`` (MariaDB): the same without switching autocommit off and on;
- ``two INSERTs, one statement`` (PostgreSQL): one ``WITH`` statement, as our enqueue sends;
- ``two INSERTs in autocommit``: two durable commits, for scale.

Variants interleave round by round; it prints the median µs per call (min–max), the
client CPU per call and the load average.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from urllib.parse import urlparse

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import interleave, print_interleaved  # noqa: E402


def mysql_variants(url: str):
    import MySQLdb

    parts = urlparse(url)
    conn = MySQLdb.connect(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 3306,
        user=parts.username or "root",
        passwd=parts.password or "",
        db="bench_taskloop",
    )
    conn.autocommit(True)
    cur = conn.cursor()
    cur.execute("DROP TABLE IF EXISTS two_rows")
    cur.execute("CREATE TABLE two_rows (id BIGINT AUTO_INCREMENT PRIMARY KEY, n INT NOT NULL)")
    insert = "INSERT INTO two_rows (n) VALUES (%s)"

    def toggles() -> None:
        conn.autocommit(False)
        cur.execute(insert, [1])
        cur.execute(insert, [2])
        conn.commit()
        conn.autocommit(True)

    def begin() -> None:
        cur.execute("BEGIN")
        cur.execute(insert, [1])
        cur.execute(insert, [2])
        conn.commit()

    variants = {
        "one INSERT": lambda: cur.execute(insert, [1]),
        "two INSERTs, one transaction": toggles,
        "… BEGIN/COMMIT": begin,
        "two INSERTs in autocommit": lambda: (cur.execute(insert, [1]), cur.execute(insert, [2])),
    }
    return variants, lambda: cur.execute("DROP TABLE two_rows")


def postgres_variants(url: str):
    import psycopg

    conn = psycopg.connect(url, dbname="bench_taskloop", autocommit=True)
    cur = conn.cursor()
    cur.execute("DROP TABLE IF EXISTS two_rows")
    cur.execute("CREATE TABLE two_rows (id BIGSERIAL PRIMARY KEY, n INT NOT NULL)")
    insert = "INSERT INTO two_rows (n) VALUES (%s)"

    def transaction() -> None:
        with conn.transaction():
            cur.execute(insert, [1])
            cur.execute(insert, [2])

    both = "WITH a AS (INSERT INTO two_rows (n) VALUES (%s) RETURNING id) INSERT INTO two_rows (n) SELECT %s FROM a"
    variants = {
        "one INSERT": lambda: cur.execute(insert, [1]),
        "two INSERTs, one transaction": transaction,
        "two INSERTs, one statement": lambda: cur.execute(both, [1, 2]),
        "two INSERTs in autocommit": lambda: (cur.execute(insert, [1]), cur.execute(insert, [2])),
    }
    return variants, lambda: cur.execute("DROP TABLE two_rows")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    servers = [
        ("MariaDB", mysql_variants, os.environ.get("BENCH_MYSQL", "mysql://root@127.0.0.1:3306")),
        ("PostgreSQL", postgres_variants, os.environ.get("BENCH_POSTGRES", "postgres://")),
    ]
    for name, make, url in servers:
        variants, drop = make(url)
        try:
            print(f"{name}:")
            print_interleaved(*interleave(variants, args.n, args.rounds))
            print()
        finally:
            drop()


if __name__ == "__main__":
    main()
