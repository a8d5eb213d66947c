"""``manage.py taskloop``: the operator's terminal, run as a real subprocess on the test database.

Each test writes real rows through the facades, runs the command in a process of its own, and
checks what it printed, its exit status and what it changed (or, for bad input, that nothing
changed and the error is one line on stderr, never a traceback).
"""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import pty
import re
import signal
import socket
import subprocess
import sys
from typing import Any

import pytest
from django.db import connections

from django_taskloop import engine
from django_taskloop.management.terminal import status as terminal_status
from django_taskloop.models import ConsumedJob, Failure, Job, JobBoard, Task, TaskRecord, Tube, WorkerProcess
from django_taskloop.testing import run_queued
from tests.testapp.models import IntLoop

from .workers_util import ROOT, child_env, explode, manage, run_workers
from .workers_util import taskloop as taskloop_process
from .workers_util import taskloop_here as taskloop

# The terminal runs in this process (taskloop_here: what a process start would cost, 54 times,
# without it) but where only a process shows it: Django's options and the exit of a refusal's
# --traceback, the command line's unknown options (taskloop_process), --watch's signals and
# other databases (their own subprocesses).

try:
    from django.tasks import TaskResultStatus
except ImportError:  # Django 5.2: the backport
    from django_tasks import TaskResultStatus

pytestmark = pytest.mark.django_db(transaction=True)


def refused(run: subprocess.CompletedProcess[str], says: str) -> None:
    """Assert that ``run`` exited 2 with one line on stderr that contains ``says``."""
    assert run.returncode == 2, (run.stdout, run.stderr)
    assert run.stderr.count("\n") == 1 and "Traceback" not in run.stderr, run.stderr
    assert says in run.stderr, run.stderr
    assert run.stdout == ""


def fail(kind: str, queue: str, item: Any, message: str = "smtp said no", attempt: int = 1) -> Failure:
    """Record a failure as a worker does."""
    try:
        raise ConnectionRefusedError(message)
    except ConnectionRefusedError as error:
        return Failure.objects.record(
            kind=kind, queue=queue, item=item, attempt=attempt, worker="w-1", error=error
        )


def row(output: str, name: str) -> list[str]:
    """Return the cells of the table line of queue ``name``."""
    (line,) = [line for line in output.splitlines() if line.split(" ", 1)[0] == name]
    return line.split()


def buried_tube(name: str = "t-emails", ready: int = 2) -> tuple[Tube, Task]:
    tube = Tube.objects.create_tube(name, "fifo")
    for n in range(ready):
        tube.put({"n": n})
    buried = tube.put({"n": "bad"})
    tube.bury(buried.id)
    return tube, buried


def trashed_job(board: JobBoard, name: str = "build-1") -> Job:
    job = board.post(name)
    board.claim(job, "w-1")
    board.trash(job, "w-1")
    return job


# -- status ----------------------------------------------------------------------------------------


def test_status_shows_each_queue_with_its_counts_wait_failures_workers_and_pause():
    tube, buried = buried_tube()
    tube.pause()
    board = JobBoard.objects.create_board("t-builds")
    board.post("build-2")
    trashed_job(board)
    IntLoop.objects.add([1, 2, 3])
    IntLoop.objects.bump(2)
    fail("task", "t-emails", buried.id)
    fail("task", "t-emails", buried.id, attempt=2)
    WorkerProcess.objects.beat("h:1", host="h", pid=1, queues=["task:t-emails", "job:t-builds"], holding={})

    run = taskloop("status")

    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert "TUBES" in out and "JOB BOARDS" in out and "LOOPS" in out
    # name, ready, taken, delayed, buried, expired, latency (2 cells: "1.2 s"), failed 1h, workers, state
    cells = row(out, "t-emails")
    assert cells[1:6] == ["2", "0", "0", "1", "0"]
    assert cells[-3:] == ["2", "1", "paused"]
    assert row(out, "t-builds")[1:5] == ["1", "0", "0", "1"]
    assert row(out, "t-builds")[-3:] == ["0", "1", "running"]
    loop = row(out, "testapp.intloop")
    assert loop[1:5] == ["2", "0", "0", "1"] and loop[-1] == "running"
    assert "1 live worker process;" in out and "2 failures in the last hour" in out
    assert max(len(line) for line in out.splitlines()) <= 100


