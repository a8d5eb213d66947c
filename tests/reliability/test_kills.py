"""``kill -9`` a random worker every 0.5 s during a drain: nothing is lost, nothing acked twice.

Four worker processes drain a tube, a loop and a board while the test kills one of them at
random every half second, ``KILLS`` times; the supervisor restarts each. The work a killed
worker held comes back when its lease (3 s, renewed every second while the worker lives) runs
out. At the end every item was done, tube tasks were acknowledged exactly once, and the only
items run more than once are ones a killed worker could have held (at most its batch per kill).

Sizes: the tube drain is 4,000 tasks (set ``TASKLOOP_RELIAB_TASKS`` to change it), the loop
drain 6,000 ids, the board's 2,000 jobs: each outlasts the ``KILLS`` kills on a quiet 2-core
machine (it must see 4). Then the drain ends unkilled. (Killing until the drain ended made a
loaded machine's drain endless: each restart costs a process start, which at load 10 takes
longer than the half second to the next kill, so the drain crawled for minutes.)
"""

from __future__ import annotations

import os
import time

import pytest
from django.db import connections

from django_taskloop.models import JobBoard, Task, Tube
from tests.testapp.models import WorkerLoop, WorkLog
from tests.workers_util import most_running

from .workers import Workers, executions, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

KILL_EVERY = 0.5
#: Kills per drain (each test must see at least 4 land before the drain ends).
KILLS = 10


def tube_size(vendor: str) -> int:
    default = 4_000
    return int(os.environ.get("TASKLOOP_RELIAB_TASKS", default))


def drain_while_killing(
    name: str,
    finished: callable,
    timeout: float = float(os.environ.get("TASKLOOP_RELIAB_TIMEOUT", 240)),
    extra: tuple[str, ...] = (),
) -> tuple[Workers, int, str]:
    """Run 4 workers on handler ``name`` (with ``extra`` options), kill one every 0.5 s until
    ``finished()`` or ``KILLS`` kills; wait for ``finished()``; stop them."""
    workers = Workers.start("--only", name, "--processes", "4", *extra)
    kills = 0
    try:
        wait_until(lambda: len(workers.children()) == 4, 60, what="4 worker processes")
        deadline = time.monotonic() + timeout
        while not finished():
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"drain of {name} unfinished after {timeout} s:\n{workers.dump_stacks()[-20000:]}"
                )
            assert workers.process.poll() is None, workers.output()
            time.sleep(KILL_EVERY)
            if kills < KILLS and workers.kill_one():
                kills += 1
        # Every killed process has been restarted before we stop (the log shows each). A stop
        # that arrives while the supervisor restarts a child is a separate matter (see the
        # report on issue 9): wait for four live, unkilled children first.
        wait_until(
            lambda: workers.output().count("with status -9; restarting it") >= kills, 30, what="restarts"
        )
        wait_until(
            lambda: len([pid for pid in workers.children() if pid not in workers.killed]) == 4,
            30,
            what="4 restarted workers",
        )
        # ... and give the newest one time to get going: a SIGTERM that reaches a child still
        # starting up makes it exit 1 (reported on issue 9, runner.py), which is not what this
        # test is about.
        time.sleep(3)
    finally:
        output = workers.stop()
    connections.close_all()
    assert workers.process.returncode == 0, output
    restarts = output.count("with status -9; restarting it")
    return workers, kills, output if restarts == kills else f"{restarts} restarts for {kills} kills\n{output}"


def assert_bounded_reruns(
    kind: str, keys: set[str], kills: int, held_per_kill: int, output: str = ""
) -> dict[str, int]:
    runs = executions(kind)
    assert set(runs) == keys, "some items never ran, or unknown ones did"
    reruns = sum(runs.values()) - len(keys)
    # A killed worker held at most one batch; each of those may run again, nothing else.
    assert reruns <= kills * held_per_kill, (reruns, kills)
    again = {key for key, n in runs.items() if n > 1}
    by_killed = set(WorkLog.objects.filter(kind=kind, key__in=again).values_list("key", "pid"))
    killed_pids = set(_killed)
    # Every key run twice was first run (at least once) by a process that was killed.
    unexplained = sorted(
        key for key in again if not any(pid in killed_pids for k, pid in by_killed if k == key)
    )
    assert not unexplained, _runs_of(kind, unexplained[:5], killed_pids) + _warnings(output)
    return {"items": len(keys), "runs": sum(runs.values()), "reruns": reruns, "kills": kills}


