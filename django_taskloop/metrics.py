"""Prometheus metrics of every queue (SPEC §7), served by ``django_taskloop.urls``.

Everything here only reads: a scrape changes nothing. Counts are grouped reads per state on
the claim indexes; ``taskloop_processed_total`` comes from the workers' throughput table, whose
pruned minutes fold into lifetime totals, so the counter never goes down.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from typing import Any

from django.db.models import Min, Q
from django.http import HttpRequest, HttpResponse

from . import engine
from .conf import setting
from .models import Job, JobBoard, Task, Tube, WorkerProcess
from .models.operating import throughput_totals
from .reaper import loop_models

__all__ = ["metrics", "render_metrics", "queue_gauges"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _label(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _line(name: str, labels: dict[str, Any], value: float) -> str:
    inner = ",".join(f'{key}="{_label(val)}"' for key, val in labels.items())
    return f"{name}{{{inner}}} {value:g}"


def _age(oldest: Any, now: Any) -> float:
    if oldest is None:
        return 0.0
    return max(0.0, (now - engine.to_datetime(oldest)).total_seconds())


def queue_gauges() -> Iterable[tuple[str, str, dict[str, int], float]]:
    """Yield ``(kind, queue, {state: count}, oldest ready age in seconds)`` for every queue."""
    now = engine.db_now("default")
    for tube in Tube.objects.order_by("name"):
        tasks = Task.objects.filter(tube=tube)
        # Task.objects' named states: a task past its ttl is "expired", never "ready".
        counts = tasks.state_counts()
        # The head of the claim order (one index read): the task the next take gets.
        head = tasks.ready().in_claim_order().values_list("created", flat=True).first()
        yield "task", tube.name, counts, _age(head, now)
    for board in JobBoard.objects.order_by("name"):
        jobs = Job.objects.filter(board=board)
        live = Q(claimed_by__isnull=False) & (Q(claim_expires_at__isnull=True) | Q(claim_expires_at__gt=now))
        claimed = jobs.filter(live, trashed=False).count()
        trashed = jobs.filter(trashed=True).count()
        unclaimed = jobs.filter(trashed=False).exclude(live).count()
        oldest = (
            jobs.filter(trashed=False)
            .exclude(live)
            .in_claim_order()
            .values_list("created_on", flat=True)
            .first()
        )
        yield (
            "job",
            board.name,
            {"unclaimed": unclaimed, "claimed": claimed, "trashed": trashed},
            _age(oldest, now),
        )
    for model in loop_models():
        rows = model._default_manager.all()
        locked = rows.filter(lock_until__gt=now).count()
        never = rows.filter(last_updated__isnull=True, lock_until__isnull=True).count()
        total = rows.count()
        # The oldest due item: an expired or bumped lock, else the least recently done id.
        due = rows.filter(lock_until__lte=now).aggregate(oldest=Min("lock_until"))["oldest"]
        yield (
            "loop",
            model._meta.label_lower,
            {"locked": locked, "never_done": never, "idle": total - locked - never},
            _age(due, now),
        )


def render_metrics() -> str:
    """Return the Prometheus text exposition of every queue."""
    lines = [
        "# HELP taskloop_items Items in each queue by state.",
        "# TYPE taskloop_items gauge",
    ]
    ages = []
    for kind, queue, counts, age in queue_gauges():
        for state, n in counts.items():
            lines.append(_line("taskloop_items", {"queue": queue, "kind": kind, "state": state}, n))
        ages.append(_line("taskloop_oldest_ready_seconds", {"queue": queue, "kind": kind}, round(age, 3)))
    lines += [
        "# HELP taskloop_oldest_ready_seconds How long the next item to run has waited (0: none ready).",
        "# TYPE taskloop_oldest_ready_seconds gauge",
        *ages,
        "# HELP taskloop_processed_total Items workers settled, by outcome.",
        "# TYPE taskloop_processed_total counter",
    ]
    for (kind, queue), totals in sorted(throughput_totals().items()):
        for outcome, n in totals.items():
            lines.append(
                _line("taskloop_processed_total", {"queue": queue, "kind": kind, "outcome": outcome}, n)
            )
    lines += [
        "# HELP taskloop_workers Live worker processes serving each queue.",
        "# TYPE taskloop_workers gauge",
    ]
    serving: dict[str, int] = {}
    for queues in WorkerProcess.objects.alive().values_list("queues", flat=True):
        for name in queues or []:
            serving[name] = serving.get(name, 0) + 1
    for name, n in sorted(serving.items()):
        kind, _, queue = name.partition(":")
        lines.append(_line("taskloop_workers", {"queue": queue, "kind": kind}, n))
    return "\n".join(lines) + "\n"


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
