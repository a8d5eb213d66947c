"""Tubes (SPEC §3, §6): Tarantool's queue drivers fifo, fifottl, utube and utubettl."""

from __future__ import annotations

import math
import statistics as pystats
import threading
import time

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from django_taskloop.engine import db_now
from django_taskloop.exceptions import NotFound, NotTaken, TaskloopError, TubeError
from django_taskloop.models import Task, Tube
from django_taskloop.models import tubes as tubes_module
from django_taskloop.models.tubes import Consumer, TubeStat, default_consumer
from tests.conftest import race

pytestmark = pytest.mark.django_db

ALL = ["fifo", "fifottl", "utube", "utubettl"]
TTL = ["fifottl", "utubettl"]
PLAIN = ["fifo", "utube"]


@pytest.fixture(autouse=True)
def _forget_callbacks():
    yield
    tubes_module._callbacks.clear()
    tubes_module._beats.clear()
    tubes_module._stale_checks.clear()


def make(type: str = "fifo", name: str = "q", **kw) -> Tube:
    return Tube.objects.create_tube(name, type, **kw)


def ids(tasks) -> list[int]:
    return [t.pk for t in tasks]


def calls(tube: Tube) -> dict[str, int]:
    return {k: v for k, v in tube.statistics()["calls"].items() if v}


# -- create_tube ---------------------------------------------------------------------------


@pytest.mark.parametrize("type", ALL)
def test_create_tube_and_if_not_exists_rules(type):
    tube = make(type, "emails.v1-x_y", ttl=60, ttr=5, pri=3)
    assert (tube.name, tube.type, tube.ttl, tube.ttr, tube.pri) == ("emails.v1-x_y", type, 60.0, 5.0, 3)
    with pytest.raises(TubeError):
        make(type, "emails.v1-x_y")
    assert Tube.objects.create_tube("emails.v1-x_y", type, if_not_exists=True).pk == tube.pk
    other = "fifo" if type != "fifo" else "utube"
    with pytest.raises(TubeError):
        Tube.objects.create_tube("emails.v1-x_y", other, if_not_exists=True)
    assert list(Tube.objects.values_list("name", flat=True)) == ["emails.v1-x_y"]


@pytest.mark.parametrize(
    "args, kwargs, error, word",
    [
        ((5, "fifo"), {}, TypeError, "name"),
        (("", "fifo"), {}, ValueError, "name"),
        (("a" * 101, "fifo"), {}, ValueError, "name"),
        (("sp ace", "fifo"), {}, ValueError, "name"),
        (("é", "fifo"), {}, ValueError, "name"),
        (("q", "lifo"), {}, ValueError, "type"),
        (("q", None), {}, TypeError, "type"),
        (("q", "fifo"), {"if_not_exists": 1}, TypeError, "if_not_exists"),
        (("q", "fifo"), {"ttl": "5"}, TypeError, "ttl"),
        (("q", "fifo"), {"ttl": 0}, ValueError, "ttl"),
        (("q", "fifottl"), {"ttr": math.nan}, ValueError, "ttr"),
        (("q", "fifottl"), {"pri": 1.5}, TypeError, "pri"),
        (("q", "fifottl"), {"on_task_change": 3}, TypeError, "on_task_change"),
    ],
)
def test_create_tube_validates_before_writing(args, kwargs, error, word):
    with pytest.raises(error, match=word):
        Tube.objects.create_tube(*args, **kwargs)
    assert not Tube.objects.exists()


# -- put / take / ack ----------------------------------------------------------------------


@pytest.mark.parametrize("type", ALL)
def test_put_take_ack_in_order(type):
    tube = make(type)
    put = [tube.put({"n": i}) for i in range(3)]
    assert [t.state for t in put] == ["r"] * 3
    assert put[0].pk < put[1].pk < put[2].pk
    first = tube.take()
    assert (first.pk, first.state, first.data) == (put[0].pk, "t", {"n": 0})
    if type in ("utube", "utubettl"):
        # All three share the key-less sub-queue: one at a time.
        assert tube.take(consumer="other") is None
    done = tube.ack(first.pk)
    assert (done.pk, done.state, done.data) == (put[0].pk, "-", {"n": 0})
    second = tube.take()
    assert second.pk == put[1].pk
    tube.ack(second)
    assert tube.take().pk == put[2].pk
    assert tube.take() is None
    with pytest.raises(NotFound):
        tube.peek(put[0].pk)


@pytest.mark.parametrize("type", ALL)
def test_ids_are_never_reused(type):
    tube = make(type)
    a = tube.put(1)
    tube.ack(tube.take())
    b = tube.put(2)
    assert b.pk > a.pk


@pytest.mark.parametrize("type", TTL)
def test_priorities_lower_first_then_id(type):
    tube = make(type, pri=5)
    t1 = tube.put("a")  # tube default pri 5
    t2 = tube.put("b", pri=1, utube="x")
    t3 = tube.put("c", pri=1, utube="y")
    t4 = tube.put("d", pri=9, utube="z")
    assert (t1.pri, t2.pri, t4.pri) == (5, 1, 9)
    assert ids([tube.take(), tube.take(), tube.take(), tube.take()]) == [t2.pk, t3.pk, t1.pk, t4.pk]


