"""The reaper (``reap()`` and ``manage.py reap_locks``): what it does and what it reports."""

from __future__ import annotations

import datetime as dt
import io
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from django_taskloop.engine import db_now
from django_taskloop.models import Job, JobBoard, TaskRecord, TaskRecordStatus, Tube
from django_taskloop.reaper import format_report, reap
from tests.testapp.models import WorkerLoop

pytestmark = pytest.mark.django_db


def test_expired_loop_locks_are_reported_and_left_first_in_line(clock):
    WorkerLoop.objects.add([1, 2, 3])
    assert sorted(WorkerLoop.objects.claim(2, lock_for=60)) == [1, 2]
    clock.advance(30)
    assert reap()["loops"]["testapp.workerloop"] == {"expired_locks": 0}
    clock.advance(31)
    report = reap()
    assert report["loops"]["testapp.workerloop"] == {"expired_locks": 2}
    # Not cleared: doloop ranks them first, ahead of the never-updated id 3.
    assert WorkerLoop.objects.filter(lock_until__isnull=False).count() == 2
    assert sorted(WorkerLoop.objects.claim(2)) == [1, 2]


def test_expired_job_claims_are_cleared(clock):
    board = JobBoard.objects.create_board("reap-board")
    job = board.post("a")
    board.post("b")
    board.claim(job, "ed", expiry=60)
    clock.advance(30)
    assert reap()["boards"]["reap-board"] == {"expired_claims": 0}
    assert Job.objects.get(uuid=job.uuid).claimed_by == "ed"
    clock.advance(31)
    report = reap()
    assert report["boards"]["reap-board"] == {"expired_claims": 1}
    assert Job.objects.get(uuid=job.uuid).claimed_by is None
    assert reap()["boards"]["reap-board"] == {"expired_claims": 0}


def test_tube_transitions_are_applied_and_counted_per_tube(clock):
    tube = Tube.objects.create_tube("reap-ttl", "fifottl")
    tube.put("later", delay=30)
    taken = tube.put("run")
    assert tube.take(0, consumer="ed").id == taken.id
    Tube.objects.create_tube("reap-other", "fifo")
    # A shorter ttr, on a task taken now.
    short = Tube.objects.create_tube("reap-ttr", "fifottl", ttr=20)
    short.put("x")
    short.take(0, consumer="ed")
    clock.advance(15)
    early = reap()
    assert (early["tubes"]["reap-ttl"]["delay"], early["tubes"]["reap-ttr"]["ttr"]) == (0, 0)
    # 31 s in all: the delay and the ttr ran out, ed (CONSUMER_TIMEOUT 60 s) is alive.
    clock.advance(16)
    report = reap()
    assert report["tubes"]["reap-ttl"]["delay"] == 1
    assert report["tubes"]["reap-ttr"]["ttr"] == 1
    assert report["tubes"]["reap-other"] == {"delay": 0, "ttr": 0, "ttl": 0, "release": 0}
    assert tube.peek(taken.id).state == "t"


def test_a_dead_consumers_tasks_go_back(clock):
    tube = Tube.objects.create_tube("reap-fifo", "fifo")
    tube.put("x")
    task = tube.take(0, consumer="gone")
    with override_settings(TASKLOOP={"CONSUMER_TIMEOUT": 60}):
        clock.advance(30)
        assert reap()["tubes"]["reap-fifo"]["release"] == 0
        clock.advance(31)
        report = reap()
    assert report["tubes"]["reap-fifo"]["release"] == 1
    assert tube.peek(task.id).state == "r"


def test_old_task_results_are_pruned():
    now = db_now()
    old = TaskRecord.objects.create(
        backend="default", queue_name="default", task_path="x.y", status=TaskRecordStatus.SUCCESSFUL
    )
    TaskRecord.objects.filter(pk=old.pk).update(finished_at=now - dt.timedelta(days=8))
    recent = TaskRecord.objects.create(
        backend="default",
        queue_name="default",
        task_path="x.y",
        status=TaskRecordStatus.FAILED,
        finished_at=now,
    )
    waiting = TaskRecord.objects.create(backend="default", queue_name="default", task_path="x.y")
    assert reap()["results"] == {"django-tasks": {"pruned": 1}}
    assert set(TaskRecord.objects.values_list("pk", flat=True)) == {recent.pk, waiting.pk}


def test_reap_locks_prints_one_line_per_loop_board_and_tube():
    WorkerLoop.objects.add([1])
    JobBoard.objects.create_board("reap-board")
    Tube.objects.create_tube("reap-fifo", "fifo")
    out = io.StringIO()
    call_command("reap_locks", stdout=out)
    lines = out.getvalue().splitlines()
    assert "loop testapp.workerloop: expired locks 0" in lines
    assert "board reap-board: expired claims 0" in lines
    assert "tube reap-fifo: delay 0, ttr 0, ttl 0, release 0" in lines
    assert "results django-tasks: pruned 0" in lines
    assert lines == format_report(reap())


def test_reap_locks_every_must_be_positive():
    with pytest.raises(CommandError, match="every"):
        call_command("reap_locks", every=0)


def _start_reaping_every_fifth_second(preexec_fn: Any = None) -> subprocess.Popen[str]:
    """Start ``manage.py reap_locks --every 0.2`` on the suite's database, in the background."""
    from django.db import connections

    from .workers_util import ROOT, child_env

    connections.close_all()
    return subprocess.Popen(
        [sys.executable, "-m", "django", "reap_locks", "--every", "0.2"],
        env=child_env(),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=preexec_fn,
    )


PASS_LINE = "results django-tasks: pruned 0"


class _Output:
    """A process's output, read line by line as it comes (so a test can wait for a line)."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self.thread = threading.Thread(target=self._read, args=(process.stdout,), daemon=True)
        self.thread.start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            self.lines.append(line)

    def wait_for_passes(self, passes: int, timeout: float = 60) -> None:
        """Wait until ``passes`` passes are printed (start-up takes seconds on a loaded machine)."""
        deadline = time.monotonic() + timeout
        while sum(PASS_LINE in line for line in self.lines) < passes:
            assert time.monotonic() < deadline, f"{passes} passes not seen in {timeout} s: {self.lines}"
            time.sleep(0.05)

    def text(self) -> str:
        self.thread.join(timeout=30)
        return "".join(self.lines)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_reap_locks_every_repeats_until_stopped():
    process = _start_reaping_every_fifth_second()
    output = _Output(process)
    output.wait_for_passes(2)
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        # Say why it did not stop: its signal masks and where it waits in the kernel.
        with open(f"/proc/{process.pid}/status") as f:
            masks = [line.strip() for line in f if line.startswith(("SigBlk", "SigIgn", "SigCgt", "State"))]
        with open(f"/proc/{process.pid}/wchan") as f:
            wchan = f.read()
        process.kill()
        process.wait()
        pytest.fail(f"reap_locks did not stop within 30 s of SIGINT: {masks}, waiting in {wchan!r}")
    out = output.text()
    assert process.returncode == 0, out
    assert out.count(PASS_LINE) >= 2


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_reap_locks_every_stops_on_one_signal_even_if_it_started_with_them_ignored(signame):
    from .workers_util import ignore_and_block_stop_signals

    process = _start_reaping_every_fifth_second(preexec_fn=ignore_and_block_stop_signals)
    output = _Output(process)
    try:
        output.wait_for_passes(2)
        process.send_signal(getattr(signal, signame))
        process.wait(timeout=15)
    finally:
        process.kill()
        process.wait()
    out = output.text()
    process.stdout.close()
    assert process.returncode == 0, out
    assert out.count(PASS_LINE) >= 2
