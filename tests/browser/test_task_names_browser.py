"""A Django Tasks user's admin in a real browser: the queue by its Django name, its failures by
result, the backend's tubes labelled (issue 28, items 2 and 3). Screenshots under
``artifacts/screenshots/tasks-*.png``."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from django_taskloop.models import Tube
from tests import options_tasks as t
from tests.workers_util import add, run_workers

from .test_admin_browser import page, server, shot  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_a_django_tasks_queue_in_the_admin(page: Any) -> None:  # noqa: F811
    User.objects.create_superuser("admin", "admin@example.com", "correct horse")
    failing = t.always_fails.enqueue("card declined")
    run = run_workers(
        "--burst",
        "--only",
        "default",
        DJANGO_SETTINGS_MODULE="tests.workers_settings",
        TASKLOOP_OVERRIDES='{"POLL_MIN": 0.05}',
    )
    assert run.returncode == 0, run.stderr
    waiting = [add.enqueue(n, n) for n in range(3)]
    t.sync.enqueue(7)
    Tube.objects.create_tube("emails", "fifottl").put({"to": "a@example.com"})

    base = page.base_url
    page.goto(f"{base}/admin/login/?next=/admin/django_taskloop/dashboard/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", "correct horse")
    page.click('input[type="submit"]')
    page.wait_for_url("**/dashboard/")

    # One card for the queue, by its Django name; its tubes small at the bottom.
    card = page.locator('section[data-queue="default"]')
    assert card.count() == 1
    assert "Django Tasks queue" in card.inner_text()
    assert "internal tubes: tasks.default, tasks-keyed.default" in card.inner_text()
    assert page.locator('section[data-queue="tasks.default"]').count() == 0
    card.screenshot(path=str(shot.__globals__["SHOTS"] / "tasks-01-dashboard-card.png"))
    shot(page, "tasks-02-dashboard")
    # Its results, from the card's link.
    card.locator("a", has_text="results").click()
    page.wait_for_load_state()
    assert "/taskrecord/" in page.url and "queue=default" in page.url
    # Those a worker started, in the list; those that wait to start, above it.
    assert page.locator("#result_list tbody tr").count() == 2
    assert page.locator("table.tl-waiting tbody tr").count() == len(waiting)

    # Failures: three attempts of one result, each linking it.
    page.goto(f"{base}/admin/django_taskloop/failure/")
    shot(page, "tasks-03-failures")
    links = page.locator(f'#result_list a[href$="/taskrecord/{failing.id}/change/"]')
    assert links.count() == 3
    assert page.locator("#changelist-filter", has_text="default (Django Tasks)").count() == 1
    links.first.click()
    page.wait_for_load_state()
    assert failing.id in page.url
    shot(page, "tasks-04-result")

    # The tubes: the backend's are labelled, and a filter leaves them out.
    page.goto(f"{base}/admin/django_taskloop/tube/")
    assert "Django Tasks queue default" in page.inner_text("#result_list")
    shot(page, "tasks-05-tubes")
    page.goto(f"{base}/admin/django_taskloop/tube/?used_by=own")
    assert "tasks.default" not in page.inner_text("#result_list")
    page.goto(f"{base}/admin/django_taskloop/task/")
    shot(page, "tasks-06-tube-tasks")
    page.goto(f"{base}/admin/django_taskloop/")
    assert "Tube tasks" in page.inner_text("#content") and "Django task results" in page.inner_text(
        "#content"
    )
    shot(page, "tasks-07-app-index")
