"""A three-node Galera cluster: the single-writer shape survives the writer's death, workers
writing to every node stay correct, and a node that is not ready is a lost connection.

MariaDB runs only (the suite's database is MariaDB, ``TASKLOOP_START_SERVERS=1``), with
Debian's galera-4. One cluster serves the module; the test that kills a node runs last.

- Single writer (MaxScale / ProxySQL): every worker connection goes through a proxy to one
  node. Mid-drain the test kills that node (``SIGKILL``) and points the proxy at node 2: every
  task is done and acknowledged once, re-runs stay within a batch per worker process.
- Every node a writer: a worker process per node drains one tube. Claims on different nodes
  meet at certification (error 1213, mostly at COMMIT), which the engine retries: nothing lost,
  nothing run twice.
- A node out of the primary component answers error 1047 to every statement that reads a
  table while its connections still answer a ping: the engine drops such a connection, so the
  next call connects again (through the proxy, to a node that works).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from .conftest import DB_NAME, ROOT, django_env, run_remote
from .galera import PROVIDER, Cluster, Proxy, status
from .workers import OVERRIDES, SETTINGS, Workers, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.vendors("mysql")]  # Galera is MariaDB's

TASKS = 3_000
BATCH = 50  # the r-tube handler's batch (workerapp)


@pytest.fixture(scope="module")
def galera(suite_vendor: str) -> Iterator[Cluster]:
    """A running three-node cluster with the suite's tables migrated on it."""
    if not PROVIDER.exists():
        pytest.skip(f"galera is not installed ({PROVIDER} missing: apt-get install galera-4)")
    cluster = Cluster()
    try:
        cluster.start()
        first = cluster.nodes[0]
        first.execute(f"CREATE DATABASE {DB_NAME} CHARACTER SET utf8mb4", database=None)
        migrated = subprocess.run(
            [sys.executable, "-m", "django", "migrate", "--run-syncdb", "-v", "0"],
            env=django_env(first.url()),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert migrated.returncode == 0, migrated.stdout + migrated.stderr
        yield cluster
    finally:
        cluster.stop()


def remaining(node) -> int | None:
    try:
        return node.execute("SELECT COUNT(*) FROM taskloop_task")[0][0]
    except node.driver_errors():
        return None


def worker_env(url: str) -> dict[str, str]:
    return django_env(url, DJANGO_SETTINGS_MODULE=SETTINGS, TASKLOOP_OVERRIDES=OVERRIDES)


def clear(cluster: Cluster) -> None:
    """Empty the tables the drains use (through node 2, which every test leaves running)."""
    for table in ("taskloop_task", "taskloop_tube_stat", "taskloop_tube", "testapp_worklog"):
        cluster.nodes[1].execute(f"DELETE FROM {table}")


def assert_each_acked_once(report: dict, reruns_allowed: int) -> int:
    assert report["stats"]["tasks"]["total"] == 0, report["stats"]
    assert report["stats"]["tasks"]["done"] == TASKS
    assert report["stats"]["calls"]["ack"] == TASKS  # each acknowledged exactly once
    assert report["keys"] == TASKS  # every task ran: nothing lost
    reruns = report["runs"] - TASKS
    assert reruns <= reruns_allowed, (reruns, report["twice"])
    return reruns


def test_writers_on_every_node_lose_nothing_and_run_nothing_twice(galera, capsys):
    clear(galera)
    nodes = galera.nodes
    assert run_remote(nodes[0].url(), "tests.reliability.scenarios:fill_tube", TASKS) == TASKS
    conflicts_before = galera.conflicts()
    started = time.monotonic()
    workers = [Workers.start("--only", "r-tube", env=worker_env(node.url())) for node in nodes]
    try:
        wait_until(lambda: remaining(nodes[1]) == 0, 120, every=0.5, what="the drain on three nodes")
    finally:
        outputs = [w.stop() for w in workers]
    took = time.monotonic() - started
    for w, output in zip(workers, outputs, strict=True):
        assert w.process.returncode == 0, output[-3000:]
        assert "stayed locked or deadlocked" not in output, output[-3000:]
    # Every node did a share of the work.
    report = run_remote(nodes[2].url(), "tests.reliability.scenarios:tube_report")
    conflicts = galera.conflicts() - conflicts_before
    assert_each_acked_once(report, reruns_allowed=0)
    with capsys.disabled():
        print(
            f"\n[reliability] galera multi-writer: {TASKS} tasks on 3 nodes in {took:.1f} s, "
            f"0 lost, {report['runs'] - TASKS} run twice, {conflicts} certification conflicts (1213) retried"
        )


def test_one_row_written_on_every_node_at_once_is_retried_at_commit(galera, capsys):
    """Each node certifies its transactions against the others' at COMMIT: two nodes that
    update one row at once fail one of the two with error 1213 there, which
    ``engine.run_in_transaction`` retries (with jitter) like any deadlock."""
    nodes = galera.nodes
    nodes[0].execute("DELETE FROM testapp_worklog WHERE kind = 'g-shared'")
    nodes[0].execute(
        "INSERT INTO testapp_worklog (kind, `key`, phase, pid, at) VALUES ('g-shared', '', 'end', 0, 0)"
    )
    times, start_at = 150, time.time() + 3  # every process past its start-up by then
    before = galera.conflicts()
    env = {"DJANGO_SETTINGS_MODULE": SETTINGS, "TASKLOOP_OVERRIDES": '{"RETRIES": 30}'}
    bumpers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.reliability.remote",
                "tests.reliability.galera:bump_shared_row",
                json.dumps([times, start_at]),
            ],
            env=django_env(node.url(), **env),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node in nodes
    ]
    outputs = [bumper.communicate(timeout=120)[0] for bumper in bumpers]
    for bumper, output in zip(bumpers, outputs, strict=True):
        assert bumper.returncode == 0, output[-3000:]
    conflicts = galera.conflicts() - before
    galera.wait_synced(nodes)
    assert nodes[1].execute("SELECT at FROM testapp_worklog WHERE kind = 'g-shared'") == [(3 * times,)]
    assert conflicts > 0, "the nodes never wrote the row at the same moment: nothing was retried"
    with capsys.disabled():
        print(
            f"\n[reliability] galera one row from 3 nodes: {3 * times} updates, none lost, "
            f"{conflicts} certification conflicts (1213) retried"
        )


