"""The benchmark harness: django-taskloop against its peers and the raw-SQL limit, in one run.

    python bench/run.py                      # the full run (about 20 minutes on 2 cores)
    python bench/run.py --quick              # a smoke run (a few minutes)
    python bench/run.py --databases postgres --systems taskloop,raw

It creates one virtualenv per system under ``bench/.venvs/`` (ours, with matplotlib for the
plot; ``django-tasks-db``, ``django-q2`` and ``dj-queue`` from PyPI, each in its own), one
database per system on each server (``bench_<system>``: created, and dropped first if it
exists), runs every scenario of every system back to back, and writes to ``bench/results/``:
``report.md`` (the tables), ``results.json`` (every sample) and ``throughput.png``.

Servers: ``--mysql mysql://root@127.0.0.1:3306`` and ``--postgres postgres://`` (the database
name is added); SQLite files go to ``bench/results/db/``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VENVS = HERE / ".venvs"

SYSTEMS = ["taskloop", "raw", "tasksdb", "q2", "djqueue"]
DATABASES = ["sqlite", "mysql", "postgres"]
LABELS = {
    "taskloop": "django-taskloop",
    "raw": "raw SQL",
    "tasksdb": "django-tasks-db",
    "q2": "django-q2",
    "djqueue": "dj-queue",
}
DB_LABELS = {"sqlite": "SQLite", "mysql": "MariaDB", "postgres": "PostgreSQL"}

# What each virtualenv holds. Ours also runs the raw baseline (it has both drivers) and this
# harness itself (matplotlib, py-spy for profiles).
DRIVERS = ["mysqlclient", "psycopg[binary]", "dj-database-url"]
VENV_SPECS = {
    "taskloop": ("3.11", ["-e", f"{ROOT}[mysql,postgres,tasks]", *DRIVERS, "matplotlib", "py-spy"]),
    "tasksdb": ("3.11", ["django-tasks-db[compat]", *DRIVERS]),
    "q2": ("3.11", ["django-q2", *DRIVERS]),
    # dj-queue needs Django 6, hence Python 3.12.
    "djqueue": ("3.12", ["dj-queue", *DRIVERS]),
}
VENV_OF = {"taskloop": "taskloop", "raw": "taskloop", "tasksdb": "tasksdb", "q2": "q2", "djqueue": "djqueue"}


# -- the plan ------------------------------------------------------------------------------


#: The ``kinds`` scenario's queues (bench/scenarios.py), in the report's order.
KINDS = ("fifo", "fifottl", "utube", "utubettl", "tasks", "tasks-keyed")


@dataclass
class Step:
    """One scenario of one system on one database, repeated ``repeats`` times."""

    system: str
    database: str
    scenario: str
    args: dict = field(default_factory=dict)
    repeats: int = 3
    #: What the result is filed under in the report (e.g. ``drain`` / ``batch 100`` / 4).
    variant: str = ""
    processes: int | None = None


def plan(quick: bool, databases: list[str], systems: list[str]) -> list[Step]:
    """Every step of the run, database by database, system by system.

    The full run fits 30 minutes on 2 cores: three repeats where the targets compare (4
    processes), one at 1 and 2 processes; the peers, 20–100× slower, drain fewer jobs.
    """
    top = 3 if not quick else 1
    procs = [1, 4] if quick else [1, 2, 4]
    steps: list[Step] = []

    def reps(n: int) -> int:
        return top if n == 4 else 1

    for db in databases:
        sqlite = db == "sqlite"
        drain_jobs = 2000 if quick else 20000
        # SQLite serialises every write: the slow peers get fewer jobs there.
        peer_jobs = 200 if quick else (150 if sqlite else 400)
        loop_ids = 10000 if quick else 100000
        # Medians of 3 where the targets are judged (MariaDB); one run elsewhere, for time.
        loop_reps = top if db == "mysql" else 1
        board_jobs = 100 if quick else 200
        enqueue_jobs = 100 if quick else 200
        samples = 10 if quick else 50
        startup_samples = 3 if quick else 5
        sizes = "10000,30000" if quick else "10000,100000,1000000"
        for system in systems:
            if system == "taskloop":
                for n in procs:
                    steps.append(
                        Step(system, db, "drain", {"jobs": drain_jobs, "processes": n}, reps(n), "workers", n)
                    )
                # Every kind of queue (issue 39: keyed ones were 20-40x slower on a stock
                # PostgreSQL); boards and loops have their own steps below.
                kind_jobs = 2000 if quick else 6000
                for kind in KINDS:
                    jobs = kind_jobs // 2 if kind.startswith("tasks") else kind_jobs
                    kind_args = {"kind": kind, "jobs": jobs, "processes": 4}
                    steps.append(Step(system, db, "kinds", kind_args, 1, kind, 4))
                # More jobs for ours: put_many of 200 is over in a few milliseconds.
                steps.append(Step(system, db, "enqueue", {"jobs": 500 if quick else 2000}, top))
                steps.append(Step(system, db, "latency", {"samples": samples, "gap": 0.2}, 1))
                loop_args = {"jobs": loop_ids, "processes": 4, "batch": 100}
                steps.append(Step(system, db, "loop", loop_args, loop_reps, "loop", 4))
                board_args = {"jobs": drain_jobs, "processes": 4}
                steps.append(Step(system, db, "board", board_args, top, "workers", 4))
                verbs_args = {"jobs": board_jobs, "processes": 4, "batch": 1}
                steps.append(Step(system, db, "board_verbs", verbs_args, top, "claim_next", 4))
                steps.append(Step(system, db, "growth", {"sizes": sizes, "samples": 50 if quick else 100}, 1))
                steps.append(Step(system, db, "startup", {"samples": startup_samples}, 1))
            elif system == "raw":
                for n in procs:
                    raw_args = {"jobs": drain_jobs, "processes": n, "batch": 100}
                    steps.append(Step(system, db, "drain", raw_args, reps(n), "batch 100", n))
                raw1 = {"jobs": 1000 if quick else (2000 if sqlite else 5000), "processes": 4, "batch": 1}
                steps.append(Step(system, db, "drain", raw1, top, "batch 1", 4))
                steps.append(Step(system, db, "enqueue", {"jobs": 500 if quick else 2000}, top))
                steps.append(Step(system, db, "latency", {"samples": samples, "gap": 0.2}, 1))
            else:
                for n in (1, 4):
                    # One process drains half as many: it is the slowest of all.
                    jobs = peer_jobs if n == 4 else peer_jobs // 2
                    steps.append(
                        Step(system, db, "drain", {"jobs": jobs, "processes": n}, reps(n), "worker", n)
                    )
                steps.append(Step(system, db, "enqueue", {"jobs": enqueue_jobs}, 1 if quick else 2))
                steps.append(Step(system, db, "latency", {"samples": samples, "gap": 0.2}, 1))
                steps.append(Step(system, db, "startup", {"samples": startup_samples}, 1))
    return steps


# -- environments and databases ------------------------------------------------------------


def find_python(version: str) -> str:
    """Return an interpreter for ``version`` (``BENCH_PYTHON311``/``BENCH_PYTHON312`` win)."""
    env = os.environ.get("BENCH_PYTHON" + version.replace(".", ""))
    candidates = [env] if env else []
    candidates += [
        str(p) for p in sorted(Path.home().glob(f".pyenv/versions/{version}.*/bin/python"), reverse=True)
    ]
    candidates += [c for c in (shutil.which(f"python{version}"),) if c]
    for candidate in candidates:
        # A pyenv shim may exist and still refuse to run: try each one.
        probe = subprocess.run(
            [candidate, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True
        )
        if probe.returncode == 0 and probe.stdout.strip() == str(tuple(int(x) for x in version.split("."))):
            return candidate
    raise SystemExit(f"no Python {version} found: set BENCH_PYTHON{version.replace('.', '')}")


def venv_python(name: str) -> Path:
    return VENVS / name / "bin" / "python"


def ensure_venv(name: str) -> None:
    """Create the virtualenv ``name`` and install its packages, unless already done."""
    version, packages = VENV_SPECS[name]
    stamp = hashlib.sha1(json.dumps([version, packages]).encode()).hexdigest()
    marker = VENVS / name / ".bench-installed"
    if marker.exists() and marker.read_text() == stamp:
        return
    print(f"setting up {VENVS / name} (Python {version}): {' '.join(packages)}", flush=True)
    subprocess.run([find_python(version), "-m", "venv", "--clear", str(VENVS / name)], check=True)
    pip = subprocess.run(
        [str(venv_python(name)), "-m", "pip", "install", "-q", *packages], capture_output=True, text=True
    )
    if pip.returncode:
        raise SystemExit(f"pip install into {VENVS / name} failed:\n{pip.stdout}{pip.stderr}")
    marker.write_text(stamp)


def db_name(system: str) -> str:
    """The database of ``system``: ``bench_<system>``, or with ``BENCH_DB_PREFIX`` another prefix
    (so that a second checkout's run does not drop the databases of a run in progress)."""
    return f"{os.environ.get('BENCH_DB_PREFIX', 'bench')}_{system}"


def database_url(system: str, db: str, args: argparse.Namespace, results: Path) -> str:
    name = db_name(system)
    if db == "sqlite":
        return f"sqlite:///{results / 'db' / (name + '.sqlite3')}"
    base = args.mysql if db == "mysql" else args.postgres
    # "postgres://" (no host: the local socket) needs the third slash kept.
    return (base if base.endswith("://") else base.rstrip("/")) + "/" + name


def recreate_database(system: str, db: str, args: argparse.Namespace, results: Path) -> None:
    """Start ``system`` from an empty database on ``db``."""
    name = db_name(system)
    if db == "sqlite":
        path = results / "db" / f"{name}.sqlite3"
        path.parent.mkdir(parents=True, exist_ok=True)
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(str(path) + suffix).unlink(missing_ok=True)
        return
    from urllib.parse import urlparse

    if db == "mysql":
        parts = urlparse(args.mysql)
        cmd = [
            "mysql",
            "-h",
            parts.hostname or "127.0.0.1",
            "-P",
            str(parts.port or 3306),
            "-u",
            parts.username or "root",
        ]
        if parts.password:
            cmd.append(f"-p{parts.password}")
        sql = f"DROP DATABASE IF EXISTS {name}; CREATE DATABASE {name} CHARACTER SET utf8mb4;"
        subprocess.run([*cmd, "-e", sql], check=True)
    else:
        conn = _pg_conn(args)
        # --force: a worker left over from an interrupted run must not block the fresh start.
        subprocess.run(["dropdb", "--if-exists", "--force", *conn, name], check=True)
        subprocess.run(["createdb", *conn, name], check=True)


def _pg_conn(args: argparse.Namespace) -> list[str]:
    from urllib.parse import urlparse

    parts = urlparse(args.postgres)
    conn = []
    if parts.hostname:
        conn += ["-h", parts.hostname]
    if parts.port:
        conn += ["-p", str(parts.port)]
    if parts.username:
        conn += ["-U", parts.username]
    return conn


def pg_autovacuum(args: argparse.Namespace) -> str:
    """The PostgreSQL server's ``autovacuum`` setting ("on"/"off")."""
    probe = subprocess.run(
        ["psql", *_pg_conn(args), "-d", "postgres", "-Atc", "SHOW autovacuum"], capture_output=True, text=True
    )
    return probe.stdout.strip() or "?"


def vacuum(system: str, args: argparse.Namespace) -> None:
    """VACUUM ``system``'s PostgreSQL database: a server with autovacuum off (as CI machines
    here are configured) would otherwise carry every dead row of the earlier scenarios into
    the later ones, and the systems that process more jobs would pay for it most. Every
    system alike, before every run."""
    subprocess.run(["vacuumdb", "-q", *_pg_conn(args), f"bench_{system}"], check=True)


# -- running -------------------------------------------------------------------------------


def command(step: Step) -> list[str]:
    python = str(venv_python(VENV_OF[step.system]))
    if step.system == "taskloop":
        script = [str(HERE / "scenarios.py")]
    elif step.system == "raw":
        script = [str(HERE / "raw_baseline.py")]
    else:
        script = [str(HERE / "peers" / "driver.py")]
    flags = []
    for key, value in step.args.items():
        flags += [f"--{key.replace('_', '-')}", str(value)]
    return [python, *script, step.scenario, *flags]


def run_once(step: Step, url: str, record_dir: Path, log) -> dict:
    env = {**os.environ, "DATABASE_URL": url, "PEER": step.system}
    cmd = command(step)
    if step.system == "raw":
        cmd += ["--url", url]
        env.pop("DATABASE_URL")
    cmd += ["--record-dir", str(record_dir)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    log.write(f"$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}\n")
    log.flush()
    for line in proc.stdout.splitlines():
        if line.startswith("BENCH "):
            return json.loads(line[6:])
    raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")


def setup_system(system: str, db: str, url: str, record_dir: Path, log) -> None:
    if system == "raw":
        return
    run_once(Step(system, db, "setup", {}, 1), url, record_dir, log)


# -- the report ----------------------------------------------------------------------------


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def fmt_rate(s: dict | None) -> str:
    if not s:
        return "–"
    if s["n"] == 1:
        return f"{s['median']:,.0f}"
    return f"{s['median']:,.0f} ({s['min']:,.0f}–{s['max']:,.0f})"


def fmt_ms(value: float | None) -> str:
    return "–" if value is None else f"{value:,.1f}"


def ratio(a: dict | None, b: dict | None) -> str:
    if not a or not b or not b["median"]:
        return "–"
    return f"{a['median'] / b['median']:,.2f}×"


def collect(results: list[dict]) -> dict:
    """Index the samples: (db, system, scenario, variant, processes) → summary of rates etc."""
    table: dict = {}
    for r in results:
        key = (r["database"], r["system"], r["scenario"], r["variant"], r["processes"])
        table.setdefault(key, []).append(r)
    return table


def rates(
    table: dict, db: str, system: str, scenario: str, variant: str, processes, field_name: str = "rate"
):
    rows = table.get((db, system, scenario, variant, processes))
    if not rows:
        return None
    values = [r[field_name] for r in rows if r.get(field_name) is not None]
    return summary(values) if values else None


def idle_targets(table: dict) -> list[str]:
    """The targets rows of an idle worker: its cost per second and its pickup latency."""

    def check(ok: bool | None) -> str:
        return "n/a" if ok is None else ("met" if ok else "**missed**")

    def idle(db: str) -> dict | None:
        row = (table.get((db, "taskloop", "latency", "", None)) or [None])[0]
        return row.get("idle") if row else None

    def target(label: str, value: float | None, unit: str, limit: float) -> str:
        if value is None:
            return f"| {label} | – | n/a |"
        return f"| {label} | {value:.1f}{unit} | {check(value <= limit)} |"

    pg, my, lite = idle("postgres"), idle("mysql"), idle("sqlite")
    # Transactions as the worker sent them where counted (pg_stat_database lags); else the server's.
    pg_xacts = pg.get("sent_xacts_per_s", pg.get("xacts_per_s")) if pg else None
    lite_row = (table.get(("sqlite", "taskloop", "latency", "", None)) or [None])[0]
    return [
        target("idle worker ≤ 2 transactions/s (PostgreSQL)", pg_xacts, "/s", 2),
        target(
            "idle worker opens no sessions (PostgreSQL)", pg.get("sessions_per_s") if pg else None, "/s", 0
        ),
        target("idle worker ≤ 10 queries/s (MariaDB, sent)", my.get("sent_per_s") if my else None, "/s", 10),
        target(
            "idle worker ≤ 10 queries/s (SQLite, sent)", lite.get("sent_per_s") if lite else None, "/s", 10
        ),
        target("idle pickup median ≤ 50 ms (SQLite)", lite_row["median_ms"] if lite_row else None, " ms", 50),
    ]


def write_report(
    results: list[dict],
    out: Path,
    quick: bool,
    databases: list[str],
    elapsed: float,
    load: str = "?",
    autovacuum: str | None = None,
) -> str:
    table = collect(results)
    procs = sorted({r["processes"] for r in results if r["scenario"] == "drain" and r["processes"]})
    lines = [
        "# django-taskloop benchmarks",
        "",
        f"{'Quick (smoke) run' if quick else 'Full run'} of `python bench/run.py{' --quick' if quick else ''}`, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, "
        f"{elapsed / 60:.1f} minutes, load average {load}. Medians, with min–max where there were several "
        "repeats; no-op jobs; rates from the first to the last handler start.",
        "",
    ]
    problems = [
        f"{r['system']} {r['scenario']} on {r['database']}: missing {r.get('missing')}, twice {r.get('twice')}, "
        f"stray {r.get('stray')}"
        for r in results
        if "exactly_once" in r and not r["exactly_once"]
    ]
    checked = sum(1 for r in results if "exactly_once" in r)
    lines.append(
        f"**Exactly once**: {checked} runs checked job by job; "
        + ("every job ran exactly once." if not problems else "PROBLEMS: " + "; ".join(problems))
    )
    lines.append("")

    # Drain.
    lines += ["## Drain (jobs/s) against processes", ""]
    for db in databases:
        lines += [f"### {DB_LABELS[db]}", ""]
        lines.append("| system | " + " | ".join(f"{n} proc" for n in procs) + " |")
        lines.append("|---|" + "---|" * len(procs))
        rows = [
            ("taskloop", "workers"),
            ("raw", "batch 100"),
            ("raw", "batch 1"),
            ("tasksdb", "worker"),
            ("q2", "worker"),
            ("djqueue", "worker"),
        ]
        for system, variant in rows:
            cells = [fmt_rate(rates(table, db, system, "drain", variant, n)) for n in procs]
            if all(c == "–" for c in cells):
                continue
            name = LABELS[system] + (f" ({variant})" if system in ("raw", "taskloop") else "")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("")
        top = max(procs) if procs else 4
        ours = rates(table, db, "taskloop", "drain", "workers", top)
        ratios = [
            f"{LABELS[p]} {ratio(ours, rates(table, db, p, 'drain', 'worker', top))}"
            for p in ("tasksdb", "q2", "djqueue")
            if rates(table, db, p, "drain", "worker", top)
        ]
        raw100 = rates(table, db, "raw", "drain", "batch 100", top)
        raw1 = rates(table, db, "raw", "drain", "batch 1", top)
        lines.append(
            f"Ratios at {top} processes, django-taskloop to: "
            + ", ".join(ratios)
            + f"; raw batch 100 {ratio(ours, raw100)}; raw batch 1 {ratio(ours, raw1)}."
        )
        lines.append("")

    # Every kind of queue.
    kind_rows = []
    for db in databases:
        got = {kind: rates(table, db, "taskloop", "kinds", kind, 4) for kind in KINDS}
        if not any(got.values()):
            continue
        keyed = [
            ratio(got[k], got[u])
            for k, u in (("utube", "fifo"), ("utubettl", "fifottl"), ("tasks-keyed", "tasks"))
        ]
        kind_rows.append(
            f"| {DB_LABELS[db]} | "
            + " | ".join(fmt_rate(got[k]) for k in KINDS)
            + " | "
            + " / ".join(keyed)
            + " |"
        )
    if kind_rows:
        lines += [
            "## Drain by kind of queue (`workers --burst`, 4 processes, jobs/s)",
            "",
            "Tubes of each type (keyed ones over 500 keys, one sub-queue each) and Django Tasks plain and "
            "keyed (`key=`: `tasks-keyed.<queue>`, a `utubettl` tube), on each server at its stock settings "
            "(PostgreSQL's `jit = on`). Target: keyed ≥ 0.5× unkeyed on the same database.",
            "",
            "| database | "
            + " | ".join(KINDS)
            + " | keyed / unkeyed (utube/fifo, utubettl/fifottl, tasks) |",
            "|---|" + "---|" * (len(KINDS) + 1),
            *kind_rows,
            "",
        ]

    # Loop and board.
    lines += [
        "## Loop `claim(100)` + `did`; board: `@board` workers and `claim_next` + `consume` "
        "(4 processes, items/s)",
        "",
    ]
    lines.append(
        "| database | loop | loop / raw batch 100 | board `@board` workers | board `claim_next` + `consume` |"
    )
    lines.append("|---|---|---|---|---|")
    for db in databases:
        loop = rates(table, db, "taskloop", "loop", "loop", 4)
        board = rates(table, db, "taskloop", "board", "workers", 4)
        one = rates(table, db, "taskloop", "board_verbs", "claim_next", 4)
        if loop or board or one:
            raw100 = rates(table, db, "raw", "drain", "batch 100", 4)
            lines.append(
                f"| {DB_LABELS[db]} | {fmt_rate(loop)} | {ratio(loop, raw100)} | {fmt_rate(board)} "
                f"| {fmt_rate(one)} |"
            )
    lines.append("")

    # Enqueue.
    lines += [
        "## Enqueue (jobs/s)",
        "",
        "| system | "
        + " | ".join(f"{DB_LABELS[db]} one at a time | {DB_LABELS[db]} bulk" for db in databases)
        + " |",
    ]
    lines.append("|---|" + "---|---|" * len(databases))
    enqueue_rows = [
        ("django-taskloop `put`", "taskloop", "rate", "bulk_rate"),
        ("django-taskloop Django Task `enqueue()`", "taskloop", "task_rate", None),
        ("django-taskloop `put` × N in one `atomic()`", "taskloop", "atomic_rate", None),
        (
            "`put`'s own statement alone, sent through the bare driver (the floor under `put`)",
            "taskloop",
            "statement_rate",
            None,
        ),
        *((LABELS[p], p, "rate", None) for p in ("tasksdb", "q2", "djqueue")),
        (
            "raw SQL: one INSERT per job in autocommit (the limit of one durable write per call)",
            "raw",
            "rate",
            None,
        ),
    ]
    for label, system, single_field, bulk_field in enqueue_rows:
        cells = []
        for db in databases:
            single = rates(table, db, system, "enqueue", "", None, single_field)
            if system == "taskloop":
                bulk = rates(table, db, system, "enqueue", "", None, bulk_field) if bulk_field else None
            elif system == "raw":
                bulk = None
            else:
                bulk = rates(table, db, system, "drain", "worker", 4, "bulk_enqueue_rate")
            cells += [fmt_rate(single), fmt_rate(bulk)]
        if any(c != "–" for c in cells):
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        "Bulk: ours is `put_many` of all the jobs in one call; dj-queue's is `enqueue_all`; "
        "django-tasks-db and django-q2 have no bulk call, so theirs is the same calls in one "
        "`transaction.atomic()`. django-tasks-db's enqueue is a Django Task's `enqueue()`, like ours "
        "in the second row."
    )
    lines.append("")

    # Latency.
    lines += ["## Idle pickup latency, put → handler start (ms, median / p95)", ""]
    lines.append("| system | " + " | ".join(DB_LABELS[db] for db in databases) + " |")
    lines.append("|---|" + "---|" * len(databases))
    for system in ("taskloop", "raw", "tasksdb", "q2", "djqueue"):
        cells = []
        for db in databases:
            rows = table.get((db, system, "latency", "", None))
            if rows:
                cells.append(f"{fmt_ms(rows[0]['median_ms'])} / {fmt_ms(rows[0]['p95_ms'])}")
            else:
                cells.append("–")
        if any(c != "–" for c in cells):
            lines.append(f"| {LABELS[system]} | " + " | ".join(cells) + " |")
    lines.append("")

    lines += startup_section(table, databases)

    # What an idle worker costs.
    idle_rows = []
    for db in databases:
        rows = table.get((db, "taskloop", "latency", "", None))
        idle = rows[0].get("idle") if rows else None
        if not idle:
            continue
        sent = (
            f"{idle['sent_per_s']:,.1f} ({idle['sent_xacts_per_s']:,.1f} transactions)"
            if "sent_per_s" in idle
            else "–"
        )
        if "xacts_per_s" in idle:
            server = (
                f"{idle['xacts_per_s']:,.1f} transactions, {idle['sessions_per_s']:,.1f} new sessions, "
                f"{idle['rows_per_s']:,.0f} rows read"
            )
        elif "queries_per_s" in idle:
            server = (
                f"{idle['queries_per_s']:,.1f} queries, {idle['commits_per_s']:,.1f} commits, "
                f"{idle['sessions_per_s']:,.1f} new sessions (whole server)"
            )
        else:
            server = "–"
        idle_rows.append(f"| {DB_LABELS[db]} | {sent} | {server} |")
    if idle_rows:
        lines += [
            "What one idle django-taskloop worker costs the database, per second, over the seconds before "
            "the first put of the latency scenario: what the worker sent (statements, commits and "
            "autocommit switches, counted in the worker: each is a round trip, a `Question` to MariaDB), "
            "and what the server counted: PostgreSQL's `pg_stat_database` of its own database (its "
            "statistics lag by a second or more), MariaDB's `SHOW GLOBAL STATUS` deltas (`Questions`, "
            "`Com_commit`, `Connections`), which count every client of the server.",
            "",
            "| database | sent by the worker | counted by the server |",
            "|---|---|---|",
            *idle_rows,
            "",
        ]

    # Client CPU per job.
    cpu_rows = []
    for db in databases:
        cells = [rates(table, db, "taskloop", "drain", "workers", n, "cpu_us_per_job") for n in procs]
        if any(cells):
            cpu_rows.append(f"| {DB_LABELS[db]} | " + " | ".join(fmt_rate(c) for c in cells) + " |")
    if cpu_rows:
        lines += [
            "Client CPU per drained job (µs): user + system time of the `manage.py workers --burst` process "
            "tree (start-up included), divided by the jobs.",
            "",
            "| database | " + " | ".join(f"{n} proc" for n in procs) + " |",
            "|---|" + "---|" * len(procs),
            *cpu_rows,
            "",
        ]

    # Growth.
    lines += ["## Claim latency as the tube grows (`take(0)`, ms, median / p95)", ""]
    sizes = []
    for r in results:
        if r["scenario"] == "growth":
            sizes = sorted({*sizes, *(int(s) for s in r["sizes"])})
    if sizes:
        lines.append("| database | " + " | ".join(f"{s:,} rows" for s in sizes) + " | largest / smallest |")
        lines.append("|---|" + "---|" * (len(sizes) + 1))
        for db in databases:
            rows = table.get((db, "taskloop", "growth", "", None))
            if not rows:
                continue
            got = rows[0]["sizes"]
            cells = [
                f"{got[str(s)]['median_ms']:.2f} / {got[str(s)]['p95_ms']:.2f}" if str(s) in got else "–"
                for s in sizes
            ]
            first, last = got.get(str(sizes[0])), got.get(str(sizes[-1]))
            growth = f"{last['median_ms'] / first['median_ms']:.2f}×" if first and last else "–"
            lines.append(f"| {DB_LABELS[db]} | " + " | ".join(cells) + f" | {growth} |")
        lines.append("")

    # Targets (issue 15), on every database.
    lines += ["## Targets (4 processes where it applies)", ""]

    def check(ok: bool | None) -> str:
        return "n/a" if ok is None else ("met" if ok else "**missed**")

    def ge(a, b, factor):
        return None if not a or not b else a["median"] >= factor * b["median"]

    def cell(a, b, factor) -> str:
        return f"{ratio(a, b)} {check(ge(a, b, factor))}" if a and b else "–"

    def at_least(value, floor) -> str:
        return f"{value['median']:,.0f} {check(value['median'] >= floor)}" if value else "–"

    def below(ms, limit) -> str:
        return "–" if ms is None else f"{ms:.1f} ms {check(ms < limit)}"

    put, bulk, drain, drain_floor, board, pickup, growth, once = ([] for _ in range(8))
    task_peer, task_raw, put_raw = ([] for _ in range(3))
    for db in databases:
        ours_put = rates(table, db, "taskloop", "enqueue", "", None)
        theirs_put = rates(table, db, "tasksdb", "enqueue", "", None)
        raw_put = rates(table, db, "raw", "enqueue", "", None)
        # The ceilings, against the same peer: put's own statement through the bare driver
        # (what any put of our row costs), and raw SQL's one-column INSERT.
        floor = rates(table, db, "taskloop", "enqueue", "", None, "statement_rate")
        ceilings = [
            f"{what}: {ratio(rate, theirs_put)}"
            for what, rate in (("its statement alone", floor), ("raw SQL", raw_put))
            if rate and theirs_put
        ]
        ceiling = f" ({'; '.join(ceilings)})" if ceilings else ""
        put.append(cell(ours_put, theirs_put, 2) + ceiling)
        # Issue 28: a Django Task's enqueue() (one row) against the reference backend and raw.
        ours_task = rates(table, db, "taskloop", "enqueue", "", None, "task_rate")
        task_peer.append(cell(ours_task, theirs_put, 1.5))
        task_raw.append(cell(ours_task, raw_put, 0.7))
        put_raw.append(cell(ours_put, raw_put, 0.7))
        ours_bulk = rates(table, db, "taskloop", "enqueue", "", None, "bulk_rate")
        bulk.append(
            cell(ours_bulk, rates(table, db, "djqueue", "drain", "worker", 4, "bulk_enqueue_rate"), 2)
        )
        ours = rates(table, db, "taskloop", "drain", "workers", 4)
        drain.append(cell(ours, rates(table, db, "raw", "drain", "batch 100", 4), 0.5))
        drain_floor.append(cell(ours, rates(table, db, "raw", "drain", "batch 100", 4), 0.8))
        board.append(at_least(rates(table, db, "taskloop", "board", "workers", 4), 5000))
        lat = (table.get((db, "taskloop", "latency", "", None)) or [None])[0]
        pickup.append(below(lat["median_ms"] if lat else None, 15 if db == "postgres" else 50))
        grown = (table.get((db, "taskloop", "growth", "", None)) or [None])[0]
        flat = None
        if grown and sizes:
            first, last = grown["sizes"].get(str(sizes[0])), grown["sizes"].get(str(sizes[-1]))
            if first and last:
                flat = last["median_ms"] <= 1.5 * first["median_ms"]
        growth.append(check(flat))
        runs = [r for r in results if r["database"] == db and "exactly_once" in r]
        once.append(
            check(all(r["exactly_once"] for r in runs) if runs else None)
            + (f" ({len(runs)} runs)" if runs else "")
        )
    keyed_drain = []
    for db in databases:
        pairs = [
            (rates(table, db, "taskloop", "kinds", k, 4), rates(table, db, "taskloop", "kinds", u, 4))
            for k, u in (("utube", "fifo"), ("utubettl", "fifottl"), ("tasks-keyed", "tasks"))
        ]
        measured = [(k, u) for k, u in pairs if k and u]
        keyed_drain.append(
            "–"
            if not measured
            else f"{min(k['median'] / u['median'] for k, u in measured):.2f}× (lowest) "
            + check(all(ge(k, u, 0.5) for k, u in measured))
        )
    target_rows = [
        ("keyed drain ≥ 0.5× unkeyed (by kind)", keyed_drain),
        ("`put` ≥ 2× django-tasks-db's enqueue", put),
        ("Django Task `enqueue()` ≥ 1.5× django-tasks-db's", task_peer),
        ("Django Task `enqueue()` ≥ 0.7× raw SQL's one INSERT per call", task_raw),
        ("`put` ≥ 0.7× raw SQL's one INSERT per call", put_raw),
        ("`put_many` ≥ 2× dj-queue's `enqueue_all`", bulk),
        ("drain ≥ 0.5× raw batch 100", drain),
        ("drain ≥ 0.8× raw batch 100 (issue 43)", drain_floor),
        ("board ≥ 5,000 jobs/s (`@board` workers)", board),
        ("idle pickup median < 50 ms (PostgreSQL < 15 ms)", pickup),
        ("claim latency at the largest size ≤ 1.5× the smallest", growth),
        ("every job exactly once", once),
    ]
    lines.append("| target | " + " | ".join(DB_LABELS[db] for db in databases) + " |")
    lines.append("|---|" + "---|" * len(databases))
    for name, cells in target_rows:
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "What an idle worker costs:", "", "| target | measured | |", "|---|---|---|"]
    lines += [*idle_targets(table), ""]
    lines += [
        "## How it was run",
        "",
        "- Every system has its own virtualenv (`bench/.venvs/`) and its own database (`bench_<system>`), "
        "created afresh; the systems run back to back on the same servers.",
        "- django-taskloop drains through `manage.py workers --burst --processes N` (the `@tube` default "
        "`fifottl` tube, batch 100) and `@board` workers the same way (batch 100: `claim_many` + "
        "`consume_many`); the loop and the board's `claim_next` + `consume` call the facades from N forked "
        "processes.",
        *(
            [
                f"- PostgreSQL's autovacuum is {autovacuum} on this server; each system's database is "
                "`VACUUM`ed before every run (`vacuumdb`, every system alike), so that no scenario carries "
                "the dead rows of the ones before it (the raw-SQL baseline makes its table afresh every run)."
            ]
            if autovacuum is not None
            else []
        ),
        "- The raw-SQL limit (`bench/raw_baseline.py`): claim with `SELECT … FOR UPDATE SKIP LOCKED` + "
        "`UPDATE`, commit, run, `DELETE`, commit; batch 1 and batch 100; its idle worker polls every 5 ms.",
        "- Peers with their defaults: django-tasks-db's `db_worker --batch` × N (`--interval 0.1` while "
        "draining, its default 1 s when idle), django-q2's `qcluster` with N workers on the ORM broker "
        "(poll 0.2 s), dj-queue's `dj_queue --only-work` with N processes of one thread (poll 0.1 s, "
        "LISTEN/NOTIFY on PostgreSQL).",
        "- Sizes and repeats"
        + (
            " (quick run): 1 repeat; 2,000 jobs for ours and raw, 200 for the peers."
            if quick
            else ": ours and raw drain 20,000 jobs, 3 repeats at 4 processes and 1 at 1 and 2; the peers drain "
            "400 jobs (150 on SQLite) at 4 processes with 3 repeats and half that at 1 process once (they are "
            "20–100× slower: 20,000 jobs would take the whole budget); raw batch 1 drains 5,000 (2,000 on "
            "SQLite); the loop has 100,000 ids, 3 repeats on MariaDB and 1 elsewhere; the @board workers drain "
            "20,000 jobs, claim_next + consume 200; "
            "enqueue 200 jobs (3 repeats, peers 2); latency 50 puts 0.2 s apart, one repeat; claim latency "
            "100 take+ack at each size."
        ),
        "",
    ]
    text = "\n".join(lines)
    (out / "report.md").write_text(text)
    return text


