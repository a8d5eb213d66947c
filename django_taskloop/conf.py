"""The ``TASKLOOP`` setting: one dict merged over defaults, cached, reset on change."""

from __future__ import annotations

from functools import cache
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

DEFAULTS: dict[str, Any] = {
    # Seconds without a heartbeat after which a tube consumer counts as dead.
    "CONSUMER_TIMEOUT": 60,
    # Seconds without a heartbeat after which a board entity shows as stale.
    "ENTITY_TIMEOUT": 60,
    # Seconds to keep consumed jobs as history; 0 deletes them at once.
    "JOB_HISTORY_RETENTION": 0,
    # Seconds to keep acknowledged Django Tasks results.
    "RESULT_RETENTION": 7 * 24 * 3600,
    # Seconds to keep Failure rows (what workers saw fail, with tracebacks).
    "FAILURE_RETENTION": 7 * 24 * 3600,
    # Seconds of per-minute throughput kept for the dashboard (older minutes fold into totals).
    "THROUGHPUT_RETENTION": 48 * 3600,
    # Seconds without a heartbeat after which a worker process no longer shows as alive.
    "WORKER_TIMEOUT": 60,
    # Bearer token that may read django_taskloop.urls' metrics without a staff login.
    "METRICS_TOKEN": None,
    # Times a claim is retried inside the engine after a deadlock / lock timeout / busy SQLite.
    "RETRIES": 5,
    # Worker defaults.
    "MAX_ATTEMPTS": 5,
    "RETRY_BACKOFF": 1.0,
    "RETRY_BACKOFF_MAX": 300.0,
    "GRACE_PERIOD": 30.0,
    "HEARTBEAT_INTERVAL": 10.0,
    # Seconds one open transaction may hold back cleanup of the queue tables (PostgreSQL's
    # VACUUM, InnoDB's purge) before each worker logs a warning naming it; 0 turns it off.
    "HORIZON_WARNING": 60.0,
    # Seconds of work a worker claims at once, sized from each handler's measured time per
    # item (at least one item, at most the handler's batch); a handler's batch_time overrides.
    "BATCH_TIME": 0.1,
    # Polling of take()/wait(): first sleep, growth factor, longest sleep (seconds). A waiting
    # take that something wakes on every change (PostgreSQL's LISTEN, SQLite's file watch) polls
    # only for the clock (wakeup.CLOCK_POLL, 0.75 s); on MariaDB an idle worker reads once every
    # POLL_MAX, about 10 round trips a second.
    "POLL_MIN": 0.005,
    "POLL_FACTOR": 1.5,
    "POLL_MAX": 0.1,
    # Django Tasks run on a cron schedule: name → {"task": dotted path, "cron": "*/5 * * * *",
    # "args": [...], "kwargs": {...}} (see django_taskloop.schedules).
    "SCHEDULE": {},
    # The IANA time zone cron expressions are read in (None: UTC).
    "TIME_ZONE": None,
}


@cache
def get_config() -> dict[str, Any]:
    """Return ``settings.TASKLOOP`` merged over the defaults."""
    user = getattr(settings, "TASKLOOP", {}) or {}
    unknown = set(user) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"TASKLOOP: unknown key(s) {sorted(unknown)}; known: {sorted(DEFAULTS)}")
    return {**DEFAULTS, **user}


def setting(name: str) -> Any:
    """Return one TASKLOOP value."""
    return get_config()[name]


@receiver(setting_changed)
def _reset(*, setting: str, **kwargs: Any) -> None:
    if setting == "TASKLOOP":
        get_config.cache_clear()


#: The dotted path ``TASKS`` names the Django Tasks backend by.
TASKS_BACKEND = "django_taskloop.backends.TaskloopBackend"


def tasks_backend_aliases() -> list[str]:
    """Return the aliases of ``settings.TASKS`` that name :data:`TASKS_BACKEND` (read as written,
    so it works whether or not a Tasks framework can be imported)."""
    tasks = getattr(settings, "TASKS", None) or {}
    return [
        alias
        for alias, options in tasks.items()
        if isinstance(options, dict) and options.get("BACKEND") == TASKS_BACKEND
    ]
