"""Admin of job boards: states, filters, the trash, facade verbs as actions, editing, stats."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse

from django_taskloop.models import Job, JobBoard, JobPriority

pytestmark = pytest.mark.django_db

LIST = "admin:django_taskloop_job_changelist"


@pytest.fixture
def viewer(client):
    user = User.objects.create_user("viewer", password="pw", is_staff=True)
    for codename in ("view_job", "view_jobboard"):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client.force_login(user)
    return client


@pytest.fixture
def board(clock):
    """Jobs a (unclaimed, HIGH), b (claimed by w1), c (claim expired), d (trashed), on "builds"."""
    board = JobBoard.objects.create_board("builds")
    other = JobBoard.objects.create_board("other")
    board.post("job-a", {"n": 1}, priority="HIGH")
    board.claim(board.post("job-b"), "w1", expiry=661)  # 600 s left once the clock moves below
    board.claim(board.post("job-c", priority="LOW"), "w2", expiry=60)
    d = board.post("job-d")
    board.claim(d, "w3")
    board.trash(d, "w3")
    other.post("job-e", priority="VERY_LOW")
    clock.advance(61)  # job-c's claim expires (the test goes on at this time)
    return board


def job(name: str) -> Job:
    return Job.objects.get(name=name)


def shown(page: str) -> set[str]:
    return {name for name in "abcdef" if f">job-{name}<" in page}


def act(client, action: str, *names: str, **extra):
    ids = [job(f"job-{name}").pk for name in names]
    return client.post(reverse(LIST), {"action": action, "_selected_action": ids, **extra}, follow=True)


def test_changelist_shows_state_owner_priority_and_claim_deadline(boss, board):
    page = boss.get(reverse(LIST)).content.decode()
    assert shown(page) == set("abcde")
    for state, n in (("unclaimed", 2), ("claimed", 1), ("expired", 1), ("trashed", 1)):
        assert page.count(f'class="tl-state tl-{state}"') == n, state
    assert "w1" in page and "HIGH" in page and "VERY_LOW" in page
    assert 'class="tl-future">in 9 min' in page or 'class="tl-future">in 10 min' in page
    assert "?state=trashed" in page  # the link to the trash
    assert 'class="column-attempts' in page  # how often each job was claimed


@pytest.mark.parametrize(
    "params, names",
    [
        ({"state": "unclaimed"}, {"a", "e"}),
        ({"state": "claimed"}, {"b"}),
        ({"state": "expired"}, {"c"}),
        ({"state": "trashed"}, {"d"}),
        ({"priority": "HIGH"}, {"a"}),
        ({"priority": "VERY_LOW"}, {"e"}),
        ({"q": "job-c"}, {"c"}),
        ({"created_on__range__gte_0": "2000-01-01", "created_on__range__gte_1": "00:00:00"}, set("abcde")),
        (
            {"claim_expires_at__range__gte_0": "2000-01-01", "claim_expires_at__range__gte_1": "00:00:00"},
            {"b", "c"},
        ),
        ({"trashed_at__range__gte_0": "2000-01-01", "trashed_at__range__gte_1": "00:00:00"}, {"d"}),
        ({"last_modified__range__lte_0": "2000-01-01", "last_modified__range__lte_1": "00:00:00"}, set()),
    ],
)
def test_filters_and_search(boss, board, params, names):
    assert shown(boss.get(reverse(LIST), params).content.decode()) == names


def test_board_filter_and_uuid_search(boss, board):
    assert shown(boss.get(reverse(LIST), {"board__id__exact": board.pk}).content.decode()) == set("abcd")
    assert shown(boss.get(reverse(LIST), {"q": job("job-b").uuid}).content.decode()) == {"b"}


def test_abandon_gives_the_job_back(boss, board):
    response = act(boss, "abandon_jobs", "b", "a")
    page = response.content.decode()
    assert "Abandoned 1 job(s)." in page
    assert "Job &#x27;job-a&#x27;: JobFailure: it is not claimed" in page
    assert job("job-b").state == "UNCLAIMED"


def test_trash_an_unclaimed_job_and_refuse_a_claimed_one(boss, board):
    page = act(boss, "trash_jobs", "a", "b").content.decode()
    assert "Moved 1 job(s) to the trash." in page
    assert "UnclaimableJob" in page or "claimed" in page
    a = job("job-a")
    assert a.trashed and a.trashed_by == "admin:boss"
    assert job("job-b").owner == "w1" and not job("job-b").trashed


def test_repost_from_the_trash(boss, board):
    page = act(boss, "repost_jobs", "d", "a").content.decode()
    assert "Re-posted 1 job(s)." in page
    assert "not trashed" in page
    copies = Job.objects.filter(name="job-d")
    assert copies.count() == 2
    assert {j.trashed for j in copies} == {True, False}
    assert board.job_count == 4


def test_set_priority_action(boss, board):
    page = act(boss, "set_priority", "a", "b", "d", priority="VERY_HIGH").content.decode()
    assert "Set 2 job(s) to VERY_HIGH." in page and "1 trashed job(s)" in page
    assert job("job-a").priority is JobPriority.VERY_HIGH
    assert job("job-b").priority is JobPriority.VERY_HIGH
    assert job("job-d").priority is JobPriority.NORMAL
    assert "Choose a priority" in act(boss, "set_priority", "a").content.decode()


def test_edit_priority_and_details_of_an_unclaimed_job(boss, board):
    url = reverse("admin:django_taskloop_job_change", args=[job("job-a").pk])
    response = boss.post(url, {"priority": "LOW", "details": '{"n": 2}'})
    assert response.status_code == 302
    a = job("job-a")
    assert a.priority is JobPriority.LOW and a.details == {"n": 2}


def test_edit_form_refuses_details_of_a_claimed_job(boss, board):
    url = reverse("admin:django_taskloop_job_change", args=[job("job-b").pk])
    response = boss.post(url, {"priority": "NORMAL", "details": '{"n": 9}'})
    assert response.status_code == 200
    assert "cannot change" in response.content.decode() and "w1" in response.content.decode()
    assert job("job-b").details == {}
    # The priority alone may change: it only orders claims.
    assert boss.post(url, {"priority": "HIGH", "details": "{}"}).status_code == 302
    assert job("job-b").priority is JobPriority.HIGH


def test_edit_form_refuses_a_trashed_job(boss, board):
    url = reverse("admin:django_taskloop_job_change", args=[job("job-d").pk])
    response = boss.post(url, {"priority": "HIGH", "details": "{}"})
    assert "trashed job cannot be edited" in response.content.decode()
    assert job("job-d").priority is JobPriority.NORMAL


def test_no_add_or_delete_of_jobs(boss, board):
    assert boss.get(reverse("admin:django_taskloop_job_add")).status_code == 403
    assert 'value="delete_selected"' not in boss.get(reverse(LIST)).content.decode()


def test_board_list_and_stats_page(boss, board):
    page = boss.get(reverse("admin:django_taskloop_jobboard_changelist")).content.decode()
    assert "builds" in page and reverse("admin:django_taskloop_jobboard_stats", args=[board.pk]) in page
    response = boss.get(reverse("admin:django_taskloop_jobboard_stats", args=[board.pk]))
    page = response.content.decode()
    assert response.status_code == 200
    assert page.count('<svg class="tl-chart"') == 2
    assert "<title>unclaimed: 1</title>" in page and "<title>trashed: 1</title>" in page
    assert "<title>expired claim: 1</title>" in page and "<title>claimed: 1</title>" in page
    assert "<title>HIGH: 1</title>" in page and "<title>LOW: 1</title>" in page
    assert boss.get(reverse("admin:django_taskloop_jobboard_stats", args=[999999])).status_code == 404


def test_create_a_board_through_the_admin(boss):
    response = boss.post(reverse("admin:django_taskloop_jobboard_add"), {"name": "deploys"})
    assert response.status_code == 302
    assert JobBoard.objects.get(name="deploys").created_on is not None


def test_history_and_entities_pages(boss, board):
    board.register_entity("conductor", "c1")
    page = boss.get(reverse("admin:django_taskloop_boardentity_changelist")).content.decode()
    assert "c1" in page and "conductor" in page
    assert boss.get(reverse("admin:django_taskloop_consumedjob_changelist")).status_code == 200


def test_viewer_sees_no_actions_and_cannot_act(viewer, board):
    page = viewer.get(reverse(LIST)).content.decode()
    assert shown(page) == set("abcde")
    assert 'name="action"' not in page and 'name="_selected_action"' not in page
    act(viewer, "abandon_jobs", "b")
    assert job("job-b").owner == "w1"
    url = reverse("admin:django_taskloop_job_change", args=[job("job-a").pk])
    viewer.post(url, {"priority": "LOW", "details": "{}"})
    assert job("job-a").priority is JobPriority.HIGH
    assert viewer.get(reverse("admin:django_taskloop_jobboard_stats", args=[board.pk])).status_code == 200


def test_a_trashed_jobs_page_is_read_only_and_links_the_job_it_was_reposted_as(boss, board):
    trashed = job("job-d")
    page = boss.get(reverse("admin:django_taskloop_job_change", args=[trashed.pk])).content.decode()
    assert 'name="details"' not in page and 'name="priority"' not in page
    assert 'name="_save"' not in page and 'name="_continue"' not in page
    assert "View job" in page and ">normal<" in page
    new = board.repost(trashed)
    page = boss.get(reverse("admin:django_taskloop_job_change", args=[trashed.pk])).content.decode()
    link = reverse("admin:django_taskloop_job_change", args=[new.pk])
    assert f'<a href="{link}">{new.uuid}</a>' in page
    # A live job's page still edits.
    live = boss.get(reverse("admin:django_taskloop_job_change", args=[new.pk])).content.decode()
    assert 'name="details"' in live and 'name="_save"' in live
