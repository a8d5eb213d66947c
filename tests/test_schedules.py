"""Schedules (SPEC §7): ``@periodic`` functions and ``TASKLOOP["SCHEDULE"]``'s Django Tasks run
once per cron tick across every worker process and host; missed ticks run once; pause, resume
and "run now"; bad input is a clear error that writes nothing.

Ticks are made due by moving ``next_run_at`` into the past (cron has minute resolution and the
suite must not wait minutes); the worker subprocesses register the ``@periodic`` functions of
``tests/testapp/periodic.py`` and read the schedules twice a second.
"""

from __future__ import annotations

import datetime as dt
import json
import signal
import time
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_taskloop import schedules
from django_taskloop.backends import task_path_of
from django_taskloop.checks import check_schedules
from django_taskloop.engine import DbNow, db_now
from django_taskloop.models import Failure, Schedule, Task, TaskRecord
from django_taskloop.schedules import (
    PERIODIC_TUBE,
    ScheduleError,
    ScheduleSpec,
    Ticker,
    configured,
    parse_cron,
    periodic,
    periodic_registry,
    sync,
)
from tests.testapp.models import WorkLog

from .conftest import race
from .workers_util import run_workers, start_workers, stop, wait_until

ADD = "tests.workers_util.add"


def task_spec(name: str = "adder", cron: str = "0 0 1 1 *", args: Any = (1, 2)) -> ScheduleSpec:
    """A ``TASKLOOP["SCHEDULE"]`` entry as :func:`configured` reads it."""
    return ScheduleSpec(name, "task", parse_cron(cron), ADD, func=schedules._load_task(ADD), args=list(args))


def make_due(name: str, seconds_ago: float = 3600) -> None:
    assert Schedule.objects.filter(name=name).update(next_run_at=DbNow(-seconds_ago)) == 1


def row(name: str) -> Schedule:
    return Schedule.objects.get(name=name)


@pytest.fixture
def registry_kept():
    """Whatever a test registers with @periodic is forgotten after it."""
    saved = dict(periodic_registry)
    yield
    periodic_registry.clear()
    periodic_registry.update(saved)


# Bad input: a clear error, nothing written. -----------------------------------------------------


def test_periodic_refuses_a_bad_cron_expression_or_name_at_registration(registry_kept):
    before = dict(periodic_registry)
    for bad in ("61 * * * *", "* * * *", "every minute", "* * * * * * *", "*/0 * * * *", "61 * * * * *"):
        with pytest.raises(ScheduleError, match="bad cron expression"):
            periodic(bad)
    with pytest.raises(ScheduleError, match="cron must be a str"):
        periodic(5)  # type: ignore[arg-type]
    with pytest.raises(ScheduleError, match="name"):
        periodic("* * * * *", name="has space")
    assert periodic_registry == before

    def job() -> None: ...

    periodic("*/5 * * * *", name="p-job")(job)
    assert periodic_registry["p-job"].cron.expression == "*/5 * * * *"
    # Six fields: the first is seconds (cronsim 2.8).
    every_10s = parse_cron("*/10  * * * * *")
    assert every_10s.expression == "*/10 * * * * *"
    at = dt.datetime(2026, 3, 1, 12, 5, 33, 400_000, tzinfo=dt.UTC)
    assert every_10s.next_after(at) == at.replace(second=40, microsecond=0)
    assert parse_cron("* * * * *").next_after(at) == at.replace(minute=6, second=0, microsecond=0)
    assert parse_cron("* * * * *").next_after(at.replace(second=0, microsecond=0)) == at.replace(
        minute=6, second=0, microsecond=0
    )

    def other() -> None: ...

    with pytest.raises(ScheduleError, match="already registered"):
        periodic("* * * * *", name="p-job")(other)