@pytest.mark.parametrize("type", PLAIN)
def test_plain_drivers_ignore_ttl_options_but_check_them(type):
    tube = make(type, ttl=1, ttr=1, pri=4)
    a = tube.put("a", pri=9, ttl=0.01, ttr=0.01, delay=10)
    b = tube.put("b", pri=-9)
    assert (a.state, a.pri, a.ttl_at, a.event_at) == ("r", 0, None, None)
    assert tube.take().pk == a.pk
    with pytest.raises(TypeError, match="delay"):
        tube.put("c", delay="1")
    with pytest.raises(TypeError, match="pri"):
        tube.put("c", pri=1.0)
    assert Task.objects.count() == 2
    assert b.pri == 0


def test_utubettl_priority_beats_insertion_order_within_a_sub_queue():
    tube = make("utubettl")
    tube.put("a-pri5", pri=5, utube="a")
    b = tube.put("b-pri1", pri=1, utube="b")
    a0 = tube.put("a-pri0", pri=0, utube="a")
    assert tube.take().pk == a0.pk
    assert tube.take().pk == b.pk
    assert tube.take() is None


# -- release -------------------------------------------------------------------------------


@pytest.mark.parametrize("type", ALL)
def test_release_without_delay_is_taken_again_first(type):
    tube = make(type)
    a, b = tube.put("a"), tube.put("b")
    taken = tube.take()
    released = tube.release(taken.pk)
    assert (released.pk, released.state, released.owner) == (a.pk, "r", None)
    assert tube.take().pk == a.pk
    assert b.pk > a.pk


@pytest.mark.parametrize("type", TTL)
def test_release_with_delay_delays_and_extends_ttl(type, clock):
    tube = make(type, ttl=500, ttr=200)
    task = tube.put("x")
    tube.take()
    released = tube.release(task.pk, delay=60)
    assert released.state == "~"
    # The delay extends the lifetime.
    assert 59.5 < (released.ttl_at - task.ttl_at).total_seconds() < 62
    assert tube.take() is None
    assert tube.peek(task.pk).state == "~"
    clock.advance(30)
    assert tube.peek(task.pk).state == "~"
    clock.advance(31)
    assert tube.peek(task.pk).state == "r"
    assert tube.take().pk == task.pk
    assert calls(tube) == {"put": 1, "take": 2, "release": 1, "delay": 1}


@pytest.mark.parametrize("type", PLAIN)
def test_release_delay_is_ignored_on_plain_drivers(type):
    tube = make(type)
    task = tube.put("x")
    tube.take()
    assert tube.release(task.pk, delay=10).state == "r"
    assert tube.take().pk == task.pk


# -- bury / kick / delete / peek -----------------------------------------------------------


@pytest.mark.parametrize("type", ALL)
def test_bury_and_kick_order_and_counts(type):
    tube = make(type)
    tasks = [tube.put(i, pri=10 - i, utube=str(i)) for i in range(4)]
    taken = tube.take(consumer="me")
    buried = [tube.bury(t.pk) for t in tasks]
    assert [t.state for t in buried] == ["!"] * 4
    assert tube.bury(tasks[0].pk).state == "!"  # no change, no count
    # bury by anyone revokes the owner's claim
    with pytest.raises(NotTaken):
        tube.ack(taken.pk, consumer="me")
    with pytest.raises(ValueError, match="count"):
        tube.kick(-1)
    with pytest.raises(TypeError, match="count"):
        tube.kick(True)
    with pytest.raises(TypeError, match="count"):
        tube.kick(1.0)
    assert tube.kick(0) == 0
    assert tube.kick() == 1
    assert tube.kick(2) == 2
    assert tube.kick(10) == 1
    assert tube.kick(10) == 0
    order = ids([tube.take(consumer=f"c{i}") for i in range(4)])
    if type in TTL:
        assert order == [t.pk for t in reversed(tasks)]  # pri 7, 8, 9, 10
    else:
        assert order == ids(tasks)
    stats = tube.statistics()
    assert stats["calls"]["bury"] == 4
    assert stats["calls"]["kick"] == 4
    assert stats["tasks"]["taken"] == 4


def test_a_kicked_task_starts_a_new_count_of_attempts_and_waits_from_the_kick(clock):
    """A worker buries a task after MAX_ATTEMPTS takes; an operator's kick (after a fix) gives
    it MAX_ATTEMPTS more, counted from 1 (not "attempt 6 of 5", buried after one try), and it
    is queued again: the queue's latency counts from the kick, not from its first put."""
    from django_taskloop.stats import tube_summary

    tube = make("fifottl")
    buried = []
    for name in ("a", "b"):
        task = tube.put(name)
        for _ in range(3):
            tube.release(tube.take(consumer="w").pk, consumer="w")
        buried.append(tube.bury(task.pk))
    first, _second = buried
    assert sorted(Task.objects.values_list("attempts", flat=True)) == [3, 3]
    clock.advance(1140)  # 19 minutes on
    assert tube.kick_task(first.pk).attempts == 0
    assert tube.kick() == 1
    assert sorted(Task.objects.values_list("attempts", flat=True)) == [0, 0]
    assert tube_summary(tube).oldest_ready < 60  # not 19 minutes
    assert tube.take(consumer="w").attempts == 1


@pytest.mark.parametrize("type", ALL)
def test_delete_task_in_any_state(type):
    tube = make(type)
    a, b, c = tube.put("a"), tube.put("b", utube="k"), tube.put("c")
    tube.take(consumer="me")
    tube.bury(c.pk)
    for task, data in ((a, "a"), (b, "b"), (c, "c")):
        gone = tube.delete_task(task.pk)
        assert (gone.pk, gone.state, gone.data) == (task.pk, "-", data)
    with pytest.raises(NotFound):
        tube.delete_task(a.pk)
    with pytest.raises(NotTaken):
        tube.ack(a.pk, consumer="me")
    stats = tube.statistics()
    assert stats["tasks"] == {"taken": 0, "buried": 0, "ready": 0, "delayed": 0, "done": 3, "total": 0}
    assert stats["calls"]["delete"] == 3


