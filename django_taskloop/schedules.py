"""Schedules: ``@periodic`` functions and ``TASKLOOP["SCHEDULE"]``'s Django Tasks, run by workers
once per cron tick across every process and host (SPEC §7).

- :func:`periodic` registers a function (in an app's ``taskloop.py``);
  ``TASKLOOP["SCHEDULE"]`` names Django Tasks. :func:`configured` reads both, checked: a bad
  cron expression, a missing task or arguments its signature refuses raise
  :class:`ScheduleError` before anything is written (and system check ``taskloop.E010``
  reports the same at ``manage.py check``).
- :func:`sync` writes one :class:`~django_taskloop.models.Schedule` row per schedule when
  workers start; a changed cron expression gets a next tick computed afresh.
- :class:`Ticker` runs in each worker's heartbeat thread: it reads the rows every
  :data:`REFRESH` seconds (one query; what the admin changed shows within that) and claims a
  tick only when its local estimate of the database's clock says one is due.
- A claimed tick of a Django Task enqueues it in the claim's transaction. A claimed tick of a
  ``@periodic`` function puts a task into the internal tube :data:`PERIODIC_TUBE` in the
  claim's transaction; workers take it with a lease like any tube task, so a run whose worker
  is killed is taken again when the lease ends (at least once), while the tick itself is
  claimed exactly once. A run that raises is not retried: the next tick is the retry.

Cron parsing, time zones and the ``@periodic`` registry live in :mod:`django_taskloop.cron`
(re-exported here); this module is the worker's side: rows, ticks and runs.
"""

from __future__ import annotations

import datetime as dt
import inspect
import json
import logging
import time
from typing import Any

from django.db import IntegrityError, router
from django.utils.module_loading import import_string

from . import engine
from .conf import setting
from .cron import Cron, ScheduleError, ScheduleSpec, parse_cron, periodic, periodic_registry, time_zone
from .models import Schedule, Tube
from .validation import check_name
from .workers import FailedForGood, Handler, autodiscover, run_interruptibly

__all__ = [
    "ScheduleError",
    "Cron",
    "ScheduleSpec",
    "periodic",
    "periodic_registry",
    "parse_cron",
    "configured",
    "sync",
    "Ticker",
    "PERIODIC_TUBE",
    "schedule_handlers",
    "time_zone",
]

logger = logging.getLogger("django_taskloop.schedules")

#: The internal tube that carries the runs of ``@periodic`` functions to the workers.
PERIODIC_TUBE = "taskloop.periodic"
#: Seconds a run of a ``@periodic`` function is leased for; the worker renews the lease while it
#: runs, so a killed worker's run is taken again about this long after it died.
PERIODIC_TTR = 30.0
#: Seconds between two reads of the schedules by a worker (what the admin changed shows then).
REFRESH = 5.0
#: Seconds a worker leaves a schedule alone after its enqueue failed (a broken task path).
BACKOFF = 60.0


def _load_task(path: str) -> Any:
    """Import the Django Task at dotted ``path``; raise :class:`ScheduleError` if it is not one."""
    try:
        task = import_string(path)
    except ImportError as error:
        raise ScheduleError(f"task {path!r} cannot be imported: {error}") from None
    if not (hasattr(task, "enqueue") and hasattr(task, "func") and hasattr(task, "takes_context")):
        raise ScheduleError(f"{path!r} is not a Django Task (decorate it with @task)")
    return task


def _check_arguments(name: str, task: Any, args: Any, kwargs: Any) -> None:
    if not isinstance(args, list | tuple):
        raise ScheduleError(f"SCHEDULE[{name!r}]['args'] must be a list, not {type(args).__name__}")
    if not isinstance(kwargs, dict):
        raise ScheduleError(f"SCHEDULE[{name!r}]['kwargs'] must be a dict, not {type(kwargs).__name__}")
    try:
        json.dumps([args, kwargs])
    except (TypeError, ValueError) as error:
        raise ScheduleError(f"SCHEDULE[{name!r}]: arguments must be JSON values ({error})") from None
    leading = (None,) if task.takes_context else ()
    try:
        inspect.signature(task.func).bind(*leading, *args, **kwargs)
    except TypeError as error:
        raise ScheduleError(
            f"SCHEDULE[{name!r}]: {task.module_path} refuses these arguments: {error}"
        ) from None


