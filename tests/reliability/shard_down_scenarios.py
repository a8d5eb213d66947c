"""What the down-shard tests run in a process of their own
(``tests.reliability.shard_down_settings``): fill every kind of sharded queue, then read the
operator's views (the admin's dashboard, the metrics, ``statistics()``) while a shard is down."""

from __future__ import annotations

from collections import defaultdict
from typing import Any


def fill() -> dict[str, dict[str, int]]:
    """Put tasks on tube ``r-shards``, jobs on board ``r-board`` and Django Tasks on queue
    ``default``, some on every shard; return how many of each every shard holds."""
    from django.conf import settings

    from django_taskloop import shards
    from tests.reliability.shard_scenarios import fill as fill_tube
    from tests.testing_tasks import record

    held: dict[str, dict[str, int]] = {
        "tube": fill_tube(1),
        "board": defaultdict(int),
        "tasks": defaultdict(int),
    }
    board = shards.board("r-board")
    for n in range(2 * len(board.databases)):
        held["board"][board.post(f"job-{n}")._state.db] += 1
    aliases = settings.TASKS["default"]["OPTIONS"]["DATABASES"]
    for n in range(12):
        result = record.enqueue(f"t{n}")  # its id ends with "@<the shard's place in aliases>"
        held["tasks"][aliases[int(result.id.rpartition("@")[2])]] += 1
    return {kind: dict(counts) for kind, counts in held.items()}


def views() -> dict[str, Any]:
    """GET the admin's dashboard (as a superuser) and the metrics; return their status codes
    and bodies (an exception in a view is its 500, not raised here)."""
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.test.utils import setup_test_environment

    setup_test_environment()  # the test client's host, "testserver", is allowed
    user = get_user_model().objects.create_superuser("op", "op@example.com", "pw")
    client = Client(raise_request_exception=False)
    client.force_login(user)
    dashboard = client.get("/admin/django_taskloop/dashboard/")
    metrics = client.get("/taskloop/metrics")
    return {
        "dashboard": [dashboard.status_code, dashboard.content.decode()],
        "metrics": [metrics.status_code, metrics.content.decode()],
    }


def statistics() -> dict[str, Any]:
    """``shards.tube("r-shards").statistics()``, or the error it raised (type and message)."""
    from django_taskloop import shards

    try:
        return {"stats": shards.tube("r-shards").statistics(apply_transitions=False)}
    except Exception as error:  # what a caller would see
        return {"error": f"{type(error).__name__}: {error}"}
