"""The demo's Django Tasks: run by ``manage.py workers`` through ``TaskloopBackend``."""

from __future__ import annotations

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task


@task()
def count_reviewed() -> dict[str, int]:
    """Count the articles reviewed so far (a report a view asks for in the background)."""
    from .models import Article

    return {"reviewed": Article.objects.filter(reviewed=True).count(), "total": Article.objects.count()}