def test_status_names_a_django_tasks_queue_by_its_django_name_and_reads_json():
    explode.enqueue("boom")
    WorkerProcess.objects.beat(
        "h:2", host="h", pid=2, queues=["task:tasks.slow", "task:tasks-keyed.slow"], holding={}
    )

    run = taskloop("status", "--json")

    assert run.returncode == 0, run.stderr
    queues = {(q["kind"], q["name"]): q for q in json.loads(run.stdout)["queues"]}
    slow = queues[("django_task", "slow")]  # explode's queue
    assert slow["counts"]["ready"] == 1
    assert slow["workers"] == 1  # one process serving both tubes counts once
    assert "tasks.slow" in slow["tubes"]
    assert slow["paused"] is False and slow["oldest_ready_seconds"] >= 0
    assert not any(name.startswith("tasks.") for _kind, name in queues)

    only = taskloop("status", "slow")
    assert only.returncode == 0, only.stderr
    assert row(only.stdout, "slow")[1] == "1" and "tasks.slow" not in only.stdout


def test_a_django_task_that_failed_for_good_stays_counted_until_an_operator_retries_it(client):
    """Its tube task is gone; its FAILED result is what is left. Status (text and JSON), the
    metrics and the dashboard count it hours after its failure too (the failures of the last
    hour no longer do), until an operator retries it."""
    from django.contrib.auth.models import User
    from django.urls import reverse

    from django_taskloop.metrics import render_metrics

    result = explode.enqueue("boom")
    burst = run_workers("--burst", "--only", "tasks.slow")
    assert burst.returncode == 0, burst.stderr
    assert TaskRecord.objects.get(pk=result.id).status == TaskResultStatus.FAILED
    assert not Task.objects.exists()
    # Its failure is named as the queue's, and the name shown is one the terminal takes back.
    shown = taskloop("failures").stdout
    assert " slow (tasks) " in shown, shown
    only = taskloop("failures", "--queue", "slow (tasks)")
    assert only.returncode == 0, only.stderr
    assert [line.split(" ago ")[1] for line in only.stdout.splitlines()[1:]] == [
        line.split(" ago ")[1] for line in shown.splitlines()[1:]
    ]
    # Two hours on: the failure is older than the last hour.
    Failure.objects.update(at=engine.db_now() - dt.timedelta(hours=2))

    slow = next(q for q in json.loads(taskloop("status", "--json").stdout)["queues"] if q["name"] == "slow")
    assert slow["counts"]["failed"] == 1 and slow["failures_last_hour"] == 0, slow
    status = taskloop("status").stdout
    header = next(line for line in status.splitlines() if "DJANGO TASKS" in line)
    cells, names = row(status, "slow"), header.split()
    assert cells[names.index("FAILED") - 1] == "1", (header, cells)  # ("DJANGO TASKS" is two words)
    assert max(len(line) for line in status.splitlines()) <= 100, status
    assert 'taskloop_items{queue="slow",kind="django_task",state="failed"} 1' in render_metrics()
    client.force_login(User.objects.create_superuser("boss", "boss@example.com", "pw"))
    page = client.get(reverse("admin:django_taskloop_dashboard")).content.decode()
    table_row = page.split('data-queue-row="slow"', 1)[1].split("</tr>", 1)[0]
    assert "1 failed</span>" in table_row  # the "failed for good" column, linked to them:
    link = re.search(r'<a href="([^"]*status__exact=FAILED)"><span class="tl-state tl-failed">', table_row)
    assert link is not None, table_row
    listed = client.get(link.group(1).replace("&amp;", "&")).content.decode()
    assert result.id in listed, listed

    assert taskloop("retry", "slow", result.id).returncode == 0
    slow = next(q for q in json.loads(taskloop("status", "--json").stdout)["queues"] if q["name"] == "slow")
    assert slow["counts"]["failed"] == 0 and slow["counts"]["ready"] == 1, slow
    assert 'taskloop_items{queue="slow",kind="django_task",state="failed"} 0' in render_metrics()


