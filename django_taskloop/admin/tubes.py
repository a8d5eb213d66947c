"""Admin of tubes: tubes with their statistics, and tasks with Tarantool's verbs as actions.

The tubes of a Django Tasks queue (``tasks.default``, ``tasks-keyed.default``) are the
backend's: their rows say whose they are, their tasks link the Django task result they bring,
and a filter leaves them out. A Django Tasks user's page is *Django task results*.
"""

from __future__ import annotations

import json
from typing import Any, cast

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ActionForm
from django.core.exceptions import PermissionDenied
from django.db import router
from django.db.models import Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.text import Truncator
from django.utils.translation import gettext_lazy as _
from rangefilter.filters import DateTimeRangeFilterBuilder, NumericRangeFilterBuilder

from .. import engine
from ..backends import result_id_of, short_result_id
from ..models import TaskRecord
from ..models.tubes import (
    BURIED,
    DELAYED,
    STORED_STATES,
    TAKEN,
    TASK_STATES,
    TTL_TYPES,
    Task,
    TaskQuerySet,
    Tube,
    TubeStat,
    calls_from,
)
from ..queues import Queue
from ..stats import TASKS_TUBE_PREFIXES, django_tasks_queue, tube_summary
from ..validation import check_key_limit, check_key_rate, check_rate
from .base import (
    ModelForm,
    QueueRowsAdmin,
    Retry,
    TaskloopModelAdmin,
    dashboard_url,
    humanize_seconds,
    names_of,
    seconds_between,
    state_badge,
    until_cell,
    when_cell,
)
from .charts import bar_chart
from .loops import STATE_COUNT_CAP
from .operating import failure_history, last_failure_note, progress_html

__all__ = ["TaskAdmin", "TubeAdmin", "TaskStateFilter", "TubeUseFilter", "tube_overview"]


def _with_per_key(whole: Any, per_key: Any) -> Any:
    """A limit's cell: the tube's own (``whole``, ``None`` for none) and, on a quiet line of its
    own below it, the one per key (``3 per key``): a short column at 1280 px, where
    ``5; 3 per key`` on one line wrapped. ``None`` when neither is set (the list's ``-``)."""
    if per_key is None:
        return None if whole is None else str(whole)
    return format_html(
        '{}<small class="tl-per-key">{}</small>',
        "-" if whole is None else whole,
        _("%(n)s per key") % {"n": per_key},
    )


def _django_tasks_note(tube_name: str, short: bool = False) -> str:
    """Say that a tube is a Django Tasks queue's (``""``: a tube of the user's own); ``short``
    for the list of tube tasks, whose columns must fit 1280 px."""
    queue = django_tasks_queue(tube_name)
    if queue is None:
        return ""
    if short:
        return format_html(' <small class="tl-why">{}</small>', _("Django Tasks"))
    keyed = tube_name.startswith(TASKS_TUBE_PREFIXES[1])
    what = _("keyed tasks of Django Tasks queue") if keyed else _("Django Tasks queue")
    return format_html(' <small class="tl-why">{} {}</small>', what, queue)


