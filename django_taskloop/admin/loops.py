"""Admin of task loops: every concrete ``TaskLoop`` subclass, registered automatically."""

from __future__ import annotations

import datetime as dt
import sys
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import F, Min, Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path
from django.utils.module_loading import module_has_submodule
from django.utils.translation import gettext_lazy as _
from rangefilter.filters import DateTimeRangeFilterBuilder

from ..engine import DbNow, db_now
from .base import (
    Retry,
    TaskloopModelAdmin,
    count_text,
    dashboard_url,
    humanize_seconds,
    seconds_between,
    state_badge,
    until_cell,
)
from .charts import bar_chart
from .paginator import EstimatedCountPaginator

if TYPE_CHECKING:
    from ..models import TaskLoop

__all__ = ["LoopStateFilter", "TaskLoopAdmin", "loop_models", "loop_overview", "register_loops"]

# Buckets of "time until the lock ends", for the lock-age chart.
LOCK_BUCKETS = ((60, "< 1 min"), (600, "1–10 min"), (3600, "10–60 min"), (6 * 3600, "1–6 h"), (None, "> 6 h"))
# Counting beyond this many rows of one state is not worth a slow page: show "10,000 (≥)".
STATE_COUNT_CAP = 10_000
# The dashboard shows every queue at once: it stops counting sooner.
DASHBOARD_COUNT_CAP = 5_000


def loop_state(obj: TaskLoop, now: dt.datetime) -> str:
    """Return the state of a loop row: ``new``, ``idle``, ``locked`` or ``bumped``."""
    if obj.lock_until is None:
        return "new" if obj.last_updated is None else "idle"
    return "locked" if obj.lock_until > now else "bumped"


LOOP_STATES = {
    # Each is a range of the loop's claim index (lock_until, last_updated, id).
    "new": Q(lock_until__isnull=True, last_updated__isnull=True),
    "idle": Q(lock_until__isnull=True, last_updated__isnull=False),
    "locked": Q(lock_until__gt=DbNow()),
    "bumped": Q(lock_until__lte=DbNow()),
}


class LoopStateFilter(admin.SimpleListFilter):
    """New, idle, locked or bumped (bumped includes expired locks)."""

    title = _("state")
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [(name, _(name)) for name in LOOP_STATES]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        condition = LOOP_STATES.get(self.value() or "")
        return queryset if condition is None else queryset.filter(condition)


def capped_count(queryset: QuerySet[Any], cap: int = STATE_COUNT_CAP) -> tuple[int, bool]:
    """Return ``(count, exact)``, counting at most ``cap + 1`` rows."""
    count = queryset.order_by()[: cap + 1].count()
    return (cap, False) if count > cap else (count, True)


def loop_overview(
    model: Any, using: str | None = None, *, full_stats: bool = True, cap: int = STATE_COUNT_CAP
) -> dict[str, Any]:
    """Return a loop's depth by state, its lock ages and (``full_stats``) doloop's ``stats()``.

    Every figure reads an index range or stops counting at :data:`STATE_COUNT_CAP`: none of
    them counts a whole big table. Without ``full_stats`` (the dashboard) only the two
    figures it shows are read, each as one end of the claim index.
    """
    manager = model._default_manager if using is None else model._default_manager.db_manager(using)
    depth = {name: capped_count(manager.filter(condition), cap) for name, condition in LOOP_STATES.items()}
    if full_stats:
        stats = manager.stats()
        depth["locked"] = (stats["locked"], True)
        depth["bumped"] = (stats["bumped"], True)
    else:
        now = db_now(manager.db)
        # Each one row from one end of an index range (a filtered MIN/MAX scans the table).
        lock_until = manager.order_by().values_list("lock_until", flat=True)
        # Skipped when the depth already says there is nothing to find.
        oldest_bump = (
            depth["bumped"][0] and lock_until.filter(lock_until__lte=now).order_by("lock_until").first()
        )
        last_lock = (
            depth["locked"][0] and lock_until.filter(lock_until__gt=now).order_by("-lock_until").first()
        )
        stats = {
            "max_bump_time": seconds_between(now, oldest_bump or None) or 0.0,
            "max_lock_time": seconds_between(last_lock or None, now) or 0.0,
        }
    # One range of the claim index per bucket, each counted up to the cap: a CASE aggregate
    # over every locked row would read them all.
    ages = {}
    lower = 0
    for upper, label in LOCK_BUCKETS:
        condition = Q(lock_until__gt=DbNow(lower))
        if upper is not None:
            condition &= Q(lock_until__lte=DbNow(upper))
        ages[label] = capped_count(manager.filter(condition), cap)[0] if depth["locked"][0] else 0
        lower = upper or lower
    return {"stats": stats, "depth": depth, "lock_ages": ages}


def depth_chart(depth: dict[str, tuple[int, bool]], title: str) -> Any:
    return bar_chart(
        [
            (name if exact else f"{name} ({count_text(count, exact)})", count)
            for name, (count, exact) in depth.items()
        ],
        title=title,
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

    list_display = ("pk_display", "loop_state", "last_updated", "since_updated", "lock_until", "lock_ends")
    list_filter = (
        LoopStateFilter,
        ("lock_until", DateTimeRangeFilterBuilder(title=_("lock until"))),
        ("last_updated", DateTimeRangeFilterBuilder(title=_("last updated"))),
    )
    # Sorting by an unindexed column would sort the whole table: only the primary key and
    # the claim index's leading column are offered.
    sortable_by = ("pk_display", "lock_until", "lock_ends")
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
        return [field.name for field in self.model._meta.fields] + ["loop_state", "lock_ends", "failures"]

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
        from .operating import failure_history

        return failure_history((type(obj), obj.pk), self.admin_site.name)

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


def loop_models() -> list[Any]:
    """Return every concrete ``TaskLoop`` subclass of the installed apps."""
    from ..models import TaskLoop

    return [m for m in apps.get_models() if issubclass(m, TaskLoop) and not m._meta.proxy]


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
    site.get_urls = get_urls  # type: ignore[method-assign]
    site._taskloop_hooked = True  # type: ignore[attr-defined]