def _runs_of(kind: str, keys: list[str], killed: set[int]) -> str:
    """Each run of ``keys`` (pid, when), for a failure's message."""
    rows = (
        WorkLog.objects.filter(kind=kind, key__in=keys).order_by("key", "at").values_list("key", "pid", "at")
    )
    return f"run more than once, by no killed process (killed: {sorted(killed)}):\n" + "\n".join(
        f"  {key} pid {pid} at {at:.3f}" for key, pid, at in rows
    )


def _warnings(output: str) -> str:
    """The workers' warnings and errors, for a failure's message."""
    lines = [line for line in output.splitlines() if "WARNING" in line or "ERROR" in line]
    return "\nthe workers' warnings:\n" + "\n".join(lines[-60:])


_killed: list[int] = []


@pytest.fixture(autouse=True)
def _forget_kills():
    _killed.clear()
    yield
    _killed.clear()


def test_tube_drain_under_kills_acks_each_task_once(vendor, capsys):
    n = tube_size(vendor)
    tube = Tube.objects.create_tube("r-tube", "fifottl", ttr=3)
    ids = {str(tube.put({"n": i}).id) for i in range(10)}
    # put() one by one costs minutes for 20,000 on a loaded 2-core machine; the rest are the
    # very rows put() writes on a fifottl tube (ready, tube's ttr, no ttl), in bulk.
    made = Task.objects.bulk_create(
        [Task(tube=tube, data={"n": i}, state="r", pri=0, ttr=3.0) for i in range(10, n)], batch_size=2000
    )
    ids |= {str(task.id) for task in made}
    assert tube.statistics()["tasks"]["ready"] == n
    workers, kills, output = drain_while_killing("r-tube", lambda: tube.statistics()["tasks"]["total"] == 0)
    _killed.extend(workers.killed)
    assert kills >= 4, f"the drain ended before the kills had any chance ({kills} kills)"
    assert "restarts for" not in output, output
    stats = tube.statistics()
    assert stats["tasks"]["done"] == n
    assert stats["calls"]["ack"] == n  # each acknowledged exactly once
    report = assert_bounded_reruns("r-tube", ids, kills, held_per_kill=50, output=output)
    with capsys.disabled():
        print(f"\n[reliability] tube kill drain ({vendor}): {report}")


def test_loop_drain_under_kills_does_every_id(vendor, capsys):
    # Enough ids that the drain outlasts several kills: batches of 20 ran through 3,000 ids
    # on MariaDB before the fourth kill once workers claimed and acknowledged in one go.
    n = 6_000
    WorkerLoop.objects.add(range(n))
    workers, kills, output = drain_while_killing(
        "r-loop", lambda: not WorkerLoop.objects.filter(last_updated__isnull=True).exists()
    )
    _killed.extend(workers.killed)
    assert kills >= 4, f"the drain ended before the kills had any chance ({kills} kills)"
    assert "restarts for" not in output, output
    assert WorkerLoop.objects.filter(last_updated__isnull=False).count() == n
    # Done ids are unlocked; none is left locked by a dead worker.
    assert not WorkerLoop.objects.filter(lock_until__isnull=False).exists()
    report = assert_bounded_reruns(
        "r-loop", {str(i) for i in range(n)}, kills, held_per_kill=20, output=output
    )
    with capsys.disabled():
        print(f"\n[reliability] loop kill drain ({vendor}): {report}")


def test_board_drain_under_kills_consumes_every_job(vendor, capsys):
    # (See the loop's: enough jobs to outlast several kills. 2,000 drained in about a second on
    # a quiet MariaDB, before the fourth kill.)
    from tests.test_boards import post_many

    n = 6_000
    board = JobBoard.objects.create_board("r-board")
    post_many(board, n)  # (the rows post() writes, in bulk: 6,000 posts took 10 s of the test)
    names = {f"j{i}" for i in range(n)}
    workers, kills, output = drain_while_killing("r-board", lambda: board.job_count == 0)
    _killed.extend(workers.killed)
    assert kills >= 4, f"the drain ended before the kills had any chance ({kills} kills)"
    assert "restarts for" not in output, output
    assert board.job_count == 0
    assert list(board.iterjobs()) == []
    from django_taskloop.models import Job

    assert not Job.objects.filter(board=board, trashed=True).exists()
    report = assert_bounded_reruns("r-board", names, kills, held_per_kill=20, output=output)
    with capsys.disabled():
        print(f"\n[reliability] board kill drain ({vendor}): {report}")


