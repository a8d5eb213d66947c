"""The admin of Django Tasks results (issue 16): status, call, return value, every attempt with
its traceback, filters by status, queue and task, retry of a FAILED task, the retention."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse

from django_taskloop.backends import keyed_tube_name, result_id_of, tube_name
from django_taskloop.models import TaskRecord, Tube

from . import options_tasks as t
from .workers_util import add

try:
    from django.tasks import TaskResultStatus, task_backends
    from django.tasks.exceptions import TaskResultDoesNotExist
except ImportError:  # Django 5.2: the backport
    from django_tasks import TaskResultStatus, task_backends
    from django_tasks.exceptions import TaskResultDoesNotExist

pytestmark = pytest.mark.django_db(transaction=True)

LIST = "admin:django_taskloop_taskrecord_changelist"


def run_all(queue: str = "default", keyed: bool = False) -> None:
    """Run what waits in ``queue``'s tube, as a worker does."""
    from django_taskloop.workers import FailedForGood

    tube = Tube.objects.get(name=keyed_tube_name(queue) if keyed else tube_name(queue))
    while (queued := tube.take(0, consumer="test")) is not None:
        try:
            task_backends["default"].execute(result_id_of(queued), "host:1", queued=queued)
        except FailedForGood:
            pass
        tube.ack(queued.id, consumer="test")


@pytest.fixture
def finished():
    ok = add.enqueue(2, b=3)
    failed = t.always_fails.using(backoff=0).enqueue("disk full")
    waiting = t.refresh.using(queue_name="slow").enqueue("later")
    run_all()
    return ok, failed, waiting


def test_the_list_shows_status_and_attempts_and_filters_by_status_queue_and_task(boss, finished):
    ok, failed, waiting = finished
    page = boss.get(reverse(LIST)).content.decode()
    for result in finished:
        assert result.id[:8] in page
    assert "Successful" in page and "Failed" in page and "Ready" in page
    assert "Finished results are kept 7 d" in page  # RESULT_RETENTION, pruned by reap_locks
    only_failed = boss.get(reverse(LIST), {"status__exact": "FAILED"}).content.decode()
    assert failed.id[:8] in only_failed and ok.id[:8] not in only_failed
    slow = boss.get(reverse(LIST), {"queue": "slow"}).content.decode()
    assert waiting.id[:8] in slow and ok.id[:8] not in slow
    by_task = boss.get(reverse(LIST), {"task": "tests.workers_util.add"}).content.decode()
    assert ok.id[:8] in by_task and failed.id[:8] not in by_task


def test_a_result_s_page_shows_the_call_the_return_value_and_every_attempt(boss, finished):
    ok, failed, waiting = finished
    page = boss.get(reverse("admin:django_taskloop_taskrecord_change", args=[ok.id])).content.decode()
    assert "&quot;b&quot;: 3" in page and '<pre class="tl-value">5</pre>' in page
    page = boss.get(reverse("admin:django_taskloop_taskrecord_change", args=[failed.id])).content.decode()
    assert page.count("builtins.RuntimeError") == 3  # three attempts, each with its traceback
    assert page.count("Traceback (most recent call last)") == 3 and "disk full" in page


def test_retry_a_failed_task_is_a_new_attempt_of_the_same_result(boss, finished):
    ok, failed, waiting = finished
    response = boss.post(
        reverse(LIST),
        {"action": "retry_tasks", "_selected_action": [failed.id, ok.id]},
        follow=True,
    )
    text = response.content.decode()
    assert "Retried 1 task(s)." in text
    assert "only a FAILED task can be retried" in text  # the successful one is refused
    failed.refresh()
    assert failed.status == TaskResultStatus.READY and len(failed.errors) == 3
    run_all()
    failed.refresh()
    # One attempt more, then FAILED again: max_attempts does not start over.
    assert failed.status == TaskResultStatus.FAILED
    assert failed.attempts == 4 and len(failed.errors) == 4
    assert TaskRecord.objects.count() == 3  # the same record, no new one


