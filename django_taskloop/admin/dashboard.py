"""The dashboard: every loop, board and tube on one page, with server-side SVG charts.

A database that cannot be reached (a shard whose server is down) is named at the top of the
page and its queues' rows and cards are marked down; every other queue shows as ever (the read
model says which: :func:`django_taskloop.stats.queue_summaries`' ``down``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db import router
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy as _lazy
from django.views.decorators.http import require_POST

from .. import engine, shards
from ..health import CleanupWatch, database_cleanup
from ..models.boards import Job, JobBoard
from ..models.operating import Failure, WorkerProcess, throughput_series
from ..models.results import TaskRecord
from ..models.tubes import Task, Tube
from ..queues import Queue
from ..stats import (
    DJANGO_TASK,
    LOCK_BUCKETS,
    QueueSummary,
    lock_ages,
    merge_django_tasks,
    processed_last_hour,
    queue_summaries,
)
from .base import count_text, dashboard_url, humanize_seconds, seconds_between
from .boards import JOB_STATE_LABELS
from .charts import bar_chart, time_chart
from .loops import DASHBOARD_COUNT_CAP, loop_models
from .operating import held_text, served_text

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


def _depth_chart(summary: QueueSummary, labels: Mapping[str, Any] | None = None) -> SafeString:
    """Return the bar chart of a queue's states, each bar in its state's colour."""
    states = [state_css(summary.kind, state) for state in summary.counts]
    return bar_chart(_depth_bars(summary, labels), title=_("Queue depth by state"), states=states)


def _depth_bars(summary: QueueSummary, labels: Mapping[str, Any] | None = None) -> list[tuple[str, float]]:
    """Return ``(label, count)`` bars of a queue's states, a capped count said in its label."""
    bars: list[tuple[str, float]] = []
    for state, (count, exact) in summary.depth().items():
        label = str(labels[state]) if labels else state
        bars.append((label if exact else f"{label} ({count_text(count, exact)})", count))
    return bars


def _depth_rows(summary: QueueSummary, labels: Mapping[str, Any] | None = None) -> list[tuple[str, str]]:
    """Return ``(label, count text)`` rows of a queue's states."""
    return [
        (str(labels[state]) if labels else state, count_text(count, exact))
        for state, (count, exact) in summary.depth().items()
    ]


def _waits_row(summary: QueueSummary) -> tuple[str, str]:
    return (_("latency"), humanize_seconds(summary.oldest_ready))


#: A Django Tasks queue's tube states, in its user's words (``taken``: a worker runs it;
#: ``delayed``: waits for its ``run_after`` or its retry's backoff).
DJANGO_TASK_STATE_LABELS = {
    "ready": _lazy("ready"),
    "taken": _lazy("running"),
    "delayed": _lazy("waiting"),
    "buried": _lazy("buried"),
    "expired": _lazy("lease lost"),
    "failed": _lazy("failed"),
}


def _loop_card(summary: QueueSummary) -> dict[str, Any]:
    """The rows and charts of a loop's card (an empty loop gets one line, no zeros)."""
    if summary.empty:
        return {"empty": True, "rows": [], "charts": []}
    model: Any = summary.source
    ages = lock_ages(model, summary.using, cap=DASHBOARD_COUNT_CAP)
    rows = [
        *_depth_rows(summary),
        (_("most overdue"), humanize_seconds(summary.oldest_ready)),
        (_("longest lock left"), humanize_seconds(summary.longest_lock_left)),
    ]
    charts = [
        _depth_chart(summary),
        bar_chart(list(ages.items()), title=_("Locks by time until they end")),
    ]
    return {"empty": False, "rows": rows, "charts": charts}


def _board_card(summary: QueueSummary) -> dict[str, Any]:
    """The rows and charts of a board's card (an empty board gets one line, no zeros)."""
    rows = [
        *_depth_rows(summary, JOB_STATE_LABELS),
        (_("oldest live claim"), humanize_seconds(summary.oldest_claim)),
        _waits_row(summary),
    ]
    if summary.empty:
        return {"empty": True, "rows": rows, "charts": []}
    chart = _depth_chart(summary, JOB_STATE_LABELS)
    return {"empty": False, "rows": rows, "charts": [chart]}


def _tube_card(summary: QueueSummary) -> dict[str, Any]:
    """The rows and charts of a tube's card (an empty tube gets no chart of zeros)."""
    rows = [*_depth_rows(summary), _waits_row(summary)]
    if summary.empty:
        return {"empty": True, "rows": rows, "charts": []}
    chart = _depth_chart(summary)
    return {"empty": False, "rows": rows, "charts": [chart]}


