"""How the package says a number to people: ``2 min``, ``3 h 05 min``, ``1 failure``, ``3 failures``.

One spelling for every door (the terminal, the admin, the verbs' messages), so that a duration
reads the same wherever an operator meets it.
"""

from __future__ import annotations

__all__ = ["duration", "plural"]


def duration(seconds: float | None) -> str:
    """Return ``seconds`` as people say it: ``0.4 s``, ``12 s``, ``2 min``, ``3 h 05 min``, ``4 d 2 h``."""
    if seconds is None:
        return "—"
    seconds = abs(seconds)
    if seconds < 10:
        return f"{seconds:.1f} s"
    whole = int(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h" if hours else f"{days} d"
    if hours:
        return f"{hours} h {minutes:02d} min" if minutes else f"{hours} h"
    if minutes:
        return f"{minutes} min" if minutes >= 10 or not secs else f"{minutes} min {secs:02d} s"
    return f"{secs} s"


def plural(n: int, word: str, many: str | None = None) -> str:
    """Return ``1 failure``, ``3 failures`` (``many``: the plural when not ``word + "s"``)."""
    return f"{n} {word if n == 1 else many or word + 's'}"
