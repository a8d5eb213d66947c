"""What keeps the admin fast at millions of rows: no full COUNT(*), index-ordered lists."""

from __future__ import annotations

import re

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.db import connection
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_taskloop.admin.paginator import EstimatedCountPaginator
from django_taskloop.models import Task, Tube
from tests.explain import assert_ordered_by_index
from tests.testapp.models import IntLoop

pytestmark = pytest.mark.django_db


@pytest.fixture
def small_cap(monkeypatch):
    monkeypatch.setattr(EstimatedCountPaginator, "exact_limit", 20)


def fill() -> Tube:
    IntLoop.objects.add(range(1, 201))
    IntLoop.objects.bump(range(1, 11), lock_for=100)
    tube = Tube.objects.create_tube("big", "fifottl")
    Task.objects.bulk_create([Task(tube=tube, data={"n": n}, pri=n % 3) for n in range(200)])
    return tube


def counts(queries) -> list[str]:
    return [q["sql"] for q in queries if re.search(r"\bCOUNT\(", q["sql"], re.I)]


@pytest.mark.parametrize(
    "url, params",
    [
        ("admin:testapp_intloop_changelist", {}),
        ("admin:testapp_intloop_changelist", {"state": "new"}),
        ("admin:testapp_intloop_changelist", {"p": "3"}),
        ("admin:django_taskloop_task_changelist", {}),
        ("admin:django_taskloop_task_changelist", {"state": "ready"}),
    ],
)
def test_change_lists_never_count_a_whole_table(boss, small_cap, url, params):
    fill()
    with CaptureQueriesContext(connection) as queries:
        response = boss.get(reverse(url), params)
    assert response.status_code == 200
    for sql in counts(queries):
        # Every count of the big tables stops early (LIMIT in a subquery).
        if "testapp_intloop" in sql or "taskloop_task" in sql:
            assert "LIMIT 21" in sql, sql
    page = response.content.decode()
    assert "counting stops there" in page or "estimate from the table statistics" in page
    # Beyond the counted rows, pages can still be reached.
    assert 'name="_selected_action"' in page


def test_show_facets_is_off(boss):
    fill()
    page = boss.get(reverse("admin:testapp_intloop_changelist"), {"_facets": "True"}).content.decode()
    assert "Show counts" not in page and "Hide counts" not in page


@pytest.mark.parametrize("model", [IntLoop, Task])
def test_default_list_order_reads_an_index(rf: RequestFactory, model):
    fill()
    model_admin = admin.site._registry[model]
    request = rf.get("/")
    request.user = User.objects.create_superuser("x", "x@example.com", "pw")
    changelist = model_admin.get_changelist_instance(request)
    assert_ordered_by_index(changelist.queryset[:50])


def test_sorting_is_offered_on_indexed_columns_only(boss):
    fill()
    page = boss.get(reverse("admin:testapp_intloop_changelist")).content.decode()
    # Sortable headers carry a link with ?o=; "last updated" and "since updated" have none.
    sortable = re.findall(r'<th scope="col" class="sortable[^"]*column-([a-z_]+)', page)
    assert set(sortable) == {"pk_display", "lock_until_at", "lock_ends"}


@pytest.mark.parametrize("o", ["5", "-5"])
def test_sort_by_lock_until_reads_the_claim_index(rf: RequestFactory, o):
    fill()
    model_admin = admin.site._registry[IntLoop]
    request = rf.get("/", {"o": o})
    request.user = User.objects.create_superuser("x", "x@example.com", "pw")
    changelist = model_admin.get_changelist_instance(request)
    rows = list(changelist.queryset.values_list("lock_until", flat=True)[:300])
    locked = [value for value in rows if value is not None]
    assert locked == sorted(locked, reverse=o.startswith("-"))
    assert_ordered_by_index(changelist.queryset[:50])