BAD_SETTINGS = [
    ({"SCHEDULE": {"x": {"task": "tests.workers_util.nope", "cron": "* * * * *"}}}, "cannot be imported"),
    (
        {"SCHEDULE": {"x": {"task": "tests.workers_util.not_a_task", "cron": "* * * * *"}}},
        "not a Django Task",
    ),
    ({"SCHEDULE": {"x": {"task": ADD, "cron": "* * * * *", "args": [1]}}}, "refuses these arguments"),
    ({"SCHEDULE": {"x": {"task": ADD, "cron": "* * * * *", "args": [1, 2], "kwargs": {"c": 3}}}}, "refuses"),
    ({"SCHEDULE": {"x": {"task": ADD, "cron": "* * * * *", "args": "1, 2"}}}, "must be a list"),
    ({"SCHEDULE": {"x": {"task": ADD, "cron": "* * * * *", "args": [1, {2}]}}}, "JSON"),
    ({"SCHEDULE": {"x": {"task": ADD, "cron": "0 25 * * *", "args": [1, 2]}}}, "bad cron expression"),
    ({"SCHEDULE": {"x": {"task": ADD}}}, "needs 'task' and 'cron'"),
    ({"SCHEDULE": {"x": {"task": ADD, "cron": "* * * * *", "arg": [1, 2]}}}, "unknown key"),
    ({"SCHEDULE": {"has space": {"task": ADD, "cron": "* * * * *", "args": [1, 2]}}}, "name"),
    ({"TIME_ZONE": "Mars/Olympus_Mons"}, "not a known time zone"),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("taskloop", "message"), BAD_SETTINGS)
def test_a_bad_schedule_setting_is_a_clear_error_that_writes_nothing(settings, taskloop, message):
    settings.TASKLOOP = taskloop
    with pytest.raises(ScheduleError, match=message):
        configured()
    [error] = check_schedules()
    assert error.id == "taskloop.E010" and message.split()[0] in error.msg
    # Workers refuse to start, before any process or row exists.
    with pytest.raises(CommandError, match=message):
        call_command("workers", burst=True)
    assert not Schedule.objects.exists()
    assert enqueued() == []


def test_good_schedules_pass_the_check(settings):
    settings.TASKLOOP = {"SCHEDULE": {"adder": {"task": ADD, "cron": "*/5 * * * *", "args": [1, 2]}}}
    assert check_schedules() == []
    [spec] = configured()
    assert (spec.kind, spec.target, spec.args) == ("task", ADD, [1, 2])


# Rows, claims, pause / resume / run now (one process). ------------------------------------------


@pytest.mark.django_db
def test_workers_write_a_row_per_schedule_and_a_changed_cron_gets_its_next_run_again(settings):
    settings.TASKLOOP = {"SCHEDULE": {"nightly": {"task": ADD, "cron": "0 3 * * *", "args": [1, 2]}}}
    sync(configured())
    now = db_now()
    first = row("nightly")
    assert (first.kind, first.target, first.time_zone, first.runs, first.paused) == (
        "task",
        ADD,
        "UTC",
        0,
        False,
    )
    assert (first.next_run_at.hour, first.next_run_at.minute) == (3, 0)
    assert now < first.next_run_at <= now + dt.timedelta(days=1)
    Schedule.objects.pause("nightly")

    # The same schedule again: untouched.
    sync(configured())
    assert row("nightly").next_run_at == first.next_run_at

    settings.TASKLOOP = {"SCHEDULE": {"nightly": {"task": ADD, "cron": "*/5 * * * *", "args": [1, 2]}}}
    sync(configured())
    changed = row("nightly")
    assert changed.cron == "*/5 * * * *" and changed.paused  # the pause outlives the change
    assert changed.next_run_at.minute % 5 == 0
    assert now < changed.next_run_at <= db_now() + dt.timedelta(minutes=5)

    # Cron is read in TASKLOOP["TIME_ZONE"]: 03:00 in Tokyo (UTC+9, no DST) is 18:00 UTC.
    settings.TASKLOOP = {
        "TIME_ZONE": "Asia/Tokyo",
        "SCHEDULE": {"nightly": {"task": ADD, "cron": "0 3 * * *", "args": [1, 2]}},
    }
    sync(configured())
    tokyo = row("nightly")
    assert tokyo.time_zone == "Asia/Tokyo"
    assert (tokyo.next_run_at.astimezone(dt.UTC).hour, tokyo.next_run_at.minute) == (18, 0)


