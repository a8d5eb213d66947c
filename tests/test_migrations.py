"""Migrations that move data: what was counted before them reads the same after."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from django_taskloop.models import Tube

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("django_taskloop", "0002_operating")]
AFTER = [("django_taskloop", "0003_derived_put")]


def _latest() -> list[tuple[str, str]]:
    """The app's newest migration: where each test leaves the schema for the tests after it."""
    executor = MigrationExecutor(connection)
    return executor.loader.graph.leaf_nodes("django_taskloop")


def _migrate(targets: list[tuple[str, str]]):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


def test_counted_puts_carry_over_to_the_derived_put():
    apps = _migrate(BEFORE)
    try:
        OldTube = apps.get_model("django_taskloop", "Tube")
        OldTask = apps.get_model("django_taskloop", "Task")
        OldStat = apps.get_model("django_taskloop", "TubeStat")
        tube = OldTube.objects.create(name="old", type="fifo")
        empty = OldTube.objects.create(name="empty", type="fifo")
        OldStat.objects.bulk_create([OldStat(tube=t, slot=s) for t in (tube, empty) for s in range(16)])
        # 10 puts so far: 4 acked (done), 3 truncated (no counter), 3 still waiting.
        OldStat.objects.filter(tube=tube, slot=3).update(put=6, done=1)
        OldStat.objects.filter(tube=tube, slot=9).update(put=4, done=3, ack=3)
        OldTask.objects.bulk_create([OldTask(tube=tube, state="r", data=n) for n in range(3)])
    finally:
        _migrate(_latest())
    tube = Tube.objects.get(name="old")
    stats = tube.statistics()
    assert stats["calls"]["put"] == 10 and stats["calls"]["ack"] == 3 and stats["tasks"]["done"] == 4
    tube.put(11)
    assert tube.statistics()["calls"]["put"] == 11
    assert Tube.objects.get(name="empty").statistics()["calls"]["put"] == 0


def test_the_derived_put_migrates_back_to_a_count():
    tube = Tube.objects.create_tube("back", "fifo")
    tube.put_many([1, 2, 3])
    tube.ack(tube.take(0).pk)
    tube.truncate()
    try:
        apps = _migrate(BEFORE)
        OldStat = apps.get_model("django_taskloop", "TubeStat")
        assert sum(OldStat.objects.filter(tube_id=tube.pk).values_list("put", flat=True)) == 3
    finally:
        _migrate(_latest())
    assert Tube.objects.get(pk=tube.pk).statistics()["calls"]["put"] == 3
