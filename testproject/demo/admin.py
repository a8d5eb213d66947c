"""The demo's admin: articles with their review locks."""

from django.contrib import admin

from django_taskloop.admin import LockableAdmin, TaskLoopAdmin

from .models import Article, ArticleLoop


@admin.register(Article)
class ArticleAdmin(LockableAdmin):
    list_display = ["title", "reviewed", "reviewed_by"]
    list_filter = ["reviewed"]
    search_fields = ["=id", "title"]


@admin.register(ArticleLoop)
class ArticleLoopAdmin(TaskLoopAdmin):
    """The project's own admin of a loop: django-taskloop registers FeedLoop by itself."""

    list_per_page = 100
