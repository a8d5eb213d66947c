"""Issue 30's three scenarios on PostgreSQL or MariaDB, ours beside a raw SKIP LOCKED queue.

    .venv/bin/python bench/held_horizon.py                      # a throwaway PostgreSQL 15
    .venv/bin/python bench/held_horizon.py --vendor mariadb     # a throwaway MariaDB
    .venv/bin/python bench/held_horizon.py --server postgres:///bench_taskloop
    .venv/bin/python bench/held_horizon.py --server mysql://root@127.0.0.1:3306/bench_taskloop
    .venv/bin/python bench/held_horizon.py --steady-minutes 1 --held-before 0.5 \\
        --held-minutes 1 --backlog 100000 --segment 10000      # a quick try

Without ``--server`` it starts a private server, by ``--vendor``: PostgreSQL 15 (the default;
``initdb`` into a temporary directory as the ``postgres`` user, default settings, autovacuum
on) or MariaDB (``mariadb-install-db`` into a temporary directory, ``mariadbd`` as root with
default settings: InnoDB, REPEATABLE READ), on a free port of 127.0.0.1, and removes it at the
end, also on Ctrl-C. With ``--server``, the URL's scheme (``postgres://`` or ``mysql://``) says
which. Systems, one after the other per scenario:

- ``ours``: a ``fifo`` tube ``horizon`` drained by ``manage.py workers --processes 2`` (the
  command, run by this script with a no-op ``@tube("horizon", type="fifo", batch=100)``);
- ``raw``: a table ``raw_horizon`` drained by 2 processes that each loop over, on PostgreSQL,
  ``DELETE … WHERE id = ANY(ARRAY(SELECT id … ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED))
  RETURNING n``; on MariaDB (READ COMMITTED, as Django's connections), ``SELECT id, n … ORDER
  BY id LIMIT 100 FOR UPDATE SKIP LOCKED`` then ``DELETE … WHERE id IN (…)`` in one
  transaction (deleted and committed before its no-ops run).

A producer process puts at ``--rate`` tasks/s (default: half of what 2 of our workers drain,
measured first on 50,000 tasks), in one ``put_many`` (raw: one INSERT) every 20 ms. Scenarios:

1. ``steady``: steady churn for ``--steady-minutes`` (8);
2. ``held``: churn; after ``--held-before`` minutes (1) another connection opens a REPEATABLE
   READ transaction (MariaDB: ``START TRANSACTION WITH CONSISTENT SNAPSHOT``, which holds
   InnoDB's purge back) and runs a SELECT, keeps it for ``--held-minutes`` (5), then commits;
   measuring goes on until the backlog is back under a second's puts (at most
   ``--recover-minutes``, 10);
3. ``backlog``: ``--backlog`` tasks (1,000,000) put up front, then drained; the rate per
   ``--segment`` tasks (100,000) by handler start.

Every task's data is its number ``n``; the producer notes each batch's put time, each handler
start is recorded (``bench/common.py``), so pickup = handler start − put, and every task is
checked to have run exactly once. Every 15 s window prints the put and drain rates, the
backlog, pickup p50/p95 and the claim statement's p95 (the statements with ``SKIP LOCKED``, timed
in the consumer: ours by a Django execute wrapper); on MariaDB also InnoDB's purge backlog at
the window's end (the history list length, ``trx_rseg_history_len``). At the end, issue 30's
targets are judged for each system, with the load average at the start and the end.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PROJECT = HERE / "project"
sys.path[:0] = [str(PROJECT), str(HERE.parent), str(HERE)]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")

from common import (  # noqa: E402
    RECORD_DIR_ENV,
    count_records,
    drain_rate,
    mysql_connect,
    percentile,
    read_records,
    record,
)

PG_BIN = Path("/usr/lib/postgresql/15/bin")
WINDOW = 15.0
TICK = 0.02
BATCH = 100
RAW_TABLE = "raw_horizon"
TUBE = "horizon"
SYSTEMS = ("ours", "raw")
_children: list[subprocess.Popen | multiprocessing.process.BaseProcess] = []


# -- a throwaway server ----------------------------------------------------------------------


def _as_postgres(args: list[str]) -> None:
    done = subprocess.run(["runuser", "-u", "postgres", "--", *args], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(args[:1])} failed ({done.returncode}): {done.stderr or done.stdout}")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def throwaway_server(vendor: str, slow_log: str | None = None) -> Iterator[str]:
    """Start a private server of ``vendor`` with default settings; yield its database's URL.
    ``slow_log`` (PostgreSQL): log the plan of every statement of a second or more
    (``auto_explain``) and every autovacuum run, and copy the server's log there at the end."""
    with throwaway_mariadb() if vendor == "mariadb" else throwaway_postgres(slow_log) as url:
        yield url


