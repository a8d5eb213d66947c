"""Contention: 16 processes on one tube, one board and one loop: no double claims, and no
deadlock or lock timeout escapes to the caller (the engine retries them, with a bound).

Every process claims and settles as fast as it can until the queue is empty; any exception in
any process fails the test (``race`` reports it), and the claims of all processes together
must cover every item exactly once.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
from django.db import connections

from django_taskloop.models import JobBoard, Task, Tube
from tests.conftest import race
from tests.testapp.models import WorkerLoop

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PROCESSES = 16


def _drain_tube(consumer: str) -> list[int]:
    from django_taskloop.models import Tube

    tube = Tube.objects.get(name="c-tube")
    taken, empty = [], 0
    while empty < 3:
        task = tube.take(0, consumer=consumer)
        if task is None:
            empty += 1
            time.sleep(0.01)
            continue
        empty = 0
        taken.append(task.id)
        assert tube.ack(task.id, consumer=consumer).state == "-"
    return taken


def _drain_board(who: str) -> list[str]:
    from django_taskloop.models import JobBoard

    board = JobBoard.objects.get(name="c-board")
    consumed, empty = [], 0
    while empty < 3:
        job = board.claim_next(who, expiry=600)
        if job is None:
            empty += 1
            time.sleep(0.01)
            continue
        empty = 0
        board.consume(job, who)
        consumed.append(job.uuid)
    return consumed


def _drain_loop(worker: str) -> list[int]:
    from tests.testapp.models import WorkerLoop

    done, empty = [], 0
    while empty < 3:
        ids = WorkerLoop.objects.claim(7, lock_for=600, min_loop_time=3600)
        if not ids:
            empty += 1
            time.sleep(0.01)
            continue
        empty = 0
        assert WorkerLoop.objects.did(ids, auto_add=False) == len(ids)
        done.extend(ids)
    return done


def _exactly_once(results: list[list], expected: set) -> Counter:
    every = Counter(item for result in results for item in result)
    doubles = {item: n for item, n in every.items() if n > 1}
    assert not doubles, f"claimed more than once: {doubles}"
    assert set(every) == expected
    return every


def test_sixteen_processes_on_one_tube():
    tube = Tube.objects.create_tube("c-tube", "fifo")
    made = Task.objects.bulk_create([Task(tube=tube, data={"n": i}, state="r") for i in range(800)])
    results = race(_drain_tube, [(f"c{i}",) for i in range(PROCESSES)])
    _exactly_once(results, {task.id for task in made})
    stats = tube.statistics()
    assert stats["tasks"]["total"] == 0
    assert stats["calls"]["ack"] == 800
    connections.close_all()


def test_sixteen_processes_on_one_board():
    board = JobBoard.objects.create_board("c-board")
    uuids = {board.post(f"j{i}").uuid for i in range(300)}
    results = race(_drain_board, [(f"w{i}",) for i in range(PROCESSES)])
    _exactly_once(results, uuids)
    assert board.job_count == 0
    connections.close_all()


def test_sixteen_processes_on_one_loop():
    WorkerLoop.objects.add(range(1500))
    results = race(_drain_loop, [(f"w{i}",) for i in range(PROCESSES)])
    _exactly_once(results, set(range(1500)))
    assert not WorkerLoop.objects.filter(last_updated__isnull=True).exists()
    assert not WorkerLoop.objects.filter(lock_until__isnull=False).exists()
    connections.close_all()
