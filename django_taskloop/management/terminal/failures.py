"""``taskloop failures``: the latest handler failures with their error, newest first.

A Django Task's failures are named by its queue's Django name and its result id, as in the
admin's Failures list.
"""

from __future__ import annotations

import json
from typing import Any

from django_taskloop import engine, shards
from django_taskloop.models import Failure
from django_taskloop.queues import TASKS_SUFFIX, Queue
from django_taskloop.stats import DJANGO_TASK, TASKS_TUBE_PREFIXES, shown_queue

from .text import WIDTH, ago, clip, table

__all__ = ["failures", "failures_lines", "failures_json"]

#: The narrowest message column worth having; below it the message gets a line of its own.
MIN_MESSAGE = 30


def failures(queue: Queue | None, since: float | None, limit: int) -> list[Failure]:
    """Return the latest ``limit`` failures, newest first, of ``queue`` (every queue if
    ``None``) in the last ``since`` seconds (ever if ``None``), from every database that holds
    the queue (a shard's workers record its failures on it)."""
    rows = Failure.objects.order_by("-at", "-pk")
    if queue is not None and queue.kind == DJANGO_TASK:
        rows = rows.filter(
            kind="task", queue__in=[prefix + queue.name.partition("@")[0] for prefix in TASKS_TUBE_PREFIXES]
        )
        databases = queue.databases
    elif queue is not None and queue.model is not None:  # a loop: its failures where Failure lives
        rows, databases = rows.filter(kind="loop", queue=queue.name), []
    elif queue is not None:
        # A shard named as ``emails@queue2``: its failures are recorded as ``emails``, there.
        rows = rows.filter(kind=queue.kind, queue=queue.shards[0].name)
        databases = queue.databases
    else:
        databases = shards.tube_databases()
    if since is not None:
        rows = rows.filter(at__gte=engine.DbNow(-since))
    found = [f for using in dict.fromkeys(databases or [rows.db]) for f in rows.using(using)[:limit]]
    return sorted(found, key=lambda f: (f.at, f.pk), reverse=True)[:limit]


def _where(failure: Failure) -> tuple[str, str]:
    """The failure's ``(kind, queue)`` as the read model names it (``emails@queue2``: a shard's)."""
    kind, queue = shown_queue(failure.kind, failure.queue)
    return kind, queue if kind == "loop" else shards.shown(queue, failure._state.db or "default")


def failures_lines(found: list[Failure], *, tracebacks: bool = False) -> list[str]:
    """Return the failures as a table (and each one's traceback below it if asked)."""
    if not found:
        return ["No failures."]
    now = engine.db_now()
    rows = []
    for f in found:
        kind, queue = _where(f)
        shown = queue if kind != DJANGO_TASK else f"{queue}{TASKS_SUFFIX}"
        rows.append(
            [ago((now - f.at).total_seconds()), shown, f.item, str(f.attempt), f.error.rsplit(".", 1)[-1]]
        )
    header = ["WHEN", "QUEUE", "ITEM", "TRY", "ERROR", "MESSAGE"]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(5)]
    room = WIDTH - sum(widths) - 2 * 5
    if room >= MIN_MESSAGE:
        cells = [[*row, clip(f.message, room)] for row, f in zip(rows, found, strict=True)]
        lines = table(header, cells, right=[3])
    else:
        # Long ids leave the message too little room: it goes on a line of its own, indented.
        body = table(header[:-1], rows, right=[3])
        lines = body[:1]
        for line, f in zip(body[1:], found, strict=True):
            lines += [line, "    " + clip(f.message, WIDTH - 4)]
    if tracebacks:
        for row, f in zip(rows, found, strict=True):
            lines += [
                "",
                f"--- {row[1]} item {f.item}, attempt {f.attempt}, {f.at:%Y-%m-%d %H:%M:%S}, on {f.worker}",
            ]
            lines += f.traceback.rstrip().splitlines()
    return lines


def _as_json(failure: Failure) -> dict[str, Any]:
    kind, queue = _where(failure)
    return {
        "at": failure.at.isoformat(),
        "kind": kind,
        "queue": queue,
        "item": failure.item,
        "attempt": failure.attempt,
        "worker": failure.worker,
        "error": failure.error,
        "message": failure.message,
        "traceback": failure.traceback,
    }


def failures_json(found: list[Failure]) -> str:
    """Return the failures as JSON: ``{"failures": [...]}``, newest first."""
    return json.dumps({"failures": [_as_json(f) for f in found]}, indent=2)