@pytest.mark.django_db
def test_a_due_tick_runs_once_and_missed_ticks_collapse_into_one():
    spec = task_spec("every-minute", "* * * * *")
    ticker = Ticker([spec])
    ticker.prepare()
    make_due("every-minute", seconds_ago=3 * 3600)  # 180 ticks missed while no worker ran

    ticker.tick()
    ticker.read_at = None  # read again at once
    ticker.tick()
    assert ticker.claim(spec) is False

    assert enqueued() == [(ADD, [1, 2])]
    after = row("every-minute")
    now = db_now()
    assert after.runs == 1
    assert now < after.next_run_at <= now + dt.timedelta(minutes=1)
    assert after.next_run_at.second == 0
    assert abs((now - after.last_run_at).total_seconds()) < 60


def enqueued() -> list[tuple[str, list]]:
    """The Django Tasks enqueued so far (path, args): their calls wait in the queues' tubes."""
    queued = Task.objects.filter(tube__name__startswith="tasks").order_by("pk")
    return [(task_path_of(t), t.data["args"]) for t in queued]


@pytest.mark.django_db
def test_paused_schedules_do_not_run_resume_skips_what_was_missed_and_run_now_runs_once():
    spec = task_spec()
    ticker = Ticker([spec])
    ticker.prepare()
    Schedule.objects.pause("adder")
    Schedule.objects.pause("adder")  # twice: a no-op
    make_due("adder")
    ticker.refresh()
    ticker.tick()
    assert ticker.claim(spec) is False
    assert enqueued() == []
    with pytest.raises(ValueError, match="paused"):
        Schedule.objects.run_now("adder")

    Schedule.objects.resume("adder")
    assert row("adder").next_run_at > db_now()  # the tick missed while paused does not run
    assert ticker.claim(spec) is False

    Schedule.objects.run_now("adder")
    ticker.refresh()
    ticker.tick()
    ticker.refresh()
    ticker.tick()
    assert len(enqueued()) == 1
    assert row("adder").runs == 1 and row("adder").next_run_at > db_now()

    with pytest.raises(LookupError):
        Schedule.objects.run_now("nope")
    with pytest.raises(LookupError):
        Schedule.objects.pause("nope")


class RefusingTask:
    """A task whose enqueue writes, then fails: the claim must roll back with it."""

    def __init__(self) -> None:
        self.real = schedules._load_task(ADD)

    def enqueue(self, *args: Any, **kwargs: Any) -> None:
        self.real.enqueue(*args, **kwargs)
        raise RuntimeError("queue is full")


@pytest.mark.django_db
def test_a_tick_whose_enqueue_fails_is_not_claimed_and_says_why():
    spec = task_spec()
    spec.func = RefusingTask()
    ticker = Ticker([spec])
    ticker.prepare()
    make_due("adder", seconds_ago=60)
    due_at = row("adder").next_run_at

    ticker.tick()

    assert enqueued() == []  # the enqueue rolled back with the claim
    after = row("adder")
    assert (after.runs, after.next_run_at, after.last_run_at) == (0, due_at, None)
    assert "queue is full" in after.last_error
    # This worker leaves it alone for a while rather than failing every second.
    with CaptureQueriesContext(connection) as queries:
        ticker.tick()
    assert not [q for q in queries.captured_queries if "UPDATE" in q["sql"]]


@pytest.mark.django_db
def test_an_idle_ticker_reads_the_schedules_once_per_refresh():
    ticker = Ticker([task_spec()])
    ticker.prepare()
    with CaptureQueriesContext(connection) as queries:
        wait = ticker.tick()
        for _ in range(20):
            ticker.tick()
    assert len(queries.captured_queries) == 1
    assert 0 < wait <= schedules.REFRESH


def _claim_once(_round: int) -> bool:
    return Ticker([task_spec("raced")]).claim(task_spec("raced"))


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_racing_processes_claim_each_tick_exactly_once():
    Ticker([task_spec("raced")]).prepare()
    for round_ in range(3):
        make_due("raced", seconds_ago=60)
        claimed = race(_claim_once, [(round_,)] * 6)
        assert sorted(claimed) == [False] * 5 + [True], f"round {round_}: {claimed}"
    assert len(enqueued()) == 3
    assert row("raced").runs == 3


