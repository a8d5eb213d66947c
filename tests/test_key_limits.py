"""A utube's key limit (``Tube.set_key_limit``, ``@tube(key_limit=…)``): at most N tasks of one
key taken at once; and its key rate (``Tube.set_key_rate``, ``@tube(key_rate=…)``): at most R
of one key taken in any period. By every consumer together, held by the database (issue 44 §2:
limits per key; the key limit generalises utube's one at a time)."""

from __future__ import annotations

import time
from collections import defaultdict

import pytest
from django.db import connections

from django_taskloop.exceptions import NotFound
from django_taskloop.models import Task, Tube
from tests.conftest import race
from tests.workers_util import most_running

pytestmark = pytest.mark.django_db(transaction=True)


def _taken_by_key(tube: Tube) -> dict[str | None, list[int]]:
    taken: dict[str | None, list[int]] = defaultdict(list)
    for task in Task.objects.filter(tube=tube, state="t").order_by("id"):
        taken[task.utube].append(task.data)
    return dict(taken)


@pytest.mark.parametrize("kind", ["utube", "utubettl"])
def test_a_key_limit_hands_out_at_most_n_of_a_key_first_ones_first(kind):
    tube = Tube.objects.create_tube("k", kind, key_limit=2)
    for i in range(5):
        tube.put(i, utube="a")
    for i in range(10, 13):
        tube.put(i, utube="b")
    tube.put(20)  # no key: the tasks without one are a sub-queue too
    tube.put(21)
    tube.put(22)
    assert sorted(t.data for t in tube.take_many(10, consumer="w1")) == [0, 1, 10, 11, 20, 21]
    assert tube.take_many(10, consumer="w2") == []  # each key has its two
    assert _taken_by_key(tube) == {"a": [0, 1], "b": [10, 11], None: [20, 21]}
    (first,) = [t for t in Task.objects.filter(tube=tube, data=0)]
    tube.ack(first.id, consumer="w1")
    assert [t.data for t in tube.take_many(10, consumer="w2")] == [2]  # a's next, in order
    # A limit of one (or None) is the utube's own rule: one of a key at a time.
    tube.set_key_limit(1)
    assert Tube.objects.get(pk=tube.pk).key_limit is None
    for task in list(Task.objects.filter(tube=tube, state="t")):
        tube.ack(task.id, consumer=task.owner)
    assert sorted(t.data for t in tube.take_many(10, consumer="w1")) == [3, 12, 22]


def test_a_task_that_comes_back_ahead_of_taken_ones_does_not_raise_the_count():
    """A buried task kicked back (or one released) sits before the key's taken ones: it counts
    with them, and the key's limit still holds."""
    tube = Tube.objects.create_tube("k", "utube", key_limit=2)
    ids = [tube.put(i, utube="a").id for i in range(4)]
    (head,) = tube.take_many(1, consumer="w")
    tube.bury(head.id)
    assert sorted(t.id for t in tube.take_many(5, consumer="w")) == ids[1:3]
    assert tube.kick(1) == 1  # the head is ready again, before the two taken
    assert tube.take_many(5, consumer="w") == []
    tube.release(ids[1], consumer="w")  # a slot is free: the key's first ready task takes it
    assert [t.id for t in tube.take_many(5, consumer="w")] == [ids[0]]
    assert sorted(_taken_by_key(tube)["a"]) == [0, 2]


def test_another_process_s_key_limit_holds_from_the_next_take():
    """A consumer's tube object that read another key limit (or none) claims by the row's."""
    tube = Tube.objects.create_tube("k", "utube", key_limit=3)
    for i in range(6):
        tube.put(i, utube="a")
    Tube.objects.get(pk=tube.pk).set_key_limit(2)  # another process lowers it
    assert len(tube.take_many(6, consumer="w")) == 2
    assert tube.key_limit == 2
    Tube.objects.get(pk=tube.pk).set_key_limit(4)  # and raises it
    assert len(tube.take_many(6, consumer="w")) == 2
    Tube.objects.get(pk=tube.pk).set_key_limit(None)  # back to one at a time
    tube.ack_many([t.id for t in Task.objects.filter(tube=tube, state="t")], consumer="w")
    assert len(tube.take_many(6, consumer="w")) == 1


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "3"])
def test_a_bad_key_limit_is_refused_and_changes_nothing(bad):
    tube = Tube.objects.create_tube("k", "utube", key_limit=3)
    with pytest.raises((TypeError, ValueError), match="key_limit"):
        tube.set_key_limit(bad)
    assert tube.key_limit == 3 and Tube.objects.get(pk=tube.pk).key_limit == 3
    with pytest.raises((TypeError, ValueError), match="key_limit"):
        Tube.objects.create_tube("bad", "utube", key_limit=bad)
    assert not Tube.objects.filter(name="bad").exists()


