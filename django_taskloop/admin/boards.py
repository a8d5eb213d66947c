"""Admin of job boards: boards, their jobs (with the trash), consumed jobs and entities."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ActionForm
from django.core.exceptions import PermissionDenied
from django.db import router
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _
from rangefilter.filters import DateTimeRangeFilterBuilder

from .. import engine
from ..exceptions import JobFailure
from ..models.boards import BoardEntity, ConsumedJob, Job, JobBoard, JobPriority, JobQuerySet
from ..stats import JOB_STATES, board_priorities, board_summary
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
from .operating import failure_history, last_failure_note, progress_html

__all__ = ["JobAdmin", "JobBoardAdmin", "JobStateFilter", "admin_identity"]

JOB_STATE_LABELS = {
    "unclaimed": _("unclaimed"),
    "claimed": _("claimed"),
    "expired": _("expired claim"),
    "trashed": _("trashed"),
}


def priority_text(priority: Any) -> str:
    """Name a priority as the priority filter does: ``very high``, not ``VERY_HIGH``."""
    return priority.name.replace("_", " ").lower() if isinstance(priority, JobPriority) else str(priority)


def admin_identity(request: HttpRequest) -> str:
    """Return the ``who`` under which an admin user acts on a board: ``admin:<username>``."""
    return f"admin:{request.user.get_username()}"


def job_state(job: Job, now: Any) -> str:
    """Return ``unclaimed``, ``claimed``, ``expired`` (claim ran out) or ``trashed``."""
    if job.trashed:
        return "trashed"
    if job.claimed_by is None:
        return "unclaimed"
    if job.claim_expires_at is not None and job.claim_expires_at <= now:
        return "expired"
    return "claimed"


class JobStateFilter(admin.SimpleListFilter):
    """Unclaimed, claimed, expired claim, or trashed (the trash)."""

    title = _("state")
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return list(JOB_STATE_LABELS.items())

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(JobQuerySet.state_condition(value)) if value in JOB_STATES else queryset


class JobPriorityFilter(admin.SimpleListFilter):
    """The five TaskFlow priorities (no query needed to list them)."""

    title = _("priority")
    parameter_name = "priority"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [(member.name, member.name.replace("_", " ").lower()) for member in JobPriority]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        member = JobPriority.__members__.get(self.value() or "")
        return queryset if member is None else queryset.filter(priority=member.rank)


class JobForm(ModelForm):
    """Edit a job's priority and details, where its state allows it."""

    # Not the model field: PriorityField's integer validators cannot compare a JobPriority,
    # so model validation of the priority is left out and the choice list validates it.
    priority = forms.ChoiceField(choices=[(member.name, member.name) for member in JobPriority])

    class Meta:
        model = Job
        fields = ["details"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk and isinstance(self.instance.priority, JobPriority):
            self.initial["priority"] = self.instance.priority.name

    def clean_priority(self) -> JobPriority:
        return JobPriority[self.cleaned_data["priority"]]

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        job = self.instance
        # Read the state live: the page may be minutes old.
        row = Job.objects.db_manager(job._state.db).filter(pk=job.pk).values("trashed", "details").first()
        if row is None:
            raise forms.ValidationError(_("This job is gone: it was consumed or removed."))
        if row["trashed"]:
            raise forms.ValidationError(
                _("A trashed job cannot be edited: re-post it, then edit the new job.")
            )
        self.details_changed = "details" in data and data["details"] != row["details"]
        if self.details_changed and job.state != "UNCLAIMED":
            raise forms.ValidationError(
                _(
                    "The details of a claimed job cannot change: %(who)s may be working on them. Abandon it first."
                )
                % {"who": job.owner}
            )
        return data

    def _post_clean(self) -> None:
        # Nothing is assigned to the instance or validated on it: JobAdmin.save_model writes
        # the cleaned values through JobBoard.edit_job(), under the state check.
        pass

    def save(self, commit: bool = True) -> Job:
        # JobAdmin.save_model writes through JobBoard.edit_job(); nothing is saved here.
        job: Job = self.instance
        return job

    def save_m2m(self) -> None:
        """Nothing: a job has no many-to-many fields, and is saved through the board."""


class JobAdmin(TaskloopModelAdmin):
    """Jobs of every board. The trash is the "trashed" state; re-post brings a job back."""

    form = JobForm
    list_display = (
        "name",
        "job_state",
        "board_name",
        "priority_display",
        "owner_display",
        "attempts",
        "age",
        "modified",
        "short_uuid",
    )
    list_display_links = ("name",)
    list_filter = (
        JobStateFilter,
        "board",
        JobPriorityFilter,
        ("created_on", DateTimeRangeFilterBuilder(title=_("created on"))),
        ("last_modified", DateTimeRangeFilterBuilder(title=_("last modified"))),
        ("claim_expires_at", DateTimeRangeFilterBuilder(title=_("claim expires at"))),
        ("trashed_at", DateTimeRangeFilterBuilder(title=_("trashed at"))),
    )
    # No join with the board table (see TaskAdmin): board names come from one small query.
    list_select_related = ()
    search_fields = ("=uuid", "name")
    search_help_text = _("A job's uuid, or part of its name.")
    # Posting order (the primary key), newest first; priority sorts through the claim index.
    ordering = ("-sequence",)
    sortable_by = ("name", "priority_display", "age")
    actions = ["abandon_jobs", "trash_jobs", "repost_jobs", "set_priority"]
    readonly_fields = (
        "uuid",
        "board",
        "name",
        "job_state",
        "claimed_by",
        "claim_expires_at",
        "created_on",
        "last_modified",
        "trashed_by",
        "trashed_at",
        "reposted_as_link",
        "attempts",
        "failures",
        "progress",
    )
    fieldsets = (
        (None, {"fields": ("uuid", "board", "name", "job_state", "progress", "priority", "details")}),
        (_("Claim"), {"fields": ("claimed_by", "claim_expires_at")}),
        (
            _("History"),
            {"fields": ("created_on", "last_modified", "trashed_by", "trashed_at", "reposted_as_link")},
        ),
        (_("Attempts and failures"), {"fields": ("attempts", "failures")}),
    )

    def get_paused_note(self, request: HttpRequest) -> str | None:
        chosen = request.GET.get("board__id__exact")
        board = JobBoard.objects.filter(pk=chosen).first() if chosen else None
        if board is not None and board.paused:
            return str(
                _("Board %(name)s is paused: claim_next hands out nothing until it is resumed.")
                % {"name": board.name}
            )
        return None

    def is_read_only(self, obj: Job) -> bool:
        # A trashed job cannot be edited (JobForm.clean says so): re-post it, edit the new one.
        return bool(obj.trashed)

    def get_readonly_fields(self, request: HttpRequest, obj: Job | None = None) -> Any:
        fields = tuple(super().get_readonly_fields(request, obj))
        trashed = obj is not None and obj.trashed
        return (*fields, "priority", "priority_display", "details") if trashed else fields

    def get_fieldsets(self, request: HttpRequest, obj: Job | None = None) -> Any:
        fieldsets = super().get_fieldsets(request, obj)
        if obj is None or not obj.trashed:
            return fieldsets
        # Shown, not edited: the priority by its name.
        return [
            (
                name,
                {
                    **options,
                    "fields": [f if f != "priority" else "priority_display" for f in options["fields"]],
                },
            )
            for name, options in fieldsets
        ]

    @admin.display(description=_("reposted as"))
    def reposted_as_link(self, obj: Job) -> str:
        if not obj.reposted_as:
            return "—"
        new = Job.objects.db_manager(obj._state.db).filter(uuid=obj.reposted_as).only("pk").first()
        if new is None:  # consumed since
            return format_html("{} <small>{}</small>", obj.reposted_as, _("(consumed or gone)"))
        return format_html('<a href="{}">{}</a>', self.admin_url("change", new.pk), obj.reposted_as)

    @admin.display(description=_("last modified"), ordering="last_modified")
    def modified(self, obj: Job) -> str:
        return when_cell(obj.last_modified, self.now())

    def get_retry(self, obj: Job) -> Retry:
        if obj.trashed and not obj.reposted_as:
            return (str(_("Retry: re-post this job")), lambda: obj.board.repost(obj))
        return None

    @admin.display(description=_("attempts and failures"))
    def failures(self, obj: Job) -> str:
        return failure_history(obj, self.admin_site.name)

    @admin.display(description=_("progress"))
    def progress(self, obj: Job) -> str:
        return progress_html("job", obj.board.name, obj.uuid)

    action_form = type(
        "JobActionForm",
        (ActionForm,),
        {
            "priority": forms.ChoiceField(
                choices=[("", "---")] + [(m.name, m.name) for m in JobPriority],
                required=False,
                label=_("priority"),
            )
        },
    )

    def has_add_permission(self, request: HttpRequest) -> bool:
        # Jobs are posted with board.post(); an add form would bypass job_posted.
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Jobs leave a board through consume or trash, never a bare DELETE.
        return False

    def get_taskloop_links(self, request: HttpRequest) -> list[tuple[str, str]]:
        return [
            (str(_("Trash")), self.admin_url("changelist") + "?state=trashed"),
            *super().get_taskloop_links(request),
        ]

    @admin.display(description=_("state"))
    def job_state(self, obj: Job) -> str:
        state = job_state(obj, self.now())
        if state == "trashed":
            # Why and when it was trashed: its last failure, and whether it was re-posted.
            note = format_html(" <small>{}</small>", _("re-posted")) if obj.reposted_as else ""
            return format_html(
                "{} {}{}", state_badge(JOB_STATE_LABELS[state], state), last_failure_note(obj), note
            )
        return state_badge(JOB_STATE_LABELS[state], state)

    @admin.display(description=_("board"))
    def board_name(self, obj: Job) -> str:
        return names_of(JobBoard, obj.board_id)

    @admin.display(description=_("priority"), ordering="priority")
    def priority_display(self, obj: Job) -> str:
        return priority_text(obj.priority)

    @admin.display(description=_("owner"))
    def owner_display(self, obj: Job) -> str:
        # Who holds it and, beneath, until when (one column for both: the list fits 1280 px).
        if obj.trashed:
            # Its state cell says trashed: who did it is enough here (the whole on hover).
            who = obj.trashed_by or "?"
            return format_html('<span title="{} {}">{}</span>', _("trashed by"), who, who)
        if obj.claimed_by is None:
            return "—"
        return format_html('{}<small class="tl-ago">{}</small>', obj.claimed_by, self.claim_ends(obj))

    @admin.display(description=_("uuid"))
    def short_uuid(self, obj: Job) -> str:
        return format_html('<code title="{}">{}…</code>', obj.uuid, obj.uuid[:8])

    @admin.display(description=_("claim ends"))
    def claim_ends(self, obj: Job) -> str:
        if obj.trashed or obj.claimed_by is None:
            return "—"
        if obj.claim_expires_at is None:
            return str(_("never"))
        return until_cell(obj.claim_expires_at, self.now())

    @admin.display(description=_("age"), ordering="-sequence")
    def age(self, obj: Job) -> str:
        return humanize_seconds(seconds_between(self.now(), obj.created_on))

    def save_model(self, request: HttpRequest, obj: Job, form: Any, change: bool) -> None:
        changes = {"priority": form.cleaned_data["priority"]}
        if form.details_changed:
            changes["details"] = form.cleaned_data["details"]
        if not obj.board.edit_job(obj, **changes):
            self.message_user(
                request, _("The job changed state meanwhile: nothing was saved."), messages.ERROR
            )

    def _each(self, request: HttpRequest, queryset: QuerySet[Any], verb: Any, done: str) -> None:
        """Apply ``verb(board, job)`` to every selected job; report successes and refusals."""
        self.run_each(
            request,
            queryset.select_related("board"),
            lambda job: verb(job.board, job),
            lambda job: f"Job {job.name!r}",
            done,
        )

    @admin.action(description=_("Abandon the claim (back to unclaimed)"), permissions=["change"])
    def abandon_jobs(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        # The admin acts for the current owner: abandon() needs the owner's name.
        def abandon(board: JobBoard, job: Job) -> None:
            if job.claimed_by is None:
                raise JobFailure("it is not claimed")
            board.abandon(job, job.claimed_by)

        self._each(request, queryset, abandon, "Abandoned %(n)d job(s).")

    @admin.action(description=_("Move to the trash"), permissions=["change"])
    def trash_jobs(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        who = admin_identity(request)

        def trash(board: JobBoard, job: Job) -> None:
            # trash() takes a job its caller holds: claim it as the admin first, atomically,
            # so that a job a worker holds is refused (UnclaimableJob), never taken away.
            with engine.write_transaction(Job, board.using):
                board.claim(job, who)
                board.trash(job, who)

        self._each(request, queryset, trash, "Moved %(n)d job(s) to the trash.")

    @admin.action(description=_("Re-post from the trash"), permissions=["change"])
    def repost_jobs(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._each(request, queryset, lambda board, job: board.repost(job), "Re-posted %(n)d job(s).")

    @admin.action(description=_("Set the priority chosen above"), permissions=["change"])
    def set_priority(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        name = request.POST.get("priority", "")
        if name not in JobPriority.__members__:
            self.message_user(request, _("Choose a priority in the list next to the action."), messages.ERROR)
            return
        priority = JobPriority[name]
        changed = sum(job.board.edit_job(job, priority=priority) for job in queryset.select_related("board"))
        skipped = queryset.count() - changed
        self.message_user(request, f"Set {changed} job(s) to {name}.", messages.SUCCESS)
        if skipped:
            self.message_user(request, f"{skipped} trashed job(s) left as they are.", messages.WARNING)


class JobBoardAdmin(QueueRowsAdmin):
    """Boards, with their job counts and a statistics page each. Hosts the dashboard."""

    noun = "board"

    list_display = ("name", "running", "live_jobs", "links", "created")
    search_fields = ("name",)
    ordering = ("name",)
    readonly_fields = ("created_on",)
    actions = ["pause_boards", "resume_boards"]

    @admin.action(description=_("Pause: workers claim nothing from it"), permissions=["change"])
    def pause_boards(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self.pause_rows(request, queryset)

    @admin.action(description=_("Resume"), permissions=["change"])
    def resume_boards(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self.resume_rows(request, queryset)

    def get_readonly_fields(self, request: HttpRequest, obj: JobBoard | None = None) -> tuple[str, ...]:
        # A board's name is how workers find it: renaming one would strand them.
        return ("name", "created_on") if obj is not None else ("created_on",)

    def save_model(self, request: HttpRequest, obj: JobBoard, form: Any, change: bool) -> None:
        if change:
            return
        board = JobBoard.objects.db_manager(router.db_for_write(JobBoard)).create_board(obj.name)
        obj.pk, obj.created_on, obj._state = board.pk, board.created_on, board._state

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description=_("created on"), ordering="created_on")
    def created(self, obj: JobBoard) -> str:
        return when_cell(obj.created_on, self.now())

    @admin.display(description=_("live jobs"))
    def live_jobs(self, obj: JobBoard) -> int:
        return obj.job_count

    @admin.display(description=_("see"))
    def links(self, obj: JobBoard) -> str:
        jobs = reverse("admin:django_taskloop_job_changelist", current_app=self.admin_site.name)
        return format_html(
            '<a href="{}?board__id__exact={}">{}</a> · <a href="{}?board__id__exact={}&amp;state=trashed">{}</a>'
            ' · <a href="{}">{}</a>',
            jobs,
            obj.pk,
            _("jobs"),
            jobs,
            obj.pk,
            _("trash"),
            self.admin_url("stats", obj.pk),
            _("statistics"),
        )

    def get_urls(self) -> list[Any]:
        site = self.admin_site

        def dashboard_was_here(request: HttpRequest) -> HttpResponse:
            # The dashboard is a URL of the site now (admin/__init__.py): old links go there.
            return HttpResponseRedirect(reverse("admin:django_taskloop_dashboard", current_app=site.name))

        return [
            path("<path:object_id>/stats/", site.admin_view(self.stats_view), name=self.url_name("stats")),
            path("dashboard/", dashboard_was_here),
            *super().get_urls(),
        ]

    def stats_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Show a board's jobs by state and by priority."""
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        board = self.get_object(request, object_id)
        if board is None:
            raise Http404(f"No board {object_id!r}")
        summary = board_summary(board)
        by_priority = board_priorities(board)
        by_state = [(str(JOB_STATE_LABELS[k]), v) for k, v in summary.counts.items()]
        rows = [
            ("job_count", board.job_count),
            *((f"state: {label}", v) for label, v in by_state),
            *((f"priority: {k}", v) for k, v in by_priority.items()),
            ("oldest live claim", humanize_seconds(summary.oldest_claim)),
        ]
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": _("Statistics of board %(name)s") % {"name": board.name},
            "object": board,
            "object_url": self.admin_url("change", board.pk),
            "rows": rows,
            "charts": [
                bar_chart(by_state, title=str(_("Jobs by state")), states=list(summary.counts)),
                bar_chart(list(by_priority.items()), title=str(_("Live jobs by priority"))),
            ],
            "changelist_url": self.admin_url("changelist"),
            "dashboard_url": dashboard_url(self.admin_site),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/django_taskloop/stats.html", context)


class ConsumedJobAdmin(TaskloopModelAdmin):
    """History of consumed jobs (kept for ``JOB_HISTORY_RETENTION`` seconds); read-only."""

    list_display = ("name", "board", "priority_name", "consumed_by", "consumed", "created", "short_uuid")
    list_filter = ("board", ("consumed_at", DateTimeRangeFilterBuilder(title=_("consumed at"))))
    search_fields = ("=uuid", "name")
    ordering = ("-consumed_at",)
    sortable_by = ("consumed",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description=_("priority"))
    def priority_name(self, obj: ConsumedJob) -> str:
        return priority_text(obj.priority)

    @admin.display(description=_("consumed at"), ordering="consumed_at")
    def consumed(self, obj: ConsumedJob) -> str:
        return when_cell(obj.consumed_at, self.now())

    @admin.display(description=_("created on"))
    def created(self, obj: ConsumedJob) -> str:
        return when_cell(obj.created_on, self.now())

    @admin.display(description=_("uuid"))
    def short_uuid(self, obj: ConsumedJob) -> str:
        return format_html('<code title="{}">{}…</code>', obj.uuid, obj.uuid[:8])


class BoardEntityAdmin(TaskloopModelAdmin):
    """Entities registered on boards, with how long ago each was last seen."""

    list_display = ("name", "kind", "board", "seen", "registered")
    list_filter = ("board", "kind", ("last_seen", DateTimeRangeFilterBuilder(title=_("last seen"))))
    search_fields = ("name",)
    ordering = ("kind", "name")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description=_("registered on"), ordering="registered_on")
    def registered(self, obj: BoardEntity) -> str:
        return when_cell(obj.registered_on, self.now())

    @admin.display(description=_("last seen"), ordering="last_seen")
    def seen(self, obj: BoardEntity) -> str:
        return when_cell(obj.last_seen, self.now())


def register(site: admin.AdminSite) -> None:
    """Register the boards' admins on ``site`` (unless the project already did)."""
    for model, model_admin in (
        (JobBoard, JobBoardAdmin),
        (Job, JobAdmin),
        (ConsumedJob, ConsumedJobAdmin),
        (BoardEntity, BoardEntityAdmin),
    ):
        if not site.is_registered(model):
            site.register(model, model_admin)
