"""The admin and the metrics show a Django Tasks queue by its Django name, its two tubes
(``tasks.<queue>``, ``tasks-keyed.<queue>``) merged, and keep those tubes out of a Tasks user's
way while an operator still reaches them (issue 28, item 2); a Django Task's failures are one
item, its result, linked (item 3)."""

from __future__ import annotations

import pytest
from django.urls import reverse

from django_taskloop import backends
from django_taskloop.backends import short_result_id
from django_taskloop.models import Failure, Tube, WorkerProcess
from django_taskloop.models.operating import record_throughput
from django_taskloop.stats import (
    DJANGO_TASK,
    TASKS_TUBE_PREFIXES,
    django_tasks_queue,
    merge_django_tasks,
    queue_summaries,
)
from django_taskloop.workers import get_handlers

from . import options_tasks as t
from .workers_util import add, run_workers

pytestmark = pytest.mark.django_db


def test_the_read_model_spells_the_backend_s_tube_names():
    assert TASKS_TUBE_PREFIXES == (backends.TUBE_PREFIX, backends.KEYED_TUBE_PREFIX)
    assert django_tasks_queue(backends.tube_name("default")) == "default"
    assert django_tasks_queue(backends.keyed_tube_name("slow")) == "slow"
    assert django_tasks_queue("emails") is None and django_tasks_queue("tasks.") is None


def test_handlers_of_a_django_tasks_queue_share_one_title():
    plain, keyed = get_handlers(["default"])
    assert plain.title == keyed.title == "default (Django Tasks)"
    assert plain.described == keyed.described == "Django Tasks queue default"


def test_an_unknown_name_lists_queues_by_their_django_names_not_their_tubes():
    with pytest.raises(ValueError) as raised:
        get_handlers(["nope"])
    message = str(raised.value)
    assert "Django Tasks queues: ['default', 'slow']" in message, message
    assert "tasks.default" not in message and "tasks-keyed" not in message, message
    # The tubes' names still select them, for an operator.
    assert [h.name for h in get_handlers(["tasks.default"])] == ["tasks.default"]


@pytest.fixture
def queued():
    """Two plain tasks and a keyed one in queue ``default``, and a tube of the user's own."""
    results = [add.enqueue(1, 2), add.enqueue(3, 4), t.sync.enqueue(7)]
    Tube.objects.create_tube("emails", "fifottl").put("hello")
    return results


def test_summaries_merge_a_queue_s_two_tubes(queued):
    (merged,) = [s for s in merge_django_tasks(queue_summaries(["task"])) if s.kind == DJANGO_TASK]
    assert merged.name == "default" and merged.counts["ready"] == 3
    assert [tube.name for tube in merged.tubes] == ["tasks.default", "tasks-keyed.default"]
    assert merged.source.name == "tasks.default"
    names = [s.name for s in merge_django_tasks(queue_summaries(["task"]))]
    assert sorted(names) == ["default", "emails"]


def test_metrics_show_a_django_tasks_queue_once_by_its_name(boss, queued):
    record_throughput("task", "tasks.default", done=3, failed=1)
    record_throughput("task", "tasks-keyed.default", done=2)
    WorkerProcess.objects.beat(
        "h:1", host="h", pid=1, queues=["task:tasks.default", "task:tasks-keyed.default"], holding={}
    )
    text = boss.get("/taskloop/metrics").content.decode()
    samples = text.splitlines()
    assert 'taskloop_items{queue="default",kind="django_task",state="ready"} 3' in samples, text
    assert 'taskloop_items{queue="emails",kind="task",state="ready"} 1' in samples, text
    assert 'taskloop_processed_total{queue="default",kind="django_task",outcome="done"} 5' in samples
    assert 'taskloop_processed_total{queue="default",kind="django_task",outcome="failed"} 1' in samples
    assert 'taskloop_workers{queue="default",kind="django_task"} 1' in samples, text
    assert "tasks.default" not in text and "tasks-keyed" not in text, text


def test_the_dashboard_has_one_card_per_django_tasks_queue_linking_its_results(boss, queued):
    page = boss.get(reverse("admin:django_taskloop_dashboard")).content.decode()
    card = page.split('data-queue="default"', 1)[1].split("</section>", 1)[0]
    assert "Django Tasks queue" in card
    assert reverse("admin:django_taskloop_taskrecord_changelist") + "?queue=default" in card
    assert '<td class="num">3</td>' in card  # ready: both tubes' tasks
    assert "running" in card  # a taken task is a running Django task
    # The internal tubes, for an operator: small, after the rest, linked.
    for name in ("tasks.default", "tasks-keyed.default"):
        tube = Tube.objects.get(name=name)
        assert f"?tube__id__exact={tube.pk}" in card and name in card
    assert 'data-queue="tasks.default"' not in page and 'data-queue="tasks-keyed.default"' not in page


