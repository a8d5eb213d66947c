"""Job boards (SPEC §2, §6 "Job boards"): TaskFlow's jobboards on the database."""

from __future__ import annotations

import math
import threading
import time
import uuid

import pytest
from django.db import connections, transaction
from django.test import override_settings

from django_taskloop.engine import DbNow, db_now
from django_taskloop.exceptions import JobFailure, NotFound, TaskloopError, UnclaimableJob
from django_taskloop.models import Job, JobBoard, JobPriority
from django_taskloop.models.boards import BoardEntity, ConsumedJob
from django_taskloop.signals import job_posted, job_removed
from tests.conftest import race

pytestmark = pytest.mark.django_db


@pytest.fixture
def board() -> JobBoard:
    return JobBoard.objects.create_board("builds")


def claimed(board: JobBoard, who: str = "ann", **kw) -> Job:
    job = board.post("j", **kw)
    board.claim(job, who)
    return job


# -- boards ----------------------------------------------------------------------------------


def test_create_board_and_if_not_exists():
    board = JobBoard.objects.create_board("a.b-c_9")
    assert board.name == "a.b-c_9" and board.pk and board.created_on is not None
    with pytest.raises(ValueError, match="name"):
        JobBoard.objects.create_board("a.b-c_9")
    again = JobBoard.objects.create_board("a.b-c_9", if_not_exists=True)
    assert again.pk == board.pk
    assert JobBoard.objects.count() == 1


@pytest.mark.parametrize(
    "name, error",
    [(5, TypeError), (None, TypeError), (b"x", TypeError), ("", ValueError), ("x" * 101, ValueError),
     ("a b", ValueError), ("é", ValueError), ("a/b", ValueError), ("a\n", ValueError)],
)  # fmt: skip
def test_create_board_rejects_bad_names_and_writes_nothing(name, error):
    with pytest.raises(error, match="name"):
        JobBoard.objects.create_board(name)
    with pytest.raises(TypeError, match="if_not_exists"):
        JobBoard.objects.create_board("ok", if_not_exists=1)
    assert JobBoard.objects.count() == 0
    assert JobBoard.objects.create_board("x" * 100).name == "x" * 100


# -- post ------------------------------------------------------------------------------------


def test_post_returns_an_unclaimed_job(board):
    job = board.post("build-1", details={"sha": "abc"}, priority="high")
    assert isinstance(job.uuid, str) and job.uuid == str(uuid.UUID(job.uuid))
    assert job.name == "build-1" and job.details == {"sha": "abc"}
    assert job.priority is JobPriority.HIGH and job.board == board
    assert job.state == "UNCLAIMED" and job.owner is None
    assert job.created_on == job.last_modified
    assert abs((db_now() - job.created_on).total_seconds()) < 5
    assert job.trashed is False and job.trashed_by is None and job.trashed_at is None
    fresh = Job.objects.get(uuid=job.uuid)
    assert fresh.priority is JobPriority.HIGH and fresh.details == {"sha": "abc"}
    assert board.post("x").details == {} and board.post("x").priority is JobPriority.NORMAL


@pytest.mark.parametrize(
    "kwargs, error, word",
    [
        ({"priority": None}, ValueError, "priority"),
        ({"priority": "urgent"}, ValueError, "priority"),
        ({"priority": 0}, ValueError, "priority"),
        ({"priority": JobPriority.HIGH.rank}, ValueError, "priority"),
        ({"details": [1]}, TypeError, "details"),
        ({"details": {"x": object()}}, TypeError, "details"),
        ({"details": {"x": math.nan}}, ValueError, "details"),
        ({"name": 5}, TypeError, "name"),
        ({"name": "n" * 256}, ValueError, "name"),
    ],
)
def test_post_rejects_bad_input_and_writes_nothing(board, kwargs, error, word):
    with pytest.raises(error, match=word):
        board.post(**{"name": "n", **kwargs})
    assert Job.objects.count() == 0


def test_priority_conversion():
    assert JobPriority.convert("very_low") is JobPriority.VERY_LOW
    assert JobPriority.VERY_HIGH.value == "VERY_HIGH"
    assert JobPriority.reorder((JobPriority.LOW, "a"), ("very_high", "b"), ("LOW", "c")) == ("b", "a", "c")
    assert JobPriority.reorder(("normal", 1)) == 1
    with pytest.raises(ValueError):
        JobPriority.reorder()