@contextlib.contextmanager
def throwaway_postgres(slow_log: str | None = None) -> Iterator[str]:
    """Start a private PostgreSQL 15 with default settings; yield its ``bench_taskloop`` URL."""
    import psycopg

    directory = Path(tempfile.mkdtemp(prefix="held_horizon_pg_"))
    shutil.chown(directory, "postgres", "postgres")
    data, port = directory / "data", _free_port()
    try:
        _as_postgres([str(PG_BIN / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"])
        options = f"-p {port} -k {directory} -c listen_addresses=127.0.0.1"
        if slow_log:
            options += (
                # (Not log_analyze: it instruments every statement, and the queue stalls.)
                " -c session_preload_libraries=auto_explain -c auto_explain.log_min_duration=50ms"
                " -c log_lock_waits=on -c log_temp_files=0"
                " -c log_autovacuum_min_duration=0 -c track_activity_query_size=4096"
            )
        log = str(directory / "server.log")
        _as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(data), "-l", log, "-w", "-o", options, "start"])
        with psycopg.connect(f"postgres://postgres@127.0.0.1:{port}/postgres", autocommit=True) as conn:
            conn.execute("CREATE DATABASE bench_taskloop")
        print(f"throwaway PostgreSQL 15 on port {port} in {directory}", flush=True)
        yield f"postgres://postgres@127.0.0.1:{port}/bench_taskloop"
    finally:
        if (data / "postmaster.pid").exists():
            _as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"])
        if slow_log and (directory / "server.log").exists():
            shutil.copyfile(directory / "server.log", slow_log)
        shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def throwaway_mariadb() -> Iterator[str]:
    """Start a private MariaDB with default settings; yield its ``bench_taskloop`` URL."""
    directory = Path(tempfile.mkdtemp(prefix="held_horizon_mariadb_"))
    data, port, server = directory / "data", _free_port(), None
    try:
        install = ["mariadb-install-db", "--no-defaults", f"--datadir={data}", "--user=root"]
        done = subprocess.run([*install, "--skip-test-db"], capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"mariadb-install-db failed ({done.returncode}): {done.stderr or done.stdout}")
        server = start_mariadbd(directory, port)
        sql(f"mysql://root@127.0.0.1:{port}/mysql", "CREATE DATABASE bench_taskloop")
        print(f"throwaway MariaDB on port {port} in {directory}", flush=True)
        yield f"mysql://root@127.0.0.1:{port}/bench_taskloop"
    finally:
        if server is not None:
            stop_mariadbd(server)
        shutil.rmtree(directory, ignore_errors=True)


def start_mariadbd(directory: Path, port: int) -> subprocess.Popen:
    """Start ``mariadbd`` on ``directory``'s datadir (root, no passwords) and wait until it answers."""
    command = [
        "mariadbd",
        "--no-defaults",
        f"--datadir={directory / 'data'}",
        f"--port={port}",
        "--bind-address=127.0.0.1",
        f"--socket={directory / 'mysqld.sock'}",
        f"--pid-file={directory / 'mysqld.pid'}",
        f"--log-error={directory / 'server.log'}",
        "--user=root",
        "--skip-grant-tables",  # a throwaway server on 127.0.0.1: no passwords to manage
        "--skip-name-resolve",
    ]
    # A session of its own: Ctrl-C reaches this script, which then shuts the server down.
    server = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and server.poll() is None:
        with contextlib.suppress(Exception):
            sql(f"mysql://root@127.0.0.1:{port}/mysql", "SELECT 1")
            return server
        time.sleep(0.5)
    stop_mariadbd(server)
    log = (directory / "server.log").read_text(errors="replace")[-3000:]
    raise RuntimeError(f"mariadbd on port {port} did not start:\n{log}")


def stop_mariadbd(server: subprocess.Popen) -> None:
    """Shut ``mariadbd`` down (SIGTERM; SIGKILL after 60 s)."""
    if server.poll() is None:
        server.terminate()
    try:
        server.wait(60)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def setup_django(url: str) -> None:
    """Point the bench project at ``url`` and create its tables."""
    os.environ["DATABASE_URL"] = url
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", run_syncdb=True, verbosity=0)


def is_mariadb(url: str) -> bool:
    return url.startswith("mysql")


def sql(url: str, statement: str) -> list[tuple]:
    """Run one statement in autocommit on a connection of its own; return its rows."""
    if is_mariadb(url):
        conn = mysql_connect(url, autocommit=True)
        try:
            cursor = conn.cursor()
            cursor.execute(statement)
            return list(cursor.fetchall()) if cursor.description else []
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(statement)
        return cursor.fetchall() if cursor.description else []


def purge_backlog(url: str) -> int | None:
    """InnoDB's history list length (undo logs not purged yet); ``None`` on PostgreSQL."""
    if not is_mariadb(url):
        return None
    return sql(
        url, "SELECT count FROM information_schema.INNODB_METRICS WHERE name = 'trx_rseg_history_len'"
    )[0][0]


# -- the two systems: put, consume, reset ----------------------------------------------------


def reset(system: str, url: str) -> None:
    """Empty the system's queue: raw, a new table; ours, a new ``fifo`` tube, its table vacuumed
    (MariaDB: analyzed)."""
    if system == "raw":
        sql(url, f"DROP TABLE IF EXISTS {RAW_TABLE}")
        key = "BIGINT AUTO_INCREMENT PRIMARY KEY" if is_mariadb(url) else "BIGSERIAL PRIMARY KEY"
        sql(url, f"CREATE TABLE {RAW_TABLE} (id {key}, n BIGINT NOT NULL)")
        return
    from django.db import connections

    from django_taskloop.models import Tube

    old = Tube.objects.filter(name=TUBE).first()
    if old is not None:
        old.truncate()
        old.drop()
    Tube.objects.create_tube(TUBE, "fifo")
    connections.close_all()
    sql(url, "ANALYZE TABLE taskloop_task" if is_mariadb(url) else "VACUUM ANALYZE taskloop_task")


def putter(system: str, url: str) -> Callable[[int, int], None]:
    """Return ``put(first, count)``, which puts tasks ``first`` … ``first + count - 1``."""
    if system == "raw" and is_mariadb(url):
        cursor = mysql_connect(url, autocommit=True).cursor()
        # executemany: MySQLdb sends one multi-row INSERT.
        insert = f"INSERT INTO {RAW_TABLE} (n) VALUES (%s)"
        return lambda first, count: (
            cursor.executemany(insert, [(n,) for n in range(first, first + count)]) and None
        )
    if system == "raw":
        import psycopg

        conn = psycopg.connect(url, autocommit=True)
        insert = f"INSERT INTO {RAW_TABLE} (n) SELECT generate_series(%s::bigint, %s::bigint)"
        return lambda first, count: conn.execute(insert, [first, first + count - 1]) and None
    from django.db import connections

    from django_taskloop.models import Tube

    connections.close_all()
    tube = Tube.objects.get(name=TUBE)
    return lambda first, count: tube.put_many(range(first, first + count)) and None


def produce(
    system: str, url: str, rate: float, run_dir: Path, stop: multiprocessing.synchronize.Event
) -> None:
    """Put ``rate`` tasks/s until ``stop`` is set, noting ``first count time`` per batch."""
    put = putter(system, url)
    started, sent = time.time(), 0
    with open(run_dir / "puts.txt", "a", buffering=1) as notes:
        while not stop.is_set():
            now = time.time()
            due = int(rate * (now - started)) - sent
            if due > 0:
                # Noted before the put: a handler start is never read before its put time.
                notes.write(f"{sent} {due} {now:.6f}\n")
                put(sent, due)
                sent += due
            time.sleep(max(0.0, TICK - (time.time() - now)))


def put_up_front(system: str, url: str, count: int, run_dir: Path) -> None:
    """Put ``count`` tasks in chunks of 10,000 (ours: ``put_many``; raw: one INSERT each)."""
    put = putter(system, url)
    with open(run_dir / "puts.txt", "a", buffering=1) as notes:
        for first in range(0, count, 10_000):
            chunk = min(10_000, count - first)
            notes.write(f"{first} {chunk} {time.time():.6f}\n")
            put(first, chunk)


def raw_consumer(url: str, run_dir: Path, stop: multiprocessing.synchronize.Event) -> None:
    """Claim and delete up to 100 rows per transaction, SKIP LOCKED; run the no-op on each."""
    os.environ[RECORD_DIR_ENV] = str(run_dir)
    if is_mariadb(url):
        claim, conn = raw_claim_mariadb, mysql_connect(url)
    else:
        import psycopg

        claim, conn = raw_claim_postgres, psycopg.connect(url)
    with open(run_dir / f"claims-{os.getpid()}.txt", "a", buffering=1) as claims:
        while not stop.is_set():
            ns, took = claim(conn)
            claims.write(f"{took * 1000:.3f}\n")
            for n in ns:
                record(n)
            if not ns:
                time.sleep(0.005)
    conn.close()


# ``= ANY(ARRAY(…))``, not ``IN (…)``: the sub-select runs once. Under ``IN`` PostgreSQL may
# plan a semi-join that runs it again per row, each time locking 100 other rows: a claim
# then ran for minutes and deleted 11,000 rows (seen on a 280,000-row backlog).
PG_CLAIM = (
    f"DELETE FROM {RAW_TABLE} WHERE id = ANY(ARRAY(SELECT id FROM {RAW_TABLE} ORDER BY id "
    f"LIMIT {BATCH} FOR UPDATE SKIP LOCKED)) RETURNING n"
)
DEADLOCK = 1213  # MariaDB's ER_LOCK_DEADLOCK
MARIADB_CLAIM = f"SELECT id, n FROM {RAW_TABLE} ORDER BY id LIMIT {BATCH} FOR UPDATE SKIP LOCKED"


def raw_claim_postgres(conn: Any) -> tuple[list[int], float]:
    """Delete up to 100 rows in one statement and commit; return their ``n`` and its time."""
    started = time.perf_counter()
    rows = conn.execute(PG_CLAIM).fetchall()
    took = time.perf_counter() - started
    conn.commit()
    return [n for (n,) in rows], took


def raw_claim_mariadb(conn: Any) -> tuple[list[int], float]:
    """Lock up to 100 rows (SKIP LOCKED), delete them, commit; return their ``n`` and the
    locking SELECT's time. MariaDB has no ``DELETE … RETURNING`` with such a sub-select. A
    deadlock (InnoDB reports some between the two consumers) rolls back: nothing claimed."""
    import MySQLdb

    cursor = conn.cursor()
    started = time.perf_counter()
    cursor.execute(MARIADB_CLAIM)
    rows = cursor.fetchall()
    took = time.perf_counter() - started
    try:
        if rows:
            ids = [row[0] for row in rows]
            cursor.execute(f"DELETE FROM {RAW_TABLE} WHERE id IN ({','.join(['%s'] * len(ids))})", ids)
        conn.commit()
    except MySQLdb.OperationalError as error:
        if error.args[0] != DEADLOCK:
            raise
        conn.rollback()
        return [], took
    return [n for _, n in rows], took


def start_consumers(system: str, url: str, run_dir: Path, stop: multiprocessing.synchronize.Event) -> None:
    """Start the system's 2 consumers (ours: ``manage.py workers --processes 2``)."""
    if system == "raw":
        for _ in range(2):
            process = multiprocessing.get_context("fork").Process(
                target=raw_consumer, args=(url, run_dir, stop)
            )
            process.start()
            _children.append(process)
        return
    command = [sys.executable, __file__, "--workers"]
    env = {**os.environ, RECORD_DIR_ENV: str(run_dir), "DATABASE_URL": url}
    with open(run_dir / "worker.out", "ab") as log:
        _children.append(
            subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        )
    time.sleep(3)  # its start-up, so that the first window measures the drain


def workers() -> None:
    """Our consumers: ``manage.py workers --processes 2`` on a no-op ``fifo`` tube handler.

    The command itself, with one handler more than the bench project's (whose ``bench`` tube
    is a ``fifottl`` one): its forked worker processes inherit it."""
    import django
    from django.core.management import call_command

    django.setup()
    from django_taskloop.workers import tube

    @tube(TUBE, type="fifo", batch=BATCH)
    def horizon(task: Any) -> None:
        """Run nothing; the record of its start is the whole job."""
        record(task.data)

    from django.db import connection

    # The forked worker processes inherit the wrapper: it times their claim statements.
    with connection.execute_wrapper(time_claims):
        call_command("workers", "--processes", "2", "--only", TUBE)


_claims: dict[int, Any] = {}


def time_claims(execute: Callable, sql: str, params: Any, many: bool, context: dict) -> Any:
    """Run one statement of a worker; note how long it took if it claims (SKIP LOCKED)."""
    if "SKIP LOCKED" not in sql:
        return execute(sql, params, many, context)
    started = time.perf_counter()
    try:
        return execute(sql, params, many, context)
    finally:
        pid = os.getpid()
        if pid not in _claims:
            _claims[pid] = open(Path(os.environ[RECORD_DIR_ENV]) / f"claims-{pid}.txt", "a", buffering=1)  # noqa: SIM115
        _claims[pid].write(f"{(time.perf_counter() - started) * 1000:.3f}\n")


def check_children(directory: Path) -> None:
    """Fail with the end of the workers' output if a consumer or the producer has died."""
    for child in _children:
        # Only our workers' command or a process that failed: the others end when told.
        code = child.poll() if isinstance(child, subprocess.Popen) else child.exitcode or None
        if code is not None:
            out = directory / "worker.out"
            tail = out.read_text(errors="replace")[-3000:] if out.exists() else ""
            raise RuntimeError(f"a consumer or the producer exited ({code}):\n{tail}")


def stop_children() -> None:
    """Stop every consumer and producer started so far (SIGTERM, then SIGKILL after 30 s)."""
    while _children:
        child = _children.pop()
        if isinstance(child, subprocess.Popen):
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGTERM)
            try:
                child.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
        else:
            child.join(30)
            if child.is_alive():
                child.kill()
                child.join()