def _tasks_card(summary: QueueSummary) -> dict[str, Any]:
    """The rows and charts of a Django Tasks queue's card: its two tubes' tasks as one."""
    rows = [*_depth_rows(summary, DJANGO_TASK_STATE_LABELS), _waits_row(summary)]
    if summary.empty:
        return {"empty": True, "rows": rows, "charts": []}
    chart = _depth_chart(summary, DJANGO_TASK_STATE_LABELS)
    return {"empty": False, "rows": rows, "charts": [chart]}


def _tasks_links(summary: QueueSummary, site: admin.AdminSite) -> dict[str, Any]:
    """A Django Tasks queue's card links its results; its internal tubes, for an operator,
    come after them, small."""
    results = _url(site, TaskRecord, "changelist")
    tasks = _url(site, Task, "changelist")
    return {
        "kind": _("Django Tasks queue"),
        "model": Tube,
        "list_url": f"{results}?queue={summary.name}" if results else None,
        "list_label": _("results"),
        "stats_url": None,
        "tubes": [
            (tube.name, f"{tasks}?tube__id__exact={tube.pk}" if tasks else None) for tube in summary.tubes
        ],
    }


def _card_links(summary: QueueSummary, site: admin.AdminSite) -> dict[str, Any]:
    """The card's kind, its pause model and its links to the list and the statistics page."""
    source: Any = summary.source
    if summary.kind == DJANGO_TASK:
        return _tasks_links(summary, site)
    if summary.kind == "loop":
        return {
            "kind": _("loop"),
            "model": source,
            "list_url": _url(site, source, "changelist"),
            "stats_url": _url(site, source, "stats"),
        }
    items, model, field = (Job, JobBoard, "board") if summary.kind == "job" else (Task, Tube, "tube")
    kind = _("job board") if summary.kind == "job" else _("tube (%(type)s)") % {"type": source.type}
    return {
        "kind": kind,
        "model": model,
        "list_url": (_url(site, items, "changelist") or "") + f"?{field}__id__exact={source.pk}",
        "stats_url": _url(site, model, "stats", source.pk),
    }


def _card(summary: QueueSummary, request: HttpRequest, site: admin.AdminSite) -> dict[str, Any]:
    """Return one queue's card: its links, state rows, charts and failures of the last hour.

    A shard on a database other than the router's (``emails@queue2``) is named without links:
    the admin's tube, board, task and failure pages read the router's database, where its
    ids name other rows."""
    links = _card_links(summary, site)
    model: Any = type(summary.source)
    shard = summary.kind != "loop" and summary.using != router.db_for_read(model)
    if shard or summary.down is not None:
        links = {
            **links,
            "list_url": None,
            "stats_url": None,
            "tubes": [(n, None) for n, _u in links.get("tubes", [])],
        }
    cards = {"loop": _loop_card, "job": _board_card, "task": _tube_card, DJANGO_TASK: _tasks_card}
    # A queue that is down: nothing to show but that (its counts are unknown, not zeros).
    body = {"empty": True, "rows": [], "charts": []} if summary.down else cards[summary.kind](summary)
    failures_url = _url(site, Failure, "changelist")
    return {
        "kind": links["kind"],
        "title": summary.title,
        "queue_kind": summary.kind,
        "queue": summary.name,
        "paused": summary.paused,
        "can_pause": summary.down is None and _can_change(request, site, links["model"]),
        "down": summary.down,
        "list_url": links["list_url"],
        "list_label": links.get("list_label", _("list")),
        "stats_url": links["stats_url"],
        "tubes": links.get("tubes", []),
        "latency": summary.oldest_ready,
        "failures": summary.failures_last_hour,
        "failures_url": f"{failures_url}?queue={summary.kind}:{summary.name}"
        if failures_url and not shard and summary.down is None
        else None,
        **body,
    }


def _visible_summaries(
    request: HttpRequest, site: admin.AdminSite, down: dict[str, str]
) -> list[QueueSummary]:
    """Return the summaries of the queues the user may see: loops, boards, then tubes
    (``down``: filled with the databases that could not be read)."""
    loops = [model for model in loop_models() if _can_view(request, site, model)]
    kinds = ["loop"] if loops else []
    kinds += [kind for kind, model in (("job", JobBoard), ("task", Tube)) if _can_view(request, site, model)]
    return merge_django_tasks(
        queue_summaries(kinds, cap=DASHBOARD_COUNT_CAP, limit=MAX_QUEUES, loops=loops, down=down)
    )


