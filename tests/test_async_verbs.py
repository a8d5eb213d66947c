"""The async twins of the producer verbs (issue 28, item 6): ``Tube.aput``, ``Tube.aput_many``,
``JobBoard.apost``, a Lockable ``aclaim``.

Each is awaited from a coroutine, as an async view awaits it (``async_to_sync`` gives the
coroutine an event loop of its own, as the ASGI handler does): the same arguments, the same
result and the same errors as its sync verb, nothing written on bad input, and no
``SynchronousOnlyOperation`` where calling the sync verb from the same coroutine raises one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.core.exceptions import SynchronousOnlyOperation
from django.db import transaction

from django_taskloop.models import Job, JobBoard, JobPriority, Task, Tube
from tests.testapp.models import Ticket

pytestmark = pytest.mark.django_db


def run(coroutine_function: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Any:
    """Await ``coroutine_function(*args, **kwargs)`` on an event loop, as an async view is."""
    return async_to_sync(coroutine_function)(*args, **kwargs)


def same_error(sync_call: Callable[[], Any], async_call: Callable[[], Awaitable[Any]]) -> BaseException:
    """Assert that the sync call and the awaited twin raise the same error; return it."""
    with pytest.raises(Exception) as sync_error:
        sync_call()

    async def awaited() -> Any:
        return await async_call()

    with pytest.raises(Exception) as async_error:
        async_to_sync(awaited)()
    assert type(async_error.value) is type(sync_error.value)
    assert str(async_error.value) == str(sync_error.value)
    return async_error.value


# -- the sync verbs from a coroutine raise: the twins are needed ---------------------------------


def test_the_sync_verbs_raise_in_a_coroutine_and_their_twins_do_not():
    tube = Tube.objects.create_tube("a-guard", "fifottl")
    board = JobBoard.objects.create_board("a-guard-board")
    Ticket.objects.create(rank=1)

    async def sync_verbs_in_a_coroutine() -> list[str]:
        refused = []
        for name, call in (
            ("put", lambda: tube.put(1)),
            ("put_many", lambda: tube.put_many([1])),
            ("post", lambda: board.post("j")),
            ("claim", lambda: Ticket.objects.claim("ed", 1)),
        ):
            try:
                call()
            except SynchronousOnlyOperation:
                refused.append(name)
        return refused

    assert run(sync_verbs_in_a_coroutine) == ["put", "put_many", "post", "claim"]

    async def twins() -> tuple[Any, ...]:
        return (
            await tube.aput(1),
            await tube.aput_many([2, 3]),
            await board.apost("j"),
            await Ticket.objects.aclaim("ed", 1),
        )

    put, many, job, claimed = run(twins)
    assert put.pk and [t.data for t in many] == [2, 3] and job.uuid and [t.rank for t in claimed] == [1]


# -- aput / aput_many -------------------------------------------------------------------------


def test_aput_takes_puts_arguments_and_returns_what_put_returns():
    tube = Tube.objects.create_tube("a-put", "utubettl", ttl=100)
    task = run(tube.aput, {"n": 1}, pri=3, ttr=7, delay=50, utube="u1")
    twin = tube.put({"n": 2}, pri=3, ttr=7, delay=50, utube="u1")
    assert type(task) is Task
    stored = Task.objects.get(pk=task.pk)
    for field in ("state", "pri", "ttr", "utube", "tube_id"):
        assert getattr(stored, field) == getattr(Task.objects.get(pk=twin.pk), field), field
    assert (stored.state, stored.pri, stored.ttr, stored.utube, stored.data) == ("~", 3, 7, "u1", {"n": 1})
    # The deadlines the database computed are read back into the returned task, as put's are.
    assert task.ttl_at == stored.ttl_at and task.event_at == stored.event_at


def test_aput_run_at_delays_like_put():
    from django.utils import timezone

    tube = Tube.objects.create_tube("a-put-at", "fifottl")
    later = timezone.now() + timezone.timedelta(hours=1)
    task = run(tube.aput, "x", run_at=later)
    assert Task.objects.get(pk=task.pk).state == "~"
    assert Task.objects.get(pk=task.pk).event_at == later


@pytest.mark.parametrize(
    "args, kwargs",
    [
        ((object(),), {}),  # not JSON
        (("x",), {"pri": "high"}),
        (("x",), {"ttl": -1}),
        (("x",), {"delay": "soon"}),
        (("x",), {"run_at": "tomorrow"}),
    ],
)
def test_aput_refuses_bad_input_as_put_does_and_writes_nothing(args, kwargs):
    tube = Tube.objects.create_tube("a-put-bad", "fifottl")
    same_error(lambda: tube.put(*args, **kwargs), lambda: tube.aput(*args, **kwargs))
    assert not Task.objects.filter(tube_id=tube.pk).exists()


def test_aput_into_a_dropped_tube_raises_put_s_error():
    tube = Tube.objects.create_tube("a-put-gone", "fifottl")
    Tube.objects.get(pk=tube.pk).drop()
    same_error(lambda: tube.put(1), lambda: tube.aput(1))
    assert not Task.objects.filter(tube_id=tube.pk).exists()


def test_aput_many_returns_the_tasks_in_order_and_joins_the_callers_transaction():
    tube = Tube.objects.create_tube("a-many", "fifottl")
    tasks = run(tube.aput_many, ["a", "b", "c"], pri=2)
    assert [t.data for t in tasks] == ["a", "b", "c"]
    assert list(Task.objects.filter(tube_id=tube.pk).order_by("pk").values_list("data", "pri")) == [
        ("a", 2),
        ("b", 2),
        ("c", 2),
    ]
    # thread_sensitive: the twin runs on the caller's connection, inside its transaction.
    with pytest.raises(RuntimeError), transaction.atomic():
        run(tube.aput_many, ["d"])
        raise RuntimeError("roll back")
    assert Task.objects.filter(tube_id=tube.pk).count() == 3
    assert run(tube.aput_many, []) == []


@pytest.mark.parametrize(
    "args, kwargs",
    [
        (("abc",), {}),  # a str is not a list of items
        ((None,), {}),
        ((["ok", object()],), {}),  # one bad item: nothing at all is written
        ((["ok"],), {"ttr": "long"}),
    ],
)
def test_aput_many_refuses_bad_input_as_put_many_does_and_writes_nothing(args, kwargs):
    tube = Tube.objects.create_tube("a-many-bad", "fifottl")
    same_error(lambda: tube.put_many(*args, **kwargs), lambda: tube.aput_many(*args, **kwargs))
    assert not Task.objects.filter(tube_id=tube.pk).exists()


# -- apost -------------------------------------------------------------------------------------


def test_apost_posts_as_post_does():
    board = JobBoard.objects.create_board("a-post")
    job = run(board.apost, "build", {"ref": "main"}, JobPriority.HIGH)
    assert type(job) is Job
    stored = Job.objects.get(pk=job.pk)
    assert (stored.name, stored.details, stored.priority, stored.state) == (
        "build",
        {"ref": "main"},
        JobPriority.HIGH,
        "UNCLAIMED",
    )
    assert job.created_on == stored.created_on
    assert run(board.apost, "plain").details == {}


@pytest.mark.parametrize(
    "args",
    [
        (123,),
        ("x" * 256,),
        ("j", ["not", "a", "dict"]),
        ("j", {"x": object()}),
        ("j", {}, "URGENT"),
    ],
)
def test_apost_refuses_bad_input_as_post_does_and_writes_nothing(args):
    board = JobBoard.objects.create_board("a-post-bad")
    same_error(lambda: board.post(*args), lambda: board.apost(*args))
    assert not Job.objects.filter(board=board).exists()


# -- aclaim ------------------------------------------------------------------------------------


def test_aclaim_claims_as_claim_does_on_a_filtered_ordered_queryset():
    Ticket.objects.bulk_create([Ticket(rank=i) for i in range(6)])
    got = run(Ticket.objects.filter(rank__gte=2).order_by("-rank").aclaim, "ed", 3, lock_for=100)
    assert [t.rank for t in got] == [5, 4, 3]
    assert all(t.locked_by == "ed" and t.lock_expires_at is not None for t in got)
    assert sorted(Ticket.objects.filter(locked_by="ed").values_list("rank", flat=True)) == [3, 4, 5]
    # Others' live locks are skipped, as claim skips them.
    assert [t.rank for t in run(Ticket.objects.order_by("-rank").aclaim, "al", 2)] == [2, 1]


@pytest.mark.parametrize(
    "args, kwargs",
    [
        (("", 1), {}),
        (("ed", 0), {}),
        (("ed", "2"), {}),
        (("ed", 1), {"lock_for": -5}),
    ],
)
def test_aclaim_refuses_bad_input_as_claim_does_and_locks_nothing(args, kwargs):
    Ticket.objects.bulk_create([Ticket(rank=i) for i in range(3)])
    same_error(lambda: Ticket.objects.claim(*args, **kwargs), lambda: Ticket.objects.aclaim(*args, **kwargs))
    assert not Ticket.objects.filter(locked_by__isnull=False).exists()


def test_aclaim_on_a_sliced_queryset_raises_claims_error():
    Ticket.objects.create(rank=1)
    error = same_error(
        lambda: Ticket.objects.all()[:1].claim("ed", 1), lambda: Ticket.objects.all()[:1].aclaim("ed", 1)
    )
    assert "sliced" in str(error)
    assert not Ticket.objects.filter(locked_by__isnull=False).exists()