# Real worker processes. -------------------------------------------------------------------------

PERIODIC_ENV = {
    "TASKLOOP_TEST_PERIODIC": "1",
    "DJANGO_SETTINGS_MODULE": "tests.workers_settings",
}


def overrides(**extra: Any) -> str:
    return json.dumps({"HEARTBEAT_INTERVAL": 0.5, "GRACE_PERIOD": 5, **extra})


def periodic_row(name: str, func: str, seconds_ago: float | None = None) -> None:
    """Write the row a worker's sync would write for ``tests/testapp/periodic.py``'s ``name``."""
    spec = parse_cron("0 0 1 1 *")
    next_run = DbNow(-seconds_ago) if seconds_ago is not None else spec.next_after(db_now())
    Schedule.objects.create(
        name=name,
        kind="periodic",
        cron=spec.expression,
        target=f"tests.testapp.periodic.{func}",
        next_run_at=next_run,
    )


def logged(kind: str, phase: str = "end") -> int:
    return WorkLog.objects.filter(kind=kind, phase=phase).count()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_missed_ticks_run_once_and_no_schedule_runs_none():
    periodic_row("t-yearly", "yearly", seconds_ago=2 * 86400)  # every tick of two days missed
    periodic_row("t-broken", "broken", seconds_ago=60)

    idle = run_workers("--burst", "--no-schedule", **PERIODIC_ENV)
    assert idle.returncode == 0, idle.stderr
    assert logged("periodic") == 0 and row("t-yearly").runs == 0

    done = run_workers("--burst", **PERIODIC_ENV)
    assert done.returncode == 0, done.stderr
    assert logged("periodic") == 1
    yearly = row("t-yearly")
    # Its next tick is the next 1 January (not now again; "30 days on" failed from 2 December).
    assert yearly.runs == 1 and yearly.next_run_at > db_now() + dt.timedelta(hours=1)
    assert (yearly.next_run_at.month, yearly.next_run_at.day) == (1, 1)
    # A run that raises is kept as a failure and not retried: the next tick is the retry.
    assert logged("periodic-broken") == 1
    assert "t-broken fails on purpose" in row("t-broken").last_error
    failure = Failure.objects.get(queue=PERIODIC_TUBE)
    assert failure.error == "builtins.RuntimeError"
    # The other schedules' rows were written by the workers' sync.
    assert Schedule.objects.filter(name="t-slow", kind="periodic").exists()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_every_tick_runs_once_across_processes_and_hosts():
    # Due before anyone starts: the six processes of two "hosts" race for it as they start.
    periodic_row("t-yearly", "yearly", seconds_ago=60)
    taskloop = overrides(SCHEDULE={"t-add": {"task": ADD, "cron": "0 0 1 1 *", "args": [2, 3]}})
    started = time.monotonic()
    hosts = [
        start_workers("--processes", "3", TASKLOOP_OVERRIDES=taskloop, **PERIODIC_ENV) for _host in range(2)
    ]
    outputs = []
    try:
        wait_until(lambda: logged("periodic") == 1, timeout=60)
        wait_until(lambda: Schedule.objects.filter(name="t-add").exists(), timeout=30)
        for round_ in range(2, 5):
            make_due("t-yearly", seconds_ago=1)
            make_due("t-add", seconds_ago=1)
            wait_until(lambda n=round_: logged("periodic") >= n, timeout=30)
            wait_until(
                lambda n=round_ - 1: TaskRecord.objects.filter(status="SUCCESSFUL").count() >= n, timeout=30
            )
        # The two-second schedule ticks at least twice while the hosts run (a fast server can
        # finish the rounds above within one of its ticks).
        wait_until(lambda: Schedule.objects.filter(name="t-every-2s", runs__gte=2).exists(), timeout=30)
        time.sleep(1.5)  # three more reads by every process: any second run would show now
    finally:
        outputs = [stop(host) for host in hosts]
    elapsed = time.monotonic() - started
    assert all(host.returncode == 0 for host in hosts), outputs
    said = "\n".join(
        line for out in outputs for line in out.splitlines() if "periodic" in line or "yearly" in line
    )
    runs = list(WorkLog.objects.filter(kind="periodic").values_list("phase", "pid"))
    assert logged("periodic") == 4, f"{runs}\n{said[-6000:]}"
    assert row("t-yearly").runs == 4
    assert row("t-add").runs == 3
    assert list(TaskRecord.objects.values_list("task_path", "args", "status").distinct()) == [
        (ADD, [2, 3], "SUCCESSFUL")
    ]
    assert TaskRecord.objects.count() == 3
    # A real two-second schedule ("*/2 * * * * *") ticked meanwhile: at most one claim per
    # tick of the whole run (six claimers that each ran every tick would make it six), and no
    # run of a claimed tick twice.
    every_2s = row("t-every-2s").runs
    assert 2 <= every_2s <= elapsed / 2 + 1, (every_2s, elapsed)
    twice = "\n".join(
        line
        for out in outputs
        for line in out.splitlines()
        if "2s" in line or "given back" in line or "could not" in line
    )
    assert logged("periodic-2s") <= every_2s, (
        f"{list(WorkLog.objects.filter(kind='periodic-2s').values_list('key', 'pid', 'at'))}\n{twice[-8000:]}"
    )
    # Six processes took part (each wrote its own rows); the runs were not all in one.
    assert sum("schedule t-yearly: tick claimed" in out for out in outputs) >= 1


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_periodic_run_whose_worker_is_killed_runs_again_and_its_tick_once():
    periodic_row("t-slow", "slowly", seconds_ago=1)
    first = start_workers(TASKLOOP_OVERRIDES=overrides(), **PERIODIC_ENV)
    try:
        wait_until(lambda: logged("periodic-slow", "start") == 1, timeout=60)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        stop(first)
    assert logged("periodic-slow") == 0
    second = start_workers(TASKLOOP_OVERRIDES=overrides(), **PERIODIC_ENV)
    try:
        # Its lease (2 s here) runs out and the next worker takes the run again.
        wait_until(lambda: logged("periodic-slow") == 1, timeout=60)
    finally:
        out = stop(second)
    assert second.returncode == 0, out
    assert logged("periodic-slow", "start") == 2
    assert row("t-slow").runs == 1


