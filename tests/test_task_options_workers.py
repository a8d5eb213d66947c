"""Options exactly as asked (issue 28, item 7): every option of a Django Task, given at the
decorator and overridden per call with ``.using(...)``, as a real ``manage.py workers`` process
runs it.

Black-box: the tests enqueue through Django's API, run worker subprocesses, and read only what
a user can — ``get_result()`` and its ``TaskResult`` fields — and what the tasks themselves
did (``WorkLog`` rows, see tests/option_worker_tasks.py). Times are the database's: the
``TaskResult`` fields and ``db_now()``, never how fast a worker went. What
tests/test_task_options.py already proves (``using(max_attempts=1|2)`` in a worker, the ttr
refusal, in-process ttl/unique/key) is not repeated here.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
from typing import Any

import pytest
from django.db import transaction

from django_taskloop.engine import db_now
from django_taskloop.exceptions import TaskExpired
from tests.testapp.models import WorkLog

from . import option_worker_tasks as t
from .workers_util import run_workers, start_workers, stop, wait_until

try:
    from django.tasks import TaskResultStatus, default_task_backend
    from django.tasks.exceptions import TaskResultDoesNotExist
except ImportError:  # Django 5.2: the backport
    from django_tasks import TaskResultStatus, default_task_backend
    from django_tasks.exceptions import TaskResultDoesNotExist

#: The worker processes' settings: short backoffs, a beat every half second.
BEAT = 0.5
FAST = {"RETRY_BACKOFF": 0.05, "HEARTBEAT_INTERVAL": BEAT, "GRACE_PERIOD": 5}

SUCCESSFUL, FAILED, READY = TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED, TaskResultStatus.READY


def worker_env(**overrides: Any) -> dict[str, str]:
    return {
        "DJANGO_SETTINGS_MODULE": "tests.workers_settings",
        "TASKLOOP_OVERRIDES": json.dumps({**FAST, **overrides}),
    }


def burst(*args: str, **overrides: Any) -> subprocess.CompletedProcess[str]:
    """Run ``manage.py workers --burst *args`` to its end and check that it exited cleanly."""
    run = run_workers("--burst", *args, **worker_env(**overrides))
    assert run.returncode == 0, run.stderr
    return run


def get(result: Any) -> Any:
    """The result as ``get_result()`` reads it now."""
    return default_task_backend.get_result(result.id)


def all_finished(results: list[Any], timeout: float, output: Any = "") -> list[Any]:
    """Wait until every result has finished; return them, re-read. After ``timeout`` seconds
    fail, saying which have not (and what the worker said)."""
    try:
        wait_until(lambda: all(get(result).is_finished for result in results), timeout=timeout, every=0.2)
    except AssertionError:
        waiting = {result.id: (get(result).status, len(get(result).errors)) for result in results}
        raise AssertionError(
            f"not finished after {timeout} s: {waiting}\n{output() if callable(output) else output}"
        ) from None
    return [get(result) for result in results]


def started(kind: str, result: Any) -> list[float]:
    """The starts of ``result``'s attempts that its task logged, as the worker recorded them
    (``last_attempted_at``, database clock), in attempt order; one per call."""
    rows = WorkLog.objects.filter(kind=kind, key=result.id).values_list("phase", "at")
    attempts = sorted((int(phase), at) for phase, at in rows)
    assert [n for n, _ in attempts] == list(range(1, len(attempts) + 1)), attempts
    return [at for _, at in attempts]


def calls(kind: str, name: str) -> int:
    return WorkLog.objects.filter(kind=kind, key=name, phase="end").count()


def seconds(since: dt.datetime, until: dt.datetime) -> float:
    return (until - since).total_seconds()


# max_attempts, backoff, takes_context ---------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_max_attempts_and_backoff_are_what_the_worker_runs():
    """Each attempt starts no sooner than the backoff asked for after the one before (the
    database's times), and there are exactly ``max_attempts`` of them: the decorator's, or
    the call's where ``using()`` gave one."""
    asked = [  # (result, max_attempts, the backoff after each failed attempt)
        (t.fails_every_second.enqueue(), 3, [1, 1]),
        (t.fails_every_second.using(backoff=2.5).enqueue(), 3, [2.5, 2.5]),  # longer per call
        (t.fails_every_second.using(max_attempts=4, backoff=0).enqueue(), 4, [0, 0, 0]),  # more
        (t.fails_growing.enqueue(), 3, [1, 2]),  # a callable: growing(attempt)
        (t.fails_slowly.using(backoff=1.5).enqueue(), 2, [1.5]),  # its own is ten minutes
    ]
    context = t.succeeds_third.enqueue()
    worker = start_workers("--only", "default", **worker_env())
    try:
        finished = all_finished([*(a[0] for a in asked), context], timeout=60, output=lambda: stop(worker))
    finally:
        output = stop(worker)

    for (result, most, backoffs), done in zip(asked, finished[:-1], strict=True):
        assert done.status == FAILED, (done.id, output)
        assert done.attempts == most and len(done.errors) == most, (done.id, backoffs, output)
        assert [error.exception_class for error in done.errors] == [RuntimeError] * most
        for n, error in enumerate(done.errors, 1):
            assert f"attempt {n} of {result.id}" in error.traceback  # the context's, each attempt's
        starts = started("backoff", result)
        assert len(starts) == most  # called once per attempt
        for before, after, wait in zip(starts[:-1], starts[1:], backoffs, strict=True):
            assert after - before >= wait, (result.id, starts, backoffs)
    # takes_context: the attempt and the result id the worker gave the task, attempt by attempt.
    (done,) = finished[-1:]
    assert done.status == SUCCESSFUL and done.return_value == {"attempt": 3, "id": context.id}
    assert len(started("context", context)) == 3
    assert [error.exception_class for error in done.errors] == [ValueError, ValueError]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_per_call_backoff_that_is_not_a_number_is_what_the_worker_waits():
    """``using(backoff=callable)`` and ``using(backoff=None)`` (the worker's own exponential
    backoff) hold for that call, as a number does: not the definition's ten minutes."""
    callable_backoff = t.fails_slowly.using(backoff=t.two_seconds).enqueue()
    default_backoff = t.fails_slowly.using(backoff=None).enqueue()
    worker = start_workers("--only", "default", **worker_env())
    try:
        callable_done, default_done = all_finished(
            # Asked for: 2 s and 0.05 s; the definition's 600 s would leave them READY.
            [callable_backoff, default_backoff],
            timeout=20,
            output=lambda: stop(worker),
        )
    finally:
        output = stop(worker)
    assert callable_done.status == FAILED and callable_done.attempts == 2, output
    first, second = started("backoff", callable_backoff)
    assert second - first >= 2
    assert default_done.status == FAILED and default_done.attempts == 2, output
    first, second = started("backoff", default_backoff)
    assert second - first >= FAST["RETRY_BACKOFF"]


# ttl ------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_task_past_its_ttl_is_never_called_by_a_worker():
    decorator = t.expires.enqueue("decorator's ttl")  # ttl=1
    per_call = t.plain.using(ttl=1).enqueue("ttl", "per call ttl")
    longer = t.expires.using(ttl=600).enqueue("longer per call")
    # The database's clock passes both deadlines (get_result reads them FAILED from then on).
    wait_until(lambda: get(decorator).status == FAILED and get(per_call).status == FAILED, timeout=30)
    assert get(longer).status == READY

    burst("--only", "default")

    for result, name in ((decorator, "decorator's ttl"), (per_call, "per call ttl")):
        done = get(result)
        assert done.status == FAILED and done.started_at is None
        assert [error.exception_class for error in done.errors] == [TaskExpired]
        assert "not started within its ttl of 1 s" in done.errors[0].traceback
        assert calls("ttl", name) == 0  # never called
    done = get(longer)
    assert done.status == SUCCESSFUL and done.return_value == "longer per call"
    assert calls("ttl", "longer per call") == 1


# ttr ------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_task_whose_worker_is_killed_runs_again_after_its_ttr_not_before(settings):
    """kill -9 the worker processes running two hung tasks: each runs again in another process
    once its ttr has passed since the kill (less the last beat) — the decorator's 20 s, or the
    call's 3 s — long before a dead consumer's timeout (10 minutes here)."""
    settings.TASKLOOP = {**settings.TASKLOOP, "HEARTBEAT_INTERVAL": BEAT}  # ttr=3 needs beats of <= 1.5 s
    decorator = t.hangs_first.enqueue("decorator's ttr")  # ttr=20
    per_call = t.hangs_first.using(ttr=3).enqueue("per call ttr")
    worker = start_workers("--only", "default", "--processes", "2", **worker_env(CONSUMER_TIMEOUT=600))
    try:
        first = wait_until(
            lambda: len(rows := list(WorkLog.objects.filter(kind="ttr", phase="1"))) == 2 and rows,
            timeout=60,
        )
        pids = {row.pid for row in first}
        assert len(pids) == 2  # one hung task in each worker process
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        killed = db_now()
        assert get(decorator).status == get(per_call).status == TaskResultStatus.RUNNING
        finished = all_finished([decorator, per_call], timeout=90, output=lambda: stop(worker))
    finally:
        output = stop(worker)

    for done in finished:
        assert done.status == SUCCESSFUL and done.return_value == 2 and done.attempts == 2, output
        (again,) = WorkLog.objects.filter(kind="ttr", key=done.id, phase="2")
        assert again.pid not in pids
    slow, quick = finished
    # Seconds from the kill to the second start. (Not from the first start: the lease runs
    # from the take, a moment before the worker records the start.)
    waited = {
        "decorator": seconds(killed, slow.last_attempted_at),
        "per call": seconds(killed, quick.last_attempted_at),
    }
    # Not before its ttr: the lease a beat renewed at most one beat before the kill ran out
    # (a beat's interval of margin more).
    assert waited["per call"] >= 3 - 2 * BEAT and waited["decorator"] >= 20 - 2 * BEAT, waited
    # The call's ttr, not the decorator's: back before the 20 s could have run out.
    assert waited["per call"] < 20 - 2 * BEAT, waited


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_that_beats_keeps_its_task_past_its_ttr_however_long_it_runs(settings):
    """A healthy worker renews the lease of the task it runs, so a task may run longer than
    its ttr (README). Beats every 0.2 s and ttr=2 (ten beats; the README asks for two): a
    12 s task (60 beats, six ttrs) runs once, though a second worker process, idle, would take
    a lapsed lease. (Each beat must keep the deadline a full lease ahead: beats come their
    interval plus their own work apart, so a beat that adds just its interval shrinks the
    lease a little every time, and a long task loses it to the idle process.) Not a shorter
    ttr: at load 10 on SQLite one beat came 0.5 s late (CI), which no deployment's ttr
    is near."""
    settings.TASKLOOP = {**settings.TASKLOOP, "HEARTBEAT_INTERVAL": 0.2}
    long = t.naps.using(ttr=2).enqueue(12)
    env = worker_env(HEARTBEAT_INTERVAL=0.2, CONSUMER_TIMEOUT=600)
    worker = start_workers("--only", "default", "--processes", "2", **env)
    try:
        (done,) = all_finished([long], timeout=60, output=lambda: stop(worker))
    finally:
        output = stop(worker)
    starts = started("nap", long)
    assert done.status == SUCCESSFUL and done.attempts == 1 and len(starts) == 1, (starts, output)


# key ------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_one_task_of_a_key_at_a_time_and_different_keys_at_once():
    """Two worker processes. x1 and y1 can only succeed together (each waits for the other to
    start); x2 shares x1's key and was enqueued before y1, so it would start beside x1 if keys
    were ignored; y1 and y2 are in group "x" too, moved to the key "apart" per call."""
    x1 = t.meets.enqueue("x", "x1", partner="y1")
    x2 = t.meets.enqueue("x", "x2")
    y1 = t.meets.using(key="apart").enqueue("x", "y1", partner="x1")
    y2 = t.meets.using(key="apart").enqueue("x", "y2")

    run = burst("--only", "default", "--processes", "2", "-v", "2")

    x1, x2, y1, y2 = (get(result) for result in (x1, x2, y1, y2))
    assert [r.status for r in (x1, x2, y1, y2)] == [SUCCESSFUL] * 4, (
        [(r.id, [e.traceback for e in r.errors]) for r in (x1, x2, y1, y2)],
        run.stderr,
    )
    # Different keys ran at the same time...
    assert x1.started_at < y1.finished_at and y1.started_at < x1.finished_at
    # ...one task of a key at a time, in enqueue order.
    assert x2.started_at >= x1.finished_at
    assert y2.started_at >= y1.finished_at
    assert all(calls("key", name) == 1 for name in ("x1", "x2", "y1", "y2"))


# unique ---------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_unique_a_waiting_twin_is_the_same_result_and_runs_once():
    first = t.report.enqueue("sales")  # @task(unique=True)
    assert t.report.enqueue("sales").id == first.id  # its waiting twin
    other = t.report.enqueue("costs")
    not_unique = t.report.using(unique=False).enqueue("sales")  # per call: not unique
    per_call = t.plain.using(unique=True).enqueue("unique", "made unique per call")
    assert t.plain.using(unique=True).enqueue("unique", "made unique per call").id == per_call.id
    by_key = t.plain.using(key="stock", unique="key").enqueue("unique", "stock a")
    assert t.plain.using(key="stock", unique="key").enqueue("unique", "stock b").id == by_key.id
    assert len({first.id, other.id, not_unique.id, per_call.id, by_key.id}) == 5

    burst("--only", "default")

    for result in (first, other, not_unique, per_call, by_key):
        assert get(result).status == SUCCESSFUL
    assert get(by_key).return_value == "stock a"
    counts = {name: calls("unique", name) for name in ("sales", "costs", "made unique per call", "stock a")}
    assert counts == {"sales": 2, "costs": 1, "made unique per call": 1, "stock a": 1}
    assert calls("unique", "stock b") == 0
    # A finished twin is no twin: the next enqueue is a new task.
    assert t.report.enqueue("sales").id not in (first.id, not_unique.id)
    assert t.plain.using(unique=True).enqueue("unique", "made unique per call").id != per_call.id


# Django's own: priority, run_after, queue_name ------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_one_worker_starts_tasks_in_priority_order():
    low = t.ranked.using(priority=-10).enqueue("low")  # @task(priority=20), lowered per call
    zero = t.plain.enqueue("order", "zero")
    decorator = t.ranked.enqueue("decorator")
    high = t.plain.using(priority=50).enqueue("order", "high")
    zero_again = t.plain.enqueue("order", "zero again")

    burst("--only", "default")

    done = [get(result) for result in (high, decorator, zero, zero_again, low)]
    assert all(result.status == SUCCESSFUL for result in done)
    starts = [result.started_at for result in done]
    assert starts == sorted(starts) and len(set(starts)) == 5, starts
    # The calls, in the order their rows were written, agree.
    assert list(WorkLog.objects.filter(kind="order").order_by("id").values_list("key", flat=True)) == [
        "high",
        "decorator",
        "zero",
        "zero again",
        "low",
    ]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_starts_a_task_not_before_its_run_after():
    worker = start_workers("--only", "default", **worker_env())
    try:
        # The worker is up (a loaded machine may take seconds to start one): only then does
        # the "not before" start to count, so that "now" is due well before "later".
        all_finished([t.plain.enqueue("run_after", "warm-up")], timeout=60, output=lambda: stop(worker))
        run_after = db_now() + dt.timedelta(seconds=3)
        later = t.plain.using(run_after=run_after).enqueue("run_after", "later")
        now = t.plain.enqueue("run_after", "now")
        later_done, now_done = all_finished([later, now], timeout=60, output=lambda: stop(worker))
    finally:
        output = stop(worker)
    assert later_done.status == now_done.status == SUCCESSFUL, output
    assert later_done.task.run_after == run_after
    assert later_done.started_at >= run_after  # the database's clock, both
    assert now_done.started_at < later_done.started_at


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_only_a_worker_of_the_task_s_queue_runs_it():
    decorator = t.in_slow.enqueue("decorator's slow")  # @task(queue_name="slow")
    per_call = t.plain.using(queue_name="slow").enqueue("queue", "per call slow")
    back = t.in_slow.using(queue_name="default").enqueue("back to default")
    plain = t.plain.enqueue("queue", "plain default")

    burst("--only", "default")

    assert get(back).status == get(plain).status == SUCCESSFUL
    assert get(decorator).status == get(per_call).status == READY
    assert calls("queue", "decorator's slow") == calls("queue", "per call slow") == 0

    burst("--only", "slow")

    assert get(decorator).status == get(per_call).status == SUCCESSFUL
    assert [calls("queue", name) for name in ("decorator's slow", "per call slow", "back to default")] == [
        1,
        1,
        1,
    ]


# enqueue_on_commit ----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_enqueue_on_commit_runs_after_the_commit_and_never_after_a_rollback():
    with transaction.atomic():
        gone = [
            t.after_commit.enqueue("rolled back"),  # @task(enqueue_on_commit=True)
            t.plain.using(enqueue_on_commit=True).enqueue("commit", "rolled back per call"),
        ]
        transaction.set_rollback(True)
    with transaction.atomic():
        kept = [
            t.after_commit.enqueue("committed"),
            t.plain.using(enqueue_on_commit=True).enqueue("commit", "committed per call"),
        ]
        eager = t.after_commit.using(enqueue_on_commit=False).enqueue("eager")
        assert [result.enqueued_at for result in kept] == [None, None]  # not before the commit
        assert eager.enqueued_at is not None  # at once, in the caller's transaction
        assert get(eager).status == READY
        for result in kept:
            with pytest.raises(TaskResultDoesNotExist):
                get(result)
    for result in gone:
        with pytest.raises(TaskResultDoesNotExist):
            get(result)

    burst("--only", "default")

    assert [get(result).status for result in (*kept, eager)] == [SUCCESSFUL] * 3
    assert [calls("commit", name) for name in ("committed", "committed per call", "eager")] == [1, 1, 1]
    assert calls("commit", "rolled back") == calls("commit", "rolled back per call") == 0
    # Enqueued at the commit: from then on the result says when.
    assert [get(result).enqueued_at is not None for result in kept] == [True, True]