# -- watching a run: 15 s windows read from the record files --------------------------------


@dataclass
class Window:
    """One 15 s window of a run."""

    phase: str
    seconds: float
    put: int
    started: int
    backlog: int
    pickups: list[float]
    claims: list[float]
    purge: int | None = None


@dataclass
class Run:
    """The record files of one system in one scenario, read as they grow."""

    system: str
    directory: Path
    url: str
    put_times: array = field(default_factory=lambda: array("d"))
    seen: bytearray = field(default_factory=bytearray)
    starts: array = field(default_factory=lambda: array("d"))
    offsets: dict[Path, int] = field(default_factory=dict)
    windows: list[Window] = field(default_factory=list)
    total_put: int = 0
    total_started: int = 0
    begun: float = field(default_factory=time.monotonic)
    last_read: float = field(default_factory=time.monotonic)

    def new_lines(self, pattern: str) -> list[str]:
        """Return the complete lines added to the files matching ``pattern`` since last time."""
        lines: list[str] = []
        for path in sorted(self.directory.glob(pattern)):
            with open(path, "rb") as f:
                f.seek(self.offsets.get(path, 0))
                chunk = f.read()
            end = chunk.rfind(b"\n") + 1
            self.offsets[path] = self.offsets.get(path, 0) + end
            lines.extend(chunk[:end].decode().splitlines())
        return lines

    def read_puts(self) -> int:
        count = 0
        for line in self.new_lines("puts.txt"):
            first, n, at = line.split()
            first, n = int(first), int(n)
            grow = first + n - len(self.put_times)
            if grow > 0:
                self.put_times.extend([0.0] * grow)
                self.seen.extend(bytes(grow))
            self.put_times[first : first + n] = array("d", [float(at)] * n)
            count += n
        return count

    def note_starts(self, found: list[list[str]]) -> list[float]:
        """Count the handler starts ``found`` (``n``, time); return their pickups in seconds."""
        pickups = []
        for n_text, at_text in found:
            n, at = int(n_text), float(at_text)
            self.seen[n] = min(255, self.seen[n] + 1)
            self.starts.append(at)
            pickups.append(at - self.put_times[n])
        return pickups

    def window(self, phase: str) -> Window:
        """Read what happened since the last window; print and keep it."""
        now = time.monotonic()
        seconds, self.last_read = now - self.last_read, now
        found = [line.split() for line in self.new_lines("*.log")]
        put = self.read_puts()  # after the starts: every start's put time is known
        pickups = self.note_starts(found)
        claims = [float(line) for line in self.new_lines("claims-*.txt")]
        self.total_put += put
        self.total_started += len(found)
        backlog = self.total_put - self.total_started
        row = Window(phase, seconds, put, len(found), backlog, pickups, claims, purge_backlog(self.url))
        self.windows.append(row)
        print_window(self, row)
        return row

    def all_started(self) -> bool:
        """Say whether every task noted as put so far has started (a cheap count of lines)."""
        notes = (self.directory / "puts.txt").read_text().splitlines()
        return count_records(self.directory) >= sum(int(line.split()[1]) for line in notes)

    def watch(
        self, phase: str, until: Callable[[Run, float], bool], limit: float, early: bool = False
    ) -> None:
        """Print 15 s windows under ``phase`` until ``until(run, elapsed)`` or ``limit`` s;
        with ``early``, a window ends as soon as every task put has started."""
        begun = opened = time.monotonic()
        while True:
            end = opened + WINDOW
            while time.monotonic() < end and not (early and self.all_started()):
                time.sleep(max(0.0, min(0.5, end - time.monotonic())))
            now = time.monotonic()
            self.window(phase)
            check_children(self.directory)
            opened = now
            if until(self, now - begun) or now - begun >= limit - 1e-6:
                return

    def once(self) -> str:
        """Say whether every task put ran exactly once."""
        seen = self.seen[: self.total_put]
        missing = seen.count(0)
        twice = len(seen) - missing - seen.count(1)
        return "every task ran once" if not (missing or twice) else f"{missing} missing, {twice} twice"


