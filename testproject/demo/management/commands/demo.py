"""``manage.py demo``: put work in every facade, run ``workers --burst``, show that it moved."""

from __future__ import annotations

from typing import Any

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser

from django_taskloop.models import JobBoard, Tube

from ...models import Article, ArticleLoop, Feed
from ...tasks import count_reviewed


class Command(BaseCommand):
    help = (
        "Create demo work in a loop, a board, a tube and a Django Task; run the workers; show before/after."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--articles", type=int, default=200, help="Articles to create (default 200).")
        parser.add_argument("--processes", type=int, default=2, help="Worker processes (default 2).")

    def handle(self, *args: Any, articles: int, processes: int, **options: Any) -> None:
        first = Article.objects.count()
        Article.objects.bulk_create([Article(title=f"Article {first + i + 1}") for i in range(articles)])
        ids = list(Article.objects.filter(reviewed=False).values_list("pk", flat=True))
        ArticleLoop.objects.add(ids)
        for n in range(5):  # saving a feed adds it to FeedLoop
            Feed.objects.get_or_create(url=f"https://example.com/feed/{n}.xml")
        builds = JobBoard.objects.create_board("demo-builds", if_not_exists=True)
        for n in range(10):
            builds.post(f"build-{n}", {"target": f"release-{n}"})
        emails = Tube.objects.create_tube("demo-emails", "fifottl", if_not_exists=True)
        for pk in ids[:100]:
            emails.put({"article": pk})
        result = count_reviewed.enqueue()

        self.editors_review()
        self.stdout.write("before:")
        self.show(builds, emails)
        self.stdout.write(f"  @task count_reviewed: {result.status}")
        self.stdout.write(f"running: manage.py workers --burst --processes {processes}")
        call_command("workers", burst=True, processes=processes)
        result.refresh()
        self.stdout.write("after:")
        self.show(builds, emails)
        self.stdout.write(f"  @task count_reviewed: {result.status}, returned {result.return_value}")

    def editors_review(self) -> None:
        """Seed 003's example: two editors each claim five articles; nobody gets the same one."""
        waiting = Article.objects.filter(reviewed=False).order_by("id")
        ann = waiting.claim("editor-ann", 5, lock_for=600)
        bob = waiting.claim("editor-bob", 5, lock_for=600)
        self.stdout.write(f"editors: ann claimed {[a.pk for a in ann]}, bob claimed {[a.pk for a in bob]}")
        Article.objects.filter(pk__in=[a.pk for a in ann]).update(reviewed=True, reviewed_by="editor-ann")
        released = Article.objects.release("editor-ann") + Article.objects.release("editor-bob")
        self.stdout.write(f"editors: ann reviewed hers, both released their locks ({released} rows)")

    def show(self, builds: Any, emails: Any) -> None:
        stats = ArticleLoop.objects.stats()
        never = ArticleLoop.objects.filter(last_updated__isnull=True).count()
        self.stdout.write(
            f"  loop ArticleLoop: {never} ids never done, {stats['locked']} locked; "
            f"articles reviewed {Article.objects.filter(reviewed=True).count()}/{Article.objects.count()}"
        )
        fetched = sum(Feed.objects.values_list("fetched", flat=True))
        self.stdout.write(f"  loop FeedLoop: {Feed.objects.count()} feeds, fetched {fetched} times in all")
        self.stdout.write(f"  board demo-builds: {builds.job_count} jobs")
        tasks = emails.statistics()["tasks"]
        self.stdout.write(f"  tube demo-emails: {tasks['ready']} ready, {tasks['done']} done")
