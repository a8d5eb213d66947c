"""Admin of task loops: every concrete ``TaskLoop`` subclass, registered automatically."""

from __future__ import annotations

import datetime as dt
import sys
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import F, Min, QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path
from django.utils.module_loading import module_has_submodule
from django.utils.translation import gettext_lazy as _
from rangefilter.filters import DateTimeRangeFilterBuilder

from ..models.loops import TaskLoopQuerySet
from ..stats import LOOP_STATES, lock_ages, loop_models, loop_summary
from .base import (
    Retry,
    TaskloopModelAdmin,
    count_text,
    dashboard_url,
    humanize_seconds,
    seconds_between,
    state_badge,
    until_cell,
    when_cell,
)
from .charts import bar_chart
from .operating import failure_history, progress_html
from .paginator import EstimatedCountPaginator

if TYPE_CHECKING:
    from ..models import TaskLoop

__all__ = ["LoopStateFilter", "TaskLoopAdmin", "loop_models", "loop_overview", "register_loops"]

# Counting beyond this many rows of one state is not worth a slow page: show "10,000 (≥)".
STATE_COUNT_CAP = 10_000
# The dashboard shows every queue at once: it stops counting sooner.
DASHBOARD_COUNT_CAP = 5_000


def loop_state(obj: TaskLoop, now: dt.datetime) -> str:
    """Return the state of a loop row: ``new``, ``idle``, ``locked`` or ``bumped``."""
    if obj.lock_until is None:
        return "new" if obj.last_updated is None else "idle"
    return "locked" if obj.lock_until > now else "bumped"


class LoopStateFilter(admin.SimpleListFilter):
    """New, idle, locked or bumped (bumped includes expired locks)."""

    title = _("state")
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [(name, _(name)) for name in LOOP_STATES]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(TaskLoopQuerySet.state_condition(value)) if value in LOOP_STATES else queryset


def loop_overview(model: Any, using: str | None = None, *, cap: int = STATE_COUNT_CAP) -> dict[str, Any]:
    """Return a loop's doloop ``stats()``, its depth by state and its lock ages.

    The depth is the read model's (:func:`django_taskloop.stats.loop_summary`), each count
    stopping at ``cap`` except ``locked`` and ``bumped``, which ``stats()`` counts (few rows).
    """
    summary = loop_summary(model, using, cap=cap)
    stats = model._default_manager.db_manager(summary.using).stats()
    depth = {**summary.depth(), "locked": (stats["locked"], True), "bumped": (stats["bumped"], True)}
    return {"stats": stats, "depth": depth, "lock_ages": lock_ages(model, summary.using, cap=cap)}


def depth_chart(depth: dict[str, tuple[int, bool]], title: str) -> Any:
    return bar_chart(
        [
            (name if exact else f"{name} ({count_text(count, exact)})", count)
            for name, (count, exact) in depth.items()
        ],
        title=title,
        states=list(depth),  # each bar in its state's colour, as the badges
    )


class LoopChangeList(ChangeList):
    """A change list whose sort by ``lock_until`` follows the claim index to the end.

    Django makes every sort total by appending ``-pk``; ``lock_until, -id`` is no prefix of
    the index (lock_until, last_updated, id), so the database would sort the whole table.
    ``lock_until, last_updated, id`` (each way, NULLs placed as the index has them) is.
    """

    def get_ordering(self, request: HttpRequest, queryset: QuerySet[Any]) -> list[Any]:
        ordering = super().get_ordering(request, queryset)
        if not ordering or ordering[0] not in ("lock_until", "-lock_until"):
            return ordering
        if ordering[0] == "-lock_until":
            return [F("lock_until").desc(), F("last_updated").desc(nulls_last=True), "-pk"]
        return [F("lock_until").asc(), F("last_updated").asc(nulls_first=True), "pk"]