@pytest.mark.parametrize("type", ALL)
def test_peek_shows_the_task_as_it_is(type):
    tube = make(type)
    task = tube.put([1, "two"], utube=7)
    assert task.utube == ("7" if type in ("utube", "utubettl") else None)
    seen = tube.peek(task.pk)
    assert (seen.state, seen.data, seen.tube_id) == ("r", [1, "two"], tube.pk)
    tube.take()
    assert tube.peek(task).state == "t"
    with pytest.raises(NotFound):
        tube.peek(task.pk + 1000)
    with pytest.raises(TypeError, match="task_id"):
        tube.peek("1")


# -- touch ---------------------------------------------------------------------------------


@pytest.mark.parametrize("type", ALL)
def test_touch_rules(type):
    tube = make(type, ttl=100, ttr=10)
    task = tube.put("x")
    for nothing in (None, 0, -5):
        assert tube.touch(task.pk, nothing, consumer="nobody").state == "r"
    with pytest.raises(NotTaken):
        tube.touch(task.pk, 1, consumer="nobody")
    taken = tube.take(consumer="me")
    with pytest.raises(NotTaken):
        tube.touch(task.pk, 1, consumer="other")
    with pytest.raises(TypeError, match="increment"):
        tube.touch(task.pk, "1", consumer="me")
    if type in PLAIN:
        with pytest.raises(TubeError):
            tube.touch(task.pk, 1, consumer="me")
        return
    touched = tube.touch(task.pk, 5, consumer="me")
    assert touched.state == "t"
    assert touched.ttr == 15.0
    assert 4.9 < (touched.event_at - taken.event_at).total_seconds() < 5.1
    assert 4.9 < (touched.ttl_at - taken.ttl_at).total_seconds() < 5.1
    assert tube.statistics()["calls"]["touch"] == 1


# -- time: ttl, ttr, delay -----------------------------------------------------------------


@pytest.mark.parametrize("type", TTL)
def test_ttl_removes_ready_buried_and_taken_tasks(type, clock):
    tube = make(type)
    ready = tube.put("r", ttl=60, utube="a")
    buried = tube.bury(tube.put("b", ttl=60, utube="b").pk)
    taken = tube.put("t", ttl=60, utube="c")
    long = tube.put("long", utube="d")
    tube.take(consumer="me")  # ready, ttr defaults to infinite: the ttl bounds the take
    got = tube.take(consumer="me")
    assert got.pk == taken.pk and buried.state == "!"
    clock.advance(30)
    assert [tube.peek(task.pk).state for task in (ready, buried, taken)] == ["t", "!", "t"]
    clock.advance(31)
    for task in (ready, buried, taken):
        with pytest.raises(NotFound):
            tube.peek(task.pk)
    with pytest.raises(NotTaken):
        tube.ack(taken.pk, consumer="me")
    assert tube.take(consumer="me").pk == long.pk
    stats = tube.statistics()
    assert stats["calls"]["ttl"] == 3
    assert stats["calls"]["delete"] == 3
    assert stats["calls"]["ttr"] == 2  # the two taken ones went back to ready first
    assert stats["tasks"]["done"] == 3
    assert stats["tasks"]["total"] == 1


@pytest.mark.parametrize("type", TTL)
def test_ttr_returns_a_taken_task_to_ready(type, clock):
    tube = make(type, ttr=60)
    task = tube.put("x", ttl=600)  # a per-put ttl does not change the default ttr
    taken = tube.take(consumer="slow")
    assert taken.ttr == 60
    assert tube.take(consumer="other") is None
    clock.advance(30)
    assert tube.take(consumer="other") is None
    assert tube.peek(task.pk).state == "t"
    clock.advance(31)
    assert tube.peek(task.pk).state == "r"
    with pytest.raises(NotTaken):
        tube.ack(task.pk, consumer="slow")
    assert tube.take(consumer="other").pk == task.pk
    assert tube.ack(task.pk, consumer="other").state == "-"
    assert tube.statistics()["calls"]["ttr"] == 1


def test_default_ttr_follows_tube_ttr_then_tube_ttl():
    assert make("fifottl", "a").put(1, ttl=5).ttr is None
    assert make("fifottl", "b", ttl=7).put(1).ttr == 7.0
    assert make("fifottl", "c", ttl=7, ttr=3).put(1).ttr == 3.0
    assert make("fifottl", "d", ttl=7, ttr=3).put(1, ttr=9).ttr == 9.0


@pytest.mark.parametrize("type", TTL)
def test_delay_then_ready_and_delay_extends_ttl(type, clock):
    tube = make(type)
    task = tube.put("x", delay=60, ttl=120)
    assert task.state == "~"
    # The ttl counts from the end of the delay: the task lives delay + ttl.
    assert 119.95 < (task.ttl_at - task.event_at).total_seconds() < 120.05
    assert tube.take() is None
    assert tube.statistics()["tasks"]["delayed"] == 1
    clock.advance(30)
    assert tube.take() is None
    assert tube.statistics()["tasks"]["delayed"] == 1
    clock.advance(31)
    got = tube.take()
    assert got is not None and got.pk == task.pk
    assert calls(tube) == {"put": 1, "take": 1, "delay": 1}
    assert tube.put("y", delay=-1).state == "r"


