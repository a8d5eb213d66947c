"""The demo's models: articles that editors review five at a time (seed 003), and loops."""

from django.db import models

from django_taskloop.models import Lockable, TaskLoop


class Article(Lockable):
    """An article waiting for an editor's review; editors claim five at a time."""

    title = models.CharField(max_length=200)
    reviewed = models.BooleanField(default=False)
    reviewed_by = models.CharField(max_length=100, blank=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return self.title


class ArticleLoop(TaskLoop):
    """The demo's loop: every article's id, re-checked once an hour by a worker."""

    class Meta:
        verbose_name = "article loop"
