"""Tubes spread over several databases (issue 31, part 1): ``TASKLOOP["SHARDS"]``,
``shards.tube()``, ``@tube`` handlers and the workers, on the suite's two database aliases
(``default`` and ``other``: two databases of the server under test, or two SQLite files).
What a shard's server dying does mid-drain is in tests/reliability/test_shards.py."""

from __future__ import annotations

import contextlib
import io
import logging
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from django.core.checks import run_checks
from django.core.management import call_command
from django.db import DatabaseError, connections

from django_taskloop import shards
from django_taskloop.models import Task, Tube
from django_taskloop.workers import Handler, shard_handlers
from django_taskloop.workers.runner import Worker

pytestmark = pytest.mark.django_db(databases=["default", "other"], transaction=True)

BOTH = ["default", "other"]
UTUBE = {"type": "utubettl"}


@pytest.fixture
def sharded(settings: Any) -> shards.ShardedTube:
    settings.TASKLOOP = {"SHARDS": {"s-tube": BOTH}}
    return shards.tube("s-tube", type="utubettl")


def on(alias: str) -> Any:
    return Task.objects.using(alias).filter(tube__name="s-tube")


@contextlib.contextmanager
def unreachable(alias: str) -> Iterator[None]:
    """Make database ``alias`` unreachable (a closed port, a file in no directory) until the
    block ends."""
    connection = connections[alias]
    saved = dict(connection.settings_dict)
    connection.close()
    if connection.vendor == "sqlite":
        connection.settings_dict["NAME"] = "/nonexistent/taskloop/unreachable.sqlite3"
    else:
        connection.settings_dict.update(HOST="127.0.0.1", PORT="1")
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(saved)


def test_a_keyed_put_goes_to_its_keys_shard_in_order(sharded):
    keys = [f"customer-{n}" for n in range(12)]
    for round_ in range(3):
        for key in keys:
            task = sharded.put({"key": key, "n": round_}, utube=key)
            assert task._state.db == shards.pick(BOTH, key)  # the same shard every time
    for key in keys:
        shard = on(shards.pick(BOTH, key)).filter(utube=key)
        assert [task.data["n"] for task in shard.order_by("id")] == [0, 1, 2]
    # Twelve keys land on both shards (crc32 spreads them), each key on one only.
    assert {shards.pick(BOTH, key) for key in keys} == set(BOTH)
    assert on("default").count() + on("other").count() == 36


def test_puts_without_a_key_are_spread_evenly(sharded):
    tasks = [sharded.put({"n": n}) for n in range(10)]
    assert Counter(task._state.db for task in tasks) == {"default": 5, "other": 5}
    put = sharded.put_many([{"n": n} for n in range(10)])
    assert len(put) == 10
    assert on("default").count() == on("other").count() == 10


def test_statistics_add_up_the_shards_and_pause_acts_on_all(sharded):
    sharded.put_many([{"n": n} for n in range(6)])
    sharded.shard("other").take(consumer="me")
    stats = sharded.statistics()
    assert stats["tasks"]["total"] == 6 and stats["tasks"]["taken"] == 1
    assert stats["shards"]["default"]["tasks"]["ready"] == 3
    assert stats["shards"]["other"]["tasks"]["ready"] == 2
    assert stats["calls"]["put"] == 6
    sharded.pause()
    assert sharded.paused and all(sharded.shard(alias).paused for alias in BOTH)
    assert sharded.shard("default").take(consumer="me") is None
    sharded.resume()
    assert not sharded.paused and sharded.shard("default").take(consumer="me") is not None


def test_a_worker_drains_every_shard_and_settles_each_task_on_its_own(sharded, caplog):
    sharded.put_many([{"n": n} for n in range(20)])
    ran: list[tuple[str, int]] = []
    handler = Handler(
        "tube", "s-tube", lambda task: ran.append((task._state.db, task.data["n"])), "s-tube", create=UTUBE
    )
    assert sorted(h.database for h in shard_handlers([handler])) == BOTH
    with caplog.at_level(logging.INFO, logger="django_taskloop.workers"):
        assert Worker([handler], burst=True, schedule=False).run() == 0
    # One summary line for the tube, counting each task once (not once per shard).
    summaries = [r.getMessage() for r in caplog.records if r.getMessage().startswith("summary")]
    assert len(summaries) == 1 and summaries[0].startswith("summary s-tube: 20 done"), summaries
    assert sorted(n for _, n in ran) == list(range(20))
    assert Counter(alias for alias, _ in ran) == {"default": 10, "other": 10}
    for alias in BOTH:
        assert not on(alias).exists()  # acknowledged (deleted) where it was
        assert sharded.shard(alias).statistics()["tasks"]["done"] == 10