# -- utube ---------------------------------------------------------------------------------


@pytest.mark.parametrize("type", ["utube", "utubettl"])
def test_utube_one_taken_task_per_sub_queue_and_release_order(type):
    tube = make(type)
    a1, a2, b1 = tube.put("a1", utube="a"), tube.put("a2", utube="a"), tube.put("b1", utube="b")
    n1 = tube.put("n1")
    n2 = tube.put("n2")
    assert ids([tube.take(), tube.take(), tube.take()]) == [a1.pk, b1.pk, n1.pk]
    assert tube.take() is None
    tube.release(a1.pk)
    assert tube.take().pk == a1.pk  # released, still first of its sub-queue
    tube.ack(a1.pk)
    assert tube.take().pk == a2.pk
    tube.bury(n1.pk)  # a buried task does not block its sub-queue
    assert tube.take().pk == n2.pk
    taken = Task.objects.filter(tube=tube, state="t")
    assert sorted(taken.values_list("utube", flat=True), key=str) == sorted(["a", "b", None], key=str)


@pytest.mark.parametrize("type", ["utube", "utubettl"])
def test_utube_take_many_takes_one_per_sub_queue(type):
    tube = make(type)
    for key in "aabbcc":
        tube.put(key, utube=key)
    got = tube.take_many(10, consumer="me")
    assert sorted(t.utube for t in got) == ["a", "b", "c"]
    assert tube.take_many(10, consumer="me") == []
    assert tube.ack_many(ids(got), consumer="me") == 3
    assert sorted(t.utube for t in tube.take_many(2, consumer="me")) == ["a", "b"]


# -- batches -------------------------------------------------------------------------------


@pytest.mark.parametrize("type", ["fifo", "fifottl"])
def test_take_many_ack_many_release_many(type):
    tube = make(type)
    put = [tube.put(i) for i in range(10)]
    got = tube.take_many(4, consumer="me")
    assert ids(got) == ids(put[:4])
    assert all(t.state == "t" and t.owner == "me" for t in got)
    assert tube.ack_many([], consumer="me") == 0
    assert tube.ack_many(ids(got[:2]), consumer="other") == 0
    assert tube.ack_many([*ids(got[:2]), put[9].pk, got[0].pk], consumer="me") == 2
    assert tube.release_many(ids(got[2:]), consumer="me") == 2
    assert ids(tube.take_many(100, consumer="me")) == ids(put[2:])
    with pytest.raises(ValueError, match="limit"):
        tube.take_many(0)
    with pytest.raises(TypeError, match="limit"):
        tube.take_many(True)
    stats = tube.statistics()
    assert stats["calls"]["take"] == 12
    assert stats["calls"]["ack"] == 2
    assert stats["calls"]["release"] == 2
    assert stats["tasks"]["done"] == 2


def test_many_verbs_refuse_bad_task_ids_and_change_nothing():
    """ack_many, release_many and touch_many take ints and Tasks: a bool, text, None or an id
    no 64-bit column holds is refused by name, whichever place it has in the list, and no
    task changes; duplicates count once, a generator and a tuple are read as a list is."""
    tube = make("fifottl")
    tube.put_many([1, 2, 3])
    got = tube.take_many(3, consumer="me")
    first = got[0].pk
    for bad, error, said in [
        ([first, True], TypeError, "not bool"),
        ([False], TypeError, "not bool"),
        ([first, "2"], TypeError, "not str"),
        ([None], TypeError, "not NoneType"),
        ([first, 2**63], ValueError, "64-bit"),
        ([-(2**63) - 1, first], ValueError, "64-bit"),
        ("12", TypeError, "not str"),
    ]:
        for verb in (tube.ack_many, tube.release_many):
            with pytest.raises(error, match=said):
                verb(bad, consumer="me")
        with pytest.raises(error, match=said):
            tube.touch_many(bad, 10, consumer="me")
    assert [t.state for t in tube.tasks.order_by("pk")] == ["t", "t", "t"]
    assert tube.ack_many(t.pk for t in got[:1]) == 0  # (another consumer's: not acked)
    assert tube.ack_many((first, first, got[1]), consumer="me") == 2
    assert tube.ack_many([2**63 - 1, -(2**63)], consumer="me") == 0
    assert [t.pk for t in tube.tasks.all()] == [got[2].pk]


# -- statistics and counters ---------------------------------------------------------------


@pytest.mark.parametrize("type", ALL)
def test_statistics_after_the_readme_sequence(type):
    tube = make(type)
    a, b = tube.put(1), tube.put(2)
    tube.ack(tube.take().pk)
    tube.bury(b.pk)
    tube.kick(1)
    tube.delete_task(b.pk)
    stats = tube.statistics()
    assert stats["tasks"] == {"taken": 0, "buried": 0, "ready": 0, "delayed": 0, "done": 2, "total": 0}
    assert stats["calls"] == {
        "ack": 1,
        "bury": 1,
        "delete": 1,
        "kick": 1,
        "put": 2,
        "release": 0,
        "take": 1,
        "touch": 0,
        "ttl": 0,
        "ttr": 0,
        "delay": 0,
    }
    assert Tube.objects.statistics() == {"q": stats}
    assert a.pk < b.pk