def test_status_counts_each_state_up_to_a_cap_and_exact_counts_all(monkeypatch):
    buried_tube(ready=3)
    monkeypatch.setattr(terminal_status, "COUNT_CAP", 2)

    assert row(terminal_status.render([], False), "t-emails")[1:5] == ["2+", "0", "0", "1"]
    (queue,) = [q for q in json.loads(terminal_status.render([], True))["queues"] if q["name"] == "t-emails"]
    assert queue["capped"] == ["ready"] and queue["counts"]["ready"] == 2
    assert row(terminal_status.render([], False, exact=True), "t-emails")[1] == "3"
    assert row(taskloop("status", "--exact").stdout, "t-emails")[1] == "3"


def test_status_of_an_unknown_queue_is_one_line_and_status_2():
    Tube.objects.create_tube("t-known", "fifo")
    run = taskloop("status", "t-nope")
    refused(run, "no queue named 't-nope' (known: ")
    assert "t-known" in run.stderr
    refused(taskloop("status", "job:t-known"), "no board named 't-known'")


def test_djangos_own_options_go_after_the_action_too():
    """Django users put ``--settings`` (and ``--traceback``, ``--no-color``, ``--pythonpath``,
    ``-v``) last; every management command takes them there. ``--settings`` after the action is
    the one used (the environment's names a module that does not exist)."""
    Tube.objects.create_tube("t-known", "fifo")
    run = manage(
        *("taskloop", "status", "t-known", "--settings", "tests.settings", "--no-color"),
        *("--pythonpath", str(ROOT), "-v", "2", "--skip-checks"),
        env=child_env(DJANGO_SETTINGS_MODULE="tests.no_such_settings"),
    )
    assert run.returncode == 0 and row(run.stdout, "t-known")[1] == "0", run.stderr
    # --traceback after the action: Django's (a refusal shows its traceback)...
    traced = taskloop_process("pause", "t-nope", "--traceback")
    assert traced.returncode != 0 and "Traceback (most recent call last)" in traced.stderr, traced.stderr
    # ... but for failures its own: each failure's traceback.
    assert taskloop_process("failures", "--traceback").stdout == "No failures.\n"
    # An option nobody knows, before or after the action: one line, status 2.
    for args in (("status", "--bogus"), ("--bogus", "status")):
        bad = taskloop_process(*args)
        assert bad.returncode == 2 and bad.stdout == "", bad
        assert bad.stderr.count("\n") == 1 and "unrecognized arguments: --bogus" in bad.stderr, bad.stderr


