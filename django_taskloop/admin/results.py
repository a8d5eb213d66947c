"""Admin of Django Tasks results (``TaskRecord``): status, call, return value, every attempt.

- Filter by status, queue and task; search by result id.
- Each result's page shows its arguments, its return value and every failed attempt with its
  traceback (``TaskResult.errors``), and which workers ran it.
- "Retry" runs a FAILED task once more as a new attempt of the same result
  (:meth:`TaskloopBackend.retry`): the id callers hold stays valid.
- Finished results are kept ``TASKLOOP["RESULT_RETENTION"]`` seconds and pruned by
  ``manage.py reap_locks``: the list and each page say until when.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext_lazy as _

from ..backends import short_result_id, taskloop_backend, taskloop_backends, waiting_results
from ..conf import setting
from ..models import TaskRecord, TaskRecordStatus
from ..stats import TASKS_TUBE_PREFIXES
from .base import ModelAdmin, TaskloopAdminMixin, humanize_seconds, state_badge
from .operating import progress_html

__all__ = ["TaskRecordAdmin", "register"]

#: The results list counts the tasks that wait to start up to this many ("more than" beyond).
WAITING_COUNT_CAP = 10_000

#: How many of the newest tasks that wait to start the results list shows above the results.
WAITING_SHOWN = 5

#: The colour (admin.css class) of each status: the tubes' colours for the same meaning.
STATUS_CSS: dict[str, str] = {
    TaskRecordStatus.READY: "ready",
    TaskRecordStatus.RUNNING: "taken",
    TaskRecordStatus.FAILED: "failed",
    TaskRecordStatus.SUCCESSFUL: "done",
}


def _pretty(value: Any) -> str:
    return format_html('<pre class="tl-value">{}</pre>', json.dumps(value, indent=2, sort_keys=True))


class QueueFilter(admin.SimpleListFilter):
    """The queues of the configured backends (no scan of the results for distinct names)."""

    title = _("queue")
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        queues: set[str] = set()
        for backend in taskloop_backends():
            queues |= set(backend.queues)
        return [(q, q) for q in sorted(queues)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(queue_name=self.value()) if self.value() else queryset


class TaskPathFilter(admin.SimpleListFilter):
    """The tasks enqueued lately (the 30 most recent paths, read from the newest results)."""

    title = _("task")
    parameter_name = "task"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        recent = TaskRecord.objects.order_by("-enqueued_at").values_list("task_path", flat=True)[:2000]
        seen: dict[str, None] = {}
        for path in recent:
            seen.setdefault(path, None)
            if len(seen) >= 30:
                break
        return [(path, path.rsplit(".", 1)[-1]) for path in sorted(seen)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(task_path=self.value()) if self.value() else queryset


class TaskRecordAdmin(TaskloopAdminMixin, ModelAdmin):
    """Results of Django Tasks, newest first, with every attempt and a retry action."""

    # "kept until" is on each result's page; the list says the retention at its top.
    list_display = ("short_id", "task_name", "queue_name", "status_badge", "attempt_count", "enqueued")
    list_filter = ("status", QueueFilter, TaskPathFilter)
    search_fields = ("=id",)
    search_help_text = _("A result id.")
    ordering = ("-enqueued_at",)
    sortable_by = ("enqueued",)
    read_only_page = True
    #: The list with the tasks that wait to start above it.
    change_list_template = "admin/django_taskloop/taskrecord/change_list.html"
    actions = ["retry_tasks"]
    readonly_fields = (
        "id",
        "task_path",
        "backend",
        "queue_name",
        "priority",
        "status_badge",
        "progress",
        "args_block",
        "kwargs_block",
        "return_value_block",
        "attempts_block",
        "enqueued_at",
        "run_after",
        "started_at",
        "last_attempted_at",
        "finished_at",
        "kept_until",
    )
    fields = readonly_fields

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # enqueue() makes them

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        retention = float(setting("RESULT_RETENTION"))
        # Tasks no worker has started wait in their queues' tubes, which carry their calls
        # (one-row enqueues): shown above the list, and found by an exact id search.
        searched = request.GET.get("q", "").strip() or None
        waiting_count, waiting = 0, list[TaskRecord]()
        if searched is not None:
            waiting_count, waiting = waiting_results(result_id=searched)
        elif request.GET.get("status__exact", TaskRecordStatus.READY) == TaskRecordStatus.READY:
            # (Not under another status's filter, where they would be in the way.)
            waiting_count, waiting = waiting_results(
                limit=WAITING_SHOWN,
                cap=WAITING_COUNT_CAP,
                # The list's queue and task filters hold for them too.
                queue_name=request.GET.get("queue") or None,
                task_path=request.GET.get("task") or None,
            )
        extra_context = {
            **(extra_context or {}),
            # Not "subtitle": the admin puts that in the browser's <title>.
            "taskloop_retention": _(
                "Finished results are kept %(time)s, then pruned by manage.py reap_locks."
            )
            % {"time": humanize_seconds(retention)},
            "waiting": [
                (record, short_result_id(record.id), self.status_badge(record), self.enqueued(record))
                for record in waiting
            ],
            "waiting_count": f"{waiting_count:,}",
            "waiting_more": waiting_count > len(waiting),
            "waiting_capped": waiting_count >= WAITING_COUNT_CAP,
        }
        return super().changelist_view(request, extra_context)

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Any:
        """A result, or one that waits to start (read off its tube task, as get_result())."""
        found = super().get_object(request, object_id, from_field)
        if found is None and from_field is None:
            waiting = waiting_results(result_id=object_id)[1]
            found = waiting[0] if waiting else None
        return found

    def get_retry(self, obj: TaskRecord) -> Any:
        """A FAILED result's page offers the retry the list's action does."""
        if obj.status != TaskRecordStatus.FAILED:
            return None
        return (
            str(_("Retry: a new attempt of this result")),
            lambda: taskloop_backend(obj.backend).retry(obj.id),
        )

    @admin.display(description=_("enqueued at"), ordering="enqueued_at")
    def enqueued(self, obj: TaskRecord) -> str:
        return self.when(obj.enqueued_at)

    @admin.display(description=_("id"))
    def short_id(self, obj: TaskRecord) -> str:
        return short_result_id(obj.id)

    @admin.display(description=_("task"))
    def task_name(self, obj: TaskRecord) -> str:
        return format_html('<span title="{}">{}</span>', obj.task_path, obj.task_path.rsplit(".", 1)[-1])

    @admin.display(description=_("progress"))
    def progress(self, obj: TaskRecord) -> str:
        # Reported by the handler running it now, in either tube of its queue.
        return progress_html("task", [prefix + obj.queue_name for prefix in TASKS_TUBE_PREFIXES], obj.pk)

    @admin.display(description=_("status"))
    def status_badge(self, obj: TaskRecord) -> str:
        # A READY task past its ttl is FAILED already (TaskRecord.expiry, the one definition
        # get_result() reads too), though no worker has reached it to write so.
        if obj.status == TaskRecordStatus.READY and obj.ttl is not None:
            if obj.expiry(self.now()) is not None:
                return state_badge(str(_("Failed (ttl ran out)")), "failed")
        return state_badge(obj.get_status_display(), STATUS_CSS.get(obj.status, "ready"))

    @admin.display(description=_("attempts"))
    def attempt_count(self, obj: TaskRecord) -> int:
        # As the result's page counts them: a worker started each, a failed one left an error.
        return max(len(obj.worker_ids or []), len(obj.errors or []))

    @admin.display(description=_("kept until"))
    def kept_until(self, obj: TaskRecord) -> str:
        if obj.finished_at is None or obj.status not in (
            TaskRecordStatus.SUCCESSFUL,
            TaskRecordStatus.FAILED,
        ):
            return "—"
        until = obj.finished_at + dt.timedelta(seconds=float(setting("RESULT_RETENTION")))
        return until.strftime("%Y-%m-%d %H:%M")

    @admin.display(description=_("args"))
    def args_block(self, obj: TaskRecord) -> str:
        return _pretty(obj.args)

    @admin.display(description=_("kwargs"))
    def kwargs_block(self, obj: TaskRecord) -> str:
        return _pretty(obj.kwargs)

    @admin.display(description=_("return value"))
    def return_value_block(self, obj: TaskRecord) -> str:
        if obj.status != TaskRecordStatus.SUCCESSFUL:
            return "—"
        return _pretty(obj.return_value)

    @admin.display(description=_("attempts"))
    def attempts_block(self, obj: TaskRecord) -> str:
        """Every attempt: the worker that ran it and, for each failed one, its traceback."""
        workers = list(obj.worker_ids or [])
        errors = list(obj.errors or [])
        if not workers and not errors:
            return "—"
        rows = []
        for n in range(max(len(workers), len(errors))):
            worker = workers[n] if n < len(workers) else "—"
            if n < len(errors):
                error = errors[n]
                outcome = format_html(
                    '<code>{}</code><pre class="tl-traceback">{}</pre>',
                    error.get("exception_class_path", ""),
                    error.get("traceback", ""),
                )
            elif obj.status == TaskRecordStatus.SUCCESSFUL and n == len(workers) - 1:
                outcome = format_html("{}", _("succeeded"))
            else:
                outcome = format_html("{}", _("running or interrupted"))
            rows.append((n + 1, worker, outcome))
        return format_html(
            '<table class="tl-attempts"><thead><tr><th>{}</th><th>{}</th><th>{}</th></tr></thead>'
            "<tbody>{}</tbody></table>",
            _("attempt"),
            _("worker"),
            _("outcome"),
            format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td></tr>", rows),
        )

    @admin.action(description=_("Retry (a new attempt of the same result)"), permissions=["change"])
    def retry_tasks(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        retried, refused = 0, []
        for record in queryset.only("id", "backend"):
            try:
                taskloop_backend(record.backend).retry(record.id)
                retried += 1
            except Exception as error:  # refusals become messages; nothing else changes
                refused.append(f"{short_result_id(record.id)}: {error}")
        if retried:
            self.message_user(request, f"Retried {retried} task(s).", messages.SUCCESS)
        for reason in refused:
            self.message_user(request, reason, messages.ERROR)


def register(site: admin.AdminSite) -> None:
    if not site.is_registered(TaskRecord):
        site.register(TaskRecord, TaskRecordAdmin)
