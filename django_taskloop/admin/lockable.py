"""``LockableAdmin``: locks of your own :class:`~django_taskloop.models.Lockable` models."""

from __future__ import annotations

from typing import Any, cast

from django.contrib import admin
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _
from rangefilter.filters import DateTimeRangeFilterBuilder

from ..engine import DbNow
from ..models.lockable import Lockable, LockableQuerySet
from .base import TaskloopModelAdmin, state_badge, until_cell

__all__ = ["LockableAdmin", "LockStateFilter"]


class LockStateFilter(admin.SimpleListFilter):
    """Locked (unexpired lease), expired (lease ended, not yet released) or free."""

    title = _("lock")
    parameter_name = "lock"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("locked", _("locked")), ("expired", _("expired lock")), ("free", _("free"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        # Every branch reads the lock_expires_at / locked_by indexes of Lockable.
        if self.value() == "locked":
            return queryset.filter(lock_expires_at__gt=DbNow())
        if self.value() == "expired":
            return queryset.filter(lock_expires_at__lte=DbNow())
        if self.value() == "free":
            return queryset.filter(Q(locked_by__isnull=True) | Q(lock_expires_at__lte=DbNow()))
        return queryset


class LockableAdmin(TaskloopModelAdmin):
    """Admin of a ``Lockable`` model: lock columns, lock filters and a "release" action.

    Subclass it as you would ``ModelAdmin``; the lock columns and filters are appended to
    your ``list_display`` and ``list_filter``::

        @admin.register(Article)
        class ArticleAdmin(LockableAdmin):
            list_display = ["title", "reviewed"]
    """

    lock_columns = ("lock_state", "locked_by", "lock_expires_at", "lock_ends")
    lock_filters: tuple[Any, ...] = (
        LockStateFilter,
        ("lock_expires_at", DateTimeRangeFilterBuilder(title=_("lock expires"))),
    )
    actions = ["release_locks"]
    readonly_fields = ("locked_by", "lock_expires_at")

    def get_list_display(self, request: HttpRequest) -> Any:
        base = [c for c in super().get_list_display(request) if c not in self.lock_columns]
        return [*base, *self.lock_columns]

    def get_list_filter(self, request: HttpRequest) -> Any:
        return [*super().get_list_filter(request), *self.lock_filters]

    @admin.display(description=_("lock"))
    def lock_state(self, obj: Lockable) -> str:
        now = self.now()
        if obj.lock_expires_at is None and not obj.locked_by:
            return state_badge(_("free"), "free")
        if obj.lock_expires_at is not None and obj.lock_expires_at > now:
            return state_badge(_("locked"), "locked")
        return state_badge(_("expired"), "expired")

    @admin.display(description=_("lock ends"), ordering="lock_expires_at")
    def lock_ends(self, obj: Lockable) -> str:
        return until_cell(obj.lock_expires_at, self.now())

    @admin.action(description=_("Release the locks of the selected rows"), permissions=["change"])
    def release_locks(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self.run_verb(
            request,
            lambda: cast(LockableQuerySet, queryset).release(),
            lambda count: f"Released {count} lock(s).",
        )