class TaskLoopAdmin(TaskloopModelAdmin):
    """Admin of a ``TaskLoop`` model: states, locks, and doloop's verbs as actions.

    Registered for every loop automatically; subclass it to register your own::

        @admin.register(SiteLoop)
        class SiteLoopAdmin(TaskLoopAdmin):
            list_per_page = 100
    """

    list_display = ("pk_display", "loop_state", "updated", "lock_until_at", "lock_ends")
    list_filter = (
        LoopStateFilter,
        ("lock_until", DateTimeRangeFilterBuilder(title=_("lock until"))),
        ("last_updated", DateTimeRangeFilterBuilder(title=_("last updated"))),
    )
    # Sorting by an unindexed column would sort the whole table: only the primary key and
    # the claim index's leading column are offered.
    sortable_by = ("pk_display", "lock_until_at", "lock_ends")
    ordering = ("-pk",)
    search_fields = ("=pk",)
    search_help_text = _("An id.")
    actions = ["bump_now", "bump_to_top", "unlock_ids", "mark_done", "remove_ids"]
    paginator = EstimatedCountPaginator

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[Any], search_term: str) -> Any:
        # An exact primary-key match (one index read), whatever the key's type; a term that
        # is no valid id matches nothing rather than raising.
        term = search_term.strip()
        if not term:
            return queryset, False
        pk = self.model._meta.pk
        target = pk.target_field if pk.is_relation else pk
        try:
            value = target.to_python(term)
        except ValidationError:
            return queryset.none(), False
        return queryset.filter(pk=value), False

    def get_ordering(self, request: HttpRequest) -> Any:
        return (f"-{self.model._meta.pk.name}",)

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return LoopChangeList

    def has_add_permission(self, request: HttpRequest) -> bool:
        # Ids join a loop through add()/did()/bump(), which workers and code call.
        return False

    def get_readonly_fields(self, request: HttpRequest, obj: TaskLoop | None = None) -> list[str]:
        return [field.name for field in self.model._meta.fields] + [
            "loop_state",
            "lock_ends",
            "progress",
            "failures",
        ]

    def get_paused_note(self, request: HttpRequest) -> str | None:
        if self.model._default_manager.paused():
            return str(_("Workers are paused on this loop: resume it from the dashboard."))
        return None

    def get_retry(self, obj: TaskLoop) -> Retry:
        # A loop id never gives up; "retry" is to run it at once (bump it to now).
        return (
            str(_("Retry now: bump this id")),
            lambda: type(obj).objects.bump(obj.pk, lock_for=0, auto_add=False),
        )

    @admin.display(description=_("attempts and failures"))
    def failures(self, obj: TaskLoop) -> str:
        return failure_history((type(obj), obj.pk), self.admin_site.name)

    @admin.display(description=_("progress"))
    def progress(self, obj: TaskLoop) -> str:
        return progress_html("loop", type(obj)._meta.label_lower, obj.pk)

    @admin.display(description=_("id"), ordering="pk")
    def pk_display(self, obj: TaskLoop) -> object:
        return obj.pk

    @admin.display(description=_("state"))
    def loop_state(self, obj: TaskLoop) -> str:
        state = loop_state(obj, self.now())
        return state_badge(_(state), state)

    @admin.display(description=_("since updated"))
    def since_updated(self, obj: TaskLoop) -> str:
        return humanize_seconds(seconds_between(self.now(), obj.last_updated))

    @admin.display(description=_("last updated"))
    def updated(self, obj: TaskLoop) -> str:
        return when_cell(obj.last_updated, self.now())

    @admin.display(description=_("lock until"), ordering="lock_until")
    def lock_until_at(self, obj: TaskLoop) -> str:
        return when_cell(obj.lock_until, self.now(), ago=False)

    @admin.display(description=_("lock ends"), ordering="lock_until")
    def lock_ends(self, obj: TaskLoop) -> str:
        return until_cell(obj.lock_until, self.now())

    # -- actions: each one calls the manager's verb with the selected ids -------------

    def _ids(self, queryset: QuerySet[Any]) -> list[Any]:
        return list(queryset.values_list("pk", flat=True))

    def _manager(self, queryset: QuerySet[Any]) -> Any:
        return self.model._default_manager.db_manager(queryset.db)

    @admin.action(description=_("Bump: make claimable now"), permissions=["change"])
    def bump_now(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        ids = self._ids(queryset)
        self.run_verb(
            request,
            lambda: self._manager(queryset).bump(ids, auto_add=False),
            lambda n: (
                f"Bumped {n} of {len(ids)} id(s)."
                + ("" if n == len(ids) else " The others were already due sooner: a bump never postpones.")
            ),
        )

    @admin.action(description=_("Bump to the top: claimed before everything else"), permissions=["change"])
    def bump_to_top(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        ids = self._ids(queryset)
        manager = self._manager(queryset)
        now = self.db_now(request, queryset.db)
        # Claims take the oldest lock_until first: go one second ahead of the current head
        # (one index read), rather than an arbitrary huge negative number.
        head = manager.aggregate(head=Min("lock_until"))["head"]
        lock_for = min(0.0, (seconds_between(head, now) or 0.0) - 1.0)
        self.run_verb(
            request,
            lambda: manager.bump(ids, lock_for=lock_for, auto_add=False),
            lambda n: f"Moved {n} id(s) to the top of the loop.",
        )

    @admin.action(description=_("Unlock (keep their place)"), permissions=["change"])
    def unlock_ids(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        ids = self._ids(queryset)
        self.run_verb(
            request,
            lambda: self._manager(queryset).unlock(ids, auto_add=False),
            lambda n: f"Unlocked {n} id(s).",
        )

    @admin.action(description=_("Mark done now (did)"), permissions=["change"])
    def mark_done(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        ids = self._ids(queryset)
        self.run_verb(
            request,
            lambda: self._manager(queryset).did(ids, auto_add=False),
            lambda n: f"Marked {n} id(s) done.",
        )

    @admin.action(description=_("Remove from the loop"), permissions=["delete"])
    def remove_ids(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        ids = self._ids(queryset)
        self.run_verb(
            request,
            lambda: self._manager(queryset).remove(ids),
            lambda n: f"Removed {n} id(s) from the loop.",
        )

    # -- stats page ------------------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        return [
            path("stats/", self.admin_site.admin_view(self.stats_view), name=self.url_name("stats")),
            *super().get_urls(),
        ]

    def get_taskloop_links(self, request: HttpRequest) -> list[tuple[str, str]]:
        return [(str(_("Statistics")), self.admin_url("stats")), *super().get_taskloop_links(request)]

    def stats_view(self, request: HttpRequest) -> HttpResponse:
        """Show doloop's ``stats()`` of this loop, its depth by state and its lock ages."""
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        overview = loop_overview(self.model)
        stats = overview["stats"]
        rows = []
        for key, value in stats.items():
            shown = value
            if key.endswith("_time"):
                shown = f"{value:.3f} s ({humanize_seconds(value)})"
            rows.append((key, shown))
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": _("Statistics of %(name)s") % {"name": self.opts.verbose_name_plural},
            "rows": rows,
            "charts": [
                depth_chart(overview["depth"], str(_("Queue depth by state"))),
                bar_chart(list(overview["lock_ages"].items()), title=str(_("Locks by time until they end"))),
            ],
            "changelist_url": self.admin_url("changelist"),
            "dashboard_url": dashboard_url(self.admin_site),
            "has_view_permission": True,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/django_taskloop/stats.html", context)


def register_loops(site: admin.AdminSite | None = None, *, pending_ok: bool = True) -> list[Any]:
    """Register :class:`TaskLoopAdmin` for every loop that ``site`` does not have yet.

    Called when django-taskloop's ``admin`` module is imported by ``autodiscover()``, and
    idempotent so that an ``AppConfig.ready()`` may call it again once every app's admin has
    run. While autodiscover is still going, a loop whose app has an ``admin`` module not yet
    imported is left for that module (``pending_ok``): the project may register its own admin
    there without ``AlreadyRegistered``. Return the models registered now.
    """
    site = site or admin.site
    registered = []
    for model in loop_models():
        if site.is_registered(model):
            continue
        app_config = apps.get_app_config(model._meta.app_label)
        own_admin = f"{app_config.name}.admin"
        if (
            pending_ok
            and own_admin not in sys.modules
            and app_config.module is not None
            and module_has_submodule(app_config.module, "admin")
        ):
            continue
        site.register(model, TaskLoopAdmin)
        registered.append(model)
    return registered


def register_loops_when_urls_are_built(site: admin.AdminSite) -> None:
    """Run :func:`register_loops` on ``site`` once more, just before it builds its URLs.

    ``autodiscover()`` imports every app's ``admin`` module before any URLconf is loaded, so
    at that moment every project-registered loop admin is known: whatever has none gets
    :class:`TaskLoopAdmin`, in whatever order the apps are installed.
    """
    if getattr(site, "_taskloop_hooked", False):
        return
    build_urls = site.get_urls

    def get_urls() -> list[Any]:
        register_loops(site, pending_ok=False)
        return build_urls()

    # Set on the instance: a project's AdminSite subclass keeps its own get_urls.
    site.get_urls = get_urls  # type: ignore[method-assign]  # its URLs, extended
    site._taskloop_hooked = True  # type: ignore[attr-defined]  # a marker: hooked once
