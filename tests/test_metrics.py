"""Prometheus metrics (SPEC §7): every queue's items by state, oldest ready age, processed
totals, live workers; for staff or a bearer token; a scrape changes nothing."""

from __future__ import annotations

import re

import pytest

from django_taskloop.models import JobBoard, Tube, WorkerProcess
from django_taskloop.models.operating import record_throughput
from tests.testapp.models import IntLoop

pytestmark = pytest.mark.django_db

LINE = re.compile(r'^[a-z_]+\{([a-z_]+="[^"]*",?)+\} -?[0-9.e+]+$')


def scrape(client, **headers) -> tuple[int, str]:
    response = client.get("/taskloop/metrics", **headers)
    return response.status_code, response.content.decode()


def test_metrics_show_every_queue_in_prometheus_text_format(boss):
    tube = Tube.objects.create_tube("emails", "fifottl")
    tube.put("a")
    tube.bury(tube.put("b").id)
    board = JobBoard.objects.create_board("builds")
    board.post("b1", {})
    IntLoop.objects.add([1, 2, 3])
    record_throughput("task", "emails", done=7, failed=2)
    WorkerProcess.objects.beat("h:1", host="h", pid=1, queues=["task:emails"], holding={})
    status, text = scrape(boss)
    assert status == 200
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert samples and all(LINE.match(line) for line in samples), [s for s in samples if not LINE.match(s)]
    assert 'taskloop_items{queue="emails",kind="task",state="ready"} 1' in samples
    assert 'taskloop_items{queue="emails",kind="task",state="buried"} 1' in samples
    assert 'taskloop_items{queue="builds",kind="job",state="unclaimed"} 1' in samples
    assert 'taskloop_items{queue="testapp.intloop",kind="loop",state="never_done"} 3' in samples
    assert any(s.startswith('taskloop_oldest_ready_seconds{queue="emails",kind="task"}') for s in samples)
    assert 'taskloop_processed_total{queue="emails",kind="task",outcome="done"} 7' in samples
    assert 'taskloop_processed_total{queue="emails",kind="task",outcome="failed"} 2' in samples
    assert 'taskloop_workers{queue="emails",kind="task"} 1' in samples
    assert "# TYPE taskloop_processed_total counter" in text


def test_metrics_need_staff_or_the_bearer_token(client, settings, django_user_model):
    assert scrape(client)[0] == 403
    settings.TASKLOOP = {"METRICS_TOKEN": "s3cret"}
    assert scrape(client, HTTP_AUTHORIZATION="Bearer wrong")[0] == 403
    assert scrape(client, HTTP_AUTHORIZATION="Bearer s3cret")[0] == 200
    user = django_user_model.objects.create_user("joe", password="pw")
    client.force_login(user)
    settings.TASKLOOP = {}
    assert scrape(client)[0] == 403  # logged in, not staff


def test_a_scrape_changes_nothing(boss, clock):
    tube = Tube.objects.create_tube("t", "fifottl", ttr=60)
    tube.put("x")
    taken = tube.take(0)
    clock.advance(61)  # its ttr ran out: a read must not return it to ready
    scrape(boss)
    assert tube.tasks.all().get(pk=taken.id).state == "t"
    assert tube.peek(taken.id).state == "r"  # (a verb does: the ttr did run out)


def test_expired_task_is_not_ready_in_metrics(boss):
    """put(ttl=…), its ttl runs out, no worker: not ready, and no oldest ready age growing."""
    from django_taskloop.engine import DbNow
    from django_taskloop.models import Task

    tube = Tube.objects.create_tube("mail", "fifottl")
    gone = tube.put("old", ttl=1)
    Task.objects.filter(pk=gone.pk).update(ttl_at=DbNow(-1), created=DbNow(-3600))
    _status, text = scrape(boss)
    assert 'taskloop_items{queue="mail",kind="task",state="ready"} 0' in text.splitlines()
    assert 'taskloop_items{queue="mail",kind="task",state="expired"} 1' in text.splitlines()
    assert 'taskloop_oldest_ready_seconds{queue="mail",kind="task"} 0' in text.splitlines()
    # A live task behind it is what the next take gets: its age, not the expired one's.
    tube.put("new", ttl=3600)
    _status, text = scrape(boss)
    assert 'taskloop_items{queue="mail",kind="task",state="ready"} 1' in text.splitlines()
    (age,) = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith('taskloop_oldest_ready_seconds{queue="mail"')
    ]
    assert age < 3000


def _samples(text: str) -> set[str]:
    return {line for line in text.splitlines() if line and not line.startswith("#")}


def test_a_bumped_loop_id_is_bumped_not_idle_in_metrics(boss):
    """One definition of a loop's states: a bumped id (or an expired lock) is first in line,
    never idle; the metrics say so as the admin does."""
    IntLoop.objects.add([1, 2, 3])
    IntLoop.objects.did([3])
    IntLoop.objects.bump([1])  # lock_until = now: due
    samples = _samples(scrape(boss)[1])
    assert 'taskloop_items{queue="testapp.intloop",kind="loop",state="bumped"} 1' in samples
    assert 'taskloop_items{queue="testapp.intloop",kind="loop",state="idle"} 1' in samples
    assert 'taskloop_items{queue="testapp.intloop",kind="loop",state="never_done"} 1' in samples
    assert 'taskloop_items{queue="testapp.intloop",kind="loop",state="locked"} 0' in samples


def test_an_expired_job_claim_is_expired_not_unclaimed_in_metrics(boss):
    """A claim whose expiry passed is claimable again, but counted as what it is: expired."""
    from django_taskloop.engine import DbNow
    from django_taskloop.models import Job

    board = JobBoard.objects.create_board("builds")
    job = board.post("old", {})
    board.claim(job, "w1", expiry=60)
    Job.objects.filter(pk=job.pk).update(claim_expires_at=DbNow(-1), created_on=DbNow(-3600))
    samples = _samples(scrape(boss)[1])
    assert 'taskloop_items{queue="builds",kind="job",state="expired"} 1' in samples
    assert 'taskloop_items{queue="builds",kind="job",state="unclaimed"} 0' in samples
    assert 'taskloop_items{queue="builds",kind="job",state="claimed"} 0' in samples
    # The next claim gets it: its wait is the oldest ready wait.
    (age,) = [
        float(s.rsplit(" ", 1)[1])
        for s in samples
        if s.startswith('taskloop_oldest_ready_seconds{queue="builds"')
    ]
    assert age >= 3500
