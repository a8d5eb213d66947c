"""The read model (``django_taskloop.stats``): one definition of every queue state, over the
facades' named queryset states, shared by the admin, the metrics and the commands."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from django_taskloop import stats
from django_taskloop.engine import DbNow, db_now
from django_taskloop.models import Failure, Job, JobBoard, Task, TaskRecord, Tube
from django_taskloop.models.boards import JobQuerySet
from django_taskloop.models.loops import TaskLoopQuerySet
from tests.testapp.models import IntLoop

pytestmark = pytest.mark.django_db


def _board() -> JobBoard:
    """A board with a job in every state: 2 unclaimed, 1 claimed, 1 expired claim, 1 trashed."""
    board = JobBoard.objects.create_board("builds")
    board.post("new", {})
    board.abandon(board.claim(board.post("abandoned", {}), "w1"), "w1")
    board.claim(board.post("held", {}), "w1", expiry=600)
    expired = board.claim(board.post("lost", {}), "w2", expiry=60)
    Job.objects.filter(pk=expired.pk).update(claim_expires_at=DbNow(-1), created_on=DbNow(-3600))
    board.trash(board.claim(board.post("broken", {}), "w1"), "w1")
    return board


def _loop() -> None:
    """A loop with 2 new ids, 1 idle, 2 locked (one bumped into the future), 2 bumped."""
    IntLoop.objects.add(range(1, 8))
    IntLoop.objects.did([3])
    IntLoop.objects.claim(1, lock_for=600)  # a lock: id 1
    IntLoop.objects.bump([2], lock_for=900)  # a bump into the future reads locked
    IntLoop.objects.bump([4], lock_for=-60)  # bumped a minute ago
    IntLoop.objects.bump([5])  # bumped now


def test_every_job_is_in_exactly_one_named_state(boss):
    board = _board()
    jobs = Job.objects.filter(board=board)
    by_state = {name: set(jobs.in_state(name).values_list("name", flat=True)) for name in JobQuerySet.STATES}
    assert by_state == {
        "unclaimed": {"new", "abandoned"},
        "claimed": {"held"},
        "expired": {"lost"},
        "trashed": {"broken"},
    }
    assert jobs.state_counts() == {"unclaimed": 2, "claimed": 1, "expired": 1, "trashed": 1}
    # claimable() is what claim_next hands out: unclaimed and expired together.
    assert set(jobs.claimable().values_list("name", flat=True)) == {"new", "abandoned", "lost"}
    # TaskFlow's own reading agrees: an expired claim is UNCLAIMED.
    assert Job.objects.get(name="lost").state == "UNCLAIMED"
    with pytest.raises(ValueError):
        jobs.in_state("complete")


def test_every_loop_id_is_in_exactly_one_named_state():
    _loop()
    by_state = {
        name: set(IntLoop.objects.in_state(name).values_list("pk", flat=True))
        for name in TaskLoopQuerySet.STATES
    }
    assert by_state == {"new": {6, 7}, "idle": {3}, "locked": {1, 2}, "bumped": {4, 5}}
    assert IntLoop.objects.state_counts() == {"new": 2, "idle": 1, "locked": 2, "bumped": 2}
    assert IntLoop.objects.filter(pk__gt=4).state_counts() == {"new": 2, "idle": 0, "locked": 0, "bumped": 1}
    # doloop's own stats() counts the same locked and bumped rows.
    doloop = IntLoop.objects.stats()
    assert (doloop["locked"], doloop["bumped"]) == (2, 2)


def test_the_admins_row_states_agree_with_the_querysets(boss):
    """The admin's badge of one row and the named state of the queryset are one definition."""
    from django_taskloop.admin.boards import job_state
    from django_taskloop.admin.loops import loop_state

    board = _board()
    _loop()
    now = db_now()
    for name in JobQuerySet.STATES:
        for job in Job.objects.filter(board=board).in_state(name):
            assert job_state(job, now) == name, job.name
    for name in TaskLoopQuerySet.STATES:
        for row in IntLoop.objects.in_state(name):
            assert loop_state(row, now) == name, row.pk


def test_a_boards_summary(boss):
    board = _board()
    summary = stats.board_summary(board)
    assert (summary.kind, summary.name, summary.title, summary.using) == (
        "job",
        "builds",
        "builds",
        "default",
    )
    assert summary.source == board
    assert summary.counts == {"unclaimed": 2, "claimed": 1, "expired": 1, "trashed": 1}
    assert summary.exact and not summary.empty
    # The head of the claim order: the first job posted (the expired one's wait is not it).
    assert summary.oldest_ready is not None and summary.oldest_ready < 600
    Job.objects.filter(name__in=["new", "abandoned"]).delete()
    # Now the job whose claim expired is: posted an hour ago.
    waits = stats.board_summary(board).oldest_ready
    assert waits is not None and 3500 < waits < 3700
    assert summary.oldest_claim is not None and summary.oldest_claim < 60
    assert summary.longest_lock_left is None and not summary.paused
    board.pause()
    assert stats.board_summary(board).paused
    assert stats.board_priorities(board)["NORMAL"] == 2  # live jobs: held and lost (not trashed)


