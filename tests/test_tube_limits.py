"""A tube's running limit (``Tube.set_limit``, ``@tube(limit=…)``): at most N of its tasks taken
at once, by every consumer together, held by the database (issue 44 §2)."""

from __future__ import annotations

import time

import pytest
from django.db import connections

from django_taskloop.exceptions import NotFound
from django_taskloop.models import Task, Tube
from tests.conftest import race
from tests.workers_util import most_running

pytestmark = pytest.mark.django_db(transaction=True)


def _taken(tube: Tube) -> int:
    return Task.objects.filter(tube=tube, state="t").count()


@pytest.mark.parametrize("kind", ["fifo", "fifottl", "utube", "utubettl"])
def test_a_limited_tube_hands_out_at_most_its_limit(kind):
    tube = Tube.objects.create_tube("t", kind, ttr=60 if kind.endswith("ttl") else None)
    # (utube: each task in a sub-queue of its own, so that the limit is what holds them back)
    ids = [tube.put(i, utube=str(i) if kind.startswith("utube") else None).id for i in range(10)]
    tube.set_limit(3)
    assert Tube.objects.get(pk=tube.pk).running_limit == 3
    first = tube.take_many(10, consumer="a")
    assert len(first) == 3
    assert tube.take_many(10, consumer="b") == []
    assert tube.take(0, consumer="b") is None
    # Each task finished (acknowledged, released) lets one more be taken.
    tube.ack(first[0].id, consumer="a")
    tube.release(first[1].id, consumer="a")
    assert len(tube.take_many(10, consumer="b")) == 2
    assert _taken(tube) == 3
    # A lower limit takes nothing back; new takes wait until enough are finished.
    tube.set_limit(1)
    assert tube.take_many(10, consumer="c") == []
    assert _taken(tube) == 3
    # No limit: the rest is handed out.
    tube.set_limit(None)
    assert len(tube.take_many(10, consumer="c")) == 10 - 1 - 3
    assert sorted(t.id for t in Task.objects.filter(tube=tube)) == sorted(ids[1:])


def test_ack_and_take_frees_its_slots_before_it_counts():
    tube = Tube.objects.create_tube("t", "fifottl", ttr=60)
    for i in range(6):
        tube.put(i)
    tube.set_limit(2)
    held = tube.take_many(5, consumer="w")
    assert len(held) == 2
    acked, more = tube.ack_and_take([task.id for task in held], 5, consumer="w")
    assert (acked, len(more)) == (2, 2)
    assert _taken(tube) == 2


def test_a_ttr_that_ran_out_gives_its_slot_back(clock):
    tube = Tube.objects.create_tube("t", "fifottl", ttr=5)
    for i in range(3):
        tube.put(i)
    tube.set_limit(1)
    (first,) = tube.take_many(3, consumer="dead")
    assert tube.take_many(3, consumer="w") == []
    clock.advance(6)
    # The dead consumer's task is free again, and its slot with it: one task, not two.
    again = tube.take_many(3, consumer="w")
    assert len(again) == 1
    assert _taken(tube) == 1


def test_another_process_s_limit_holds_from_the_next_take():
    """The database holds the limit: a consumer whose tube object holds an older limit takes
    by the one set elsewhere since (a tube object that knew of no limit takes as unlimited
    tubes do, until it is read again: a worker reads it at each start)."""
    tube = Tube.objects.create_tube("t", "fifo")
    for i in range(5):
        tube.put(i)
    mine = Tube.objects.get(pk=tube.pk)
    mine.set_limit(2)
    tube.running_limit = 1  # what another process last read: the take looks again
    assert len(tube.take_many(5, consumer="w")) == 2


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "3"])
def test_a_bad_limit_is_refused_and_changes_nothing(bad):
    tube = Tube.objects.create_tube("t", "fifo")
    tube.set_limit(4)
    with pytest.raises((TypeError, ValueError), match="limit"):
        tube.set_limit(bad)
    assert Tube.objects.get(pk=tube.pk).running_limit == 4
    assert tube.running_limit == 4


def test_a_dropped_tube_s_limit_cannot_be_set():
    tube = Tube.objects.create_tube("t", "fifo")
    Tube.objects.get(pk=tube.pk).drop()
    with pytest.raises(NotFound):
        tube.set_limit(2)


def _hold_and_ack(tube_id: int, worker: int) -> list[tuple[float, float]]:
    """Take one task at a time until the tube stays empty, hold it 20 ms, acknowledge it;
    return each hold (taken, acknowledging), by the monotonic clock (one machine)."""
    tube = Tube.objects.get(pk=tube_id)
    holds = []
    empty = 0
    while empty < 20:
        tasks = tube.take_many(2, consumer=f"w{worker}")
        if not tasks:
            empty += 1
            time.sleep(0.01)
            continue
        empty = 0
        took = time.monotonic()
        time.sleep(0.02)
        acking = time.monotonic()
        tube.ack_many([task.id for task in tasks], consumer=f"w{worker}")
        holds.extend((took, acking) for _ in tasks)
    connections.close_all()
    return holds


@pytest.mark.slow
def test_six_processes_never_hold_more_than_the_limit(vendor):
    tube = Tube.objects.create_tube("t", "fifottl", ttr=60)
    Task.objects.bulk_create([Task(tube=tube, data=i, state="r", pri=0, ttr=60.0) for i in range(300)])
    tube.set_limit(3)
    results = race(_hold_and_ack, [(tube.pk, w) for w in range(6)])
    holds = [hold for result in results for hold in result]
    assert len(holds) == 300 and not Task.objects.filter(tube=tube).exists()
    assert sum(1 for result in results if result) >= 3, "the processes did not share the work"
    # At any moment, at most 3 held: a hold is counted from just after its take returned to
    # just before its acknowledgement was sent, so this under-counts nothing the database allowed.
    most = most_running([took for took, _ in holds], [acking for _, acking in holds])
    print(f"\n[{vendor}] most held at once: {most} (limit 3)")
    assert most <= 3
    assert most == 3, "the limit was never reached: the test shows nothing"