def startup_section(table: dict, databases: list[str]) -> list[str]:
    """Start-up: spawn → the first handler start of a task queued before the spawn."""
    rows = []

    def cells(system: str, median: str, most: str) -> list[str]:
        out = []
        for db in databases:
            row = (table.get((db, system, "startup", "", None)) or [None])[0]
            out.append(f"{fmt_ms(row.get(median))} / {fmt_ms(row.get(most))}" if row else "–")
        return out

    for label, system, median, most in (
        ("django-taskloop, tube task (`--only bench`)", "taskloop", "median_ms", "max_ms"),
        ("django-taskloop, Django Task (every handler)", "taskloop", "task_median_ms", "task_max_ms"),
        ("django-taskloop, the floor: `django.setup()` + import", "taskloop", "import_ms", "import_ms"),
        ("django-tasks-db", "tasksdb", "median_ms", "max_ms"),
        ("django-q2", "q2", "median_ms", "max_ms"),
        ("dj-queue", "djqueue", "median_ms", "max_ms"),
    ):
        row = cells(system, median, most)
        if any(c != "–" for c in row):
            rows.append(f"| {label} | " + " | ".join(row) + " |")
    if not rows:
        return []
    return [
        "## Start-up, spawn → first handler start of a task queued before (ms, median / max)",
        "",
        "A worker process spawned (not burst) with one task already queued, import time included; "
        "target under 1,000 ms. Each sample's machine load is in results.json.",
        "",
        "| worker | " + " | ".join(DB_LABELS[db] for db in databases) + " |",
        "|---|" + "---|" * len(databases),
        *rows,
        "",
    ]