def test_a_loops_summary():
    _loop()
    summary = stats.loop_summary(IntLoop)
    assert (summary.kind, summary.name, summary.title) == ("loop", "testapp.intloop", "int loops")
    assert summary.counts == {"new": 2, "idle": 1, "locked": 2, "bumped": 2}
    # Most overdue: id 4, bumped a minute ago; the lock that ends last: id 2's, in 900 s.
    assert summary.oldest_ready is not None and 59 < summary.oldest_ready < 120
    assert summary.longest_lock_left is not None and 800 < summary.longest_lock_left <= 900
    ages = stats.lock_ages(IntLoop, cap=100)
    assert ages == {"< 1 min": 0, "1–10 min": 1, "10–60 min": 1, "1–6 h": 0, "> 6 h": 0}


def test_a_tubes_summary_and_capped_counts():
    tube = Tube.objects.create_tube("emails", "fifottl")
    for n in range(3):
        tube.put(n)
    tube.bury(tube.put("bad").id)
    gone = tube.put("old", ttl=1)
    Task.objects.filter(pk=gone.pk).update(ttl_at=DbNow(-1))
    summary = stats.tube_summary(tube)
    assert summary.counts == {"ready": 3, "taken": 0, "delayed": 0, "buried": 1, "expired": 1}
    assert summary.oldest_ready is not None and summary.oldest_ready < 60
    capped = stats.tube_summary(tube, cap=2)
    assert capped.counts["ready"] == 2 and capped.capped == {"ready"} and not capped.exact
    assert capped.depth()["ready"] == (2, False) and capped.depth()["buried"] == (1, True)


def test_an_empty_queue_has_no_oldest_ready():
    tube = Tube.objects.create_tube("quiet", "fifo")
    board = JobBoard.objects.create_board("quiet")
    for summary in (stats.tube_summary(tube), stats.board_summary(board), stats.loop_summary(IntLoop)):
        assert summary.empty and summary.oldest_ready is None, summary.kind


def test_queue_summaries_list_every_queue_with_its_failures_of_the_last_hour():
    Tube.objects.create_tube("b-tube", "fifo")
    Tube.objects.create_tube("a-tube", "fifo")
    JobBoard.objects.create_board("builds")
    IntLoop.objects.add([1])
    for _ in range(2):
        Failure.objects.create(
            kind="task",
            queue="a-tube",
            item="1",
            attempt=1,
            worker="w",
            error="E",
            message="",
            traceback="",
            at=db_now(),
        )
    summaries = stats.queue_summaries()
    names = [(s.kind, s.name) for s in summaries]
    assert names[:3] == [("task", "a-tube"), ("task", "b-tube"), ("job", "builds")]
    assert ("loop", "testapp.intloop") in names
    assert {(s.kind, s.name): s.failures_last_hour for s in summaries}[("task", "a-tube")] == 2
    assert [s.name for s in stats.queue_summaries(["task"], limit=1)] == ["a-tube"]
    assert [s.kind for s in stats.queue_summaries(["loop", "job"], loops=[IntLoop])] == ["loop", "job"]
    with pytest.raises(ValueError):
        stats.queue_summaries(["queue"])


def test_a_django_tasks_queue_counts_its_results_that_failed_for_good():
    Tube.objects.create_tube("tasks.mail", "fifottl").put({})
    Tube.objects.create_tube("tasks-keyed.mail", "utubettl")
    Tube.objects.create_tube("tasks.other", "fifottl")
    for queue, status in [("mail", "FAILED"), ("mail", "FAILED"), ("mail", "SUCCESSFUL"), ("other", "READY")]:
        TaskRecord.objects.create(backend="default", queue_name=queue, task_path="m.f", status=status)
    merged = {s.name: s for s in stats.merge_django_tasks(stats.queue_summaries(["task"]))}
    assert merged["mail"].kind == stats.DJANGO_TASK
    assert list(merged["mail"].counts) == list(stats.DJANGO_TASK_STATES)
    assert merged["mail"].counts["failed"] == 2 and merged["mail"].counts["ready"] == 1
    assert merged["other"].counts["failed"] == 0
    assert stats.failed_for_good("default") == {"mail": 2}


def test_a_summary_only_reads():
    tube = Tube.objects.create_tube("t", "fifottl", ttr=0.01)
    tube.put("x")
    taken = tube.take(0)
    Task.objects.filter(pk=taken.id).update(event_at=DbNow(-1))  # its ttr ran out
    stats.queue_summaries()
    assert Task.objects.get(pk=taken.id).state == "t"


def test_stats_sits_on_its_floor():
    """stats may import the models and the engine, never the admin, the metrics or the workers."""
    tree = ast.parse(Path(stats.__file__).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            imported.add("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
    upward = {
        name
        for name in imported
        if name.lstrip(".").split(".")[0] in ("admin", "metrics", "workers", "management", "backends")
        or name.startswith("django_taskloop.")
    }
    assert not upward, upward
