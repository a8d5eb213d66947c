"""``manage.py workers`` (SPEC §5): real worker subprocesses on the test database."""

from __future__ import annotations

import io
import os
import re
import signal
import time
from collections import Counter

import pytest
from django.core.management import call_command

from django_taskloop.models import BoardEntity, Consumer, Failure, JobBoard, Tube, WorkerProcess
from django_taskloop.models.operating import throughput_totals
from django_taskloop.workers import Handler, board, get_handlers, loop, registry, tube
from tests.testapp.models import WorkerLoop, WorkLog

from .workers_util import (
    alive,
    children_of,
    run_workers,
    start_workers,
    stop,
    stop_hard,
    stop_once,
    wait_until,
)

FAST = '{"RETRY_BACKOFF": 0.3, "MAX_ATTEMPTS": 3, "GRACE_PERIOD": 20, "HEARTBEAT_INTERVAL": 0.5}'


def ends(kind: str) -> Counter[str]:
    return Counter(WorkLog.objects.filter(kind=kind, phase="end").values_list("key", flat=True))


# Registry (no database). -------------------------------------------------------------------


def test_decorators_register_handlers_found_by_autodiscovery():
    handlers = {h.name: h for h in get_handlers()}
    assert handlers["w-drain"].kind == "tube"
    assert handlers["w-board"].kind == "board"
    assert handlers["testapp.workerloop"].kind == "loop"
    assert handlers["testapp.workerloop"].target is WorkerLoop
    assert handlers["testapp.workerloop"].batch == 10
    assert handlers["w-board"].batch == 100  # the @board default, as @tube's and @loop's
    # The Tasks backend's queues are served too.
    assert handlers["tasks.default"].kind == "tube"
    assert [h.name for h in get_handlers(["w-board", "w-drain"])] == ["w-board", "w-drain"]
    # The decorated name still calls the function.
    assert isinstance(registry["w-fail"], Handler)


def test_decorators_validate_arguments():
    with pytest.raises(ValueError, match="unknown handler"):
        get_handlers(["nope"])
    with pytest.raises(TypeError, match="name"):
        tube(3)
    with pytest.raises(ValueError, match="name"):
        board("has space")
    with pytest.raises(ValueError, match="type"):
        tube("t", type="lifo")
    with pytest.raises(TypeError, match="batch"):
        tube("t", batch=True)
    with pytest.raises(TypeError, match="batch"):
        board("b", batch=True)
    with pytest.raises(ValueError, match="batch"):
        board("b", batch=0)
    with pytest.raises(ValueError, match="lock_for"):
        loop(WorkerLoop, lock_for=0)
    with pytest.raises(TypeError, match="model"):
        loop(WorkLog)
    with pytest.raises(ValueError, match="already registered"):
        tube("w-drain")(lambda task: None)


def test_command_rejects_bad_options():
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="processes"):
        call_command("workers", processes=0)
    with pytest.raises(CommandError, match="unknown handler"):
        call_command("workers", only=["nope"], burst=True)


