"""Template tags of django-taskloop's admin pages."""

from __future__ import annotations

import functools
from typing import Any

from django import template
from django.contrib.admin.templatetags.admin_list import pagination
from django.template.loader import get_template
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

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


@functools.cache
def _ordered_breadcrumbs() -> bool:
    """Whether the admin draws breadcrumbs as ``<ol class="breadcrumbs">`` (Django 6) rather
    than ``<div class="breadcrumbs">`` (before): read off its own change list template."""
    loaded = getattr(get_template("admin/change_list.html"), "template", None)  # Django's engine
    source = getattr(loaded, "source", "")
    return '<ol class="breadcrumbs">' in source


@register.simple_tag
def taskloop_breadcrumbs(*crumbs: Any) -> SafeString:
    """Draw breadcrumbs as the admin of this Django version does (its style applies): ``crumbs``
    are ``url, label`` pairs, the last one's url empty (the page itself)."""
    pairs = list(zip(crumbs[::2], crumbs[1::2], strict=True))
    *links, (_url, here) = pairs
    if _ordered_breadcrumbs():
        # One item a line, as Django's own: its separators are spaced by that white space.
        items = format_html_join("\n", '<li><a href="{}">{}</a></li>', links)
        return format_html(
            '<ol class="breadcrumbs">\n{}\n<li aria-current="page">{}</li>\n</ol>', items, here
        )
    items = format_html_join("", '<a href="{}">{}</a> &rsaquo; ', links)
    return format_html('<div class="breadcrumbs">{}{}</div>', items, here)
