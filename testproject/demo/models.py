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


class Feed(models.Model):
    """A feed to fetch again and again; saving one puts it in :class:`FeedLoop`."""

    url = models.URLField(unique=True)
    title = models.CharField(max_length=200, blank=True)
    fetched = models.PositiveIntegerField(default=0, editable=False)

    def __str__(self) -> str:
        return self.title or self.url

    def save(self, *args, **kwargs) -> None:
        super().save(*args, **kwargs)
        # A no-op for a feed already in the loop: its place in line is kept.
        FeedLoop.objects.add(self)

    def fetch(self) -> None:
        """Fetch the feed (the demo only counts); called by the loop's worker."""
        Feed.objects.filter(pk=self.pk).update(fetched=models.F("fetched") + 1)


class FeedLoop(TaskLoop):
    """The feeds to fetch: one row per feed, keyed by the feed itself (no id column).

    Deleting a feed takes it out of the loop. ``FeedLoop.objects.bump(feed)`` fetches a feed
    next; ``FeedLoop.objects.stats()`` tells how far behind the fetchers are.
    """

    feed = models.OneToOneField(Feed, primary_key=True, on_delete=models.CASCADE)

    class Meta:
        verbose_name = "feed loop"

    def __str__(self) -> str:
        return f"loop of feed {self.pk}"