def print_header(system: str, scenario: str, url: str) -> None:
    print(f"\n{scenario} — {system}", flush=True)
    purge = f" {'history':>9}" if is_mariadb(url) else ""
    print(
        f"  {'t s':>5} {'phase':<8} {'put/s':>8} {'drain/s':>8} {'backlog':>9} "
        f"{'pickup p50':>11} {'p95':>8} {'claim p95':>10}{purge}",
        flush=True,
    )


def _ms(values: list[float], p: float, scale: float = 1000) -> str:
    return f"{percentile(values, p) * scale:,.0f} ms" if values else "–"


def print_window(run: Run, row: Window) -> None:
    at = time.monotonic() - run.begun
    claim = f"{percentile(row.claims, 95):.1f} ms" if row.claims else "–"
    purge = "" if row.purge is None else f" {row.purge:>9,}"
    print(
        f"  {at:>5.0f} {row.phase:<8} {row.put / row.seconds:>8,.0f} {row.started / row.seconds:>8,.0f} "
        f"{row.backlog:>9,} {_ms(row.pickups, 50):>11} {_ms(row.pickups, 95):>8} {claim:>10}{purge}",
        flush=True,
    )


# -- the scenarios ---------------------------------------------------------------------------


def fork(target: Callable, *args: object) -> None:
    """Start ``target(*args)`` in a forked process (Django's connections closed first)."""
    from django.db import connections

    connections.close_all()
    process = multiprocessing.get_context("fork").Process(target=target, args=args)
    process.start()
    _children.append(process)


