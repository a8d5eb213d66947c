"""Text for people on a terminal: durations that read ("2 min"), aligned tables, parsed ages."""

from __future__ import annotations

import re
from collections.abc import Sequence

from django_taskloop.human import duration, plural

__all__ = ["WIDTH", "BadInput", "ago", "clip", "duration", "parse_duration", "plural", "table"]

#: The terminal's width every table fits in (docs/operating.md), the queue names permitting.
WIDTH = 100
#: Seconds per unit of a duration given on the command line (``90``, ``90s``, ``5m``, ``2h``, ``7d``, ``2w``).
_UNITS = {"": 1, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|min|h|d|w|)\s*$")


class BadInput(Exception):
    """A name, id or option the operator got wrong: one line, exit status 2, nothing changed."""


def parse_duration(text: str, option: str) -> float:
    """Return the seconds of ``text`` such as ``90``, ``90s``, ``5m``, ``2h``, ``7d`` or ``2w``."""
    match = _DURATION.match(text)
    if match is None:
        raise BadInput(f"{option} takes a duration such as 90s, 5m, 2h, 7d or 2w, not {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


def ago(seconds: float | None) -> str:
    """Return ``2 min ago`` (``—`` for never)."""
    return "—" if seconds is None else f"{duration(seconds)} ago"


def clip(text: str, width: int) -> str:
    """Return ``text`` on one line, cut to ``width`` characters with an ellipsis."""
    line = " ".join(text.split())
    return line if len(line) <= width else line[: max(0, width - 1)] + "…"


def table(header: Sequence[str], rows: Sequence[Sequence[str]], *, right: Sequence[int] = ()) -> list[str]:
    """Return the lines of an aligned table: two spaces between columns, columns in ``right``
    aligned right (numbers), the last column not padded."""
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    lines = []
    for row in [header, *rows]:
        cells = [
            str(cell).rjust(widths[i]) if i in right else str(cell).ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        lines.append("  ".join(cells).rstrip())
    return lines
