"""What ``taskloop alive`` reads: whether a worker process on this host beats.

The operator's verbs that change queues (retry, pause, resume, prune) live with the queue:
:mod:`django_taskloop.queues`.
"""

from __future__ import annotations

from django.db.models import Count, Max

from django_taskloop import engine
from django_taskloop.conf import setting
from django_taskloop.human import duration, plural
from django_taskloop.models import WorkerProcess

__all__ = ["alive"]


def alive(host: str) -> tuple[bool, str]:
    """Whether a worker process on ``host`` beat within ``WORKER_TIMEOUT`` (what the workers
    page calls live), and one line saying so: a process manager's or Kubernetes' check."""
    live = WorkerProcess.objects.alive().filter(host=host).aggregate(n=Count("pk"), newest=Max("beat_at"))
    if not live["n"]:
        within = duration(float(setting("WORKER_TIMEOUT")))
        return False, f"no live worker process on host {host} (none beat in the last {within})"
    age = (engine.db_now() - live["newest"]).total_seconds()
    found = plural(live["n"], "live worker process", "live worker processes")
    return True, f"{found} on host {host}, the newest beat {duration(age)} ago"