def begin(system: str, url: str, scenario: str, base: Path) -> Run:
    """Empty the system's queue and return a run recording under a fresh directory."""
    directory = base / f"{scenario}-{system}"
    directory.mkdir(parents=True)
    reset(system, url)
    print_header(system, scenario, url)
    return Run(system, directory, url)


def drained(run: Run, _elapsed: float = 0.0) -> bool:
    return run.total_put > 0 and run.total_put == run.total_started


@contextlib.contextmanager
def churning(run: Run, url: str, rate: float) -> Iterator[Callable[[], None]]:
    """Run the consumers and the producer; yield a function that stops the producer."""
    ctx = multiprocessing.get_context("fork")
    consumers, producer = ctx.Event(), ctx.Event()
    try:
        start_consumers(run.system, url, run.directory, consumers)
        if rate:
            fork(produce, run.system, url, rate, run.directory, producer)
            run.begun = run.last_read = time.monotonic()  # the windows start with the puts
        yield producer.set
    finally:
        producer.set()
        consumers.set()
        stop_children()


def empty_out(run: Run, stop_producer: Callable[[], None]) -> None:
    """Stop putting and watch until every task put has started (at most 5 minutes)."""
    stop_producer()
    time.sleep(0.5)  # its last batch
    run.watch("drain", drained, 300, early=True)


