"""Argument checks shared by every facade.

Each check runs before anything touches the database and raises ``TypeError`` (wrong type) or
``ValueError`` (bad value) with a message that names the argument as spelled in the signature.
"""

from __future__ import annotations

import dataclasses
import datetime
import inspect
import json
import math
import re
import uuid
from collections.abc import Iterable, Iterator
from typing import Any, Literal, overload

from django.conf import settings
from django.db.models import QuerySet

# Longer than any lease anyone needs, short enough that now + seconds stays a valid datetime
# on every database (about 31 years).
MAX_SECONDS = 1_000_000_000


@overload
def check_seconds(
    value: Any,
    name: str,
    *,
    allow_none: Literal[False] = False,
    positive: bool = False,
    non_negative: bool = False,
) -> float: ...


@overload
def check_seconds(
    value: Any,
    name: str,
    *,
    allow_none: bool,
    positive: bool = False,
    non_negative: bool = False,
) -> float | None: ...


def check_seconds(
    value: Any,
    name: str,
    *,
    allow_none: bool = False,
    positive: bool = False,
    non_negative: bool = False,
) -> float | None:
    """Return ``value`` as float seconds; ``int``/``float`` only, finite, within bounds."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be an int or float number of seconds, not {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{name} must be finite, not {value!r}")
    if positive and not value > 0:
        raise ValueError(f"{name} must be > 0, not {value!r}")
    if non_negative and value < 0:
        raise ValueError(f"{name} must be >= 0, not {value!r}")
    if abs(value) > MAX_SECONDS:
        raise ValueError(f"{name} must be at most {MAX_SECONDS} seconds in size, not {value!r}")
    return float(value)


def check_timeout(value: Any, name: str = "timeout") -> float | None:
    """Return a wait's ``timeout`` as float seconds, one rule for every wait (SPEC §6): ``None``
    waits forever; a negative finite timeout is 0; one longer than ``MAX_SECONDS`` waits that
    long (a wait, unlike a deadline that is stored, has no column to overflow); NaN and
    ±infinity are ``ValueError``, anything but an int or float ``TypeError``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"{name} must be an int or float number of seconds or None, not {type(value).__name__}"
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{name} must be finite (None waits forever), not {value!r}")
    return min(max(0.0, float(value)), float(MAX_SECONDS))


#: The names of tubes, boards, handlers and Django Tasks queues.
NAME_RE = re.compile(r"[A-Za-z0-9_.\-]{1,100}\Z", re.ASCII)


def check_name(value: Any, name: str = "name") -> str:
    """Return ``value`` if it is a valid tube, board or handler name; else raise, naming ``name``.

    One wording for every kind of name, so that a tube and a board refuse the same mistake
    with the same sentence.
    """
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, not {type(value).__name__}")
    if not NAME_RE.match(value):
        raise ValueError(f"{name} must be 1-100 ASCII letters, digits, '_', '-' or '.', not {value!r}")
    return value


def check_count(value: Any, name: str, *, minimum: int = 0, maximum: int | None = None) -> int:
    """Return ``value`` if it is an ``int`` (``bool`` rejected) >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, not {value!r}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, not {value!r}")
    return value


def check_key_limit(value: Any, tube_type: str, name: str = "key_limit") -> int | None:
    """Return a key limit for a tube of ``tube_type``: ``None`` (also for 1: one task of a key
    at a time, the utube's own rule) or an ``int`` above 1. Only utube and utubettl tubes have
    keys."""
    if value is None:
        return None
    value = check_count(value, name, minimum=1)
    if not str(tube_type).startswith("utube"):
        raise ValueError(f"{name} is for utube and utubettl tubes (their tasks have keys), not {tube_type}")
    return None if value == 1 else value


def check_key_rate(value: Any, tube_type: str, name: str = "key_rate") -> Rate | None:
    """Return a key rate for a tube of ``tube_type`` (see :func:`check_rate`), or ``None``.
    Only utube and utubettl tubes have keys."""
    rate = check_rate(value, name)
    if rate is not None and not str(tube_type).startswith("utube"):
        raise ValueError(f"{name} is for utube and utubettl tubes (their tasks have keys), not {tube_type}")
    return rate


_RATE_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_RATE_RE = re.compile(
    r"^\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)?\s*"
    r"(s|sec|secs|second|seconds|m|min|mins|minute|minutes|h|hr|hour|hours|d|day|days)\s*$"
)


@dataclasses.dataclass(frozen=True)
class Rate:
    """At most ``count`` starts in any ``period`` seconds: ``Rate(100, 60)``, written ``100/m``.
    It unpacks as ``count, period = rate``."""

    #: How many may start in one period.
    count: int
    #: The period, in seconds.
    period: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "count", int(self.count))
        object.__setattr__(self, "period", float(self.period))

    def __iter__(self) -> Iterator[Any]:
        return iter((self.count, self.period))

    def __str__(self) -> str:
        count, period = self
        for unit, seconds in (("d", 86400.0), ("h", 3600.0), ("m", 60.0), ("s", 1.0)):
            times = period / seconds
            if times >= 1 and times == int(times):
                return f"{count}/{unit}" if times == 1 else f"{count}/{int(times)}{unit}"
        return f"{count}/{period:g}s"

    def __repr__(self) -> str:
        return f"Rate({self.count!r}, {self.period!r})"


def check_rate(value: Any, name: str = "rate") -> Rate | None:
    """Return ``value`` as a :class:`Rate`, or ``None`` for ``None``: a text such as
    ``"100/m"``, ``"60/s"``, ``"10/5s"``, ``"1000/h"`` or ``"5/d"`` (a count, a slash, an
    optional number and a unit: s, m, h or d, or their words), or a ``(count, seconds)`` pair.
    The count must be at least 1, the period at least a millisecond."""
    if value is None or isinstance(value, Rate):
        return value
    if isinstance(value, str):
        match = _RATE_RE.match(value.lower())
        if not match:
            raise ValueError(
                f"{name} must be a count per period such as '100/m', '60/s' or '10/5s' "
                f"(units s, m, h, d), not {value!r}"
            )
        count, times, unit = match.groups()
        period = float(times or 1) * _RATE_UNITS[unit[0]]
        count = int(count)
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        count = check_count(value[0], f"{name}'s count")
        period = check_seconds(value[1], f"{name}'s period")
    else:
        raise TypeError(
            f"{name} must be a str such as '100/m', a (count, seconds) pair or None, not {value!r}"
        )
    if count < 1:
        raise ValueError(f"{name} must let at least 1 start per period, not {value!r}")
    if not (period >= 0.001 and math.isfinite(period)):
        raise ValueError(f"{name}'s period must be at least 0.001 seconds, not {value!r}")
    return Rate(count, period)


def check_owner(value: Any, name: str, *, max_length: int = 255) -> str:
    """Return ``value`` if it is a non-empty ``str`` that fits the owner column."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, not {type(value).__name__}")
    if not value:
        raise ValueError(f"{name} must not be empty")
    check_text(value, name)
    if len(value) > max_length:
        raise ValueError(f"{name} must be at most {max_length} characters, not {len(value)}")
    return value