def test_a_tube_handlers_put_goes_through_the_shards(settings):
    settings.TASKLOOP = {"SHARDS": {"s-tube": BOTH}}
    handler = Handler("tube", "s-tube", print, "s-tube", create={"type": "fifottl"})
    tasks = [handler.put({"n": n}) for n in range(4)]
    assert Counter(task._state.db for task in tasks) == {"default": 2, "other": 2}
    assert len(handler.put_many([{"n": n} for n in range(4)])) == 4


def test_a_shard_that_is_down_takes_no_puts_and_stops_no_other(sharded, caplog):
    sharded.put_many([{"n": n} for n in range(4)])  # two on each shard
    key_on_other = next(f"k{n}" for n in range(100) if shards.pick(BOTH, f"k{n}") == "other")
    ran: list[int] = []
    handler = Handler("tube", "s-tube", lambda task: ran.append(task.data["n"]), "s-tube", create=UTUBE)
    with unreachable("other"):
        # Unpinned puts go to the shard that is up; a put its key pins to the down one fails.
        assert {sharded.put({"n": n})._state.db for n in range(4, 8)} == {"default"}
        with pytest.raises(DatabaseError):
            sharded.put({"n": 99}, utube=key_on_other)
        with caplog.at_level(logging.WARNING, logger="django_taskloop.workers"):
            assert Worker([handler], burst=True, schedule=False).run() == 0
    assert sorted(ran) == [0, 2, 4, 5, 6, 7]  # default's; other's two wait for it
    assert "is unreachable" in caplog.text and "the others go on" in caplog.text
    assert on("other").count() == 2
    assert Worker([handler], burst=True, schedule=False).run() == 0  # back: its tasks run
    assert sorted(ran) == [0, 1, 2, 3, 4, 5, 6, 7]
    assert not on("default").exists() and not on("other").exists()


def test_one_database_stays_one_tube(settings):
    settings.TASKLOOP = {}
    plain = shards.tube("s-plain")
    assert plain.databases == ["default"] and not shards.is_sharded("s-plain")
    handler = Handler("tube", "s-plain", print, "s-plain", create=UTUBE)
    assert shard_handlers([handler]) == [handler]
    assert isinstance(handler.get_tube(), Tube)


@pytest.mark.parametrize(
    "value, message",
    [
        ({"s": ["default", "nowhere"]}, "'nowhere', which is not in DATABASES"),
        ({"s": []}, "non-empty list"),
        ({"s": ["default", "default"]}, "names a database twice"),
        (["default"], "must be a dict"),
    ],
)
def test_bad_shards_are_a_system_check_error(settings, value, message):
    settings.TASKLOOP = {"SHARDS": value}
    errors = [error for error in run_checks() if error.id == "taskloop.E020"]
    assert len(errors) == 1 and message in errors[0].msg, errors


# Django Tasks: a backend's queues over its OPTIONS["DATABASES"] --------------------------------

SHARDED_TASKS = {
    "default": {
        "BACKEND": "django_taskloop.backends.TaskloopBackend",
        "QUEUES": ["default", "slow"],
        "OPTIONS": {"DATABASES": BOTH},
    }
}


@pytest.fixture
def sharded_tasks() -> Iterator[Any]:
    from django.test.utils import override_settings

    from django_taskloop.compat import TASKS_AVAILABLE

    if not TASKS_AVAILABLE:
        pytest.skip("no Django Tasks framework installed")
    with override_settings(TASKS=SHARDED_TASKS):
        yield


def run_tasks() -> None:
    from django_taskloop.backends import task_handlers

    assert Worker(task_handlers(), burst=True, schedule=False).run() == 0


