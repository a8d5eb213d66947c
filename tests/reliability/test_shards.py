"""One tube over three database servers (issue 31, part 1): a shard's server dies mid-drain.

Tube ``r-shards`` (``utubettl``) is spread by ``TASKLOOP["SHARDS"]`` over three throwaway
servers of the run's vendor (MariaDB on MariaDB runs, PostgreSQL on the others): the
``throwaway`` server as ``default`` and two more as ``shard1`` and ``shard2``. Tasks are put
under 60 utube keys, so each key's tasks live on one shard. Two worker processes drain all
three; mid-drain the test kills ``shard1``'s server outright, checks that the other shards'
tasks keep running while it is down, and starts it again. Then: every task ran, each shard's
tasks were acknowledged exactly once, each key's tasks first ran in the order they were put,
and only work in flight at the kill ran twice.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from .conftest import BASE, ROOT, Server, django_env
from .shard_scenarios import KEYS
from .workers import OVERRIDES, Workers, wait_until

pytestmark = pytest.mark.slow

PER_KEY = 50
TASKS = KEYS * PER_KEY
SETTINGS = "tests.reliability.shard_settings"


def free_port() -> int:
    """A port nothing listens on or connects from now (the system's choice)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_on_a_free_port(server: Server) -> None:
    """Start ``server`` on a port that is free now; again on another if that one was taken
    meanwhile (CI: a fixed port was the local end of some client's connection)."""
    for attempt in range(3):
        server.port = free_port()
        try:
            server.start()
            return
        except (TimeoutError, RuntimeError):
            if attempt == 2:
                raise


@pytest.fixture
def more_servers(throwaway: Server) -> Iterator[list[Server]]:
    """Two more throwaway servers of the throwaway's vendor, each with a fresh database."""
    servers = []
    try:
        for n in (1, 2):
            server = Server(throwaway.vendor, 0, BASE / f"{throwaway.vendor}-shard{n}", ["127.0.0.1"])
            servers.append(server)
            server.install()
            start_on_a_free_port(server)
            server.recreate_database()
        yield servers
    finally:
        for server in servers:
            with contextlib.suppress(Exception):
                server.stop()
            shutil.rmtree(server.directory, ignore_errors=True)


def remote(env: dict[str, str], target: str, *args: Any) -> Any:
    """Run ``tests.reliability.shard_scenarios:target(*args)`` in a process of the shard settings."""
    import json

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.reliability.remote",
            f"tests.reliability.shard_scenarios:{target}",
            json.dumps(args),
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"{target} failed:\n{done.stdout}\n{done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def left(server: Server) -> int | None:
    try:
        return server.execute("SELECT COUNT(*) FROM taskloop_task")[0][0]
    except server.driver_errors():
        return None


def runs(server: Server) -> int:
    return server.execute("SELECT COUNT(*) FROM testapp_worklog WHERE kind = 'r-shards'")[0][0]


def test_a_shard_killed_mid_drain_loses_nothing_and_stops_no_other(throwaway, more_servers, capsys):
    every = [throwaway, *more_servers]
    victim = more_servers[0]
    env = django_env(
        throwaway.url(),
        DJANGO_SETTINGS_MODULE=SETTINGS,
        TASKLOOP_OVERRIDES=OVERRIDES,
        TASKLOOP_SHARD_URLS=",".join(server.url() for server in more_servers),
    )
    held = remote(env, "fill", PER_KEY)
    assert sum(held.values()) == TASKS and set(held) == {"default", "shard1", "shard2"}, held
    workers = Workers.start("--only", "r-shards", "--processes", "2", env=env)
    failed: AssertionError | None = None
    try:
        wait_until(lambda: runs(throwaway) >= TASKS // 5, 120, what="a fifth of the drain")
        victim.stop(crash=True)
        down_at = time.monotonic()
        during = runs(throwaway)
        time.sleep(4)
        # The other shards' tasks kept running while shard1 was down.
        ran_while_down = runs(throwaway) - during
        victim.start()
        outage = time.monotonic() - down_at
        wait_until(
            lambda: all(left(server) == 0 for server in every), 180, every=0.5, what="every shard drained"
        )
    except AssertionError as error:
        failed = error
    finally:
        output = workers.stop()
    if failed is not None:
        counts = {server.port: left(server) for server in every}
        raise AssertionError(f"{failed}; tasks left by port {counts}; the workers said:\n{output[-4000:]}")
    assert workers.process.returncode == 0, output[-3000:]
    assert "its queues wait for it, the others go on" in output, output[-3000:]
    assert ran_while_down > 0, output[-3000:]
    report = remote(env, "report")
    assert report["stats"]["tasks"]["total"] == 0, report
    assert report["stats"]["tasks"]["done"] == TASKS, report
    assert report["stats"]["calls"]["ack"] == TASKS, report  # each acknowledged exactly once
    for alias, tasks in report["shards"].items():
        assert tasks["done"] == held[alias], (alias, report)
    assert report["keys"] == TASKS  # every task ran
    assert report["out_of_order"] == [], report  # each key's tasks in the order put
    # Only work in flight at the kill runs again: two workers, at most a batch of 50 each.
    reruns = report["runs"] - TASKS
    assert reruns <= 2 * 50, reruns
    with capsys.disabled():
        print(
            f"\n[reliability] {throwaway.vendor} shards: {TASKS} tasks over 3 servers {held}; shard1 "
            f"killed for {outage:.1f} s, {ran_while_down} ran on the others meanwhile; "
            f"{reruns} re-runs, 0 lost, 0 out of order"
        )
