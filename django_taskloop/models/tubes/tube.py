"""The tube: :class:`Tube`, both of its sides on its core, and :class:`TubeManager` (create
tubes, and look at all of them)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.db import IntegrityError, models

from ... import engine
from ...exceptions import NotFound, TubeError
from ...validation import (
    Rate,
    check_bool,
    check_count,
    check_key_limit,
    check_key_rate,
    check_name,
    check_rate,
)
from .claiming import TubeClaiming
from .definitions import SLOTS, TUBE_TYPES, check_lifetime, check_pri
from .operating import TubeOperating
from .records import Consumer, Task, TubeStat

logger = logging.getLogger("django_taskloop.tubes")


class TubeManager(models.Manager["Tube"]):
    """Create tubes and look at all of them: ``create_tube``, ``statistics``, ``reap``."""

    def create_tube(
        self,
        name: str,
        type: str,
        if_not_exists: bool = False,
        ttl: float | None = None,
        ttr: float | None = None,
        pri: int | None = None,
        on_task_change: Callable[[Task, str], Any] | None = None,
        limit: int | None = None,
        rate: Any = None,
        key_limit: int | None = None,
        key_rate: Any = None,
    ) -> Tube:
        """Create the tube ``name`` of driver ``type`` and return it.

        An existing name raises :class:`TubeError`, unless ``if_not_exists`` is true and the
        existing tube has the same type (then it is returned). ``ttl``, ``ttr`` and ``pri``
        are the defaults of the tube's tasks (ignored by fifo and utube, but type-checked).
        ``limit``: the new tube's running limit (see :meth:`Tube.set_limit`), ``rate`` its
        rate (``"100/m"``: see :meth:`Tube.set_rate`), ``key_limit`` (utube and utubettl) how
        many tasks of one key may be taken at once (see :meth:`Tube.set_key_limit`) and
        ``key_rate`` in any period (``"10/m"``: see :meth:`Tube.set_key_rate`); an existing
        tube keeps its own.
        """
        name = check_name(name)
        if not isinstance(type, str):
            raise TypeError(f"type must be a str, not {builtins_type(type).__name__}")
        if type not in TUBE_TYPES:
            raise ValueError(f"type must be one of {', '.join(TUBE_TYPES)}, not {type!r}")
        if_not_exists = check_bool(if_not_exists, "if_not_exists")
        ttl = check_lifetime(ttl, "ttl")
        ttr = check_lifetime(ttr, "ttr")
        pri = check_pri(pri)
        if limit is not None:
            limit = check_count(limit, "limit", minimum=1)
        checked_rate = check_rate(rate, "rate")
        key_limit = check_key_limit(key_limit, type)
        checked_key_rate = check_key_rate(key_rate, type)
        if on_task_change is not None and not callable(on_task_change):
            raise TypeError("on_task_change must be callable or None")
        tube = self._existing_or_made(
            name, type, if_not_exists, ttl, ttr, pri, limit, checked_rate, key_limit, checked_key_rate
        )
        if on_task_change is not None:
            tube.on_task_change(on_task_change)
        return tube

    def _existing_or_made(
        self,
        name: str,
        type: str,
        if_not_exists: bool,
        ttl: float | None,
        ttr: float | None,
        pri: int | None,
        limit: int | None = None,
        rate: Rate | None = None,
        key_limit: int | None = None,
        key_rate: Rate | None = None,
    ) -> Tube:
        """The tube ``name`` made now with its counter slots, or (``if_not_exists``) as it
        exists already."""
        using = self.db

        def make() -> Tube:
            count, period = (None, None) if rate is None else rate
            key_count, key_period = (None, None) if key_rate is None else key_rate
            tube = self.model(
                name=name,
                type=type,
                ttl=ttl,
                ttr=ttr,
                pri=pri,
                running_limit=limit,
                rate_count=count,
                rate_period=period,
                key_limit=key_limit,
                key_rate_count=key_count,
                key_rate_period=key_period,
            )
            tube.save(using=using, force_insert=True)
            TubeStat.objects.using(using).bulk_create([TubeStat(tube=tube, slot=s) for s in range(SLOTS)])
            return tube

        existing = self.filter(name=name).first()
        if existing is None:
            try:
                return engine.run_in_transaction(self.model, using, make)
            except IntegrityError:
                # A rival created it between our look and our insert.
                existing = self.filter(name=name).first()
                if existing is None:
                    raise
        if not if_not_exists:
            raise TubeError(f"tube {name!r} already exists")
        if existing.type != type:
            raise TubeError(f"tube {name!r} exists with type {existing.type!r}, not {type!r}")
        self._warn_if_options_differ(existing, {"ttl": ttl, "ttr": ttr, "pri": pri})
        return existing

    @staticmethod
    def _warn_if_options_differ(existing: Tube, asked: dict[str, Any]) -> None:
        """The stored tube wins (its tasks were put under its options), but silently handing
        back other options than the code asked for hides a real mistake, e.g. a worker's
        @tube("emails") having created it first with the defaults."""
        differ = {
            key: value
            for key, value in asked.items()
            if value is not None and value != getattr(existing, key)
        }
        if differ:
            logger.warning(
                "tube %r already exists with %s; create_tube(if_not_exists=True) asked for %s: "
                "the stored options stay (drop and re-create the tube, or change the code to match)",
                existing.name,
                ", ".join(f"{key}={getattr(existing, key)!r}" for key in differ),
                ", ".join(f"{key}={value!r}" for key, value in differ.items()),
            )

    def statistics(self) -> dict[str, dict[str, dict[str, int]]]:
        """Return ``{tube name: tube.statistics()}`` for every tube."""
        return {tube.name: tube.statistics() for tube in self.order_by("name")}

    def reap(self) -> dict[str, int]:
        """Apply every due transition of every tube; return the counts per kind.

        Kinds: ``delay`` (delayed → ready), ``ttr`` (taken → ready), ``ttl`` (removed),
        ``release`` (a dead consumer's task → ready), ``consumers`` (dead consumers forgotten).
        """
        totals = {"delay": 0, "ttr": 0, "ttl": 0, "release": 0, "consumers": 0}
        for tube in self.all():
            try:
                done = tube.tidy(stale=True)
            except NotFound:
                continue
            for kind, n in done.items():
                totals[kind] += n
        totals["consumers"] = Consumer.objects.using(self.db).forget_dead()
        return totals


builtins_type = type


class Tube(TubeClaiming, TubeOperating):
    """A named queue of tasks with a driver: ``fifo``, ``fifottl``, ``utube`` or ``utubettl``.

    Its consumer side (take, ack, release, touch, bury: :class:`~.claiming.TubeClaiming`) and
    its producer and operator side (put, kick, pause, delete, drop, statistics, peek:
    :class:`~.operating.TubeOperating`) stand on one core (:class:`~.core.TubeCore`: the row,
    the helpers both use, the time-driven transitions).
    """

    objects = TubeManager()

    class Meta:
        app_label = "django_taskloop"
        db_table = "taskloop_tube"
        ordering = ["name"]
