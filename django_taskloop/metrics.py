"""Prometheus metrics of every queue (SPEC §7), served by ``django_taskloop.urls``.

A Django Tasks queue shows as ``queue="<its Django name>", kind="django_task"``: its two tubes
(``tasks.<name>``, ``tasks-keyed.<name>``) are the backend's business, merged here.

Everything here only reads: a scrape changes nothing. Counts are grouped reads per state on
the claim indexes; ``taskloop_processed_total`` comes from the workers' throughput table, whose
pruned minutes fold into lifetime totals, so the counter never goes down.

A database that cannot be reached (a shard whose server is down) leaves out its queues'
series only: the others are served as ever, and ``taskloop_shard_up{database=…}`` says 0 for
it (1 for each database that was read).
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from typing import Any

from django.http import HttpRequest, HttpResponse

from . import shards
from .conf import setting
from .health import database_cleanup
from .models.operating import throughput_totals
from .stats import (
    QueueSummary,
    merge_django_tasks,
    queue_databases,
    queue_summaries,
    shown_queue,
    workers_serving,
)

__all__ = ["metrics", "render_metrics", "queue_gauges"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _label(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _line(name: str, labels: dict[str, Any], value: float) -> str:
    inner = ",".join(f'{key}="{_label(val)}"' for key, val in labels.items())
    return f"{name}{{{inner}}} {value:g}"


#: Metric state labels that differ from the read model's state names (kept for dashboards
#: built on them): a loop's ``new`` ids are ``never_done``.
STATE_LABELS = {("loop", "new"): "never_done"}


def queue_gauges(down: dict[str, str] | None = None) -> Iterable[tuple[str, str, dict[str, int], float]]:
    """Yield ``(kind, queue, {state: count}, oldest ready age in seconds)`` for every queue
    that could be read (``down``: filled with the databases that could not, by alias).

    Read from :func:`django_taskloop.stats.queue_summaries` (exact counts), the one
    definition of every state that the admin shows too.
    """
    for summary in _readable(down):
        yield _gauge(summary)


def _gauge(summary: QueueSummary) -> tuple[str, str, dict[str, int], float]:
    """``(kind, queue, {state: count}, oldest ready age in seconds)`` of one queue."""
    counts = {STATE_LABELS.get((summary.kind, state), state): n for state, n in summary.counts.items()}
    # A tube's shard other than the router's database: "emails@queue2".
    return summary.kind, shards.shown(summary.name, summary.using), counts, summary.oldest_ready or 0.0


def _readable(down: dict[str, str] | None) -> list[QueueSummary]:
    """Every queue's summary that could be read: a queue that is down has no series rather
    than false zeros."""
    return [s for s in merge_django_tasks(queue_summaries(down=down)) if s.down is None]


def render_metrics() -> str:
    """Return the Prometheus text exposition of every queue."""
    down: dict[str, str] = {}
    lines = _queue_lines(down)
    lines += [
        "# HELP taskloop_shard_up Whether each database that holds queues could be read (0: down).",
        "# TYPE taskloop_shard_up gauge",
        *(
            _line("taskloop_shard_up", {"database": alias}, int(alias not in down))
            for alias in queue_databases()
        ),
        "# HELP taskloop_processed_total Items workers settled, by outcome.",
        "# TYPE taskloop_processed_total counter",
    ]
    processed: dict[tuple[str, str], dict[str, int]] = {}
    for (kind, queue), totals in throughput_totals().items():
        into = processed.setdefault(shown_queue(kind, queue), {})
        for outcome, n in totals.items():
            into[outcome] = into.get(outcome, 0) + n
    for (kind, queue), totals in sorted(processed.items()):
        for outcome, n in totals.items():
            lines.append(
                _line("taskloop_processed_total", {"queue": queue, "kind": kind, "outcome": outcome}, n)
            )
    lines += [
        "# HELP taskloop_workers Live worker processes serving each queue.",
        "# TYPE taskloop_workers gauge",
    ]
    serving = workers_serving()
    for (kind, queue), n in sorted(serving.items()):
        lines.append(_line("taskloop_workers", {"queue": queue, "kind": kind}, n))
    return "\n".join([*lines, *_cleanup_lines()]) + "\n"


#: The gauges written per queue, in their order: name -> help.
_QUEUE_GAUGES = {
    "taskloop_items": "Items in each queue by state.",
    "taskloop_oldest_ready_seconds": "How long the next item to run has waited (0: none ready).",
    "taskloop_running_limit": "At most this many of a queue's items run at once, every worker together "
    "(queues with a running limit only; taskloop_items' taken: how many run).",
    "taskloop_rate_limit": "At most this many of a queue's items started per taskloop_rate_period_seconds, "
    "every worker together (queues with a rate only).",
    "taskloop_rate_period_seconds": "A queue's rate's period.",
    "taskloop_rate_used": "How many of a queue's items were started in its rate's window up to now.",
    "taskloop_key_limit": "At most this many of a queue's items of one key run at once, every worker "
    "together (keyed queues with a key limit above 1 only).",
    "taskloop_key_rate_limit": "At most this many of a queue's items of one key started per "
    "taskloop_key_rate_period_seconds, every worker together (keyed queues with a key rate only).",
    "taskloop_key_rate_period_seconds": "A queue's key rate's period.",
}


def _queue_lines(down: dict[str, str]) -> list[str]:
    """Each readable queue's items by state, its oldest ready item's age, its limits and rates
    (``down``: filled with the databases that could not be read). Each gauge's samples follow
    its ``HELP`` and ``TYPE``, as the text format asks."""
    samples: dict[str, list[str]] = {name: [] for name in _QUEUE_GAUGES}
    for summary in _readable(down):
        kind, queue, counts, age = _gauge(summary)
        labels = {"queue": queue, "kind": kind}
        for state, n in counts.items():
            samples["taskloop_items"].append(_line("taskloop_items", {**labels, "state": state}, n))
        samples["taskloop_oldest_ready_seconds"].append(
            _line("taskloop_oldest_ready_seconds", labels, round(age, 3))
        )
        for name, value in _limits_of(summary):
            samples[name].append(_line(name, labels, value))
    lines: list[str] = []
    for name, about in _QUEUE_GAUGES.items():
        lines += [f"# HELP {name} {about}", f"# TYPE {name} gauge", *samples[name]]
    return lines


def _limits_of(summary: QueueSummary) -> list[tuple[str, Any]]:
    """``summary``'s limit and rate gauges that it has: (name, value)."""
    found: list[tuple[str, Any]] = []
    if summary.limit is not None:
        found.append(("taskloop_running_limit", summary.limit))
    if summary.rate is not None:
        found += [
            ("taskloop_rate_limit", summary.rate.count),
            ("taskloop_rate_period_seconds", summary.rate.period),
            ("taskloop_rate_used", summary.started or 0),
        ]
    if summary.key_limit is not None:
        found.append(("taskloop_key_limit", summary.key_limit))
    if summary.key_rate is not None:
        found += [
            ("taskloop_key_rate_limit", summary.key_rate.count),
            ("taskloop_key_rate_period_seconds", summary.key_rate.period),
        ]
    return found


