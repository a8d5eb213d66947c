"""Handlers of the reliability tests: each logs one ``WorkLog`` row per call, then returns.

Leases are short (3 s) so that the work of a killed worker comes back within seconds; the
worker renews them while it is alive (every second).
"""

from __future__ import annotations

import os
import time
from typing import Any

from django_taskloop.workers import board, loop, tube
from tests.testapp.models import WorkerLoop, WorkLog

LEASE = 3


def _log(kind: str, key: Any) -> None:
    WorkLog.objects.create(kind=kind, key=str(key), phase="end", pid=os.getpid(), at=time.time())


@tube("r-tube", batch=50, type="fifottl", ttr=LEASE)
def tube_task(task: Any) -> None:
    _log("r-tube", task.id)


@tube("r-limited", batch=10, type="fifottl", ttr=LEASE, limit=5)
def limited_task(task: Any) -> None:
    # At most 5 at once over every worker (tests/reliability/test_kills.py): a start and an end.
    WorkLog.objects.create(
        kind="r-limited-start", key=str(task.id), phase="start", pid=os.getpid(), at=time.time()
    )
    time.sleep(0.02)
    _log("r-limited", task.id)


@tube("r-key-limited", batch=10, type="utubettl", ttr=LEASE, key_limit=2)
def key_limited_task(task: Any) -> None:
    # At most 2 of one key at once over every worker (tests/reliability/test_kills.py).
    WorkLog.objects.create(
        kind="r-key-limited-start",
        key=f"{task.utube}:{task.id}",
        phase="start",
        pid=os.getpid(),
        at=time.time(),
    )
    time.sleep(0.02)
    _log("r-key-limited", task.id)


@tube("r-paced", batch=10, type="fifottl", ttr=LEASE, rate="40/s")
def paced_task(task: Any) -> None:
    # At most 40 started in any second over every worker (tests/reliability/test_kills.py).
    WorkLog.objects.create(
        kind="r-paced-start", key=str(task.id), phase="start", pid=os.getpid(), at=time.time()
    )
    time.sleep(0.02)
    _log("r-paced", task.id)


@board("r-board", batch=20, expiry=LEASE)
def board_job(job: Any) -> None:
    _log("r-board", job.name)


@loop(WorkerLoop, batch=20, lock_for=LEASE, name="r-loop")
def loop_id(item_id: int) -> None:
    _log("r-loop", item_id)


@tube("r-shards", batch=50, type="utubettl", ttr=LEASE)
def shard_task(task: Any) -> None:
    # Over several databases in tests/reliability/test_shards.py (shard_settings).
    _log("r-shards", f"{task.data['key']}:{task.data['seq']}")
