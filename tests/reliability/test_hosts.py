"""Workers on three hosts drain one tube; one host's link is cut mid-drain; nothing is lost.

The hosts are network namespaces made by the test (``ip netns`` + veth pairs on a private
bridge); the throwaway database server listens on the bridge, so each host's workers reach it
over their own link. Cutting a link sends no reset: the cut-off worker hangs in the middle of
whatever it was doing, its heartbeats stop, its tasks' ttr (3 s) runs out, and the other two
hosts take them over and finish. If it was cut inside a transaction, its row locks stand until
the server drops the session: the throwaway servers do that after 10 s idle in a transaction
(``idle_in_transaction_session_timeout``, MariaDB's ``idle_transaction_timeout``), as
production servers should (docs/guarantees.md). The cut-off worker never acknowledges anything after the cut,
so every task is acknowledged exactly once.

SQLite runs use the throwaway PostgreSQL: an embedded database has no link to cut.
"""

from __future__ import annotations

import signal

import pytest

from .conftest import BRIDGE_ADDRESS, django_env, run_remote
from .workers import OVERRIDES, SETTINGS, Workers, wait_until

pytestmark = pytest.mark.slow

TASKS = 3_000


def remaining(server) -> int:
    return server.execute("SELECT COUNT(*) FROM taskloop_task")[0][0]


def test_cut_host_leases_run_out_and_the_others_finish(netns_hosts, throwaway, capsys):
    assert run_remote(throwaway.url(), "tests.reliability.scenarios:fill_tube", TASKS) == TASKS
    env = django_env(
        throwaway.url(host=BRIDGE_ADDRESS),
        DJANGO_SETTINGS_MODULE=SETTINGS,
        TASKLOOP_OVERRIDES=OVERRIDES,
    )
    fleet = [
        Workers.start(
            "--only", "r-tube", "--processes", "1", env=env, prefix=["ip", "netns", "exec", host.netns]
        )
        for host in netns_hosts
    ]
    victim, cut_host = fleet[0], netns_hosts[0]
    try:
        # Cut host 1 once it is busy: it holds a batch when its link goes.
        wait_until(lambda: remaining(throwaway) < TASKS * 0.8, 120, what="a fifth of the drain")
        cut_host.cut()
        left_at_cut = remaining(throwaway)
        wait_until(lambda: remaining(throwaway) == 0, 180, every=0.5, what="the other hosts to finish")
        # The cut-off worker is stuck in a database call that will never answer.
        assert victim.process.poll() is None
        victim.process.send_signal(signal.SIGKILL)
        victim.process.wait(30)
    finally:
        cut_host.restore()
        outputs = [workers.stop() for workers in fleet]
    for workers, output in zip(fleet[1:], outputs[1:], strict=True):
        assert workers.process.returncode == 0, output
    report = run_remote(throwaway.url(), "tests.reliability.scenarios:tube_report")
    assert report["stats"]["tasks"]["total"] == 0
    assert report["stats"]["tasks"]["done"] == TASKS
    assert report["stats"]["calls"]["ack"] == TASKS  # each acknowledged exactly once
    assert report["keys"] == TASKS
    # The cut host's unacknowledged batch (at most 50 tasks) ran again on the others.
    assert report["runs"] - TASKS <= 50, report["runs"]
    with capsys.disabled():
        print(
            f"\n[reliability] netns hosts ({throwaway.vendor}): host1 cut with {left_at_cut} tasks left; "
            f"{report['runs'] - TASKS} re-runs; all {TASKS} acked once"
        )
