"""The dashboard: every loop, board and tube on one page, with server-side SVG charts."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, reverse
from django.utils.translation import gettext as _

from ..models.boards import Job, JobBoard
from ..models.tubes import Task, Tube
from .base import humanize_seconds, seconds_between
from .boards import JOB_STATE_LABELS, board_overview
from .charts import bar_chart
from .loops import DASHBOARD_COUNT_CAP, LOCK_BUCKETS, loop_models, loop_overview
from .tubes import tube_depth

__all__ = ["dashboard_view", "dashboard_data"]

# A dashboard lists at most this many boards and tubes (largest first would need counts).
MAX_QUEUES = 50


def _can_view(request: HttpRequest, site: admin.AdminSite, model: Any) -> bool:
    model_admin = site._registry.get(model)
    return model_admin is not None and model_admin.has_view_or_change_permission(request)


def _url(site: admin.AdminSite, model: Any, view: str, *args: Any) -> str | None:
    try:
        return reverse(
            f"admin:{model._meta.app_label}_{model._meta.model_name}_{view}", args=args, current_app=site.name
        )
    except NoReverseMatch:
        return None


def dashboard_data(request: HttpRequest, site: admin.AdminSite) -> dict[str, Any]:
    """Return the cards of the dashboard: what the user may see of loops, boards and tubes."""
    cards: list[dict[str, Any]] = []
    oldest: list[tuple[str, float]] = []
    depth_totals: dict[str, int] = {}
    for model in loop_models():
        if not _can_view(request, site, model):
            continue
        overview = loop_overview(model, full_stats=False, cap=DASHBOARD_COUNT_CAP)
        stats = overview["stats"]
        depth = overview["depth"]
        label = str(model._meta.verbose_name_plural)
        for state, (count, _exact) in depth.items():
            depth_totals[f"loop {state}"] = depth_totals.get(f"loop {state}", 0) + count
        empty = not any(count for count, _exact in depth.values())
        if not empty:
            oldest.append((label, stats["max_bump_time"]))
        cards.append(
            {
                "kind": _("loop"),
                "title": label,
                "empty": empty,
                "list_url": _url(site, model, "changelist"),
                "stats_url": _url(site, model, "stats"),
                # An empty loop gets one line: a table and charts of zeros say nothing.
                "rows": []
                if empty
                else [(state if exact else f"{state} (≥)", count) for state, (count, exact) in depth.items()]
                + [
                    (_("most overdue"), humanize_seconds(stats["max_bump_time"])),
                    (_("longest lock left"), humanize_seconds(stats["max_lock_time"])),
                ],
                "charts": []
                if empty
                else [
                    bar_chart(
                        [(state, count) for state, (count, _exact) in depth.items()],
                        title=_("Queue depth by state"),
                    ),
                    bar_chart(list(overview["lock_ages"].items()), title=_("Locks by time until they end")),
                ],
            }
        )
    if _can_view(request, site, JobBoard):
        for board in JobBoard.objects.all()[:MAX_QUEUES]:
            overview = board_overview(board)
            by_state = overview["by_state"]
            claim_age = seconds_between(overview["now"], overview["oldest_claim"])
            oldest.append((f"board {board.name}", claim_age or 0.0))
            for state, count in by_state.items():
                depth_totals[f"job {state}"] = depth_totals.get(f"job {state}", 0) + count
            cards.append(
                {
                    "kind": _("job board"),
                    "title": board.name,
                    "list_url": (_url(site, Job, "changelist") or "") + f"?board__id__exact={board.pk}",
                    "stats_url": _url(site, JobBoard, "stats", board.pk),
                    "rows": [(str(JOB_STATE_LABELS[k]), v) for k, v in by_state.items()]
                    + [(_("oldest live claim"), humanize_seconds(claim_age))],
                    "charts": [
                        bar_chart(
                            [(str(JOB_STATE_LABELS[k]), v) for k, v in by_state.items()],
                            title=_("Queue depth by state"),
                        )
                    ],
                }
            )
    if _can_view(request, site, Tube):
        for tube in Tube.objects.all()[:MAX_QUEUES]:
            depth = tube_depth(tube, DASHBOARD_COUNT_CAP)
            for state, (count, _exact) in depth.items():
                depth_totals[f"task {state}"] = depth_totals.get(f"task {state}", 0) + count
            cards.append(
                {
                    "kind": _("tube (%(type)s)") % {"type": tube.type},
                    "title": tube.name,
                    "list_url": (_url(site, Task, "changelist") or "") + f"?tube__id__exact={tube.pk}",
                    "stats_url": _url(site, Tube, "stats", tube.pk),
                    "rows": [
                        (state if exact else f"{state} (≥)", count) for state, (count, exact) in depth.items()
                    ],
                    "charts": [
                        bar_chart(
                            [(state, count) for state, (count, _exact) in depth.items()],
                            title=_("Queue depth by state"),
                        )
                    ],
                }
            )
    # Queues with work first; empty loops last, small.
    cards.sort(key=lambda card: bool(card.get("empty")))
    summary = []
    if depth_totals:
        summary.append(bar_chart(list(depth_totals.items()), title=_("Everything, by state"), width=520))
    if oldest:
        summary.append(
            bar_chart(
                [(label, round(seconds, 1)) for label, seconds in oldest],
                title=_("Oldest lock: most overdue loop id, oldest live job claim"),
                unit="s",
                width=520,
            )
        )
    return {"cards": cards, "summary": summary, "lock_buckets": [label for _upper, label in LOCK_BUCKETS]}


def dashboard_view(request: HttpRequest, site: admin.AdminSite) -> HttpResponse:
    """Render the dashboard for a staff user who may view at least one queue."""
    data = dashboard_data(request, site)
    if not data["cards"] and not any(
        _can_view(request, site, model) for model in (JobBoard, Tube, *loop_models())
    ):
        raise PermissionDenied
    context = {
        **site.each_context(request),
        "title": _("Task loop dashboard"),
        **data,
    }
    request.current_app = site.name
    return TemplateResponse(request, "admin/django_taskloop/dashboard.html", context)