def _drain_slots_under_kills(tube: Tube, tasks: list[Task]) -> str:
    """Put ``tasks`` on ``tube`` and drain it with 4 processes of 3 slots each while workers
    are killed: at least 4 kills, no restart given up, every task done and reruns bounded.
    Return the reruns' report."""
    made = Task.objects.bulk_create(tasks, batch_size=2000)
    ids = {str(task.id) for task in made}
    workers, kills, output = drain_while_killing(
        tube.name, lambda: tube.statistics()["tasks"]["total"] == 0, extra=("--concurrency", "3")
    )
    _killed.extend(workers.killed)
    assert kills >= 4, f"the drain ended before the kills had any chance ({kills} kills)"
    assert "restarts for" not in output, output
    assert tube.statistics()["tasks"]["done"] == len(made)
    return assert_bounded_reruns(tube.name, ids, kills, held_per_kill=30, output=output)


def _runs(kind: str, prefix: str = "") -> list[tuple[float, float]]:
    """``(start, end)`` of each run the handler of ``kind`` logged (its starts under
    ``<kind>-start``, keyed ``<prefix><id>`` where it has a prefix). A run cut short by a kill
    never logged its end: it ran no longer than its handler's 0.02 s sleep, counted as that."""
    rows = list(
        WorkLog.objects.filter(kind__in=[kind, f"{kind}-start"]).values_list("key", "phase", "at", "pid")
    )
    ends = {(key, pid): at for key, phase, at, pid in rows if phase == "end"}
    return [
        (at, ends.get((started[len(prefix) :], pid), at + 0.02))
        for started, phase, at, pid in rows
        if phase == "start" and started.startswith(prefix)
    ]


def test_a_tube_s_limit_holds_under_kills(vendor, capsys):
    """``@tube(limit=5)`` with 4 processes of 3 slots each (issue 44 §2): while workers are
    killed, never more than 5 of its tasks run at once, every task is done, and a killed
    worker's slots come back with its tasks' ttr."""
    # Enough tasks to outlast the kills: five slots of 0.02 s tasks, each slot refilled
    # within a poll (0.1 s) of its last task's end.
    tube = Tube.objects.create_tube("r-limited", "fifottl", ttr=3)
    report = _drain_slots_under_kills(
        tube, [Task(tube=tube, data={"n": i}, state="r", pri=0, ttr=3.0) for i in range(1_000)]
    )
    runs = _runs("r-limited")
    most = most_running([start for start, _ in runs], [end for _, end in runs])
    with capsys.disabled():
        print(f"\n[reliability] limited tube kill drain ({vendor}): {report}, most running at once {most}")
    assert most <= 5


def test_a_key_limit_holds_under_kills(vendor, capsys):
    """``@tube(type="utubettl", key_limit=2)`` with 4 processes of 3 slots each (issue 44 §2,
    per key): while workers are killed, never more than 2 tasks of one key run at once, every
    task is done, and a killed worker's slots of a key come back with its tasks' ttr."""
    n, keys = 800, 4
    tube = Tube.objects.create_tube("r-key-limited", "utubettl", ttr=3)
    report = _drain_slots_under_kills(
        tube,
        [Task(tube=tube, data={"n": i}, utube=f"k{i % keys}", state="r", pri=0, ttr=3.0) for i in range(n)],
    )
    most = {}
    for key in (f"k{i}" for i in range(keys)):
        runs = _runs("r-key-limited", prefix=f"{key}:")
        most[key] = most_running([start for start, _ in runs], [end for _, end in runs])
    with capsys.disabled():
        print(
            f"\n[reliability] key-limited tube kill drain ({vendor}): {report}, most of a key at once {most}"
        )
    assert max(most.values()) <= 2


def test_a_tube_s_rate_holds_under_kills(vendor, capsys):
    """``@tube(rate="40/s")`` with 4 processes of 3 slots each (issue 44 §2): while workers
    are killed, never more than 40 of its tasks start in any second (runs cut short by a kill
    count too: each was claimed), and every task is done."""
    from tests.test_tube_rates import most_in_a_window

    tube = Tube.objects.create_tube("r-paced", "fifottl", ttr=3)
    # Ten windows: the drain outlasts the kills.
    report = _drain_slots_under_kills(
        tube, [Task(tube=tube, data={"n": i}, state="r", pri=0, ttr=3.0) for i in range(400)]
    )
    most = most_in_a_window([start for start, _end in _runs("r-paced")], 1.0)
    with capsys.disabled():
        print(f"\n[reliability] paced tube kill drain ({vendor}): {report}, most started in any 1 s {most}")
    assert most <= 40
    # Near the rate, or the test shows nothing (a task that could not start within
    # RATE_MARGIN of its claim is given back: on a loaded machine a window may fall short).
    assert most >= 30, "the rate was never approached: the test shows nothing"