def check_text(value: str, name: str) -> str:
    """Return ``value`` if every database can store it: no NUL, no lone surrogate."""
    # PostgreSQL refuses NUL in text and no database stores a lone surrogate: say so here,
    # by name, rather than fail inside the database (found by fuzzing, issue 9).
    if "\x00" in value:
        raise ValueError(f"{name} must not contain NUL characters")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{name} must be valid Unicode text (it holds a lone surrogate)") from None
    return value


def check_json(value: Any, name: str) -> Any:
    """Return ``value`` if it is a JSON value every database stores: finite numbers, clean text."""
    try:
        json.dumps(value, allow_nan=False)
    except ValueError as error:  # NaN or an infinity (PostgreSQL and MySQL's JSON refuse them)
        raise ValueError(f"{name} must be a JSON value: {error}") from None
    except (TypeError, RecursionError) as error:
        raise TypeError(f"{name} must be a JSON value: {error}") from None
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            check_text(item, name)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return value


def check_aware(value: Any, name: str) -> datetime.datetime:
    """Return ``value`` if it is a timezone-aware ``datetime``."""
    if not isinstance(value, datetime.datetime):
        raise TypeError(f"{name} must be a datetime, not {type(value).__name__}")
    if value.utcoffset() is None:
        raise ValueError(f"{name} must be an aware datetime (with a time zone)")
    return value


def check_bool(value: Any, name: str) -> bool:
    """Return ``value`` if it is a ``bool``."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, not {type(value).__name__}")
    return value


_SCALARS = (str, bytes, int, float, uuid.UUID)


def as_id_list(id_or_ids: Any, name: str = "id_or_ids") -> list[Any]:
    """Return one id or an iterable of ids as a list without duplicates, first occurrence first.

    A ``str`` is one id, never an iterable of characters. A queryset is evaluated as its
    primary keys (or its single ``values_list`` column).
    """
    if id_or_ids is None:
        raise TypeError(f"{name} must be an id or an iterable of ids, not None")
    if isinstance(id_or_ids, _SCALARS) or not isinstance(id_or_ids, Iterable):
        values: Iterable[Any] = [id_or_ids]
    elif isinstance(id_or_ids, QuerySet) and id_or_ids._iterable_class.__name__ == "ModelIterable":
        values = id_or_ids.values_list("pk", flat=True)
    else:
        values = id_or_ids
    seen: dict[Any, None] = {}
    for value in values:
        if value is None:
            raise TypeError(f"{name} must not contain None")
        if hasattr(value, "_meta") and hasattr(value, "pk"):  # a model instance: use its pk
            value = value.pk
        seen.setdefault(value, None)
    return list(seen)


def check_handler(func: Any, what: str = "handler") -> None:
    """Refuse, at registration, a function that a worker could not run to completion.

    ``async def`` functions are run (on the worker's event loop); generator functions, sync
    or async, would return an iterator without running their body, and the item would be
    settled unrun: they are refused here with a clear error.
    """
    if not callable(func):
        raise TypeError(f"a {what} must be callable, not {type(func).__name__}")
    target = inspect.unwrap(func)
    if inspect.isasyncgenfunction(target) or inspect.isgeneratorfunction(target):
        kind = "an async generator" if inspect.isasyncgenfunction(target) else "a generator"
        name = getattr(target, "__qualname__", repr(target))
        raise TypeError(
            f"{name} is {kind} function: a worker cannot run it to completion "
            "(use a plain def or async def function that returns when its work is done)"
        )


def check_aliases(value: Any, name: str) -> list[str]:
    """Check a list of ``DATABASES`` aliases (a queue's shards): non-empty, each known, none
    twice; return it as a list. ``TypeError``/``ValueError`` name the setting."""
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(a, str) for a in value):
        raise TypeError(f"{name} must be a non-empty list of DATABASES aliases, not {value!r}")
    unknown = [alias for alias in value if alias not in settings.DATABASES]
    if unknown:
        raise ValueError(f"{name} names {unknown[0]!r}, which is not in DATABASES")
    if len(set(value)) != len(value):
        raise ValueError(f"{name} names a database twice: {list(value)!r}")
    return list(value)
