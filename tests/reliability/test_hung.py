"""A database server that hangs is a server that is down, within bounded time (issue 39).

A hung server (here SIGSTOP: it keeps its connections and its port, the kernel acknowledges
what is sent, nothing answers) ends no statement by itself: no server-side timeout can fire,
and TCP keepalives are answered by the kernel. Before, with one shard of three frozen for 8 s,
two workers ran nothing at all on the two healthy shards for the whole 8 s, and a put whose
turn was the frozen shard waited 8 s. Every round trip of ours now has a client-side deadline
(``TASKLOOP["DATABASE_TIMEOUT"]``; a put with no key: ``SHARD_PUT_TIMEOUT``).
"""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest

from .conftest import Server, django_env
from .shard_scenarios import KEYS
from .test_shards import SETTINGS, TASKS, left, remote, runs
from .test_shards import more_servers as more_servers  # the fixture: two more throwaway servers
from .workers import OVERRIDES, Workers, wait_until

pytestmark = pytest.mark.slow

PER_KEY = TASKS // KEYS
FROZEN_FOR = 8.0
#: The test's bounds: 2 s for our round trips, a put with no key 1 s on one shard.
TIMEOUTS = {"DATABASE_TIMEOUT": 2, "SHARD_PUT_TIMEOUT": 1}


def _overrides() -> str:
    return json.dumps({**json.loads(OVERRIDES), **TIMEOUTS})


def test_a_hung_shard_stops_no_other_and_puts_move_on(throwaway, more_servers, capsys):  # noqa: F811
    every = [throwaway, *more_servers]
    victim = more_servers[0]
    env = django_env(
        throwaway.url(),
        DJANGO_SETTINGS_MODULE=SETTINGS,
        TASKLOOP_OVERRIDES=_overrides(),
        TASKLOOP_SHARD_URLS=",".join(server.url() for server in more_servers),
    )
    held = remote(env, "fill", PER_KEY)
    assert set(held) == {"default", "shard1", "shard2"}, held
    pinned = remote(env, "key_on", "shard1")
    workers = Workers.start("--only", "r-shards", "--processes", "2", env=env)
    failed: AssertionError | None = None
    puts: list[dict] = []
    keyed: list[dict] = []
    try:
        wait_until(lambda: runs(throwaway) >= TASKS // 5, 120, what="a fifth of the drain")
        victim.freeze()
        frozen_at = time.monotonic()
        before = runs(throwaway)
        try:
            # Three puts with no key: one of them has the frozen shard's turn.
            puts = remote(env, "timed_puts", 3)
            # A put pinned by its key to the frozen shard.
            keyed = remote(env, "timed_puts", 1, pinned)
            time.sleep(max(0.0, FROZEN_FOR - (time.monotonic() - frozen_at)))
            ran_while_frozen = runs(throwaway) - before
        finally:
            victim.thaw()
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
    said = "\n".join(line for line in output.splitlines() if " WARNING " in line or " ERROR " in line)
    assert "its queues wait for it, the others go on" in output, said[-4000:]
    # The healthy shards went on while one hung.
    assert ran_while_frozen > 0, output[-3000:]
    # Each put with no key was made, on a shard that answered, within about a second.
    assert all(put["error"] is None for put in puts), puts
    assert all(put["shard"] != "shard1" for put in puts), puts
    slowest = max(put["seconds"] for put in puts)
    assert slowest < TIMEOUTS["SHARD_PUT_TIMEOUT"] + 1.5, puts
    # The keyed put waits for its shard no longer than the bound, then says so.
    assert keyed[0]["error"] is not None and "did not answer within" in keyed[0]["error"], keyed
    assert keyed[0]["seconds"] < TIMEOUTS["DATABASE_TIMEOUT"] + 1.5, keyed
    report = remote(env, "report")
    extra = sum(1 for put in puts if put["error"] is None)
    assert report["stats"]["tasks"]["total"] == 0, report
    assert report["stats"]["tasks"]["done"] == TASKS + extra, report
    assert report["stats"]["calls"]["ack"] == TASKS + extra, report  # each acknowledged once
    assert report["out_of_order"] == [], report
    reruns = report["runs"] - TASKS - extra
    assert reruns <= 2 * 50, reruns
    with capsys.disabled():
        print(
            f"\n[reliability] {throwaway.vendor} shards: shard1 frozen (SIGSTOP) {FROZEN_FOR:.0f} s; "
            f"{ran_while_frozen} tasks ran on the others meanwhile; puts with no key took "
            f"{', '.join(format(put['seconds'], '.2f') + ' s' for put in puts)} (shards "
            f"{', '.join(str(put['shard']) for put in puts)}); the keyed put raised after "
            f"{keyed[0]['seconds']:.2f} s; {reruns} re-runs, 0 lost"
        )


def test_a_worker_whose_only_database_hangs_says_so_and_stops_when_told(throwaway: Server, capsys):
    """One database, frozen: the worker says so in one line and waits it out; a stop signal
    while it hangs still ends the worker within the grace period."""
    env = django_env(throwaway.url(), DJANGO_SETTINGS_MODULE=SETTINGS, TASKLOOP_OVERRIDES=_overrides())
    remote(env, "fill", 2)  # a few tasks, so that the worker is past its start
    workers = Workers.start("--only", "r-shards", env=env)
    try:
        wait_until(lambda: runs(throwaway) >= 2 * KEYS, 120, what="the first tasks")
        throwaway.freeze()
        try:
            wait_until(
                lambda: "unreachable" in workers.output(), 30, every=0.25, what="the worker to say it hangs"
            )
            said = workers.output()
            workers.process.send_signal(signal.SIGTERM)
            asked = time.monotonic()
            try:
                code = workers.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                workers.process.send_signal(signal.SIGABRT)  # PYTHONFAULTHANDLER: every thread's stack
                time.sleep(1)
                raise AssertionError("no stop 30 s after SIGTERM:\n" + workers.output()[-8000:]) from None
            took = time.monotonic() - asked
        finally:
            throwaway.thaw()
    finally:
        output = workers.stop()
    lines = [line for line in said.splitlines() if "unreachable" in line]
    assert lines and "did not answer within" in lines[0], said[-3000:]
    assert code == 0, output[-3000:]
    assert took < 5 + 3, (
        f"{took:.1f} s after SIGTERM:\n{output[-3000:]}"
    )  # GRACE_PERIOD 5 (OVERRIDES), and a bound
    with capsys.disabled():
        print(
            f"\n[reliability] {throwaway.vendor}: worker said {lines[0].strip()!r}; stopped {took:.1f} s after SIGTERM"
        )
