"""The operator's views while one shard's server is down (issue 39, item 3).

Tube ``r-shards``, board ``r-board`` and the Django Tasks queue ``default`` are spread over
three throwaway servers of the run's vendor (MariaDB on MariaDB runs, PostgreSQL on the
others): ``default``, ``shard1`` and ``shard2``. With work on every shard, ``shard1``'s server
is stopped (a connection to it is refused at once) or frozen (SIGSTOP: it hangs, nothing
answers, until the views' deadline, ``DATABASE_TIMEOUT``), then each view is called as an operator
would, in a process of its own: ``taskloop status`` (text and ``--json``), ``reap_locks``, the
admin's dashboard and ``/taskloop/metrics`` (the test client), the sharded tube's
``statistics()``. Each shows the reachable shards as before and names the one that is down.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from .conftest import ROOT, Server, django_env
from .test_shards import more_servers  # noqa: F401  (the fixture: two more throwaway servers)

pytestmark = pytest.mark.slow

SETTINGS = "tests.reliability.shard_down_settings"
SCENARIOS = "tests.reliability.shard_down_scenarios"


def run(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    """Run ``python *argv`` in a process of the shard settings (bounded: a hang fails)."""
    return subprocess.run(
        [sys.executable, *argv], env=env, cwd=ROOT, capture_output=True, text=True, timeout=180
    )


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run(env, "-m", "django", *args)


def scenario(env: dict[str, str], target: str) -> Any:
    done = run(env, "-m", "tests.reliability.remote", f"{SCENARIOS}:{target}", "[]")
    assert done.returncode == 0, f"{target} failed:\n{done.stdout}\n{done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def row(text: str, name: str) -> list[str]:
    """The cells of the status table row of ``name`` (its first cell)."""
    found = [line.split() for line in text.splitlines() if line.split()[:1] == [name]]
    assert len(found) == 1, f"{len(found)} rows named {name!r} in:\n{text}"
    return found[0]


@pytest.mark.parametrize("how", ["stopped", "frozen"])
def test_every_view_shows_the_reachable_shards_and_names_the_one_down(
    throwaway: Server,
    more_servers: list[Server],  # noqa: F811
    how: str,
) -> None:
    victim = more_servers[0]
    env = django_env(
        throwaway.url(),
        DJANGO_SETTINGS_MODULE=SETTINGS,
        TASKLOOP_SHARD_URLS=",".join(server.url() for server in more_servers),
        TASKLOOP_OVERRIDES='{"DATABASE_TIMEOUT": 2}',
    )
    held = scenario(env, "fill")
    for kind in ("tube", "board", "tasks"):
        assert set(held[kind]) >= {"default", "shard1", "shard2"} - (
            {"default"} if kind == "tasks" else set()
        )
    if how == "stopped":
        victim.stop()
        assert not victim.reachable()
        views_of_a_shard_down(env, held, "OperationalError")
        return
    victim.freeze()
    try:
        views_of_a_shard_down(env, held, "did not answer within 2 s")
    finally:
        victim.thaw()


def views_of_a_shard_down(env: dict[str, str], held: dict[str, Any], reason: str) -> None:
    """Each view with shard1 down: ``reason`` is what its one-line reason says."""

    # taskloop status: a row per shard, shard1's marked down with its reason; exit 0.
    status = manage(env, "taskloop", "status")
    assert status.returncode == 0, f"exit {status.returncode}:\n{status.stdout}\n{status.stderr}"
    text = status.stdout
    assert row(text, "r-shards@shard2")[1] == str(held["tube"]["shard2"]), text  # READY
    assert row(text, "r-shards")[1] == str(held["tube"]["default"]), text
    assert "down" in row(text, "r-shards@shard1"), text
    assert "down" in row(text, "r-board@shard1"), text
    assert row(text, "r-board@shard2")[1] == str(held["board"]["shard2"]), text  # UNCLAIMED
    assert "down" in row(text, "default@shard1"), text  # the Django Tasks queue's shard
    says = [line for line in text.splitlines() if "shard1" in line and "unreachable" in line]
    assert len(says) == 1 and reason in says[0], text

    as_json = manage(env, "taskloop", "status", "--json")
    assert as_json.returncode == 0, f"exit {as_json.returncode}:\n{as_json.stdout}\n{as_json.stderr}"
    found = json.loads(as_json.stdout)
    assert set(found["down"]) == {"shard1"} and reason in found["down"]["shard1"], found
    by = {(q["kind"], q["name"], q["using"]): q for q in found["queues"]}
    assert by[("task", "r-shards", "shard2")]["counts"]["ready"] == held["tube"]["shard2"]
    assert by[("task", "r-shards", "shard2")]["down"] is None
    assert by[("task", "r-shards", "shard1")]["down"] == found["down"]["shard1"]
    assert by[("job", "r-board", "shard1")]["down"] == found["down"]["shard1"]
    assert by[("django_task", "default", "shard1")]["down"] == found["down"]["shard1"]

    # reap_locks: the others tidied, one line on stderr names the one skipped; exit 3.
    reaped = manage(env, "reap_locks")
    assert reaped.returncode == 3, f"exit {reaped.returncode}:\n{reaped.stdout}\n{reaped.stderr}"
    assert "tube r-shards@shard2:" in reaped.stdout and "tube r-shards:" in reaped.stdout, reaped.stdout
    assert "r-shards@shard1" not in reaped.stdout, reaped.stdout
    skipped = reaped.stderr.strip().splitlines()
    assert len(skipped) == 1 and "shard1" in skipped[0] and reason in skipped[0], reaped.stderr

    # The dashboard renders, shard1's row marked down; the metrics keep every other series.
    views = scenario(env, "views")
    code, page = views["dashboard"]
    assert code == 200, page[-3000:]
    assert 'data-queue-row="r-shards@shard2"' in page and 'data-queue-row="r-shards@shard1"' in page
    down_row = page.split('data-queue-row="r-shards@shard1"', 1)[1].split("</tr>", 1)[0]
    assert "tl-down" in down_row and reason in down_row, down_row
    code, metrics = views["metrics"]
    assert code == 200, metrics[-3000:]
    lines = metrics.splitlines()
    ready = held["tube"]["shard2"]
    assert f'taskloop_items{{queue="r-shards@shard2",kind="task",state="ready"}} {ready}' in lines, metrics
    assert 'taskloop_shard_up{database="shard1"} 0' in lines, metrics
    assert 'taskloop_shard_up{database="shard2"} 1' in lines, metrics
    assert 'taskloop_shard_up{database="default"} 1' in lines, metrics
    assert not [line for line in lines if "r-shards@shard1" in line and line.startswith("taskloop_items")]

    # The sharded tube's statistics(): the reachable shards added up, the one down named.
    stats = scenario(env, "statistics")
    assert "error" not in stats, stats
    stats = stats["stats"]
    assert set(stats["shards"]) == {"default", "shard2"}, stats
    assert set(stats["down"]) == {"shard1"} and reason in stats["down"]["shard1"], stats
    assert stats["tasks"]["ready"] == held["tube"]["default"] + held["tube"]["shard2"], stats
