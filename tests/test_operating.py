"""What an operator needs (SPEC §7, issue 14): kick_task, pause/resume, re-post once, Failure,
throughput over time, live worker processes."""

from __future__ import annotations

import pytest

from django_taskloop.exceptions import JobFailure, NotFound, TubeError
from django_taskloop.models import Failure, JobBoard, Throughput, Tube, WorkerProcess
from django_taskloop.models.operating import (
    prune_throughput,
    record_throughput,
    throughput_series,
    throughput_totals,
)
from tests.testapp.models import IntLoop

pytestmark = pytest.mark.django_db


def test_kick_task_kicks_exactly_the_chosen_buried_task():
    tube = Tube.objects.create_tube("k", "fifo")
    first, second = tube.put("a"), tube.put("b")
    tube.bury(first.id)
    tube.bury(second.id)
    kicked = tube.kick_task(second.id)  # not the first in kick order
    assert kicked.id == second.id and kicked.state == "r"
    assert tube.peek(first.id).state == "!"
    assert tube.peek(second.id).state == "r"
    assert tube.statistics()["calls"]["kick"] == 1
    with pytest.raises(TubeError, match="not buried"):
        tube.kick_task(second.id)
    with pytest.raises(NotFound):
        tube.kick_task(999_999)


def test_a_paused_tube_hands_out_nothing_and_everything_else_works():
    tube = Tube.objects.create_tube("p", "fifottl")
    task = tube.put("x")
    assert tube.paused is False
    tube.pause()
    tube.pause()  # twice: a no-op
    assert tube.paused is True
    assert tube.take(0) is None
    assert tube.take_many(10) == []
    tube.put("y")  # put still works
    assert tube.statistics()["tasks"]["ready"] == 2
    tube.resume()
    assert tube.paused is False
    assert tube.take(0).id == task.id


def test_a_paused_board_claims_nothing_next_but_an_explicit_claim_works():
    board = JobBoard.objects.create_board("pb")
    job = board.post("j", {})
    board.pause()
    assert board.paused
    assert board.claim_next("w") is None
    board.claim(job, "w")  # explicit claim still works
    board.abandon(job, "w")
    board.resume()
    assert board.claim_next("w").uuid == job.uuid


def test_a_loop_handler_pauses_for_workers_only():
    IntLoop.objects.add([1, 2])
    assert IntLoop.objects.paused() is False
    IntLoop.objects.pause()
    IntLoop.objects.pause()
    assert IntLoop.objects.paused() is True
    assert sorted(IntLoop.objects.claim(10)) == [1, 2]  # user code's claim is not affected
    IntLoop.objects.resume()
    assert IntLoop.objects.paused() is False


def test_a_trashed_job_is_reposted_once():
    board = JobBoard.objects.create_board("builds")
    job = board.post("build-1356", {"ref": "main"})
    board.claim(job, "w")
    board.trash(job, "w")
    new = board.repost(job)
    job.refresh_from_db()
    assert job.reposted_as == new.uuid
    with pytest.raises(JobFailure, match="re-posted already"):
        board.repost(job)
    assert [j.name for j in board.iterjobs()].count("build-1356") == 1


def test_failures_are_recorded_and_found_per_item():
    tube = Tube.objects.create_tube("f", "fifo")
    task = tube.put("x")
    for attempt in (1, 2):
        try:
            raise RuntimeError(f"boom {attempt}\x00")
        except RuntimeError as error:
            Failure.objects.record(
                kind="task", queue="f", item=task.id, attempt=attempt, worker="w1", error=error
            )
    first, second = Failure.objects.for_item(tube.peek(task.id))[::-1]
    assert (first.attempt, second.attempt) == (1, 2)
    assert second.error == "builtins.RuntimeError"
    assert second.message == "boom 2\\x00"
    assert "Traceback" in second.traceback and "RuntimeError: boom 2" in second.traceback
    assert list(Failure.objects.for_item((IntLoop, 5))) == []
    with pytest.raises(ValueError, match="kind must be"):
        Failure.objects.record(kind="tube", queue="f", item=1, attempt=1, worker="w", error=RuntimeError())
    with pytest.raises(TypeError, match="for_item"):
        Failure.objects.for_item("nope")


