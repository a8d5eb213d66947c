"""A tube's running limit (``Tube.set_limit``, ``@tube(limit=…)``): at most N of its tasks
taken at once, by every consumer on every host together.

The database holds it. A take of a limited tube runs in one transaction that locks the tube's
row first, so the takes of one limited tube count and claim one after another; it counts the
tasks taken and still held and claims at most what the limit leaves. Unlimited tubes take as
before, with no lock and no count.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db.models import Q, QuerySet

from ... import engine
from .definitions import TAKEN

if TYPE_CHECKING:
    from .core import TubeCore


def claim_within(tube: TubeCore, spec: engine.ClaimSpec) -> engine.Claimed:
    """``spec``'s claim (``later``: see ``engine.claim``), cut to what ``tube``'s running limit
    leaves (:func:`room`); in the take's transaction."""
    left = room(tube, spec.limit)
    if not left:
        return engine.Claimed([])  # (as engine.claim's empty claim)
    claimed: engine.Claimed = (spec if left == spec.limit else spec.limited_to(left)).run(later=True)
    return claimed


def room(tube: TubeCore, wanted: int) -> int:
    """How many of ``wanted`` tasks a take of ``tube`` may claim now, inside the take's
    transaction: the tube's row is locked (``engine.lock_rows``: on PostgreSQL its key stays
    shared, so puts into the tube go on) and its limit read afresh, then the tasks taken and
    still held are counted. A task whose ttr ran out counts no more (its slot is free at once,
    before a transition makes it ready again); a consumer found dead frees its slots when its
    tasks are put back."""
    using, pk = tube.using, tube.pk
    found = engine.lock_rows(
        lambda: type(tube)._default_manager.using(using).filter(pk=pk),
        ["running_limit"],
        using,
        key=("tube limit", pk),
    )
    if not found:
        raise tube._gone()
    ((limit,),) = found
    tube.running_limit = limit
    if limit is None:
        return wanted
    held = engine.count_rows(lambda: _taken(tube), using, ("tube taken", pk, tube.type))
    return max(0, min(wanted, int(limit) - held))


def _taken(tube: TubeCore) -> QuerySet[Any]:
    """``tube``'s tasks taken and still held (a ttr that ran out frees its slot)."""
    taken = tube._tasks().filter(state=TAKEN)
    if tube._has_ttl:
        taken = taken.filter(Q(event_at__isnull=True) | Q(event_at__gt=engine.DbNow()))
    return taken


def freed(tube: TubeCore, count: int) -> int:
    """``count`` of ``tube``'s taken tasks were finished in the current transaction: if the
    tube is limited, tell the consumers waiting for a slot (``NOTIFY`` at the commit on
    PostgreSQL, this process's waiters at the commit; SQLite's wake on any commit). Return
    ``count``."""
    if count and tube.running_limit is not None:
        tube._wake()
    return count
