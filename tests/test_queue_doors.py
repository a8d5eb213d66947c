"""The same queue through each door gives the same answer (issue 42): the terminal, the admin's
actions, the dashboard, the reaper and :class:`django_taskloop.queues.Queue` itself find a
queue the same way and act on every shard of it.

Each operator verb is run through each door that offers it, on a tube and a board that
``SHARDS`` spreads over the suite's two databases, and every shard is looked at afterwards.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any

import pytest
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone

from django_taskloop import shards
from django_taskloop.engine import DbNow
from django_taskloop.models import Failure, Job, JobBoard, Task, Tube
from django_taskloop.queues import Queue, QueueError, resolve
from tests.testapp.models import IntLoop

pytestmark = pytest.mark.django_db(databases=["default", "other"], transaction=True)

BOTH = ["default", "other"]


@pytest.fixture
def spread(settings: Any) -> tuple[shards.ShardedTube, shards.ShardedBoard]:
    """A tube and a board on both databases, each shard with one buried task / trashed job."""
    settings.TASKLOOP = {"SHARDS": {"d-tube": BOTH, "d-board": BOTH}}
    tube, board = shards.tube("d-tube"), shards.board("d-board")
    for alias in BOTH:
        shard = tube.shard(alias)
        shard.put({"on": alias})
        shard.bury(shard.take(consumer="me").pk)
        jobs = board.shard(alias)
        job = jobs.post(f"job-{alias}", {})
        jobs.claim(job, "me")
        jobs.trash(job, "me")
    return tube, board


def _terminal(*args: str) -> str:
    out = io.StringIO()
    call_command("taskloop", *args, stdout=out)
    return out.getvalue()


def _admin_action(client: Any, kind: str, name: str, action: str) -> None:
    model, url = (Tube, "tube") if kind == "task" else (JobBoard, "jobboard")
    row = model.objects.get(name=name)  # the router's row: the whole queue
    changelist = reverse(f"admin:django_taskloop_{url}_changelist")
    client.post(changelist, {"action": action, "_selected_action": [row.pk]})


def _paused(kind: str, name: str) -> list[bool]:
    model = Tube if kind == "task" else JobBoard
    return [model.objects.using(alias).get(name=name).paused for alias in BOTH]


PAUSE_DOORS: dict[str, Callable[[Any, str, str, str], None]] = {
    "queue": lambda client, kind, name, do: getattr(resolve(f"{kind}:{name}"), do)(),
    "terminal": lambda client, kind, name, do: _terminal(do, f"{kind}:{name}") and None,
    "dashboard": lambda client, kind, name, do: (
        client.post(reverse("admin:django_taskloop_pause"), {"kind": kind, "queue": name, "do": do}) and None
    ),
    "admin action": lambda client, kind, name, do: _admin_action(
        client, kind, name, f"{do}_{'tubes' if kind == 'task' else 'boards'}"
    ),
}


@pytest.mark.parametrize("door", sorted(PAUSE_DOORS))
@pytest.mark.parametrize("kind,name", [("task", "d-tube"), ("job", "d-board")])
def test_pause_and_resume_reach_every_shard_through_each_door(spread, admin_client, door, kind, name):
    PAUSE_DOORS[door](admin_client, kind, name, "pause")
    assert _paused(kind, name) == [True, True]
    assert resolve(f"{kind}:{name}").paused()
    PAUSE_DOORS[door](admin_client, kind, name, "resume")
    assert _paused(kind, name) == [False, False]
    assert not resolve(f"{kind}:{name}").paused()


def _buried() -> list[int]:
    return [Task.objects.using(alias).filter(tube__name="d-tube").buried().count() for alias in BOTH]


def _trashed_left() -> list[int]:
    return [
        Job.objects.using(alias)
        .filter(board__name="d-board")
        .trashed()
        .filter(reposted_as__isnull=True)
        .count()
        for alias in BOTH
    ]


RETRY_DOORS: dict[tuple[str, str], Callable[[Any], object]] = {
    ("task", "queue"): lambda client: resolve("d-tube").retry_all(),
    ("task", "terminal"): lambda client: _terminal("retry", "d-tube", "--all"),
    ("task", "admin action"): lambda client: _admin_action(client, "task", "d-tube", "kick_all"),
    ("job", "queue"): lambda client: resolve("d-board").retry_all(),
    ("job", "terminal"): lambda client: _terminal("retry", "d-board", "--all"),
}


@pytest.mark.parametrize("kind,door", sorted(RETRY_DOORS))
def test_retry_every_failed_item_reaches_every_shard_through_each_door(spread, admin_client, kind, door):
    left = _buried if kind == "task" else _trashed_left
    assert left() == [1, 1]
    RETRY_DOORS[kind, door](admin_client)
    assert left() == [0, 0]


def test_a_queue_of_an_admin_row_is_the_queue_a_name_resolves_to(spread):
    for model, name in ((Tube, "d-tube"), (JobBoard, "d-board")):
        by_row = Queue.of(model.objects.get(name=name))
        by_name = resolve(name)
        assert by_row == by_name
        assert by_row.databases == BOTH
        # The name of one shard, as status shows it, is that shard only.
        assert resolve(f"{name}@other").databases == ["other"]


def test_the_read_model_through_each_door_counts_each_shard_the_same(spread):
    from django_taskloop.metrics import render_metrics

    queue = resolve("d-tube")
    by_queue = {s.using: s.counts["buried"] for s in queue.summaries()}
    assert by_queue == {"default": 1, "other": 1}
    metrics = render_metrics()
    for alias, shown in (("default", "d-tube"), ("other", "d-tube@other")):
        assert f'taskloop_items{{queue="{shown}",kind="task",state="buried"}} {by_queue[alias]}' in metrics
    status = json.loads(_terminal("status", "d-tube", "--json"))
    by_status = {q["using"]: q["counts"]["buried"] for q in status["queues"]}
    assert by_status == by_queue, status


def test_a_loop_name_resolves_in_any_case_through_each_door(admin_client):
    label = IntLoop._meta.label_lower
    shouted = label.upper()
    assert resolve(shouted).model is IntLoop
    assert Queue.named("loop", shouted) == resolve(label)
    admin_client.post(
        reverse("admin:django_taskloop_pause"), {"kind": "loop", "queue": shouted, "do": "pause"}
    )
    assert IntLoop.objects.paused()
    _terminal("resume", shouted)
    assert not IntLoop.objects.paused()


def test_the_reaper_reaches_every_shard_of_a_board_and_prunes_each_shards_failures(settings):
    from django_taskloop.reaper import reap

    settings.TASKLOOP = {"SHARDS": {"d-board": BOTH}, "FAILURE_RETENTION": 60}
    board = shards.board("d-board")
    for alias in BOTH:
        jobs = board.shard(alias)
        job = jobs.post(f"job-{alias}", {})
        jobs.claim(job, "gone", expiry=60)
        Job.objects.using(alias).filter(pk=job.pk).update(claim_expires_at=DbNow(-1))
        Failure.objects.using(alias).create(
            kind="job",
            queue="d-board",
            item=str(job.uuid),
            attempt=1,
            worker="w",
            error="x",
            at=timezone.now(),
        )
        Failure.objects.using(alias).update(at=DbNow(-3600))
    report = reap()
    assert set(report["boards"]) >= {"d-board", "d-board@other"}, report
    for alias in BOTH:
        assert not Job.objects.using(alias).filter(claimed_by="gone").exists(), alias
        assert not Failure.objects.using(alias).exists(), alias


def test_a_wrong_name_or_id_is_one_error_and_changes_nothing(spread):
    with pytest.raises(QueueError, match="no queue named 'nope'"):
        resolve("nope")
    with pytest.raises(QueueError, match="spread over 2 databases"):
        resolve("d-tube").retry(["1"])
    with pytest.raises(QueueError, match="no job"):
        resolve("d-board").retry(["not-a-job"])
    assert _buried() == [1, 1] and _trashed_left() == [1, 1]


@pytest.fixture
def spread_tasks(settings: Any) -> None:
    """A Django Tasks queue whose backend spreads it over both databases: its two tubes on each."""
    settings.TASKS = {
        "default": {
            "BACKEND": "django_taskloop.backends.TaskloopBackend",
            "QUEUES": ["dq"],
            "OPTIONS": {"DATABASES": BOTH},
        }
    }
    for alias in BOTH:
        Tube.objects.db_manager(alias).create_tube("tasks.dq", "fifottl")
        Tube.objects.db_manager(alias).create_tube("tasks-keyed.dq", "utubettl")


@pytest.mark.parametrize("door", ["queue", "terminal", "dashboard"])
def test_a_django_tasks_queue_pauses_and_resumes_as_one_on_every_shard(spread_tasks, admin_client, door):
    PAUSE_DOORS[door](admin_client, "django_task", "dq", "pause")
    for alias in BOTH:
        rows = Tube.objects.using(alias).filter(name__in=["tasks.dq", "tasks-keyed.dq"])
        assert [tube.paused for tube in rows] == [True, True], alias
    PAUSE_DOORS[door](admin_client, "django_task", "dq", "resume")
    for alias in BOTH:
        rows = Tube.objects.using(alias).filter(name__in=["tasks.dq", "tasks-keyed.dq"])
        assert [tube.paused for tube in rows] == [False, False], alias
    assert len(resolve("dq").shards) == 4


def test_a_django_tasks_queue_is_named_back_as_every_door_shows_it(spread_tasks):
    """``failures`` shows ``dq (tasks)``, the admin and the logs ``dq (Django Tasks)``: typed
    back, both name the queue (a fresh project's try found the admin's spelling refused)."""
    queue = resolve("django_task:dq")
    assert resolve("dq") == resolve("dq (tasks)") == resolve("dq (Django Tasks)") == queue
    with pytest.raises(QueueError, match="no Django Tasks queue named 'nope'"):
        resolve("nope (Django Tasks)")
