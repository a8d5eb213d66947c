"""Cron: parsing, time zones and the ``@periodic`` registry; pure (no database, no models).

Cron expressions are read by `cronsim <https://pypi.org/project/cronsim/>`_ (Debian cron's
rules; five fields, or six with a leading seconds field) in ``TASKLOOP["TIME_ZONE"]`` (default
UTC). :mod:`django_taskloop.schedules` writes the schedules' rows and claims their ticks.
"""

from __future__ import annotations

import datetime as dt
import zoneinfo
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cronsim import CronSim, CronSimError

from .conf import setting
from .validation import check_handler, check_name

__all__ = [
    "ScheduleError",
    "Cron",
    "ScheduleSpec",
    "periodic",
    "periodic_registry",
    "parse_cron",
    "time_zone",
]


class ScheduleError(ValueError):
    """A schedule that cannot run: bad cron expression, missing task, bad arguments."""


@dataclass(frozen=True)
class Cron:
    """A parsed cron expression: five fields (minute hour day month weekday), or six with a
    leading seconds field (``*/10 * * * * *``: every ten seconds)."""

    expression: str

    def next_after(self, now: dt.datetime, time_zone: str = "UTC") -> dt.datetime:
        """Return the first tick strictly after ``now`` (aware), as an aware UTC datetime."""
        zone = zoneinfo.ZoneInfo(time_zone)
        # CronSim drops the microseconds and yields ticks strictly after what is left: after
        # 12:05:00.4, "* * * * *" gives 12:06, never 12:05 again.
        tick = next(CronSim(self.expression, now.astimezone(zone)))
        return tick.astimezone(dt.UTC)


def parse_cron(expression: Any) -> Cron:
    """Return ``expression`` parsed; raise :class:`ScheduleError` saying what is wrong."""
    if not isinstance(expression, str):
        raise ScheduleError(f"cron must be a str such as '*/5 * * * *', not {type(expression).__name__}")
    text = " ".join(expression.split())
    try:
        it = CronSim(text, dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
        next(it)
    except CronSimError as error:
        raise ScheduleError(f"bad cron expression {expression!r}: {error}") from None
    except StopIteration:
        raise ScheduleError(f"cron expression {expression!r} never matches") from None
    return Cron(text)


def time_zone() -> str:
    """Return ``TASKLOOP["TIME_ZONE"]`` (default UTC), checked."""
    name = setting("TIME_ZONE") or "UTC"
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, TypeError):
        raise ScheduleError(f'TASKLOOP["TIME_ZONE"] {name!r} is not a known time zone') from None
    return name


@dataclass
class ScheduleSpec:
    """One schedule as the code declares it."""

    name: str
    kind: str  # "periodic" or "task"
    cron: Cron
    target: str
    func: Callable[..., Any] | None = None
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)


#: The ``@periodic`` functions registered so far, by schedule name.
periodic_registry: dict[str, ScheduleSpec] = {}


def periodic(cron: str, name: str | None = None) -> Callable[[Callable[[], Any]], Callable[[], Any]]:
    """Run the decorated function (no arguments) on ``cron``'s schedule, once per tick across
    every worker process and host.

    ``name`` (default: the function's dotted path) names the schedule in the admin. A bad cron
    expression or a name already taken raises :class:`ScheduleError` here, at import.
    """
    parsed = parse_cron(cron)
    if name is not None:
        try:
            check_name(name, "name")
        except (TypeError, ValueError) as error:
            raise ScheduleError(str(error)) from None

    def decorate(func: Callable[[], Any]) -> Callable[[], Any]:
        try:
            check_handler(func, "@periodic function")
        except TypeError as error:
            raise ScheduleError(str(error)) from None
        path = f"{func.__module__}.{func.__qualname__}"
        label = name or path
        if name is None:
            try:
                check_name(label, "name")
            except ValueError as error:
                raise ScheduleError(f"{error}; pass @periodic(..., name=...)") from None
        existing = periodic_registry.get(label)
        if existing is not None and existing.target != path:
            raise ScheduleError(f"a schedule named {label!r} is already registered ({existing.target})")
        periodic_registry[label] = ScheduleSpec(label, "periodic", parsed, path, func=func)
        return func

    return decorate