def test_counters_are_spread_over_slots_and_survive_a_new_tube_object():
    tube = make("fifo")
    tube.put(1)
    assert TubeStat.objects.filter(tube=tube).count() == tubes_module.SLOTS
    # Another process's counters live in another row; statistics() sums them.
    tube.take(0)
    TubeStat.objects.filter(tube=tube).exclude(slot=tubes_module._slot()).filter(slot__lt=3).update(take=10)
    fresh = Tube.objects.get(pk=tube.pk)
    assert fresh.statistics()["calls"]["take"] in (21, 31)


def test_rolled_back_verbs_leave_no_count_and_truncate_changes_none():
    tube = make("fifo")
    with transaction.atomic():
        tube.put(1)
        tube.take(0)
        transaction.set_rollback(True)
    assert tube.statistics()["calls"]["put"] == 0
    assert not Task.objects.exists()
    tube.put(1)
    tube.put(2)
    tube.take()
    before = tube.statistics()["calls"]
    assert tube.truncate() == 2
    after = tube.statistics()
    assert after["calls"] == before
    assert after["tasks"]["total"] == 0


# -- on_task_change ------------------------------------------------------------------------


def test_on_task_change_events_after_commit(django_capture_on_commit_callbacks):
    events = []
    first = lambda task, event: events.append(("first", task.pk, task.state, event))  # noqa: E731
    tube = make("fifottl", on_task_change=first)
    seen = []

    def second(task, event):
        seen.append((task.pk, task.state, event))

    assert tube.on_task_change(second) is first
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        task = tube.put("x")
        tube.take()
        assert seen == []  # not before commit
    assert len(callbacks) >= 2
    with django_capture_on_commit_callbacks(execute=True):
        tube.release(task.pk)
        tube.bury(task.pk)
        tube.kick()
        tube.take()
        tube.touch(task.pk, 1)
        tube.ack(task.pk)
    assert [e for _, _, e in seen] == ["put", "take", "release", "bury", "kick", "take", "touch", "delete"]
    assert seen[0][1] == "r" and seen[1][1] == "t" and seen[-1][1] == "-"
    assert events == []
    assert tube.on_task_change(None) is second
    assert tube.on_task_change(None) is None
    with django_capture_on_commit_callbacks(execute=True):
        tube.put("y")
    assert len(seen) == 8


def test_on_task_change_reports_ttl_as_delete_then_ttl(django_capture_on_commit_callbacks, clock):
    seen = []
    tube = make("fifottl", on_task_change=lambda task, event: seen.append((task.state, event)))
    with django_capture_on_commit_callbacks(execute=True):
        task = tube.put("x", ttl=60)
    clock.advance(30)
    with django_capture_on_commit_callbacks(execute=True):
        assert tube.peek(task.pk).state == "r"
        tube.statistics()
    assert seen == [("r", "put")]
    clock.advance(31)
    with django_capture_on_commit_callbacks(execute=True):
        assert tube.take() is None
        tube.statistics()
    assert seen == [("r", "put"), ("-", "delete"), ("-", "ttl")]


def test_on_task_change_not_called_on_rollback(django_capture_on_commit_callbacks):
    seen = []
    tube = make("fifo", on_task_change=lambda task, event: seen.append(event))
    with django_capture_on_commit_callbacks(execute=True):
        with transaction.atomic():
            tube.put(1)
            transaction.set_rollback(True)
    assert seen == []


# -- ownership and errors ------------------------------------------------------------------


@pytest.mark.parametrize("type", ALL)
def test_ownership_errors(type):
    tube = make(type)
    task = tube.put("x")
    for verb in (tube.ack, tube.release):
        with pytest.raises(NotTaken):
            verb(task.pk, consumer="me")  # not taken at all
        with pytest.raises(NotTaken):
            verb(task.pk + 999, consumer="me")  # missing id: ownership first
    tube.take(consumer="me")
    with pytest.raises(NotTaken):
        tube.ack(task.pk, consumer="you")
    with pytest.raises(NotTaken):
        tube.release(task.pk, consumer="you")
    with pytest.raises(NotTaken):
        tube.ack(task.pk)  # the default consumer is someone else too
    # An explicit consumer is a durable identity: any caller may act under it.
    assert tube.ack(task.pk, consumer="me").state == "-"
    for verb in (tube.bury, tube.delete_task):
        with pytest.raises(NotFound):
            verb(task.pk)


def test_default_consumer_is_host_pid_thread():
    import os
    import socket

    assert default_consumer() == f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"
    tube = make("fifo")
    task = tube.put(1)
    assert tube.take().owner == default_consumer()
    assert tube.ack(task.pk).state == "-"


@pytest.mark.parametrize(
    "verb, args, kwargs, error, word",
    [
        ("put", (object(),), {}, TypeError, "data"),
        ("put", (1,), {"ttl": -1}, ValueError, "ttl"),
        ("put", (1,), {"ttr": math.inf}, ValueError, "ttr"),
        ("put", (1,), {"delay": math.nan}, ValueError, "delay"),
        ("put", (1,), {"delay": "1"}, TypeError, "delay"),
        ("put", (1,), {"pri": True}, TypeError, "pri"),
        ("put", (1,), {"utube": "x" * 300}, ValueError, "utube"),
        ("take", (), {"timeout": math.inf}, ValueError, "timeout"),
        ("take", (), {"timeout": "1"}, TypeError, "timeout"),
        ("take", (), {"consumer": 5}, TypeError, "consumer"),
        ("take", (), {"consumer": ""}, ValueError, "consumer"),
        ("take_many", (5,), {"consumer": b"x"}, TypeError, "consumer"),
        ("ack", ("1",), {}, TypeError, "task_id"),
        ("ack_many", (["1"],), {}, TypeError, "task_id"),
        ("release", (1,), {"delay": math.nan}, ValueError, "delay"),
        ("touch", (1, math.inf), {}, ValueError, "increment"),
        ("bury", (None,), {}, TypeError, "task_id"),
        ("delete_task", (1.0,), {}, TypeError, "task_id"),
        ("kick", (-1,), {}, ValueError, "count"),
    ],
)
def test_bad_arguments_raise_and_write_nothing(verb, args, kwargs, error, word):
    tube = make("fifottl")
    existing = tube.put("keep")
    with pytest.raises(error, match=word):
        getattr(tube, verb)(*args, **kwargs)
    assert list(Task.objects.values_list("pk", "state")) == [(existing.pk, "r")]
    assert tube.statistics()["calls"] == {**dict.fromkeys(tubes_module.CALLS, 0), "put": 1}
    assert not Consumer.objects.exists()


