"""Liveness records on job boards (TaskFlow's registered entities, e.g. conductors):
``BoardEntity``, each with a heartbeat on the database's clock, alive or stale by it.
``JobBoard.register_entity`` writes them."""

from __future__ import annotations

from typing import Self

from django.db import models, router

from .. import engine
from ..conf import setting
from ..validation import check_seconds

__all__ = ["BoardEntity", "BoardEntityQuerySet", "BoardEntityManager"]

_KIND_LENGTH = 100
_NAME_LENGTH = 255


class BoardEntityQuerySet(models.QuerySet["BoardEntity"]):
    """Registered entities, alive or stale by their last heartbeat."""

    def stale(self, timeout: float | None = None) -> Self:
        """Entities not seen for ``timeout`` seconds (default ``TASKLOOP["ENTITY_TIMEOUT"]``)."""
        timeout = self._timeout(timeout)
        return self.filter(last_seen__lte=engine.DbNow(-timeout))

    def alive(self, timeout: float | None = None) -> Self:
        """Entities seen within ``timeout`` seconds (default ``TASKLOOP["ENTITY_TIMEOUT"]``)."""
        timeout = self._timeout(timeout)
        return self.filter(last_seen__gt=engine.DbNow(-timeout))

    @staticmethod
    def _timeout(timeout: float | None) -> float:
        if timeout is None:
            return float(setting("ENTITY_TIMEOUT"))
        return check_seconds(timeout, "timeout", non_negative=True)


BoardEntityManagerBase = models.Manager.from_queryset(BoardEntityQuerySet)


class BoardEntityManager(BoardEntityManagerBase["BoardEntity"]):
    """Manager of :class:`BoardEntity`: ``stale()`` and ``alive()``."""


class BoardEntity(models.Model):
    """A liveness record (e.g. a conductor) registered on a board, with a heartbeat."""

    board = models.ForeignKey(
        "django_taskloop.JobBoard", on_delete=models.CASCADE, related_name="entities", db_index=False
    )
    kind = models.CharField(max_length=_KIND_LENGTH)
    name = models.CharField(max_length=_NAME_LENGTH)
    metadata = models.JSONField(default=dict, blank=True)
    registered_on = models.DateTimeField(editable=False)
    last_seen = models.DateTimeField(editable=False)

    objects = BoardEntityManager()

    class Meta:
        app_label = "django_taskloop"
        db_table = "taskloop_board_entity"
        ordering = ["kind", "name"]
        verbose_name_plural = "board entities"
        constraints = [
            models.UniqueConstraint(fields=["board", "kind", "name"], name="taskloop_entity_uniq"),
        ]
        indexes = [models.Index(fields=["last_seen"], name="taskloop_entity_seen_idx")]

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"

    def is_stale(self, timeout: float | None = None) -> bool:
        """Say whether this entity's last heartbeat is older than ``timeout`` (database clock)."""
        entities = BoardEntity.objects.db_manager(
            self._state.db or router.db_for_read(BoardEntity, instance=self)
        ).filter(pk=self.pk)
        return entities.stale(timeout).exists()