def state_css(kind: str, state: str) -> str:
    """Return the admin.css class (without ``tl-``) of ``state`` of a queue of ``kind``: its
    badge's colour (a tube task whose ttl ran out is grey, as in the task list; elsewhere
    "expired" is a lease that ran out, free to run again)."""
    return "ttl" if kind in ("task", DJANGO_TASK) and state == "expired" else state


#: What stays in a queue after failing for good, waiting for an operator (a Django Task: its
#: result, FAILED; its tube task is gone).
FAILED_FOR_GOOD = {"task": "buried", DJANGO_TASK: "failed", "job": "trashed"}


def _state_labels(kind: str) -> Mapping[str, Any] | None:
    return {"job": JOB_STATE_LABELS, DJANGO_TASK: DJANGO_TASK_STATE_LABELS}.get(kind)


def _processed(
    summary: QueueSummary, processed: Mapping[tuple[str, str], tuple[int, int]]
) -> tuple[int, int]:
    """Return ``(done, failed)`` of the last hour of a queue (a Django Tasks queue: its tubes')."""
    if summary.kind == DJANGO_TASK:
        pairs = [processed.get(("task", tube.name), (0, 0)) for tube in summary.tubes]
        return sum(done for done, _f in pairs), sum(failed for _d, failed in pairs)
    return processed.get((summary.kind, summary.name), (0, 0))


def _queue_row(summary: QueueSummary, card: dict[str, Any], processed: Any) -> dict[str, Any]:
    """Return one row of the table of queues: states, rate, latency, failures, paused."""
    if summary.down is not None:
        return {
            **card,
            "states": [],
            "wait": "—",
            "rate": "—",
            "done": "0",
            "for_good": "",
            "for_good_state": None,
        }
    labels = _state_labels(summary.kind)
    chips = [
        (
            str(labels[state]) if labels else state,
            _chip_count(summary, state, count, exact),
            state_css(summary.kind, state),
        )
        for state, (count, exact) in summary.depth().items()
        if count
    ]
    if summary.rate is not None:
        # A tube's rate, with what its window holds: "rate 12 of 60/s".
        chips.append((str(_("rate")), f"{summary.started or 0:,} of {summary.rate}", "rate"))
    for by_key in (summary.key_limit, summary.key_rate):
        if by_key is not None:
            # A utube's key limit and key rate: "per key 3", "per key 10/m".
            chips.append(
                (str(_("per key")), f"{by_key:,}" if isinstance(by_key, int) else str(by_key), "rate")
            )
    done, _failed = _processed(summary, processed)
    good = FAILED_FOR_GOOD.get(summary.kind)
    # A Django Tasks queue's failed for good: its FAILED results, a click away.
    results = card.get("list_url") if summary.kind == DJANGO_TASK else None
    return {
        **card,
        "states": chips,
        "wait": humanize_seconds(summary.oldest_ready) if summary.oldest_ready is not None else "—",
        "rate": f"{done / 60:.1f}" if done else "—",
        "done": f"{done:,}",
        "for_good": count_text(*summary.depth()[good]) if good else "",
        "for_good_state": good,
        "for_good_url": f"{results}&status__exact=FAILED" if results else None,
        "empty": summary.empty,
    }


def _chip_count(summary: QueueSummary, state: str, count: int, exact: bool) -> str:
    """A state's count on its chip; a limited tube's taken tasks against its limit ("5/5")."""
    text = count_text(count, exact)
    return f"{text}/{summary.limit}" if state == "taken" and summary.limit is not None else text


def _every_database(since: float, bucket: int, down: dict[str, str]) -> list[tuple[Any, int, int, int]]:
    """Return ``throughput_series`` of every queue, added up over every database that holds
    queues and can be reached (a shard's workers write their throughput on the shard), on the
    router's buckets."""
    read = shards.read_each(
        shards.tube_databases(), lambda using: throughput_series("*", None, since, bucket, using=using), down
    )
    series = list(read.values()) or [[]]
    total = {moment: [done, failed, back] for moment, done, failed, back in series[0]}
    for other in series[1:]:
        for moment, done, failed, back in other:
            if moment in total:
                for slot, n in enumerate((done, failed, back)):
                    total[moment][slot] += n
    return [(moment, *values) for moment, values in total.items()]


