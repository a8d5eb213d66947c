"""Admin of schedules: each ``@periodic`` function and ``TASKLOOP["SCHEDULE"]`` entry with its
next and last run; actions run one now (exactly one worker runs it), pause and resume."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.text import Truncator
from django.utils.translation import gettext_lazy as _

from ..models import Schedule
from .base import ModelAdmin, TaskloopAdminMixin, state_badge, until_cell

__all__ = ["ScheduleAdmin", "register"]


class ScheduleAdmin(TaskloopAdminMixin, ModelAdmin):
    """The schedules, by name: what runs when, whether paused, the last error."""

    list_display = ("name", "kind", "cron_cell", "next_run", "last_run", "state", "runs", "error_preview")
    list_filter = ("kind", "paused")
    search_fields = ("name", "target")
    ordering = ("name",)
    sortable_by = ("name", "next_run_at", "last_run_at")
    readonly_fields = (
        "name",
        "kind",
        "target",
        "cron",
        "time_zone",
        "next_run_at",
        "last_run_at",
        "runs",
        "paused",
        "last_error",
    )
    fields = readonly_fields
    read_only_page = True
    actions = ["run_now", "pause_schedules", "resume_schedules"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # schedules are declared in code and settings

    @admin.display(description=_("cron"))
    def cron_cell(self, obj: Schedule) -> str:
        zone = "" if obj.time_zone == "UTC" else f" {obj.time_zone}"
        return format_html("<code>{}</code>{}", obj.cron, zone)

    @admin.display(description=_("next run"), ordering="next_run_at")
    def next_run(self, obj: Schedule) -> str:
        if obj.paused:
            return "—"
        return until_cell(obj.next_run_at, self.now())

    @admin.display(description=_("last run"), ordering="last_run_at")
    def last_run(self, obj: Schedule) -> str:
        return until_cell(obj.last_run_at, self.now())

    @admin.display(description=_("state"))
    def state(self, obj: Schedule) -> str:
        return state_badge(str(_("paused")), "idle") if obj.paused else state_badge(str(_("active")), "ready")

    @admin.display(description=_("last error"))
    def error_preview(self, obj: Schedule) -> str:
        return Truncator(obj.last_error).chars(80) or "—"

    def _each(self, request: HttpRequest, queryset: QuerySet[Any], verb: Any, done: str) -> None:
        self.run_each(request, queryset, lambda row: verb(row.name, using=row._state.db), str, done)

    @admin.action(description=_("Run now (once, by the first worker to look)"), permissions=["change"])
    def run_now(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._each(request, queryset, Schedule.objects.run_now, str(_("%(n)d schedule(s) due now.")))

    @admin.action(description=_("Pause: no tick runs"), permissions=["change"])
    def pause_schedules(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._each(request, queryset, Schedule.objects.pause, str(_("%(n)d schedule(s) paused.")))

    @admin.action(description=_("Resume (from the next tick)"), permissions=["change"])
    def resume_schedules(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._each(request, queryset, Schedule.objects.resume, str(_("%(n)d schedule(s) resumed.")))


def register(site: admin.AdminSite) -> None:
    if not site.is_registered(Schedule):
        site.register(Schedule, ScheduleAdmin)
