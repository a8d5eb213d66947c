"""Lockable (SPEC §4): claim, renew, skip others' locks, release, release_expired."""

from __future__ import annotations

import math
import time

import pytest
from django.db import connections, transaction

from django_taskloop.engine import db_now
from tests.conftest import race
from tests.testapp.models import Ticket

pytestmark = pytest.mark.django_db


def make(n: int, **kw) -> list[Ticket]:
    return Ticket.objects.bulk_create([Ticket(rank=i, **kw) for i in range(n)])


def test_claim_locks_rows_in_order_with_db_deadline():
    make(8)
    before = db_now()
    got = Ticket.objects.order_by("-rank").claim("ed", 3, lock_for=100)
    assert [t.rank for t in got] == [7, 6, 5]
    for t in got:
        assert t.locked_by == "ed"
        assert 99 < (t.lock_expires_at - before).total_seconds() < 105
    assert Ticket.objects.filter(locked_by="ed").count() == 3


def test_claim_honours_filters_and_skips_others_locks():
    make(4, queue="a")
    make(4, queue="b")
    mine = Ticket.objects.filter(queue="b").claim("ann", 2)
    assert {t.queue for t in mine} == {"b"}
    theirs = Ticket.objects.filter(queue="b").claim("bob", 5)
    assert len(theirs) == 2
    assert not {t.pk for t in mine} & {t.pk for t in theirs}
    assert Ticket.objects.filter(queue="b").claim("cy", 5) == []


def test_claim_includes_own_rows_and_refreshes_them():
    make(3)
    first = Ticket.objects.claim("ed", 2, lock_for=10)
    again = Ticket.objects.claim("ed", 3, lock_for=1000)
    assert {t.pk for t in first} <= {t.pk for t in again}
    assert len(again) == 3
    for t in again:
        assert t.lock_expires_at > first[0].lock_expires_at


def test_expired_locks_are_claimable_by_others(clock):
    make(2)
    Ticket.objects.claim("ed", 2, lock_for=60)
    assert Ticket.objects.claim("bob", 2) == []
    clock.advance(30)
    assert Ticket.objects.claim("bob", 2) == []
    clock.advance(31)
    assert len(Ticket.objects.claim("bob", 2)) == 2


def test_release_and_release_expired_count_rows(clock):
    make(6)
    Ticket.objects.claim("ed", 2)
    Ticket.objects.claim("bob", 2, lock_for=60)
    clock.advance(30)
    assert Ticket.objects.release_expired() == 0
    clock.advance(31)
    assert Ticket.objects.release_expired() == 2
    assert Ticket.objects.release("bob") == 0
    assert Ticket.objects.all().release("ed") == 2
    Ticket.objects.claim("cy", 3)
    assert Ticket.objects.release() == 3
    assert not Ticket.objects.filter(locked_by__isnull=False).exists()
    assert not Ticket.objects.filter(lock_expires_at__isnull=False).exists()


def test_claim_inside_callers_transaction_rolls_back_with_it():
    make(2)
    with transaction.atomic():
        assert len(Ticket.objects.claim("ed", 2)) == 2
        transaction.set_rollback(True)
    assert Ticket.objects.filter(locked_by__isnull=False).count() == 0


@pytest.mark.parametrize(
    "kwargs, error, word",
    [
        ({"owner": 5, "limit": 1}, TypeError, "owner"),
        ({"owner": "", "limit": 1}, ValueError, "owner"),
        ({"owner": "x" * 300, "limit": 1}, ValueError, "owner"),
        ({"owner": "a", "limit": 0}, ValueError, "limit"),
        ({"owner": "a", "limit": -1}, ValueError, "limit"),
        ({"owner": "a", "limit": True}, TypeError, "limit"),
        ({"owner": "a", "limit": 1.0}, TypeError, "limit"),
        ({"owner": "a", "limit": 1, "lock_for": 0}, ValueError, "lock_for"),
        ({"owner": "a", "limit": 1, "lock_for": -3}, ValueError, "lock_for"),
        ({"owner": "a", "limit": 1, "lock_for": math.nan}, ValueError, "lock_for"),
        ({"owner": "a", "limit": 1, "lock_for": math.inf}, ValueError, "lock_for"),
        ({"owner": "a", "limit": 1, "lock_for": 1e300}, ValueError, "lock_for"),
        ({"owner": "a", "limit": 1, "lock_for": "5"}, TypeError, "lock_for"),
        ({"owner": "a", "limit": 1, "lock_for": None}, TypeError, "lock_for"),
    ],
)
def test_bad_arguments_raise_and_write_nothing(kwargs, error, word):
    make(3)
    with pytest.raises(error, match=word):
        Ticket.objects.claim(**kwargs)
    assert not Ticket.objects.filter(locked_by__isnull=False).exists()


