"""The dashboard: every loop, board and tube the user may see, with SVG charts; no CDN."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse

from django_taskloop.admin.charts import bar_chart
from django_taskloop.models import JobBoard, Tube
from tests.testapp.models import IntLoop

pytestmark = pytest.mark.django_db

URL = "admin:django_taskloop_dashboard"


@pytest.fixture
def queues():
    IntLoop.objects.add(range(1, 6))
    IntLoop.objects.bump([1, 2], lock_for=900)
    board = JobBoard.objects.create_board("builds")
    board.claim(board.post("compile"), "w1", expiry=60)
    board.post("test")
    tube = Tube.objects.create_tube("emails", "fifo")
    for n in range(3):
        tube.put({"n": n})
    tube.bury(tube.put({"n": 9}).pk)


def test_dashboard_shows_every_queue_with_charts(client, queues):
    client.force_login(User.objects.create_superuser("boss", "boss@example.com", "pw"))
    response = client.get(reverse(URL))
    page = response.content.decode()
    assert response.status_code == 200
    for queue in ("int loops", "builds", "emails"):
        assert f'data-queue="{queue}"' in page
    assert "<title>locked: 2</title>" in page and "<title>new: 3</title>" in page  # the loop
    assert "<title>claimed: 1</title>" in page and "<title>unclaimed: 1</title>" in page  # the board
    assert "<title>ready: 3</title>" in page and "<title>buried: 1</title>" in page  # the tube
    # The table of queues first: each queue's states, its latency, what failed.
    table = page.split('<table class="tl-queues">', 1)[1].split("</table>", 1)[0]
    assert page.index('class="tl-queues"') < page.index('class="tl-chart"')
    for queue in ("int loops", "builds", "emails"):
        assert f'data-queue-row="{queue}"' in table
    assert '<span class="tl-state tl-buried">buried 1</span>' in table  # the emails tube
    assert '<span class="tl-state tl-buried">1 buried</span>' in table  # failed for good
    assert '<span class="tl-state tl-bumped">bumped 2</span>' not in table  # locked, not bumped
    assert '<span class="tl-state tl-locked">locked 2</span>' in table
    # No chart of the oldest locks that reads "0 s" for a board that holds none.
    assert "Oldest lock" not in page
    assert "<title>10–60 min: 2</title>" in page  # lock ages of the loop
    assert reverse("admin:testapp_intloop_stats") in page
    # Offline: no script or stylesheet from another host.
    assert not re.search(r'(src|href)="https?://', page)


def test_viewer_of_tubes_only_sees_tubes(client, queues):
    user = User.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_tube"))
    client.force_login(user)
    page = client.get(reverse(URL)).content.decode()
    assert 'data-queue="emails"' in page
    assert 'data-queue="builds"' not in page and 'data-queue="int loops"' not in page


def test_staff_without_permissions_is_refused(client, queues):
    client.force_login(User.objects.create_user("nobody", password="pw", is_staff=True))
    assert client.get(reverse(URL)).status_code == 403


def test_anonymous_is_sent_to_the_login_page(client):
    response = client.get(reverse(URL))
    assert response.status_code == 302 and reverse("admin:login") in response["Location"]


def test_app_index_and_change_lists_link_the_dashboard(client, queues):
    client.force_login(User.objects.create_superuser("boss", "boss@example.com", "pw"))
    dashboard = reverse(URL)
    assert dashboard in client.get(reverse("admin:app_list", args=["django_taskloop"])).content.decode()
    for name in (
        "django_taskloop_task_changelist",
        "django_taskloop_job_changelist",
        "testapp_intloop_changelist",
    ):
        assert dashboard in client.get(reverse(f"admin:{name}")).content.decode(), name


def test_bar_chart_escapes_labels_and_scales_bars():
    svg = bar_chart([("<b>", 10), ("half", 5), ("zero", 0)], title="T & t", width=420)
    assert "&lt;b&gt;" in svg and "<b>" not in svg
    assert "T &amp; t" in svg
    widths = [float(w) for w in re.findall(r'<rect x="[\d.]+%" y="[\d.]+" width="([\d.]+)%"', svg)]
    assert widths[0] == 2 * widths[1] and widths[2] == 0
    # As wide as its card: no fixed width, no scaling of its text.
    assert (
        '<svg class="tl-chart" role="img" aria-label="T &amp; t" width="100%"' in svg and "viewBox" not in svg
    )
    assert "no data" in bar_chart([], title="empty")


def test_expired_task_is_not_ready_on_the_dashboard(client):
    from django_taskloop.engine import DbNow
    from django_taskloop.models import Task

    client.force_login(User.objects.create_superuser("boss", "boss@example.com", "pw"))
    tube = Tube.objects.create_tube("mail", "fifottl")
    gone = tube.put("old", ttl=1)
    Task.objects.filter(pk=gone.pk).update(ttl_at=DbNow(-1))
    tube.bury(tube.put("buried").pk)
    page = client.get(reverse(URL)).content.decode()
    assert "<title>expired: 1</title>" in page and "<title>buried: 1</title>" in page
    assert "<title>ready: 1</title>" not in page
    # One colour per state: the expired task's bar is grey, as in the task list (tl-ttl).
    assert re.search(r'class="tl-ttl"[^>]*><title>expired: 1</title>', page)


def test_an_expired_job_claim_is_the_boards_oldest_ready_work_on_the_dashboard(client):
    """The next claim_next takes a job whose claim expired: the board's oldest ready wait is
    its wait (as in the metrics), and it is counted as an expired claim, not unclaimed."""
    from django_taskloop.engine import DbNow
    from django_taskloop.models import Job

    client.force_login(User.objects.create_superuser("boss", "boss@example.com", "pw"))
    board = JobBoard.objects.create_board("builds")
    job = board.post("old", {})
    board.claim(job, "w1", expiry=60)
    Job.objects.filter(pk=job.pk).update(claim_expires_at=DbNow(-1), created_on=DbNow(-7200))
    page = client.get(reverse(URL)).content.decode()
    assert "<title>expired claim: 1</title>" in page and "<title>unclaimed: 0</title>" in page
    waits = re.findall(r'<th scope="row">latency</th><td class="num">([^<]*)</td>', page)
    assert waits == ["2 h"], waits


def test_a_bumped_loop_id_is_bumped_on_the_dashboard(client):
    client.force_login(User.objects.create_superuser("boss", "boss@example.com", "pw"))
    IntLoop.objects.add([1, 2, 3])
    IntLoop.objects.did([3])
    IntLoop.objects.bump([1])
    page = client.get(reverse(URL)).content.decode()
    assert "<title>bumped: 1</title>" in page and "<title>idle: 1</title>" in page
    assert "<title>new: 1</title>" in page


def test_the_table_of_queues_says_rate_failed_attempts_and_what_failed_for_good(client, queues):
    from django_taskloop.models import Failure
    from django_taskloop.models.operating import record_throughput
    from django_taskloop.stats import processed_last_hour

    client.force_login(User.objects.create_superuser("boss", "boss@example.com", "pw"))
    record_throughput("task", "emails", done=120, failed=2)
    for attempt in (1, 2):
        try:
            raise ConnectionError("smtp down")
        except ConnectionError as error:
            Failure.objects.record(
                kind="task", queue="emails", item=1, attempt=attempt, worker="w", error=error
            )
    assert processed_last_hour() == {("task", "emails"): (120, 2)}
    page = client.get(reverse(URL)).content.decode()
    row = page.split('data-queue-row="emails"', 1)[1].split("</tr>", 1)[0]
    cells = re.findall(r'<td class="num"[^>]*>(.*?)</td>', row, re.S)
    assert cells[1] == "2.0"  # done per minute over the last hour
    assert ">2</a>" in cells[2]  # failed attempts in the last hour, linked to them
    assert "1 buried" in cells[3]  # what failed for good: one task, whatever its attempts
    # The card says the same count for what it is.
    assert "2 failed attempts in the last hour" in page
    # The old address of the dashboard leads there.
    old = client.get("/admin/django_taskloop/jobboard/dashboard/")
    assert old.status_code == 302 and old["Location"] == reverse(URL)


def test_a_limited_tube_shows_what_runs_against_its_limit(client, queues):
    tube = Tube.objects.get(name="emails")
    tube.set_limit(2)
    tube.take_many(5, consumer="w")
    client.force_login(User.objects.create_superuser("boss", "boss@example.com", "pw"))
    table = client.get(reverse(URL)).content.decode().split('<table class="tl-queues">', 1)[1]
    assert '<span class="tl-state tl-taken">taken 2/2</span>' in table.split("</table>", 1)[0]