def test_throughput_is_kept_per_minute_and_totals_survive_pruning(settings):
    record_throughput("task", "t", done=5, failed=1)
    record_throughput("task", "t", done=3, given_back=2)
    (row,) = Throughput.objects.all()
    assert (row.done, row.failed, row.given_back) == (8, 1, 2)
    series = throughput_series("task", "t", since_seconds=3600)
    assert len(series) >= 59 and sum(s[1] for s in series) == 8
    assert throughput_totals()[("task", "t")] == {"done": 8, "failed": 1, "given_back": 2}
    settings.TASKLOOP = {"THROUGHPUT_RETENTION": -120}  # everything is old
    assert prune_throughput() == 1
    assert Throughput.objects.get().minute is None
    assert throughput_totals()[("task", "t")] == {"done": 8, "failed": 1, "given_back": 2}


def test_worker_processes_beat_and_leave():
    WorkerProcess.objects.beat(
        "h:1:worker", host="h", pid=1, queues=["task:emails"], holding={"task:emails": 3}
    )
    WorkerProcess.objects.beat("h:1:worker", host="h", pid=1, queues=["task:emails"], holding={})
    (alive,) = WorkerProcess.objects.alive()
    assert alive.holding == {} and alive.queues == ["task:emails"]
    WorkerProcess.objects.gone("h:1:worker")
    assert not WorkerProcess.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_waiting_take_keeps_waiting_while_paused_and_wakes_on_resume():
    import threading
    import time

    from django.db import connections

    tube = Tube.objects.create_tube("pw", "fifottl")
    tube.put("x")
    tube.pause()
    started = time.monotonic()
    assert tube.take(0.6) is None
    assert time.monotonic() - started >= 0.55

    def resume_soon() -> None:
        time.sleep(0.3)
        Tube.objects.get(name="pw").resume()
        connections.close_all()

    threading.Thread(target=resume_soon).start()
    got = tube.take(5)
    assert got is not None and time.monotonic() - started < 5


def test_reap_locks_prunes_old_failures_throughput_and_gone_workers(settings):
    from django_taskloop.reaper import format_report, reap

    try:
        raise RuntimeError("old")
    except RuntimeError as error:
        Failure.objects.record(kind="task", queue="q", item=1, attempt=1, worker="w", error=error)
    record_throughput("task", "q", done=1)
    WorkerProcess.objects.beat("gone", host="h", pid=1, queues=[], holding={})
    settings.TASKLOOP = {"FAILURE_RETENTION": -60, "THROUGHPUT_RETENTION": -120, "WORKER_TIMEOUT": -1}
    lines = format_report(reap())
    assert (
        "results operating: failures pruned 1, throughput minutes folded 1, gone workers forgotten 1" in lines
    )
    assert not Failure.objects.exists() and not WorkerProcess.objects.exists()
    assert throughput_totals()[("task", "q")]["done"] == 1


def test_the_pause_verbs_live_on_paused_queues_manager():
    from django_taskloop.models import PausedQueue
    from django_taskloop.models.operating import is_paused, pause, resume

    pauses = PausedQueue.objects
    assert not pauses.is_paused("task", "mail")
    pauses.pause("task", "mail")
    pauses.pause("task", "mail")  # twice: a no-op
    assert pauses.is_paused("task", "mail") and is_paused("task", "mail")
    assert pauses.is_paused("task", "mail", fresh=False)
    assert not pauses.is_paused("job", "mail")
    assert PausedQueue.objects.filter(kind="task", queue="mail").count() == 1
    pauses.resume("task", "mail")
    assert not pauses.is_paused("task", "mail")
    # The module-level spellings are the same verbs on a database alias.
    pause("job", "builds", "default")
    assert pauses.is_paused("job", "builds")
    resume("job", "builds", "default")
    assert not is_paused("job", "builds")
    with pytest.raises(ValueError, match="kind must be"):
        pauses.pause("tube", "mail")


def test_failures_of_a_job_are_found_by_its_model_label():
    board = JobBoard.objects.create_board("b")
    job = board.post("build-1")
    Failure.objects.record(kind="job", queue="b", item=job.uuid, attempt=1, worker="w", error=OSError("x"))
    assert [f.error for f in Failure.objects.for_item(job)] == ["builtins.OSError"]
    # Another model's instance is neither a task nor a job.
    with pytest.raises(TypeError, match="for_item"):
        Failure.objects.for_item(board)