# -- priority order --------------------------------------------------------------------------

ORDER = ["NORMAL", "LOW", "VERY_HIGH", "NORMAL", "HIGH", "VERY_HIGH", "VERY_LOW"]
EXPECTED = ["VERY_HIGH#3", "VERY_HIGH#6", "HIGH#5", "NORMAL#1", "NORMAL#4", "LOW#2", "VERY_LOW#7"]


def post_in_order(board):
    for i, priority in enumerate(ORDER, 1):
        board.post(f"{priority}#{i}", priority=priority)


def test_iterjobs_orders_by_priority_then_posting(board):
    post_in_order(board)
    assert [j.name for j in board.iterjobs()] == EXPECTED
    board.claim(next(j for j in board.iterjobs() if j.name == "HIGH#5"), "ann")
    assert [j.name for j in board.iterjobs(only_unclaimed=True)] == [n for n in EXPECTED if n != "HIGH#5"]
    assert [j.name for j in board.iterjobs(ensure_fresh=True)] == EXPECTED
    with pytest.raises(TypeError, match="only_unclaimed"):
        board.iterjobs(only_unclaimed="yes")


def test_claim_next_takes_most_urgent_then_oldest(board):
    post_in_order(board)
    got = [board.claim_next("ann") for _ in range(8)]
    assert [j.name if j else None for j in got] == [*EXPECTED, None]
    assert all(j.state == "CLAIMED" and j.owner == "ann" for j in got[:-1])
    assert got[0].claimed_by == "ann" and got[0].last_modified > got[0].created_on


def test_claim_next_skips_claimed_and_trashed_and_takes_expired(board):
    a, b, c = (board.post(n) for n in "abc")
    board.claim(a, "x")
    board.claim(b, "x")
    board.trash(b, "x")
    Job.objects.filter(pk=a.pk).update(claim_expires_at=DbNow(-1))  # a's claim has just expired
    assert board.claim_next("y").uuid == a.uuid
    assert board.claim_next("y").uuid == c.uuid
    assert board.claim_next("y") is None


def test_claim_next_validates_before_writing(board):
    board.post("a")
    for kwargs, error, word in [
        ({"who": 3}, TypeError, "who"),
        ({"who": ""}, ValueError, "who"),
        ({"who": "w", "expiry": 0}, ValueError, "expiry"),
        ({"who": "w", "expiry": "1"}, TypeError, "expiry"),
    ]:
        with pytest.raises(error, match=word):
            board.claim_next(**kwargs)
    assert board.find_owner(board.post("b")) is None
    assert not Job.objects.claimed().exists()


# -- failure matrix (SPEC §2, reference §1.7) ------------------------------------------------


def test_claim_already_claimed_by_other_or_same_owner_is_unclaimable(board):
    job = claimed(board, "ann")
    before = Job.objects.get(pk=job.pk).last_modified
    with pytest.raises(UnclaimableJob, match="ann"):
        board.claim(job, "bob")
    with pytest.raises(UnclaimableJob):
        board.claim(job, "ann")
    assert board.find_owner(job) == "ann"
    assert Job.objects.get(pk=job.pk).last_modified == before


def test_claim_of_gone_or_unknown_job_is_not_found(board):
    consumed = claimed(board)
    board.consume(consumed, "ann")
    trashed = claimed(board)
    board.trash(trashed, "ann")
    other_board = JobBoard.objects.create_board("other")
    elsewhere = other_board.post("e")
    for job in (consumed, trashed, str(uuid.uuid4()), elsewhere):
        with pytest.raises(NotFound):
            board.claim(job, "bob")
    assert not issubclass(NotFound, JobFailure) and issubclass(UnclaimableJob, JobFailure)


