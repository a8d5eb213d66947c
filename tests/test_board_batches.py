"""Batch verbs of job boards: ``claim_many``, ``consume_many``, ``abandon_many`` (workers' path).

Each job in a batch gets what the one-job verb would give it: ``claim_many`` claims like
``claim_next`` (pause, attempts, expiry, claim order), ``consume_many`` removes like
``consume`` (only jobs ``who`` holds, ``job_removed`` at commit, history with retention).
"""

from __future__ import annotations

import dataclasses
import uuid

import pytest
from django.db import connection, connections, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from django_taskloop import engine
from django_taskloop.engine import DbNow, db_now
from django_taskloop.models import Job, JobBoard, JobPriority
from django_taskloop.models.boards import ConsumedJob
from django_taskloop.signals import job_removed
from tests.conftest import race

pytestmark = pytest.mark.django_db


@pytest.fixture
def board() -> JobBoard:
    return JobBoard.objects.create_board("batches")


def post_in_order(board: JobBoard) -> list[str]:
    """Post jobs whose claim order differs from their posting order; return that claim order."""
    for name, priority in [
        ("n1", "NORMAL"),
        ("l1", "LOW"),
        ("vh1", "VERY_HIGH"),
        ("n2", "NORMAL"),
        ("vl1", "VERY_LOW"),
        ("h1", "HIGH"),
        ("vh2", "VERY_HIGH"),
    ]:
        board.post(name, priority=priority)
    return ["vh1", "vh2", "h1", "n1", "n2", "l1", "vl1"]


def post_many(board: JobBoard, n: int) -> None:
    now = db_now()
    Job.objects.bulk_create(
        [
            Job(board=board, uuid=str(uuid.uuid4()), name=f"j{i}", details={"n": i}, created_on=now, last_modified=now)
            for i in range(n)
        ],
        batch_size=1000,
    )  # fmt: skip


# -- claim_many ------------------------------------------------------------------------------


def test_claim_many_claims_in_claim_order_up_to_limit(board):
    order = post_in_order(board)
    first = board.claim_many("ann", 3)
    assert [j.name for j in first] == order[:3]
    rest = board.claim_many("bob", 10)
    assert [j.name for j in rest] == order[3:]
    assert board.claim_many("ann", 5) == []
    assert all(j.owner == "ann" and j.state == "CLAIMED" for j in first)
    assert all(j.owner == "bob" for j in rest)
    assert {j.claimed_by for j in first} == {"ann"}


def test_claim_many_writes_what_claim_next_writes(board):
    board.post("a")
    board.post("b")
    (by_next,) = [board.claim_next("ann")]
    (by_many,) = board.claim_many("ann", 1)
    for job in (by_next, by_many):
        assert job.claimed_by == "ann" and job.attempts == 1
        assert job.claim_expires_at is None and job.expires_in() == -1
        assert job.last_modified > job.created_on
    board.abandon(by_many, "ann")
    (again,) = board.claim_many("cy", 1, expiry=30)
    assert again.uuid == by_many.uuid and again.attempts == 2
    assert again.claim_expires_at is not None and 25 < again.expires_in() <= 30
    assert Job.objects.get(uuid=again.uuid).attempts == 2


def test_claim_many_skips_claimed_and_trashed_and_takes_expired(board):
    a, b, c, d = (board.post(n) for n in "abcd")
    board.claim(a, "x")
    board.claim(b, "x")
    board.trash(b, "x")
    board.claim(d, "x")
    Job.objects.filter(pk=a.pk).update(claim_expires_at=DbNow(-1))  # a's claim has just expired
    assert [j.uuid for j in board.claim_many("y", 10)] == [a.uuid, c.uuid]