def test_django_tasks_spread_over_the_backends_databases_and_ids_name_the_shard(sharded_tasks):
    from django_taskloop.compat import TaskResultStatus
    from tests import testing_tasks as t

    results = [t.record.enqueue(f"r{n}") for n in range(6)]
    assert Counter(result.id.rpartition("@")[2] for result in results) == {"0": 3, "1": 3}
    for result in results:  # each read back from its own shard before and after the run
        assert (
            result.id.endswith("@0")
            == Task.objects.using("default").filter(data__id=result.id.split("-")[1]).exists()
        )
        assert t.record.get_result(result.id).status == TaskResultStatus.READY
    run_tasks()
    for n, result in enumerate(results):
        done = t.record.get_result(result.id)
        assert done.status == TaskResultStatus.SUCCESSFUL and done.return_value == f"R{n}"
    assert sorted(t.logged()) == sorted(f"r{n}" for n in range(6))


def test_django_tasks_keys_and_unique_calls_keep_to_one_shard(sharded_tasks):
    from django.db import transaction

    from django_taskloop.compat import TaskResultStatus
    from tests import testing_tasks as t

    first = t.refresh.enqueue("sales")
    assert t.refresh.enqueue("sales").id == first.id  # its waiting twin, on the same shard
    steps = [t.account_step.enqueue(7, 1)]
    with transaction.atomic():  # the caller's transaction (default): enqueued at its commit
        later = t.notify.enqueue(5)
        assert (
            not Task.objects.using(later.id.rpartition("@")[2] == "0" and "default" or "other")
            .filter(data__result=later.id)
            .exists()
        )
    run_tasks()
    for task, result in [(t.refresh, first), (t.account_step, steps[0]), (t.notify, later)]:
        assert task.get_result(result.id).status == TaskResultStatus.SUCCESSFUL, result.id
    # The second step (enqueued by the first, same key) ran after it, on the key's shard.
    ends = t.logged("end")
    assert ends.count("7:2") == 1 and ends.index("7:1") < ends.index("7:2")
    assert "notify:5" in ends


def test_a_bad_databases_option_is_a_system_check_error():
    from django.test.utils import override_settings

    from django_taskloop.compat import TASKS_AVAILABLE

    if not TASKS_AVAILABLE:
        pytest.skip("no Django Tasks framework installed")
    bad = {"default": {**SHARDED_TASKS["default"], "OPTIONS": {"DATABASES": ["default", "nowhere"]}}}
    with override_settings(TASKS=bad):
        errors = [error for error in run_checks() if error.id == "taskloop.E004"]
    assert len(errors) == 1 and "'nowhere', which is not in DATABASES" in errors[0].msg, errors


def test_the_read_model_the_metrics_and_the_reaper_cover_every_shard(sharded):
    from django_taskloop.metrics import render_metrics
    from django_taskloop.reaper import reap
    from django_taskloop.stats import queue_summaries

    sharded.put_many([{"n": n} for n in range(5)])  # 3 on one shard, 2 on the other
    mine = {s.using: s.counts["ready"] for s in queue_summaries(["task"]) if s.name == "s-tube"}
    assert mine == {"default": 3, "other": 2}
    metrics = render_metrics()
    assert 'taskloop_items{queue="s-tube",kind="task",state="ready"} 3' in metrics
    assert 'taskloop_items{queue="s-tube@other",kind="task",state="ready"} 2' in metrics
    assert {"s-tube", "s-tube@other"} <= set(reap()["tubes"])
    out = io.StringIO()
    call_command("taskloop", "status", stdout=out)
    rows = [line.split()[:2] for line in out.getvalue().splitlines() if line.startswith("s-tube")]
    assert sorted(rows) == [["s-tube", "3"], ["s-tube@other", "2"]], out.getvalue()


def test_a_board_over_shards_posts_in_turn_and_its_workers_consume_each_job_where_it_is(settings):
    from django_taskloop.models import Job

    settings.TASKLOOP = {"SHARDS": {"s-board": BOTH}}
    jobs = shards.board("s-board")
    posted = [jobs.post(f"job-{n}", {"n": n}) for n in range(6)]
    assert Counter(job._state.db for job in posted) == {"default": 3, "other": 3}
    assert jobs.job_count == 6 and len(list(jobs.iterjobs(only_unclaimed=True))) == 6
    ran: list[tuple[str, int]] = []
    handler = Handler(
        "board", "s-board", lambda job: ran.append((job._state.db, job.details["n"])), "s-board"
    )
    assert Worker([handler], burst=True, schedule=False).run() == 0
    assert sorted(n for _, n in ran) == list(range(6))
    assert Counter(alias for alias, _ in ran) == {"default": 3, "other": 3}
    assert jobs.job_count == 0
    assert not Job.objects.using("default").exists() and not Job.objects.using("other").exists()