@pytest.mark.parametrize("verb", ["abandon", "consume", "trash"])
def test_release_verbs_failure_matrix(board, verb):
    act = getattr(board, verb)
    unclaimed = board.post("u")
    with pytest.raises(NotFound, match="not claimed"):
        act(unclaimed, "ann")
    theirs = claimed(board, "bob")
    with pytest.raises(JobFailure, match="not owned") as info:
        act(theirs, "ann")
    assert type(info.value) is JobFailure
    with pytest.raises(NotFound):
        act(str(uuid.uuid4()), "ann")
    mine = claimed(board, "ann")
    act(mine, "ann")
    if verb == "abandon":
        assert mine.state == "UNCLAIMED"
    else:
        assert mine.state == "COMPLETE"
        with pytest.raises(
            NotFound, match=f"not found to be {verb.rstrip('e')}ed"
        ):  # consume twice, trash twice
            act(mine, "ann")
        for again in ("abandon", "consume", "trash"):
            with pytest.raises(NotFound):
                getattr(board, again)(mine, "ann")
    assert theirs.state == "CLAIMED" and unclaimed.state == "UNCLAIMED"


@pytest.mark.parametrize("verb", ["claim", "abandon", "consume", "trash"])
@pytest.mark.parametrize(
    "job, who, error, word",
    [
        ("ok", 5, TypeError, "who"),
        ("ok", None, TypeError, "who"),
        ("ok", "", ValueError, "who"),
        (12, "w", TypeError, "job"),
        ("not-a-uuid", "w", ValueError, "job"),
    ],
)
def test_bad_arguments_raise_before_writing(board, verb, job, who, error, word):
    real = board.post("j")
    board.claim(board.post("k"), "w")
    before = list(Job.objects.values_list("uuid", "claimed_by", "last_modified", "trashed"))
    with pytest.raises(error, match=word):
        getattr(board, verb)(real if job == "ok" else job, who)
    assert list(Job.objects.values_list("uuid", "claimed_by", "last_modified", "trashed")) == before


def test_claim_rejects_bad_expiry(board):
    job = board.post("j")
    for expiry, error in [(0, ValueError), (-1, ValueError), (math.nan, ValueError), (math.inf, ValueError),
                          ("5", TypeError), (True, TypeError)]:  # fmt: skip
        with pytest.raises(error, match="expiry"):
            board.claim(job, "w", expiry=expiry)
    assert job.state == "UNCLAIMED"


def test_job_accepted_as_instance_str_any_case_or_uuid(board):
    a, b, c = (board.post(n) for n in "abc")
    board.claim(a, "w")
    board.claim(b.uuid.upper(), "w")
    board.claim(uuid.UUID(c.uuid), "w")
    assert [board.find_owner(x) for x in (a.uuid.upper(), uuid.UUID(b.uuid), c)] == ["w", "w", "w"]
    board.consume(a.uuid.upper(), "w")
    board.abandon(uuid.UUID(b.uuid), "w")
    assert (a.state, b.state) == ("COMPLETE", "UNCLAIMED")


def test_consume_after_expiry(board):
    job = board.post("j")
    board.claim(job, "ann", expiry=60)
    Job.objects.filter(pk=job.pk).update(claim_expires_at=DbNow(-1))  # expired, nobody re-claimed
    with pytest.raises(NotFound):
        board.consume(job, "ann")
    board.claim(job, "bob")  # someone else re-claimed
    with pytest.raises(JobFailure, match="not owned"):
        board.consume(job, "ann")
    board.consume(job, "bob")


def test_verbs_inside_callers_transaction_roll_back_with_it(board):
    job = board.post("j")
    with transaction.atomic():
        board.claim(job, "ann")
        assert job.state == "CLAIMED"
        transaction.set_rollback(True)
    assert job.state == "UNCLAIMED"
    with transaction.atomic():
        board.post("k")
        transaction.set_rollback(True)
    assert board.job_count == 1


# -- state, owner, expiry ----------------------------------------------------------------------


@pytest.mark.slow
def test_claim_with_expiry_lapses_and_another_can_claim(board, clock):
    job = board.post("j")
    board.claim(job, "ann", expiry=60)
    assert job.state == "CLAIMED" and job.owner == "ann"
    assert 0 < job.expires_in() <= 60
    with pytest.raises(UnclaimableJob):
        board.claim(job, "bob")
    clock.advance(30)
    assert job.state == "CLAIMED" and 0 < job.expires_in() <= 30
    with pytest.raises(UnclaimableJob):
        board.claim(job, "bob")
    clock.advance(31)
    assert job.state == "UNCLAIMED"
    assert job.owner is None and board.find_owner(job) is None
    assert job.expires_in() == -2
    assert [j.uuid for j in board.iterjobs(only_unclaimed=True)] == [job.uuid]
    board.claim(job, "bob", expiry=30)
    assert job.owner == "bob" and 29 < job.expires_in() <= 30


