"""A tube's running limit (``Tube.set_limit``, ``@tube(limit=…)``): at most N of its tasks
taken at once; and its rate (``Tube.set_rate``, ``@tube(rate="100/m")``): at most R of them
taken in any period. Both by every consumer on every host together.

The database holds them. A take of a limited tube runs in one transaction that locks the
tube's row first, so the takes of one limited tube count and claim one after another. For the
running limit it counts the tasks taken and still held; for the rate it sums the tube's start
log (:class:`TubeStart`: a row per claim, with how many it took) over the last period, and
writes its own row. It claims at most what both leave. Unlimited tubes take as before, with no
lock and no count.

A rate counts a task as started when it is claimed; a worker starts a rate-limited task as soon
as it claims it (it claims no more than its free slots), and the window a take counts over is
the period plus ``RATE_MARGIN`` seconds, which absorb the delay between the two. A task that
could not start within the margin (a commit that hung: MariaDB lets the next take see a commit
before it answers the client) is given back, not started late. A take the
rate refuses tells this process's waiters when the window's oldest start runs out
(:func:`django_taskloop.wakeup.wake_at`), so that they try again then, not at their next poll.

A utube's key limit and key rate (``Tube.set_key_limit``, ``Tube.set_key_rate``) are per key:
they are rules of the claim's own statement (``claiming._sub_queue_heads``: fewer than N of the
key taken or ready before a task; one of a key a claim while the key's log rows in the window
are fewer than R), which the same lock serializes. A key rate's log is the tube's own rows that
have a key, a row a task; a tube rate's is the rows without one.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.db.models import Min, Q, QuerySet, Sum

from ... import engine, wakeup
from ...conf import setting
from ..operating import TASKS_TUBE_PREFIXES
from .definitions import TAKEN
from .records import Task, TubeStart

if TYPE_CHECKING:
    from .core import TubeCore


#: When this process last removed each tube's log rows that left its window, by (database,
#: tube id) and, for a key rate's rows, (database, tube id, "keys"): ``engine.local_clock()``
#: seconds (a test clock moves it).
_pruned: dict[tuple[Any, ...], float] = {}


def claim_within(
    tube: TubeCore, spec: engine.ClaimSpec, respec: Callable[[], engine.ClaimSpec] | None = None
) -> engine.Claimed:
    """``spec``'s claim (``later``: see ``engine.claim``), cut to what ``tube``'s running limit
    and rate leave (:func:`room`); in the take's transaction. A rate's claim is logged, and
    ``tube.claim_sent_at`` says when this take had the tube's lock (before the log's row was
    written: the time the log says is later). A key limit and a key rate are part of the
    claim's statement: one that the lock's read finds changed has ``respec()`` build the claim
    again. A key rate's claim is logged by key, a row a task, in the tube's own log."""
    by_key = (tube.key_limit, tube.key_rate_count, tube.key_rate_period)
    left, home = room(tube, spec.limit)
    if not left:
        return engine.Claimed([])  # (as engine.claim's empty claim)
    if (tube.key_limit, tube.key_rate_count, tube.key_rate_period) != by_key and respec is not None:
        spec = respec()
    claimed: engine.Claimed = (spec if left == spec.limit else spec.limited_to(left)).run(later=True)
    if tube.rate_count is not None and len(claimed):
        TubeStart.objects.using(tube.using).create(tube_id=home, at=engine.DbNow(), n=len(claimed))
    if tube.key_rate_count is not None and tube.key_rate_period is not None and len(claimed):
        _log_keys(tube, claimed, window(float(tube.key_rate_period)))
    return claimed


def _log_keys(tube: TubeCore, claimed: engine.Claimed, seconds: float) -> None:
    """Log ``claimed``'s tasks that have a key, a row each, in ``tube``'s key rate log (its
    own rows with a key); remove the rows older than the window ``seconds`` (once a window per
    process)."""
    using = tube.using
    keys = [task.utube for task in claimed.instances() if task.utube is not None]
    if keys:
        TubeStart.objects.using(using).bulk_create(
            [TubeStart(tube_id=tube.pk, key=key, at=engine.DbNow(), n=1) for key in keys]
        )
    pruned, now = (using, tube.pk, "keys"), engine.local_clock()
    if now - _pruned.get(pruned, -math.inf) >= seconds:
        old = TubeStart.objects.using(using).filter(tube_id=tube.pk, key__isnull=False)
        engine.delete_rows(old.filter(at__lte=engine.DbNow(-seconds)))
        _pruned[pruned] = now


def room(tube: TubeCore, wanted: int) -> tuple[int, int]:
    """How many of ``wanted`` tasks a take of ``tube`` may claim now, inside the take's
    transaction, and the tube whose row holds the count (:func:`group`: a Django Tasks queue's
    keyed tube counts with its plain one). That row is locked (``engine.lock_rows``: on
    PostgreSQL its key stays shared, so puts go on) and the limit and rate read afresh from
    it. Then the tasks taken and still held are counted (a task whose ttr ran out counts no
    more: its slot is free at once, before a transition makes it ready again; a consumer found
    dead frees its slots when its tasks are put back), and the rate's starts in its window
    summed (:func:`_rate_room`)."""
    using = tube.using
    home, counted = group(tube)
    found = {pk: rest for pk, *rest in _lock(tube, home)}
    if tube.pk not in found:
        raise tube._gone()
    if home not in found:  # its partner was dropped meanwhile: it counts alone
        home, counted = tube.pk, (tube.pk,)
    tube.claim_sent_at = time.monotonic()  # (the lock's wait is not the claim's)
    tube.limit_group = counted
    limit, count, period = found[home][:3]
    tube.running_limit, tube.rate_count, tube.rate_period = limit, count, period
    # Its own: a key limit and a key rate are a tube's, not a queue's.
    tube.key_limit, tube.key_rate_count, tube.key_rate_period = found[tube.pk][3:]
    left = wanted
    if limit is not None:
        held = engine.count_rows(lambda: _taken(tube, counted), using, ("tube taken", counted, tube.type))
        left = max(0, min(left, int(limit) - held))
    if count is not None and period is not None and left:
        left = min(left, _rate_room(tube, home, int(count), float(period)))
    return left, home


def _lock(tube: TubeCore, home: int) -> list[tuple[Any, ...]]:
    """Lock the rows of ``tube`` and of ``home`` (its own or its partner's: :func:`group`) and
    read their ids, limits, rates and key limits."""
    pks = sorted({tube.pk, home})
    return engine.lock_rows(
        lambda: type(tube)._default_manager.using(tube.using).filter(pk__in=pks),
        [
            "pk",
            "running_limit",
            "rate_count",
            "rate_period",
            "key_limit",
            "key_rate_count",
            "key_rate_period",
        ],
        tube.using,
        key=("tube limit", *pks),
    )


def group(tube: TubeCore) -> tuple[int, tuple[int, ...]]:
    """``(home, counted)``: the tube whose row holds ``tube``'s count (and its rate's log), and
    the tubes whose taken tasks it counts. A Django Tasks queue is two tubes, ``tasks.<q>``
    and ``tasks-keyed.<q>``: they share one count, at home in the plain one (a limit of 5 is 5
    for the queue, keyed or not); the pair is read by name each time (one indexed read, for such
    queues alone: a tube dropped and made again has a new id). Any other tube is its own."""
    plain, keyed = TASKS_TUBE_PREFIXES
    name = str(tube.name)
    if name.startswith(keyed):
        queue = name[len(keyed) :]
    elif name.startswith(plain):
        queue = name[len(plain) :]
    else:
        return tube.pk, (tube.pk,)
    rows = type(tube)._default_manager.using(tube.using).filter(name__in=[plain + queue, keyed + queue])
    pair = dict(rows.values_list("name", "pk"))
    home = pair.get(plain + queue, tube.pk)
    return home, tuple(sorted({tube.pk, *pair.values()}))


def window(period: float) -> float:
    """The seconds a rate of ``period`` counts starts over: the period and ``RATE_MARGIN``."""
    return float(period) + float(setting("RATE_MARGIN"))


def _rate_room(tube: TubeCore, home: int, count: int, period: float) -> int:
    """What ``tube``'s rate of ``count`` per ``period`` leaves now (under the lock of ``home``,
    whose log it is): the log's rows that left the window are removed (by each process at most
    once a window), those in it summed. None left: this process's waiters on the tube are told
    when the oldest runs out."""
    using, seconds = tube.using, window(period)
    key, now = (using, home), engine.local_clock()
    if now - _pruned.get(key, -math.inf) >= seconds:
        # At most once a window per process: the sum below reads the window alone anyway.
        old = TubeStart.objects.using(using).filter(tube_id=home, key__isnull=True)
        engine.delete_rows(old.filter(at__lte=engine.DbNow(-seconds)))
        _pruned[key] = now
    found = _in_window(using, home, seconds).aggregate(used=Sum("n"), first=Min("at"))
    left = count - int(found["used"] or 0)
    if left <= 0 and found["first"] is not None:
        age = (engine.db_now(using) - engine.to_datetime(found["first"])).total_seconds()
        wakeup.wake_at(using, tube.pk, max(0.0, seconds - age))
    return max(0, left)


def started(tube: TubeCore) -> int | None:
    """How many of ``tube``'s tasks were taken in its rate's window up to now (``None``: the
    tube has no rate): what status, the dashboard and the metrics show beside the rate."""
    rate = tube.rate
    if rate is None:
        return None
    home, _counted = group(tube)
    return int(_in_window(tube.using, home, window(rate.period)).aggregate(used=Sum("n"))["used"] or 0)


def _in_window(using: str, home: int, seconds: float) -> QuerySet[Any]:
    """Tube ``home``'s start log over the last ``seconds`` (a rate's window; the rows of a key
    rate, which have a key, are not its)."""
    return TubeStart.objects.using(using).filter(
        tube_id=home, key__isnull=True, at__gt=engine.DbNow(-seconds)
    )


def _taken(tube: TubeCore, counted: tuple[int, ...]) -> QuerySet[Any]:
    """The tasks of ``counted`` (``tube`` and its partner, see :func:`group`) taken and still
    held (a ttr that ran out frees its slot)."""
    tasks = (
        tube._tasks() if counted == (tube.pk,) else Task.objects.using(tube.using).filter(tube_id__in=counted)
    )
    taken = tasks.filter(state=TAKEN)
    if tube._has_ttl:
        taken = taken.filter(Q(event_at__isnull=True) | Q(event_at__gt=engine.DbNow()))
    return taken


def freed(tube: TubeCore, count: int) -> int:
    """``count`` of ``tube``'s taken tasks were finished in the current transaction: if the
    tube is limited, tell the consumers waiting for a slot (``NOTIFY`` at the commit on
    PostgreSQL, this process's waiters at the commit; SQLite's wake on any commit). Return
    ``count``. A tube with a key limit: its takers are told as well (a slot of a key is
    free)."""
    if count and (tube.running_limit is not None or tube.key_limit is not None):
        tube._wake()
        # The pair this object's last take counted (one read by name if it took none yet).
        counted = tube.limit_group if tube.limit_group is not None else group(tube)[1]
        for other in counted:
            if other != tube.pk:  # (a Django Tasks queue: its other tube's takers wait too)
                wakeup.send_notify(tube.using, other)
                transaction.on_commit(functools.partial(wakeup.notify, tube.using, other), using=tube.using)
    return count