def _on_database(tmp_path: Any, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``manage.py taskloop ARGS`` with the suite's settings on the database ``url``."""
    connections.close_all()
    return subprocess.run(
        [sys.executable, "-m", "django", "taskloop", *args],
        env={**child_env(), "DATABASE_URL": url},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("action", [["status"], ["failures"], ["retry", "emails", "--all"]])
def test_a_database_without_the_tables_says_run_migrate_in_one_line(tmp_path, action):
    run = _on_database(tmp_path, f"sqlite:///{tmp_path}/empty.sqlite3", *action)
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    (line,) = run.stderr.strip().splitlines()
    assert "lacks the tables of django_taskloop" in line and "run manage.py migrate" in line, line


@pytest.mark.parametrize(
    "scheme", ["postgres", pytest.param("mysql", marks=pytest.mark.needs_module("MySQLdb", "mysql"))]
)
def test_a_database_that_is_down_is_one_line(tmp_path, scheme):
    with socket.socket() as free:  # a port where no server listens
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    # (MySQL: Django 6's system checks read the server's version before the command runs.)
    run = _on_database(tmp_path, f"{scheme}://nobody@127.0.0.1:{port}/none", "status")
    assert run.returncode == 1, run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    (line,) = run.stderr.strip().splitlines()
    assert f"database 'default' (127.0.0.1:{port}) is unreachable" in line, line


def test_watch_refreshes_until_sigterm_and_stops_cleanly():
    buried_tube()
    connections.close_all()
    watcher = subprocess.Popen(
        [sys.executable, "-m", "django", "taskloop", "status", "--watch", "0.2"],
        env=child_env(),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert watcher.stdout is not None
    seen = ""
    while seen.count("TUBES") < 2:
        line = watcher.stdout.readline()
        assert line, f"the watcher ended: {watcher.wait()}, {seen}"
        seen += line
    watcher.send_signal(signal.SIGTERM)
    out, err = watcher.communicate(timeout=60)
    assert watcher.returncode == 0, err
    assert err == ""
    text = seen + out
    assert text.count("TUBES") >= 2  # refreshed: blocks one after another, not in place
    assert "\x1b[" not in text


def test_watch_on_a_terminal_clears_the_screen_and_stops_on_ctrl_c():
    buried_tube()
    connections.close_all()
    leader, follower = pty.openpty()
    watcher = subprocess.Popen(
        [sys.executable, "-m", "django", "taskloop", "status", "--watch", "0.2"],
        env=child_env(),
        cwd=ROOT,
        stdout=follower,
        stderr=subprocess.PIPE,
    )
    os.close(follower)
    seen = b""
    while seen.count(b"\x1b[H\x1b[2J") < 2:
        chunk = os.read(leader, 4096)  # (OSError once the watcher is gone: the test fails)
        assert chunk, seen
        seen += chunk
    watcher.send_signal(signal.SIGINT)
    # Read on until the watcher closes the terminal: a full terminal buffer would block its write.
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # EIO: the watcher is gone
            break
        if not chunk:
            break
    _out, err = watcher.communicate(timeout=60)
    os.close(leader)
    assert watcher.returncode == 0, err
    assert b"Traceback" not in err and b"t-emails" in seen


def test_watch_says_when_the_database_fails_and_reads_again():
    calls = []

    def draw() -> str:
        calls.append(1)
        if len(calls) == 1:
            with connections["default"].cursor() as cursor:
                cursor.execute("SELECT * FROM taskloop_no_such_table")
        os.kill(os.getpid(), signal.SIGTERM)  # the watch's own handler: stop after this one
        return terminal_status.render([], False)

    out = io.StringIO()
    before = signal.getsignal(signal.SIGTERM)
    terminal_status.watch(0.01, draw, out, tty=False)

    first, second = out.getvalue().split("\n", 1)
    assert first.startswith("Cannot read the queues: ") and "taskloop_no_such_table" in first
    assert "queues (0 paused)" in second and len(calls) == 2
    assert signal.getsignal(signal.SIGTERM) is before  # given back


# -- failures --------------------------------------------------------------------------------------


def test_failures_lists_the_newest_first_with_their_error_and_filters_by_queue_and_since():
    fail("task", "t-emails", 7, "first")
    old = fail("job", "t-builds", "0b1c", "old one")
    Failure.objects.filter(pk=old.pk).update(at=engine.DbNow(-7200))
    fail("task", "t-emails", 8, "connection refused by smtp.example.com " * 5)
    JobBoard.objects.create_board("t-builds")
    Tube.objects.create_tube("t-emails", "fifo")

    run = taskloop("failures")
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].split() == ["WHEN", "QUEUE", "ITEM", "TRY", "ERROR", "MESSAGE"]
    where = [re.search(r" ago\s+(\S+)\s+(\S+)\s+(\d+)  ", line).groups() for line in lines[1:]]
    assert where == [("t-emails", "8", "1"), ("t-emails", "7", "1"), ("t-builds", "0b1c", "1")]
    assert "ConnectionRefusedError" in lines[1] and lines[1].endswith("…")
    assert max(len(line) for line in lines) <= 100

    recent = taskloop("failures", "--since", "1h")
    assert "t-builds" not in recent.stdout and recent.stdout.count("t-emails") == 2
    builds = taskloop("failures", "--queue", "t-builds", "--traceback")
    assert builds.stdout.count("old one") == 2 and "Traceback (most recent call last)" in builds.stdout

    data = json.loads(taskloop("failures", "--json", "--limit", "1").stdout)["failures"]
    assert [(f["kind"], f["queue"], f["item"]) for f in data] == [("task", "t-emails", "8")]
    assert data[0]["error"] == "builtins.ConnectionRefusedError" and "Traceback" in data[0]["traceback"]


def test_failures_with_long_ids_put_each_message_on_a_line_of_its_own():
    board = JobBoard.objects.create_board("t-builds")
    job = trashed_job(board)
    fail("job", "t-builds", job.uuid, "the compiler ran out of memory " * 2, attempt=3)

    run = taskloop("failures", "--queue", "t-builds")

    assert run.returncode == 0, run.stderr
    header, line, message = run.stdout.splitlines()
    assert header.split() == ["WHEN", "QUEUE", "ITEM", "TRY", "ERROR"]
    assert f"t-builds  {job.uuid}    3  ConnectionRefusedError" in line
    assert message == "    " + ("the compiler ran out of memory " * 2).strip()


def test_failures_refuses_a_bad_since_and_an_unknown_queue():
    refused(taskloop("failures", "--since", "yesterday"), "--since takes a duration")
    refused(taskloop("failures", "--queue", "t-nope"), "no queue named 't-nope'")


# -- retry -----------------------------------------------------------------------------------------


def test_retry_kicks_the_named_buried_tasks():
    tube, first = buried_tube()
    second = tube.put({"n": "bad too"})
    tube.bury(second.id)

    run = taskloop("retry", "t-emails", str(first.id), str(second.id))

    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [
        f"kicked task {first.id} of tube t-emails back to ready",
        f"kicked task {second.id} of tube t-emails back to ready",
    ]
    assert tube.tasks.buried().count() == 0 and tube.tasks.ready().count() == 4


def test_retry_all_kicks_every_buried_task_of_the_tube_only():
    tube, _ = buried_tube()
    tube.bury(tube.put({"n": 9}).id)
    other, _ = buried_tube("t-other")

    run = taskloop("retry", "t-emails", "--all")

    assert run.stdout == "kicked 2 buried tasks of tube t-emails back to ready\n", run.stderr
    assert tube.tasks.buried().count() == 0 and other.tasks.buried().count() == 1


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ((), "name the ids to retry, or say --all"),
        (("{id}", "--all"), "needs the ids to retry, or --all for every failed item (not both)"),
        (("{id}", "999999"), "no task 999999 in tube t-emails"),
        (("{id}", "abc"), "a tube task id is a whole number, not 'abc'"),
        (("{ready}",), "is ready, not buried: nothing to retry"),
    ],
)
def test_retry_refuses_without_a_target_or_with_a_bad_id_and_changes_nothing(args, says):
    tube, buried = buried_tube()
    ready = tube.tasks.ready().values_list("pk", flat=True).first()
    filled = [arg.format(id=buried.id, ready=ready) for arg in args]

    refused(taskloop("retry", "t-emails", *filled), says)

    assert list(tube.tasks.buried().values_list("pk", flat=True)) == [buried.id]


