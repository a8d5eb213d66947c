"""The demo's handlers, run by ``manage.py workers``: a loop, a board and a tube."""

from __future__ import annotations

import logging
from typing import Any

from django_taskloop.workers import board, loop, tube

from .models import Article, ArticleLoop, Feed, FeedLoop

logger = logging.getLogger(__name__)


@loop(ArticleLoop, batch=50, lock_for=60)
def recheck(article_id: int) -> None:
    """Review an article by machine: the loop comes back to every id once an hour."""
    Article.objects.filter(pk=article_id, reviewed=False).update(reviewed=True, reviewed_by="robot")


@loop(FeedLoop, batch=20, lock_for=120, min_loop_time=900)
def fetch_feed(feed_id: int) -> None:
    """Fetch a feed; the loop brings it back every 15 minutes."""
    Feed.objects.get(pk=feed_id).fetch()


@board("demo-builds", expiry=60)
def build(job: Any) -> None:
    """Build what the job names (the demo only says so)."""
    logger.debug("building %s with %s", job.name, job.details)


@tube("demo-emails", batch=50)
def send_email(task: Any) -> None:
    """Send the e-mail the task holds (the demo only logs it)."""
    logger.debug("e-mail about article %s sent", task.data["article"])
