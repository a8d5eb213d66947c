"""A worker never starts an item whose lease it cannot vouch for.

A worker holds what it claimed by a lease that its heartbeat thread renews. When the renewals
come too late (a heartbeat thread stalled by a slow chore, a machine starved of CPU), the
lease lapses and another worker may take the item and finish it. An item already running may
then run twice (at least once: its acknowledgement says the lease was lost); one not started
yet must not start. Before starting an item whose lease may have lapsed (by this process's
estimate of the database's clock), the worker asks the database and renews it, or leaves it.

The heartbeat's stall is made by turning its renewals off; the lease runs out on the test
clock (``clock.advance``), in the database's own time.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from django_taskloop.models import JobBoard, Tube
from django_taskloop.workers import Handler, heartbeat
from django_taskloop.workers.runner import Worker

pytestmark = pytest.mark.django_db(transaction=True)

FIFOTTL = {"type": "fifottl"}


@pytest.fixture
def stalled_heartbeat(monkeypatch: pytest.MonkeyPatch) -> None:
    """The heartbeat thread runs but renews nothing (as one held up past the leases)."""
    monkeypatch.setattr(heartbeat.Heart, "_beat_drivers", lambda self, due: None)


def _burst(*handlers: Handler) -> int:
    return Worker(list(handlers), burst=True, schedule=False).run()


def test_an_item_whose_lease_lapsed_before_it_started_is_not_started(clock, stalled_heartbeat):
    tube = Tube.objects.create_tube("lease-lapsed", "fifottl", ttr=30)
    # The first's own ttr outlasts the test: only the second's lease lapses.
    first, second = tube.put("first", ttr=1000), tube.put("second")
    ran: list[tuple[str, str]] = []

    def handle(task: Any) -> None:
        ran.append(("worker", task.data))
        if task.id == first.id:
            # While the first runs, the second's lease runs out unrenewed; a rival takes it
            # and finishes it.
            clock.advance(31)
            taken = tube.take_many(1, consumer="rival")
            assert [t.id for t in taken] == [second.id]
            ran.append(("rival", taken[0].data))
            assert tube.ack_many([second.id], consumer="rival") == 1

    handler = Handler(
        "tube", "lease-lapsed", handle, "lease-lapsed", batch=2, batch_time=0, lease=30, create=FIFOTTL
    )
    _burst(handler)
    assert ran == [("worker", "first"), ("rival", "second")]
    assert tube.statistics()["tasks"]["total"] == 0


def test_a_batch_claimed_ahead_whose_lease_lapsed_is_not_started(clock, stalled_heartbeat):
    """The next batch, claimed in the transaction that acknowledged the last, waits while the
    worker's other queues run: its lease may lapse there."""
    ahead = Tube.objects.create_tube("lease-ahead", "fifottl", ttr=30)
    other = Tube.objects.create_tube("lease-other", "fifottl", ttr=30)
    a1, a2 = ahead.put("a1"), ahead.put("a2")
    other.put("o1", ttr=1000)  # the running task's lease outlasts the test
    ran: list[tuple[str, str]] = []

    def handle_ahead(task: Any) -> None:
        ran.append(("worker", task.data))

    def handle_other(task: Any) -> None:
        ran.append(("worker", task.data))
        # a2 was claimed ahead with a1's acknowledgement and waits for the next round.
        clock.advance(31)
        taken = ahead.take_many(1, consumer="rival")
        assert [t.id for t in taken] == [a2.id]
        ran.append(("rival", taken[0].data))
        assert ahead.ack_many([a2.id], consumer="rival") == 1

    handlers = [
        Handler(
            "tube",
            "lease-ahead",
            handle_ahead,
            "lease-ahead",
            batch=1,
            batch_time=0,
            lease=30,
            create=FIFOTTL,
        ),
        Handler(
            "tube",
            "lease-other",
            handle_other,
            "lease-other",
            batch=1,
            batch_time=0,
            lease=30,
            create=FIFOTTL,
        ),
    ]
    _burst(*handlers)
    assert ran == [("worker", "a1"), ("worker", "o1"), ("rival", "a2")], ran
    assert a1.id != a2.id
    assert ahead.statistics()["tasks"]["total"] == 0


def test_a_job_whose_claim_expired_before_it_started_is_not_started(clock, stalled_heartbeat):
    board = JobBoard.objects.create_board("lease-board")
    first, second = board.post("first"), board.post("second")
    ran: list[tuple[str, str]] = []

    def handle(job: Any) -> None:
        ran.append(("worker", job.name))
        if job.uuid == first.uuid:
            # The running job's claim outlasts the test: only the second's lapses.
            assert board.extend_many([job], job.owner, 1000) == 1
            clock.advance(31)
            rival = board.claim_many("rival", 1, expiry=30)
            assert [j.uuid for j in rival] == [second.uuid]
            ran.append(("rival", rival[0].name))
            board.consume_many(rival, "rival")

    handler = Handler("board", "lease-board", handle, "lease-board", batch=2, batch_time=0, lease=30)
    _burst(handler)
    assert ran == [("worker", "first"), ("rival", "second")]