@pytest.mark.parametrize("kind", ["fifo", "fifottl"])
def test_a_key_limit_on_a_tube_without_keys_is_refused(kind):
    with pytest.raises(ValueError, match="utube and utubettl tubes"):
        Tube.objects.create_tube("k", kind, key_limit=2)
    assert not Tube.objects.filter(name="k").exists()
    tube = Tube.objects.create_tube("k", kind)
    with pytest.raises(ValueError, match="utube and utubettl tubes"):
        tube.set_key_limit(2)
    tube.set_key_limit(None)  # (none is every tube's)
    assert Tube.objects.get(pk=tube.pk).key_limit is None


def test_a_dropped_tube_s_key_limit_cannot_be_set():
    tube = Tube.objects.create_tube("k", "utube")
    Tube.objects.get(pk=tube.pk).drop()
    with pytest.raises(NotFound):
        tube.set_key_limit(2)


@pytest.mark.parametrize("kind", ["utube", "utubettl"])
def test_a_key_rate_hands_out_at_most_its_rate_of_a_key_per_period(kind, clock, settings):
    """``set_key_rate("2/10s")``: at most 2 of one key's tasks taken in any 10 s (and the
    margin), a key's first ready one a take; tasks without a key have none; a tube rate beside
    it counts every task once."""
    from django_taskloop.validation import Rate

    settings.TASKLOOP = {"RATE_MARGIN": 5}  # (steps of the test clock leave real time to spare)
    tube = Tube.objects.create_tube("k", kind, ttr=60 if kind.endswith("ttl") else None, key_rate="2/10s")
    assert Tube.objects.get(pk=tube.pk).key_rate == Rate(2, 10)
    tube.set_key_limit(5)  # (a key's tasks may run together: the rate is what holds them back)
    for i in range(4):
        tube.put(i, utube="a")
        tube.put(10 + i, utube="b")
    tube.put(20)
    tube.put(21)
    first = tube.take_many(10, consumer="w")
    # One of a key a take; no key: no key rate (the key limit holds those as one sub-queue).
    assert sorted(t.data for t in first) == [0, 10, 20, 21]
    tube.ack_many([t.id for t in first], consumer="w")  # the rate counts starts, not what runs
    assert sorted(t.data for t in tube.take_many(10, consumer="w")) == [1, 11]
    assert tube.take_many(10, consumer="w") == []  # each key has had its 2
    clock.advance(12)
    assert tube.take_many(10, consumer="w") == []  # the period and the margin: 15 s
    clock.advance(3.5)
    assert sorted(t.data for t in tube.take_many(10, consumer="w")) == [2, 12]
    # The key rate's log holds a row per task with a key, the tube rate's none of them.
    assert tube.rate_used() is None
    tube.set_key_rate(None)
    assert sorted(t.data for t in tube.take_many(10, consumer="w")) == [3, 13]
    assert Tube.objects.get(pk=tube.pk).key_rate is None


def test_a_key_rate_and_a_tube_rate_hold_together(clock, settings):
    settings.TASKLOOP = {"RATE_MARGIN": 5}
    tube = Tube.objects.create_tube("k", "utube", rate="3/10s", key_rate="1/10s")
    for i in range(3):
        tube.put(i, utube="a")
        tube.put(10 + i, utube="b")
    assert sorted(t.data for t in tube.take_many(10, consumer="w")) == [0, 10]
    assert tube.rate_used() == 2
    tube.ack_many([t.id for t in Task.objects.filter(tube=tube, state="t")], consumer="w")
    assert tube.take_many(10, consumer="w") == []  # each key had its 1; the tube 2 of 3
    clock.advance(16)
    assert len(tube.take_many(10, consumer="w")) == 2
    assert tube.rate_used() == 2  # (the window moved on: these two alone)