class TubeUseFilter(admin.SimpleListFilter):
    """Tubes of one's own, or those that hold a Django Tasks queue (the backend's, internal)."""

    title = _("used by")
    parameter_name = "used_by"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("own", _("your own tubes")), ("django_tasks", _("Django Tasks (internal)"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() not in ("own", "django_tasks"):
            return queryset
        internal = Q()
        for prefix in TASKS_TUBE_PREFIXES:
            internal |= Q(name__startswith=prefix)
        if queryset.model is not Tube:
            # Tasks: by their tubes' ids (tubes are few; a join would be planned first).
            internal = Q(tube_id__in=list(Tube.objects.filter(internal).values_list("pk", flat=True)))
        return queryset.exclude(internal) if self.value() == "own" else queryset.filter(internal)


class TaskStateFilter(admin.SimpleListFilter):
    """Ready, taken, delayed, buried or expired: the named states of ``Task.objects``, read
    with the database's clock (``state`` leads the tube's claim index after the tube)."""

    title = _("state")
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [(name, _(name)) for name in TASK_STATES]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        name = self.value()
        return cast(TaskQuerySet, queryset).in_state(name) if name in TASK_STATES else queryset


class PriorityRangeFilter(NumericRangeFilterBuilder(title=_("priority"))):  # type: ignore[misc]  # rangefilter builds the base class
    """A priority range that the (tube, state, pri, id) index can serve.

    ``state IN (every state)`` changes no result but turns "tube = ? AND pri BETWEEN ? AND ?"
    into one index range per state: without it MariaDB, which cannot skip over the state
    column, reads every task of the tube to find a rare priority.
    """

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        filtered: QuerySet[Any] = super().queryset(request, queryset)
        if filtered is queryset:
            return queryset
        return filtered.filter(state__in=list(STORED_STATES.values()))


class EventRangeFilter(DateTimeRangeFilterBuilder(title=_("next event (delay end, ttr)"))):  # type: ignore[misc]  # rangefilter builds the base class
    """A range of ``event_at`` that the (tube, state, event_at) index can serve, as above."""

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        filtered: QuerySet[Any] = super().queryset(request, queryset)
        if filtered is queryset:
            return queryset
        return filtered.filter(state__in=list(STORED_STATES.values()))


class TaskForm(ModelForm):
    """Edit a task's priority (ttl tubes only) and data, unless a consumer holds it."""

    class Meta:
        model = Task
        fields = ["pri", "data"]

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        task = self.instance
        state = (
            Task.objects.db_manager(task._state.db).filter(pk=task.pk).values_list("state", flat=True).first()
        )
        if state is None:
            raise forms.ValidationError(_("This task is gone: it was acknowledged or deleted."))
        if state == TAKEN:
            raise forms.ValidationError(
                _("Task %(id)s is taken by %(owner)s: release it before editing it.")
                % {"id": task.pk, "owner": task.owner}
            )
        if "pri" in self.changed_data and task.tube.type not in TTL_TYPES:
            self.add_error("pri", _("A %(type)s tube has no priorities.") % {"type": task.tube.type})
        return data


class TaskAdmin(TaskloopModelAdmin):
    """Tasks of every tube, with Tarantool's verbs as actions."""

    form = TaskForm
    # Eight columns fit 1280 px with room for the data (the holder shows in the state cell;
    # utube and ttl are on each task's page).
    list_display = (
        "id",
        "task_state",
        "tube_name",
        "pri",
        "attempts",
        "deadline",
        "age",
        "data_preview",
    )
    list_filter = (
        TaskStateFilter,
        "tube",
        TubeUseFilter,
        ("pri", PriorityRangeFilter),
        ("created", DateTimeRangeFilterBuilder(title=_("created"))),
        ("event_at", EventRangeFilter),
        ("ttl_at", DateTimeRangeFilterBuilder(title=_("expires (ttl)"))),
    )
    # No join with the tube table: MariaDB would plan it first and sort a million rows. Tubes
    # are few; their names come from one small query per page (tube_name).
    list_select_related = ()
    # Shows the search box; get_search_results decides what a term means (id or utube key).
    search_fields = ("utube",)
    search_help_text = _("A task id, or a utube key.")
    # Newest first through the primary key: whatever the filters, no sort of a big table.
    ordering = ("-id",)
    sortable_by = ("id", "age")
    actions = ["release_tasks", "bury_tasks", "kick_tasks", "delete_tasks", "set_priority"]
    readonly_fields = (
        "id",
        "tube",
        "task_state",
        "utube",
        "owner",
        "created",
        "event_at",
        "ttl_at",
        "ttr",
        "attempts",
        "failures",
        "progress",
    )
    fieldsets = (
        (None, {"fields": ("id", "tube", "task_state", "progress", "utube", "pri", "data")}),
        (_("Timers"), {"fields": ("owner", "created", "event_at", "ttl_at", "ttr")}),
        (_("Attempts and failures"), {"fields": ("attempts", "failures")}),
    )
    action_form = type(
        "TaskActionForm",
        (ActionForm,),
        {"pri": forms.CharField(required=False, label=_("priority"), max_length=12)},
    )

    def has_add_permission(self, request: HttpRequest) -> bool:
        # Tasks are put with tube.put(); an add form would skip the counters and wake-ups.
        return False

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[Any], search_term: str) -> Any:
        # A number is a task id (primary key); anything else a utube key (exact, indexed with
        # the tube when the tube filter is on).
        term = search_term.strip()
        if not term:
            return queryset, False
        if term.isdigit():
            return queryset.filter(pk=int(term)), False
        return queryset.filter(utube=term), False

    @admin.display(description=_("state"))
    def task_state(self, obj: Task) -> str:
        now = self.now()
        name = obj.current_state(now)
        if name == "expired":
            # Its ttl ran out: no take gets it, and the next call on the tube removes it.
            return format_html("{} <small>{}</small>", state_badge(_(name), name), _("ttl ran out"))
        if obj.state in (DELAYED, TAKEN) and obj.event_at is not None and obj.event_at <= now:
            # The timer ran out; the next call on the tube makes it ready.
            return format_html("{} <small>{}</small>", state_badge(_(name), name), _("overdue"))
        if obj.state == BURIED:
            return format_html("{} {}", state_badge(_(name), name), last_failure_note(obj))
        if obj.state == TAKEN and obj.owner:
            return format_html(
                '{} <small class="tl-why">{} {}</small>', state_badge(_(name), name), _("by"), obj.owner
            )
        return state_badge(_(name), name)

    @admin.display(description=_("tube"))
    def tube_name(self, obj: Task) -> str:
        # The name alone ("emails", not "emails (fifottl)"): the type is on the tube's page.
        name = names_of(Tube, obj.tube_id).rsplit(" (", 1)[0]
        return format_html("{}{}", name, _django_tasks_note(name, short=True))

    @admin.display(description=_("next event"))
    def deadline(self, obj: Task) -> str:
        return until_cell(obj.event_at, self.now())

    @admin.display(description=_("expires"))
    def expires(self, obj: Task) -> str:
        return until_cell(obj.ttl_at, self.now())

    @admin.display(description=_("age"), ordering="-id")
    def age(self, obj: Task) -> str:
        return humanize_seconds(seconds_between(self.now(), obj.created))

    @admin.display(description=_("data"))
    def data_preview(self, obj: Task) -> str:
        result_id = self._result_id(obj)
        if result_id is not None:
            # The call and its outcome are on the result's page: the data is only a pointer.
            url = reverse(
                "admin:django_taskloop_taskrecord_change", args=[result_id], current_app=self.admin_site.name
            )
            return format_html(
                '<a href="{}" title="{} {}">{} {}</a>',
                url,
                _("Django task result"),
                result_id,
                _("result"),
                short_result_id(result_id),
            )
        return Truncator(json.dumps(obj.data, ensure_ascii=False)).chars(40)

    def _result_id(self, obj: Task) -> str | None:
        """Return the result id of a Django Tasks queue's tube task (``None``: not one)."""
        if django_tasks_queue(names_of(Tube, obj.tube_id).rsplit(" (", 1)[0]) is None:
            return None
        return result_id_of(obj)

    def get_paused_note(self, request: HttpRequest) -> str | None:
        pk = request.GET.get("tube__id__exact")
        tube = Tube.objects.filter(pk=pk).first() if pk else None
        if tube is not None and tube.paused:
            return str(
                _("Tube %(name)s is paused: no task is handed out until it is resumed.") % {"name": tube.name}
            )
        return None

    def get_retry(self, obj: Task) -> Retry:
        if obj.state == BURIED:
            return (str(_("Retry: kick this task")), lambda: obj.tube.kick_task(obj.pk))
        return None

    @admin.display(description=_("attempts and failures"))
    def failures(self, obj: Task) -> str:
        result_id = self._result_id(obj)
        if result_id is not None:
            # A Django Task's failures are its result's, every attempt (each one a tube task).
            record = TaskRecord.objects.filter(pk=result_id).first()
            return failure_history(record, self.admin_site.name) if record is not None else "—"
        return failure_history(obj, self.admin_site.name)

    @admin.display(description=_("progress"))
    def progress(self, obj: Task) -> str:
        # A Django Task's progress is named by its result id, as its failures are.
        return progress_html("task", obj.tube.name, self._result_id(obj) or obj.pk)

    def delete_model(self, request: HttpRequest, obj: Task) -> None:
        # Through the tube: its events and its "delete" counter, as a worker's delete would.
        obj.tube.delete_task(obj.pk)

    def delete_view(self, request: HttpRequest, object_id: str, extra_context: Any = None) -> Any:
        task = self.get_object(request, object_id)
        if task is not None and task.state == TAKEN:
            # A live worker holds it: say whose work the delete takes away.
            extra_context = {
                **(extra_context or {}),
                "title": _("Delete task %(id)s? Consumer %(owner)s is working on it now.")
                % {"id": task.pk, "owner": task.owner},
            }
        return super().delete_view(request, object_id, extra_context)

    def save_model(self, request: HttpRequest, obj: Task, form: Any, change: bool) -> None:
        changes = {name: form.cleaned_data[name] for name in form.changed_data}
        if changes and not obj.tube.edit_task(obj.pk, **changes):
            self.message_user(request, _("The task was taken meanwhile: nothing was saved."), messages.ERROR)

    def _each(self, request: HttpRequest, queryset: QuerySet[Any], verb: Any, done: str) -> None:
        """Apply ``verb(tube, task)`` to every selected task; report successes and refusals."""
        self.run_each(
            request,
            queryset.select_related("tube"),
            lambda task: verb(task.tube, task),
            lambda task: f"task {task.pk}",
            done,
        )

    @admin.action(description=_("Release (taken → ready)"), permissions=["change"])
    def release_tasks(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        # release() checks ownership: the admin acts as the consumer that holds the task.
        self._each(
            request,
            queryset,
            lambda tube, task: tube.release(task.pk, consumer=task.owner or "-"),
            "Released %(n)d task(s).",
        )

    @admin.action(description=_("Bury"), permissions=["change"])
    def bury_tasks(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._each(request, queryset, lambda tube, task: tube.bury(task.pk), "Buried %(n)d task(s).")

    @admin.action(
        description=_("Retry: kick the selected buried tasks (buried → ready)"), permissions=["change"]
    )
    def kick_tasks(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        # Exactly the rows chosen, whatever their place in the tube's kick order.
        self._each(request, queryset, lambda tube, task: tube.kick_task(task.pk), "Kicked %(n)d task(s).")

    @admin.action(description=_("Delete (delete_task)"), permissions=["delete"])
    def delete_tasks(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._each(request, queryset, lambda tube, task: tube.delete_task(task.pk), "Deleted %(n)d task(s).")

    @admin.action(description=_("Set the priority given above"), permissions=["change"])
    def set_priority(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        try:
            pri = int(request.POST.get("pri", ""))
        except ValueError:
            self.message_user(request, _("Enter a whole-number priority next to the action."), messages.ERROR)
            return
        changed, refused = 0, []
        for task in queryset.select_related("tube"):
            if task.tube.type not in TTL_TYPES:
                refused.append(f"task {task.pk}: a {task.tube.type} tube has no priorities")
            elif not task.tube.edit_task(task.pk, pri=pri):
                refused.append(f"task {task.pk}: taken, release it first")
            else:
                changed += 1
        if changed:
            self.message_user(request, f"Set the priority of {changed} task(s) to {pri}.", messages.SUCCESS)
        for reason in refused:
            self.message_user(request, reason, messages.ERROR)


def tube_overview(tube: Tube, exact: bool = False) -> dict[str, Any]:
    """Return a tube's statistics in Tarantool's shape and the first ttr deadline.

    With ``exact`` (or whenever the tube holds fewer than :data:`STATE_COUNT_CAP` tasks in
    every state) it is ``tube.statistics()`` itself. Otherwise counting every task would
    take seconds at millions of tasks: the task counts stop at the cap (``exact`` is then
    false) and the call counters are read from the tube's counter rows.
    """
    using = tube._state.db or router.db_for_read(Tube)
    depth = tube_summary(tube, cap=STATE_COUNT_CAP).depth()
    counted = all(is_exact for _count, is_exact in depth.values())
    if exact or counted:
        # A page view only reads: overdue tasks are shown as overdue, not freed.
        stats = tube.statistics(apply_transitions=False)
        counted = True
    else:
        sums = TubeStat.objects.using(using).filter(tube_id=tube.pk).sums()
        # statistics(apply_transitions=False)'s shape: expired tasks are in no state's count.
        tasks = {name: depth[name][0] for name in ("taken", "buried", "ready", "delayed")}
        tasks["total"] = sum(tasks.values())
        tasks["done"] = sums["done"]
        tasks["expired"] = depth["expired"][0]
        # calls.put is derived from the number of tasks: at least this many, like the counts.
        stats = {"tasks": tasks, "calls": calls_from(sums, tasks["total"] + tasks["expired"])}
    taken = Task.objects.using(using).filter(tube=tube).taken()
    # The (tube, state, event_at) index: the taken task whose ttr runs out first.
    first_deadline = (
        taken.filter(event_at__isnull=False).order_by("event_at").values_list("event_at", flat=True).first()
    )
    return {"statistics": stats, "exact": counted, "first_ttr": first_deadline, "now": engine.db_now(using)}


class TubeForm(forms.ModelForm):  # type: ignore[type-arg]
    """A tube's options, its rate and key rate written as ``100/m`` (one field for each rate's
    two columns)."""

    rate = forms.CharField(
        required=False,
        max_length=40,
        help_text=_(
            "At most this many of its tasks started per period, by every worker together: "
            "100/m, 60/s, 10/5s (units s, m, h, d); empty: no rate. See Tube.set_rate."
        ),
    )
    key_rate = forms.CharField(
        required=False,
        max_length=40,
        help_text=_(
            "utube and utubettl: at most this many of one key's tasks started per period, by every "
            "worker together, written as the rate; empty: no key rate. See Tube.set_key_rate."
        ),
    )

    class Meta:
        model = Tube
        # Every editable option but the rate's two columns, which the rate field writes.
        fields = ("name", "type", "ttl", "ttr", "pri", "running_limit", "key_limit")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in ("rate", "key_rate"):
            if getattr(self.instance, name) is not None:
                self.initial[name] = str(getattr(self.instance, name))

    def clean_rate(self) -> Any:
        try:
            return check_rate(self.cleaned_data.get("rate") or None, "rate")
        except (TypeError, ValueError) as error:
            raise forms.ValidationError(str(error)) from error

    def clean(self) -> dict[str, Any]:
        cleaned: dict[str, Any] = super().clean() or {}
        kind = self.instance.type if self.instance.pk else cleaned.get("type")
        for name, check in (("key_limit", check_key_limit), ("key_rate", check_key_rate)):
            if kind and name in cleaned:
                try:
                    # (The key rate's field is text: empty is none.)
                    cleaned[name] = check(cleaned[name] if cleaned[name] != "" else None, kind)
                except (TypeError, ValueError) as error:
                    self.add_error(name, str(error))
        return cleaned

    def save(self, commit: bool = True) -> Any:
        rate, key_rate = self.cleaned_data.get("rate"), self.cleaned_data.get("key_rate")
        self.instance.rate_count, self.instance.rate_period = (None, None) if rate is None else rate
        self.instance.key_rate_count, self.instance.key_rate_period = (
            (None, None) if key_rate is None else key_rate
        )
        return super().save(commit)


class TubeAdmin(QueueRowsAdmin):
    """Tubes, their options and a statistics page each."""

    noun = "tube"
    form = TubeForm

    list_display = (
        "tube_name",
        "running",
        "type",
        "ttl",
        "ttr",
        "pri",
        "limit",
        "rate_text",
        "links",
        "created_at",
    )
    list_filter = (TubeUseFilter, "type")
    search_fields = ("name",)
    ordering = ("name",)
    actions = ["kick_all", "pause_tubes", "resume_tubes"]

    @admin.display(description=_("name"), ordering="name")
    def tube_name(self, obj: Tube) -> str:
        return format_html("{}{}", obj.name, _django_tasks_note(obj.name))

    @admin.display(description=_("created"), ordering="created")
    def created_at(self, obj: Tube) -> str:
        return when_cell(obj.created, self.now())

    @admin.display(description=_("limit"), ordering="running_limit", empty_value="-")
    def limit(self, obj: Tube) -> Any:
        """Its running limit: at most this many taken at once, every worker together; a utube's
        key limit on a line of its own below it (``-`` / ``3 per key``)."""
        return _with_per_key(obj.running_limit, obj.key_limit)

    @admin.display(description=_("rate"), ordering="rate_count", empty_value="-")
    def rate_text(self, obj: Tube) -> Any:
        """Its rate: at most this many started per period, every worker together (``100/m``);
        a utube's key rate below it, as the key limit is."""
        return _with_per_key(obj.rate, obj.key_rate)

    @admin.action(description=_("Pause: workers take nothing from it"), permissions=["change"])
    def pause_tubes(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self.pause_rows(request, queryset)

    @admin.action(description=_("Resume"), permissions=["change"])
    def resume_tubes(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self.resume_rows(request, queryset)

    def get_readonly_fields(self, request: HttpRequest, obj: Tube | None = None) -> tuple[str, ...]:
        # The type decides how the stored tasks are read: it cannot change under them.
        return ("name", "type", "created") if obj is not None else ("created",)

    def save_model(self, request: HttpRequest, obj: Tube, form: Any, change: bool) -> None:
        if change:
            # ttl/ttr/pri are defaults for future puts only; the running limit holds from the
            # next take of every worker that knows the tube is limited.
            super().save_model(request, obj, form, change)
            return
        tube = Tube.objects.db_manager(router.db_for_write(Tube)).create_tube(
            obj.name,
            obj.type,
            ttl=obj.ttl,
            ttr=obj.ttr,
            pri=obj.pri,
            limit=obj.running_limit,
            rate=obj.rate,
            key_limit=obj.key_limit,
            key_rate=obj.key_rate,
        )
        obj.pk, obj.created, obj._state = tube.pk, tube.created, tube._state

    def has_delete_permission(self, request: HttpRequest, obj: Tube | None = None) -> bool:
        # drop() refuses while tasks are taken; a bare DELETE would not.
        return False

    @admin.display(description=_("see"))
    def links(self, obj: Tube) -> str:
        tasks = reverse("admin:django_taskloop_task_changelist", current_app=self.admin_site.name)
        return format_html(
            '<a href="{}?tube__id__exact={}">{}</a> · <a href="{}?tube__id__exact={}&amp;state=buried">{}</a>'
            ' · <a href="{}">{}</a>',
            tasks,
            obj.pk,
            _("tasks"),
            tasks,
            obj.pk,
            _("buried"),
            self.admin_url("stats", obj.pk),
            _("statistics"),
        )

    @admin.action(description=_("Kick every buried task"), permissions=["change"])
    def kick_all(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        # "Retry everything that failed for good" on the chosen tubes: on every shard of each,
        # as pause and resume do (the row is the whole queue).
        kicked = sum(Queue.of(tube).kick_buried() for tube in queryset)
        self.message_user(request, f"Kicked {kicked} task(s).", messages.SUCCESS)

    def get_urls(self) -> list[URLPattern]:
        site = self.admin_site
        return [
            path("<path:object_id>/stats/", site.admin_view(self.stats_view), name=self.url_name("stats")),
            *super().get_urls(),
        ]

    def stats_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Show Tarantool's ``statistics()`` of a tube, with charts."""
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        tube = self.get_object(request, object_id)
        if tube is None:
            raise Http404(f"No tube {object_id!r}")
        overview = tube_overview(tube, exact=request.GET.get("exact") == "1")
        stats = overview["statistics"]
        first_ttr = overview["first_ttr"]
        rows = [
            *((f"tasks.{k}", v) for k, v in stats["tasks"].items()),
            *((f"calls.{k}", v) for k, v in stats["calls"].items()),
            (
                "first ttr deadline",
                "—" if first_ttr is None else until_cell(first_ttr, overview["now"]),
            ),
        ]
        tasks = stats["tasks"]
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": _("Statistics of tube %(name)s") % {"name": tube.name},
            "object": tube,
            "object_url": self.admin_url("change", tube.pk),
            "rows": rows,
            "charts": [
                bar_chart(
                    [(name, tasks.get(name, 0)) for name in TASK_STATES],
                    title=str(_("Tasks by state")),
                    # Each state's colour; a task past its ttl is grey, as in the task list.
                    states=["ttl" if name == "expired" else name for name in TASK_STATES],
                ),
                bar_chart(list(stats["calls"].items()), title=str(_("Calls"))),
            ],
            "raw": json.dumps(stats, indent=2),
            "note": None
            if overview["exact"]
            else format_html(
                '{} <a href="?exact=1">{}</a>',
                _(
                    "Task counts stop at %(cap)s per state, and so does put (derived from them): "
                    "counting millions of tasks takes seconds."
                )
                % {"cap": f"{STATE_COUNT_CAP:,}"},
                _("Count them all with statistics()"),
            ),
            "changelist_url": self.admin_url("changelist"),
            "dashboard_url": dashboard_url(self.admin_site),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/django_taskloop/stats.html", context)


def register(site: admin.AdminSite) -> None:
    """Register the tubes' admins on ``site`` (unless the project already did)."""
    for model, model_admin in ((Tube, TubeAdmin), (Task, TaskAdmin)):
        if not site.is_registered(model):
            site.register(model, model_admin)
