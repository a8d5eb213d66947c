"""What every benchmarked system shares: the job record, the exactly-once check, the numbers.

Standard library only: this module is imported from every benchmark virtualenv (ours, the
peers', the raw baseline's).

Every no-op job carries an integer ``n``. The handler's only work is :func:`record`: one line
``"<n> <unix time>"`` appended to a file of its own process. The harness then reads every
line back, checks that each expected ``n`` appears exactly once, and measures the drain rate
from the first to the last handler start (so process start-up, which differs between
systems, does not count) and the pickup latency (put time → handler start).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

RECORD_DIR_ENV = "BENCH_RECORD_DIR"

_record_file = None
_record_pid = None


def record(n: int) -> None:
    """Note that job ``n`` started now, in this process's record file."""
    global _record_file, _record_pid
    pid = os.getpid()
    if _record_file is None or _record_pid != pid:
        # A forked child must not write through its parent's buffer.
        directory = os.environ[RECORD_DIR_ENV]
        _record_file = open(Path(directory) / f"{pid}.log", "a", buffering=1)  # noqa: SIM115
        _record_pid = pid
    _record_file.write(f"{n} {time.time():.6f}\n")


def read_records(directory: str | Path) -> list[tuple[int, float]]:
    """Return every ``(n, time)`` recorded under ``directory``."""
    out = []
    for path in Path(directory).glob("*.log"):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2:
                out.append((int(parts[0]), float(parts[1])))
    return out


def count_records(directory: str | Path) -> int:
    """Return how many job starts are recorded under ``directory`` (cheap: counts lines)."""
    total = 0
    for path in Path(directory).glob("*.log"):
        with open(path, "rb") as f:
            total += f.read().count(b"\n")
    return total


def wait_for_records(directory: str | Path, count: int, timeout: float, poll: float = 0.05) -> bool:
    """Wait until ``count`` job starts are recorded; return whether they were in time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if count_records(directory) >= count:
            return True
        time.sleep(poll)
    return count_records(directory) >= count


def fresh_dir(path: str | Path) -> Path:
    """Return ``path`` as an empty directory."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    for old in path.glob("*.log"):
        old.unlink()
    return path


def check_once(records: list[tuple[int, float]], expected: Iterable[int]) -> dict:
    """Check that every expected job ran exactly once; return what was found."""
    expected = set(expected)
    seen = Counter(n for n, _ in records)
    missing = len(expected - set(seen))
    twice = sum(1 for n, c in seen.items() if c > 1)
    stray = len(set(seen) - expected)
    return {
        "exactly_once": not (missing or twice or stray),
        "missing": missing,
        "twice": twice,
        "stray": stray,
    }


def most_at_once(starts: list[float], seconds: float) -> int:
    """The most items running at one moment, each running ``seconds`` from its start (an end
    before a start at the same instant)."""
    events = sorted([(at, 1) for at in starts] + [(at + seconds, 0) for at in starts])
    running = most = 0
    for _at, begins in events:
        running += 1 if begins else -1
        most = max(most, running)
    return most


def drain_rate(records: list[tuple[int, float]]) -> float:
    """Return jobs per second between the first and the last handler start."""
    times = sorted(t for _, t in records)
    if len(times) < 2 or times[-1] <= times[0]:
        return 0.0
    return (len(times) - 1) / (times[-1] - times[0])


