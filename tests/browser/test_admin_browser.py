"""A real browser (Debian's chromium, driven by Playwright) operates the admin of a live server.

Run with ``pytest -m browser tests/browser``; it needs the ``playwright`` package and
``/usr/bin/chromium`` (``apt-get install chromium``; never ``playwright install``). Each page
is saved under ``artifacts/screenshots/`` for CI to keep.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connections

from django_taskloop.models import Job, JobBoard, Task, Tube
from tests.testapp.models import IntLoop

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

CHROMIUM = os.environ.get("TASKLOOP_CHROMIUM", "/usr/bin/chromium")
SHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """A live server of the test project on 127.0.0.1 (pytest-django's uses ``localhost``)."""
    from pytest_django.live_server_helper import LiveServer

    before = set(threading.enumerate())
    live = LiveServer("127.0.0.1")
    try:
        yield live.url
    finally:
        live.stop()
        # The server's request threads are daemons that close their database connection when
        # the browser's keep-alive socket closes: wait for them, or PostgreSQL refuses to drop
        # the test database while "another session" is still using it.
        deadline = time.monotonic() + 10
        for thread in set(threading.enumerate()) - before:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))


@pytest.fixture
def page(server: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:  # fail loudly: a skipped browser run would hide a broken admin
        pytest.fail("the browser tests need `pip install playwright` (and Debian's chromium)")
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: apt-get install -y chromium"
    # Playwright's sync API runs an event loop in this thread; the ORM calls of the test are
    # still plain synchronous code between page actions.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        tab = context.new_page()
        tab.set_default_timeout(20_000)
        tab.base_url = server  # type: ignore[attr-defined]
        try:
            yield tab
        finally:
            context.close()
            browser.close()
            # Inside sync_playwright() the ORM runs in the greenlet's own context, with a
            # connection of its own: close it here, where it is visible, or it outlives the
            # test (and PostgreSQL refuses to drop the test database).
            connections.close_all()


def shot(page: Any, name: str) -> None:
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def run_action(page: Any, action: str, *row_values: Any, **extra: str) -> str:
    """Tick the rows, pick ``action``, fill the action form's extra fields, press Go."""
    for value in row_values:
        page.check(f'input[name="_selected_action"][value="{value}"]')
    page.select_option('select[name="action"]', action)
    for name, value in extra.items():
        page.fill(f'[name="{name}"]', value)
    page.click('button[name="index"]')
    page.wait_for_load_state()
    return page.inner_text("ul.messagelist")


def row_of(page: Any, value: Any) -> Any:
    return page.locator(
        "#result_list tbody tr", has=page.locator(f'input[name="_selected_action"][value="{value}"]')
    )


def test_operate_the_queues_from_the_admin(page: Any) -> None:
    User.objects.create_superuser("admin", "admin@example.com", "correct horse")
    IntLoop.objects.add(range(1, 31), updated=True)
    IntLoop.objects.add(range(31, 36))
    IntLoop.objects.claim(3, lock_for=900)
    board = JobBoard.objects.create_board("builds")
    compile_job = board.post("compile", {"ref": "main"}, priority="HIGH")
    board.claim(compile_job, "worker-1", expiry=600)
    broken = board.post("deploy", {"env": "prod"})
    board.claim(broken, "worker-2")
    board.trash(broken, "worker-2")
    board.post("lint")
    tube = Tube.objects.create_tube("emails", "fifottl", ttr=300)
    for n in range(4):
        tube.put({"to": f"user{n}@example.com"}, pri=n)
    victim = tube.put({"to": "bounce@example.com"}, pri=9)
    tube.take(0, consumer="mailer-1")

    base = page.base_url
    # Log in.
    page.goto(f"{base}/admin/login/?next=/admin/django_taskloop/jobboard/dashboard/")
    shot(page, "01-login")
    page.fill("#id_username", "admin")
    page.fill("#id_password", "correct horse")
    page.click('input[type="submit"]')
    page.wait_for_url("**/dashboard/")

    # The dashboard: one card per queue, charts drawn on the server.
    assert page.locator('section[data-queue="int loops"]').count() == 1
    assert page.locator('section[data-queue="builds"]').count() == 1
    assert page.locator('section[data-queue="emails"]').count() == 1
    assert page.locator("svg.tl-chart").count() >= 4
    assert page.locator("table.tl-queues tbody tr").count() >= 3  # the table of queues
    shot(page, "02-dashboard")

    # Bump a loop item: it becomes "bumped", first in line.
    page.goto(f"{base}/admin/testapp/intloop/")
    shot(page, "03-loop-list")
    message = run_action(page, "bump_now", 7)
    assert "Bumped 1 of 1" in message
    assert row_of(page, 7).locator(".tl-state").inner_text() == "bumped"
    shot(page, "04-loop-bumped")
    assert IntLoop.objects.claim(1, lock_for=60) == [7]
    page.goto(f"{base}/admin/testapp/intloop/stats/")
    assert page.locator("svg.tl-chart").count() == 2
    shot(page, "05-loop-stats")

    # Bury a task, then kick it back.
    page.goto(f"{base}/admin/django_taskloop/task/?tube__id__exact={tube.pk}")
    shot(page, "06-task-list")
    assert "Buried 1 task(s)." in run_action(page, "bury_tasks", victim.pk)
    assert row_of(page, victim.pk).locator(".tl-state").inner_text() == "buried"
    shot(page, "07-task-buried")
    assert "Kicked 1 task(s)." in run_action(page, "kick_tasks", victim.pk)
    assert row_of(page, victim.pk).locator(".tl-state").inner_text() == "ready"
    shot(page, "08-task-kicked")
    assert Task.objects.get(pk=victim.pk).state == "r"
    page.goto(f"{base}/admin/django_taskloop/tube/{tube.pk}/stats/")
    assert "calls.kick" in page.inner_text("table.tl-stats")
    shot(page, "09-tube-stats")

    # Abandon a claimed job.
    page.goto(f"{base}/admin/django_taskloop/job/")
    shot(page, "10-job-list")
    assert "Abandoned 1 job(s)." in run_action(page, "abandon_jobs", compile_job.pk)
    assert row_of(page, compile_job.pk).locator(".tl-state").inner_text() == "unclaimed"
    shot(page, "11-job-abandoned")
    assert board.find_owner(compile_job) is None

    # Re-post a trashed job from the trash.
    page.click("text=Trash")
    page.wait_for_url("**state=trashed**")
    assert row_of(page, broken.pk).locator(".tl-state").inner_text() == "trashed"
    shot(page, "12-trash")
    assert "Re-posted 1 job(s)." in run_action(page, "repost_jobs", broken.pk)
    page.goto(f"{base}/admin/django_taskloop/job/?state=unclaimed")
    reposted = Job.objects.filter(name="deploy", trashed=False).get()
    assert row_of(page, reposted.pk).locator(".tl-state").inner_text() == "unclaimed"
    assert reposted.details == {"env": "prod"}
    shot(page, "13-job-reposted")
    page.goto(f"{base}/admin/django_taskloop/jobboard/{board.pk}/stats/")
    shot(page, "14-board-stats")
    page.goto(f"{base}/admin/django_taskloop/")
    shot(page, "15-app-index")

    # Editing a claimed job's details is refused with a clear message.
    board.claim(reposted, "worker-3")
    page.goto(f"{base}/admin/django_taskloop/job/{reposted.pk}/change/")
    page.fill('textarea[name="details"]', '{"env": "staging"}')
    page.click('input[name="_save"]')
    page.wait_for_load_state()
    assert "cannot change" in page.inner_text("ul.errorlist.nonfield")
    shot(page, "16-job-edit-refused")
    assert Job.objects.get(pk=reposted.pk).details == {"env": "prod"}
    page.goto(f"{base}/admin/django_taskloop/tube/")
    shot(page, "17-tube-list")


def _burst(*names: str) -> None:
    from tests.workers_util import run_workers

    args = [arg for name in names for arg in ("--only", name)]
    done = run_workers(
        "--burst",
        *args,
        DJANGO_SETTINGS_MODULE="tests.workers_settings",
        TASKLOOP_OVERRIDES='{"RETRY_BACKOFF": 0.2, "MAX_ATTEMPTS": 3}',
    )
    assert done.returncode == 0, done.stderr


def test_an_operator_finds_why_a_task_failed_pauses_retries_and_resumes(page: Any) -> None:
    """Issue 14's story at 1280 px: a task fails three times and is buried; the operator finds
    it from the dashboard, reads the traceback, pauses the tube, retries that one task,
    resumes, and watches throughput move."""
    from tests.testapp.models import WorkLog

    page.set_viewport_size({"width": 1280, "height": 900})
    User.objects.create_superuser("admin", "admin@example.com", "correct horse")
    # Realistic volume beside the story: a big loop (its counts are estimates or caps).
    IntLoop.objects.add(range(1, 200_001))
    tube = Tube.objects.create_tube("w-flaky", "fifottl")
    doomed = tube.put({"to": "a@example.com"})
    for n in range(20):
        tube.put({"to": f"user{n}@example.com"}, pri=5)
    WorkLog.objects.create(kind="fixed", key="later", pid=0, at=0)  # the first 20 go through
    _burst("w-flaky")
    WorkLog.objects.filter(kind="fixed").delete()  # the mail server goes down
    assert not Task.objects.filter(pk=doomed.pk).exists()  # sent while the server was up
    doomed = tube.put({"to": "ceo@example.com"})
    for _ in range(20):  # retried with a growing delay, then buried after 3 attempts
        _burst("w-flaky")
        if tube.peek(doomed.id).state == "!":
            break
        time.sleep(0.3)
    assert tube.peek(doomed.id).state == "!"

    base = page.base_url
    page.goto(f"{base}/admin/login/?next=/admin/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", "correct horse")
    page.click('input[type="submit"]')
    page.wait_for_url("**/admin/")
    # The admin index links the dashboard.
    page.click("text=Task loop dashboard")
    page.wait_for_url("**/dashboard/")
    card = page.locator('section[data-queue="w-flaky"]')
    assert "3 failed attempts in the last hour" in card.inner_text()
    assert "Processed per minute, last hour" in page.content()
    loop_card = page.locator('section[data-queue="int loops"]').inner_text()
    assert "≥" in loop_card or "~" in loop_card  # capped counts say so
    shot(page, "20-operator-dashboard")

    # From the dashboard to the failures of that tube, then to the task.
    card.locator("a.tl-failures").click()
    page.wait_for_url("**/failure/**")
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 3
    assert "smtp.example.com refused" in page.inner_text("#result_list")
    shot(page, "21-failures")
    rows.first.locator(f'a:text-is("{doomed.id}")').click()
    page.wait_for_url(f"**/task/{doomed.id}/change/")
    assert f"task {doomed.id} (buried)" in page.inner_text("#content")
    assert "Traceback (most recent call last)" in page.inner_text("pre.tl-traceback")
    assert "ConnectionError" in page.inner_text("table.tl-attempts")
    shot(page, "22-task-traceback")

    # Pause the tube from the dashboard, retry the one task, see that nothing takes it.
    page.goto(f"{base}/admin/django_taskloop/jobboard/dashboard/")
    page.locator('section[data-queue="w-flaky"] button[value="pause"]').click()
    page.wait_for_load_state()
    assert "paused" in page.locator('section[data-queue="w-flaky"] h2').inner_text()
    shot(page, "23-tube-paused")
    WorkLog.objects.create(kind="fixed", key="now", pid=0, at=0)  # the mail server is back
    page.goto(f"{base}/admin/django_taskloop/task/{doomed.id}/change/")
    page.click("text=Retry: kick this task")
    page.wait_for_load_state()
    assert "done" in page.inner_text("ul.messagelist")
    assert tube.peek(doomed.id).state == "r"
    _burst("w-flaky")
    assert tube.peek(doomed.id).state == "r"  # paused: no worker took it
    shot(page, "24-task-retried-while-paused")

    # Resume; the worker sends it; throughput moves.
    page.goto(f"{base}/admin/django_taskloop/jobboard/dashboard/")
    page.locator('section[data-queue="w-flaky"] button[value="resume"]').click()
    page.wait_for_load_state()
    _burst("w-flaky")
    assert not Task.objects.filter(pk=doomed.pk).exists()
    page.reload()
    tips = page.eval_on_selector_all("svg.tl-chart rect title", "els => els.map(e => e.textContent)")
    assert any(" done" in tip and not tip.split(": ")[1].startswith("0 done") for tip in tips)
    shot(page, "25-throughput-after-resume")
    for n in range(30):
        tube.put({"to": f"reader{n}@example.com", "subject": "Your weekly digest of new articles"}, pri=n % 3)
    tube.take_many(3, consumer="mailer-7")
    page.goto(f"{base}/admin/django_taskloop/task/?tube__id__exact={tube.pk}")
    # Nine columns at 1280 px: the data column keeps room.
    data = page.locator("#result_list td.field-data_preview").first.bounding_box()
    table = page.locator("#changelist .results").bounding_box()
    assert data["width"] >= 140 and data["x"] + data["width"] <= table["x"] + table["width"] + 1
    shot(page, "26-task-list-1280")
    page.goto(f"{base}/admin/testapp/intloop/")
    assert "int loops" in page.inner_text("p.paginator")
    shot(page, "27-big-loop-list")


def test_an_operator_sees_expired_work_as_expired_not_ready(page: Any) -> None:
    """Issue 26.5: a tube task past its ttl, and a Django Task result past its ttl, read
    "expired" / "Failed (ttl ran out)" in the admin, never "ready"."""
    import datetime as dt

    from django_taskloop.engine import DbNow, db_now
    from tests import options_tasks

    User.objects.create_superuser("admin", "admin@example.com", "correct horse")
    tube = Tube.objects.create_tube("digests", "fifottl")
    stale = tube.put({"to": "late@example.com"}, ttl=60)
    fresh = tube.put({"to": "soon@example.com"}, ttl=600)
    Task.objects.filter(pk=stale.id).update(ttl_at=DbNow(-5))
    late = options_tasks.must_start_soon.enqueue("late")
    # No worker has started it: its tube task carries the call (one-row enqueue).
    Task.objects.filter(pk=int(late.id.split("-")[0])).update(created=db_now() - dt.timedelta(seconds=61))

    base = page.base_url
    page.goto(f"{base}/admin/login/?next=/admin/django_taskloop/task/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", "correct horse")
    page.click('input[type="submit"]')
    page.wait_for_url("**/task/")
    shot(page, "30-tasks-expired")
    assert "expired" in row_of(page, stale.id).inner_text()
    assert "ttl ran out" in row_of(page, stale.id).inner_text()
    assert "ready" in row_of(page, fresh.id).inner_text()
    page.goto(f"{base}/admin/django_taskloop/task/?state=expired")
    shot(page, "31-tasks-filter-expired")
    assert page.locator("#result_list tbody tr").count() == 1
    page.goto(f"{base}/admin/django_taskloop/taskrecord/")
    shot(page, "32-results-expired")
    assert "Failed (ttl ran out)" in page.inner_text("table.tl-waiting")
