"""Claimable rows on your own models (seeds 003 and 004): ``Lockable``."""

from __future__ import annotations

from typing import Any, Self

from asgiref.sync import sync_to_async
from django.db import models
from django.db.models import Q

from .. import engine
from ..validation import check_count, check_owner, check_seconds

__all__ = ["Lockable", "LockableQuerySet", "LockableManager"]


class LockableQuerySet(models.QuerySet[Any]):
    """Claim and release the rows of this queryset for an owner."""

    def claim(self, owner: str, limit: int, lock_for: float = 3600) -> list[Any]:
        """Lock up to ``limit`` rows of this queryset for ``owner`` and return them.

        Rows are taken in the queryset's ordering (then the model's, then primary key). Rows
        ``owner`` already holds are included and their lease renewed; rows that others hold
        with an unexpired lease are skipped.
        """
        locked_by = self.model._meta.get_field("locked_by")
        assert isinstance(locked_by, models.CharField) and locked_by.max_length is not None
        owner = check_owner(owner, "owner", max_length=locked_by.max_length)
        limit = check_count(limit, "limit", minimum=1)
        # (Without allow_none, check_seconds never gives None.)
        lock_for = check_seconds(lock_for, "lock_for", positive=True)
        if self.query.is_sliced:
            raise TypeError("claim() cannot be used on a sliced queryset; pass limit instead")
        order = list(self.query.order_by or self.model._meta.ordering or [])
        if not any(str(o).lstrip("-") in ("pk", self.model._meta.pk.name) for o in order):
            order.append("pk")
        claimable = Q(locked_by__isnull=True) | Q(lock_expires_at__lte=engine.DbNow()) | Q(locked_by=owner)
        claimed: list[Any] = engine.claim(
            self,
            limit=limit,
            claimable=claimable,
            order_by=order,
            changes={"locked_by": owner, "lock_expires_at": engine.DbNow(lock_for)},
            fetch=True,
        )
        return claimed

    def release(self, owner: str | None = None) -> int:
        """Clear the lock of every locked row here (only ``owner``'s if given); return the count."""
        queryset = self.filter(locked_by__isnull=False)
        if owner is not None:
            owner = check_owner(owner, "owner")
            queryset = queryset.filter(locked_by=owner)
        return queryset.update(locked_by=None, lock_expires_at=None)

    def release_expired(self) -> int:
        """Clear every lock here whose lease has ended; return the count."""
        return self.filter(lock_expires_at__lte=engine.DbNow()).update(locked_by=None, lock_expires_at=None)

    def locked(self) -> Self:
        """Rows under an unexpired lock."""
        return self.filter(lock_expires_at__gt=engine.DbNow())

    def unlocked(self) -> Self:
        """Rows free to claim: never locked, released, or with an expired lease."""
        return self.filter(Q(locked_by__isnull=True) | Q(lock_expires_at__lte=engine.DbNow()))

    async def aclaim(self, owner: str, limit: int, lock_for: float = 3600) -> list[Any]:
        """``await Model.objects.aclaim(...)``: :meth:`claim` from async code (same arguments,
        errors and result), in Django's thread for sync code (``sync_to_async(thread_sensitive=True)``,
        as Django's own async queryset methods run)."""
        return await sync_to_async(self.claim, thread_sensitive=True)(owner, limit, lock_for)


LockableManagerBase = models.Manager.from_queryset(LockableQuerySet)


class LockableManager(LockableManagerBase[Any]):
    """Manager of :class:`Lockable` models: ``claim``, ``release``, ``release_expired``."""


class Lockable(models.Model):
    """Abstract model whose rows workers can claim: ``Model.objects.claim(owner, limit)``."""

    locked_by = models.CharField(max_length=255, null=True, blank=True, db_index=True, editable=False)
    lock_expires_at = models.DateTimeField(null=True, blank=True, db_index=True, editable=False)

    objects = LockableManager()

    class Meta:
        abstract = True
