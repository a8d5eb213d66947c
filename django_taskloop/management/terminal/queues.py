"""Queues by the names an operator types: ``emails``, ``default``, ``testapp.feedloop``, or with
their kind in front when two kinds share a name (``task:emails``, ``job:emails``).

Names are the read model's (:mod:`django_taskloop.stats`): a tube's or board's name, a loop's
model label, a Django Tasks queue's Django name (kind ``django_task``; its tubes
``tasks.<name>`` and ``tasks-keyed.<name>`` are one queue). A tube of a Django Tasks queue
may still be named on its own (``task:tasks.default``). A Django Tasks queue may also be named
as ``taskloop failures`` shows it: ``default (tasks)``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from django_taskloop import shards
from django_taskloop.models import JobBoard, TaskLoop, Tube
from django_taskloop.stats import DJANGO_TASK, TASKS_TUBE_PREFIXES, django_tasks_queue, loop_models

from .text import BadInput

__all__ = ["KINDS", "TASKS_SUFFIX", "Queue", "resolve", "known_names"]

#: The kinds an operator may put in front of a name, as the read model spells them.
KINDS = ("task", DJANGO_TASK, "job", "loop")
#: How a table names a Django Tasks queue where tubes are named too (``default (tasks)``):
#: typed back, it names that queue.
TASKS_SUFFIX = " (tasks)"
#: What each kind is called in sentences.
KIND_WORDS = {"task": "tube", DJANGO_TASK: "Django Tasks queue", "job": "board", "loop": "loop"}


@dataclasses.dataclass(frozen=True)
class Queue:
    """One queue, found: its kind, its name and what its verbs are called on."""

    kind: str
    name: str
    #: The tube, the board, or the loop's model.
    source: Any
    #: A Django Tasks queue's tubes (its tasks, its keyed tasks: those that exist, on every
    #: database that holds them).
    tubes: tuple[Tube, ...] = ()
    #: A tube's or a board's every shard (``source`` is the first): what the verbs act on.
    shards: tuple[Any, ...] = ()

    @property
    def everywhere(self) -> tuple[Any, ...]:
        """The tube or board on every database that holds it (one, unless sharded)."""
        return self.shards or (self.source,)

    @property
    def label(self) -> str:
        """Say what the queue is: ``tube emails``, ``Django Tasks queue default``."""
        return f"{KIND_WORDS[self.kind]} {self.name}"

    @property
    def key(self) -> str:
        """The queue's ``kind:name``."""
        return f"{self.kind}:{self.name}"


def _loop(name: str) -> type[TaskLoop] | None:
    return next((m for m in loop_models() if m._meta.label_lower == name.lower()), None)


def _candidates(kind: str | None, name: str) -> list[Queue]:
    """Every queue of ``kind`` (any kind if ``None``) that is called ``name`` (a tube or a board
    on every database that holds it; ``name@alias``: that shard's only)."""
    found = []
    if kind in (None, "task") and (tubes := shards.everywhere(Tube, name)):
        if kind == "task" or django_tasks_queue(name) is None:
            found.append(Queue("task", name, tubes[0], shards=tuple(tubes)))
    if kind in (None, DJANGO_TASK):
        # The plain tube (its tasks) first, then the keyed one; each on every shard.
        ordered = [tube for prefix in TASKS_TUBE_PREFIXES for tube in shards.everywhere(Tube, prefix + name)]
        if ordered:
            found.append(Queue(DJANGO_TASK, name, ordered[0], tuple(ordered)))
    if kind in (None, "job") and (boards := shards.everywhere(JobBoard, name)):
        found.append(Queue("job", name, boards[0], shards=tuple(boards)))
    if kind in (None, "loop") and (model := _loop(name)) is not None:
        found.append(Queue("loop", model._meta.label_lower, model))
    return found


def known_names(limit: int = 12) -> list[str]:
    """Return up to ``limit`` queue names an operator may type, for an error message."""
    names: list[str] = []
    for tube in Tube.objects.order_by("name").values_list("name", flat=True)[: limit * 2]:
        name = django_tasks_queue(tube) or tube
        if name not in names:
            names.append(name)
    names += list(JobBoard.objects.order_by("name").values_list("name", flat=True)[:limit])
    names += [model._meta.label_lower for model in loop_models()]
    return names[:limit]


def resolve(text: str) -> Queue:
    """Return the queue ``text`` names (``name`` or ``kind:name``); :class:`BadInput` if none or
    several do."""
    kind, sep, name = text.partition(":")
    if not sep or kind not in KINDS:
        kind, name = "", text
    if not kind and text.endswith(TASKS_SUFFIX):  # as ``failures`` shows one: "default (tasks)"
        kind, name = DJANGO_TASK, text.removesuffix(TASKS_SUFFIX)
    if not name.strip():
        raise BadInput("a queue name is empty")
    found = _candidates(kind or None, name)
    if not found:
        known = ", ".join(known_names()) or "none yet"
        what = f"{KIND_WORDS[kind]} named" if kind else "queue named"
        raise BadInput(f"no {what} {name!r} (known: {known})")
    if len(found) > 1:
        raise BadInput(
            f"{name!r} names {len(found)} queues: say which, as {' or '.join(q.key for q in found)}"
        )
    return found[0]