def test_retry_reposts_trashed_jobs_and_refuses_a_live_one():
    board = JobBoard.objects.create_board("t-builds")
    first, second = trashed_job(board, "a"), trashed_job(board, "b")
    live = board.post("c")

    refused(
        taskloop("retry", "t-builds", first.uuid, live.uuid),
        f"job {live.uuid} of board t-builds is not trashed",
    )
    refused(taskloop("retry", "t-builds", "no-such-uuid"), "no job no-such-uuid on board t-builds")
    assert board.jobs.filter(name="a").count() == 1

    one = taskloop("retry", "t-builds", first.uuid)
    assert one.returncode == 0, one.stderr
    assert one.stdout.startswith(f"re-posted job {first.uuid} of board t-builds as ")
    again = taskloop("retry", "t-builds", first.uuid)
    refused(again, f"job {first.uuid} of board t-builds was re-posted already")

    rest = taskloop("retry", "t-builds", "--all")
    assert rest.stdout.count("re-posted job") == 1 and second.uuid in rest.stdout
    assert board.jobs.claimable().count() == 3  # c, and a and b again


def test_retry_bumps_loop_ids_so_they_run_next():
    IntLoop.objects.add([1, 2, 3])
    IntLoop.objects.did([1, 2, 3])
    fail("loop", "testapp.intloop", 3)

    refused(taskloop("retry", "testapp.intloop", "2", "99"), "no id 99 in loop testapp.intloop")
    refused(taskloop("retry", "testapp.intloop", "x"), "'x' is not an id of loop testapp.intloop")
    assert IntLoop.objects.bumped().count() == 0

    run = taskloop("retry", "testapp.intloop", "2")
    assert run.stdout == "bumped 1 id of loop testapp.intloop: it runs next\n", run.stderr
    assert list(IntLoop.objects.bumped().values_list("pk", flat=True)) == [2]
    failed = taskloop("retry", "loop:testapp.intloop", "--all")
    assert failed.returncode == 0, failed.stderr
    assert sorted(IntLoop.objects.bumped().values_list("pk", flat=True)) == [2, 3]