def test_tubes_of_a_shard_that_was_down_at_start_are_prepared_before_a_poll_reads_them(settings):
    """Two tubes on a shard that is down when the worker starts: both wait unprepared. When it
    is back, the idle poll (one read for every tube of the database) must prepare them all
    first, not read a tube it has not opened (it raised RuntimeError)."""
    settings.TASKLOOP = {"SHARDS": {"s-tube": BOTH, "s-tube2": BOTH}}
    handlers = [Handler("tube", name, print, name, create=UTUBE) for name in ("s-tube", "s-tube2")]
    worker = Worker(handlers, burst=False, schedule=False)
    with unreachable("other"):
        worker._prepare()
    assert len(worker.parked.unprepared) == 2
    since, _ = worker.parked.until["other"]
    worker.parked.until["other"] = (since, 0.0)  # due for a look now
    tubes = [driver for driver in worker.drivers if driver.using == "other"]
    assert worker._not_worth_trying(tubes) == set(tubes)  # both empty, both opened
    assert not worker.parked.unprepared and "other" not in worker.parked.until


# -- the operator's verbs act on the whole queue --------------------------------------------------


def test_the_terminal_pauses_resumes_and_retries_a_sharded_tube_on_every_shard(sharded):
    sharded.put_many([{"n": n} for n in range(4)])  # 2 on each shard
    for alias in BOTH:  # one buried task on each shard
        tube = sharded.shard(alias)
        tube.bury(tube.take(consumer="me").id)
    out = io.StringIO()
    call_command("taskloop", "pause", "s-tube", stdout=out)
    assert all(sharded.shard(alias).paused for alias in BOTH), out.getvalue()
    call_command("taskloop", "resume", "s-tube", stdout=out)
    assert not any(sharded.shard(alias).paused for alias in BOTH), out.getvalue()
    # One shard by the name status shows for it: only that one.
    call_command("taskloop", "pause", "s-tube@other", stdout=out)
    assert sharded.shard("other").paused and not sharded.shard("default").paused
    call_command("taskloop", "resume", "s-tube@other", stdout=out)
    call_command("taskloop", "retry", "s-tube", "--all", stdout=out)
    assert [on(alias).filter(state="r").count() for alias in BOTH] == [2, 2], out.getvalue()


def test_a_sharded_tube_missing_from_the_routers_database_is_found_on_its_shards(settings):
    settings.TASKLOOP = {"SHARDS": {"s-far": ["other"]}}
    shards.tube("s-far").put({"n": 1})
    assert not Tube.objects.using("default").filter(name="s-far").exists()
    out = io.StringIO()
    call_command("taskloop", "pause", "s-far", stdout=out)
    assert Tube.objects.using("other").get(name="s-far").paused, out.getvalue()


def test_the_admin_pauses_and_resumes_a_sharded_queue_on_every_shard(sharded, admin_client, settings):
    from django.urls import reverse

    from django_taskloop.models import JobBoard

    settings.TASKLOOP = {"SHARDS": {"s-tube": BOTH, "s-board": BOTH}}
    sharded.put_many([{"n": n} for n in range(2)])
    jobs = shards.board("s-board")
    jobs.post("a", {}), jobs.post("b", {})
    dashboard_pause = reverse("admin:django_taskloop_pause")
    admin_client.post(dashboard_pause, {"kind": "task", "queue": "s-tube", "do": "pause"})
    assert all(sharded.shard(alias).paused for alias in BOTH)
    admin_client.post(dashboard_pause, {"kind": "task", "queue": "s-tube", "do": "resume"})
    assert not any(sharded.shard(alias).paused for alias in BOTH)
    # The changelist's actions on the router's row of each.
    tube = Tube.objects.get(name="s-tube")
    board = JobBoard.objects.get(name="s-board")
    tubes = reverse("admin:django_taskloop_tube_changelist")
    boards = reverse("admin:django_taskloop_jobboard_changelist")
    admin_client.post(tubes, {"action": "pause_tubes", "_selected_action": [tube.pk]})
    admin_client.post(boards, {"action": "pause_boards", "_selected_action": [board.pk]})
    assert all(sharded.shard(alias).paused for alias in BOTH)
    assert all(jobs.shard(alias).paused for alias in BOTH)
    admin_client.post(tubes, {"action": "resume_tubes", "_selected_action": [tube.pk]})
    admin_client.post(boards, {"action": "resume_boards", "_selected_action": [board.pk]})
    assert not any(sharded.shard(alias).paused for alias in BOTH)
    assert not any(jobs.shard(alias).paused for alias in BOTH)