def test_release_validates_owner():
    with pytest.raises(TypeError, match="owner"):
        Ticket.objects.release(7)
    with pytest.raises(ValueError, match="owner"):
        Ticket.objects.release("")


def test_huge_limit_is_fine():
    make(5)
    assert len(Ticket.objects.claim("ed", 10**9)) == 5


# -- real processes racing ---------------------------------------------------------------


def _claim_until_empty(worker: str) -> list[tuple[int, float, float]]:
    """Claim in small batches until nothing is left; record each claim with its time window."""
    from tests.testapp.models import Ticket

    seen = []
    empty = 0
    while empty < 3:
        got = Ticket.objects.exclude(queue="done").claim(worker, 7, lock_for=600)
        if not got:
            empty += 1
            time.sleep(0.01)
            continue
        empty = 0
        pks = [t.pk for t in got]
        # Mark done by moving them out of the claimable queue, as a worker would.
        Ticket.objects.filter(pk__in=pks, locked_by=worker).update(queue="done")
        seen.extend(pks)
        time.sleep(0.001)  # a little work, so that no process drains it all alone
    return seen


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_eight_processes_claim_every_row_exactly_once():
    Ticket.objects.bulk_create([Ticket(rank=i) for i in range(5000)], batch_size=1000)
    results = race(_claim_until_empty, [(f"w{i}",) for i in range(8)])
    everything = [pk for result in results for pk in result]
    assert all(result for result in results), "some process claimed nothing"
    assert len(everything) == 5000
    assert len(set(everything)) == 5000
    assert Ticket.objects.filter(queue="done").count() == 5000
    connections.close_all()


def _review_and_release(worker: str) -> list[int]:
    """Claim unreviewed tickets 25 at a time, mark them reviewed, release them (issue 12.1)."""
    from tests.testapp.models import Ticket

    seen: list[int] = []
    empty = 0
    while empty < 3:
        got = Ticket.objects.filter(queue="a").order_by("id").claim(worker, 25, lock_for=600)
        if not got:
            empty += 1
            time.sleep(0.01)
            continue
        empty = 0
        pks = [t.pk for t in got]
        # "Reviewed": the row leaves the caller's filter, and the lock is given up at once.
        Ticket.objects.filter(pk__in=pks).update(queue="reviewed")
        Ticket.objects.filter(pk__in=pks).release(worker)
        seen.extend(pks)
    return seen


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("round_", range(3))
def test_filtered_claim_rechecks_the_filter_under_the_lock(round_):
    # A rival read the same candidates before this worker reviewed and released them: the
    # locking read must find that they no longer match the caller's filter (seed 004: the
    # SELECT … FOR UPDATE SKIP LOCKED carries the whole WHERE), not only that they are free.
    Ticket.objects.bulk_create([Ticket(rank=i) for i in range(3000)], batch_size=1000)
    results = race(_review_and_release, [(f"w{i}",) for i in range(8)])
    everything = [pk for result in results for pk in result]
    twice = len(everything) - len(set(everything))
    assert twice == 0, f"{twice} rows were handed out again after they left the filter"
    assert len(everything) == 3000
    assert Ticket.objects.filter(queue="reviewed").count() == 3000
    connections.close_all()


@pytest.mark.django_db(transaction=True)  # so that MariaDB plans on fresh statistics (tests/explain.py)
def test_claim_candidates_read_an_index_in_order():
    from django.db.models import Q

    from django_taskloop.engine import DbNow
    from tests.explain import assert_ordered_by_index

    Ticket.objects.bulk_create([Ticket(queue="ab"[i % 2], rank=i) for i in range(20000)], batch_size=2000)
    claimable = Q(locked_by__isnull=True) | Q(lock_expires_at__lte=DbNow()) | Q(locked_by="x")
    # The default order (primary key) and a user's filtered order (an index on queue, rank).
    assert_ordered_by_index(Ticket.objects.filter(claimable).order_by("pk").values_list("pk")[:14])
    assert_ordered_by_index(
        Ticket.objects.filter(queue="a")
        .filter(claimable)
        .order_by("queue", "rank", "pk")
        .values_list("pk")[:14]
    )
    # release_expired finds expired locks through the lock_expires_at index.
    text = Ticket.objects.filter(lock_expires_at__lte=DbNow()).explain()
    assert "lock_expires_at" in text or "lock_exp" in text, text


@pytest.mark.django_db(databases=["default", "other"])
def test_claims_stay_on_the_routed_database():
    from django.test.utils import CaptureQueriesContext

    Ticket.objects.using("other").bulk_create([Ticket(rank=i) for i in range(5)])
    with CaptureQueriesContext(connections["default"]) as on_default:
        got = Ticket.objects.using("other").claim("ed", 3)
        assert Ticket.objects.using("other").release_expired() == 0
        assert Ticket.objects.db_manager("other").release("ed") == 3
    assert len(got) == 3
    assert len(on_default) == 0
    assert Ticket.objects.count() == 0
