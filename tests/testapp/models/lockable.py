from django.db import models

from django_taskloop.models import Lockable

__all__ = ["Ticket"]


class Ticket(Lockable):
    """A row users claim; ``queue`` and ``rank`` exercise filtered and ordered claims."""

    queue = models.CharField(max_length=20, default="a")
    rank = models.IntegerField(default=0)

    class Meta:
        app_label = "testapp"
        indexes = [models.Index(fields=["queue", "rank"], name="testapp_ticket_queue_rank")]