def test_a_lapsed_lease_still_held_is_renewed_and_the_item_runs(clock, stalled_heartbeat):
    """The lease lapsed by the clock but nobody took the item: the worker renews it and runs it."""
    tube = Tube.objects.create_tube("lease-kept", "fifottl", ttr=30)
    tube.put("first")
    tube.put("second")
    ran: list[str] = []

    def handle(task: Any) -> None:
        ran.append(task.data)
        if task.data == "first":
            clock.advance(25)  # past the worker's margin, within the lease

    handler = Handler(
        "tube", "lease-kept", handle, "lease-kept", batch=2, batch_time=0, lease=30, create=FIFOTTL
    )
    _burst(handler)
    assert ran == ["first", "second"]
    assert tube.statistics()["tasks"]["total"] == 0


def test_a_fifo_task_of_a_consumer_taken_for_dead_is_not_started(clock, stalled_heartbeat, settings):
    """fifo/utube tasks are held while their consumer beats: a worker whose beats stopped for
    CONSUMER_TIMEOUT is taken for dead, and its tasks go to others."""
    settings.TASKLOOP = {"CONSUMER_TIMEOUT": 30}
    tube = Tube.objects.create_tube("lease-fifo", "fifo")
    first, second = tube.put("first"), tube.put("second")
    ran: list[tuple[str, str]] = []

    def handle(task: Any) -> None:
        ran.append(("worker", task.data))
        if ran == [("worker", "first")]:  # the first run only: the rival comes once
            clock.advance(31)
            taken: dict[int, Any] = {}
            for _ in range(3):  # the dead consumer's tasks come back, then are taken
                taken.update((t.id, t) for t in tube.take_many(2, consumer="rival"))
            assert second.id in taken, taken
            ran.append(("rival", taken[second.id].data))
            assert tube.ack_many([second.id], consumer="rival") == 1
            if first.id in taken:  # the running one went too: the rival leaves it
                tube.release(first.id, consumer="rival")

    handler = Handler(
        "tube", "lease-fifo", handle, "lease-fifo", batch=2, batch_time=0, create={"type": "fifo"}
    )
    _burst(handler)
    assert ("worker", "second") not in ran, ran
    assert ran.count(("rival", "second")) == 1
    assert tube.statistics()["tasks"]["total"] == 0


def test_a_renewal_that_failed_adds_its_time_to_the_next(monkeypatch):
    """A heartbeat's renewal adds the time since the last one to each deadline (so the lease
    stays as far ahead as the claim put it). One that failed added nothing: the next adds its
    time too, or every failed beat would shorten the leases of a healthy worker."""
    from django.db import DatabaseError

    from django_taskloop.models import Task
    from django_taskloop.workers.drivers import make_driver

    tube = Tube.objects.create_tube("lease-renew", "fifottl", ttr=30)
    tube.put("x")
    driver = make_driver(Handler("tube", "lease-renew", print, "lease-renew", create=FIFOTTL), "me")
    driver.prepare()
    [task] = driver.claim(1)
    assert driver.renew([task]) is True
    after_first = Task.objects.get(pk=task.pk).event_at

    def fails(*args: Any, **kwargs: Any) -> int:
        raise DatabaseError("the connection dropped")

    time.sleep(0.3)  # the heartbeat's own clock (time.monotonic) must pass: nothing else moves it
    monkeypatch.setattr(tube.__class__, "touch_many", fails)
    with pytest.raises(DatabaseError):
        driver.renew([task])
    monkeypatch.undo()
    assert driver.renew([task]) is True
    gained = (Task.objects.get(pk=task.pk).event_at - after_first).total_seconds()
    assert gained >= 0.3, gained


def test_a_task_without_a_ttr_in_a_batch_of_leased_ones_is_confirmed_by_its_owner(clock, stalled_heartbeat):
    """A fifottl task with no ttr has no deadline to push: confirmed by who holds it, not by a
    touch of an infinite increment."""
    tube = Tube.objects.create_tube("lease-mixed", "fifottl")
    tube.put("first", ttr=30)
    tube.put("second")  # no ttr: held until its consumer is gone
    ran: list[str] = []

    def handle(task: Any) -> None:
        ran.append(task.data)
        if task.data == "first":
            clock.advance(25)  # past the batch's margin (the first's ttr), within its lease

    handler = Handler("tube", "lease-mixed", handle, "lease-mixed", batch=2, batch_time=0, create=FIFOTTL)
    _burst(handler)
    assert ran == ["first", "second"]
    assert tube.statistics()["tasks"]["total"] == 0


def test_a_loop_id_a_rival_locked_after_the_lease_lapsed_is_not_started(clock, stalled_heartbeat):
    """doloop's locks name no holder: an id locked again by a rival (its lease ran out while
    the batch waited) looks the same as one this worker still holds, so it is not started."""
    from tests.testapp.models import WorkerLoop

    WorkerLoop.objects.add([1, 2])
    ran: list[tuple[str, int]] = []

    def handle(id_: int) -> None:
        ran.append(("worker", id_))
        if id_ == 1:
            # The locks run out unrenewed; a rival locks both (the one running here too, which
            # may then run twice: at least once) and works on id 2.
            clock.advance(31)
            assert sorted(WorkerLoop.objects.claim(2, lock_for=30)) == [1, 2]
            ran.append(("rival", 2))

    handler = Handler("loop", "lease-loop", handle, WorkerLoop, batch=2, batch_time=0, lease=30)
    _burst(handler)
    assert ran == [("worker", 1), ("rival", 2)], ran
    # The rival's lock stands, to run out or to be unlocked by the rival's did().
    assert WorkerLoop.objects.status(2)[2][1] > 0
