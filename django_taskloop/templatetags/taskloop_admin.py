"""Template tags of django-taskloop's admin pages."""

from __future__ import annotations

from typing import Any

from django import template
from django.contrib.admin.templatetags.admin_list import pagination

from ..admin.base import count_text

register = template.Library()


@register.inclusion_tag("admin/django_taskloop/pagination.html")
def taskloop_pagination(cl: Any) -> dict[str, Any]:
    """Django's pagination, with the total said as what it is: exact, ``~estimate`` or ``≥ cap``."""
    context = pagination(cl)
    paginator = cl.paginator
    exact = getattr(paginator, "count_is_exact", True)
    estimate = getattr(paginator, "count_is_estimate", False)
    context["count_label"] = count_text(cl.result_count, exact, estimate)
    return context