def test_retry_runs_a_failed_django_task_again_as_the_same_result():
    result = explode.enqueue("boom")
    run_queued()
    assert TaskRecord.objects.get(pk=result.id).status == TaskResultStatus.FAILED
    done = explode.enqueue("not yet")

    refused(taskloop("retry", "slow", done.id), "only a FAILED task can be retried")
    refused(taskloop("retry", "slow", "nope"), "no result nope in Django Tasks queue slow")

    run = taskloop("retry", "slow", result.id)
    assert run.stdout == f"retried result {result.id} of Django Tasks queue slow: READY again\n", run.stderr
    assert TaskRecord.objects.get(pk=result.id).status == TaskResultStatus.READY


# -- pause and resume ------------------------------------------------------------------------------


def test_alive_says_whether_a_worker_process_on_this_host_beats():
    """``taskloop alive``: a process manager's or Kubernetes' health check (exit 0 or 1, one line)."""
    import socket

    dead = taskloop("alive")
    assert dead.returncode == 1 and dead.stdout == "", dead
    assert f"no live worker process on host {socket.gethostname()}" in dead.stderr
    WorkerProcess.objects.beat("here:1", host=socket.gethostname(), pid=1, queues=[], holding={})
    WorkerProcess.objects.beat("far:2", host="far", pid=2, queues=[], holding={})
    WorkerProcess.objects.filter(identity="far:2").update(beat_at=engine.DbNow(-3600))
    live = taskloop("alive")
    assert live.returncode == 0 and live.stdout.startswith("1 live worker process on host "), live
    assert taskloop("alive", "--host", "far").returncode == 1  # its last beat is an hour old


def test_pause_and_resume_every_kind_of_queue():
    tube, _ = buried_tube()
    board = JobBoard.objects.create_board("t-builds")
    explode.enqueue("boom")

    run = taskloop("pause", "t-emails", "t-builds", "testapp.intloop", "slow")
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [
        "paused tube t-emails",
        "paused board t-builds",
        "paused loop testapp.intloop",
        "paused Django Tasks queue slow",
    ]
    assert tube.paused and board.paused and IntLoop.objects.paused()
    assert Tube.objects.get(name="tasks.slow").paused
    assert taskloop("pause", "t-emails").stdout == "tube t-emails was paused already\n"
    assert row(taskloop("status").stdout, "t-emails")[-1] == "paused"

    back = taskloop("resume", "t-emails", "t-builds", "testapp.intloop", "slow")
    assert back.returncode == 0, back.stderr
    assert not tube.paused and not board.paused and not IntLoop.objects.paused()
    assert not Tube.objects.get(name="tasks.slow").paused
    assert taskloop("resume", "t-emails").stdout == "tube t-emails was not paused\n"


def test_pause_refuses_an_ambiguous_or_unknown_name_and_pauses_nothing():
    tube = Tube.objects.create_tube("t-same", "fifo")
    board = JobBoard.objects.create_board("t-same")

    refused(taskloop("pause", "t-same"), "'t-same' names 2 queues: say which, as task:t-same or job:t-same")
    refused(taskloop("pause", "job:t-same", "t-nope"), "no queue named 't-nope'")
    assert not tube.paused and not board.paused

    assert taskloop("pause", "job:t-same").stdout == "paused board t-same\n"
    assert board.paused and not tube.paused


