"""Admin of task loops: auto-registration, states, filters, doloop's verbs as actions, stats."""

from __future__ import annotations

import uuid

import pytest
from demo.admin import ArticleLoopAdmin
from demo.models import ArticleLoop, FeedLoop
from django.contrib import admin
from django.contrib.auth.models import Permission, User
from django.urls import reverse

from django_taskloop.admin import TaskLoopAdmin, register_loops
from django_taskloop.admin.loops import loop_models
from tests.testapp.models import IntLoop, StrLoop, Thing, ThingLoop, UuidLoop

pytestmark = pytest.mark.django_db

LIST = "admin:testapp_intloop_changelist"
STATS = "admin:testapp_intloop_stats"


@pytest.fixture
def viewer(client):
    user = User.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_intloop"))
    client.force_login(user)
    return client


def populate() -> None:
    """Ids 1-3 new, 4-6 idle, 7-8 locked, 9-10 bumped."""
    IntLoop.objects.add(range(1, 4))
    IntLoop.objects.add(range(4, 11), updated=True)
    IntLoop.objects.filter(pk__in=[7, 8]).bump([7, 8], lock_for=600)
    IntLoop.objects.bump([9, 10], lock_for=-5)


def shown_ids(page: str) -> set[int]:
    return {i for i in range(1, 11) if f'name="_selected_action" value="{i}"' in page}


def post_action(client, action: str, ids):
    return client.post(reverse(LIST), {"action": action, "_selected_action": list(ids)}, follow=True)


def test_every_loop_is_registered_with_the_loop_admin(client):
    client.get("/admin/")  # builds the site's URLs: every loop is registered by then
    assert set(loop_models()) >= {IntLoop, StrLoop, UuidLoop, ThingLoop, ArticleLoop, FeedLoop}
    for model in loop_models():
        assert isinstance(admin.site._registry[model], TaskLoopAdmin), model
    # The demo registers its own admin for ArticleLoop, after django_taskloop's admin ran.
    assert type(admin.site._registry[ArticleLoop]) is ArticleLoopAdmin
    assert type(admin.site._registry[FeedLoop]) is TaskLoopAdmin
    # Idempotent: a second call registers nothing and raises nothing.
    assert register_loops() == []


def test_a_projects_own_admin_is_respected():
    site = admin.AdminSite(name="custom")

    class Mine(TaskLoopAdmin):
        list_per_page = 7

    site.register(IntLoop, Mine)
    registered = register_loops(site)
    assert IntLoop not in registered
    assert type(site._registry[IntLoop]) is Mine
    assert StrLoop in registered


def test_changelist_shows_states_and_deadlines(boss):
    populate()
    page = boss.get(reverse(LIST)).content.decode()
    assert shown_ids(page) == set(range(1, 11))
    for state, n in (("new", 3), ("idle", 3), ("locked", 2), ("bumped", 2)):
        assert page.count(f'class="tl-state tl-{state}"') == n, state
    assert page.count('class="tl-future">in 9 min') + page.count('class="tl-future">in 10 min') == 2
    assert page.count('class="tl-past">') == 2
    assert reverse(STATS) in page
    # Newest ids first: the primary key index, read backwards.
    assert page.index('value="10"') < page.index('value="1"')


@pytest.mark.parametrize(
    "state, ids", [("new", {1, 2, 3}), ("idle", {4, 5, 6}), ("locked", {7, 8}), ("bumped", {9, 10})]
)
def test_state_filter(boss, state, ids):
    populate()
    assert shown_ids(boss.get(reverse(LIST), {"state": state}).content.decode()) == ids


def test_date_range_filters(boss):
    populate()
    after = {"lock_until__range__gte_0": "2000-01-01", "lock_until__range__gte_1": "00:00:00"}
    assert shown_ids(boss.get(reverse(LIST), after).content.decode()) == {7, 8, 9, 10}
    before = {"last_updated__range__lte_0": "2000-01-01", "last_updated__range__lte_1": "00:00:00"}
    assert shown_ids(boss.get(reverse(LIST), before).content.decode()) == set()
    since = {"last_updated__range__gte_0": "2000-01-01", "last_updated__range__gte_1": "00:00:00"}
    assert shown_ids(boss.get(reverse(LIST), since).content.decode()) == set(range(4, 11))


def test_search_by_id(boss):
    populate()
    assert shown_ids(boss.get(reverse(LIST), {"q": "7"}).content.decode()) == {7}
    assert shown_ids(boss.get(reverse(LIST), {"q": "not-a-number"}).content.decode()) == set()