def steady(system: str, url: str, args: argparse.Namespace, base: Path) -> str:
    """Scenario 1: steady churn; judged: no window with pickup p95 over 1 s."""
    run = begin(system, url, "steady churn", base)
    with churning(run, url, args.rate) as stop_producer:
        run.watch("churn", lambda *_: False, args.steady_minutes * 60)
        empty_out(run, stop_producer)
    worst = max(
        (percentile(w.pickups, 95) for w in run.windows if w.phase == "churn" and w.pickups), default=0
    )
    verdict = "PASS" if worst <= 1 else "FAIL"
    return f"{verdict}: worst window pickup p95 {worst * 1000:,.0f} ms (target ≤ 1 s); {run.once()}"


def held(system: str, url: str, args: argparse.Namespace, base: Path) -> str:
    """Scenario 2: churn with a REPEATABLE READ transaction held open in the middle."""
    run = begin(system, url, "held horizon", base)
    with churning(run, url, args.rate) as stop_producer:
        run.watch("before", lambda *_: False, args.held_before * 60)
        holder = hold(url)
        print(f"  held from {time.strftime('%H:%M:%S')}", flush=True)
        try:
            run.watch("held", lambda *_: False, args.held_minutes * 60)
        finally:
            holder.commit()
            holder.close()
            print(f"  committed at {time.strftime('%H:%M:%S')}", flush=True)
        run.watch("after", lambda r, _: r.windows[-1].backlog <= args.rate, args.recover_minutes * 60)
        empty_out(run, stop_producer)
    rows = [w for w in run.windows if w.phase == "held"]
    ratio = sum(w.started for w in rows) / max(1, sum(w.put for w in rows))
    p95 = percentile([p for w in rows for p in w.pickups], 95)
    verdict = "PASS" if ratio >= 0.8 and p95 < 1 else "FAIL"
    return (
        f"{verdict}: while held, drain {ratio:.3f}× the put rate (target ≥ 0.8), "
        f"pickup p95 {p95 * 1000:,.0f} ms (target < 1 s); {run.once()}"
    )


