"""What the settings reference (docs/settings.md) states of each ``TASKLOOP`` key, read from
``django_taskloop/conf.py`` so that it cannot drift: the key's type, found by trying values on
the key's check (``conf.RULES``), and its default (``conf.DEFAULTS``).

The Sphinx extension ``taskloop_settings`` renders it at build time; tests/test_docs_site.py
checks it without Sphinx. Django's settings must be configured (the check of ``SHARDS`` reads
``DATABASES``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django_taskloop.conf import DEFAULTS, RULES

__all__ = ["DEFAULTS", "KINDS", "PAGE", "Kind", "default_parts", "described_keys", "duration", "kind_of"]

#: The settings reference.
PAGE = Path(__file__).resolve().parent.parent / "settings.md"

#: How docs/settings.md opens the description of one key.
_DESCRIPTION = re.compile(r"^```\{taskloop-setting\}[ \t]+(\S+)[ \t]*$", re.MULTILINE)


@dataclass(frozen=True)
class Kind:
    """A type the reference can state, with values that tell it apart from the others: a key
    is of this kind when its check accepts every value of ``accepts`` and refuses every value
    of ``refuses``."""

    text: str
    accepts: tuple[Any, ...]
    refuses: tuple[Any, ...]
    #: The default is a number of seconds (shown in days, hours or minutes too).
    seconds: bool = False

    def fits(self, rule: Callable[[Any, str], Any]) -> bool:
        """Say whether ``rule`` (one of ``conf.RULES``) accepts and refuses as this kind does."""
        return all(_accepted(rule, value) for value in self.accepts) and not any(
            _accepted(rule, value) for value in self.refuses
        )


def _accepted(rule: Callable[[Any, str], Any], value: Any) -> bool:
    try:
        rule(value, "TASKLOOP[...]")
    except (TypeError, ValueError):
        return False
    return True


_NOT_NUMBERS = (True, "1", None, math.nan, math.inf)

#: Every type the reference states. A key whose check fits none of them (or several) fails the
#: build: add or sharpen a kind here.
KINDS: tuple[Kind, ...] = (
    Kind("seconds (int or float), more than 0", (0.25, 1, 3600), (0, -1, *_NOT_NUMBERS), seconds=True),
    Kind("seconds (int or float), 0 or more", (0, 0.25, 3600), (-0.25, *_NOT_NUMBERS), seconds=True),
    Kind("int, 0 or more", (0, 1, 100), (-1, 2.5, *_NOT_NUMBERS)),
    Kind("int, 1 or more", (1, 100), (0, 2.5, *_NOT_NUMBERS)),
    Kind("int or float, 1 or more", (1, 1.5, 4), (0.5, 0, *_NOT_NUMBERS)),
    Kind("non-empty str, or None", ("s3cret", None), ("", 1, b"s3cret")),
    Kind("IANA time zone name (str), or None for UTC", ("UTC", "Europe/Riga", "", None), (1, b"UTC")),
    Kind(
        "dict: schedule name → entry",
        ({}, {"digest": {"task": "app.tasks.digest", "cron": "0 7 * * *"}}, {"digest": "checked by E010"}),
        ([], None, "digest"),
    ),
    Kind(
        "dict: tube or board name → list of DATABASES aliases",
        ({}, {"emails": ["default"]}),
        ([], None, {"emails": "default"}, {"emails": []}, {"": ["default"]}, {"emails": ["nowhere"]}),
    ),
    Kind(
        "dict: tube name → int, 1 or more, or None",
        ({}, {"charges": 5}, {"charges": None}),
        ([], None, {"charges": 0}, {"charges": True}, {"charges": 1.5}, {"": 5}, {"charges": ["default"]}),
    ),
    Kind(
        "dict: tube name → rate such as 100/m or (count, seconds) (or None: no rate)",
        ({}, {"charges": "100/m"}, {"charges": (60, 1)}, {"charges": None}),
        ([], None, {"charges": 5}, {"charges": "0/m"}, {"charges": "fast"}, {"": "1/s"}, {"charges": (1, 0)}),
    ),
)


def kind_of(key: str) -> Kind:
    """Return the kind of ``TASKLOOP[key]``; ``LookupError`` if no kind, or more than one, fits."""
    rule = RULES[key]
    fitting = [kind for kind in KINDS if kind.fits(rule)]
    if len(fitting) != 1:
        said = " and ".join(repr(kind.text) for kind in fitting) or "none"
        raise LookupError(
            f"TASKLOOP[{key!r}]: its check in django_taskloop/conf.py fits {said} of the types "
            "the settings reference states (docs/_ext/settings_reference.py, KINDS)"
        )
    return fitting[0]


_UNITS = ((86400, "day"), (3600, "hour"), (60, "minute"))


def duration(seconds: float) -> str | None:
    """Return ``seconds`` in the largest whole unit (``"7 days"``), or ``None`` below a minute
    or when no unit divides it."""
    for size, unit in _UNITS:
        if seconds >= size and seconds % size == 0:
            count = int(seconds // size)
            return f"{count} {unit}{'' if count == 1 else 's'}"
    return None


def default_parts(key: str) -> tuple[str, str | None]:
    """Return how the reference shows ``TASKLOOP[key]``'s default: the value as written in
    Python, and the same in days, hours or minutes when it is a number of seconds (else ``None``)."""
    value = DEFAULTS[key]
    as_time = duration(value) if kind_of(key).seconds and value else None
    return repr(value), as_time


def described_keys(text: str | None = None) -> list[str]:
    """Return the keys that the settings reference (``text``, default docs/settings.md) describes,
    in the page's order."""
    return _DESCRIPTION.findall(PAGE.read_text() if text is None else text)