@pytest.mark.parametrize("kind", ["fifo", "fifottl"])
def test_a_key_rate_on_a_tube_without_keys_is_refused(kind):
    with pytest.raises(ValueError, match="utube and utubettl tubes"):
        Tube.objects.create_tube("k", kind, key_rate="1/s")
    assert not Tube.objects.filter(name="k").exists()
    tube = Tube.objects.create_tube("k", kind)
    with pytest.raises(ValueError, match="utube and utubettl tubes"):
        tube.set_key_rate("1/s")
    with pytest.raises(ValueError, match="key_rate"):
        Tube.objects.create_tube("u", "utube", key_rate="fast")
    assert Tube.objects.get(pk=tube.pk).key_rate is None and not Tube.objects.filter(name="u").exists()


def _hold_and_ack(tube_id: int, worker: int) -> list[tuple[str, float, float, int]]:
    """Take one task at a time until the tube stays empty, hold it 200 ms, acknowledge it;
    return each hold: its key, when it was taken and acknowledged by the monotonic clock (one
    machine), and how many of its key the database had taken midway."""
    tube = Tube.objects.get(pk=tube_id)
    holds = []
    empty = 0
    while empty < 20:
        tasks = tube.take_many(1, consumer=f"w{worker}")
        if not tasks:
            empty += 1
            time.sleep(0.005)
            continue
        empty = 0
        (task,) = tasks
        took = time.monotonic()
        time.sleep(0.1)
        seen = Task.objects.filter(tube_id=tube_id, utube=task.utube, state="t").count()
        time.sleep(0.1)
        acking = time.monotonic()
        tube.ack(task.id, consumer=f"w{worker}")
        holds.append((str(task.utube), took, acking, seen))
    connections.close_all()
    return holds


@pytest.mark.slow
def test_six_processes_never_hold_more_than_the_key_limit(vendor):
    """Six processes take one task at a time from two keys with a key limit of 2: more takers
    than slots, so takes meet at the limit all the time."""
    tube = Tube.objects.create_tube("k", "utubettl", ttr=60, key_limit=2)
    keys = ["a", "b"]
    Task.objects.bulk_create(
        [Task(tube=tube, data=i, utube=keys[i % 2], state="r", pri=0, ttr=60.0) for i in range(60)]
    )
    results = race(_hold_and_ack, [(tube.pk, w) for w in range(6)])
    holds = [hold for result in results for hold in result]
    assert len(holds) == 60 and not Task.objects.filter(tube=tube).exists()
    assert sum(1 for result in results if result) >= 3, "the processes did not share the work"
    # At any moment, at most 2 of a key held, by the database's count midway through each hold
    # and by the holds' times (from just after a take returned to just before its
    # acknowledgement was sent: it under-counts nothing the database allowed).
    seen = max(hold[3] for hold in holds)
    most = {}
    for key in keys:
        mine = [(took, acking) for k, took, acking, _ in holds if k == key]
        most[key] = most_running([took for took, _ in mine], [acking for _, acking in mine])
    print(f"\n[{vendor}] most of a key held at once: {most}, counted: {seen} (key limit 2)")
    assert seen <= 2 and max(most.values()) <= 2
    assert min(most.values()) == 2, "the key limit was never reached: the test shows nothing"


def test_the_decorator_and_the_key_limits_setting_set_it_at_a_worker_s_start(settings, caplog):
    from django_taskloop.workers.drivers import TubeDriver
    from tests.testapp.taskloop import key_limited, limited  # key_limit=2; a fifottl tube

    key_limited._tubes.clear()
    key_limited.put({"sleep": 0}, utube="a")  # the put makes the tube with the decorator's
    tube = Tube.objects.get(name="w-key-limited")
    assert tube.key_limit == 2
    tube.set_key_limit(5)
    driver = TubeDriver(key_limited, "w")
    driver.prepare()
    assert Tube.objects.get(pk=tube.pk).key_limit == 2
    settings.TASKLOOP = {"KEY_LIMITS": {"w-key-limited": 3}}
    driver.prepare()
    assert Tube.objects.get(pk=tube.pk).key_limit == 3
    settings.TASKLOOP = {"KEY_LIMITS": {"w-key-limited": None}}  # one at a time
    driver.prepare()
    assert Tube.objects.get(pk=tube.pk).key_limit is None
    settings.TASKLOOP = {"KEY_RATES": {"w-key-limited": "7/m"}}  # and a key rate, as a rate
    driver.prepare()
    assert str(Tube.objects.get(pk=tube.pk).key_rate) == "7/m" and driver.paced
    # A tube without keys: the setting is left unset, and the worker says so.
    settings.TASKLOOP = {"KEY_LIMITS": {"w-limited": 3}}
    other = TubeDriver(limited, "w")
    other.prepare()
    assert Tube.objects.get(name="w-limited").key_limit is None
    assert "tube 'w-limited' is fifottl: its tasks have no keys" in caplog.text
    settings.TASKLOOP = {"KEY_RATES": {"w-limited": "3/s"}}
    other.prepare()
    assert Tube.objects.get(name="w-limited").key_rate is None
    assert "so its key rate of 3/s is left unset" in caplog.text