# Real worker processes. --------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_burst_drains_a_tube_a_board_and_a_loop():
    drain = Tube.objects.create_tube("w-drain", "fifottl")
    task_ids = [drain.put({"n": i}).id for i in range(120)]
    builds = JobBoard.objects.create_board("w-board")
    jobs = [builds.post(f"job-{i}", {"n": i}).uuid for i in range(7)]
    WorkerLoop.objects.add(range(1, 26))

    done = run_workers(
        "--burst",
        "--processes",
        "2",
        "--only",
        "w-drain",
        "--only",
        "w-board",
        "--only",
        "testapp.workerloop",
    )

    assert done.returncode == 0, done.stderr
    assert ends("drain") == Counter({str(i): 1 for i in task_ids})
    assert ends("board") == Counter(jobs)
    assert ends("loop") == Counter({str(i): 1 for i in range(1, 26)})
    stats = drain.statistics()
    assert stats["tasks"]["total"] == 0
    assert stats["tasks"]["done"] == 120
    assert stats["calls"]["ack"] == 120
    assert builds.job_count == 0
    # Each worker process registered itself on the board and as the tube's consumer.
    assert BoardEntity.objects.filter(board=builds, kind="worker").count() == 2
    assert Consumer.objects.filter(name__endswith=":worker").count() >= 1
    assert WorkerLoop.objects.filter(last_updated__isnull=True).count() == 0
    assert WorkerLoop.objects.filter(lock_until__isnull=False).count() == 0
    # Two processes shared the work, and said what they did.
    assert len(set(WorkLog.objects.values_list("pid", flat=True))) >= 1
    assert "summary w-drain" in done.stderr
    # Batches are sized from the handler's time (at most its batch=50), and say what they did.
    batches = [
        (int(c), int(d)) for c, d in re.findall(r'tube "w-drain": (\d+) claimed, (\d+) done', done.stderr)
    ]
    assert sum(d for _, d in batches) == 120
    assert 1 <= max(c for c, _ in batches) <= 50


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_burst_drains_a_board_in_batches_each_job_once():
    builds = JobBoard.objects.create_board("w-board")
    jobs = [builds.post(f"job-{i}", {"n": i}, priority=("low", "high")[i % 2]).uuid for i in range(250)]

    done = run_workers("--burst", "--processes", "2", "--only", "w-board")

    assert done.returncode == 0, done.stderr
    assert ends("board") == Counter(jobs)
    assert builds.job_count == 0
    # Claimed a batch at a time (claim_many), settled a batch at a time (consume_many): fast
    # jobs in batches that grow towards the handler's 100.
    batches = [
        (int(c), int(d))
        for c, d in re.findall(
            r'board "w-board": (\d+) claimed, (\d+) done, 0 failed, 0 given back', done.stderr
        )
    ]
    assert sum(d for _, d in batches) == 250 and all(c == d for c, d in batches)
    assert 8 <= max(c for c, _ in batches) <= 100
    assert "lost their claim" not in done.stderr
    assert throughput_totals()[("job", "w-board")]["done"] == 250


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_verbose_worker_names_each_item_as_it_starts_and_ends():
    drain_tube = Tube.objects.create_tube("w-drain", "fifottl")
    ids = [drain_tube.put({"n": n}).id for n in range(3)]
    quiet = run_workers("--burst", "--only", "w-drain")
    assert quiet.returncode == 0, quiet.stderr
    assert "started" not in quiet.stderr
    ids += [drain_tube.put({"n": n}).id for n in range(3)]
    loud = run_workers("--burst", "--only", "w-drain", "-v", "2")
    assert loud.returncode == 0, loud.stderr
    for task_id in ids[3:]:
        assert f'task {task_id} of tube "w-drain": started' in loud.stderr
        assert f'task {task_id} of tube "w-drain": done' in loud.stderr


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_burst_with_nothing_to_do_exits_at_once():
    Tube.objects.create_tube("w-drain", "fifottl")
    started = time.monotonic()
    done = run_workers("--burst", "--only", "w-drain")
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 30
    assert "summary w-drain: 0 done" in done.stderr


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_failing_tube_task_is_retried_with_growing_delays_then_buried():
    failing = Tube.objects.create_tube("w-fail", "fifottl")
    task = failing.put({"x": 1})
    # Two processes: the attempt count lives in the database, so the limit holds across them.
    worker = start_workers(
        "--only",
        "w-fail",
        "--processes",
        "2",
        DJANGO_SETTINGS_MODULE="tests.workers_settings",
        TASKLOOP_OVERRIDES=FAST,
    )
    try:
        wait_until(lambda: failing.statistics()["tasks"]["buried"] == 1, timeout=60)
    finally:
        output = stop(worker)
    assert worker.returncode == 0, output
    tries = list(
        WorkLog.objects.filter(kind="fail", key=str(task.id)).order_by("at").values_list("at", flat=True)
    )
    assert len(tries) == 3  # MAX_ATTEMPTS
    gaps = [b - a for a, b in zip(tries, tries[1:], strict=False)]
    assert gaps[0] >= 0.25  # RETRY_BACKOFF
    assert gaps[1] >= 0.55  # doubled
    assert gaps[1] > gaps[0]
    assert failing.peek(task.id).state == "!"
    assert failing.peek(task.id).attempts == 3
    # Every failure is kept with its traceback, newest first (issue 14).
    seen = list(Failure.objects.for_item(failing.peek(task.id)))
    assert [f.attempt for f in seen] == [3, 2, 1]
    assert all(f.error == "builtins.RuntimeError" and "fails on purpose" in f.traceback for f in seen)
    assert throughput_totals()[("task", "w-fail")]["failed"] == 3
    assert (
        f'task {task.id} of tube "w-fail" failed (attempt 1 of 3), retrying in 0.3 s: RuntimeError: '
        in output
    )
    assert f'task {task.id} of tube "w-fail" failed (attempt 3 of 3), buried: RuntimeError: ' in output


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_failing_job_is_abandoned_then_trashed_and_failing_loop_id_backs_off():
    builds = JobBoard.objects.create_board("w-board")
    job = builds.post("bad", {"fail": True})
    good = builds.post("good", {})
    WorkerLoop.objects.add([-1, 1])
    worker = start_workers(
        "--only",
        "w-board",
        "--only",
        "testapp.workerloop",
        DJANGO_SETTINGS_MODULE="tests.workers_settings",
        TASKLOOP_OVERRIDES=FAST,
    )
    try:
        wait_until(lambda: WorkLog.objects.filter(kind="board", key=job.uuid).count() >= 3, timeout=60)
        wait_until(lambda: job.state == "COMPLETE", timeout=30)
        wait_until(lambda: WorkLog.objects.filter(kind="loop", key="-1").count() >= 3, timeout=60)
    finally:
        output = stop(worker)
    assert worker.returncode == 0, output
    job.refresh_from_db()
    assert job.trashed
    assert job.attempts == 3
    assert WorkLog.objects.filter(kind="board", key=job.uuid).count() == 3
    assert ends("board")[good.uuid] == 1
    # Retried with the tubes' growing delay (issue 12.5), not reclaimed at once.
    job_tries = list(
        WorkLog.objects.filter(kind="board", key=job.uuid).order_by("at").values_list("at", flat=True)
    )
    assert job_tries[1] - job_tries[0] >= 0.25, job_tries
    assert job_tries[2] - job_tries[1] >= 0.55, job_tries
    assert f'job bad ({job.uuid}) of board "w-board" failed (attempt 1 of 3), retrying in 0.3 s' in output
    assert f'job bad ({job.uuid}) of board "w-board" failed (attempt 3 of 3), trashed: RuntimeError' in output
    # The loop id never gives up, but waits longer each time; the good one ran once.
    tries = list(WorkLog.objects.filter(kind="loop", key="-1").order_by("at").values_list("at", flat=True))
    assert tries[1] - tries[0] >= 0.25
    assert tries[2] - tries[1] >= 0.55
    assert ends("loop")["1"] == 1
    assert [f.attempt for f in Failure.objects.for_item(job)] == [3, 2, 1]
    loop_failures = list(Failure.objects.for_item((WorkerLoop, -1)))
    assert len(loop_failures) >= 3 and loop_failures[-1].attempt == 1
    assert throughput_totals()[("job", "w-board")]["done"] == 1


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_sigterm_lets_work_in_hand_finish_nothing_lost_nothing_twice():
    slow = Tube.objects.create_tube("w-slow", "fifottl", ttr=2)
    ids = [slow.put({"sleep": 0.4}).id for _ in range(9)]
    worker = start_workers(
        "--only", "w-slow", DJANGO_SETTINGS_MODULE="tests.workers_settings", TASKLOOP_OVERRIDES=FAST
    )
    try:
        wait_until(lambda: WorkLog.objects.filter(kind="slow", phase="start").exists(), timeout=60)
    except BaseException:
        stop(worker)
        raise
    output = stop_once(worker)
    assert worker.returncode == 0, output
    assert "finishing work in hand" in output
    first = ends("slow")
    assert first, output
    # Everything started was finished; what was not started went back to ready.
    assert set(WorkLog.objects.filter(kind="slow", phase="start").values_list("key", flat=True)) == set(
        first
    ), output
    assert slow.statistics()["tasks"]["taken"] == 0, output
    again = run_workers("--burst", "--only", "w-slow")
    assert again.returncode == 0, again.stderr
    assert ends("slow") == Counter({str(i): 1 for i in ids}), output + again.stderr
    assert slow.statistics()["tasks"]["total"] == 0


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_second_signal_gives_everything_back_at_once():
    slow = Tube.objects.create_tube("w-slow", "fifottl", ttr=2)
    task = slow.put({"sleep": 60})
    worker = start_workers(
        "--only", "w-slow", DJANGO_SETTINGS_MODULE="tests.workers_settings", TASKLOOP_OVERRIDES=FAST
    )
    try:
        wait_until(lambda: WorkLog.objects.filter(kind="slow", phase="start").exists(), timeout=60)
        started = time.monotonic()
        output = stop_hard(worker)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert time.monotonic() - started < 15
    assert worker.returncode == 0, output
    assert "giving everything back now" in output
    assert "1 given back" in output
    assert slow.peek(task.id).state == "r"
    assert not ends("slow")


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_work_still_running_when_the_grace_period_ends_is_given_back():
    slow = Tube.objects.create_tube("w-slow", "fifottl", ttr=2)
    task = slow.put({"sleep": 60})
    worker = start_workers(
        "--only",
        "w-slow",
        DJANGO_SETTINGS_MODULE="tests.workers_settings",
        TASKLOOP_OVERRIDES='{"GRACE_PERIOD": 1, "HEARTBEAT_INTERVAL": 0.5}',
    )
    try:
        wait_until(lambda: WorkLog.objects.filter(kind="slow", phase="start").exists(), timeout=60)
    except BaseException:
        stop(worker)
        raise
    started = time.monotonic()
    output = stop_once(worker)
    assert 0.9 < time.monotonic() - started < 15
    assert worker.returncode == 0, output
    assert "grace period over" in output
    assert slow.peek(task.id).state == "r"
    assert not ends("slow")


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_heartbeats_keep_a_task_longer_than_its_ttr():
    slow = Tube.objects.create_tube("w-slow", "fifottl", ttr=2)
    task = slow.put({"sleep": 4})
    done = run_workers(
        "--burst",
        "--only",
        "w-slow",
        DJANGO_SETTINGS_MODULE="tests.workers_settings",
        TASKLOOP_OVERRIDES=FAST,
    )
    assert done.returncode == 0, done.stderr
    assert ends("slow") == Counter({str(task.id): 1})
    stats = slow.statistics()
    assert stats["calls"]["ttr"] == 0  # the 2 s ttr never ran out under the 4 s handler
    assert stats["calls"]["touch"] >= 4
    assert stats["calls"]["ack"] == 1
    assert "lost their lease" not in done.stderr


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_heartbeats_keep_loop_ids_locked_past_lock_for():
    WorkerLoop.objects.add([1000, 1001])
    done = run_workers(
        "--burst",
        "--processes",
        "2",
        "--only",
        "w-loop-slow",
        DJANGO_SETTINGS_MODULE="tests.workers_settings",
        TASKLOOP_OVERRIDES='{"HEARTBEAT_INTERVAL": 0.2}',
    )
    assert done.returncode == 0, done.stderr
    # lock_for=1 under a 2.5 s handler: without renewal the other process would run them too.
    starts = Counter(WorkLog.objects.filter(kind="loop-slow", phase="start").values_list("key", flat=True))
    assert starts == Counter({"1000": 1, "1001": 1})
    assert ends("loop-slow") == Counter({"1000": 1, "1001": 1})
    assert WorkerLoop.objects.filter(last_updated__isnull=False).count() == 2


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_kill_9_of_a_worker_holding_tasks_runs_them_again_and_acks_each_once():
    slow = Tube.objects.create_tube("w-slow", "fifottl", ttr=2)
    ids = [slow.put({"sleep": 0.5}).id for _ in range(8)]
    supervisor = start_workers(
        "--only",
        "w-slow",
        "--processes",
        "2",
        DJANGO_SETTINGS_MODULE="tests.workers_settings",
        TASKLOOP_OVERRIDES=FAST,
    )
    try:
        first = wait_until(lambda: WorkLog.objects.filter(kind="slow", phase="start").first(), timeout=60)
        assert first.pid in children_of(supervisor.pid)
        os.kill(first.pid, signal.SIGKILL)
        # The victim's tasks come back once their ttr (2 s) runs out; the supervisor starts
        # a new child in the victim's place.
        wait_until(lambda: slow.statistics()["tasks"]["total"] == 0, timeout=90)
        assert len(children_of(supervisor.pid)) == 2
    finally:
        output = stop(supervisor)
    assert supervisor.returncode == 0, output
    assert "died with status -9; restarting it" in output
    stats = slow.statistics()
    assert stats["tasks"]["done"] == 8
    assert stats["calls"]["ack"] == 8  # each acknowledged exactly once
    assert stats["calls"]["ttr"] >= 1  # ... after the victim's lease ran out
    finished = ends("slow")
    assert set(finished) == {str(i) for i in ids}
    # Only what the victim held may have run twice.
    victim = set(WorkLog.objects.filter(kind="slow", pid=first.pid).values_list("key", flat=True))
    assert {key for key, n in finished.items() if n > 1} <= victim


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_an_idle_worker_picks_up_a_put_promptly():
    drain = Tube.objects.create_tube("w-drain", "fifottl")
    worker = start_workers("--only", "w-drain")
    latencies = []
    try:
        warm = drain.put({})
        wait_until(lambda: ends("drain")[str(warm.id)], timeout=60)
        for _ in range(15):
            time.sleep(0.3)  # let the worker go idle again
            put_at = time.time()
            task = drain.put({})
            logged = wait_until(
                lambda key=str(task.id): WorkLog.objects.filter(kind="drain", key=key).first(), timeout=30
            )
            latencies.append(logged.at - put_at)
    finally:
        output = stop(worker)
    assert worker.returncode == 0, output
    latencies.sort()
    median = latencies[len(latencies) // 2]
    print(f"idle pickup: median {median * 1000:.1f} ms, max {latencies[-1] * 1000:.1f} ms")
    # SPEC: take() sees a put from another process within 100 ms; generous for a busy machine.
    assert median < 0.5


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_children_stop_when_their_supervisor_is_killed():
    Tube.objects.create_tube("w-drain", "fifottl")
    supervisor = start_workers("--only", "w-drain", "--processes", "2")
    children: list[int] = []

    try:
        children = wait_until(
            lambda: len(children_of(supervisor.pid)) == 2 and children_of(supervisor.pid), timeout=60
        )
        time.sleep(1)  # let them reach their idle loop
        supervisor.kill()
        supervisor.communicate(timeout=30)
        wait_until(lambda: not any(alive(pid) for pid in children), timeout=30)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
        for pid in children:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_demo_command_moves_work_in_every_facade(tmp_path):
    log = tmp_path / "workers.log"
    for _ in (1, 2):  # a second run tells the same story
        out = io.StringIO()
        before = signal.getsignal(signal.SIGTERM)
        call_command("demo", articles=30, processes=1, log=str(log), stdout=out)
        assert signal.getsignal(signal.SIGTERM) is before  # the in-process worker gave it back
        text = out.getvalue()
        before_part, after_part = text.split("After:")
        assert "articles reviewed:          5 of 30" in before_part, text
        assert "30 ids waiting for their first check" in before_part
        assert "5 feeds, fetched 0 times in all" in before_part
        assert "board demo-builds:          10 jobs waiting" in before_part
        assert "30 e-mails ready to send, 0 sent" in before_part
        assert f"(its log: {log})" in before_part
        assert "articles reviewed:          30 of 30" in after_part
        assert "0 ids waiting for their first check" in after_part
        assert "5 feeds, fetched 5 times in all" in after_part
        assert "board demo-builds:          0 jobs waiting" in after_part
        assert "0 e-mails ready to send, 30 sent" in after_part
        # The Django Task agrees with the numbers above it.
        assert "then: SUCCESSFUL, 30 of 30 articles reviewed" in after_part
        # The worker's log went to the file, not between the story's lines.
        assert "INFO" not in text and "summary" not in text
        assert "summary demo-emails" in log.read_text()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_running_workers_honour_a_pause_within_a_second_and_show_as_alive():
    drain_tube = Tube.objects.create_tube("w-drain", "fifottl")
    worker = start_workers("--only", "w-drain", "--only", "testapp.workerloop")
    try:
        live = wait_until(lambda: list(WorkerProcess.objects.alive()), timeout=60)
        assert sorted(live[0].queues) == ["loop:testapp.workerloop", "task:w-drain"]
        drain_tube.pause()
        WorkerLoop.objects.pause()
        time.sleep(1.2)  # a worker honours a pause within a second
        paused_task = drain_tube.put({"n": 1})
        WorkerLoop.objects.add([7])
        time.sleep(1.5)
        assert drain_tube.peek(paused_task.id).state == "r"
        assert not ends("loop")
        drain_tube.resume()
        WorkerLoop.objects.resume()
        wait_until(lambda: ends("drain")[str(paused_task.id)] == 1 and ends("loop")["7"] == 1, timeout=30)
    finally:
        output = stop(worker)
    assert worker.returncode == 0, output
    assert not WorkerProcess.objects.exists()  # it said goodbye
