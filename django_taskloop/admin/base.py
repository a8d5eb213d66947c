"""What every django-taskloop admin shares: the database clock, fast pagination, safe actions."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db.models import Model, QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import NoReverseMatch, URLPattern, reverse
from django.utils.functional import Promise
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _

from ..engine import db_now
from ..exceptions import TaskloopError
from ..human import duration
from ..queues import Queue
from .display import ago_text, when_cell, when_text
from .paginator import EstimatedCountPaginator

if TYPE_CHECKING:
    # django-stubs makes these generic (the model, the form's model, the page's object); Django
    # does not subscript them at run time, so the subscripted names exist for mypy only.
    ModelAdmin = admin.ModelAdmin[Any]
    ModelForm = forms.ModelForm[Any]
else:
    ModelAdmin, ModelForm = admin.ModelAdmin, forms.ModelForm

_NOW: ContextVar[dt.datetime | None] = ContextVar("taskloop_admin_now", default=None)

#: What an item's page offers as its retry button: ``(label, verb)``, or ``None``.
Retry = tuple[str, Callable[[], object]] | None

__all__ = [
    "ModelAdmin",
    "ModelForm",
    "dashboard_url",
    "TaskloopAdminMixin",
    "TaskloopModelAdmin",
    "QueueRowsAdmin",
    "humanize_seconds",
    "seconds_between",
    "state_badge",
    "count_text",
    "until_cell",
    "ago_text",
    "when_cell",
    "when_text",
]


def seconds_between(later: dt.datetime | None, earlier: dt.datetime | None) -> float | None:
    """Return ``later - earlier`` in seconds, or ``None`` if either is missing."""
    if later is None or earlier is None:
        return None
    return (later - earlier).total_seconds()


#: The admin says a duration as the terminal does (``2 min``, ``3 h 05 min``): one spelling.
humanize_seconds = duration


class TaskloopModelAdmin(ModelAdmin):
    """The ``ModelAdmin`` of a queue-like model.

    - Counts never scan a whole table (:class:`EstimatedCountPaginator`, no full count).
    - "now" is the database's clock, read once per request, so that "locked for 3m" agrees
      with what workers see whatever the web server's clock says.
    - Actions go through the facade API; the facade's refusals become error messages.
    - Django's bulk "delete selected" is removed: deleting rows behind the facade's back
      would skip its bookkeeping (counters, signals); each admin offers the facade's verb.
    """

    paginator = EstimatedCountPaginator
    show_full_result_count = False
    # Facet counts run one COUNT per filter choice over the whole filtered table.
    show_facets = admin.ShowFacets.NEVER
    list_per_page = 50
    change_list_template = "admin/django_taskloop/change_list.html"
    change_form_template = "admin/django_taskloop/change_form.html"

    def db_now(self, request: HttpRequest, using: str | None = None) -> dt.datetime:
        """Return the database's current time, read once per request and database."""
        alias = using or self._alias()
        cache: dict[str, dt.datetime] = request.__dict__.setdefault("_taskloop_now", {})
        if alias not in cache:
            cache[alias] = db_now(alias)
        return cache[alias]

    def _alias(self) -> str:
        from django.db import router

        return router.db_for_read(self.model)

    def url_name(self, view: str) -> str:
        """Return the URL name of this model's admin ``view`` (``changelist``, ``stats``…)."""
        return f"{self.opts.app_label}_{self.opts.model_name}_{view}"

    def admin_url(self, view: str, *args: Any) -> str:
        """Reverse this model's admin ``view`` on this admin site."""
        site = self.admin_site.name
        return reverse(f"admin:{self.url_name(view)}", args=args, current_app=site)

    def get_taskloop_links(self, request: HttpRequest) -> list[tuple[str, str]]:
        """Return ``(label, url)`` pairs shown above the change list (stats, dashboard)."""
        url = dashboard_url(self.admin_site)
        return [] if url is None else [(str(_("Dashboard")), url)]

    def get_actions(self, request: HttpRequest, action_location: Any = None) -> dict[str, Any]:
        # ``action_location`` exists from Django 6.1 (actions on the change form too).
        if action_location is None:
            actions = super().get_actions(request)
        else:
            actions = super().get_actions(request, action_location=action_location)  # type: ignore[call-arg]  # Django 6.1 (the stubs lack it)
        actions.pop("delete_selected", None)
        return actions

    def now(self) -> dt.datetime:
        """Return the "now" of the page being rendered (the database's clock)."""
        value = _NOW.get()
        return value if value is not None else db_now(self._alias())

    def when(self, moment: dt.datetime | None, *, ago: bool = True) -> str:
        """Return :func:`when_cell` of ``moment`` against the page's "now"."""
        return when_cell(moment, self.now(), ago=ago)

    def get_paused_note(self, request: HttpRequest) -> str | None:
        """Return a note for the top of the list when what it shows is paused, else ``None``."""
        return None

    #: Nothing on an item's page is editable (its rows are written by verbs, not forms): the
    #: page shows no Save buttons.
    read_only_page = False

    def is_read_only(self, obj: Any) -> bool:
        """Whether ``obj``'s page offers nothing to edit (no Save), whatever the permissions."""
        return False

    def get_retry(self, obj: Any) -> Retry:
        """Return ``(button label, verb)`` to retry ``obj`` from its page, or ``None``."""
        return None

    def get_urls(self) -> list[URLPattern]:
        from django.urls import path

        site = self.admin_site
        return [
            path("<path:object_id>/retry/", site.admin_view(self.retry_view), name=self.url_name("retry")),
            *super().get_urls(),
        ]

    def retry_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Retry the item whose page this is (POST, with the change permission)."""
        from django.http import Http404, HttpResponseNotAllowed, HttpResponseRedirect

        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        obj = self.get_object(request, object_id)
        if obj is None:
            raise Http404(object_id)
        self.require(request, "change", obj)
        retry = self.get_retry(obj)
        if retry is None:
            self.message_user(request, _("There is nothing to retry here."), messages.ERROR)
        else:
            label, verb = retry
            self.run_verb(request, verb, lambda _result: f"{label}: done.")
        return HttpResponseRedirect(self.admin_url("change", obj.pk))

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        extra_context = dict(extra_context or {})
        obj = None if object_id is None else self.get_object(request, object_id)
        if self.read_only_page or (obj is not None and self.is_read_only(obj)):
            extra_context.update(show_save=False, show_save_and_continue=False)
            extra_context.setdefault("title", _("View %s") % self.opts.verbose_name)
        if object_id is not None:
            retry = None if obj is None else self.get_retry(obj)
            if obj is not None and retry is not None and self.has_change_permission(request, obj):
                extra_context["taskloop_retry"] = (retry[0], self.admin_url("retry", obj.pk))
        return super().changeform_view(request, object_id, form_url, extra_context)

    def get_changelist_instance(self, request: HttpRequest) -> ChangeList:
        changelist = super().get_changelist_instance(request)
        paginator = changelist.paginator
        exact = getattr(paginator, "count_is_exact", True)
        if not exact:
            # "Select all 1001 int loops" would say a cap as if it were the total.
            changelist.result_count = LabelledCount(
                changelist.result_count,
                count_text(changelist.result_count, exact, paginator.count_is_estimate),
            )
        return changelist

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        # Read the clock once, so that every row of the page is measured against one "now".
        # A context variable, not an attribute: one ModelAdmin instance serves every thread.
        token = _NOW.set(self.db_now(request))
        names = _NAMES.set({})
        extra_context = {
            "taskloop_links": self.get_taskloop_links(request),
            "taskloop_paused": self.get_paused_note(request),
            **(extra_context or {}),
        }
        try:
            response = super().changelist_view(request, extra_context)
            # Render here, while "now" is set: the columns are computed while rendering.
            if hasattr(response, "render") and not getattr(response, "is_rendered", True):
                response.render()
            return response
        finally:
            _NOW.reset(token)
            _NAMES.reset(names)

    def run_verb(
        self,
        request: HttpRequest,
        verb: Callable[[], object],
        success: Callable[[Any], str],
    ) -> Any:
        """Call ``verb()``; report ``success(result)`` or the facade's refusal as a message."""
        try:
            result = verb()
        except (TaskloopError, ValueError, TypeError, LookupError) as error:
            self.message_user(request, f"{type(error).__name__}: {error}", messages.ERROR)
            return None
        self.message_user(request, success(result), messages.SUCCESS)
        return result

    def run_each(
        self,
        request: HttpRequest,
        items: Iterable[Any],
        verb: Callable[[Any], object],
        label: Callable[[Any], str],
        done: str,
    ) -> None:
        """Call ``verb(item)`` for every item; report how many succeeded and each refusal."""
        ok, errors = 0, []
        for item in items:
            try:
                verb(item)
                ok += 1
            except (TaskloopError, ValueError, TypeError, LookupError) as error:
                errors.append(f"{label(item)}: {type(error).__name__}: {error}")
        if ok:
            self.message_user(request, done % {"n": ok}, messages.SUCCESS)
        for refusal in errors:
            self.message_user(request, refusal, messages.ERROR)

    def require(self, request: HttpRequest, permission: str, obj: Model | None = None) -> None:
        """Raise ``PermissionDenied`` unless the user has ``permission`` (``change``, ``delete``…)."""
        if not getattr(self, f"has_{permission}_permission")(request, obj):
            raise PermissionDenied