def test_claim_many_validates_before_writing(board):
    board.post("a")
    for kwargs, error, word in [
        ({"who": 3, "limit": 1}, TypeError, "who"),
        ({"who": "", "limit": 1}, ValueError, "who"),
        ({"who": "w", "limit": 0}, ValueError, "limit"),
        ({"who": "w", "limit": -2}, ValueError, "limit"),
        ({"who": "w", "limit": True}, TypeError, "limit"),
        ({"who": "w", "limit": 1.5}, TypeError, "limit"),
        ({"who": "w", "limit": "3"}, TypeError, "limit"),
        ({"who": "w", "limit": None}, TypeError, "limit"),
        ({"who": "w", "limit": 1, "expiry": 0}, ValueError, "expiry"),
        ({"who": "w", "limit": 1, "expiry": -1}, ValueError, "expiry"),
        ({"who": "w", "limit": 1, "expiry": "1"}, TypeError, "expiry"),
        ({"who": "w", "limit": 1, "expiry": float("nan")}, ValueError, "expiry"),
    ]:
        with pytest.raises(error, match=word):
            board.claim_many(**kwargs)
    assert not Job.objects.claimed().exists()


def test_claim_many_hands_out_nothing_while_paused(board):
    board.post("a")
    board.pause()
    assert board.claim_many("ann", 5) == []
    assert board.claim_next("ann") is None
    assert not Job.objects.claimed().exists()
    board.resume()
    assert [j.name for j in board.claim_many("ann", 5)] == ["a"]


def test_claim_many_inside_callers_transaction_rolls_back_with_it(board):
    board.post("a")
    with transaction.atomic():
        assert len(board.claim_many("ann", 5)) == 1
        transaction.set_rollback(True)
    (job,) = Job.objects.all()
    assert job.state == "UNCLAIMED" and job.attempts == 0


@pytest.mark.django_db(databases=["default", "other"])
def test_claim_many_stays_on_the_boards_database():
    board = JobBoard.objects.using("other").create_board("elsewhere")
    board.post("a")
    board.post("b")
    with CaptureQueriesContext(connections["default"]) as on_default:
        jobs = board.claim_many("ann", 5)
        assert board.consume_many(jobs[:1], "ann") == 1
        assert board.abandon_many(jobs[1:], "ann") == 1
    assert len(on_default) == 0, [q["sql"] for q in on_default]
    assert Job.objects.using("other").count() == 1


# -- claim_next under contention -------------------------------------------------------------


def test_claim_next_locks_with_the_index_scan_not_a_shared_candidate_read(board):
    """Rivals must not all start on the same head-of-queue candidates (issue: boards speed)."""
    post_many(board, 5)
    with CaptureQueriesContext(connection) as queries:
        job = board.claim_next("ann")
    assert job is not None and job.details == {"n": 0}
    selects = [q["sql"] for q in queries if q["sql"].lstrip().upper().startswith("SELECT")]
    if engine.features("default").skip_locked:
        # The first read of the job table is the locking one: no plain candidate read before it.
        job_reads = [sql for sql in selects if "taskloop_job" in sql]
        assert "FOR UPDATE" in job_reads[0].upper() and "SKIP LOCKED" in job_reads[0].upper(), job_reads


def test_the_locking_scan_reads_the_claim_index(board):
    from tests.explain import assert_ordered_by_index

    now = db_now()
    other = JobBoard.objects.create_board("other")
    priorities = list(JobPriority)
    Job.objects.bulk_create(
        [
            Job(board=(board, other)[i % 2], uuid=str(uuid.uuid4()), name=f"j{i}",
                priority=priorities[i % 5], created_on=now, last_modified=now)
            for i in range(20000)
        ],
        batch_size=2000,
    )  # fmt: skip
    # What claim_next and claim_many lock (engine.claim direct=True): the claim index, in order.
    locking = (
        board.jobs.claimable()
        .in_claim_order()
        .select_for_update(skip_locked=True)
        .values_list("pk", flat=True)[:100]
    )
    text = assert_ordered_by_index(locking)
    assert "taskloop_job_claim_idx" in text, text
    assert [j.priority for j in board.claim_many("w", 3)] == [JobPriority.VERY_HIGH] * 3