def plot(results: list[dict], out: Path, databases: list[str]) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is missing: no plot")
        return None
    table = collect(results)
    fig, axes = plt.subplots(
        1, len(databases), figsize=(max(11, 4.6 * len(databases)), 5), squeeze=False, sharey=True
    )
    series = [
        ("taskloop", "workers", "django-taskloop (workers)", "o-"),
        ("raw", "batch 100", "raw SQL, batch 100", "k--"),
        ("raw", "batch 1", "raw SQL, batch 1", "kx:"),
        ("tasksdb", "worker", "django-tasks-db", "s-"),
        ("q2", "worker", "django-q2 (ORM)", "^-"),
        ("djqueue", "worker", "dj-queue", "d-"),
    ]
    for ax, db in zip(axes[0], databases, strict=False):
        for system, variant, label, style in series:
            xs, ys, lo, hi = [], [], [], []
            for n in (1, 2, 4):
                s = rates(table, db, system, "drain", variant, n)
                if s:
                    xs.append(n)
                    ys.append(s["median"])
                    lo.append(s["median"] - s["min"])
                    hi.append(s["max"] - s["median"])
            if xs:
                ax.errorbar(xs, ys, yerr=[lo, hi], fmt=style, label=label, capsize=3, markersize=5)
        ax.set_title(DB_LABELS[db])
        ax.set_xlabel("worker processes")
        ax.set_xticks([1, 2, 4])
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("drained jobs/s (log scale)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=9)
    fig.suptitle("Drain throughput of no-op jobs against worker processes (2-core machine)", fontsize=11)
    fig.tight_layout(rect=(0, 0.12, 1, 0.95))
    path = out / "throughput.png"
    fig.savefig(path, dpi=110)
    return path


# -- main ----------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer jobs, sizes and repeats: a smoke run")
    parser.add_argument(
        "--databases", default=",".join(DATABASES), help="comma-separated: sqlite,mysql,postgres"
    )
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated: " + ",".join(SYSTEMS))
    parser.add_argument(
        "--scenarios",
        default="",
        help="comma-separated subset (drain,enqueue,latency,loop,board,board_verbs,growth,startup)",
    )
    parser.add_argument("--mysql", default=os.environ.get("BENCH_MYSQL", "mysql://root@127.0.0.1:3306"))
    parser.add_argument("--postgres", default=os.environ.get("BENCH_POSTGRES", "postgres://"))
    parser.add_argument("--out", default=str(HERE / "results"))
    parser.add_argument(
        "--report-only", action="store_true", help="rewrite report and plot from results.json"
    )
    args = parser.parse_args()
    databases = [d for d in args.databases.split(",") if d]
    systems = [s for s in args.systems.split(",") if s]
    for name in databases:
        if name not in DATABASES:
            parser.error(f"--databases: unknown {name!r}")
    for name in systems:
        if name not in SYSTEMS:
            parser.error(f"--systems: unknown {name!r}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    # Our virtualenv first: this harness re-runs itself there, for matplotlib.
    VENVS.mkdir(exist_ok=True)
    ensure_venv("taskloop")
    if Path(sys.prefix).resolve() != (VENVS / "taskloop").resolve():
        os.execv(str(venv_python("taskloop")), [str(venv_python("taskloop")), __file__, *sys.argv[1:]])

    if args.report_only:
        saved = json.loads((out / "results.json").read_text())
        write_report(
            saved["results"],
            out,
            saved["quick"],
            saved["databases"],
            saved["elapsed"],
            saved.get("load", "?"),
            saved.get("autovacuum"),
        )
        plot(saved["results"], out, saved["databases"])
        return
    for system in systems:
        ensure_venv(VENV_OF[system])

    steps = plan(args.quick, databases, systems)
    if args.scenarios:
        wanted = set(args.scenarios.split(","))
        steps = [s for s in steps if s.scenario in wanted]
    results: list[dict] = []
    started = time.monotonic()
    # Other work on the machine shows directly in the numbers: say how busy it was.
    load_start = os.getloadavg()[0]
    log = open(out / "run.log", "w")  # noqa: SIM115
    record_dir = out / "records"
    prepared: set[tuple[str, str]] = set()
    autovacuum = pg_autovacuum(args) if "postgres" in databases else None
    for step in steps:
        url = database_url(step.system, step.database, args, out)
        if (step.system, step.database) not in prepared:
            recreate_database(step.system, step.database, args, out)
            setup_system(step.system, step.database, url, record_dir, log)
            prepared.add((step.system, step.database))
        for i in range(step.repeats):
            if step.database == "postgres":
                vacuum(step.system, args)
            t0 = time.monotonic()
            try:
                r = run_once(step, url, record_dir, log)
            except (RuntimeError, subprocess.TimeoutExpired) as error:
                print(
                    f"  FAILED {step.system} {step.scenario} on {step.database}: {str(error)[:500]}",
                    flush=True,
                )
                continue
            r.update(database=step.database, variant=step.variant, processes=step.processes, repeat=i)
            results.append(r)
            shown = (
                f"{r['rate']:,.0f}/s"
                if "rate" in r
                else f"{r['median_ms']:.1f} ms"
                if "median_ms" in r
                else json.dumps(r.get("sizes"))[:120]
            )
            once = "" if r.get("exactly_once", True) else "  NOT EXACTLY ONCE"
            print(
                f"[{(time.monotonic() - started) / 60:5.1f} min] {step.database:8} {LABELS[step.system]:16} "
                f"{step.scenario:8} {step.variant:10} {step.processes or '':>2}  {shown}{once}  "
                f"({time.monotonic() - t0:.1f} s)",
                flush=True,
            )
        elapsed = time.monotonic() - started
        load = f"{load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
        (out / "results.json").write_text(
            json.dumps(
                {
                    "quick": args.quick,
                    "databases": databases,
                    "elapsed": elapsed,
                    "load": load,
                    "autovacuum": autovacuum,
                    "results": results,
                },
                indent=1,
            )
        )
    elapsed = time.monotonic() - started
    load = f"{load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
    write_report(results, out, args.quick, databases, elapsed, load, autovacuum)
    png = plot(results, out, databases)
    print(f"\n{len(results)} results in {elapsed / 60:.1f} minutes: {out / 'report.md'}, {png}")


if __name__ == "__main__":
    main()
