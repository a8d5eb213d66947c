"""The Django admin of django-taskloop.

Imported by ``admin.autodiscover()``. It registers ``JobBoard``/``Job`` and ``Tube``/``Task``,
and every concrete :class:`~django_taskloop.models.TaskLoop` subclass that its project does
not register itself (see :func:`register_loops`). ``LockableAdmin`` and ``TaskLoopAdmin`` are
public, to subclass in your own ``admin.py``.
"""

from __future__ import annotations

from .base import TaskloopAdminMixin
from .charts import bar_chart
from .lockable import LockableAdmin, LockStateFilter
from .loops import LoopStateFilter, TaskLoopAdmin, register_loops
from .paginator import EstimatedCountPaginator

__all__ = [
    "EstimatedCountPaginator",
    "LockStateFilter",
    "LoopStateFilter",
    "TaskLoopAdmin",
    "register_loops",
    "LockableAdmin",
    "TaskloopAdminMixin",
    "bar_chart",
]

# Loops of apps whose admin has already run, or that have none; register_loops() again from
# an AppConfig.ready() catches those of apps whose admin modules come after this one.
register_loops()