def setting_schedules() -> list[ScheduleSpec]:
    """Return ``TASKLOOP["SCHEDULE"]``'s entries, checked (:class:`ScheduleError` otherwise)."""
    entries = setting("SCHEDULE") or {}
    if not isinstance(entries, dict):
        raise ScheduleError(
            f'TASKLOOP["SCHEDULE"] must be a dict of name → entry, not {type(entries).__name__}'
        )
    specs = []
    for name, entry in entries.items():
        try:
            check_name(name, "TASKLOOP['SCHEDULE'] name")
        except (TypeError, ValueError) as error:
            raise ScheduleError(str(error)) from None
        if not isinstance(entry, dict):
            raise ScheduleError(f"SCHEDULE[{name!r}] must be a dict, not {type(entry).__name__}")
        unknown = set(entry) - {"task", "cron", "args", "kwargs"}
        if unknown or "task" not in entry or "cron" not in entry:
            raise ScheduleError(
                f"SCHEDULE[{name!r}] needs 'task' and 'cron' (and may have 'args', 'kwargs')"
                + (f"; unknown key(s) {sorted(unknown)}" if unknown else "")
            )
        try:
            cron = parse_cron(entry["cron"])
        except ScheduleError as error:
            raise ScheduleError(f"SCHEDULE[{name!r}]: {error}") from None
        if not isinstance(entry["task"], str):
            raise ScheduleError(f"SCHEDULE[{name!r}]['task'] must be a dotted path (str)")
        task = _load_task(entry["task"])
        args, kwargs = entry.get("args", []), entry.get("kwargs", {})
        _check_arguments(name, task, args, kwargs)
        specs.append(
            ScheduleSpec(name, "task", cron, entry["task"], func=task, args=list(args), kwargs=kwargs)
        )
    return specs


def configured() -> list[ScheduleSpec]:
    """Return every schedule the code declares (``@periodic`` and ``TASKLOOP["SCHEDULE"]``),
    checked; a name used by both raises :class:`ScheduleError`."""
    autodiscover()
    time_zone()
    specs = list(periodic_registry.values())
    for spec in setting_schedules():
        if spec.name in periodic_registry:
            raise ScheduleError(f"schedule {spec.name!r} is both a @periodic function and a SCHEDULE entry")
        specs.append(spec)
    return specs


def sync(specs: list[ScheduleSpec], using: str | None = None) -> None:
    """Write a row for each schedule in ``specs``, or update the row whose cron expression, time
    zone or target changed (its next tick computed afresh from now). Pauses are kept; rows of
    schedules the code no longer declares are left alone (the admin can delete them)."""
    if not specs:
        return
    using = using or router.db_for_write(Schedule)
    zone = time_zone()
    rows = Schedule.objects.using(using)
    now = engine.db_now(using)
    existing = {row.name: row for row in rows.filter(name__in=[spec.name for spec in specs])}
    missing = [
        Schedule(
            name=spec.name,
            kind=spec.kind,
            cron=spec.cron.expression,
            time_zone=zone,
            target=spec.target,
            next_run_at=spec.cron.next_after(now, zone),
        )
        for spec in specs
        if spec.name not in existing
    ]
    if missing:
        try:
            # Several workers start at once: the first one writes, the others find the rows.
            rows.bulk_create(missing, ignore_conflicts=True)
        except IntegrityError:
            pass
    for spec in specs:
        row = existing.get(spec.name)
        if row is None:
            continue
        if (row.kind, row.cron, row.time_zone, row.target) != (
            spec.kind,
            spec.cron.expression,
            zone,
            spec.target,
        ):
            rows.filter(pk=row.pk).update(
                kind=spec.kind,
                cron=spec.cron.expression,
                time_zone=zone,
                target=spec.target,
                next_run_at=spec.cron.next_after(now, zone),
            )
            logger.info("schedule %s: now %r (%s)", spec.name, spec.cron.expression, zone)


