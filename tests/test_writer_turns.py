"""SQLite lets one writer in at a time, and a writer that finds the lock taken sleeps in its
busy handler (1, 2, 5 … 100 ms at a time) without knowing when the lock comes free. Our own
write transactions queue for it instead, on a lock of a file beside the database
(engine.writers_in_turn), which the kernel hands to the next writer the moment it is let go.
"""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import re

import pytest
from django.db import connections, transaction

from django_taskloop import engine
from django_taskloop.models import Task, Tube

pytestmark = pytest.mark.django_db(transaction=True)


def _turn_path() -> str:
    return engine.data_files("default")[0] + "-taskloop-turn"


def _turn_is_free() -> bool:
    """Whether a writer could take the turn now (another open of the file: another holder)."""
    fd = os.open(_turn_path(), os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # closing lets go of a lock taken here
    return True


@pytest.fixture
def sqlite_file(vendor):
    assert vendor == "sqlite", "the turn file is SQLite's: mark the test vendors('sqlite')"


@pytest.mark.vendors("mysql", "postgresql")  # SQLite takes one (the tests below)
def test_other_databases_take_no_turn(vendor):
    assert engine.data_files("default") == []
    tube = Tube.objects.create_tube("t", "fifo")
    tube.put(1)
    assert engine.run_in_transaction(Task, "default", lambda: tube.take_many(1, consumer="w"))


@pytest.mark.vendors("sqlite")  # its turn file
def test_a_write_transaction_holds_the_turn_until_it_commits(sqlite_file):
    tube = Tube.objects.create_tube("t", "fifo")
    tube.put("a")
    seen = []
    engine.run_in_transaction(Task, "default", lambda: seen.append(_turn_is_free()))
    # A one-statement write in autocommit (a put) takes its turn too.
    engine.run_in_transaction(Task, "default", lambda: seen.append(_turn_is_free()), alone=True)
    assert seen == [False, False]
    assert _turn_is_free()
    # Inside a caller's transaction the caller's commit ends the write, not ours: no turn.
    with transaction.atomic():
        engine.run_in_transaction(Task, "default", lambda: seen.append(_turn_is_free()))
        tube.put("b")
        seen.append(_turn_is_free())
    assert seen[2:] == [True, True]
    assert Task.objects.count() == 2


@pytest.mark.vendors("sqlite")  # its turn file
def test_the_on_commit_hooks_run_with_the_turn_free(sqlite_file):
    """A hook (a tube's on_task_change callback, say) may take long or write itself: the next
    writer's turn comes at the commit, not after the hooks."""
    seen = []

    def work():
        transaction.on_commit(lambda: seen.append(_turn_is_free()))
        Tube.objects.create_tube("t", "fifo").put("a")

    engine.run_in_transaction(Task, "default", work)
    assert seen == [True]
    assert _turn_is_free() and Task.objects.count() == 1


@pytest.mark.vendors("sqlite")  # its turn file
def test_the_turn_is_let_go_when_the_work_fails(sqlite_file):
    def fail():
        raise ValueError("no")

    with pytest.raises(ValueError):
        engine.run_in_transaction(Task, "default", fail)
    assert _turn_is_free()


def _write_when_told(tube_id: int, go: multiprocessing.Event, done: multiprocessing.Event) -> None:
    go.wait(30)
    Tube.objects.get(pk=tube_id).put("child")
    done.set()
    connections.close_all()


@pytest.mark.vendors("sqlite")  # its turn file
def test_a_forked_child_waits_for_its_parents_turn(sqlite_file):
    """A lock belongs to the open file: a child that kept the descriptor it inherited would
    hold its parent's turn too, and write while the parent is mid-transaction."""
    tube = Tube.objects.create_tube("t", "fifo")
    tube.put("warm")  # this process has opened its turn file: the child inherits it
    connections.close_all()
    ctx = multiprocessing.get_context("fork")
    go, done = ctx.Event(), ctx.Event()
    child = ctx.Process(target=_write_when_told, args=(tube.pk, go, done))
    child.start()
    waited = []

    def work():
        # The turn is held, the database's own write lock not yet (nothing written here):
        # only the turn keeps the child waiting.
        go.set()
        waited.append(not done.wait(1.0))
        tube.put("parent")

    engine.run_in_transaction(Task, "default", work, lock_first=False)
    assert done.wait(30), "the child never wrote"
    child.join(30)
    assert child.exitcode == 0
    assert waited == [True], "the child wrote while the parent held the turn"
    assert sorted(Task.objects.values_list("data", flat=True)) == ["child", "parent", "warm"]


@pytest.mark.vendors("sqlite")  # its turn file
def test_a_worker_s_lease_renewals_take_the_turn(sqlite_file):
    """A renewal that skips the turn meets SQLite's busy handler instead, and loses the lock
    to writers that take turns back to back: seen in CI as a live worker that waited 4.5 s to
    renew 3 s leases, lost finished jobs it had not acknowledged yet, and saw them run again
    (tests/reliability/test_kills.py, the board's drain). Every renewal a worker's heartbeat
    or its check before a start sends (a board's jobs, a loop's ids, a tube's tasks) holds
    the turn while it writes."""
    from django_taskloop.models import JobBoard, WorkerProcess
    from tests.testapp.models import WorkerLoop

    board = JobBoard.objects.create_board("b")
    board.post("job")
    (job,) = board.claim_many("w", 1, expiry=30)
    WorkerLoop.objects.add([1])
    assert WorkerLoop.objects.claim(1, lock_for=30) == [1]
    tube = Tube.objects.create_tube("t", "fifottl", ttr=30)
    tube.put("a")
    (task,) = tube.take_many(1, consumer="w")

    writes: list[tuple[str, bool]] = []

    def watch(execute, sql, params, many, context):
        written = re.match(r'\s*(?:UPDATE|INSERT INTO|DELETE FROM)\s+"?(\w+)', sql, re.IGNORECASE)
        if written:
            writes.append((written[1], _turn_is_free()))
        return execute(sql, params, many, context)

    with connections["default"].execute_wrapper(watch):
        assert board.extend_many([job], "w", 30) == 1
        assert job.extend_expiry(30)
        assert WorkerLoop.objects.renew([1], lock_for=30) == 1
        assert tube.touch_many([task.id], 5, consumer="w") == 1
        # ... and its goodbye at the end (a row of its own, beside the heartbeat's beats).
        WorkerProcess.objects.beat("w", host="h", pid=1, queues=["tube:t"], holding={})
        WorkerProcess.objects.gone("w")
    renewals = [
        (table, free) for table, free in writes if table.endswith(("job", "workerloop", "task", "process"))
    ]
    assert len(renewals) >= 6, writes
    assert [table for table, free in renewals if free] == [], f"renewals that skipped the turn: {writes}"
