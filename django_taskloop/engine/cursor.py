"""A consumer's claim cursor: where its last claim ended, so that the next one starts there.

A claim reads its queue's index in claim order from the head. Every row claimed or finished
leaves a dead entry at that head until the database cleans it up (PostgreSQL's VACUUM,
InnoDB's purge), and while a transaction is held open anywhere the cleanup waits for it: the
head fills with dead entries and every claim walks them all again (hundreds of milliseconds
after a few minutes at thousands of tasks a second). A claim that starts after the last row
this consumer claimed (``(pri, id) > (last pri, last id)``, one descent of the index) walks
only what was put since.

What it may skip — a row behind the cursor that became claimable later (released, kicked, a
delay that ran out, a higher priority put after, a put that committed after a later one) —
is found by a claim from the head, which a cursor asks for at least every
:data:`FULL_LOOK_MIN` seconds, or :data:`FULL_LOOK_FACTOR` times what the last look from the
head took, whichever is longer: the walk over dead entries costs the consumer at most a
twentieth of its time, and a skipped row waits at most that long. This is Que's job cursor
(``cursor_expiry``). Only where dead entries linger (PostgreSQL, MySQL/MariaDB): SQLite
removes an entry with its row, and its claims keep the exact order.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from django.db.models import Field, Model, Q, QuerySet

from . import compiler
from .vendor import features

#: A cursor looks from the head at least this often (seconds)…
FULL_LOOK_MIN = 1.0
#: …and no more often than this many times what its last look from the head took.
FULL_LOOK_FACTOR = 20.0


class ClaimCursor:
    """Where one consumer's claims of one queue stand (see the module's text). Give the same
    cursor to every batch claim and idle look of that consumer; the engine moves it."""

    __slots__ = ("position", "_full_at", "_full_cost", "_lock")

    def __init__(self) -> None:
        #: The claim-order values of the last row claimed (``None``: start from the head).
        self.position: tuple[Any, ...] | None = None
        self._full_at = -float("inf")
        self._full_cost = 0.0
        self._lock = threading.Lock()

    def start(self) -> tuple[Any, ...] | None:
        """Where the next claim or look starts: :attr:`position`, or ``None`` (the head) when
        a look from the head is due."""
        with self._lock:
            due = max(FULL_LOOK_MIN, FULL_LOOK_FACTOR * self._full_cost)
            if self.position is None or time.monotonic() - self._full_at >= due:
                return None
            return self.position

    def looked_from_head(self, started: float, found: bool) -> None:
        """A claim or look from the head that began at ``started`` (monotonic) ended: the next
        is due a while later. ``found``: a look saw a claimable row, which may lie behind the
        position, so the next claim starts from the head."""
        with self._lock:
            self._full_at = started
            self._full_cost = time.monotonic() - started
            if found:
                self.position = None

    def moved_to(self, position: tuple[Any, ...]) -> None:
        """A claim handed out rows up to ``position`` (the claim-order values of its last)."""
        with self._lock:
            self.position = position


class Resume:
    """One claim's or look's use of a cursor: where it starts (:attr:`start`, ``None``: the
    head), its filter, and moving the cursor when it is done."""

    __slots__ = ("cursor", "order", "start", "began")

    def __init__(self, cursor: ClaimCursor | None, queryset: QuerySet[Any], order_by: Sequence[Any]) -> None:
        using = queryset.db
        active = cursor is not None and features(using).dead_entries_linger
        self.order = order_attributes(queryset.model, order_by) if active else None
        self.cursor = cursor if self.order is not None else None
        self.start = self.cursor.start() if self.cursor is not None else None
        self.began = time.monotonic()

    def condition(self, using: str, values: Sequence[Any] | None = None) -> Q | None:
        """The filter for rows after the start (``values`` in its place: stand-ins a kept
        statement fills in); ``None`` from the head."""
        if self.start is None or self.order is None:
            return None
        return compiler.after(using, self.order, self.start if values is None else values)

    def claimed(self, objs: Sequence[Model]) -> None:
        """The claim handed out ``objs``, in claim order."""
        if self.cursor is None or self.order is None:
            return
        if self.start is None:
            self.cursor.looked_from_head(self.began, found=False)
        if objs:
            self.cursor.moved_to(tuple(getattr(objs[-1], name) for name, _ in self.order))

    def looked(self, found: bool) -> None:
        """A look (is anything claimable?) ended; ``found``: it saw something."""
        if self.cursor is not None and self.start is None:
            self.cursor.looked_from_head(self.began, found)


def order_attributes(model: type[Model], order_by: Sequence[Any]) -> list[tuple[str, bool]] | None:
    """``order_by`` (names, ``-`` for descending) as (attribute, descending) pairs; ``None`` if
    it is not plain non-null columns (Python cannot sort by it, nor a cursor stand on it)."""
    opts = model._meta
    order = []
    for name in order_by:
        if not isinstance(name, str):
            return None
        field = opts.pk if name.lstrip("-") == "pk" else opts.get_field(name.lstrip("-"))
        if not isinstance(field, Field) or field.null or not field.concrete:
            return None
        order.append((field.attname, name.startswith("-")))
    return order