# Admin. ----------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_admin_lists_schedules_and_runs_pauses_and_resumes_them(boss):
    Ticker([task_spec("adder"), task_spec("other", "*/5 * * * *")]).prepare()
    url = reverse("admin:django_taskloop_schedule_changelist")
    page = boss.get(url).content.decode()
    assert "adder" in page and "other" in page and "*/5 * * * *" in page
    assert "Run now" in page and "Pause" in page and "Resume" in page
    # "active", not "running": nothing runs between ticks.
    assert ">active<" in page and ">running<" not in page
    adder = row("adder")

    def act(action: str) -> str:
        response = boss.post(url, {"action": action, "_selected_action": [adder.pk]}, follow=True)
        assert response.status_code == 200
        return response.content.decode()

    assert "1 schedule(s) due now." in act("run_now")
    assert row("adder").next_run_at <= db_now()
    assert "1 schedule(s) paused." in act("pause_schedules")
    assert row("adder").paused and "paused" in boss.get(url).content.decode()
    refused = act("run_now")
    assert "is paused" in refused
    assert "1 schedule(s) resumed." in act("resume_schedules")
    assert not row("adder").paused and row("adder").next_run_at > db_now()
    assert row("other").next_run_at.minute % 5 == 0  # untouched
    detail = boss.get(reverse("admin:django_taskloop_schedule_change", args=[adder.pk])).content.decode()
    assert ADD in detail
    assert 'name="_save"' not in detail  # declared in code and settings: nothing to edit


@pytest.mark.django_db
def test_admin_actions_need_the_change_permission(client):
    from django.contrib.auth.models import Permission, User

    Ticker([task_spec("adder")]).prepare()
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_schedule"))
    client.force_login(viewer)
    url = reverse("admin:django_taskloop_schedule_changelist")
    page = client.get(url).content.decode()
    assert "adder" in page and "Run now" not in page
    before = row("adder").next_run_at
    client.post(url, {"action": "run_now", "_selected_action": [row("adder").pk]})
    assert row("adder").next_run_at == before