def test_the_admins_kick_every_buried_task_kicks_on_every_shard(sharded, admin_client, settings):
    """As pause and resume do: the changelist's row of a sharded tube is the whole queue."""
    from django.urls import reverse

    settings.TASKLOOP = {"SHARDS": {"s-tube": BOTH}}
    for alias in BOTH:
        shard = sharded.shard(alias)
        shard.put({"on": alias})
        shard.bury(shard.take(consumer="me").pk)
    buried = [Task.objects.using(alias).buried().count() for alias in BOTH]
    assert buried == [1, 1]
    tube = Tube.objects.get(name="s-tube")
    tubes = reverse("admin:django_taskloop_tube_changelist")
    page = admin_client.post(tubes, {"action": "kick_all", "_selected_action": [tube.pk]}, follow=True)
    assert "Kicked 2 task(s)." in page.content.decode()
    assert [Task.objects.using(alias).buried().count() for alias in BOTH] == [0, 0]


def test_a_parked_shards_throughput_waits_for_it_without_a_warning_a_second(settings, caplog):
    """A shard that is down is parked: the heartbeat's throughput flush leaves its counts for
    when it is back instead of warning every second that it could not write them."""
    from django_taskloop.models import Throughput

    settings.TASKLOOP = {"SHARDS": {"s-tube": BOTH}}
    worker = Worker([Handler("tube", "s-tube", print, "s-tube", create=UTUBE)], burst=False, schedule=False)
    worker._prepare()
    far = next(driver for driver in worker.drivers if driver.using == "other")
    with unreachable("other"):
        assert worker.parked.park_queue(far)
        worker.heart.throughput.add(far, 3, 1, 0)
        with caplog.at_level(logging.DEBUG, logger="django_taskloop"):
            worker.heart.flush_throughput()
            worker.heart.flush_throughput()
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(said) == 1 and "unreachable" in said[0], said  # the parking's one line
    assert not Throughput.objects.using("other").exists()
    worker.parked.until.clear()  # back
    worker.heart.flush_throughput()
    written = Throughput.objects.using("other").get(queue="s-tube")
    assert (written.done, written.failed) == (3, 1)


def test_the_dashboard_and_status_count_each_shards_own_failures_and_name_each_shard(
    sharded, admin_client, sharded_tasks
):
    """Failures and throughput are written on the shard's own database: each shard's row
    counts its own (they had repeated the router's on every shard), its title names the
    shard (a Django Tasks queue's too), and only the router's rows link to the admin's tube
    pages (which read that database: a shard's tube id named another tube there)."""
    from django.urls import reverse

    from django_taskloop.models import Failure
    from django_taskloop.stats import DJANGO_TASK, merge_django_tasks, queue_summaries
    from tests import testing_tasks as t

    keys = {
        alias: [k for k in (f"k{n}" for n in range(40)) if shards.pick(BOTH, k) == alias] for alias in BOTH
    }
    for key in keys["default"][:3] + keys["other"][:1]:
        sharded.put({"key": key}, utube=key)

    def fail(task: Any) -> None:
        raise RuntimeError("no")

    handler = Handler("tube", "s-tube", fail, "s-tube", create=UTUBE)
    Worker([handler], burst=True, schedule=False).run()
    t.record.enqueue("r0"), t.record.enqueue("r1")  # one per shard
    mine = {s.using: s for s in queue_summaries(["task"]) if s.name == "s-tube"}
    # Each shard's own rows (3 tasks failed on one, 1 on the other; a burst may retry some).
    own = {alias: Failure.objects.using(alias).filter(queue="s-tube").count() for alias in BOTH}
    assert own["default"] >= 3 and own["other"] >= 1 and own["default"] != own["other"], own
    assert {alias: s.failures_last_hour for alias, s in mine.items()} == own
    titles = {s.title for s in merge_django_tasks(queue_summaries(["task"])) if s.kind == DJANGO_TASK}
    assert titles == {"default", "default@other"}, titles
    page = admin_client.get(reverse("admin:django_taskloop_dashboard")).content.decode()
    router_tube = Tube.objects.using("default").get(name="s-tube")
    assert f'tube__id__exact={router_tube.pk}">s-tube</a>' in page
    assert '<th scope="row">s-tube@other<small' in page  # named, not linked
    assert '<th scope="row">default@other<small' in page
    out = io.StringIO()
    call_command("taskloop", "status", stdout=out)
    rows = {
        line.split()[0]: line.split() for line in out.getvalue().splitlines() if line.startswith("s-tube")
    }
    assert set(rows) == {"s-tube", "s-tube@other"}, out.getvalue()


