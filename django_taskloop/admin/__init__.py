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
from .paginator import EstimatedCountPaginator

__all__ = [
    "EstimatedCountPaginator",
    "LockStateFilter",
    "LockableAdmin",
    "TaskloopAdminMixin",
    "bar_chart",
]
