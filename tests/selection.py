"""Where each test runs, and that nothing is skipped unseen (a pytest plugin of the suite).

- ``@pytest.mark.vendors("mysql", ...)``: a test of one database's behaviour. On another database
  it is not collected (not skipped: nothing was wanted there), and the summary counts it.
- Vendor-independent tests (:data:`VENDOR_INDEPENDENT`, marked ``vendor_independent``): what they
  check does not depend on the database. CI runs them once per Django version, on its SQLite
  leg; a leg with ``TASKLOOP_VENDOR_TESTS_ONLY=1`` (MariaDB, PostgreSQL) leaves them out and
  says so.
- Under ``-n`` (pytest-xdist): the tests that start their own servers share one process
  (``--dist loadgroup``: one throwaway server at a time per run). A test marked ``alone`` (it
  reads what the whole server does, such as its oldest transaction) runs while no other test on
  that server does: of this run, or of another run on the same server (CI's legs side by side).
  A test marked ``quiet`` (it measures a latency, which a busy machine stretches) runs while no
  other test of any run on this machine does.
- ``TASKLOOP_STRICT_SKIPS=1`` (CI): any skip fails the run. A test CI is meant to run that
  cannot run here (a missing tool, browser or module) is a failure, not a line in a summary.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

#: Test modules whose outcome does not depend on the database vendor, and why. They still use a
#: database (SQLite on the leg that runs them); what they check is the package's own logic,
#: rendering or commands, whose SQL is the same ORM on every vendor and is covered, vendor by
#: vendor, by the modules not listed here.
VENDOR_INDEPENDENT: dict[str, str] = {
    "tests/test_architecture.py": "the package's imports and sizes",
    "tests/test_layers.py": "which module may import which",
    "tests/test_stop_event.py": "a stop's signal handling, no database",
    "tests/test_worker_stops.py": "signals racing a supervisor and its children (what a stop gives back "
    "goes through the verbs, tested on every database)",
    "tests/test_readme.py": "the README's examples as written (the verbs they call: their own tests)",
    "tests/test_checks_settings.py": "the TASKLOOP setting's validation",
    "tests/test_fresh_project.py": "a project of its own on SQLite: TASKS forgotten or another backend",
    "tests/test_docs_site.py": "the documentation site's build and its settings reference",
    "tests/test_terminal.py": "the terminal's commands and output (the read model: tests/test_stats.py)",
    "tests/test_task_names.py": "how a task is named",
    "tests/test_task_names_admin.py": "task names in the admin's pages",
    "tests/test_task_names_logs.py": "task names in the worker's log lines",
    "tests/test_admin_boards.py": "the admin's pages and actions (their SQL: the verbs' own tests)",
    "tests/test_admin_dashboard.py": "the admin's pages",
    "tests/test_admin_lockable.py": "the admin's pages",
    "tests/test_admin_loops.py": "the admin's pages and actions",
    "tests/test_admin_operating.py": "the admin's pages and actions",
    "tests/test_admin_results.py": "the admin's pages",
    "tests/test_admin_tubes.py": "the admin's pages and actions",
    "tests/browser/test_admin_browser.py": "the admin in a browser",
    "tests/browser/test_admin_glance_browser.py": "the admin in a browser",
    "tests/browser/test_task_names_browser.py": "the admin in a browser",
}

#: Tests of the database's own behaviour under real processes racing (kills, contention, eight
#: processes on one queue) and of servers going away: what they race is SQL the engine compiles
#: the same way on every Django line (the statements themselves are pinned per line by
#: tests/test_kept_statements.py and the plan tests). CI runs them on one Django line per
#: database; a leg with ``TASKLOOP_ONE_LINE_TESTS=0`` leaves them out and says so.
ONE_DJANGO_LINE: dict[str, str] = {
    "tests/reliability/test_kills.py": "kill -9 during drains",
    "tests/reliability/test_contention.py": "sixteen processes on one queue",
    "tests/reliability/test_stateful.py": "the queues against their reference models",
    "tests/reliability/test_fuzz.py": "random verbs against the reference models",
    "tests/test_boards.py::test_eight_processes_consume_every_job_exactly_once": "a race",
    "tests/test_loops.py::test_eight_processes_work_one_loop_without_holding_an_id_twice": "a race",
    "tests/test_lockable.py::test_eight_processes_claim_every_row_exactly_once": "a race",
    "tests/test_tubes.py::test_eight_consumers_ack_every_task_once_and_never_share_a_sub_queue": "a race",
    "tests/test_tube_limits.py::test_six_processes_never_hold_more_than_the_limit": "a race",
    "tests/test_tube_rates.py::test_six_processes_never_take_more_than_the_rate": "a race",
    "tests/test_key_limits.py::test_six_processes_never_hold_more_than_the_key_limit": "a race",
    "tests/test_key_limits.py::test_six_processes_never_take_more_than_the_key_rate": "a race",
    "tests/test_schedules.py::test_racing_processes_claim_each_tick_exactly_once": "a race",
    "tests/test_schedules.py::test_every_tick_runs_once_across_processes_and_hosts": "a race",
    "tests/test_schedules.py::test_a_periodic_run_whose_worker_is_killed_runs_again_and_its_tick_once": "kill -9",
    "tests/test_worker_stops.py": "signals and kills racing a supervisor and its children",
}

#: Tests that run ``manage.py workers`` processes and wait on them. CI runs them once per database
#: and once per Django line: on Django 6.1's SQLite leg and on Django 5.2's MariaDB and
#: PostgreSQL legs; ``TASKLOOP_WORKER_TESTS=0`` leaves them out of the others. The statements
#: such a worker sends are the ones the in-process tests pin on every line and database.
WORKER_PROCESSES: dict[str, str] = {
    "tests/test_workers.py": "workers draining, stopping, pausing",
    "tests/test_concurrency.py": "workers running many items at once",
    "tests/test_worker_edges.py": "workers' edge cases",
    "tests/test_task_options_workers.py": "task options as workers run them",
    "tests/test_idle.py": "an idle worker's cost",
    "tests/test_startup.py": "a worker's start",
    "tests/test_async_backend.py": "async tasks in workers",
    "tests/test_reload.py": "workers reloading on a code change",
    "tests/test_progress.py::test_a_worker_shows_progress_renews_the_lease_and_drops_it_at_the_end": "",
    "tests/test_task_queue_limits.py::test_a_queue_s_limit_holds_across_worker_processes": "",
}

_SAID: list[str] = []


def pytest_configure(config: Any) -> None:
    config.addinivalue_line(
        "markers", "vendors(*names): runs only on these databases (sqlite, mysql, postgresql)"
    )
    config.addinivalue_line(
        "markers", "vendor_independent: the same on every database (CI runs it on SQLite only)"
    )
    config.addinivalue_line(
        "markers", "one_django_line: races and servers: CI runs it under one Django line per database"
    )
    config.addinivalue_line("markers", "worker_processes: runs manage.py workers processes and waits on them")
    config.addinivalue_line(
        "markers", "quiet: it measures latency: runs while no other test on the machine runs (any run)"
    )
    config.addinivalue_line("markers", "alone: runs while no other test on its database server does")
    config.addinivalue_line(
        "markers", "needs_module(name, extra): runs where the module imports (else left out, and said)"
    )
    # pytest-xdist's, named here too so that a run without it (-p no:xdist) still collects.
    config.addinivalue_line("markers", "xdist_group(name): under -n, these tests share one process")


def _vendor() -> str:
    from django.conf import settings

    engine = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
    return {"sqlite3": "sqlite"}.get(engine, engine)


def say(line: str) -> None:
    """Print ``line`` in the run's summary (under -n, from the process that collected it)."""
    if line not in _SAID:
        _SAID.append(line)


