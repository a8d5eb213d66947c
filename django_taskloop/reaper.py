"""Upkeep of every loop, board and tube: ``reap()``, run by ``reap_locks`` and by workers.

Nothing here is needed for correctness (every facade already reads a passed deadline as
passed, on the next call of any kind); reaping tidies the columns up, applies the tubes' time
transitions for observers that only read rows (the admin), returns a dead consumer's tasks and
prunes history.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

from . import engine, shards
from .conf import setting, tasks_backend_aliases
from .exceptions import NotFound
from .models import (
    Consumer,
    Failure,
    Job,
    JobBoard,
    TaskRecord,
    TaskRecordStatus,
    Tube,
    WorkerProcess,
)
from .models.operating import prune_throughput
from .stats import loop_models

__all__ = ["reap", "format_report", "loop_models"]


def _aliases(model: Any, using: str | None) -> Iterable[str]:
    # Every shard of a tube, a board or a Django Tasks queue (shards.databases).
    return [using] if using else shards.databases(model)


def reap(
    using: str | None = None, down: dict[str, str] | None = None
) -> dict[str, dict[str, dict[str, int]]]:
    """Reap expired claims, dead consumers' tasks and old history; return what was done.

    The report is ``{"loops": {label: counts}, "boards": {name: counts}, "tubes": {name: counts},
    "results": {"django-tasks": counts}}``. ``using`` picks a database alias; by default each
    model's routed alias for writes. A database that cannot be reached (a shard whose server
    is down) is left alone and named in ``down`` (``{alias: reason}``, filled in when given);
    the others are reaped.
    """
    report: dict[str, dict[str, dict[str, int]]] = {"loops": {}, "boards": {}, "tubes": {}, "results": {}}
    down = {} if down is None else down

    def each(model: Any, work: Callable[[str], None]) -> None:
        shards.read_each(_aliases(model, using), work, down)

    for model in loop_models():
        # Expired loop locks are reported, not cleared. doloop ranks ids whose lock_until
        # has passed FIRST ("expired/bumped locks first"): that is how a crashed worker's
        # ids and bumped ids jump the queue. Nulling lock_until would demote them behind
        # every never-updated id, and would erase bumps. They are already claimable.
        each(model, functools.partial(_loop, report, model))
    each(JobBoard, functools.partial(_boards, report))
    each(Tube, functools.partial(_tubes, report))
    each(Failure, functools.partial(_operating, report))
    if tasks_backend_aliases():
        each(TaskRecord, functools.partial(_results, report))
    return report


def _loop(report: dict[str, dict[str, dict[str, int]]], model: Any, alias: str) -> None:
    expired = model.objects.db_manager(alias).filter(lock_until__lte=engine.DbNow()).count()
    report["loops"][model._meta.label_lower] = {"expired_locks": expired}


def _boards(report: dict[str, dict[str, dict[str, int]]], alias: str) -> None:
    jobs = Job.objects.db_manager(alias)
    for board in JobBoard.objects.db_manager(alias).order_by("name"):
        expired = jobs.filter(board=board).reap_expired()
        report["boards"][shards.shown(board.name, alias)] = {"expired_claims": expired}
    pruned = jobs.all().prune_history()
    if pruned or report["boards"]:
        report["boards"].setdefault("(history)", {})["pruned"] = pruned


def _tubes(report: dict[str, dict[str, dict[str, int]]], alias: str) -> None:
    for tube in Tube.objects.db_manager(alias).order_by("name"):
        try:
            # delay/ttr/ttl transitions, and the tasks of dead consumers back to ready.
            report["tubes"][shards.shown(tube.name, alias)] = dict(tube.tidy(stale=True))
        except NotFound:
            continue  # dropped while we looked
    forgotten = Consumer.objects.using(alias).forget_dead()
    if forgotten:
        report["tubes"].setdefault("(consumers)", {})["dead_forgotten"] = forgotten


def _operating(report: dict[str, dict[str, dict[str, int]]], alias: str) -> None:
    operating = {
        "failures_pruned": Failure.objects.prune(alias),
        "throughput_minutes_folded": prune_throughput(alias),
        "gone_workers_forgotten": WorkerProcess.objects.db_manager(alias).prune(),
    }
    if any(operating.values()):  # added up over the databases
        earlier = report["results"].get("operating", {})
        report["results"]["operating"] = {key: earlier.get(key, 0) + n for key, n in operating.items()}


def _results(report: dict[str, dict[str, dict[str, int]]], alias: str) -> None:
    retention = float(setting("RESULT_RETENTION"))
    old = TaskRecord.objects.db_manager(alias).filter(
        status__in=[TaskRecordStatus.SUCCESSFUL, TaskRecordStatus.FAILED],
        finished_at__lte=engine.DbNow(-retention),
    )
    earlier = report["results"].get("django-tasks", {}).get("pruned", 0)
    report["results"]["django-tasks"] = {"pruned": earlier + old.delete()[0]}


def format_report(report: dict[str, dict[str, dict[str, int]]]) -> list[str]:
    """Return one line per loop, board and tube of a :func:`reap` report."""
    lines = []
    singular = {"loops": "loop", "boards": "board", "tubes": "tube", "results": "results"}
    for section, entries in report.items():
        for name, counts in entries.items():
            said = (
                ", ".join(f"{key.replace('_', ' ')} {value}" for key, value in counts.items())
                or "nothing to do"
            )
            lines.append(f"{singular[section]} {name}: {said}")
    return lines