def _throughput_charts(down: dict[str, str]) -> list[SafeString]:
    """Return the processed-items charts of the last hour and day (none if the day was idle);
    the day's axis names the dates."""
    hour = _every_database(3600, 60, down)
    day = _every_database(24 * 3600, 1800, down)
    if not any(done or failed or back for _t, done, failed, back in day):
        return []
    return [
        time_chart(
            [(_local(t).strftime(when), (done, failed, back)) for t, done, failed, back in points],
            title=title,
        )
        for points, title, when in (
            (hour, _("Processed per minute, last hour"), "%H:%M"),
            (day, _("Processed per half hour, last day"), "%b %d, %H:%M"),
        )
    ]


def _local(moment: Any) -> Any:
    return timezone.localtime(moment) if timezone.is_aware(moment) else moment


def _workers() -> list[dict[str, Any]]:
    """Return a row per live worker process: who, where, up for how long, what it holds."""
    now = engine.db_now()
    return [
        {
            "identity": w.identity,
            "host": w.host,
            "pid": w.pid,
            "up": humanize_seconds(seconds_between(now, w.started)),
            "beat": humanize_seconds(seconds_between(now, w.beat_at)),
            "serves": served_text(w.queues),
            "holds": held_text(w.holding),
        }
        for w in WorkerProcess.objects.alive().order_by("host", "pid")
    ]


def _databases() -> list[dict[str, Any]]:
    """What holds back cleanup of the queue tables, per database that keeps old row versions
    (none on SQLite): the oldest other open transaction, dead row versions or purge backlog."""
    limit = CleanupWatch.threshold()
    rows = []
    for alias, read in database_cleanup().items():
        holder = read.holder
        dead = sorted(read.dead_rows.items(), key=lambda item: -item[1])
        rows.append(
            {
                "alias": alias,
                "oldest": humanize_seconds(holder.seconds) if holder is not None else "—",
                "holder": holder.describe() if holder is not None else "",
                "held": bool(holder is not None and limit and holder.seconds >= limit),
                "dead": sum(n for _table, n in dead) if read.purge_backlog is None else None,
                "most_dead": f"{dead[0][0]} {dead[0][1]:,}" if dead and dead[0][1] else "",
                "backlog": read.purge_backlog,
            }
        )
    return rows


def dashboard_data(request: HttpRequest, site: admin.AdminSite) -> dict[str, Any]:
    """Return the cards of the dashboard: what the user may see of loops, boards and tubes."""
    down: dict[str, str] = {}
    summaries = _visible_summaries(request, site, down)
    cards = [_card(summary, request, site) for summary in summaries]
    # Each database's own throughput rows: a shard's workers write theirs on the shard.
    processed = shards.read_each(dict.fromkeys(s.using for s in summaries), processed_last_hour, down)
    rows = [
        _queue_row(summary, card, processed.get(summary.using, {}))
        for summary, card in zip(summaries, cards, strict=True)
    ]
    rows.sort(key=lambda row: bool(row["empty"]))
    databases = _databases()
    # Queues with work first; empty ones last, small.
    cards.sort(key=lambda card: bool(card["empty"]))
    return {
        "queues": rows,
        "cards": cards,
        "throughput": _throughput_charts(down),
        "down": sorted(down.items()),
        "workers": _workers(),
        "databases": databases,
        "cleanup_held": any(db["held"] for db in databases),
        "workers_url": _url(site, WorkerProcess, "changelist"),
        "failures_url": _url(site, Failure, "changelist"),
        "lock_buckets": [label for _upper, label in LOCK_BUCKETS],
    }


def _can_change(request: HttpRequest, site: admin.AdminSite, model: Any) -> bool:
    model_admin = site._registry.get(model)
    return model_admin is not None and model_admin.has_change_permission(request)


@require_POST
def pause_view(request: HttpRequest, site: admin.AdminSite) -> HttpResponse:
    """Pause or resume one queue (POST ``kind``, ``queue``, ``do``=pause|resume) for a user who
    may change that kind of queue, on every shard of it (:class:`~django_taskloop.queues.Queue`,
    as the terminal and the admin's actions do); back to the dashboard."""
    kind, name, do = request.POST.get("kind", ""), request.POST.get("queue", ""), request.POST.get("do")
    queue = Queue.named(kind, name)
    if queue is None or do not in ("pause", "resume"):
        raise PermissionDenied("unknown queue or verb")
    model = queue.model or (JobBoard if kind == "job" else Tube)
    if not _can_change(request, site, model):
        raise PermissionDenied
    if do == "pause":
        queue.pause()
    else:
        queue.resume()
    what = "Django Tasks" if kind == DJANGO_TASK else kind
    messages.success(request, f"{'Paused' if do == 'pause' else 'Resumed'} {what} queue {queue.name}.")
    return HttpResponseRedirect(dashboard_url(site) or reverse("admin:index", current_app=site.name))


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
