"""Admin of Lockable models (the demo's Article): lock columns, filters, release action."""

from __future__ import annotations

import pytest
from demo.models import Article
from django.contrib.auth.models import Permission, User
from django.urls import reverse

from django_taskloop.admin import EstimatedCountPaginator

pytestmark = pytest.mark.django_db

URL = "admin:demo_article_changelist"


@pytest.fixture
def viewer(client):
    user = User.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_article"))
    client.force_login(user)
    return client


def articles(n: int = 6) -> list[Article]:
    made = Article.objects.bulk_create([Article(title=f"article {i}") for i in range(n)])
    Article.objects.filter(pk__in=[a.pk for a in made[:2]]).claim("ed", 2, lock_for=600)
    Article.objects.filter(pk=made[2].pk).claim("bob", 1, lock_for=0.001)
    return made


def test_changelist_shows_lock_state_owner_and_deadline(boss):
    articles()
    page = boss.get(reverse(URL)).content.decode()
    assert page.count('class="tl-state tl-locked"') == 2
    assert page.count('class="tl-state tl-free"') == 3
    assert page.count('class="tl-state tl-expired"') == 1
    assert "ed" in page and "bob" in page
    assert 'class="tl-future">in 9 min' in page or 'class="tl-future">in 10 min' in page
    assert "django_taskloop/admin.css" in page


@pytest.mark.parametrize("value, titles", [("locked", {0, 1}), ("expired", {2}), ("free", {2, 3, 4, 5})])
def test_lock_filter(boss, value, titles):
    articles()
    page = boss.get(reverse(URL), {"lock": value}).content.decode()
    shown = {i for i in range(6) if f">article {i}<" in page}
    assert shown == titles


def test_lock_expiry_range_filter(boss):
    articles()
    response = boss.get(
        reverse(URL),
        {"lock_expires_at__range__gte_0": "2000-01-01", "lock_expires_at__range__gte_1": "00:00:00"},
    )
    page = response.content.decode()
    assert response.status_code == 200
    assert {i for i in range(6) if f">article {i}<" in page} == {0, 1, 2}


def test_release_action_goes_through_the_queryset_api(boss):
    made = articles()
    response = boss.post(
        reverse(URL),
        {"action": "release_locks", "_selected_action": [made[0].pk, made[2].pk, made[4].pk]},
        follow=True,
    )
    assert "Released 2 lock(s)." in response.content.decode()
    assert set(Article.objects.filter(locked_by__isnull=False).values_list("pk", flat=True)) == {made[1].pk}


def test_delete_selected_is_not_offered(boss):
    articles()
    page = boss.get(reverse(URL)).content.decode()
    assert 'value="release_locks"' in page
    assert 'value="delete_selected"' not in page


def test_viewer_without_change_permission_sees_no_actions_and_cannot_release(viewer):
    made = articles()
    page = viewer.get(reverse(URL)).content.decode()
    assert "release_locks" not in page
    assert 'name="_selected_action"' not in page
    viewer.post(reverse(URL), {"action": "release_locks", "_selected_action": [made[0].pk]})
    assert Article.objects.filter(pk=made[0].pk, locked_by="ed").exists()


def test_paginator_caps_filtered_counts_and_counts_small_tables_exactly():
    Article.objects.bulk_create([Article(title=str(i)) for i in range(30)])
    small = EstimatedCountPaginator(Article.objects.order_by("pk"), 10)
    assert small.count == 30 and small.count_is_exact

    class Capped(EstimatedCountPaginator):
        exact_limit = 12

    filtered = Capped(Article.objects.filter(reviewed=False).order_by("pk"), 10)
    assert filtered.count == 13
    assert not filtered.count_is_exact and not filtered.count_is_estimate
    # Unfiltered beyond the cap: the statistics' estimate where the database keeps one, but
    # never fewer rows than were seen.
    unfiltered = Capped(Article.objects.order_by("pk"), 10)
    assert unfiltered.count >= 13
    assert not unfiltered.count_is_exact
    assert [a.title for a in unfiltered.page(3).object_list] == [str(i) for i in range(20, 30)]


def test_the_admin_base_is_a_model_admin_and_its_old_mixin_name_still_works():
    """``TaskloopModelAdmin`` is a ``ModelAdmin`` (it was a mixin, ``TaskloopAdminMixin``): an
    admin written against the mixin, as ``(TaskloopAdminMixin, admin.ModelAdmin)``, still builds
    and gets its pagination and clock."""
    from django.contrib import admin

    from django_taskloop.admin import LockableAdmin, TaskloopAdminMixin
    from django_taskloop.admin.base import TaskloopModelAdmin

    assert issubclass(TaskloopModelAdmin, admin.ModelAdmin)
    assert issubclass(LockableAdmin, TaskloopModelAdmin)

    class OldStyle(TaskloopAdminMixin, admin.ModelAdmin):
        pass

    built = OldStyle(Article, admin.AdminSite())
    assert built.paginator is EstimatedCountPaginator and callable(built.db_now)