# -- consume_many ----------------------------------------------------------------------------


def test_consume_many_removes_only_what_who_holds(board):
    post_many(board, 3)
    mine = board.claim_many("ann", 3, expiry=60)
    theirs = board.claim(board.post("theirs"), "bob")
    free = board.post("free")
    lapsed = board.claim(board.post("lapsed"), "ann")
    Job.objects.filter(pk=lapsed.pk).update(claim_expires_at=DbNow(-1))
    trashed = board.claim(board.post("trashed"), "ann")
    board.trash(trashed, "ann")
    given = [
        mine[0],  # a Job
        mine[1].uuid.upper(),  # its uuid, any case
        uuid.UUID(mine[2].uuid),  # a uuid.UUID
        mine[0],  # a duplicate counts once
        theirs,
        free,
        lapsed,
        trashed,
        str(uuid.uuid4()),  # gone (never existed)
    ]
    assert board.consume_many(given, "ann") == 3
    assert not Job.objects.filter(uuid__in=[j.uuid for j in mine]).exists()
    assert all(j.state == "COMPLETE" for j in mine)
    assert theirs.state == "CLAIMED" and theirs.owner == "bob"
    assert free.state == "UNCLAIMED" and lapsed.state == "UNCLAIMED"
    assert Job.objects.get(pk=trashed.pk).trashed
    assert board.consume_many([theirs], "ann") == 0
    assert board.consume_many([], "ann") == 0
    assert board.job_count == 3


def test_consume_many_validates_before_writing(board):
    post_many(board, 2)
    jobs = board.claim_many("ann", 2)
    for args, error, word in [
        ((jobs, 3), TypeError, "who"),
        ((jobs, ""), ValueError, "who"),
        (([jobs[0], 12], "ann"), TypeError, "job"),
        (([jobs[0], "not-a-uuid"], "ann"), ValueError, "job"),
        ((None, "ann"), TypeError, "jobs"),
        ((jobs[0], "ann"), TypeError, "jobs"),
    ]:
        with pytest.raises(error, match=word):
            board.consume_many(*args)
    assert Job.objects.claimed().count() == 2


def test_consume_many_of_a_lapsed_claim_that_someone_took_over(board):
    post_many(board, 2)
    jobs = board.claim_many("ann", 2, expiry=60)
    Job.objects.filter(pk=jobs[0].pk).update(claim_expires_at=DbNow(-1))
    board.claim(jobs[0], "bob")
    assert board.consume_many(jobs, "ann") == 1
    assert jobs[0].owner == "bob" and jobs[1].state == "COMPLETE"


def test_consume_many_in_chunks(board, monkeypatch):
    real = engine.features
    monkeypatch.setattr(engine.vendor, "features", lambda u: dataclasses.replace(real(u), max_params=7))
    post_many(board, 40)
    jobs = board.claim_many("ann", 40)
    assert len(jobs) == 40
    with CaptureQueriesContext(connection) as queries:
        assert board.consume_many(jobs[:30], "ann") == 30
    deletes = [q for q in queries if q["sql"].lstrip().upper().startswith("DELETE")]
    assert 2 <= len(deletes) <= 30 // 5, [q["sql"] for q in deletes]
    assert board.abandon_many(jobs, "ann") == 10
    assert board.job_count == 10 and not Job.objects.claimed().exists()