def test_search_by_uuid_and_string_ids(boss):
    key = uuid.uuid4()
    UuidLoop.objects.add([key, uuid.uuid4()])
    page = boss.get(reverse("admin:testapp_uuidloop_changelist"), {"q": str(key)}).content.decode()
    assert page.count('name="_selected_action"') == 1 and str(key) in page
    StrLoop.objects.add(["alpha", "beta"])
    page = boss.get(reverse("admin:testapp_strloop_changelist"), {"q": "beta"}).content.decode()
    assert page.count('name="_selected_action"') == 1


def test_bump_now(boss):
    populate()
    response = post_action(boss, "bump_now", [1, 7])
    assert "Bumped 2 of 2" in response.content.decode()
    status = IntLoop.objects.status([1, 7])
    assert all(-5 < locked_for <= 0.5 for _, locked_for in status.values())


def test_bump_to_top_goes_ahead_of_every_bumped_id(boss):
    populate()
    post_action(boss, "bump_to_top", [4])
    assert IntLoop.objects.claim(1, lock_for=60) == [4]
    assert IntLoop.objects.claim(2, lock_for=60) == [9, 10]


def test_unlock_keeps_last_updated(boss):
    populate()
    before = IntLoop.objects.get(pk=7).last_updated
    response = post_action(boss, "unlock_ids", [7])
    assert "Unlocked 1 id(s)." in response.content.decode()
    row = IntLoop.objects.get(pk=7)
    assert row.lock_until is None and row.last_updated == before


def test_mark_done(boss):
    populate()
    response = post_action(boss, "mark_done", [1, 8])
    assert "Marked 2 id(s) done." in response.content.decode()
    assert all(
        since is not None and since < 5 and locked is None
        for since, locked in IntLoop.objects.status([1, 8]).values()
    )


def test_remove(boss):
    populate()
    response = post_action(boss, "remove_ids", [2, 3])
    assert "Removed 2 id(s) from the loop." in response.content.decode()
    assert not IntLoop.objects.filter(pk__in=[2, 3]).exists()
    assert IntLoop.objects.count() == 8


def test_actions_work_on_one_to_one_loops(boss):
    things = Thing.objects.bulk_create([Thing(name=str(i)) for i in range(3)])
    ThingLoop.objects.add([t.pk for t in things])
    url = reverse("admin:testapp_thingloop_changelist")
    boss.post(url, {"action": "mark_done", "_selected_action": [things[0].pk]})
    assert ThingLoop.objects.get(pk=things[0].pk).last_updated is not None


def test_stats_page_shows_doloops_ten_keys_and_charts(boss):
    populate()
    response = boss.get(reverse(STATS))
    page = response.content.decode()
    assert response.status_code == 200
    for key in IntLoop.objects.stats():
        assert f"<code>{key}</code>" in page
    assert page.count('<svg class="tl-chart"') == 2
    assert "Queue depth by state" in page and "Locks by time until they end" in page
    assert "<title>locked: 2</title>" in page and "<title>new: 3</title>" in page
    assert "<title>bumped: 2</title>" in page and "<title>idle: 3</title>" in page
    assert "<title>1–10 min: 2</title>" in page


def test_detail_page_is_read_only(boss):
    populate()
    response = boss.get(reverse("admin:testapp_intloop_change", args=[7]))
    assert response.status_code == 200
    assert 'name="lock_until"' not in response.content.decode()
    assert boss.get(reverse("admin:testapp_intloop_add")).status_code == 403


def test_viewer_sees_lists_and_stats_but_no_actions(viewer):
    populate()
    page = viewer.get(reverse(LIST)).content.decode()
    assert shown_ids(page) == set()  # no checkboxes at all
    assert "bump_now" not in page and 'name="action"' not in page
    assert ">7<" in page or ">7</a>" in page
    assert viewer.get(reverse(STATS)).status_code == 200
    viewer.post(reverse(LIST), {"action": "remove_ids", "_selected_action": [1]})
    viewer.post(reverse(LIST), {"action": "bump_now", "_selected_action": [1]})
    assert IntLoop.objects.filter(pk=1, lock_until__isnull=True).exists()


def test_staff_without_any_permission_gets_no_stats(client):
    user = User.objects.create_user("nobody", password="pw", is_staff=True)
    client.force_login(user)
    assert client.get(reverse(STATS)).status_code == 403


def test_register_all_on_a_custom_site():
    from django_taskloop.admin import register_all
    from django_taskloop.models import Job, JobBoard, Task, Tube

    site = admin.AdminSite(name="ops")
    register_all(site)
    for model in (JobBoard, Job, Tube, Task, IntLoop, FeedLoop):
        assert site.is_registered(model), model

    def names(patterns):
        for pattern in patterns:
            yield getattr(pattern, "name", None)
            yield from names(getattr(pattern, "url_patterns", []))

    assert "django_taskloop_dashboard" in set(names(site.get_urls()))