def deselect(config: Any, items: list[Any], leave: list[Any], said: str) -> None:
    """Leave ``leave`` out of ``items`` and say so: ``said`` with their count."""
    if leave:
        config.hook.pytest_deselected(items=leave)
        gone = set(map(id, leave))
        items[:] = [item for item in items if id(item) not in gone]
        say(said.format(len(leave)))


def pytest_itemcollected(item: Any) -> None:
    # Marked as collected, before any pytest_collection_modifyitems (pytest-xdist reads the
    # groups there, --dist loadgroup).
    from tests.reliability.conftest import SERVER_FIXTURES

    # A table names a module, or a test (all its parameters).
    names = {item.nodeid.split("::", 1)[0], item.nodeid.split("[", 1)[0]}
    for table, marker in (
        (VENDOR_INDEPENDENT, pytest.mark.vendor_independent),
        (ONE_DJANGO_LINE, pytest.mark.one_django_line),
        (WORKER_PROCESSES, pytest.mark.worker_processes),
    ):
        if names & table.keys():
            item.add_marker(marker)
    if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
        item.add_marker(pytest.mark.one_django_line)
        if os.environ.get("PYTEST_XDIST_WORKER"):
            item.add_marker(pytest.mark.xdist_group("servers"))


def pytest_collection_finish(session: Any) -> None:
    """Under --dist loadgroup, the groups took (pytest-xdist marks them in the tests' names): a
    pytest that names tests otherwise would spread the server tests over every process."""
    if not getattr(session.config.option, "loadgroup", False):
        return
    lost = [
        item.nodeid
        for item in session.items
        if item.get_closest_marker("xdist_group") and "@" not in item.nodeid
    ]
    if lost:
        raise pytest.UsageError(
            f"--dist loadgroup did not group {len(lost)} test(s) (first: {lost[0]}): this pytest and "
            "pytest-xdist disagree on how a test is named (pytest-xdist issue 1386); see pyproject.toml"
        )


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    vendor = _vendor()
    elsewhere = [
        item
        for item in items
        if (marker := item.get_closest_marker("vendors")) is not None and vendor not in marker.args
    ]
    deselect(config, items, elsewhere, f"{{}} test(s) of other databases' behaviour: not for {vendor}")
    # A test that needs a driver this virtualenv lacks (the README's command installs no
    # MySQL client): left out and said, not skipped; CI (strict) installs it, and runs it.
    if os.environ.get("TASKLOOP_STRICT_SKIPS") != "1":
        missing = [
            item
            for item in items
            if any(importlib.util.find_spec(m.args[0]) is None for m in item.iter_markers("needs_module"))
        ]
        needed = sorted({m.args for item in missing for m in item.iter_markers("needs_module")})
        said = ", ".join(f"{name} (pip install -e '.[{extra}]')" for name, extra in needed)
        deselect(config, items, missing, f"{{}} test(s) not run: missing {said}")
    for variable, value, marker, said in _LEFT_TO_OTHER_LEGS:
        if os.environ.get(variable) == value:
            leave = [item for item in items if item.get_closest_marker(marker)]
            deselect(config, items, leave, f"{{}} test(s) {said} ({variable}={value})")