def test_consume_many_keeps_history_with_retention(board):
    with override_settings(TASKLOOP={"JOB_HISTORY_RETENTION": 3600}):
        board.post("low", {"a": 1}, priority="low")
        board.post("high", {"b": [2]}, priority="high")
        jobs = board.claim_many("ann", 2)
        jobs[0].details["edited"] = "locally"  # history copies the job as stored
        assert board.consume_many([jobs[0], jobs[1].uuid], "ann") == 2
        assert not Job.objects.exists()
        history = {h.name: h for h in ConsumedJob.objects.all()}
        assert set(history) == {"low", "high"}
        assert history["low"].details == {"a": 1} and history["low"].priority is JobPriority.LOW
        assert history["high"].uuid == jobs[0].uuid and history["high"].consumed_by == "ann"
        assert all(h.consumed_at >= h.created_on for h in history.values())
        assert Job.objects.prune_history() == 0
    with override_settings(TASKLOOP={"JOB_HISTORY_RETENTION": 0}):
        board.post("c")
        assert board.consume_many(board.claim_many("ann", 1), "ann") == 1
        assert ConsumedJob.objects.count() == 2


def test_consume_many_inside_callers_transaction_rolls_back_with_it(board):
    post_many(board, 2)
    jobs = board.claim_many("ann", 2)
    with transaction.atomic():
        assert board.consume_many(jobs, "ann") == 2
        transaction.set_rollback(True)
    assert Job.objects.claimed().count() == 2


@pytest.fixture
def removed():
    log: list[str] = []

    def on_removed(sender, job, **kw):
        log.append(job.uuid)

    job_removed.connect(on_removed)
    yield log
    job_removed.disconnect(on_removed)


@pytest.mark.django_db(transaction=True)
def test_consume_many_fires_job_removed_for_each_at_commit(removed):
    board = JobBoard.objects.create_board("signals")
    post_many(board, 4)
    jobs = board.claim_many("ann", 4)
    with transaction.atomic():
        assert board.consume_many(jobs[:2], "ann") == 2
        assert removed == []
        transaction.set_rollback(True)
    assert removed == []
    assert board.abandon_many(jobs[3:], "ann") == 1  # abandoning is no removal
    with transaction.atomic():
        assert board.consume_many([jobs[0], jobs[1].uuid, jobs[2], jobs[3]], "ann") == 3
        assert removed == []
    assert sorted(removed) == sorted(j.uuid for j in jobs[:3])


@pytest.mark.django_db(transaction=True)
def test_consume_many_outside_any_transaction_one_delete_and_exact_when_some_were_lost(removed):
    board = JobBoard.objects.create_board("optimistic")
    post_many(board, 6)
    jobs = board.claim_many("ann", 6, expiry=60)
    with CaptureQueriesContext(connection) as queries:
        assert board.consume_many(jobs[:3], "ann") == 3
    verbs = [q["sql"].split()[0].upper() for q in queries if "taskloop_job" in q["sql"]]
    assert verbs.count("DELETE") == 1 and "SELECT" not in verbs, verbs  # (SQLite: + its write lock)
    assert sorted(removed) == sorted(j.uuid for j in jobs[:3])
    # One lapsed and was taken over, one was consumed by its owner already: neither is counted.
    Job.objects.filter(pk=jobs[3].pk).update(claim_expires_at=DbNow(-1))
    board.claim(jobs[3], "bob")
    board.consume(jobs[4], "ann")
    removed.clear()
    assert board.consume_many(jobs[3:], "ann") == 1
    assert removed == [jobs[5].uuid]
    assert jobs[3].owner == "bob" and board.job_count == 1


# -- abandon_many ----------------------------------------------------------------------------


def test_abandon_many_frees_only_what_who_holds(board):
    post_many(board, 3)
    mine = board.claim_many("ann", 2, expiry=60)
    theirs = board.claim_many("bob", 1)
    before = Job.objects.get(pk=mine[0].pk).last_modified
    assert board.abandon_many([*mine, mine[0].uuid, *theirs, str(uuid.uuid4())], "ann") == 2
    assert [j.state for j in mine] == ["UNCLAIMED", "UNCLAIMED"]
    assert theirs[0].owner == "bob"
    after = Job.objects.get(pk=mine[0].pk)
    assert after.claim_expires_at is None and after.attempts == 1 and after.last_modified > before
    assert board.abandon_many([], "ann") == 0
    with pytest.raises(TypeError, match="who"):
        board.abandon_many(mine, None)
    # Free again, for anyone, in claim order.
    assert [j.uuid for j in board.claim_many("cy", 5)] == [mine[0].uuid, mine[1].uuid]