def test_take_waiting_inside_a_transaction_is_refused():
    tube = make("fifo")
    tube.put(1)
    with transaction.atomic():
        with pytest.raises(TaskloopError):
            tube.take(timeout=1)
        with pytest.raises(TaskloopError):
            tube.take(timeout=None)
        assert tube.take(0).state == "t"


def test_negative_timeout_is_one_immediate_try():
    tube = make("fifo")
    assert tube.take(timeout=-5) is None
    tube.put(1)
    assert tube.take(timeout=-5).state == "t"


# -- drop / truncate -----------------------------------------------------------------------


@pytest.mark.parametrize("type", ALL)
def test_drop_refuses_taken_tasks_then_every_verb_is_not_found(type):
    tube = make(type)
    task = tube.put(1)
    tube.put(2, utube="b")
    tube.take(consumer="me")
    with pytest.raises(TubeError):
        tube.drop()
    assert tube.truncate() == 2  # clears ownership too
    assert tube.drop() is True
    assert not Tube.objects.exists()
    assert not TubeStat.objects.exists()
    for call in (
        lambda: tube.put(1),
        lambda: tube.take(),
        lambda: tube.take_many(3),
        lambda: tube.ack(task.pk, consumer="me"),
        lambda: tube.ack_many([task.pk], consumer="me"),
        lambda: tube.release(task.pk, consumer="me"),
        lambda: tube.touch(task.pk, 1, consumer="me"),
        lambda: tube.peek(task.pk),
        lambda: tube.bury(task.pk),
        lambda: tube.kick(),
        lambda: tube.delete_task(task.pk),
        lambda: tube.truncate(),
        lambda: tube.drop(),
        lambda: tube.statistics(),
    ):
        with pytest.raises(NotFound):
            call()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_drop_refuses_while_a_consumer_waits():
    tube = make("fifo")
    result = {}

    def wait():
        try:
            result["task"] = Tube.objects.get(pk=tube.pk).take(timeout=1.5, consumer="waiter")
        finally:
            connections.close_all()

    thread = threading.Thread(target=wait)
    thread.start()
    time.sleep(0.5)
    with pytest.raises(TubeError):
        tube.drop()
    thread.join()
    assert result["task"] is None
    assert tube.drop() is True


# -- dead consumers ------------------------------------------------------------------------


@pytest.mark.parametrize("type", ALL)
def test_a_dead_consumers_tasks_go_back_to_ready(type, settings, clock):
    settings.TASKLOOP = {"CONSUMER_TIMEOUT": 60.0}
    tube = make(type)
    task = tube.put("x")
    tube.take(consumer="dies")
    assert Consumer.objects.filter(name="dies").exists()
    assert tube.take(consumer="lives") is None
    clock.advance(30)
    assert tube.peek(task.pk).state == "t"
    clock.advance(31)  # (the clock's move also lets this process look for the dead again at once)
    assert tube.peek(task.pk).state == "r"
    assert tube.take(consumer="lives").pk == task.pk
    with pytest.raises(NotTaken):
        tube.ack(task.pk, consumer="dies")
    # (Within "lives"'s own timeout of its last call: a loaded machine must not make it dead too.)
    assert tube.statistics()["calls"]["release"] == 1


def test_reap_applies_every_transition_and_counts_them(settings, clock):
    settings.TASKLOOP = {"CONSUMER_TIMEOUT": 60.0}
    fifo, ttl = make("fifo", "a"), make("fifottl", "b")
    fifo.put(1)
    fifo.take(consumer="dies")
    ttl.put("gone", ttl=40)
    ttl.put("later", delay=40)
    ttl.put("run", ttr=40)
    ttl.take(consumer="slow")
    clock.advance(30)
    assert Tube.objects.reap() == {"delay": 0, "ttr": 0, "ttl": 0, "release": 0, "consumers": 0}
    clock.advance(31)
    assert Tube.objects.reap() == {"delay": 1, "ttr": 1, "ttl": 1, "release": 1, "consumers": 2}
    assert Tube.objects.reap() == {"delay": 0, "ttr": 0, "ttl": 0, "release": 0, "consumers": 0}
    assert fifo.statistics()["tasks"]["ready"] == 1
    assert ttl.statistics()["tasks"]["ready"] == 2


# -- the claim is served by an index -------------------------------------------------------