def hold(url: str) -> Any:
    """Open a REPEATABLE READ transaction that has read something; return its connection."""
    if is_mariadb(url):
        holder = mysql_connect(url, isolation="REPEATABLE READ")
        cursor = holder.cursor()
        # The read view opens here: InnoDB purges no undo log newer than it until the commit.
        cursor.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        cursor.execute("SELECT count(*) FROM django_migrations")
        cursor.fetchall()
        return holder
    import psycopg

    holder = psycopg.connect(url)
    holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    holder.execute("SELECT count(*) FROM pg_class").fetchall()
    return holder


def backlog(system: str, url: str, args: argparse.Namespace, base: Path) -> str:
    """Scenario 3: a backlog put up front, drained; the rate per segment by handler start."""
    run = begin(system, url, "backlog", base)
    fill(run, url, args.backlog)
    with churning(run, url, 0.0):
        run.watch("drain", drained, args.recover_minutes * 60 + args.backlog / 1000, early=True)
    rates = segment_rates(sorted(run.starts), args.segment)
    print("  rate per {:,}: {}".format(args.segment, " ".join(f"{r:,.0f}" for r in rates)), flush=True)
    if len(rates) < 2:
        return f"– (fewer than 2 segments of {args.segment:,}); {run.once()}"
    middle = rates[len(rates) // 2] / rates[0]
    verdict = "PASS" if middle >= 0.7 else "FAIL"
    return f"{verdict}: middle rate {middle:.3f}× the first segment's (target ≥ 0.7); {run.once()}"


def fill(run: Run, url: str, count: int) -> None:
    """Put ``count`` tasks up front and take them as put before the first window."""
    started = time.monotonic()
    put_up_front(run.system, url, count, run.directory)
    run.total_put += run.read_puts()
    run.last_read = time.monotonic()
    print(f"  {count:,} put in {run.last_read - started:.1f} s", flush=True)


def segment_rates(starts: list[float], size: int) -> list[float]:
    """Return the drain rate of each whole ``size`` tasks in start order."""
    rates = []
    for first in range(0, len(starts) - size + 1, size):
        span = starts[first + size - 1] - starts[first]
        rates.append((size - 1) / span if span > 0 else float("inf"))
    return rates


def calibrate(url: str, base: Path, jobs: int = 50_000) -> float:
    """Return half of what 2 of our workers drain from ``jobs`` tasks put up front."""
    run = begin("ours", url, "calibration", base)
    fill(run, url, jobs)
    with churning(run, url, 0.0):
        run.watch("drain", drained, 300, early=True)
    rate = drain_rate(read_records(run.directory))
    print(f"  2 of our workers drain {rate:,.0f}/s: the producer puts {rate / 2:,.0f}/s", flush=True)
    return rate / 2


SCENARIOS = {"steady": steady, "held": held, "backlog": backlog}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--vendor",
        choices=("postgresql", "mariadb"),
        default="postgresql",
        help="the throwaway server to start (default: postgresql; ignored with --server)",
    )
    parser.add_argument("--server", help="an existing database's URL instead of a throwaway server")
    parser.add_argument(
        "--slow-log",
        help="PostgreSQL: log plans of statements of 1 s or more and autovacuum runs, and keep the "
        "throwaway server's log in this file; sample pg_stat_activity every second into FILE.activity",
    )
    parser.add_argument("--rate", type=float, help="tasks put per second (default: calibrated)")
    parser.add_argument("--scenarios", default="steady,held,backlog")
    parser.add_argument("--systems", default="ours,raw")
    parser.add_argument("--steady-minutes", type=float, default=8)
    parser.add_argument("--held-before", type=float, default=1, help="minutes of churn before the hold")
    parser.add_argument("--held-minutes", type=float, default=5)
    parser.add_argument("--recover-minutes", type=float, default=10, help="at most, after the hold")
    parser.add_argument("--backlog", type=int, default=1_000_000)
    parser.add_argument("--segment", type=int, default=100_000)
    args = parser.parse_args()
    args.scenarios = args.scenarios.split(",")
    args.systems = args.systems.split(",")
    unknown = set(args.scenarios) - set(SCENARIOS) | set(args.systems) - set(SYSTEMS)
    if unknown:
        parser.error(f"unknown scenarios or systems: {', '.join(sorted(unknown))}")
    return args