def test_status_json_and_metrics_show_the_limit_beside_what_runs():
    from django_taskloop.management.terminal.status import _as_json, status_lines, summaries
    from django_taskloop.metrics import render_metrics

    limited = Tube.objects.create_tube("mail", "fifottl", ttr=60)
    Tube.objects.create_tube("free", "fifo").put(1)
    for i in range(4):
        limited.put(i)
    limited.set_limit(3)
    limited.take_many(2, consumer="w")
    found = summaries()
    lines = status_lines(found, {})
    (mail,) = [line for line in lines if line.startswith("mail ")]
    (free,) = [line for line in lines if line.startswith("free ")]
    assert " 2/3 " in mail, lines
    assert "/" not in free.split()[2], lines  # no limit, no slash
    by_name = {s.name: s for s in found}
    assert _as_json(by_name["mail"], 0)["limit"] == 3
    assert _as_json(by_name["free"], 0)["limit"] is None
    text = render_metrics()
    assert 'taskloop_running_limit{queue="mail",kind="task"} 3' in text
    assert 'taskloop_running_limit{queue="free"' not in text
    assert 'taskloop_items{queue="mail",kind="task",state="taken"} 2' in text


def test_create_tube_and_a_handler_s_first_put_make_the_tube_limited():
    made = Tube.objects.create_tube("made", "fifo", limit=3)
    assert Tube.objects.get(pk=made.pk).running_limit == 3
    # An existing tube keeps its own (a worker's start sets its handler's).
    again = Tube.objects.create_tube("made", "fifo", if_not_exists=True, limit=7)
    assert again.running_limit == 3
    with pytest.raises(ValueError, match="limit"):
        Tube.objects.create_tube("bad", "fifo", limit=0)
    assert not Tube.objects.filter(name="bad").exists()
    from tests.testapp.taskloop import limited

    limited._tubes.clear()  # (made by an earlier test on another database)
    limited.put({"sleep": 0})  # @tube("w-limited", limit=5): the put makes the tube
    assert Tube.objects.get(name="w-limited").running_limit == 5


def test_the_limits_setting_wins_over_the_decorator(settings):
    from django_taskloop.workers.drivers import TubeDriver
    from tests.testapp.taskloop import limited  # @tube("w-limited", limit=5)

    settings.TASKLOOP = {"LIMITS": {"w-limited": 2}}
    limited._tubes.clear()
    limited.put({"sleep": 0})  # the put makes the tube with the setting's limit
    tube = Tube.objects.get(name="w-limited")
    assert tube.running_limit == 2
    # A worker's start sets it on the tube too; None in the setting lifts the decorator's.
    tube.set_limit(9)
    driver = TubeDriver(limited, "w")
    driver.prepare()
    assert Tube.objects.get(pk=tube.pk).running_limit == 2 and driver.limited
    settings.TASKLOOP = {"LIMITS": {"w-limited": None}}
    driver.prepare()
    assert Tube.objects.get(pk=tube.pk).running_limit is None and not driver.limited
    settings.TASKLOOP = {}
    driver.prepare()
    assert Tube.objects.get(pk=tube.pk).running_limit == 5


@pytest.mark.parametrize(
    "limits", [{"t": 0}, {"t": True}, {"t": 1.5}, {"": 3}, {3: 3}, ["t"]], ids=lambda v: repr(v)
)
def test_a_bad_limits_setting_is_a_system_check_error(settings, limits):
    from django_taskloop.checks import check_settings

    settings.TASKLOOP = {"LIMITS": limits}
    errors = [e for e in check_settings(None) if e.id == "taskloop.E020"]
    assert errors and "LIMITS" in errors[0].msg, errors


@pytest.mark.parametrize("verb", ["ack", "ack_many", "release_delayed", "bury", "delete_task"])
def test_finishing_a_limited_tube_s_task_wakes_the_takers_waiting_for_a_slot(verb):
    """A taken task that ends frees a slot of the limit: takers that wait (a waiting take, an
    idle worker) hear of it at the commit, as they hear of a put, instead of at their next poll.
    An unlimited tube's acknowledgement frees nothing anyone waits for: no wake-up."""
    from django_taskloop import wakeup

    tube = Tube.objects.create_tube("t", "fifottl", ttr=60, limit=1)
    free = Tube.objects.create_tube("free", "fifottl", ttr=60)
    tube.put(1)
    free.put(1)
    (task,) = tube.take_many(1, consumer="w")
    (other,) = free.take_many(1, consumer="w")
    waiter = wakeup.Waiter("default", [tube.pk, free.pk])
    try:
        {
            "ack": lambda: tube.ack(task.id, consumer="w"),
            "ack_many": lambda: tube.ack_many([task.id], consumer="w"),
            "release_delayed": lambda: tube.release(task.id, delay=30, consumer="w"),
            "bury": lambda: tube.bury(task.id),
            "delete_task": lambda: tube.delete_task(task.id),
        }[verb]()
        free.ack(other.id, consumer="w")
        assert waiter.sleep(1.0) == {tube.pk}
    finally:
        waiter.close()