@pytest.mark.parametrize("type", ["fifo", "fifottl", "utube"])
def test_claim_order_is_served_by_the_claim_index(type, vendor):
    other = make(type, "other")
    tube = make(type)
    # A realistic table: most rows belong to other tubes, and some of ours are not ready.
    Task.objects.bulk_create([Task(tube=other, data=i) for i in range(3000)], batch_size=1000)
    pri = (lambda i: i % 3) if type == "fifottl" else (lambda i: 0)
    mine = Task.objects.bulk_create([Task(tube=tube, data=i, pri=pri(i)) for i in range(300)])
    Task.objects.filter(pk__in=[t.pk for t in mine[:50]]).update(state="!")
    queryset = tube.tasks.all().filter(tube._claimable()).in_claim_order().values_list("pk", flat=True)[:10]
    if vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE taskloop_task")
    elif vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
    # (MySQL's ANALYZE TABLE would commit the test's transaction; InnoDB's estimates will do.)
    plan = queryset.explain()
    print(plan)
    outer = plan.split("SubPlan")[0]
    if vendor == "postgresql":
        assert (
            "Index Scan using taskloop_task_claim" in outer
            or "Index Only Scan using taskloop_task_claim" in outer
        )
        assert "Sort" not in outer
    elif vendor == "mysql":
        # id select_type table type possible_keys key key_len ref rows Extra
        first = plan.splitlines()[0].split()
        # fifo/utube order by id (pri is the constant 0): the primary key serves it as well.
        assert first[5] in (
            ("taskloop_task_claim",) if type == "fifottl" else ("taskloop_task_claim", "PRIMARY")
        )
        assert "filesort" not in plan.splitlines()[0].lower()
    else:
        assert "USING INDEX taskloop_task_claim" in plan or "USING COVERING INDEX taskloop_task_claim" in plan
        assert "TEMP B-TREE" not in plan.upper()


# -- real processes ------------------------------------------------------------------------


def _put_later(tube_id: int, rounds: int) -> list[float]:
    tube = Tube.objects.get(pk=tube_id)
    stamps = []
    for i in range(rounds):
        time.sleep(0.3)
        tube.put(i)
        stamps.append(time.time())
    return stamps


def _take_waiting(tube_id: int, rounds: int) -> list[float]:
    tube = Tube.objects.get(pk=tube_id)
    stamps = []
    for _ in range(rounds):
        task = tube.take(timeout=5, consumer="waiter")
        assert task is not None
        stamps.append(time.time())
        tube.ack(task.pk, consumer="waiter")
    return stamps


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_waiting_take_wakes_promptly_on_a_put_in_another_process(vendor):
    tube = make("fifo")
    rounds = 6
    results = race(
        lambda mode: (_put_later if mode == "put" else _take_waiting)(tube.pk, rounds), [("put",), ("take",)]
    )
    puts, takes = sorted(results, key=lambda stamps: stamps[0])
    latencies = [got - put for put, got in zip(puts, takes, strict=True)]
    median = pystats.median(latencies)
    print(
        f"\n[{vendor}] put -> waiting take: median {median * 1000:.1f} ms, max {max(latencies) * 1000:.1f} ms"
    )
    assert median < 1.0
    assert max(latencies) < 2.0


def _consume(tube_id: int, worker: int) -> list[tuple[int, str | None, float, float]]:
    """Take and ack until the tube stays empty; record each hold (pk, utube, took, acking)."""
    tube = Tube.objects.get(pk=tube_id)
    consumer = f"w{worker}"
    held = []
    empty = 0
    while empty < 5:
        if worker >= 2:
            tasks = tube.take_many(16, consumer=consumer)
        else:
            task = tube.take(0, consumer=consumer)
            tasks = [task] if task else []
        took = time.monotonic()
        if not tasks:
            empty += 1
            time.sleep(0.02)
            continue
        empty = 0
        acking = time.monotonic()
        if worker >= 2:
            assert tube.ack_many([t.pk for t in tasks], consumer=consumer) == len(tasks)
        else:
            assert tube.ack(tasks[0].pk, consumer=consumer).state == "-"
        held.extend((t.pk, t.utube, took, acking) for t in tasks)
    return held


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_eight_consumers_ack_every_task_once_and_never_share_a_sub_queue(vendor):
    tube = make("utube")
    Task.objects.bulk_create(
        [Task(tube=tube, data=i, utube=str(i % 100) if i % 101 else None) for i in range(5000)],
        batch_size=1000,
    )
    started = time.monotonic()
    results = race(_consume, [(tube.pk, w) for w in range(8)])
    elapsed = time.monotonic() - started
    held = [row for result in results for row in result]
    print(f"\n[{vendor}] 8 consumers, 5000 utube tasks: {elapsed:.1f} s ({5000 / elapsed:.0f} tasks/s)")
    # Under a loaded machine a late starter may find the work gone; most must have shared it.
    assert sum(1 for result in results if result) >= 4, "the consumers did not share the work"
    assert len(held) == 5000
    assert len({pk for pk, *_ in held}) == 5000
    assert not Task.objects.exists()
    stats = tube.statistics()
    assert stats["calls"]["take"] == stats["calls"]["ack"] == stats["tasks"]["done"] == 5000
    # No sub-queue ever had two taken tasks: per sub-queue, holds never overlap.
    by_key: dict[str | None, list[tuple[float, float]]] = {}
    for _pk, key, took, acking in held:
        by_key.setdefault(key, []).append((took, acking))
    for key, spans in by_key.items():
        spans.sort()
        for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
            assert end <= start, f"sub-queue {key!r} had two taken tasks at once"
    connections.close_all()


# -- the worker's driver: keeping its in-flight tasks' leases -----------------------------------


