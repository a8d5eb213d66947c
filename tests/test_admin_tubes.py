"""Admin of tubes and tasks: states, filters, Tarantool's verbs as actions, editing, statistics."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse

from django_taskloop.models import Task, Tube

pytestmark = pytest.mark.django_db

LIST = "admin:django_taskloop_task_changelist"


@pytest.fixture
def viewer(client):
    user = User.objects.create_user("viewer", password="pw", is_staff=True)
    for codename in ("view_task", "view_tube"):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client.force_login(user)
    return client


@pytest.fixture
def tube():
    """A fifottl tube: t0 ready (pri 5), t1 taken by "w1", t2 delayed, t3 buried; a fifo tube: t4."""
    tube = Tube.objects.create_tube("emails", "fifottl", ttr=600)
    tube.put({"n": 0}, pri=5, ttl=3600)
    tube.put({"n": 1}, pri=1)
    assert tube.take(0, consumer="w1").data == {"n": 1}
    tube.put({"n": 2}, delay=300)
    tube.bury(tube.put({"n": 3}).pk)
    Tube.objects.create_tube("plain", "fifo").put({"n": 4})
    return tube


def task(n: int) -> Task:
    return Task.objects.get(data__n=n)


def shown(page: str) -> set[int]:
    return {n for n in range(6) if f"{{&quot;n&quot;: {n}}}" in page}


def act(client, action: str, *ns: int, **extra):
    ids = [task(n).pk for n in ns]
    return client.post(reverse(LIST), {"action": action, "_selected_action": ids, **extra}, follow=True)


def test_changelist_shows_state_owner_deadlines_and_data(boss, tube):
    page = boss.get(reverse(LIST)).content.decode()
    assert shown(page) == {0, 1, 2, 3, 4}
    for state, n in (("ready", 2), ("taken", 1), ("delayed", 1), ("buried", 1)):
        assert page.count(f'class="tl-state tl-{state}"') == n, state
    assert "w1" in page
    assert page.count('class="tl-future">in 9 min') + page.count('class="tl-future">in 10 min') == 1  # ttr
    assert page.count('class="tl-future">in 4 min') + page.count('class="tl-future">in 5 min') == 1  # delay
    # How often each task was taken (the worker buries after MAX_ATTEMPTS).
    assert '<td class="field-attempts">1</td>' in page and '<td class="field-attempts">0</td>' in page


@pytest.mark.parametrize(
    "params, ns",
    [
        ({"state": "ready"}, {0, 4}),
        ({"state": "taken"}, {1}),
        ({"state": "delayed"}, {2}),
        ({"state": "buried"}, {3}),
        ({"pri__range__gte": "2"}, {0}),
        ({"pri__range__gte": "0", "pri__range__lte": "1"}, {1, 2, 3, 4}),
        ({"created__range__gte_0": "2000-01-01", "created__range__gte_1": "00:00:00"}, {0, 1, 2, 3, 4}),
        ({"event_at__range__gte_0": "2000-01-01", "event_at__range__gte_1": "00:00:00"}, {1, 2}),
        ({"ttl_at__range__gte_0": "2000-01-01", "ttl_at__range__gte_1": "00:00:00"}, {0}),
    ],
)
def test_filters(boss, tube, params, ns):
    assert shown(boss.get(reverse(LIST), params).content.decode()) == ns


def test_tube_filter_and_search(boss, tube):
    assert shown(boss.get(reverse(LIST), {"tube__id__exact": tube.pk}).content.decode()) == {0, 1, 2, 3}
    assert shown(boss.get(reverse(LIST), {"q": str(task(2).pk)}).content.decode()) == {2}
    keyed = Tube.objects.create_tube("keyed", "utube")
    keyed.put({"n": 5}, utube="customer-7")
    assert shown(boss.get(reverse(LIST), {"q": "customer-7"}).content.decode()) == {5}


def test_release_acts_for_the_holding_consumer(boss, tube):
    page = act(boss, "release_tasks", 1, 0).content.decode()
    assert "Released 1 task(s)." in page
    assert "NotTaken" in page
    assert task(1).state == "r" and task(1).owner is None


def test_bury_and_kick_exactly_the_chosen_task(boss, tube):
    assert "Buried 1 task(s)." in act(boss, "bury_tasks", 0).content.decode()
    assert task(0).state == "!"
    # Kick order is priority then id: t3 (pri 0) comes before t0 (pri 5); the operator chose t0.
    page = act(boss, "kick_tasks", 0).content.decode()
    assert "Kicked 1 task(s)." in page
    assert task(0).state == "r" and task(3).state == "!"
    page = act(boss, "kick_tasks", 3, 1).content.decode()
    assert "Kicked 1 task(s)." in page and "is not buried" in page
    assert task(3).state == "r"
    assert tube.statistics()["calls"]["kick"] == 2


def test_delete_task(boss, tube):
    assert "Deleted 2 task(s)." in act(boss, "delete_tasks", 1, 3).content.decode()
    assert not Task.objects.filter(data__n__in=[1, 3]).exists()
    assert tube.statistics()["calls"]["delete"] == 2


def test_set_priority_refuses_taken_tasks_and_fifo_tubes(boss, tube):
    page = act(boss, "set_priority", 0, 1, 4, pri="-3").content.decode()
    assert "Set the priority of 1 task(s) to -3." in page
    assert "taken, release it first" in page and "fifo tube has no priorities" in page
    assert task(0).pri == -3 and task(1).pri == 1 and task(4).pri == 0
    assert "whole-number priority" in act(boss, "set_priority", 0, pri="x").content.decode()


def test_edit_a_ready_task(boss, tube):
    url = reverse("admin:django_taskloop_task_change", args=[task(0).pk])
    assert boss.post(url, {"pri": "9", "data": '{"n": 0, "x": true}'}).status_code == 302
    assert Task.objects.get(pk=task(0).pk).pri == 9
    assert Task.objects.get(pk=task(0).pk).data == {"n": 0, "x": True}


def test_edit_form_refuses_a_taken_task_and_priorities_on_fifo(boss, tube):
    url = reverse("admin:django_taskloop_task_change", args=[task(1).pk])
    response = boss.post(url, {"pri": "9", "data": '{"n": 1}'})
    assert "is taken by w1: release it before editing it" in response.content.decode()
    assert task(1).pri == 1
    url = reverse("admin:django_taskloop_task_change", args=[task(4).pk])
    response = boss.post(url, {"pri": "9", "data": '{"n": 4}'})
    assert "A fifo tube has no priorities." in response.content.decode()
    assert task(4).pri == 0


def test_tube_list_kick_all_and_stats(boss, tube):
    page = boss.get(reverse("admin:django_taskloop_tube_changelist")).content.decode()
    assert "emails" in page and reverse("admin:django_taskloop_tube_stats", args=[tube.pk]) in page
    response = boss.get(reverse("admin:django_taskloop_tube_stats", args=[tube.pk]))
    page = response.content.decode()
    assert response.status_code == 200
    for key in ("tasks.ready", "tasks.taken", "tasks.buried", "tasks.delayed", "tasks.done", "calls.put"):
        assert f"<code>{key}</code>" in page
    assert "<title>ready: 1</title>" in page and "<title>buried: 1</title>" in page
    assert "<title>put: 4</title>" in page
    url = reverse("admin:django_taskloop_tube_changelist")
    page = boss.post(url, {"action": "kick_all", "_selected_action": [tube.pk]}, follow=True).content.decode()
    assert "Kicked 1 task(s)." in page
    assert task(3).state == "r"


def test_create_a_tube_through_the_admin(boss):
    response = boss.post(
        reverse("admin:django_taskloop_tube_add"), {"name": "jobs", "type": "utubettl", "ttl": "60"}
    )
    assert response.status_code == 302
    tube = Tube.objects.get(name="jobs")
    assert tube.type == "utubettl" and tube.ttl == 60


def test_a_tube_s_running_limit_through_the_admin(boss):
    add = reverse("admin:django_taskloop_tube_add")
    refused = boss.post(add, {"name": "none", "type": "fifo", "running_limit": "0"})
    assert refused.status_code == 200 and not Tube.objects.filter(name="none").exists()
    assert boss.post(add, {"name": "api", "type": "fifo", "running_limit": "3"}).status_code == 302
    tube = Tube.objects.get(name="api")
    assert tube.running_limit == 3
    listed = boss.get(reverse("admin:django_taskloop_tube_changelist")).content.decode()
    assert '<td class="field-limit">3</td>' in listed, listed
    change = reverse("admin:django_taskloop_tube_change", args=[tube.pk])
    assert boss.post(change, {"running_limit": ""}).status_code == 302
    assert Tube.objects.get(pk=tube.pk).running_limit is None


def test_a_tube_s_rate_through_the_admin(boss):
    """One field, written as the code writes it (``100/m``); a rate that does not read is
    refused with its reason and makes nothing."""
    from django_taskloop.validation import Rate

    add = reverse("admin:django_taskloop_tube_add")
    refused = boss.post(add, {"name": "none", "type": "fifo", "rate": "fast"})
    assert refused.status_code == 200 and not Tube.objects.filter(name="none").exists()
    assert "count per period" in refused.content.decode()
    assert boss.post(add, {"name": "api", "type": "fifo", "rate": "100/m"}).status_code == 302
    tube = Tube.objects.get(name="api")
    assert tube.rate == Rate(100, 60)
    listed = boss.get(reverse("admin:django_taskloop_tube_changelist")).content.decode()
    assert '<td class="field-rate_text">100/m</td>' in listed, listed
    change = reverse("admin:django_taskloop_tube_change", args=[tube.pk])
    assert 'value="100/m"' in boss.get(change).content.decode()
    assert boss.post(change, {"rate": "10/5s"}).status_code == 302
    assert Tube.objects.get(pk=tube.pk).rate == Rate(10, 5)
    assert boss.post(change, {"rate": ""}).status_code == 302
    assert Tube.objects.get(pk=tube.pk).rate is None


def test_no_add_or_bulk_delete_of_tasks(boss, tube):
    assert boss.get(reverse("admin:django_taskloop_task_add")).status_code == 403
    page = boss.get(reverse(LIST)).content.decode()
    assert 'value="delete_selected"' not in page and 'value="delete_tasks"' in page


def test_viewer_sees_no_actions_and_cannot_act(viewer, tube):
    page = viewer.get(reverse(LIST)).content.decode()
    assert shown(page) == {0, 1, 2, 3, 4}
    assert 'name="action"' not in page and 'name="_selected_action"' not in page
    act(viewer, "delete_tasks", 0)
    act(viewer, "bury_tasks", 0)
    assert task(0).state == "r"
    viewer.post(reverse("admin:django_taskloop_task_change", args=[task(0).pk]), {"pri": "9", "data": "{}"})
    assert task(0).pri == 5
    assert viewer.get(reverse("admin:django_taskloop_tube_stats", args=[tube.pk])).status_code == 200


def test_change_permission_without_delete_permission_hides_delete(client, tube):
    user = User.objects.create_user("operator", password="pw", is_staff=True)
    for codename in ("view_task", "change_task"):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client.force_login(user)
    page = client.get(reverse(LIST)).content.decode()
    assert 'value="bury_tasks"' in page and 'value="delete_tasks"' not in page


def test_stats_of_a_big_tube_cap_the_counts_and_offer_the_exact_statistics(boss, tube, monkeypatch):
    import django_taskloop.admin.tubes as tubes_admin

    monkeypatch.setattr(tubes_admin, "STATE_COUNT_CAP", 1)
    for n in range(3):
        tube.put({"n": 10 + n})
    tube.take(0)
    url = reverse("admin:django_taskloop_tube_stats", args=[tube.pk])
    page = boss.get(url).content.decode()
    assert "Task counts stop at 1 per state, and so does put" in page and "?exact=1" in page
    assert "<title>ready: 1</title>" in page  # capped
    exact = tube.statistics()
    assert f"<title>take: {exact['calls']['take']}</title>" in page  # counters are exact
    # put is derived from the task counts, so it is capped with them: never more than exact.
    shown = int(re.search(r"<title>put: (\d+)</title>", page).group(1))
    assert 0 < shown < exact["calls"]["put"]
    page = boss.get(url, {"exact": "1"}).content.decode()
    assert "Task counts stop" not in page
    assert f"<title>ready: {exact['tasks']['ready']}</title>" in page


def _expire(task: Task) -> None:
    """Move ``task``'s ttl deadline into the past (database clock), as waiting would."""
    from django_taskloop.engine import DbNow

    Task.objects.filter(pk=task.pk).update(ttl_at=DbNow(-1))


def test_expired_task_is_not_ready_in_the_task_list(boss, tube):
    _expire(task(0))  # ready, its ttl ran out, no worker came
    page = boss.get(reverse(LIST)).content.decode()
    assert page.count('class="tl-state tl-ready"') == 1  # only the fifo tube's task
    assert page.count('class="tl-state tl-expired"') == 1
    assert shown(boss.get(reverse(LIST), {"state": "ready"}).content.decode()) == {4}
    assert shown(boss.get(reverse(LIST), {"state": "expired"}).content.decode()) == {0}


def test_expired_task_is_not_ready_on_the_statistics_page(boss, tube):
    _expire(task(0))
    page = boss.get(reverse("admin:django_taskloop_tube_stats", args=[tube.pk])).content.decode()
    rows = dict(re.findall(r"<code>(tasks\.\w+)</code></th><td class=\"num\">(\d+)</td>", page))
    assert rows["tasks.ready"] == "0", rows
    assert rows["tasks.expired"] == "1", rows
    assert rows["tasks.overdue"] == "0", rows
    assert Task.objects.filter(pk=task(0).pk).exists()  # a page view only reads