@pytest.mark.parametrize("limits", [{"t": 0}, {"t": True}, {"t": 1.5}, {"": 3}, ["t"]], ids=lambda v: repr(v))
def test_a_bad_key_limits_setting_is_a_system_check_error(settings, limits):
    from django_taskloop.checks import check_settings

    settings.TASKLOOP = {"KEY_LIMITS": limits}
    errors = [e for e in check_settings(None) if e.id == "taskloop.E020"]
    assert errors and "KEY_LIMITS" in errors[0].msg, errors


@pytest.mark.parametrize(
    "rates", [{"t": "fast"}, {"t": 5}, {"t": "0/m"}, {"": "1/s"}, ["t"]], ids=lambda v: repr(v)
)
def test_a_bad_key_rates_setting_is_a_system_check_error(settings, rates):
    from django_taskloop.checks import check_settings

    settings.TASKLOOP = {"KEY_RATES": rates}
    errors = [e for e in check_settings(None) if e.id == "taskloop.E020"]
    assert errors and "KEY_RATES" in errors[0].msg, errors


def test_status_json_metrics_and_the_dashboard_show_the_key_limit(boss):
    """Status (its table and JSON), the metrics and the dashboard show a key limit and a key rate."""
    from django.urls import reverse

    from django_taskloop.management.terminal.status import _as_json, status_lines, summaries
    from django_taskloop.metrics import render_metrics

    keyed = Tube.objects.create_tube("keyed", "utube", key_limit=3, key_rate="10/m")
    Tube.objects.create_tube("plain", "fifo").put(1)
    Tube.objects.create_tube("one", "utube", key_rate="5/s")
    keyed.put(1, utube="a")
    found = summaries()
    lines = status_lines(found, {})
    header = next(line for line in lines if line.startswith("TUBES"))
    assert "PER KEY" in header, lines
    row = {
        line.split()[0]: line
        for line in lines
        if line.split() and line.split()[0] in ("keyed", "plain", "one")
    }
    assert "3 at once, 10/m" in row["keyed"] and "5/s" in row["one"] and "at once" not in row["one"], lines
    assert "—" in row["plain"].split(), lines
    # No column where no tube has a key limit or rate.
    plain_only = status_lines([s for s in found if s.name == "plain"], {})
    assert "PER KEY" not in next(line for line in plain_only if line.startswith("TUBES")), plain_only
    by_name = {s.name: s for s in found}
    assert _as_json(by_name["keyed"], 0)["key_limit"] == 3
    assert _as_json(by_name["keyed"], 0)["key_rate"] == "10/m"
    assert _as_json(by_name["plain"], 0)["key_limit"] is None
    assert _as_json(by_name["plain"], 0)["key_rate"] is None
    text = render_metrics()
    assert 'taskloop_key_limit{queue="keyed",kind="task"} 3' in text
    assert 'taskloop_key_limit{queue="plain"' not in text
    assert 'taskloop_key_rate_limit{queue="keyed",kind="task"} 10' in text
    assert 'taskloop_key_rate_period_seconds{queue="keyed",kind="task"} 60' in text
    # Each family's samples follow its HELP and TYPE (the text format's rule).
    assert text.index("# TYPE taskloop_key_rate_limit") < text.index('taskloop_key_rate_limit{queue="keyed"')
    assert text.index('taskloop_key_limit{queue="keyed"') < text.index("# TYPE taskloop_key_rate_limit")
    page = boss.get(reverse("admin:django_taskloop_dashboard")).content.decode()
    assert page.count("per key 3") == 1 and page.count("per key 10/m") == 1, page


