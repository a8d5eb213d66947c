"""``@periodic`` functions of the schedule tests, registered only in the worker processes those
tests start (``TASKLOOP_TEST_PERIODIC=1``): every other test's workers run no schedule.

Their cron is Jan 1st, midnight: no real tick comes during a test; the tests make a tick due
by moving ``next_run_at`` (cronsim has minute resolution, and the suite must not wait minutes).
"""

from __future__ import annotations

import time

from django_taskloop import schedules
from django_taskloop.workers import periodic

from .taskloop import log

# Short enough for a test: a worker reads the schedules twice a second (default 5 s), and a
# killed worker's run comes back after 2 s (default 30 s).
schedules.REFRESH = 0.5
schedules.PERIODIC_TTR = 2.0


@periodic("0 0 1 1 *", name="t-yearly")
def yearly() -> None:
    log("periodic", "t-yearly")


@periodic("0 0 1 1 *", name="t-slow")
def slowly() -> None:
    log("periodic-slow", "t-slow", "start")
    time.sleep(3)
    log("periodic-slow", "t-slow")


@periodic("0 0 1 1 *", name="t-broken")
def broken() -> None:
    log("periodic-broken", "t-broken")
    raise RuntimeError("t-broken fails on purpose")


@periodic("*/2 * * * * *", name="t-every-2s")
def every_two_seconds() -> None:
    log("periodic-2s", "t-every-2s")


@periodic("0 0 1 1 *", name="t-async")
async def yearly_async() -> None:
    """An ``async def`` schedule: awaited, not dropped."""
    import asyncio

    from asgiref.sync import sync_to_async

    await asyncio.sleep(0.01)
    await sync_to_async(log)("periodic-async", "t-async")