def test_expires_in_values(board):
    job = board.post("j")
    assert job.expires_in() == -2
    board.claim(job, "ann")
    assert job.expires_in() == -1
    board.abandon(job, "ann")
    board.claim(job, "ann", expiry=100)
    assert 99 < job.expires_in() <= 100
    board.consume(job, "ann")
    assert job.expires_in() == -2


def test_extend_expiry_on_live_expired_and_never_expiring_claims(board):
    live = board.post("live")
    board.claim(live, "ann", expiry=10)
    stamp = Job.objects.get(pk=live.pk).last_modified
    assert live.extend_expiry(500) is True
    assert 499 < live.expires_in() <= 500
    assert Job.objects.get(pk=live.pk).last_modified >= stamp
    forever = board.post("forever")
    board.claim(forever, "ann")
    assert forever.expires_in() == -1
    assert forever.extend_expiry(20) is True
    assert 19 < forever.expires_in() <= 20
    expired = board.post("expired")
    board.claim(expired, "ann", expiry=10)
    Job.objects.filter(pk=expired.pk).update(claim_expires_at=DbNow(-1))
    assert expired.extend_expiry(100) is False
    assert expired.state == "UNCLAIMED"
    unclaimed = board.post("u")
    assert unclaimed.extend_expiry(100) is False and unclaimed.expires_in() == -2
    board.consume(live, "ann")
    assert live.extend_expiry(100) is False
    for bad, error in [
        (0, ValueError),
        (-5, ValueError),
        (math.nan, ValueError),
        (None, TypeError),
        ("1", TypeError),
    ]:
        with pytest.raises(error, match="seconds"):
            forever.extend_expiry(bad)
    assert 18 < forever.expires_in() <= 20


def test_reap_expired_tidies_expired_claims_only(board):
    a, b, c = (board.post(n) for n in "abc")
    board.claim(a, "x", expiry=100)
    board.claim(b, "x")
    board.claim(c, "x", expiry=100)
    Job.objects.filter(pk=a.pk).update(claim_expires_at=DbNow(-1))
    assert Job.objects.reap_expired() == 1
    assert Job.objects.get(pk=a.pk).claimed_by is None
    assert (b.state, c.state, a.state) == ("CLAIMED", "CLAIMED", "UNCLAIMED")
    assert Job.objects.reap_expired() == 0


# -- consume history -------------------------------------------------------------------------


def test_consume_removes_the_row_by_default(board):
    job = claimed(board)
    board.consume(job, "ann")
    assert not Job.objects.filter(uuid=job.uuid).exists()
    assert ConsumedJob.objects.count() == 0
    assert job.state == "COMPLETE"


def test_consume_keeps_history_with_retention_and_prune_removes_it(board):
    with override_settings(TASKLOOP={"JOB_HISTORY_RETENTION": 3600}):
        job = claimed(board, priority="low", details={"a": 1})
        board.consume(job, "ann")
        assert not Job.objects.filter(uuid=job.uuid).exists()
        (history,) = ConsumedJob.objects.all()
        assert (history.uuid, history.consumed_by, history.priority, history.details) == (
            job.uuid,
            "ann",
            JobPriority.LOW,
            {"a": 1},
        )
        assert history.state == "COMPLETE" and job.state == "COMPLETE"
        assert Job.objects.prune_history() == 0
    with override_settings(TASKLOOP={"JOB_HISTORY_RETENTION": 0}):
        assert Job.objects.prune_history() == 1
    assert ConsumedJob.objects.count() == 0


# -- trash and repost ------------------------------------------------------------------------