#: The name of :class:`TaskloopModelAdmin` when it was a mixin; ``class MyAdmin(TaskloopAdminMixin,
#: admin.ModelAdmin)`` still works.
TaskloopAdminMixin = TaskloopModelAdmin


_NAMES: ContextVar[dict[Any, dict[Any, str]] | None] = ContextVar("taskloop_admin_names", default=None)


def names_of(model: type[Model], pk: object) -> str:
    """Return ``str()`` of the ``model`` row ``pk`` (a tube, a board), one query per page.

    Tubes and boards are few: reading them all once is cheaper than joining them to a
    million tasks, and keeps the list query on one table's index.
    """
    cache = _NAMES.get()
    if cache is None:  # outside a change list: no page to share a cache with
        row = model._default_manager.filter(pk=pk).first()
        return str(pk) if row is None else str(row)
    if model not in cache:
        cache[model] = {row.pk: str(row) for row in model._default_manager.all()}
    return cache[model].get(pk, str(pk))


def dashboard_url(site: admin.AdminSite) -> str | None:
    """Return the URL of the dashboard on admin ``site``, or ``None`` if it is not there."""
    try:
        return reverse("admin:django_taskloop_dashboard", current_app=site.name)
    except NoReverseMatch:  # the job boards' admin, which hosts it, is not registered
        return None


