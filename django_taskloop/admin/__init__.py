"""The Django admin of django-taskloop.

Imported by ``admin.autodiscover()``. It registers ``JobBoard``/``Job`` and ``Tube``/``Task``,
and every concrete :class:`~django_taskloop.models.TaskLoop` subclass that its project does
not register itself (see :func:`register_loops`): a project registers its own ``ModelAdmin``
for a loop in its ``admin.py`` as usual, with no ``unregister``. ``LockableAdmin`` and ``TaskLoopAdmin`` are
public, to subclass in your own ``admin.py``.
"""

from __future__ import annotations

from .base import TaskloopAdminMixin
from .boards import JobAdmin, JobBoardAdmin
from .charts import bar_chart
from .lockable import LockableAdmin, LockStateFilter
from .loops import LoopStateFilter, TaskLoopAdmin, register_loops
from .paginator import EstimatedCountPaginator
from .tubes import TaskAdmin, TubeAdmin

__all__ = [
    "EstimatedCountPaginator",
    "JobAdmin",
    "JobBoardAdmin",
    "TaskAdmin",
    "TubeAdmin",
    "LockStateFilter",
    "LoopStateFilter",
    "TaskLoopAdmin",
    "register_loops",
    "LockableAdmin",
    "TaskloopAdminMixin",
    "bar_chart",
]

from django.contrib import admin as _admin  # noqa: E402

from . import boards as _boards  # noqa: E402
from . import loops as _loops  # noqa: E402
from . import tubes as _tubes  # noqa: E402

_boards.register(_admin.site)
_tubes.register(_admin.site)

# Loops of apps whose admin has already run, or that have none, at once; the others when the
# site builds its URLs, after every app's admin module has had its say.
register_loops()
_loops.register_loops_when_urls_are_built(_admin.site)
