"""The operator's admin (issue 14): failures and their tracebacks, retry the chosen item,
pause/resume, live workers, deletes through the tube, titles and counts that say what they are."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse
from django.utils import timezone

from django_taskloop.models import Failure, Job, JobBoard, Task, Tube, WorkerProcess

pytestmark = pytest.mark.django_db


def fail(kind: str, queue: str, item, attempt: int, message: str = "smtp down") -> Failure:
    try:
        raise ConnectionError(message)
    except ConnectionError as error:
        return Failure.objects.record(
            kind=kind, queue=queue, item=item, attempt=attempt, worker="host:1", error=error
        )


@pytest.fixture
def buried():
    tube = Tube.objects.create_tube("emails", "fifottl")
    task = tube.put({"to": "a@example.com"})
    for attempt in (1, 2, 3):
        fail("task", "emails", task.pk, attempt, f"smtp down {attempt}")
    tube.bury(task.pk)
    return tube, task


def test_failures_list_filters_by_queue_and_error_and_links_the_item(boss, buried):
    tube, task = buried
    fail("job", "builds", "some-uuid", 1, "compiler crashed")
    url = reverse("admin:django_taskloop_failure_changelist")
    page = boss.get(url).content.decode()
    assert page.count('title="smtp down') == 3 and "compiler crashed" in page
    assert reverse("admin:django_taskloop_task_change", args=[task.pk]) in page
    only = boss.get(url, {"queue": "task:emails"}).content.decode()
    assert "compiler crashed" not in only and only.count('title="smtp down') == 3
    by_error = boss.get(url, {"error": "builtins.ConnectionError"}).content.decode()
    assert by_error.count("ConnectionError") >= 4
    detail = boss.get(reverse("admin:django_taskloop_failure_change", args=[Failure.objects.first().pk]))
    assert "Traceback (most recent call last)" in detail.content.decode()


def test_a_tasks_page_shows_its_attempts_and_last_traceback_and_the_list_says_why_it_is_buried(boss, buried):
    tube, task = buried
    page = boss.get(reverse("admin:django_taskloop_task_change", args=[task.pk])).content.decode()
    assert f"task {task.pk} (buried)" in page  # a title that says the state
    assert page.count("ConnectionError") >= 3 and "smtp down 3" in page
    assert "Last traceback" in page and "Traceback (most recent call last)" in page
    listing = boss.get(reverse("admin:django_taskloop_task_changelist")).content.decode()
    assert "ConnectionError: smtp down 3" in listing


def test_retry_the_chosen_task_from_the_list(boss, buried):
    tube, task = buried
    other = tube.put({"to": "b@example.com"})
    tube.bury(other.pk)
    response = boss.post(
        reverse("admin:django_taskloop_task_changelist"),
        {"action": "kick_tasks", "_selected_action": [other.pk]},
        follow=True,
    )
    assert "Kicked 1 task(s)." in response.content.decode()
    assert tube.peek(other.pk).state == "r" and tube.peek(task.pk).state == "!"


def test_pause_and_resume_a_tube_and_a_board(boss):
    tube = Tube.objects.create_tube("emails", "fifottl")
    board = JobBoard.objects.create_board("builds")
    tubes = reverse("admin:django_taskloop_tube_changelist")
    boss.post(tubes, {"action": "pause_tubes", "_selected_action": [tube.pk]}, follow=True)
    assert tube.paused
    assert "tl-paused" in boss.get(tubes).content.decode()
    boss.post(tubes, {"action": "resume_tubes", "_selected_action": [tube.pk]}, follow=True)
    assert not tube.paused
    boards = reverse("admin:django_taskloop_jobboard_changelist")
    boss.post(boards, {"action": "pause_boards", "_selected_action": [board.pk]}, follow=True)
    assert board.paused
    boss.post(boards, {"action": "resume_boards", "_selected_action": [board.pk]}, follow=True)
    assert not board.paused


def test_a_viewer_can_neither_pause_nor_retry(client, buried):
    tube, task = buried
    user = User.objects.create_user("viewer", password="pw", is_staff=True)
    for codename in ("view_task", "view_tube", "view_failure"):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client.force_login(user)
    client.post(
        reverse("admin:django_taskloop_tube_changelist"),
        {"action": "pause_tubes", "_selected_action": [tube.pk]},
    )
    client.post(
        reverse("admin:django_taskloop_task_changelist"),
        {"action": "kick_tasks", "_selected_action": [task.pk]},
    )
    assert not tube.paused and tube.peek(task.pk).state == "!"
    assert client.get(reverse("admin:django_taskloop_failure_changelist")).status_code == 200


def test_deleting_a_task_from_its_page_goes_through_the_tube(boss):
    tube = Tube.objects.create_tube("emails", "fifottl")
    held = tube.put({"n": 1})
    tube.take(0, consumer="worker-7")
    url = reverse("admin:django_taskloop_task_delete", args=[held.pk])
    confirm = boss.get(url).content.decode()
    assert "Consumer worker-7 is working on it now" in confirm
    boss.post(url, {"post": "yes"}, follow=True)
    assert not Task.objects.filter(pk=held.pk).exists()
    assert tube.statistics()["calls"]["delete"] == 1


def test_a_job_page_shows_its_failures_and_a_trashed_job_says_why(boss):
    board = JobBoard.objects.create_board("builds")
    job = board.post("build-1356", {})
    board.claim(job, "w")
    fail("job", "builds", job.uuid, 1, "compiler crashed")
    board.trash(job, "w")
    page = boss.get(reverse("admin:django_taskloop_job_change", args=[job.pk])).content.decode()
    assert "compiler crashed" in page and "Last traceback" in page
    listing = boss.get(reverse("admin:django_taskloop_job_changelist"), {"state": "trashed"}).content.decode()
    assert "ConnectionError: compiler crashed" in listing
    boss.post(
        reverse("admin:django_taskloop_job_changelist"),
        {"action": "repost_jobs", "_selected_action": [job.pk]},
    )
    again = boss.post(
        reverse("admin:django_taskloop_job_changelist"),
        {"action": "repost_jobs", "_selected_action": [job.pk]},
        follow=True,
    ).content.decode()
    assert "re-posted already" in again
    assert Job.objects.filter(name="build-1356", trashed=False).count() == 1


def test_workers_page_lists_live_processes_and_what_they_hold(boss):
    WorkerProcess.objects.beat(
        "web-1:42:worker", host="web-1", pid=42, queues=["task:emails"], holding={"task:emails": 3}
    )
    page = boss.get(reverse("admin:django_taskloop_workerprocess_changelist")).content.decode()
    assert "web-1:42:worker" in page and "3 of task:emails" in page


def test_the_dashboard_shows_throughput_failures_pauses_workers_and_is_linked_from_the_index(boss, buried):
    from django_taskloop.models.operating import record_throughput

    tube, task = buried
    record_throughput("task", "emails", done=40, failed=3)
    WorkerProcess.objects.beat("web-1:42:worker", host="web-1", pid=42, queues=["task:emails"], holding={})
    Tube.objects.create_tube("empty", "fifo")
    index = boss.get(reverse("admin:index")).content.decode()
    assert reverse("admin:django_taskloop_dashboard") in index
    page = boss.get(reverse("admin:django_taskloop_dashboard")).content.decode()
    assert "Processed per minute, last hour" in page and "Processed per half hour, last day" in page
    assert "3 failed attempts in the last hour" in page
    assert "web-1:42:worker" in page
    assert "latency" in page
    # Pause from the dashboard, and see it marked.
    boss.post(reverse("admin:django_taskloop_pause"), {"kind": "task", "queue": "emails", "do": "pause"})
    assert tube.paused
    assert (
        'tl-state tl-paused">paused' in boss.get(reverse("admin:django_taskloop_dashboard")).content.decode()
    )
    boss.post(reverse("admin:django_taskloop_pause"), {"kind": "task", "queue": "emails", "do": "resume"})
    assert not tube.paused
    # A loop handler too.
    boss.post(
        reverse("admin:django_taskloop_pause"), {"kind": "loop", "queue": "testapp.intloop", "do": "pause"}
    )
    from tests.testapp.models import IntLoop

    assert IntLoop.objects.paused()
    # Named as Django spells a model (testapp.IntLoop), as the terminal and --only take it.
    boss.post(
        reverse("admin:django_taskloop_pause"), {"kind": "loop", "queue": "testapp.IntLoop", "do": "resume"}
    )
    assert not IntLoop.objects.paused()


def test_the_dashboard_pause_needs_the_change_permission(client):
    tube = Tube.objects.create_tube("emails", "fifottl")
    user = User.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_tube"))
    client.force_login(user)
    page = client.get(reverse("admin:django_taskloop_dashboard")).content.decode()
    assert 'name="do"' not in page
    response = client.post(
        reverse("admin:django_taskloop_pause"), {"kind": "task", "queue": "emails", "do": "pause"}
    )
    assert response.status_code == 403 and not tube.paused
    assert client.get(reverse("admin:django_taskloop_pause")).status_code == 405


def test_lists_say_estimates_and_caps_as_such(boss, settings):
    from tests.testapp.models import IntLoop

    IntLoop.objects.add(range(1, 1203))
    page = boss.get(reverse("admin:testapp_intloop_changelist")).content.decode()
    # SQLite has no statistics: the count stops at the cap; the servers estimate.
    assert "≥ 1,001" in page or "~" in page
    assert "1001 int loops" not in page


def test_viewing_a_tubes_statistics_changes_nothing(boss, clock):
    tube = Tube.objects.create_tube("t", "fifottl", ttr=60)
    tube.put("x")
    taken = tube.take(0, consumer="w1")
    clock.advance(30)
    assert tube.statistics(apply_transitions=False)["tasks"]["overdue"] == 0
    clock.advance(31)  # its ttr ran out: only a verb, a worker or reap_locks may free it
    assert tube.statistics(apply_transitions=False)["tasks"]["overdue"] == 1
    page = boss.get(reverse("admin:django_taskloop_tube_stats", args=[tube.pk])).content.decode()
    assert Task.objects.get(pk=taken.pk).state == "t"
    assert "tasks.overdue" in page
    boss.get(reverse("admin:django_taskloop_dashboard"))
    boss.get(reverse("admin:django_taskloop_task_changelist"))
    assert Task.objects.get(pk=taken.pk).state == "t"


def test_a_loop_ids_page_shows_its_failures(boss):
    from tests.testapp.models import IntLoop

    IntLoop.objects.add([5])
    fail("loop", "testapp.intloop", 5, 1, "feed unreachable")
    page = boss.get(reverse("admin:testapp_intloop_change", args=[5])).content.decode()
    assert "feed unreachable" in page and "Last traceback" in page


def test_retry_from_the_items_page(boss, buried):
    tube, task = buried
    page = boss.get(reverse("admin:django_taskloop_task_change", args=[task.pk])).content.decode()
    assert "Retry: kick this task" in page
    assert boss.get(reverse("admin:django_taskloop_task_retry", args=[task.pk])).status_code == 405
    boss.post(reverse("admin:django_taskloop_task_retry", args=[task.pk]), follow=True)
    assert tube.peek(task.pk).state == "r"
    page = boss.get(reverse("admin:django_taskloop_task_change", args=[task.pk])).content.decode()
    assert "Retry: kick this task" not in page  # ready now: nothing to retry
    board = JobBoard.objects.create_board("builds")
    job = board.post("b", {})
    board.claim(job, "w")
    board.trash(job, "w")
    boss.post(reverse("admin:django_taskloop_job_retry", args=[job.pk]), follow=True)
    job.refresh_from_db()
    assert job.reposted_as


def test_a_viewer_cannot_retry_from_the_items_page(client, buried):
    tube, task = buried
    user = User.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_task"))
    client.force_login(user)
    assert (
        "Retry"
        not in client.get(reverse("admin:django_taskloop_task_change", args=[task.pk])).content.decode()
    )
    assert client.post(reverse("admin:django_taskloop_task_retry", args=[task.pk])).status_code == 403
    assert tube.peek(task.pk).state == "!"


def test_paused_queues_are_marked_on_their_lists(boss):
    from tests.testapp.models import IntLoop

    tube = Tube.objects.create_tube("emails", "fifottl")
    tube.pause()
    page = boss.get(
        reverse("admin:django_taskloop_task_changelist"), {"tube__id__exact": tube.pk}
    ).content.decode()
    assert "Tube emails is paused" in page
    board = JobBoard.objects.create_board("builds")
    board.pause()
    page = boss.get(
        reverse("admin:django_taskloop_job_changelist"), {"board__id__exact": board.pk}
    ).content.decode()
    assert "Board builds is paused" in page
    IntLoop.objects.pause()
    assert (
        "Workers are paused on this loop"
        in boss.get(reverse("admin:testapp_intloop_changelist")).content.decode()
    )
    IntLoop.objects.resume()
    assert "Workers are paused" not in boss.get(reverse("admin:testapp_intloop_changelist")).content.decode()


def test_the_dashboard_is_a_url_of_the_site_and_its_old_url_redirects_there(boss):
    dashboard = reverse("admin:django_taskloop_dashboard")
    assert dashboard == "/admin/django_taskloop/dashboard/"
    assert reverse("admin:django_taskloop_pause") == "/admin/django_taskloop/dashboard/pause/"
    old = boss.get("/admin/django_taskloop/jobboard/dashboard/")
    assert old.status_code == 302 and old["Location"] == dashboard
    assert boss.get(dashboard).status_code == 200


def test_failure_times_read_to_the_second_and_how_long_ago(boss, buried):
    page = boss.get(reverse("admin:django_taskloop_failure_changelist")).content.decode()
    failure = Failure.objects.first()
    assert failure is not None
    at = timezone.localtime(failure.at)  # in the current time zone, as the admin shows times
    assert f">{at:%H:%M:%S}</time>" in page and "just now" in page
    assert f'title="{at:%Y-%m-%d %H:%M:%S}"' in page


def test_the_failures_filter_offers_only_queues_that_failed(boss, buried):
    Tube.objects.create_tube("never-failed", "fifo")
    JobBoard.objects.create_board("calm")
    page = boss.get(reverse("admin:django_taskloop_failure_changelist")).content.decode()
    assert "?queue=task%3Aemails" in page
    assert "never-failed" not in page and "job%3Acalm" not in page and "loop%3A" not in page


@pytest.mark.parametrize("workers", [0, 2])
def test_the_workers_list_says_no_capped_count_under_a_few_rows(boss, workers):
    for n in range(workers):
        WorkerProcess.objects.beat(f"w{n}", host="web", pid=n, queues=["task:emails"], holding={})
    page = boss.get(reverse("admin:django_taskloop_workerprocess_changelist")).content.decode()
    assert "counting stops there" not in page and "More than" not in page
    assert f'<span class="tl-total">{workers}</span> worker process' in page