def _cleanup_lines() -> list[str]:
    """What holds back cleanup of the queue tables, per database (none on SQLite)."""
    found = database_cleanup()
    if not found:
        return []
    lines = [
        "# HELP taskloop_db_oldest_transaction_seconds How long the oldest other open transaction "
        "has held back cleanup (VACUUM, InnoDB purge) of the queue tables (0: none open).",
        "# TYPE taskloop_db_oldest_transaction_seconds gauge",
        *(
            _line(
                "taskloop_db_oldest_transaction_seconds", {"database": alias}, round(read.oldest_seconds, 3)
            )
            for alias, read in found.items()
        ),
    ]
    dead = [(alias, table, n) for alias, read in found.items() for table, n in sorted(read.dead_rows.items())]
    if dead:
        lines += [
            "# HELP taskloop_db_dead_rows Dead row versions in each queue table (PostgreSQL statistics).",
            "# TYPE taskloop_db_dead_rows gauge",
            *(_line("taskloop_db_dead_rows", {"database": a, "table": t}, n) for a, t, n in dead),
        ]
    backlog = [(alias, read.purge_backlog) for alias, read in found.items() if read.purge_backlog is not None]
    if backlog:
        lines += [
            "# HELP taskloop_db_purge_backlog Undo records InnoDB has not purged yet (history list length).",
            "# TYPE taskloop_db_purge_backlog gauge",
            *(_line("taskloop_db_purge_backlog", {"database": alias}, n) for alias, n in backlog),
        ]
    return lines


def _allowed(request: HttpRequest) -> bool:
    user = getattr(request, "user", None)
    if user is not None and user.is_active and user.is_staff:
        return True
    token = setting("METRICS_TOKEN")
    given = request.headers.get("Authorization", "")
    if token and given.startswith("Bearer "):
        return hmac.compare_digest(given[len("Bearer ") :].encode(), str(token).encode())
    return False


def metrics(request: HttpRequest) -> HttpResponse:
    """Serve the metrics to staff users or to a request with ``Bearer <METRICS_TOKEN>``."""
    if not _allowed(request):
        return HttpResponse("Forbidden: log in as staff or send Authorization: Bearer <token>\n", status=403)
    return HttpResponse(render_metrics(), content_type=CONTENT_TYPE)