def run_all(url: str, args: argparse.Namespace, base: Path) -> list[str]:
    """Run every chosen scenario on every chosen system; return the verdict lines."""
    setup_django(url)
    print(sql(url, "SELECT version()")[0][0], flush=True)
    if args.slow_log and not is_mariadb(url):
        print(f"sampling pg_stat_activity every second into {args.slow_log}.activity", flush=True)
        threading.Thread(
            target=sample_activity, args=(url, args.slow_log + ".activity", threading.Event()), daemon=True
        ).start()
    if args.rate is None:
        args.rate = calibrate(url, base)
    verdicts = []
    for scenario in args.scenarios:
        for system in args.systems:
            verdicts.append(f"{scenario:<8} {system:<5} {SCENARIOS[scenario](system, url, args, base)}")
    return verdicts


ACTIVITY = """
SELECT pid, backend_type, state, coalesce(wait_event_type || ':' || wait_event, ''),
       round(extract(epoch FROM clock_timestamp() - query_start)::numeric, 3),
       round(extract(epoch FROM clock_timestamp() - xact_start)::numeric, 1),
       backend_xmin IS NOT NULL, left(regexp_replace(query, '\\s+', ' ', 'g'), 400)
FROM pg_stat_activity
WHERE pid <> pg_backend_pid() AND (state IS DISTINCT FROM 'idle' OR backend_type <> 'client backend')
  AND backend_type NOT IN ('checkpointer', 'background writer', 'walwriter', 'logical replication launcher',
                           'autovacuum launcher')
"""


def sample_activity(url: str, path: str, stop: threading.Event) -> None:
    """Every second, append what every busy backend is doing (wall clock first) to ``path``:
    for stalls, beside the slow-statement log."""
    import psycopg

    with contextlib.suppress(psycopg.OperationalError):  # the server stopped at the end
        with psycopg.connect(url, autocommit=True) as conn, open(path, "a") as out:
            while not stop.wait(1.0):
                stamp = time.strftime("%H:%M:%S")
                for row in conn.execute(ACTIVITY).fetchall():
                    out.write(stamp + " | " + " | ".join(str(v) for v in row) + "\n")
                out.flush()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    if sys.argv[1:] == ["--workers"]:
        workers()
        return
    args = parse_args()
    signal.signal(signal.SIGTERM, _interrupt)
    print("load average at start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()), flush=True)
    base = Path(tempfile.mkdtemp(prefix="held_horizon_runs_"))
    server = (
        contextlib.nullcontext(args.server) if args.server else throwaway_server(args.vendor, args.slow_log)
    )
    try:
        with server as url:
            try:
                verdicts = run_all(url, args, base)
            finally:
                stop_children()
    except KeyboardInterrupt:
        raise SystemExit(
            "\ninterrupted: the consumers are stopped and the throwaway server removed"
        ) from None
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"\ntargets of issue 30 (put rate {args.rate:,.0f}/s):")
    for line in verdicts:
        print(f"  {line}")
    print("load average at end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()), flush=True)


if __name__ == "__main__":
    main()