#: CI's selections by marker: (variable, value, marker, what the summary says of those left out).
_LEFT_TO_OTHER_LEGS = [
    (
        "TASKLOOP_ONE_LINE_TESTS",
        "0",
        "one_django_line",
        "of concurrency and servers left to this database's leg on another Django line",
    ),
    (
        "TASKLOOP_WORKER_TESTS",
        "0",
        "worker_processes",
        "that run worker processes left to other legs (CI: Django 6.1 on SQLite, Django 5.2 on "
        "MariaDB and PostgreSQL)",
    ),
    (
        "TASKLOOP_BROWSER_TESTS",
        "0",
        "browser",
        "in a browser left to the oldest and newest Django lines' SQLite legs",
    ),
    (
        "TASKLOOP_VENDOR_TESTS_ONLY",
        "1",
        "vendor_independent",
        "independent of the database left to the SQLite leg of this Django version",
    ),
]


# -- alone, under -n ------------------------------------------------------------------------


def _lock_path(name: str) -> str:
    """The lock file ``name`` of the database server this run uses: machine-wide, so that runs
    side by side on one server (CI's legs) take turns as one run's processes do. SQLite: this
    run's own (run-tests.sh gives each run a temporary directory)."""
    from django.conf import settings

    database = settings.DATABASES["default"]
    if "sqlite" in database["ENGINE"]:
        return os.path.join(tempfile.gettempdir(), f"taskloop-tests-{name}.lock")
    server = f"{_vendor()}-{database.get('HOST') or 'local'}-{database.get('PORT') or ''}".replace("/", "_")
    return f"/tmp/taskloop-tests-{server}-{name}.lock"


@contextmanager
def _turn(path: str, alone: bool) -> Iterator[None]:
    """Every test holds lock ``path`` shared, a test that must be alone holds it exclusively. A
    turnstile in front keeps a waiting ``alone`` test from being starved by the others."""
    with open(f"{path}.turnstile", "a") as turnstile, open(path, "a") as tests:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(tests, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            if not alone:
                fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(tests, fcntl.LOCK_UN)
            if alone:
                fcntl.flock(turnstile, fcntl.LOCK_UN)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: Any, nextitem: Any) -> Any:
    # Around the whole protocol (setup, call, teardown), before any fixture opens a transaction.
    # Always the machine's lock first, then the server's: no two tests wait on each other.
    quiet = item.get_closest_marker("quiet") is not None
    alone = item.get_closest_marker("alone") is not None
    with _turn("/tmp/taskloop-tests-machine.lock", quiet), _turn(_lock_path("tests"), alone):
        yield


# -- nothing skipped unseen ------------------------------------------------------------------

_SKIPPED: list[str] = []


def pytest_runtest_logreport(report: Any) -> None:
    if report.skipped and os.environ.get("TASKLOOP_STRICT_SKIPS") == "1":
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _SKIPPED.append(f"{report.nodeid}: {reason}")


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # Under -n the summary is printed by the controller: hand it what was said here.
        session.config.workeroutput["taskloop_said"] = list(_SAID)
    elif _SKIPPED:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook (absent under -p no:xdist)
def pytest_testnodedown(node: Any, error: Any) -> None:
    for line in getattr(node, "workeroutput", {}).get("taskloop_said", []):
        say(line)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for line in _SAID:
        terminalreporter.write_line(line, yellow=True)
    if _SKIPPED:
        terminalreporter.write_line(
            f"TASKLOOP_STRICT_SKIPS=1: {len(_SKIPPED)} test(s) skipped that this run is meant to run:",
            red=True,
        )
        for line in _SKIPPED:
            terminalreporter.write_line(f"  {line}", red=True)