def test_retry_of_a_keyed_task_goes_back_to_its_key(finished):
    keyed = t.step.using(max_attempts=1).enqueue(5, 1)
    queued = Tube.objects.get(name=keyed_tube_name("default")).take(0)
    task_backends["default"].execute(keyed.id, "host:1", queued=queued)  # its record is written
    TaskRecord.objects.filter(pk=keyed.id).update(status="FAILED")
    task_backends["default"].retry(keyed.id)
    assert (
        Tube.objects.get(name=keyed_tube_name("default")).tasks.all().filter(utube="account:5").count() == 2
    )
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].retry("nope")


def test_a_viewer_cannot_retry(client, finished):
    ok, failed, waiting = finished
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_taskrecord"))
    client.force_login(viewer)
    assert client.get(reverse(LIST)).status_code == 200
    client.post(reverse(LIST), {"action": "retry_tasks", "_selected_action": [failed.id]})
    failed.refresh()
    assert failed.status == TaskResultStatus.FAILED


def test_a_failed_result_s_page_has_a_retry_button_and_no_save(boss, finished):
    ok, failed, waiting = finished
    change = "admin:django_taskloop_taskrecord_change"
    failed_page = boss.get(reverse(change, args=[failed.id])).content.decode()
    ok_page = boss.get(reverse(change, args=[ok.id])).content.decode()
    retry_url = reverse("admin:django_taskloop_taskrecord_retry", args=[failed.id])
    assert retry_url in failed_page and "Retry: a new attempt of this result" in failed_page
    assert "Retry:" not in ok_page  # only a FAILED result can be retried
    for page in (failed_page, ok_page):
        assert 'name="_save"' not in page and 'name="_continue"' not in page  # nothing to edit
    response = boss.post(retry_url, follow=True)
    assert response.status_code == 200
    failed.refresh()
    assert failed.status == TaskResultStatus.READY and len(failed.errors) == 3
    assert TaskRecord.objects.count() == 3


def test_expired_task_is_not_ready_in_the_results_list(boss):
    """A READY result past its ttl shows FAILED, as get_result() reads it, before a worker
    reaches it (TaskRecord.expiry, the one definition)."""
    import datetime as dt

    from django_taskloop.engine import db_now
    from django_taskloop.models import Task

    late = t.must_start_soon.enqueue("late")
    in_time = t.must_start_soon.enqueue("in time")
    # No worker has started them: the list shows them above the results, read off their
    # tube tasks (one-row enqueues).
    Task.objects.filter(pk=int(late.id.split("-")[0])).update(created=db_now() - dt.timedelta(seconds=61))
    page = boss.get(reverse(LIST)).content.decode()
    assert "Tasks that wait to start: 2" in page
    assert late.id in page and in_time.id in page
    # Not in the way under another status's filter.
    failed_only = boss.get(reverse(LIST), {"status__exact": "FAILED"}).content.decode()
    assert "wait to start" not in failed_only and late.id not in failed_only
    assert page.count("Failed (ttl ran out)") == 1
    assert page.count("Ready") >= 1  # the one still within its ttl (and the filter's choice)
    detail = boss.get(reverse("admin:django_taskloop_taskrecord_change", args=[late.id])).content.decode()
    assert "Failed (ttl ran out)" in detail
    fresh = boss.get(reverse("admin:django_taskloop_taskrecord_change", args=[in_time.id])).content.decode()
    assert "Failed (ttl ran out)" not in fresh


def test_the_results_page_title_is_a_title_and_its_times_read_to_the_second(boss, finished):
    page = boss.get(reverse(LIST)).content.decode()
    title = page.split("<title>", 1)[1].split("</title>", 1)[0]
    assert "kept" not in title and "Django task result" in title
    assert 'class="help tl-retention">Finished results are kept 7 d' in page
    assert page.count('<time class="tl-when"') >= 3