def percentile(values: list[float], p: float) -> float:
    """Return the ``p``-th percentile (0–100) of ``values``, nearest rank."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))
    return ordered[k]


def latencies(records: list[tuple[int, float]], put_times: dict[int, float]) -> dict:
    """Return pickup latency (put → handler start) in milliseconds: median, p95, count."""
    first = {}
    for n, t in records:
        first.setdefault(n, t)
    values = [(first[n] - put_times[n]) * 1000 for n in put_times if n in first]
    return {
        "median_ms": statistics.median(values) if values else float("nan"),
        "p95_ms": percentile(values, 95),
        "samples": len(values),
    }


def spaced_puts(put, count: int, gap: float) -> dict[int, float]:
    """Call ``put(n)`` ``count`` times, ``gap`` seconds apart (so the worker goes idle)."""
    times = {}
    for n in range(count):
        time.sleep(gap)
        times[n] = time.time()
        put(n)
    return times


def db_vendor(url: str) -> str:
    """Return ``"sqlite"``, ``"mysql"`` or ``"postgres"`` for a database URL ('' = SQLite)."""
    if not url or url.startswith("sqlite"):
        return "sqlite"
    scheme = urlparse(url).scheme
    return "mysql" if scheme.startswith(("mysql", "mariadb")) else "postgres"


def mysql_connect(url: str, *, autocommit: bool = False, isolation: str = "READ COMMITTED") -> Any:
    """A MySQLdb connection to ``url`` (``mysql://user[:password]@host:port/database``).
    READ COMMITTED by default, as Django uses: REPEATABLE READ's gap locks deadlock claims."""
    import MySQLdb

    parts = urlparse(url)
    return MySQLdb.connect(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 3306,
        user=unquote(parts.username or "root"),
        passwd=unquote(parts.password or ""),
        db=parts.path.lstrip("/"),
        autocommit=autocommit,
        init_command=f"SET SESSION TRANSACTION ISOLATION LEVEL {isolation}",
    )


def emit(result: dict) -> None:
    """Print one result for the harness: a single JSON line marked ``BENCH``."""
    sys.stdout.write("BENCH " + json.dumps(result) + "\n")
    sys.stdout.flush()


def idle_cost(url: str, seconds: float) -> dict | None:
    """Return what the database did for database ``url`` per second while the worker idled.

    PostgreSQL: ``pg_stat_database`` of that database alone: transactions, sessions opened and
    rows read per second. MariaDB/MySQL: ``SHOW GLOBAL STATUS`` deltas (``Questions``,
    ``Com_commit``, ``Connections``): the server counts for every client, so run it on a quiet
    server. Our own reads are subtracted. SQLite: ``None`` (no server to ask).
    """
    vendor = db_vendor(url)
    if vendor == "postgres":
        return _idle_cost_postgres(url, seconds)
    if vendor == "mysql":
        return _idle_cost_mysql(url, seconds)
    return None


def _idle_cost_postgres(url: str, seconds: float) -> dict:
    import psycopg

    name = urlparse(url).path.lstrip("/")

    def read() -> tuple[int, int, int]:
        with psycopg.connect(
            url.replace("postgres://", "postgresql://", 1).split("?")[0].rsplit("/", 1)[0] + "/postgres",
            autocommit=True,
        ) as conn:
            # The statistics snapshot is per transaction: autocommit gives a fresh one.
            conn.execute("SELECT pg_stat_clear_snapshot()")
            row = conn.execute(
                "SELECT xact_commit + xact_rollback, sessions, tup_returned + tup_fetched FROM pg_stat_database WHERE datname = %s",
                [name],
            ).fetchone()
        return row

    before = read()
    time.sleep(seconds)
    after = read()
    return {
        "xacts_per_s": (after[0] - before[0]) / seconds,
        "sessions_per_s": (after[1] - before[1]) / seconds,
        "rows_per_s": (after[2] - before[2]) / seconds,
    }


def _idle_cost_mysql(url: str, seconds: float) -> dict:
    import MySQLdb

    parts = urlparse(url)
    params = {"host": parts.hostname or "localhost", "user": parts.username or "root"}
    if parts.port:
        params["port"] = parts.port
    if parts.password:
        params["password"] = parts.password
    names = ("Questions", "Com_commit", "Connections")

    def read() -> dict[str, int]:
        conn = MySQLdb.connect(**params)
        try:
            cursor = conn.cursor()
            cursor.execute(
                "SHOW GLOBAL STATUS WHERE Variable_name IN (%s, %s, %s)",
                names,
            )
            return {name: int(value) for name, value in cursor.fetchall()}
        finally:
            conn.close()

    before = read()
    time.sleep(seconds)
    after = read()
    # Our second connection and its one statement count too.
    return {
        "queries_per_s": (after["Questions"] - before["Questions"] - 1) / seconds,
        "commits_per_s": (after["Com_commit"] - before["Com_commit"]) / seconds,
        "sessions_per_s": (after["Connections"] - before["Connections"] - 1) / seconds,
    }


def children_cpu() -> float:
    """Return the user + system CPU seconds of this process's waited-for children so far
    (each with its own waited-for descendants: a supervisor's worker processes count)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def interleave(
    variants: dict, n: int, rounds: int, after_round=None
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Time each of ``variants`` (name → a call taking no argument) ``n`` times per round,
    the variants interleaved round by round so that a noisy minute hurts them all alike;
    ``after_round()``, if given, runs after each round, untimed. Returns the wall and the
    client CPU (user + system) µs per call, a list per variant."""
    wall: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, call in variants.items():
            started, cpu_started = time.perf_counter(), time.process_time()
            for _ in range(n):
                call()
            wall[name].append((time.perf_counter() - started) / n * 1e6)
            cpu[name].append((time.process_time() - cpu_started) / n * 1e6)
        if after_round is not None:
            after_round()
    return wall, cpu


def print_interleaved(wall: dict[str, list[float]], cpu: dict[str, list[float]] | None = None) -> None:
    """Print :func:`interleave`'s medians (min–max) per variant, then the load average."""
    load = os.getloadavg()
    width = max(map(len, wall))
    print(f"{'':<{width}}  wall µs per call (range)" + ("   client CPU µs" if cpu else ""))
    for name, values in wall.items():
        line = f"{name:<{width}}  {statistics.median(values):7.0f} ({min(values):.0f}–{max(values):.0f})"
        print(line + (f"  {statistics.median(cpu[name]):10.0f}" if cpu else ""))
    print(f"\nload average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