def test_trash_keeps_the_record_and_repost_posts_it_again(board):
    job = claimed(board, "ann", details={"k": [1, 2]}, priority=JobPriority.VERY_HIGH)
    board.post("other")
    board.trash(job, "ann")
    assert job.state == "COMPLETE" and job.owner is None
    row = Job.objects.get(uuid=job.uuid)
    assert row.trashed is True and row.trashed_by == "ann"
    assert abs((db_now() - row.trashed_at).total_seconds()) < 5
    assert row.last_modified >= row.trashed_at - (row.trashed_at - row.last_modified)
    assert board.job_count == 1
    assert [j.name for j in board.iterjobs()] == ["other"]
    assert job.wait(0) is True
    new = board.repost(job.uuid)
    assert new.uuid != job.uuid and new.state == "UNCLAIMED"
    assert (new.name, new.details, new.priority) == ("j", {"k": [1, 2]}, JobPriority.VERY_HIGH)
    assert board.job_count == 2 and Job.objects.filter(uuid=job.uuid, trashed=True).exists()
    with pytest.raises(JobFailure, match="not trashed"):
        board.repost(new)
    with pytest.raises(NotFound):
        board.repost(str(uuid.uuid4()))


# -- job_count, find_owner --------------------------------------------------------------------


def test_job_count_and_find_owner(board):
    assert board.job_count == 0
    a, b, c, d = (board.post(n) for n in "abcd")
    board.claim(a, "ann")
    board.claim(b, "bob")
    board.consume(b, "bob")
    board.claim(c, "cy")
    board.trash(c, "cy")
    assert board.job_count == 2  # a (claimed) and d (unclaimed)
    assert board.find_owner(a) == "ann"
    assert board.find_owner(d) is None
    assert board.find_owner(b) is None and board.find_owner(c) is None
    assert JobBoard.objects.create_board("empty").job_count == 0


def test_last_modified_changes_on_claim_abandon_and_trash(board, clock):
    job = board.post("j")
    stamps = [Job.objects.get(pk=job.pk).last_modified]
    for step in (
        lambda: board.claim(job, "a"),
        lambda: board.abandon(job, "a"),
        lambda: board.claim(job, "a"),
    ):
        clock.advance(1)
        step()
        stamps.append(Job.objects.get(pk=job.pk).last_modified)
    clock.advance(1)
    board.trash(job, "a")
    stamps.append(Job.objects.get(pk=job.pk).last_modified)
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)


# -- wait ------------------------------------------------------------------------------------


def test_wait_zero_and_inside_atomic(board):
    with pytest.raises(NotFound):
        board.wait(0)
    with pytest.raises(NotFound):
        board.wait(-3)  # a negative timeout is 0
    # The test runs inside atomic(): a wait with a timeout there could never succeed.
    for call in (lambda: board.wait(1), lambda: board.wait(None), lambda: board.post("x").wait(1)):
        with pytest.raises(TaskloopError, match="atomic"):
            call()
    assert [j.name for j in board.wait(0)] == ["x"]
    for bad, error in [(math.nan, ValueError), (math.inf, ValueError), ("1", TypeError)]:
        with pytest.raises(error, match="timeout"):
            board.wait(bad)
        with pytest.raises(error, match="timeout"):
            Job.objects.get().wait(bad)


def test_job_wait_zero_checks_state_first(board):
    job = claimed(board)
    assert job.wait(0) is False
    board.consume(job, "ann")
    assert job.wait(0) is True


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_wait_times_out_and_wakes_on_post_and_consume():
    board = JobBoard.objects.create_board("w")
    start = time.monotonic()
    with pytest.raises(NotFound):
        board.wait(0.3)
    assert 0.3 <= time.monotonic() - start < 3

    def later(fn):
        def run():
            time.sleep(0.3)
            try:
                fn()
            finally:
                connections.close_all()

        thread = threading.Thread(target=run)
        thread.start()
        return thread

    thread = later(lambda: board.post("late"))
    start = time.monotonic()
    assert [j.name for j in board.wait(10)] == ["late"]
    assert time.monotonic() - start < 5
    thread.join()

    job = board.claim_next("ann")
    start = time.monotonic()
    assert job.wait(0.3) is False
    assert 0.3 <= time.monotonic() - start < 3
    thread = later(lambda: board.consume(job.uuid, "ann"))
    assert job.wait(10) is True
    assert time.monotonic() - start < 8
    thread.join()


# -- signals ---------------------------------------------------------------------------------