def test_a_tube_s_key_limit_through_the_admin(boss):
    """The tube form's key limit: for utube tubes alone (refused with its reason, nothing
    made, for a fifo), 1 saved as one at a time; the list shows it beside the running limit."""
    from django.urls import reverse

    add = reverse("admin:django_taskloop_tube_add")
    refused = boss.post(add, {"name": "none", "type": "fifo", "key_limit": "2"})
    assert refused.status_code == 200 and not Tube.objects.filter(name="none").exists()
    assert "utube and utubettl tubes" in refused.content.decode()
    assert boss.post(add, {"name": "mail", "type": "utube", "key_limit": "3"}).status_code == 302
    tube = Tube.objects.get(name="mail")
    assert tube.key_limit == 3
    listed = boss.get(reverse("admin:django_taskloop_tube_changelist")).content.decode()
    # The per-key part on a line of its own (the cell stays one short column at 1280 px).
    assert '<td class="field-limit">-<small class="tl-per-key">3 per key</small></td>' in listed, listed
    change = reverse("admin:django_taskloop_tube_change", args=[tube.pk])
    assert boss.post(change, {"key_limit": "1"}).status_code == 302
    assert Tube.objects.get(pk=tube.pk).key_limit is None
    # The key rate: one text field, as the rate.
    refused = boss.post(change, {"key_rate": "fast"})
    assert refused.status_code == 200 and "count per period" in refused.content.decode()
    assert boss.post(change, {"key_rate": "10/m"}).status_code == 302
    assert str(Tube.objects.get(pk=tube.pk).key_rate) == "10/m"
    assert 'value="10/m"' in boss.get(change).content.decode()
    listed = boss.get(reverse("admin:django_taskloop_tube_changelist")).content.decode()
    assert '<td class="field-rate_text">-<small class="tl-per-key">10/m per key</small></td>' in listed
    assert boss.post(change, {"key_rate": ""}).status_code == 302
    assert Tube.objects.get(pk=tube.pk).key_rate is None
    refused = boss.post(add, {"name": "none", "type": "fifo", "key_rate": "1/s"})
    assert refused.status_code == 200 and not Tube.objects.filter(name="none").exists()


def _take_keys_at_pace(tube_id: int, worker: int) -> list[tuple[str, tuple[float, float]]]:
    """Take up to three tasks at a time until the tube stays empty, acknowledging them with the
    next take as a worker's batch does; return each task's key and the two times between which
    its take claimed (``test_tube_rates._take_at_pace``)."""
    from tests.test_tube_rates import _between

    tube = Tube.objects.get(pk=tube_id)
    takes: list[tuple[str, tuple[float, float]]] = []
    empty, held = 0, []
    while empty < 60:
        _acked, tasks = tube.ack_and_take([task.id for task in held], 3, consumer=f"w{worker}")
        returned = time.time()
        held = tasks
        if not tasks:
            empty += 1
            time.sleep(0.02)
            continue
        empty = 0
        takes.extend((str(task.utube), _between(tube, returned)) for task in tasks)
    connections.close_all()
    return takes


@pytest.mark.slow
def test_six_processes_never_take_more_than_the_key_rate(vendor):
    """A key rate of 5/s on two keys, six processes taking: a claim of a key and the fifth
    after it never less than a second apart (the latter's return less the former's lock), and
    5 of a key in a second reached; the two keys together take 10 a second."""
    from tests.test_tube_rates import fewest_seconds_apart, most_in_a_window

    tube = Tube.objects.create_tube("k", "utubettl", ttr=60, key_limit=20, key_rate="5/s")
    Task.objects.bulk_create(
        [Task(tube=tube, data=i, utube="ab"[i % 2], state="r", pri=0, ttr=60.0) for i in range(30)]
    )
    results = race(_take_keys_at_pace, [(tube.pk, w) for w in range(6)])
    takes = [take for result in results for take in result]
    assert len(takes) == 30 and not Task.objects.filter(tube=tube).exists()
    assert sum(1 for result in results if result) >= 2, "the processes did not share the work"
    by_key = {key: [between for k, between in takes if k == key] for key in "ab"}
    most = {key: most_in_a_window([locked for locked, _ in mine], 1.0) for key, mine in by_key.items()}
    apart = {key: round(fewest_seconds_apart(mine, 5), 3) for key, mine in by_key.items()}
    starts = [locked for _k, (locked, _returned) in takes]
    span = max(starts) - min(starts)
    print(
        f"\n[{vendor}] most of a key taken in any 1 s (by lock): {most} (key rate 5/s); a claim of "
        f"a key and the 5th after it at least {apart} s apart; 30 in {span:.2f} s (ideal 2.0)"
    )
    assert min(apart.values()) >= 1.0
    assert min(most.values()) >= 5, "the key rate was never reached: the test shows nothing"
    assert span >= 2.0  # (15 of a key: three windows, the third 2 s after the first)
