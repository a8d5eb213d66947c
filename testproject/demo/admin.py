"""The demo's admin: articles with their review locks."""

from django.contrib import admin

from django_taskloop.admin import LockableAdmin

from .models import Article


@admin.register(Article)
class ArticleAdmin(LockableAdmin):
    list_display = ["title", "reviewed", "reviewed_by"]
    list_filter = ["reviewed"]
    search_fields = ["=id", "title"]
