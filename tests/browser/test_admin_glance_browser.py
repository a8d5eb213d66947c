"""The admin at a glance (issue 29.3): at 1280×800 with the sidebar open, every list of ours
shows its key columns without scrolling, and the dashboard is one overview whose charts use
their cards' width. Realistic data: thousands of rows, failures, held work, a trashed job that
was re-posted. Each page is saved under ``artifacts/screenshots/`` (``glance-*.png``).

Run with ``pytest -m browser tests/browser`` (Playwright and Debian's chromium).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.contrib.auth.models import User

from django_taskloop.engine import db_now
from django_taskloop.models import Failure, JobBoard, Tube, WorkerProcess
from django_taskloop.models.operating import Throughput, record_throughput
from django_taskloop.models.schedules import Schedule
from tests.testapp.models import IntLoop

from . import test_admin_browser as browser

# The live server and the browser's tab of the admin's browser test.
server = browser.server
page = browser.page


def shot(page: Any, name: str) -> None:
    """Save what the window shows (1280×800, no scrolling): what an operator sees first."""
    page.screenshot(path=str(browser.SHOTS / f"{name}.png"))


pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

#: The admin's lists, each with the columns an operator reads (their ``th`` classes).
LISTS = {
    "failures": ("failure/", ("failed_at", "where", "item_link", "attempt", "error_name")),
    "jobs": (
        "job/",
        ("name", "job_state", "board_name", "owner_display", "age", "modified", "short_uuid"),
    ),
    "trash": ("job/?state=trashed", ("name", "job_state", "age", "modified", "short_uuid")),
    "tasks": (
        "task/",
        ("id", "task_state", "tube_name", "pri", "attempts", "deadline", "age", "data_preview"),
    ),
    "tubes": ("tube/", ("tube_name", "running", "type", "limit", "rate_text", "links", "created_at")),
    "boards": ("jobboard/", ("name", "running", "live_jobs", "links", "created")),
    "results": ("taskrecord/", ("short_id", "task_name", "queue_name", "status_badge", "enqueued")),
    "workers": ("workerprocess/", ("identity", "host", "pid", "up_for", "last_beat", "serves", "holds")),
    "consumed": ("consumedjob/", ("name", "board", "consumed_by", "consumed", "created", "short_uuid")),
    "entities": ("boardentity/", ("name", "kind", "board", "seen", "registered")),
    "schedules": ("schedule/", ("name", "kind", "cron_cell", "next_run", "last_run", "state")),
}

REFUSED = (
    "[Errno 111] Connection refused: could not reach the artifact registry at "
    "registry.internal.example.com:5000 after 3 retries; the deploy step gave up and left "
    "release 2026.11.26-4 half rolled out on eu-west-1 (3 of 8 hosts)"
)


def _fail(kind: str, queue: str, item: Any, attempts: int, error: BaseException) -> None:
    for attempt in range(1, attempts + 1):
        try:
            raise error
        except type(error) as raised:
            Failure.objects.record(
                kind=kind, queue=queue, item=item, attempt=attempt, worker="web-2:4711", error=raised
            )


def _throughput_of_a_day() -> None:
    """A day of work in the throughput rows (what workers record each minute)."""
    now = db_now().replace(second=0, microsecond=0)
    rows = [
        Throughput(
            kind="task",
            queue="emails",
            minute=now - dt.timedelta(minutes=m),
            done=40 + (m * 7) % 60,
            failed=(m % 13 == 0) * 3,
            given_back=(m % 29 == 0),
        )
        for m in range(1, 24 * 60, 3)
    ]
    Throughput.objects.bulk_create(rows)
    record_throughput("job", "builds", done=12, failed=2)


def realistic_data(settings: Any) -> dict[str, Any]:
    """Thousands of rows on every queue, failures, held work, a trashed job re-posted."""
    settings.TASKLOOP = {"JOB_HISTORY_RETENTION": 3600}  # consumed jobs are kept an hour
    User.objects.create_superuser("admin", "admin@example.com", "correct horse")
    IntLoop.objects.add(range(1, 5001), updated=True)
    IntLoop.objects.bump(list(range(10, 40)))
    IntLoop.objects.claim(25, lock_for=900)
    board = JobBoard.objects.create_board("builds")
    for n in range(1500):
        board.post(f"compile-{n}", {"ref": f"feature/{n}", "targets": ["linux", "mac"]})
    board.claim_many("ci-runner-7", 30, expiry=600)
    broken = board.post("deploy-production-eu-west-1", {"env": "prod", "release": "2026.11.26-4"})
    board.claim(broken, "ci-runner-3")
    _fail("job", "builds", broken.uuid, 3, ConnectionRefusedError(REFUSED))
    board.trash(broken, "ci-runner-3")
    reposted = board.repost(broken)
    lost = board.post("publish-docs", {"site": "docs"})
    board.claim(lost, "ci-runner-4")
    _fail("job", "builds", lost.uuid, 1, TimeoutError("the docs host did not answer in 30 s"))
    board.trash(lost, "ci-runner-4")
    consumed = board.post("lint", {})
    board.claim(consumed, "ci-runner-1")
    board.consume(consumed, "ci-runner-1")
    board.register_entity("worker", "ci-runner-7", {"arch": "x86_64"})
    JobBoard.objects.create_board("nightly").pause()
    Schedule.objects.create(
        name="nightly-digest",
        kind="task",
        cron="0 3 * * *",
        target="tests.workers_util.add",
        next_run_at=db_now() + dt.timedelta(hours=5),
        last_run_at=db_now() - dt.timedelta(hours=19),
        runs=12,
    )
    # At most 12 at once (an SMTP relay's connections) and 600 a minute (its quota): the
    # dashboard reads "taken 8/12" and "rate 12 of 600/m".
    emails = Tube.objects.create_tube("emails", "fifottl", ttr=300, limit=12, rate="600/m")
    emails.put_many(
        [
            {"to": f"reader{n}@example.com", "subject": "Your weekly digest of new articles"}
            for n in range(3000)
        ]
    )
    held = emails.take_many(12, consumer="mailer-1")
    for task in held[:4]:
        emails.release(task.id, consumer="mailer-1")
        _fail(
            "task",
            "emails",
            task.id,
            3,
            ConnectionRefusedError("smtp.example.com:587 refused the connection"),
        )
        emails.bury(task.id)
    thumbnails = Tube.objects.create_tube("thumbnails", "utube", key_limit=3, key_rate="10/m")
    thumbnails.put_many([{"image": f"img/{n}.png"} for n in range(200)])
    _django_tasks()
    _throughput_of_a_day()
    WorkerProcess.objects.beat(
        "web-2:4711", host="web-2", pid=4711, queues=["task:emails", "job:builds"], holding={"task:emails": 8}
    )
    WorkerProcess.objects.beat(
        "web-3:5120",
        host="web-3",
        pid=5120,
        queues=["loop:testapp.intloop"],
        holding={"loop:testapp.intloop": 25},
    )
    return {"board": board, "broken": broken, "reposted": reposted}


def _django_tasks() -> None:
    """Results of Django Tasks: done, failed, and waiting to start."""
    from tests import options_tasks as t
    from tests.test_admin_results import run_all
    from tests.workers_util import add

    for n in range(6):
        add.enqueue(n, b=3)
    t.always_fails.using(backoff=0).enqueue("disk full on /var/spool")
    run_all()
    t.refresh.using(queue_name="slow").enqueue("later")


def log_in(page: Any, path: str = "/admin/") -> None:
    page.goto(f"{page.base_url}/admin/login/?next={path}")
    page.fill("#id_username", "admin")
    page.fill("#id_password", "correct horse")
    page.click('input[type="submit"]')
    page.wait_for_load_state()


def outside(page: Any, columns: tuple[str, ...]) -> list[str]:
    """Return the key column headers that lie (partly) outside the visible table area."""
    visible = page.locator("#changelist .results").bounding_box()
    right = min(visible["x"] + visible["width"], page.viewport_size["width"])
    lost = []
    for column in columns:
        box = page.locator(f"#result_list thead th.column-{column}").bounding_box()
        if box is None or box["x"] < visible["x"] - 1 or box["x"] + box["width"] > right + 1:
            lost.append(column)
    return lost


def test_every_list_shows_its_key_columns_at_1280(page: Any, settings: Any) -> None:
    realistic_data(settings)
    page.set_viewport_size({"width": 1280, "height": 800})
    log_in(page)
    lost = {}
    for name, (path, columns) in LISTS.items():
        page.goto(f"{page.base_url}/admin/django_taskloop/{path}")
        shot(page, f"glance-{name}")
        assert page.locator("#nav-sidebar").is_visible(), name  # the sidebar is open
        assert page.locator("#result_list").count() == 1, name
        # Nothing to scroll sideways: the page is as wide as the window.
        wide = page.evaluate("document.documentElement.scrollWidth") > 1280
        if outside(page, columns) or wide:
            lost[name] = (outside(page, columns), wide)
    assert lost == {}
    # The tube list's per-key limit and rate each read on one line of their own (a key limit
    # beside the running limit, '-; 3 per key', wrapped in the narrow column).
    page.goto(f"{page.base_url}/admin/django_taskloop/tube/")
    for cell in ("limit", "rate_text"):
        per_key = page.locator(f"td.field-{cell} .tl-per-key")
        assert per_key.count() == 1, cell
        box = per_key.bounding_box()
        assert box is not None and box["height"] < 20, (cell, box)  # one line of 11 px text
    page.goto(f"{page.base_url}/admin/testapp/intloop/")
    shot(page, "glance-loop")
    assert outside(page, ("pk_display", "loop_state", "updated", "lock_until_at", "lock_ends")) == []


def test_failure_times_read_to_the_second_and_how_long_ago(page: Any, settings: Any) -> None:
    realistic_data(settings)
    page.set_viewport_size({"width": 1280, "height": 800})
    log_in(page, "/admin/django_taskloop/failure/")
    cell = page.locator("#result_list .field-failed_at").first.inner_text()
    assert ":" in cell and cell.count(":") == 2, cell  # hh:mm:ss
    assert "ago" in cell or "just now" in cell, cell


def test_the_dashboard_is_one_overview_with_charts_as_wide_as_their_cards(page: Any, settings: Any) -> None:
    realistic_data(settings)
    page.set_viewport_size({"width": 1280, "height": 800})
    log_in(page, "/admin/django_taskloop/dashboard/")
    shot(page, "glance-dashboard")
    page.screenshot(path=str(browser.SHOTS / "glance-dashboard-full.png"), full_page=True)
    table = page.locator("table.tl-queues")
    assert table.count() == 1
    text = table.inner_text()
    for queue in ("builds", "emails", "thumbnails", "int loops", "nightly"):
        assert queue in text, queue
    assert "taken 8/12" in text, text  # the emails tube's running limit, beside what runs
    assert "rate 12 of 600/m" in text, text  # its rate, beside what its window holds
    # The table comes before the charts.
    charts = page.locator("svg.tl-chart")
    assert charts.count() >= 2
    assert table.bounding_box()["y"] < charts.first.bounding_box()["y"]
    for index in range(charts.count()):
        chart = charts.nth(index)
        card = chart.locator("xpath=ancestor::*[contains(@class, 'tl-card')][1]")
        inner = card.evaluate("e => e.clientWidth - parseFloat(getComputedStyle(e).paddingLeft) * 2")
        assert abs(chart.bounding_box()["width"] - inner) <= 4, (index, chart.bounding_box(), inner)
    # The sidebar highlights no model: the dashboard is the app's, not the job boards'.
    assert page.locator("#nav-sidebar tr.current-model").count() == 0
    # Breadcrumbs drawn as this Django's admin draws them, so that its style applies.
    crumbs = page.locator(".breadcrumbs")
    assert crumbs.locator("a").count() == 2 and "Dashboard" in crumbs.inner_text()
    colour = crumbs.evaluate("e => getComputedStyle(e).backgroundColor")
    assert colour not in ("rgba(0, 0, 0, 0)", "transparent"), colour
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    # The old URL still leads there.
    page.goto(f"{page.base_url}/admin/django_taskloop/jobboard/dashboard/")
    assert page.url.endswith("/admin/django_taskloop/dashboard/")


def test_a_trashed_jobs_page_is_read_only_and_links_its_new_job(page: Any, settings: Any) -> None:
    data = realistic_data(settings)
    page.set_viewport_size({"width": 1280, "height": 800})
    broken, reposted = data["broken"], data["reposted"]
    log_in(page, f"/admin/django_taskloop/job/{broken.pk}/change/")
    shot(page, "glance-trashed-job")
    assert page.locator('textarea[name="details"]').count() == 0
    assert page.locator('select[name="priority"]').count() == 0
    assert page.locator('input[name="_save"]').count() == 0
    page.click(f"text={reposted.uuid}")
    page.wait_for_url(f"**/job/{reposted.pk}/change/")
