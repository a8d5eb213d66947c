"""The Django admin of django-taskloop.

Imported by ``admin.autodiscover()``. It registers ``JobBoard``/``Job`` (the trash is the
"trashed" state of the job list), ``Tube``/``Task``, and every concrete
:class:`~django_taskloop.models.TaskLoop` subclass that its project does not register itself
(see :func:`register_loops`): a project registers its own ``ModelAdmin`` for a loop in its
``admin.py`` as usual, subclassing :class:`TaskLoopAdmin`, with no ``unregister``.

- ``LockableAdmin``: subclass it for your own ``Lockable`` models (lock columns, filters and
  a "release" action are added to yours).
- Every loop, board and tube has a statistics page (its ``stats()``/``statistics()``), and
  ``admin:django_taskloop_dashboard`` (``<admin>/django_taskloop/dashboard/``, a URL of the
  site itself, linked from the app index and every list) shows them all: a table of every
  queue (counts by state, latency (the oldest ready wait), rate, failed attempts of the last hour, what failed for
  good, paused), throughput charts as wide as their cards (server-side SVG), the live workers,
  and a card per queue. ``<admin>/django_taskloop/jobboard/dashboard/``, where it was,
  redirects there.
- Times read to the second with how long ago beneath (``base.when_cell``); every list fits
  1280 px with the sidebar and the filters open.
- Actions call the facades' verbs; a staff user without the change permission gets none.
- Built for millions of rows: pagination never counts a whole table
  (:class:`EstimatedCountPaginator`), list orders and sorts follow indexes, no facet counts.
- Schedules: next and last run of each; run now, pause, resume.
- On an ``AdminSite`` of your own: ``register_all(site)``.
"""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, URLResolver, path

from . import boards, loops, operating, results, schedules, tubes
from .base import TaskloopAdminMixin
from .boards import JobAdmin, JobBoardAdmin
from .charts import bar_chart
from .dashboard import dashboard_view, pause_view
from .lockable import LockableAdmin, LockStateFilter
from .loops import LoopStateFilter, TaskLoopAdmin, register_loops
from .paginator import EstimatedCountPaginator
from .results import TaskRecordAdmin
from .schedules import ScheduleAdmin
from .tubes import TaskAdmin, TubeAdmin

__all__ = [
    "EstimatedCountPaginator",
    "JobAdmin",
    "JobBoardAdmin",
    "LockStateFilter",
    "LockableAdmin",
    "LoopStateFilter",
    "ScheduleAdmin",
    "TaskAdmin",
    "TaskLoopAdmin",
    "TaskRecordAdmin",
    "TaskloopAdminMixin",
    "TubeAdmin",
    "bar_chart",
    "dashboard_urls",
    "register_all",
    "register_loops",
]


def dashboard_urls(site: admin.AdminSite) -> list[URLPattern]:
    """Return the dashboard's URLs on ``site``: ``admin:django_taskloop_dashboard`` and
    ``admin:django_taskloop_pause`` (the dashboard's pause and resume buttons)."""

    def dashboard(request: HttpRequest) -> HttpResponse:
        return dashboard_view(request, site)

    def pause(request: HttpRequest) -> HttpResponse:
        return pause_view(request, site)

    return [
        path("django_taskloop/dashboard/", site.admin_view(dashboard), name="django_taskloop_dashboard"),
        path("django_taskloop/dashboard/pause/", site.admin_view(pause), name="django_taskloop_pause"),
    ]


def add_dashboard(site: admin.AdminSite) -> None:
    """Serve the dashboard's URLs among ``site``'s own (once; the site keeps its own get_urls)."""
    if getattr(site, "_taskloop_dashboard", False):
        return
    build_urls = site.get_urls

    def get_urls() -> list[URLResolver | URLPattern]:
        return [*dashboard_urls(site), *build_urls()]

    # Set on the instance: a project's AdminSite subclass keeps its own get_urls.
    site.get_urls = get_urls  # type: ignore[method-assign]  # its URLs, extended
    site._taskloop_dashboard = True  # type: ignore[attr-defined]  # a marker: hooked once


def register_all(site: admin.AdminSite) -> None:
    """Register every django-taskloop admin on ``site`` that is not registered there yet.

    Loops of apps whose ``admin`` module has not run yet are registered when ``site`` builds
    its URLs, so that those modules may register their own admins first.
    """
    boards.register(site)
    tubes.register(site)
    operating.register(site)
    schedules.register(site)
    results.register(site)
    if site.index_template is None:
        # The admin index links the dashboard (a project's own index template wins).
        site.index_template = "admin/django_taskloop/index.html"
    register_loops(site)
    loops.register_loops_when_urls_are_built(site)
    add_dashboard(site)


register_all(admin.site)
