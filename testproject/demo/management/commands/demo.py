"""``manage.py demo``: put work in every facade, run ``workers --burst``, show that it moved.

It reads as a short story: what is waiting before, what ran (the worker's own log goes to a
file the demo names), what is left after. Every run starts from fresh demo data, so a second
run tells the same story.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser

from django_taskloop.models import Job, JobBoard, TaskRecord, Tube

from ...models import Article, ArticleLoop, Feed, FeedLoop
from ...tasks import count_reviewed


class Command(BaseCommand):
    help = "Create demo work in two loops, a board, a tube and a Django Task; run the workers; show before/after."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--articles", type=int, default=200, help="Articles to create (default 200).")
        parser.add_argument("--processes", type=int, default=2, help="Worker processes (default 2).")
        parser.add_argument(
            "--log",
            default=str(Path(settings.BASE_DIR) / "demo-workers.log"),
            help="Where the workers' log goes (default testproject/demo-workers.log).",
        )

    def handle(self, *args: Any, articles: int, processes: int, log: str, **options: Any) -> None:
        say = self.stdout.write
        builds, emails = self.fresh_start(articles)

        say("Editors claim articles to review (Lockable.claim, seed 003):")
        self.editors_review()
        say("")
        say("Before the workers run:")
        self.show(builds, emails)

        say("")
        say(f"Running: manage.py workers --burst --processes {processes}  (its log: {log})")
        started = time.monotonic()
        with self.log_to(log):
            call_command("workers", burst=True, processes=processes)
        say(f"  every handler drained its queue in {time.monotonic() - started:.1f} s")

        say("")
        say("After:")
        self.show(builds, emails)

        say("")
        say("A view enqueues a Django Task (count_reviewed) and a worker runs it:")
        result = count_reviewed.enqueue()
        say(f"  enqueued: {result.status}")
        with self.log_to(log):
            call_command("workers", burst=True, only=["tasks.default"])
        result.refresh()
        value = result.return_value
        say(f"  then: {result.status}, {value['reviewed']} of {value['total']} articles reviewed")

    def fresh_start(self, articles: int) -> tuple[Any, Any]:
        """Remove the last run's demo data and create this run's work."""
        Article.objects.all().delete()
        ArticleLoop.objects.all().delete()
        Feed.objects.all().delete()  # takes the feeds out of FeedLoop too
        TaskRecord.objects.all().delete()
        builds = JobBoard.objects.create_board("demo-builds", if_not_exists=True)
        Job.objects.filter(board=builds).delete()
        emails = Tube.objects.create_tube("demo-emails", "fifottl", if_not_exists=True)
        emails.truncate()
        for tube in Tube.objects.filter(name__startswith="tasks."):
            tube.truncate()

        Article.objects.bulk_create([Article(title=f"Article {i + 1}") for i in range(articles)])
        ids = list(Article.objects.values_list("pk", flat=True))
        ArticleLoop.objects.add(ids)
        for n in range(5):  # saving a feed adds it to FeedLoop
            Feed.objects.create(url=f"https://example.com/feed/{n}.xml")
        for n in range(10):
            builds.post(f"build-{n}", {"target": f"release-{n}"})
        for pk in ids[:100]:
            emails.put({"article": pk})
        # The tube's counters are for its lifetime (Tarantool's statistics): count from here.
        self.sent_before = emails.statistics()["tasks"]["done"]
        return builds, emails

    def editors_review(self) -> None:
        """Two editors each claim five articles; nobody gets the same one."""
        waiting = Article.objects.filter(reviewed=False).order_by("id")
        ann = waiting.claim("editor-ann", 5, lock_for=600)
        bob = waiting.claim("editor-bob", 5, lock_for=600)
        self.stdout.write(f"  ann claimed articles {[a.pk for a in ann]}")
        self.stdout.write(f"  bob claimed articles {[a.pk for a in bob]} (not ann's: they are locked)")
        Article.objects.filter(pk__in=[a.pk for a in ann]).update(reviewed=True, reviewed_by="editor-ann")
        Article.objects.release("editor-ann")
        Article.objects.release("editor-bob")
        self.stdout.write("  ann reviewed hers; bob gave his back unreviewed; both released their locks")

    def show(self, builds: Any, emails: Any) -> None:
        say = self.stdout.write
        never = ArticleLoop.objects.filter(last_updated__isnull=True).count()
        reviewed = Article.objects.filter(reviewed=True).count()
        say(f"  articles reviewed:          {reviewed} of {Article.objects.count()}")
        say(f"  loop ArticleLoop:           {never} ids waiting for their first check")
        fetched = sum(Feed.objects.values_list("fetched", flat=True))
        say(f"  loop FeedLoop:              {FeedLoop.objects.count()} feeds, fetched {fetched} times in all")
        say(f"  board demo-builds:          {builds.job_count} jobs waiting")
        tasks = emails.statistics()["tasks"]
        sent = tasks["done"] - self.sent_before
        say(f"  tube demo-emails:           {tasks['ready']} e-mails ready to send, {sent} sent")

    class log_to:
        """Send the workers' log to ``path`` (appended), not to the terminal, while it lasts."""

        def __init__(self, path: str) -> None:
            self.handler = logging.FileHandler(path)
            self.handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
            self.logger = logging.getLogger("django_taskloop")

        def __enter__(self) -> None:
            self.saved = (self.logger.handlers[:], self.logger.propagate, self.logger.level)
            self.logger.handlers[:] = [self.handler]
            self.logger.propagate = False
            self.logger.setLevel(logging.INFO)

        def __exit__(self, *exc: Any) -> None:
            self.handler.close()
            self.logger.handlers[:], self.logger.propagate, level = self.saved
            self.logger.setLevel(level)