@pytest.fixture
def received():
    log: list[tuple[str, str]] = []

    def on_posted(sender, job, **kw):
        log.append(("posted", job.name))

    def on_removed(sender, job, **kw):
        log.append(("removed", job.name))

    job_posted.connect(on_posted)
    job_removed.connect(on_removed)
    yield log
    job_posted.disconnect(on_posted)
    job_removed.disconnect(on_removed)


@pytest.mark.django_db(transaction=True)
def test_signals_fire_after_commit_only(received, clock):
    board = JobBoard.objects.create_board("s")
    with transaction.atomic():
        a = board.post("a")
        assert received == []
    assert received == [("posted", "a")]
    with transaction.atomic():
        board.post("rolled-back")
        transaction.set_rollback(True)
    assert received == [("posted", "a")]
    board.claim(a, "w")
    board.abandon(a, "w")
    board.claim(a, "w", expiry=60)  # expiring is not a removal either
    assert received == [("posted", "a")]
    board.claim(board.post("b"), "w")
    board.consume(Job.objects.get(name="b"), "w")
    clock.advance(30)
    assert board.claim_next("w") is None  # a's claim holds
    clock.advance(31)  # a's claim expires
    c = board.claim_next("w")
    with transaction.atomic():
        board.trash(c, "w")
        transaction.set_rollback(True)
    board.trash(c, "w")
    board.repost(c)
    assert received == [
        ("posted", "a"),
        ("posted", "b"),
        ("removed", "b"),
        ("removed", "a"),
        ("posted", "a"),
    ]


# -- register_entity -------------------------------------------------------------------------


def test_register_entity_heartbeats(board, clock):
    first = board.register_entity("conductor", "c1@host:1", {"pid": 1})
    assert (first.kind, first.name, first.metadata) == ("conductor", "c1@host:1", {"pid": 1})
    assert abs((db_now() - first.last_seen).total_seconds()) < 5
    clock.advance(1)
    second = board.register_entity("conductor", "c1@host:1")
    assert second.pk == first.pk and second.last_seen > first.last_seen
    assert second.metadata == {"pid": 1}  # no metadata: keep what was registered
    assert board.register_entity("conductor", "c1@host:1", {"pid": 2}).metadata == {"pid": 2}
    board.register_entity("conductor", "c2@host:2")
    assert BoardEntity.objects.filter(board=board).count() == 2
    assert board.entities.count() == 2


def test_register_entity_staleness(board):
    old = board.register_entity("conductor", "old")
    BoardEntity.objects.filter(pk=old.pk).update(
        last_seen=db_now() - __import__("datetime").timedelta(seconds=120)
    )
    new = board.register_entity("conductor", "new")
    assert [e.name for e in board.entities.stale()] == ["old"]  # default ENTITY_TIMEOUT: 60 s
    assert [e.name for e in board.entities.alive()] == ["new"]
    assert old.is_stale() and not new.is_stale()
    assert new.is_stale(timeout=0) and [e.name for e in board.entities.stale(timeout=1000)] == []
    with override_settings(TASKLOOP={"ENTITY_TIMEOUT": 600}):
        assert not old.is_stale()
    board.register_entity("conductor", "old")  # it beats again
    assert not BoardEntity.objects.get(pk=old.pk).is_stale()


@pytest.mark.parametrize(
    "args, error, word",
    [
        ((5, "n"), TypeError, "kind"),
        (("", "n"), ValueError, "kind"),
        (("k", None), TypeError, "name"),
        (("k", ""), ValueError, "name"),
        (("k", "n", [1]), TypeError, "metadata"),
        (("k", "n", {"x": {1, 2}}), TypeError, "metadata"),
    ],
)
def test_register_entity_validates(board, args, error, word):
    with pytest.raises(error, match=word):
        board.register_entity(*args)
    assert BoardEntity.objects.count() == 0


# -- routing ---------------------------------------------------------------------------------