def _tube_driver(tube: Tube, consumer: str) -> object:
    from django_taskloop.workers import Handler
    from django_taskloop.workers.drivers import TubeDriver

    driver = TubeDriver(
        Handler("tube", tube.name, lambda task: None, tube.name, batch=10, lease=60), consumer
    )
    driver.tube = tube
    return driver


@pytest.mark.django_db(transaction=True)
def test_a_workers_heartbeat_touches_its_timed_tasks_in_one_statement():
    """Each beat pushes the deadline of every task the worker holds: one UPDATE for them all
    (it was one transaction per task: 100 in flight, 100 transactions a beat, every beat)."""
    tube = Tube.objects.create_tube("beats", "fifottl", ttr=30)
    tube.put_many(list(range(6)))
    driver = _tube_driver(tube, "w")
    tasks = tube.take_many(5, consumer="w")
    lost = tasks[4]
    tube.release(lost.pk, consumer="w")  # no longer ours: skipped
    before = dict(Task.objects.filter(state="t").values_list("pk", "event_at"))
    with CaptureQueriesContext(connection) as queries:
        driver.renew(tasks)
    writes = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("UPDATE")]
    assert len([w for w in writes if "taskloop_task" in w.split("SET")[0]]) == 1, writes
    after = {
        pk: (at, ttr) for pk, at, ttr in Task.objects.filter(state="t").values_list("pk", "event_at", "ttr")
    }
    assert set(after) == {t.pk for t in tasks[:4]}
    for pk, (event_at, ttr) in after.items():
        assert (event_at - before[pk]).total_seconds() == pytest.approx(driver.beat_every, abs=0.01)
        assert ttr == pytest.approx(30 + driver.beat_every)
    assert Task.objects.get(pk=lost.pk).state == "r"
    assert tube.statistics()["calls"]["touch"] == 4


@pytest.mark.django_db(transaction=True)
def test_a_workers_heartbeat_leaves_tasks_without_a_deadline_alone():
    """A task with no ttr and no ttl has no deadline to push: a beat writes nothing for it."""
    tube = Tube.objects.create_tube("untimed", "fifottl")
    tube.put_many([1, 2, 3])
    driver = _tube_driver(tube, "w")
    tasks = tube.take_many(3, consumer="w")
    assert all(t.event_at is None and t.ttl_at is None for t in tasks)
    with CaptureQueriesContext(connection) as queries:
        driver.renew(tasks)
    assert not [
        q for q in queries.captured_queries if "taskloop_task" in q["sql"].replace("taskloop_tube", "")
    ]
    assert tube.statistics()["calls"]["touch"] == 0


# -- expired is not ready (issue 26, item 5) -----------------------------------------------


def _expire(*tasks: Task, taken: bool = False) -> None:
    """Move the ttl deadline of ``tasks`` into the past (database clock), as waiting would."""
    from django_taskloop.engine import DbNow

    changes = {"ttl_at": DbNow(-1)}
    if taken:
        changes["event_at"] = DbNow(-1)  # a taken task's ttr deadline never passes its ttl
    Task.objects.filter(pk__in=[t.pk for t in tasks]).update(**changes)


@pytest.mark.parametrize("type", TTL)
def test_expired_task_is_not_ready_in_statistics_that_only_read(type):
    """The issue's case: put(ttl=1), wait, no worker. A page view's statistics only read, and
    must not count a task past its ttl as ready (nor taken or buried): Tarantool removes it."""
    tube = make(type, ttr=600)
    taken = tube.put({"n": 0}, ttl=1)
    assert tube.take(0, consumer="w1").pk == taken.pk
    _expire(taken, taken=True)
    ready = tube.put({"n": 1}, ttl=1)
    _expire(ready)
    buried = tube.bury(tube.put({"n": 2}, ttl=1).pk)
    _expire(buried)
    tube.put({"n": 3}, ttl=3600, utube="other")
    stats = tube.statistics(apply_transitions=False)
    tasks = stats["tasks"]
    assert (tasks["ready"], tasks["taken"], tasks["buried"], tasks["delayed"]) == (1, 0, 0, 0), tasks
    assert tasks["expired"] == 3 and tasks["total"] == 1, tasks
    assert stats["calls"]["put"] == 4
    assert Task.objects.filter(tube=tube).count() == 4  # only read: nothing was removed
    # Applying the transitions removes them, as Tarantool's ttl does.
    assert tube.statistics()["tasks"] == {
        "taken": 0,
        "buried": 0,
        "ready": 1,
        "delayed": 0,
        "done": 3,
        "total": 1,
    }


@pytest.mark.parametrize("type", TTL)
def test_expired_task_is_not_ready_in_the_named_states(type):
    tube = make(type)
    alive = tube.put({"n": 0}, ttl=3600)
    gone = tube.put({"n": 1}, ttl=1)
    delayed = tube.put({"n": 2}, delay=600)
    _expire(gone)
    tasks = Task.objects.filter(tube=tube)
    assert list(tasks.ready()) == [alive]
    assert list(tasks.expired()) == [gone]
    assert list(tasks.delayed()) == [delayed]
    assert not tasks.taken().exists() and not tasks.buried().exists()
    assert tasks.state_counts() == {"ready": 1, "taken": 0, "delayed": 1, "buried": 0, "expired": 1}
    now = db_now()
    assert [t.current_state(now) for t in tasks.order_by("pk")] == ["ready", "expired", "delayed"]
    assert Task.objects.get(pk=gone.pk).current_state() == "expired"