def test_a_node_not_ready_is_a_lost_connection(galera, tmp_path, capsys):
    clear(galera)
    third = galera.nodes[2]
    proxy = Proxy(third.port)
    client = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.reliability.remote",
            "tests.reliability.galera:not_ready_then_failover",
            f'["{tmp_path}"]',
        ],
        env=django_env(f"mysql://root@127.0.0.1:{proxy.port}/{DB_NAME}"),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_until(lambda: (tmp_path / "connected").exists() or client.poll() is not None, 60)
        assert client.poll() is None, client.communicate()[0]
        # Node 3 leaves the cluster: it is not ready (wsrep_ready OFF), yet it answers pings.
        third.execute("SET GLOBAL wsrep_provider_options='gmcast.isolate=1'", database=None)
        wait_until(lambda: status(third, "wsrep_ready") == "OFF", 60, what="node 3 not ready")
        # A worker's look at it counts it unreachable (it would wait, as for an outage),
        # though it accepts connections; a node that is ready is reachable.
        assert run_remote(third.url(), "tests.reliability.galera:reach_error") == "1047"
        assert run_remote(galera.nodes[1].url(), "tests.reliability.galera:reach_error") is None
        proxy.switch(galera.nodes[1].port, cut=False)  # new connections go to node 2
        (tmp_path / "switched").touch()
        output, _ = client.communicate(timeout=120)
    finally:
        if client.poll() is None:
            client.kill()
        proxy.close()
        # Node 3 comes back (IST from the others) before the next test needs all three.
        third.execute("SET GLOBAL wsrep_provider_options='gmcast.isolate=0'", database=None)
        galera.wait_synced(galera.nodes)
    assert client.returncode == 0, output
    result = json.loads(output.strip().splitlines()[-1])
    assert result["first_error"] == 1047, result
    assert result["dropped"], result
    assert result["ready"] == 2, result  # the first put and the last
    with capsys.disabled():
        print(
            "\n[reliability] galera node not ready: error 1047 dropped the connection, "
            "the next put reached node 2"
        )


def test_single_writer_dies_mid_drain_and_a_proxy_fails_over(galera, capsys):
    clear(galera)
    first, second, _ = galera.nodes
    assert run_remote(first.url(), "tests.reliability.scenarios:fill_tube", TASKS) == TASKS
    proxy = Proxy(first.port)
    processes = 2
    workers = Workers.start(
        "--only",
        "r-tube",
        "--processes",
        str(processes),
        env=worker_env(f"mysql://root@127.0.0.1:{proxy.port}/{DB_NAME}"),
    )
    try:
        wait_until(lambda: (remaining(second) or TASKS) < TASKS * 0.8, 120, what="a fifth of the drain")
        first.stop(crash=True)  # the writer dies (kill -9)
        down_at = time.monotonic()
        proxy.switch(second.port)  # the proxy sees it and routes to node 2
        try:
            wait_until(lambda: remaining(second) == 0, 90, every=0.5, what="the drain on node 2")
        except AssertionError as error:
            raise AssertionError(
                f"{error}; {remaining(second)} left:\n{workers.dump_stacks()[-15000:]}"
            ) from None
        failover = time.monotonic() - down_at
    finally:
        output = workers.stop()
        proxy.close()
    assert workers.process.returncode == 0, output[-3000:]
    report = run_remote(second.url(), "tests.reliability.scenarios:tube_report")
    kills = 1
    # Only work in flight when the writer died runs again: at most a batch per process.
    reruns = assert_each_acked_once(report, reruns_allowed=kills * processes * BATCH)
    with capsys.disabled():
        print(
            f"\n[reliability] galera single writer killed mid-drain: {TASKS} tasks, 0 lost, "
            f"{reruns} re-runs (bound {kills * processes * BATCH}), {kills} kill, "
            f"drained {failover:.1f} s after the kill"
        )
