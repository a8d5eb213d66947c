"""How the admin says a moment: to the second, with how long ago it is."""

from __future__ import annotations

import datetime as dt

from django.utils import timezone
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _

from ..human import duration

__all__ = ["ago_text", "when_cell", "when_text"]


def ago_text(seconds: float) -> str:
    """Say how long ago ``seconds`` (negative: ahead) is: ``just now``, ``2 min ago``, ``in 3 h``
    (the duration as the terminal says it: :func:`django_taskloop.human.duration`)."""
    if abs(seconds) < 5:
        return str(_("just now"))
    return str(_("in %(time)s") if seconds < 0 else _("%(time)s ago")) % {"time": duration(seconds)}


def when_text(moment: dt.datetime) -> str:
    """Return ``moment`` to the second in the current time zone: ``2026-11-26 15:04:05``."""
    return _local(moment).strftime("%Y-%m-%d %H:%M:%S")


def _local(moment: dt.datetime) -> dt.datetime:
    return timezone.localtime(moment) if timezone.is_aware(moment) else moment


def when_cell(moment: dt.datetime | None, now: dt.datetime, *, ago: bool = True) -> str:
    """Return a time to the second, the date only when it is not today, with how long ago it
    is beneath (``15:04:05`` / ``2 min ago``; not with ``ago=False``); the full date and time
    as its tooltip."""
    if moment is None:
        return "—"
    local, today = _local(moment), _local(now)
    shown = local.strftime("%H:%M:%S" if local.date() == today.date() else "%b %d, %H:%M:%S")
    return format_html(
        '<time class="tl-when" datetime="{}" title="{}">{}</time><small class="tl-ago">{}</small>',
        moment.isoformat(),
        when_text(moment),
        shown,
        ago_text((now - moment).total_seconds()) if ago else "",
    )