class LabelledCount(int):
    """A count that compares as a number and prints as what it is (``~200,000``, ``≥ 1,001``)."""

    label: str

    def __new__(cls, value: int, label: str) -> LabelledCount:
        number = super().__new__(cls, value)
        number.label = label
        return number

    def __str__(self) -> str:
        return self.label


def count_text(count: int, exact: bool = True, estimate: bool = False) -> str:
    """Say a count as what it is: exact ``1,234``, estimated ``~200,000``, or capped ``≥ 5,000``."""
    if estimate:
        return f"~{count:,}"
    return f"{count:,}" if exact else f"≥ {count:,}"


def state_badge(label: str | Promise, css: str) -> str:
    """Return a coloured state label for a change list."""
    return format_html('<span class="tl-state tl-{}">{}</span>', css, label)


def until_cell(deadline: dt.datetime | None, now: dt.datetime) -> str:
    """Return "in 3m 05s" for a future deadline, "2s ago" for a past one, "—" for none."""
    if deadline is None:
        return "—"
    seconds = seconds_between(deadline, now) or 0.0
    if seconds >= 0:
        return format_html('<span class="tl-future">in {}</span>', humanize_seconds(seconds))
    return format_html('<span class="tl-past">{} ago</span>', humanize_seconds(seconds))


class QueueRowsAdmin(TaskloopModelAdmin):
    """The admin of a table whose rows are queues (tubes, boards). A row is the whole queue:
    its pause and resume act on every shard of it (:meth:`django_taskloop.queues.Queue.of`),
    as the terminal and the dashboard do."""

    #: What a row is called in the messages: ``tube``, ``board``.
    noun = "queue"

    @admin.display(description=_("running"))
    def running(self, obj: Any) -> str:
        return state_badge(_("paused"), "paused") if obj.paused else state_badge(_("running"), "running")

    def pause_rows(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        """Pause each chosen queue on every shard; say how many, and each refusal."""
        self._each_queue(request, queryset, Queue.pause, "Paused %(n)d {}(s).")

    def resume_rows(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        """Resume each chosen queue on every shard; say how many, and each refusal."""
        self._each_queue(request, queryset, Queue.resume, "Resumed %(n)d {}(s).")

    def _each_queue(
        self, request: HttpRequest, queryset: QuerySet[Any], verb: Callable[[Queue], object], done: str
    ) -> None:
        noun = self.noun
        self.run_each(
            request,
            queryset,
            lambda row: verb(Queue.of(row)),
            lambda row: f"{noun} {row.name}",
            done.format(noun),
        )