def test_pausing_a_django_tasks_queue_pauses_both_its_tubes(boss, queued):
    url = reverse("admin:django_taskloop_pause")
    response = boss.post(url, {"kind": DJANGO_TASK, "queue": "default", "do": "pause"})
    assert response.status_code == 302
    assert [tube.paused for tube in Tube.objects.filter(name__startswith="tasks").order_by("name")] == [
        True,
        True,
    ]
    boss.post(url, {"kind": DJANGO_TASK, "queue": "default", "do": "resume"})
    assert not any(tube.paused for tube in Tube.objects.filter(name__startswith="tasks"))
    assert boss.post(url, {"kind": DJANGO_TASK, "queue": "nope", "do": "pause"}).status_code == 403


def test_tube_lists_label_the_backend_s_tubes_and_can_leave_them_out(boss, queued):
    tubes = reverse("admin:django_taskloop_tube_changelist")
    page = boss.get(tubes).content.decode()
    assert "Django Tasks queue default" in page and "keyed tasks of Django Tasks queue default" in page
    own = boss.get(tubes, {"used_by": "own"}).content.decode()
    assert "emails" in own and "tasks.default" not in own
    internal = boss.get(tubes, {"used_by": "django_tasks"}).content.decode()
    assert "tasks.default" in internal and ">emails<" not in internal
    tasks = reverse("admin:django_taskloop_task_changelist")
    result_url = reverse("admin:django_taskloop_taskrecord_change", args=[queued[0].id])
    listed = boss.get(tasks, {"used_by": "own"}).content.decode()
    assert "hello" in listed and result_url not in listed
    listed = boss.get(tasks).content.decode()
    # A tube task of the backend points at its result, not at a JSON blob.
    link = f'<a href="{result_url}" title="Django task result {queued[0].id}">result {short_result_id(queued[0].id)}</a>'
    assert link in listed


def test_the_app_index_tells_tube_tasks_from_django_task_results(boss):
    page = boss.get(reverse("admin:app_list", args=["django_taskloop"])).content.decode()
    assert "Tube tasks" in page and "Django task results" in page
    assert ">Tasks<" not in page


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_failures_of_a_django_task_are_one_item_linked_to_its_result(boss):
    result = t.always_fails.enqueue("boom")
    run = run_workers(
        "--burst",
        "--only",
        "default",
        DJANGO_SETTINGS_MODULE="tests.workers_settings",
        TASKLOOP_OVERRIDES='{"POLL_MIN": 0.05}',
    )
    assert run.returncode == 0, run.stderr
    assert Failure.objects.count() == 3
    url = reverse("admin:django_taskloop_failure_changelist")
    result_url = reverse("admin:django_taskloop_taskrecord_change", args=[result.id])
    page = boss.get(url).content.decode()
    # Three attempts of one item: each row links the same result.
    assert page.count(f'href="{result_url}"') == 3, page
    assert "Django Tasks" in page
    # The queue filter offers the queue by its Django name, and filters both its tubes.
    assert "default (Django Tasks)" in page
    assert "?queue=task%3Atasks.default" not in page and "?queue=task:tasks.default" not in page
    only = boss.get(url, {"queue": f"{DJANGO_TASK}:default"}).content.decode()
    assert only.count(f'href="{result_url}"') == 3
    assert boss.get(url, {"queue": f"{DJANGO_TASK}:slow"}).content.decode().count(result_url) == 0
    # An operator can still filter by one tube; a search by the result id finds every attempt.
    assert boss.get(url, {"queue": "task:tasks.default"}).content.decode().count(f'href="{result_url}"') == 3
    assert boss.get(url, {"q": result.id}).content.decode().count(f'href="{result_url}"') == 3
    detail = boss.get(reverse("admin:django_taskloop_failure_change", args=[Failure.objects.first().pk]))
    assert result_url in detail.content.decode()


def test_live_workers_serve_and_hold_a_django_tasks_queue_by_its_name(boss):
    WorkerProcess.objects.beat(
        "h:1",
        host="h",
        pid=1,
        queues=["task:tasks.default", "task:tasks-keyed.default", "task:emails"],
        holding={"task:tasks.default": 2, "task:tasks-keyed.default": 1},
    )
    for url in (
        reverse("admin:django_taskloop_workerprocess_changelist"),
        reverse("admin:django_taskloop_dashboard"),
    ):
        page = boss.get(url).content.decode()
        assert "default (Django Tasks), task:emails" in page, url
        assert "3 of default (Django Tasks)" in page, url
        assert "tasks.default" not in page and "tasks-keyed" not in page, url


def test_the_failures_list_reads_the_results_task_paths_with_its_rows_not_one_query_each(boss):
    """Each Django Task's row links its result by task path: read in the list's own query."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_taskloop.engine import db_now
    from django_taskloop.models import TaskRecord

    def failures_of(count: int) -> None:
        for n in range(count):
            record = TaskRecord.objects.create(
                backend="default", queue_name="default", task_path=f"app.tasks.t{n}"
            )
            Failure.objects.create(
                kind="task",
                queue="tasks.default",
                item=record.id,
                attempt=1,
                worker="w",
                error="E",
                at=db_now(),
            )

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            page = boss.get(reverse("admin:django_taskloop_failure_changelist")).content.decode()
        assert page.count("app.tasks.t") >= Failure.objects.count()  # each row names its task
        return len(captured)

    failures_of(2)
    few = queries()
    failures_of(8)
    assert queries() == few
