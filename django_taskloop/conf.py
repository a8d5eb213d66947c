"""The ``TASKLOOP`` setting: one dict merged over defaults, cached, reset on change."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from .validation import check_aliases, check_count, check_rate, check_seconds

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
    # Items one worker process runs at once (each in a thread of its own, an async def
    # handler's coroutine on that thread's event loop): workers --concurrency's default; a
    # handler's own concurrency= wins.
    "CONCURRENCY": 1,
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
    # Tubes spread over several databases: tube name → the DATABASES aliases of its shards
    # (see django_taskloop.shards). A tube not named here lives in one database.
    "SHARDS": {},
    "LIMITS": {},
    "KEY_LIMITS": {},
    "KEY_RATES": {},
    "RATES": {},
    # Seconds a tube's rate counts its takes for beyond its period: they absorb the delay
    # between a task's claim (what the rate counts) and its start in the worker.
    "RATE_MARGIN": 0.05,
    # Seconds a round trip of the package's own (a worker's claim, settle or heartbeat, the
    # probe of a database found down, a keyed put on a shard) may take before the server counts
    # as hung, like one that went away: the connection is shut down on the client (a stopped
    # server enforces no timeout of its own), a shard is parked, a single database waited out.
    # Also bounds the connections the package opens itself. 0: unbounded. A handler's own
    # statements are never bounded.
    "DATABASE_TIMEOUT": 5.0,
    # Seconds a put with no key waits on one shard before it is tried on the next (the shard
    # is left out of the turn for a while). Never more than DATABASE_TIMEOUT.
    "SHARD_PUT_TIMEOUT": 1.0,
}


def _seconds(**bounds: bool) -> Callable[[Any, str], Any]:
    return lambda value, name: check_seconds(value, name, **bounds)


def _count(minimum: int) -> Callable[[Any, str], Any]:
    return lambda value, name: check_count(value, name, minimum=minimum)


def _factor(value: Any, name: str) -> float:
    if check_seconds(value, name) < 1:
        raise ValueError(f"{name} must be >= 1, not {value!r}")
    return float(value)


def _token(value: Any, name: str) -> Any:
    if value is not None and not (isinstance(value, str) and value):
        raise TypeError(f"{name} must be a non-empty str or None, not {value!r}")
    return value


def _mapping(value: Any, name: str) -> Any:
    if not isinstance(value, dict):
        raise TypeError(f"{name} must be a dict, not {type(value).__name__}")
    return value


def _shards(value: Any, name: str) -> Any:
    _mapping(value, name)
    for tube, aliases in value.items():
        if not isinstance(tube, str) or not tube:
            raise TypeError(f"{name}'s keys must be tube names (non-empty str), not {tube!r}")
        check_aliases(aliases, f"{name}[{tube!r}]")
    return value


def _by_tube(check: Callable[[Any, str], Any]) -> Callable[[Any, str], Any]:
    """A setting of tube name -> value, each value checked by ``check(value, its name)``."""

    def checked(value: Any, name: str) -> Any:
        _mapping(value, name)
        for tube, entry in value.items():
            if not isinstance(tube, str) or not tube:
                raise TypeError(f"{name}'s keys must be tube names (non-empty str), not {tube!r}")
            check(entry, f"{name}[{tube!r}]")
        return value

    return checked


def _limit(minimum: int) -> Callable[[Any, str], Any]:
    def checked(limit: Any, name: str) -> Any:
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < minimum):
            raise ValueError(f"{name} must be a count of at least {minimum} or None, not {limit!r}")

    return checked


def _zone(value: Any, name: str) -> Any:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{name} must be an IANA time zone name (a str) or None, not {type(value).__name__}")
    return value


#: What each key accepts: a check that raises ``TypeError``/``ValueError`` naming the key (the
#: system check ``taskloop.E020`` runs them; SCHEDULE's entries and the time zone's name are
#: checked by ``taskloop.E010``).
RULES: dict[str, Callable[[Any, str], Any]] = {
    "CONSUMER_TIMEOUT": _seconds(positive=True),
    "ENTITY_TIMEOUT": _seconds(positive=True),
    "JOB_HISTORY_RETENTION": _seconds(non_negative=True),
    "RESULT_RETENTION": _seconds(non_negative=True),
    "FAILURE_RETENTION": _seconds(non_negative=True),
    "THROUGHPUT_RETENTION": _seconds(non_negative=True),
    "WORKER_TIMEOUT": _seconds(positive=True),
    "METRICS_TOKEN": _token,
    "RETRIES": _count(0),
    "MAX_ATTEMPTS": _count(1),
    "RETRY_BACKOFF": _seconds(non_negative=True),
    "RETRY_BACKOFF_MAX": _seconds(non_negative=True),
    "GRACE_PERIOD": _seconds(non_negative=True),
    "HEARTBEAT_INTERVAL": _seconds(positive=True),
    "HORIZON_WARNING": _seconds(non_negative=True),
    "BATCH_TIME": _seconds(non_negative=True),
    "CONCURRENCY": _count(1),
    "POLL_MIN": _seconds(positive=True),
    "POLL_FACTOR": _factor,
    "POLL_MAX": _seconds(positive=True),
    "SCHEDULE": _mapping,
    "TIME_ZONE": _zone,
    "SHARDS": _shards,
    "LIMITS": _by_tube(_limit(1)),
    "KEY_LIMITS": _by_tube(_limit(1)),
    "KEY_RATES": _by_tube(check_rate),
    "RATES": _by_tube(check_rate),
    "RATE_MARGIN": _seconds(non_negative=True),
    "DATABASE_TIMEOUT": _seconds(non_negative=True),
    "SHARD_PUT_TIMEOUT": _seconds(positive=True),
}


def user_settings() -> Any:
    """Return ``settings.TASKLOOP`` as written (``{}`` when unset or empty)."""
    return getattr(settings, "TASKLOOP", None) or {}


@cache
def get_config() -> dict[str, Any]:
    """Return ``settings.TASKLOOP`` merged over the defaults (unknown keys are left out: the
    system checks warn about them, and refuse values of the wrong type or range)."""
    user = user_settings()
    if not isinstance(user, dict):
        return dict(DEFAULTS)
    return {**DEFAULTS, **{key: value for key, value in user.items() if key in DEFAULTS}}


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