class Ticker:
    """Claim the due ticks of ``specs`` (one per worker process; its heartbeat thread calls
    :meth:`tick`). Idle, it costs one read every :data:`REFRESH` seconds."""

    def __init__(self, specs: list[ScheduleSpec], using: str | None = None) -> None:
        self.specs = {spec.name: spec for spec in specs}
        self.using = using or router.db_for_write(Schedule)
        self.zone = time_zone()
        # name → (next_run_at, paused) as last read, and the database clock at that read.
        self.rows: dict[str, tuple[dt.datetime, bool]] = {}
        self.read_at: tuple[float, dt.datetime] | None = None
        self.held_back: dict[str, float] = {}

    def prepare(self) -> None:
        """Write the rows of the schedules (once, when the worker starts)."""
        sync(list(self.specs.values()), self.using)

    def refresh(self) -> None:
        """Read the schedules' next ticks and pauses, and the database's clock, in one query."""
        rows = list(
            Schedule.objects.using(self.using)
            .filter(name__in=list(self.specs))
            .annotate(db_now=engine.DbNow())
            .values_list("name", "next_run_at", "paused", "cron", "db_now")
        )
        self.rows = {
            name: (next_run_at, paused)
            for name, next_run_at, paused, cron, _now in rows
            if cron == self.specs[name].cron.expression
        }
        now = engine.to_datetime(rows[0][4]) if rows else engine.db_now(self.using)
        self.read_at = (time.monotonic(), now)

    def now(self) -> dt.datetime:
        """Return the database's clock as estimated from the last read."""
        assert self.read_at is not None
        mono, then = self.read_at
        return then + dt.timedelta(seconds=time.monotonic() - mono)

    def tick(self) -> float:
        """Claim (and start) every tick due now; return the seconds until it is worth calling again."""
        if self.read_at is None or time.monotonic() - self.read_at[0] >= REFRESH:
            self.refresh()
        now = self.now()
        due = [
            name
            for name, (next_run_at, paused) in self.rows.items()
            if not paused and next_run_at <= now and self.held_back.get(name, 0.0) <= time.monotonic()
        ]
        for name in due:
            self.claim(self.specs[name])
        if due:
            self.refresh()
            now = self.now()
        read_mono = self.read_at[0] if self.read_at is not None else time.monotonic()
        wait = REFRESH - (time.monotonic() - read_mono)
        upcoming = [(at - now).total_seconds() for at, paused in self.rows.values() if not paused]
        return max(0.05, min([wait, *upcoming]))

    def claim(self, spec: ScheduleSpec) -> bool:
        """Claim ``spec``'s due tick, starting its run in the same transaction; say whether this
        process claimed it."""

        def start(now: dt.datetime) -> None:
            if spec.kind == "task":
                task: Any = spec.func  # a "task" schedule's func is a Django Task
                task.enqueue(*spec.args, **spec.kwargs)
            else:
                _periodic_tube(self.using).put({"schedule": spec.name, "tick": now.isoformat()})

        try:
            claimed = Schedule.objects.claim_tick(
                spec.name,
                spec.cron.expression,
                lambda now: spec.cron.next_after(now, self.zone),
                start,
                using=self.using,
            )
        except Exception as error:
            # The tick stays due and is tried again (by any worker) after BACKOFF here: a task
            # that cannot be enqueued must not make this worker spin.
            self.held_back[spec.name] = time.monotonic() + BACKOFF
            logger.exception("schedule %s: could not start its tick", spec.name)
            record_error(spec.name, error, self.using)
            return False
        if claimed:
            logger.info("schedule %s: tick claimed (%s %s)", spec.name, spec.kind, spec.target)
        return claimed


def record_error(name: str, error: BaseException, using: str) -> None:
    """Keep the last error of schedule ``name`` for the admin."""
    try:
        Schedule.objects.using(using).filter(name=name).update(
            last_error=f"{type(error).__module__}.{type(error).__qualname__}: {error}"[:10_000]
        )
    except Exception:
        logger.exception("schedule %s: could not record its error", name)


def _periodic_tube(using: str) -> Any:
    # Looked up at each tick (ticks are rare), not cached: a tube dropped since (from the
    # admin, say) is made afresh rather than failing every tick.

    return Tube.objects.db_manager(using).create_tube(
        PERIODIC_TUBE, "fifottl", ttr=PERIODIC_TTR, if_not_exists=True
    )


def _run_periodic(task: Any) -> None:
    """Run the ``@periodic`` function a tick's tube task names (the handler of :data:`PERIODIC_TUBE`)."""
    name = task.data["schedule"]
    spec = periodic_registry.get(name)
    if spec is None or spec.func is None:
        logger.warning("schedule %s: no @periodic function of that name here; tick %s dropped", name, task.id)
        return
    using = task._state.db or "default"
    try:
        # Interruptible by a hard stop like any handler; an async def function is awaited.
        run_interruptibly(spec.func)
    except Exception as error:
        record_error(name, error, using)
        # No retry: the next tick is the retry (cron's way); the failure is kept as a Failure.
        raise FailedForGood(f"schedule {name}: {error}") from error
    Schedule.objects.using(using).filter(name=name).exclude(last_error="").update(last_error="")


def schedule_handlers() -> list[Handler]:
    """Return the handler of :data:`PERIODIC_TUBE` when ``@periodic`` functions exist."""
    if not periodic_registry:
        return []
    return [
        Handler(
            "tube",
            PERIODIC_TUBE,
            _run_periodic,
            PERIODIC_TUBE,
            batch=1,
            lease=PERIODIC_TTR,
            create={"type": "fifottl", "ttr": PERIODIC_TTR},
            builtin=True,
        )
    ]


def ticker() -> Ticker | None:
    """Return a :class:`Ticker` of every configured schedule, or ``None`` when there is none."""
    specs = configured()
    return Ticker(specs) if specs else None