# -- prune -----------------------------------------------------------------------------------------


def test_prune_deletes_only_rows_older_than_asked_and_a_dry_run_deletes_nothing(settings):
    settings.TASKLOOP = {**getattr(settings, "TASKLOOP", {}), "JOB_HISTORY_RETENTION": 30 * 86400}
    old, new = fail("task", "t-emails", 1), fail("task", "t-emails", 2)
    Failure.objects.filter(pk=old.pk).update(at=engine.DbNow(-3 * 86400))
    board = JobBoard.objects.create_board("t-builds")
    for name in ("a", "b"):
        job = board.post(name)
        board.claim(job, "w")
        board.consume(job, "w")
    ConsumedJob.objects.filter(name="a").update(consumed_at=engine.DbNow(-3 * 86400))
    result = explode.enqueue("boom")
    run_queued()
    TaskRecord.objects.filter(pk=result.id).update(finished_at=engine.DbNow(-3 * 86400))

    dry = taskloop("prune", "--older-than", "2d", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines() == [
        "failures older than 2 d: would delete 1",
        "finished Django Task results older than 2 d: would delete 1",
        "consumed jobs' history older than 2 d: would delete 1",
    ]
    assert (
        Failure.objects.count() == 2 and ConsumedJob.objects.count() == 2 and TaskRecord.objects.count() == 1
    )

    only = taskloop("prune", "--older-than", "2d", "--only", "failures")
    assert only.stdout == "failures older than 2 d: deleted 1\n", only.stderr
    assert list(Failure.objects.values_list("pk", flat=True)) == [new.pk]
    assert ConsumedJob.objects.count() == 2

    rest = taskloop("prune", "--older-than", "2d")
    assert "finished Django Task results older than 2 d: deleted 1" in rest.stdout
    assert (
        list(ConsumedJob.objects.values_list("name", flat=True)) == ["b"] and not TaskRecord.objects.exists()
    )


def test_prune_needs_an_explicit_age():
    fail("task", "t-emails", 1)
    run = taskloop("prune")
    assert run.returncode == 2 and "--older-than" in run.stderr and "Traceback" not in run.stderr
    assert run.stderr.count("\n") == 1
    refused(taskloop("prune", "--older-than", "soon"), "--older-than takes a duration")
    assert Failure.objects.count() == 1


# -- the documented examples -----------------------------------------------------------------------

DOCS = ROOT / "docs" / "operating.md"
EXAMPLE = re.compile(r"<!-- terminal-example -->\n```console\n(.*?)```", re.S)
#: Outputs that do not depend on the moment or on ids: compared as written.
EXACT = ("pause", "resume", "prune")


def documented() -> list[tuple[list[str], list[str]]]:
    """Return ``(arguments, output lines)`` of every example command in docs/operating.md."""
    examples = []
    for block in EXAMPLE.findall(DOCS.read_text()):
        for chunk in block.split("$ python manage.py taskloop ")[1:]:
            command, *output = chunk.rstrip("\n").split("\n")
            examples.append((command.split(), output))
    return examples


def test_the_documented_examples_run_as_written():
    """The examples without ids (those with ids are the retry tests above): each exits 0 on the
    queues the docs name; pause, resume and prune print what the docs say, the tables their
    documented columns. ``--watch`` runs until stopped: its own tests above."""
    tube, _ = buried_tube("emails")
    fail("task", "emails", 1)
    board = JobBoard.objects.create_board("builds")
    fail("job", "builds", trashed_job(board).uuid)
    Tube.objects.create_tube("tasks.default", "fifottl")
    examples = documented()
    assert len(examples) >= 8, examples

    for args, output in examples:
        if "--watch" in args:
            continue
        run = taskloop(*args)
        assert run.returncode == 0, (args, run.stderr)
        if args[0] in EXACT:
            assert run.stdout.splitlines() == output, args
        elif output:
            assert run.stdout.splitlines()[0].split() == output[0].split(), args
        if "--json" in args:
            assert json.loads(run.stdout)
