"""Admin of what an operator needs beside the queues: why things failed, and who is working.

- Failures: every handler failure a worker saw, filterable by kind, queue and error, each
  linking to its item; the item's own page shows its attempts and last traceback
  (:func:`failure_history`). A Django Task's failures are named by its result (the item is the
  result id, whichever tube task brought each attempt), under its queue's Django name, and
  link to the result's page.
- Workers: the worker processes alive now, on which host, since when, what each holds, and
  the progress their running handlers reported (:func:`progress_html`, also on items' pages).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import OuterRef, QuerySet, Subquery
from django.http import HttpRequest
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe
from django.utils.text import Truncator
from django.utils.translation import gettext_lazy as _

from ..backends import short_result_id
from ..engine import db_now
from ..models import Failure, Job, JobBoard, Task, TaskRecord, Tube, WorkerProcess
from ..reaper import loop_models
from ..stats import DJANGO_TASK, TASKS_TUBE_PREFIXES, django_tasks_queue, running_progress
from .base import ModelAdmin, TaskloopAdminMixin, humanize_seconds, seconds_between
from .display import when_text

__all__ = [
    "FailureAdmin",
    "WorkerProcessAdmin",
    "failure_history",
    "held_text",
    "progress_html",
    "register",
    "served_text",
]


def _queue_title(name: str) -> str:
    """A worker's ``kind:queue`` for people: a Django Tasks queue's tubes by its Django name."""
    kind, _sep, queue = name.partition(":")
    tasks = django_tasks_queue(queue) if kind == "task" else None
    return f"{tasks} (Django Tasks)" if tasks is not None else name


def served_text(queues: list[str] | None) -> str:
    """Say what a worker process serves (a Django Tasks queue once, for its two tubes)."""
    return ", ".join(dict.fromkeys(_queue_title(name) for name in queues or []))


def held_text(holding: dict[str, int] | None) -> str:
    """Say what a worker process holds now: ``3 of emails``; ``—`` for nothing."""
    held: dict[str, int] = {}
    for name, n in (holding or {}).items():
        held[_queue_title(name)] = held.get(_queue_title(name), 0) + n
    return ", ".join(f"{n} of {queue}" for queue, n in held.items()) or "—"


def _progress_bar(fraction: float, message: str) -> str:
    """``[####    ] 40% copied 400 of 1000 files`` as HTML."""
    return format_html(
        '<progress max="1" value="{}"></progress> {}% {}', fraction, round(fraction * 100), message
    )


def progress_html(kind: str, queues: str | list[str], item: Any) -> str:
    """Return what the handler running ``item`` reported (``—``: nothing, or not running)."""
    found = running_progress(kind=kind, queue=queues, item=item)
    return (
        format_html_join(
            mark_safe("<br>"),
            "{} <small>({})</small>",
            ((_progress_bar(p.fraction, p.message), p.worker) for p in found),
        )
        or "—"
    )


def failure_history(obj: Any, site_name: str = "admin") -> str:
    """Return an item's attempts (newest first) and its last traceback, as HTML."""
    failures = list(Failure.objects.for_item(obj)[:20])
    if not failures:
        return "—"
    rows = format_html_join(
        "",
        "<tr><td>{}</td><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td></tr>",
        (
            (
                f.attempt,
                f.at.strftime("%Y-%m-%d %H:%M:%S"),
                f.error,
                Truncator(f.message).chars(120),
                f.worker,
            )
            for f in failures
        ),
    )
    return format_html(
        '<table class="tl-attempts"><thead><tr><th>{}</th><th>{}</th><th>{}</th><th>{}</th><th>{}</th>'
        '</tr></thead><tbody>{}</tbody></table><p><strong>{}</strong></p><pre class="tl-traceback">{}</pre>',
        _("attempt"),
        _("when"),
        _("error"),
        _("message"),
        _("worker"),
        rows,
        _("Last traceback"),
        failures[0].traceback,
    )


def last_failure_note(obj: Any) -> str:
    """Say why and when a buried task or trashed job ended there (its last failure): two lines
    at most in a list, the whole message and time on hover."""
    failure = Failure.objects.for_item(obj).first()
    if failure is None:
        return ""
    error = failure.error.rsplit(".", 1)[-1]
    return format_html(
        '<span class="tl-why tl-clamp" title="{}: {} ({} {})">{}: {} <span class="tl-when">({} {})</span></span>',
        error,
        failure.message,
        _("attempt %(n)s,") % {"n": failure.attempt},
        when_text(failure.at),
        error,
        Truncator(failure.message).chars(120),
        _("attempt %(n)s,") % {"n": failure.attempt},
        when_text(failure.at),
    )


class FailureErrorFilter(admin.SimpleListFilter):
    """The errors seen lately (the 20 most recent kinds), without counting the whole table."""

    title = _("error")
    parameter_name = "error"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        recent = Failure.objects.order_by("-at").values_list("error", flat=True)[:2000]
        seen: dict[str, None] = {}
        for error in recent:
            seen.setdefault(error, None)
            if len(seen) >= 20:
                break
        return [(error, error.rsplit(".", 1)[-1]) for error in seen]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(error=self.value()) if self.value() else queryset


class FailureQueueFilter(admin.SimpleListFilter):
    """The queues that have failures (a queue that never failed is not offered)."""

    title = _("queue")
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        # A Django Tasks queue once, by its Django name; its tubes are not listed (the URL
        # ?queue=task:tasks.default still filters by one, for an operator).
        tubes = Tube.objects.order_by("name").values_list("name", flat=True)[:100]
        choices: dict[str, Any] = {}
        for name in tubes:
            queue = django_tasks_queue(name)
            if queue is None:
                choices.setdefault(f"task:{name}", f"task:{name}")
            else:
                choices.setdefault(f"{DJANGO_TASK}:{queue}", _tasks_title(queue))
        for name in JobBoard.objects.order_by("name").values_list("name", flat=True)[:100]:
            choices[f"job:{name}"] = f"job:{name}"
        for model in loop_models():
            if not model._meta.proxy:
                choices[f"loop:{model._meta.label_lower}"] = f"loop:{model._meta.label_lower}"
        # One read of the (kind, queue, item) index per queue: queues are few, failures many.
        return [(value, label) for value, label in choices.items() if _failed(value)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if not value:
            return queryset
        kind, _sep, queue = value.partition(":")
        if kind == DJANGO_TASK:
            return queryset.filter(kind="task", queue__in=[prefix + queue for prefix in TASKS_TUBE_PREFIXES])
        return queryset.filter(kind=kind, queue=queue)


def _failures_of(value: str) -> QuerySet[Failure]:
    """Return the failures of the filter's ``kind:queue`` (a Django Tasks queue: its tubes')."""
    kind, _sep, queue = value.partition(":")
    if kind == DJANGO_TASK:
        return Failure.objects.filter(
            kind="task", queue__in=[prefix + queue for prefix in TASKS_TUBE_PREFIXES]
        )
    return Failure.objects.filter(kind=kind, queue=queue)


def _failed(value: str) -> bool:
    return _failures_of(value).exists()


def _tasks_title(queue: str) -> str:
    return f"{queue} (Django Tasks)"


def _result_id(failure: Failure) -> str | None:
    """Return the result id a Failure row of a Django Task names (``None``: not one; rows
    recorded before the item was the result id name its tube task, all digits)."""
    if failure.kind != "task" or django_tasks_queue(failure.queue) is None or failure.item.isdigit():
        return None
    return failure.item


class FailureAdmin(TaskloopAdminMixin, ModelAdmin):
    """Every failure a worker saw, newest first: what failed, why, where, which attempt."""

    # Five columns leave the message readable at 1280 px with both sidebars: the error and its
    # message share one (two lines of it; the whole on hover and on the failure's page).
    list_display = ("failed_at", "where", "item_link", "attempt", "error_name")
    list_filter = (FailureQueueFilter, "kind", FailureErrorFilter)
    search_fields = ("=item",)
    search_help_text = _("A tube task id, job uuid, loop id or Django task result id.")
    ordering = ("-at", "-id")
    sortable_by = ("failed_at",)
    readonly_fields = (
        "kind",
        "where",
        "item_link",
        "attempt",
        "worker",
        "error",
        "message",
        "failed_at",
        "traceback_block",
    )
    fields = readonly_fields
    date_hierarchy = None

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a record of what happened: read only

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        # The task path of a Django Task's result, read with the rows: one query a page,
        # not one a row (None: not a result, or pruned after RESULT_RETENTION).
        paths = TaskRecord.objects.filter(pk=OuterRef("item")).values("task_path")[:1]
        rows: QuerySet[Any] = super().get_queryset(request).annotate(result_task_path=Subquery(paths))
        return rows

    @admin.display(description=_("queue"))
    def where(self, obj: Failure) -> str:
        queue = django_tasks_queue(obj.queue) if obj.kind == "task" else None
        if queue is not None:
            return format_html('<small>Django Tasks</small> <span title="{}">{}</span>', obj.queue, queue)
        return format_html("<small>{}</small> {}", obj.kind, obj.queue)

    @admin.display(description=_("at"), ordering="at")
    def failed_at(self, obj: Failure) -> str:
        return self.when(obj.at)

    @admin.display(description=_("error"))
    def error_name(self, obj: Failure) -> str:
        return format_html(
            '<code title="{}">{}</code> <span class="tl-clamp" title="{}">{}</span>',
            obj.error,
            obj.error.rsplit(".", 1)[-1],
            obj.message,
            Truncator(obj.message).chars(300),
        )

    @admin.display(description=_("message"))
    def message_preview(self, obj: Failure) -> str:
        return Truncator(obj.message).chars(80)

    @admin.display(description=_("item"))
    def item_link(self, obj: Failure) -> str:
        result_id = _result_id(obj)
        if result_id is not None:
            return _result_link(result_id, getattr(obj, "result_task_path", None), self.admin_site.name)
        url = _item_url(obj, self.admin_site.name)
        # A job's uuid by its first 8 characters, as the job list shows it; whole on hover.
        shown = f"{obj.item[:8]}…" if obj.kind == "job" and len(obj.item) > 12 else obj.item
        if url:
            return format_html('<a href="{}" title="{}">{}</a>', url, obj.item, shown)
        return format_html('<span title="{}">{}</span>', obj.item, shown)

    @admin.display(description=_("traceback"))
    def traceback_block(self, obj: Failure) -> str:
        return format_html('<pre class="tl-traceback">{}</pre>', obj.traceback)


def _result_link(result_id: str, path: str | None, site_name: str) -> str:
    """Name a Django Task's result by its task (``path``, read with the row) and short id (as
    *Django task results* lists it), linked to its page: the attempts of one result are one
    item, each row links it."""
    if path is None:  # pruned after RESULT_RETENTION
        return format_html(
            '<small>{}</small> <span title="{}">{}</span>', _("result"), result_id, short_result_id(result_id)
        )
    url = reverse("admin:django_taskloop_taskrecord_change", args=[result_id], current_app=site_name)
    return format_html(
        '<a href="{}" title="{} {}">{} <small>{} {}</small></a>',
        url,
        path,
        result_id,
        path.rsplit(".", 1)[-1],
        _("result"),
        short_result_id(result_id),
    )


def _item_url(failure: Failure, site_name: str) -> str | None:
    try:
        if failure.kind == "task":
            task = (
                Task.objects.filter(pk=int(failure.item)).only("pk").first()
                if failure.item.isdigit()
                else None
            )
            if task is not None:
                return reverse("admin:django_taskloop_task_change", args=[task.pk], current_app=site_name)
            return None
        if failure.kind == "job":
            job = Job.objects.filter(uuid=failure.item).only("pk").first()
            if job is not None:
                return reverse("admin:django_taskloop_job_change", args=[job.pk], current_app=site_name)
            return None
        app_label, _dot, model_name = failure.queue.partition(".")
        return reverse(f"admin:{app_label}_{model_name}_change", args=[failure.item], current_app=site_name)
    except NoReverseMatch:
        return None


class WorkerProcessAdmin(ModelAdmin):
    """The worker processes alive now: host, pid, since when, last heartbeat, what they hold."""

    list_display = ("identity", "host", "pid", "up_for", "last_beat", "serves", "holds", "reported")
    ordering = ("host", "pid")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return super().get_queryset(request).filter(pk__in=WorkerProcess.objects.alive().values("pk"))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def _now(self) -> Any:
        return db_now()

    @admin.display(description=_("up for"))
    def up_for(self, obj: WorkerProcess) -> str:
        return humanize_seconds(seconds_between(self._now(), obj.started))

    @admin.display(description=_("last heartbeat"))
    def last_beat(self, obj: WorkerProcess) -> str:
        return format_html("{} {}", humanize_seconds(seconds_between(self._now(), obj.beat_at)), _("ago"))

    @admin.display(description=_("serves"))
    def serves(self, obj: WorkerProcess) -> str:
        return served_text(obj.queues)

    @admin.display(description=_("holds now"))
    def holds(self, obj: WorkerProcess) -> str:
        return held_text(obj.holding)

    @admin.display(description=_("progress"))
    def reported(self, obj: WorkerProcess) -> str:
        # What its running handlers reported: the row holds it, no query per worker.
        entries = [entry for entry in obj.progress or () if isinstance(entry, dict)]
        return (
            format_html_join(
                mark_safe("<br>"),
                "{} {}: {}",
                (
                    (
                        entry["kind"],
                        f"{entry['item']} of {_queue_title(entry['kind'] + ':' + entry['queue'])}",
                        _progress_bar(float(entry["fraction"]), entry.get("message", "")),
                    )
                    for entry in entries
                ),
            )
            or "—"
        )


def register(site: admin.AdminSite) -> None:
    for model, model_admin in ((Failure, FailureAdmin), (WorkerProcess, WorkerProcessAdmin)):
        if not site.is_registered(model):
            site.register(model, model_admin)