@pytest.mark.django_db(databases=["default", "other"])
def test_boards_stay_on_the_routed_database():
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connections["default"]) as on_default:
        board = JobBoard.objects.using("other").create_board("elsewhere")
        same = JobBoard.objects.db_manager("other").create_board("elsewhere", if_not_exists=True)
        assert same.pk == board.pk
        post_in_order(board)
        job = board.claim_next("ann", expiry=60)
        assert job.name == "VERY_HIGH#3" and job.state == "CLAIMED" and job.owner == "ann"
        assert job.extend_expiry(100) and 99 < job.expires_in() <= 100
        board.claim(board.post("k"), "bob")
        board.abandon(Job.objects.using("other").get(name="k").uuid, "bob")
        board.consume(job, "ann")
        second = board.claim_next("ann")
        board.trash(second, "ann")
        board.repost(second)
        assert board.job_count == 7
        assert board.find_owner(second) is None
        assert [j.name for j in board.iterjobs()][0] == "VERY_HIGH#6"
        assert board.wait(0)
        assert job.wait(0) is True
        board.register_entity("conductor", "c")
        assert board.entities.stale().count() == 0
        assert Job.objects.using("other").reap_expired() == 0
        assert Job.objects.db_manager("other").prune_history() == 0
    assert len(on_default) == 0, [q["sql"] for q in on_default]
    assert JobBoard.objects.count() == 0 and Job.objects.count() == 0


# -- the claim index -------------------------------------------------------------------------


def test_claim_next_candidates_read_the_claim_index(board):
    from tests.explain import assert_ordered_by_index

    now = db_now()
    other = JobBoard.objects.create_board("other")
    Job.objects.bulk_create(
        [
            Job(board=(board, other)[i % 2], uuid=str(uuid.uuid4()), name=f"j{i}",
                priority=JobPriority.convert(ORDER[i % 7]), created_on=now, last_modified=now)
            for i in range(20000)
        ],
        batch_size=2000,
    )  # fmt: skip
    # The same queryset claim_next gives the engine: candidates in claim order.
    candidates = board.jobs.claimable().in_claim_order().values_list("pk")[:2]
    text = assert_ordered_by_index(candidates)
    assert "taskloop_job_claim_idx" in text, text
    assert board.claim_next("w").priority is JobPriority.VERY_HIGH


# -- real processes racing ---------------------------------------------------------------------


def _claim_and_consume(board_id: int, worker: str) -> list[str]:
    board = JobBoard.objects.get(pk=board_id)
    done = []
    while True:
        job = board.claim_next(worker, expiry=600)
        if job is None:
            return done
        board.consume(job, worker)
        done.append(job.uuid)


def post_many(board: JobBoard, n: int) -> None:
    now = db_now()
    Job.objects.bulk_create(
        [
            Job(board=board, uuid=str(uuid.uuid4()), name=f"j{i}", created_on=now, last_modified=now)
            for i in range(n)
        ],
        batch_size=1000,
    )


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_eight_processes_consume_every_job_exactly_once():
    board = JobBoard.objects.create_board("race")
    post_many(board, 2000)
    expected = set(Job.objects.values_list("uuid", flat=True))
    results = race(_claim_and_consume, [(board.pk, f"w{i}") for i in range(8)])
    everything = [u for result in results for u in result]
    assert all(results), f"some process consumed nothing: {[len(r) for r in results]}"
    assert len(everything) == 2000
    assert set(everything) == expected
    assert board.job_count == 0 and not Job.objects.exists()
    connections.close_all()


@pytest.mark.parametrize("timeout", [-5, 0, 10**12, None])
def test_a_board_and_a_tube_read_a_wait_s_timeout_by_one_rule(board, timeout):
    """One rule for every wait (validation.check_timeout): a negative timeout is 0, one past
    MAX_SECONDS waits that long, None forever. The board's wait refused a long one (ValueError)
    while the tube's take clamped it; inside atomic() both now say why they cannot wait."""
    from django_taskloop.exceptions import TaskloopError
    from django_taskloop.models import Tube
    from django_taskloop.validation import MAX_SECONDS, check_timeout

    expected = None if timeout is None else min(max(0.0, float(timeout)), float(MAX_SECONDS))
    assert check_timeout(timeout) == expected
    tube = Tube.objects.create_tube("waits", "fifo")
    if expected == 0:  # no wait: one immediate try each
        with pytest.raises(NotFound):
            board.wait(timeout)
        assert tube.take(timeout=timeout) is None
        return
    # The test runs inside atomic(): a wait there could never succeed, on either.
    with pytest.raises(TaskloopError, match="atomic"):
        board.wait(timeout)
    with pytest.raises(TaskloopError, match="inside a transaction"):
        tube.take(timeout=timeout)
