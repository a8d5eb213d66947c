"""The dashboard: every loop, board and tube on one page, with server-side SVG charts."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Count
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, reverse
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from .. import engine
from ..models.boards import Job, JobBoard
from ..models.operating import Failure, WorkerProcess, is_paused, pause, resume, throughput_series
from ..models.tubes import Task, Tube
from .base import count_text, dashboard_url, humanize_seconds, seconds_between
from .boards import JOB_STATE_LABELS, board_overview
from .charts import bar_chart, time_chart
from .loops import DASHBOARD_COUNT_CAP, LOCK_BUCKETS, loop_models, loop_overview
from .tubes import tube_depth

__all__ = ["dashboard_view", "dashboard_data", "pause_view"]

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
    capped: set[str] = set()  # totals that include a count stopped at the cap
    for model in loop_models():
        if not _can_view(request, site, model):
            continue
        overview = loop_overview(model, full_stats=False, cap=DASHBOARD_COUNT_CAP)
        stats = overview["stats"]
        depth = overview["depth"]
        label = str(model._meta.verbose_name_plural)
        for state, (count, exact) in depth.items():
            depth_totals[f"loop {state}"] = depth_totals.get(f"loop {state}", 0) + count
            if not exact:
                capped.add(f"loop {state}")
        empty = not any(count for count, _exact in depth.values())
        if not empty:
            oldest.append((label, stats["max_bump_time"]))
        queue = model._meta.label_lower
        cards.append(
            {
                "kind": _("loop"),
                "title": label,
                "queue_kind": "loop",
                "queue": queue,
                "paused": is_paused("loop", queue, model._default_manager.db),
                "can_pause": _can_change(request, site, model),
                "empty": empty,
                "list_url": _url(site, model, "changelist"),
                "stats_url": _url(site, model, "stats"),
                # An empty loop gets one line: a table and charts of zeros say nothing.
                "rows": []
                if empty
                else [(state, count_text(count, exact)) for state, (count, exact) in depth.items()]
                + [
                    (_("most overdue"), humanize_seconds(stats["max_bump_time"])),
                    (_("longest lock left"), humanize_seconds(stats["max_lock_time"])),
                ],
                "charts": []
                if empty
                else [
                    bar_chart(
                        [
                            (state if exact else f"{state} ({count_text(count, exact)})", count)
                            for state, (count, exact) in depth.items()
                        ],
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
            head = (
                board.jobs.filter(trashed=False, claimed_by__isnull=True)
                .in_claim_order()
                .values_list("created_on", flat=True)
                .first()
            )
            cards.append(
                {
                    "kind": _("job board"),
                    "title": board.name,
                    "queue_kind": "job",
                    "queue": board.name,
                    "paused": board.paused,
                    "can_pause": _can_change(request, site, JobBoard),
                    "latency": seconds_between(overview["now"], head),
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
            for state, (count, exact) in depth.items():
                depth_totals[f"task {state}"] = depth_totals.get(f"task {state}", 0) + count
                if not exact:
                    capped.add(f"task {state}")
            # The head of the claim order: the task the next take gets, and how long it waited.
            head = tube.tasks.ready().in_claim_order().values_list("created", flat=True).first()
            empty_tube = not any(count for count, _exact in depth.values())
            cards.append(
                {
                    "kind": _("tube (%(type)s)") % {"type": tube.type},
                    "title": tube.name,
                    "queue_kind": "task",
                    "queue": tube.name,
                    "paused": tube.paused,
                    "can_pause": _can_change(request, site, Tube),
                    "latency": seconds_between(engine.db_now(tube.using), head),
                    "empty": empty_tube,
                    "list_url": (_url(site, Task, "changelist") or "") + f"?tube__id__exact={tube.pk}",
                    "stats_url": _url(site, Tube, "stats", tube.pk),
                    "rows": [(state, count_text(count, exact)) for state, (count, exact) in depth.items()],
                    # An empty tube gets no chart of zeros.
                    "charts": []
                    if empty_tube
                    else [
                        bar_chart(
                            [
                                (state if exact else f"{state} ({count_text(count, exact)})", count)
                                for state, (count, exact) in depth.items()
                            ],
                            title=_("Queue depth by state"),
                        )
                    ],
                }
            )
    # Failures of the last hour per queue: one grouped read of the (queue, at) index range.
    failed = dict(
        ((kind, queue), n)
        for kind, queue, n in Failure.objects.filter(at__gte=engine.DbNow(-3600))
        .values_list("kind", "queue")
        .annotate(n=Count("pk"))
        .values_list("kind", "queue", "n")
    )
    failures_url = _url(site, Failure, "changelist")
    for card in cards:
        n = failed.get((card["queue_kind"], card["queue"]), 0)
        card["failures"] = n
        card["failures_url"] = (
            f"{failures_url}?queue={card['queue_kind']}:{card['queue']}" if failures_url else None
        )
        if "latency" in card:
            card["rows"].append(
                (
                    _("oldest ready waits"),
                    humanize_seconds(card["latency"]) if card["latency"] is not None else "—",
                )
            )
    # Queues with work first; empty ones last, small.
    cards.sort(key=lambda card: bool(card.get("empty")))
    summary = []
    if depth_totals:
        summary.append(
            bar_chart(
                [(f"{name} (≥)" if name in capped else name, n) for name, n in depth_totals.items()],
                title=_("Everything, by state (≥: counting stopped there)"),
                width=520,
            )
        )
    if oldest:
        summary.append(
            bar_chart(
                [(label, round(seconds, 1)) for label, seconds in oldest],
                title=_("Oldest lock: most overdue loop id, oldest live job claim"),
                unit="s",
                width=520,
            )
        )
    hour = throughput_series("*", None, 3600, 60)
    day = throughput_series("*", None, 24 * 3600, 1800)
    throughput = []
    if any(done or failed or back for _t, done, failed, back in day):
        throughput = [
            time_chart(
                [(t.strftime("%H:%M"), (done, failed, back)) for t, done, failed, back in hour],
                title=_("Processed per minute, last hour"),
            ),
            time_chart(
                [(t.strftime("%H:%M"), (done, failed, back)) for t, done, failed, back in day],
                title=_("Processed per half hour, last day"),
            ),
        ]
    workers = list(WorkerProcess.objects.alive().order_by("host", "pid"))
    now = engine.db_now()
    return {
        "cards": cards,
        "summary": summary,
        "throughput": throughput,
        "workers": [
            {
                "identity": w.identity,
                "host": w.host,
                "pid": w.pid,
                "up": humanize_seconds(seconds_between(now, w.started)),
                "beat": humanize_seconds(seconds_between(now, w.beat_at)),
                "serves": ", ".join(w.queues or []),
                "holds": ", ".join(f"{n} of {q}" for q, n in (w.holding or {}).items()) or "—",
            }
            for w in workers
        ],
        "workers_url": _url(site, WorkerProcess, "changelist"),
        "failures_url": failures_url,
        "lock_buckets": [label for _upper, label in LOCK_BUCKETS],
    }


def _can_change(request: HttpRequest, site: admin.AdminSite, model: Any) -> bool:
    model_admin = site._registry.get(model)
    return model_admin is not None and model_admin.has_change_permission(request)


@require_POST
def pause_view(request: HttpRequest, site: admin.AdminSite) -> HttpResponse:
    """Pause or resume one queue (POST ``kind``, ``queue``, ``do``=pause|resume) for a user who
    may change that kind of queue; back to the dashboard."""
    kind, queue, do = request.POST.get("kind"), request.POST.get("queue", ""), request.POST.get("do")
    if kind == "task":
        model: Any = Tube
        target = Tube.objects.filter(name=queue).first()
    elif kind == "job":
        model = JobBoard
        target = JobBoard.objects.filter(name=queue).first()
    elif kind == "loop":
        model = next((m for m in loop_models() if m._meta.label_lower == queue), None)
        target = model
    else:
        model = target = None
    if model is None or target is None or do not in ("pause", "resume"):
        raise PermissionDenied("unknown queue or verb")
    if not _can_change(request, site, model):
        raise PermissionDenied
    if kind == "loop":
        (pause if do == "pause" else resume)("loop", queue, model._default_manager.db)
    else:
        getattr(target, do)()
    messages.success(request, f"{'Paused' if do == 'pause' else 'Resumed'} {kind} queue {queue}.")
    return HttpResponseRedirect(dashboard_url(site))


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