# -- a tube is made with its registration's options (issue 39, item 4) ----------------------------


@pytest.fixture
def registry_kept() -> Iterator[None]:
    """Handlers a test registers leave the worker registry afterwards."""
    from django_taskloop.workers import registry

    before = dict(registry)
    yield
    registry.clear()
    registry.update(before)


@pytest.mark.parametrize("first", ["statistics", "put"])
@pytest.mark.parametrize("databases", [BOTH, ["default"]], ids=["sharded", "one database"])
def test_a_tube_is_made_with_its_registrations_options_whoever_makes_it(
    settings, registry_kept, caplog, first, databases
):
    """``@tube("rf", type="utube")``, then ``shards.tube("rf").statistics()`` (or a first keyed
    put) before any worker made it: it was made ``fifottl`` on every shard, and its keyed tasks
    were then handed out six at a time, with a false warning about the type."""
    from django_taskloop.workers import tube
    from django_taskloop.workers.drivers import make_driver

    settings.TASKLOOP = {"SHARDS": {"s-rf": databases}} if len(databases) > 1 else {}
    handler = tube("s-rf", type="utube", ttr=30, batch=6)(lambda task: None)
    rf = shards.tube("s-rf")
    if first == "statistics":
        rf.statistics()
    else:
        rf.put({"n": 0}, utube="k")
    made = [found for alias in databases for found in Tube.objects.using(alias).filter(name="s-rf")]
    assert made and {(found.type, found.ttr) for found in made} == {("utube", 30)}
    if first == "statistics":
        assert len(made) == len(databases)  # on every shard
    # Six tasks of one key: one at a time.
    home = shards.pick(databases, "k")
    rf.put_many([{"n": n} for n in range(1, 6 if first == "put" else 7)], utube="k")
    assert len(rf.shard(home).take_many(6, consumer="me")) == 1
    # The worker finds the tube as its handler asks: no warning.
    with caplog.at_level(logging.WARNING, logger="django_taskloop"):
        for alias in databases:
            make_driver(replace(handler, database=alias, _tubes={}), "w").prepare()
    assert "exists with" not in caplog.text, caplog.text


def test_options_given_against_a_tubes_registration_are_refused_and_nothing_is_made(settings, registry_kept):
    from django_taskloop.workers import tube

    settings.TASKLOOP = {"SHARDS": {"s-rf": BOTH}}
    tube("s-rf", type="utube")(lambda task: None)
    with pytest.raises(ValueError, match=r"tube 's-rf' is registered with type='utube'.*type='fifo'"):
        shards.tube("s-rf", type="fifo")
    assert not any(Tube.objects.using(alias).filter(name="s-rf").exists() for alias in BOTH)
    # What the registration says, given again, is no contradiction; an unregistered tube takes
    # what it is given, else the default.
    assert shards.tube("s-rf", type="utube").statistics()["tasks"]["total"] == 0
    assert Tube.objects.using("other").get(name="s-rf").type == "utube"
    shards.tube("s-free", type="fifo").statistics()
    shards.tube("s-plain2").statistics()
    assert Tube.objects.get(name="s-free").type == "fifo"
    assert Tube.objects.get(name="s-plain2").type == "fifottl"


def test_a_registration_in_a_taskloop_module_not_yet_imported_gives_the_options(
    settings, registry_kept, monkeypatch
):
    """A web process may never have imported the app's ``taskloop`` module: its ``@tube``
    options are found there all the same (``@tube("w-slow", batch=3, ttr=2)`` in the test app)."""
    from django_taskloop import workers

    settings.TASKLOOP = {}
    monkeypatch.delitem(sys.modules, "tests.testapp.taskloop", raising=False)
    monkeypatch.setattr(workers, "_discovered", False)
    workers.registry.clear()  # (restored by registry_kept)
    shards.tube("w-slow").statistics()
    assert Tube.objects.get(name="w-slow").ttr == 2
    assert workers.registry["w-slow"].create == {"type": "fifottl", "ttr": 2}