# -- the worker's driver ----------------------------------------------------------------------


def test_board_driver_claims_settles_gives_back_and_renews_in_batches(board):
    from django_taskloop.workers import Handler
    from django_taskloop.workers.drivers import BoardDriver

    post_many(board, 5)
    driver = BoardDriver(Handler("board", board.name, lambda job: None, board.name, batch=3, lease=60), "w1")
    driver.prepare()
    jobs = driver.claim(driver.handler.batch)
    assert [j.details["n"] for j in jobs] == [0, 1, 2] and all(j.owner == "w1" for j in jobs)
    assert all(55 < j.expires_in() <= 60 for j in jobs)
    Job.objects.filter(pk=jobs[0].pk).update(claim_expires_at=DbNow(5))
    lost = board.claim(board.post("lost"), "w2")
    driver.renew([*jobs, lost])
    assert 55 < jobs[0].expires_in() <= 60
    assert lost.owner == "w2" and lost.expires_in() == -1  # not ours: untouched
    driver.done(jobs[:2])
    assert [j.state for j in jobs] == ["COMPLETE", "COMPLETE", "CLAIMED"]
    driver.give_back(jobs[2:])
    assert jobs[2].state == "UNCLAIMED"
    board.pause()
    assert driver.claim(10) == []


# -- real processes racing ---------------------------------------------------------------------


def _claim_many_and_consume(board_id: int, worker: str, limit: int) -> list[str]:
    board = JobBoard.objects.get(pk=board_id)
    done: list[str] = []
    while True:
        jobs = board.claim_many(worker, limit, expiry=600)
        if not jobs:
            return done
        assert all(j.claimed_by == worker for j in jobs)
        assert board.consume_many(jobs, worker) == len(jobs)
        done.extend(j.uuid for j in jobs)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_processes_claim_many_every_job_exactly_once():
    board = JobBoard.objects.create_board("race-many")
    post_many(board, 6000)
    expected = set(Job.objects.values_list("uuid", flat=True))
    # Batches of different sizes, one job at a time among them.
    results = race(_claim_many_and_consume, [(board.pk, f"w{i}", (1, 7, 50, 100, 100)[i]) for i in range(5)])
    everything = [u for result in results for u in result]
    assert len(everything) == 6000, [len(r) for r in results]
    assert set(everything) == expected
    assert board.job_count == 0 and not Job.objects.exists()
    connections.close_all()


def test_extend_many_extends_only_the_live_claims_who_holds(board):
    for n in range(4):
        board.post(f"job-{n}")
    mine = board.claim_many("me", 3, expiry=5)
    theirs = board.claim_many("them", 1, expiry=5)
    board.consume(mine[2], "me")
    before = {job.uuid: Job.objects.get(uuid=job.uuid).claim_expires_at for job in [*mine[:2], *theirs]}
    assert board.extend_many([*mine, *theirs, str(uuid.uuid4())], "me", 600) == 2
    after = {job.uuid: Job.objects.get(uuid=job.uuid).claim_expires_at for job in [*mine[:2], *theirs]}
    now = db_now()
    assert all((after[job.uuid] - now).total_seconds() > 500 for job in mine[:2])
    assert after[theirs[0].uuid] == before[theirs[0].uuid]  # another's claim is left alone
    assert board.extend_many([], "me", 600) == 0
    with pytest.raises(ValueError, match="seconds"):
        board.extend_many(mine, "me", 0)
    with pytest.raises(TypeError, match="jobs"):
        board.extend_many(mine[0], "me", 5)
