"""What ``taskloop`` changes: retry, pause and resume, prune — each through the facades' verbs.

Every target is checked before anything is written: an unknown id, or one that is not in the
state its retry needs, is :class:`~.text.BadInput` and nothing changes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from django.core.exceptions import ValidationError
from django.db.models import Count, Max, QuerySet

from django_taskloop import engine, shards
from django_taskloop.backends import taskloop_backends
from django_taskloop.compat import TaskResultDoesNotExist
from django_taskloop.conf import setting, tasks_backend_aliases
from django_taskloop.models import ConsumedJob, Failure, TaskRecord, TaskRecordStatus, WorkerProcess
from django_taskloop.models.tubes import STORED_STATES
from django_taskloop.stats import DJANGO_TASK

from .queues import Queue
from .text import BadInput, duration, plural

__all__ = ["retry", "pause", "resume", "prune", "alive", "PRUNABLE"]

_STATE_NAMES = {code: name for name, code in STORED_STATES.items()}


def _task_ids(ids: list[str]) -> list[int]:
    try:
        return [int(text) for text in ids]
    except ValueError:
        bad = next(text for text in ids if not text.strip().lstrip("-").isdigit())
        raise BadInput(f"a tube task id is a whole number, not {bad!r}") from None


def _retry_tube(queue: Queue, ids: list[str], every: bool) -> list[str]:
    """Kick the buried tasks ``ids`` of a tube (or every buried one, on every shard) back to
    ready. Task ids are a shard's own: a sharded tube's are named with its shard's name."""
    tube = queue.source
    if every:
        kicked = 0
        for shard in queue.everywhere:
            buried = shard.tasks.buried().count()
            kicked += shard.kick(buried) if buried else 0
        return [f"kicked {plural(kicked, 'buried task')} of {queue.label} back to ready"]
    if len(queue.everywhere) > 1:
        names = " or ".join(shards.shown(queue.name, shard._state.db) for shard in queue.everywhere)
        raise BadInput(
            f"{queue.label} is spread over {len(queue.everywhere)} databases, each with task ids of "
            f"its own: name the one that holds them ({names})"
        )
    wanted = _task_ids(ids)
    states = dict(tube.tasks.filter(pk__in=wanted).values_list("pk", "state"))
    buried = set(tube.tasks.filter(pk__in=wanted).buried().values_list("pk", flat=True))
    for task_id in wanted:
        if task_id not in states:
            raise BadInput(f"no task {task_id} in {queue.label}")
        if task_id not in buried:
            state = _STATE_NAMES.get(states[task_id], states[task_id])
            raise BadInput(f"task {task_id} of {queue.label} is {state}, not buried: nothing to retry")
    for task_id in wanted:
        tube.kick_task(task_id)
    return [f"kicked task {task_id} of {queue.label} back to ready" for task_id in wanted]


def _retry_board(queue: Queue, ids: list[str], every: bool) -> list[str]:
    """Re-post the trashed jobs ``ids`` of a board (or every trashed job not re-posted yet), on
    every shard that holds them."""
    if len(queue.everywhere) > 1:
        # Sharded: each shard re-posts its own (a job's uuid is unique across shards).
        lines: list[str] = []
        left = list(ids)
        for board in queue.everywhere:
            mine = ids if every else [u for u in left if board.jobs.filter(uuid=u).exists()]
            left = [u for u in left if u not in mine]
            if every or mine:
                one = dataclasses.replace(queue, source=board, shards=())
                lines += [line for line in _retry_board(one, mine, every) if not line.startswith("no ")]
        if left:
            raise BadInput(f"no job {left[0]} on {queue.label}")
        return lines or [f"no trashed job on {queue.label} to re-post"]
    board = queue.source
    jobs = board.jobs.all()
    if every:
        ids = list(
            jobs.trashed()
            .filter(reposted_as__isnull=True)
            .order_by("sequence")
            .values_list("uuid", flat=True)
        )
    found = {
        uuid: (trashed, again)
        for uuid, trashed, again in jobs.filter(uuid__in=ids).values_list("uuid", "trashed", "reposted_as")
    }
    for uuid in ids:
        if uuid not in found:
            raise BadInput(f"no job {uuid} on {queue.label}")
        trashed, again = found[uuid]
        if not trashed:
            raise BadInput(f"job {uuid} of {queue.label} is not trashed: nothing to retry")
        if again:
            raise BadInput(f"job {uuid} of {queue.label} was re-posted already, as {again}")
    if not ids:
        return [f"no trashed job on {queue.label} to re-post"]
    return [f"re-posted job {uuid} of {queue.label} as {board.repost(uuid).uuid}" for uuid in ids]


def _loop_ids(queue: Queue, ids: list[str]) -> list[Any]:
    field = queue.source._meta.pk
    try:
        return [field.to_python(text) for text in ids]
    except ValidationError:
        bad = next(text for text in ids if not _valid(field, text))
        raise BadInput(f"{bad!r} is not an id of {queue.label}") from None


def _valid(field: Any, text: str) -> bool:
    try:
        field.to_python(text)
    except ValidationError:
        return False
    return True


def _retry_loop(queue: Queue, ids: list[str], every: bool) -> list[str]:
    """Bump loop ids (or every id with a failure on record) so that they run next."""
    manager = queue.source._default_manager
    if every:
        failed = (
            Failure.objects.filter(kind="loop", queue=queue.name).values_list("item", flat=True).distinct()
        )
        field = queue.source._meta.pk
        wanted = list(manager.status([field.to_python(t) for t in failed if _valid(field, t)]))
    else:
        wanted = _loop_ids(queue, ids)
        known = manager.status(wanted)
        missing = [i for i in wanted if i not in known]
        if missing:
            raise BadInput(f"no id {missing[0]} in {queue.label}")
    if not wanted:
        return [f"no failed id of {queue.label} to bump"]
    bumped = manager.bump(wanted, lock_for=0, auto_add=False)
    return [
        f"bumped {plural(bumped, 'id')} of {queue.label}: {'it runs' if bumped == 1 else 'they run'} next"
    ]


def _result(queue: Queue, result_id: str) -> tuple[Any, Any]:
    """Return ``(backend, result)`` of the Django Task ``result_id`` of the queue."""
    for backend in taskloop_backends():
        try:
            result = backend.get_result(result_id)
        except (TaskResultDoesNotExist, ValueError):
            continue
        if result.task.queue_name == queue.name:
            return backend, result
    raise BadInput(f"no result {result_id} in {queue.label}")


def _retry_tasks(queue: Queue, ids: list[str], every: bool) -> list[str]:
    """Run FAILED Django Tasks of the queue once more (each the same result, a new attempt)."""
    if every:
        failed = TaskRecord.objects.filter(queue_name=queue.name, status=TaskRecordStatus.FAILED)
        ids = list(failed.order_by("finished_at").values_list("id", flat=True))
    found = [_result(queue, result_id) for result_id in ids]
    for _backend, result in found:
        if result.status != TaskRecordStatus.FAILED:
            status = getattr(result.status, "value", result.status)
            raise BadInput(
                f"result {result.id} of {queue.label} is {status}: only a FAILED task can be retried"
            )
    if not ids:
        return [f"no FAILED task in {queue.label} to retry"]
    return [
        f"retried result {backend.retry(result.id).id} of {queue.label}: READY again"
        for backend, result in found
    ]


_RETRY: dict[str, Callable[[Queue, list[str], bool], list[str]]] = {
    "task": _retry_tube,
    "job": _retry_board,
    "loop": _retry_loop,
    DJANGO_TASK: _retry_tasks,
}


def retry(queue: Queue, ids: list[str], every: bool) -> list[str]:
    """Retry the items ``ids`` of ``queue``, or every failed one if ``every``; return what was done.

    A tube's buried tasks are kicked, a board's trashed jobs re-posted, a loop's ids bumped, a
    Django Tasks queue's FAILED results run once more.
    """
    if bool(ids) == every:
        raise BadInput(
            f"retry {queue.name} needs the ids to retry, or --all for every failed item (not both)"
            if every
            else f"retry {queue.name}: name the ids to retry, or say --all for every failed item"
        )
    return _RETRY[queue.kind](queue, ids, every)


def _pause_targets(queue: Queue) -> list[Any]:
    """What ``pause()``/``resume()`` are called on: a Django Tasks queue's tubes, both; a tube or
    a board on every shard."""
    if queue.kind == DJANGO_TASK:
        return list(queue.tubes)
    if queue.kind == "loop":
        return [queue.source._default_manager]
    return list(queue.everywhere)


def _paused(target: Any) -> bool:
    paused = target.paused
    return bool(paused() if callable(paused) else paused)


def pause(queue: Queue) -> str:
    """Pause ``queue`` (workers leave it alone); return what was done."""
    targets = _pause_targets(queue)
    if all(_paused(target) for target in targets):
        return f"{queue.label} was paused already"
    for target in targets:
        target.pause()
    return f"paused {queue.label}"


def resume(queue: Queue) -> str:
    """Resume ``queue``; return what was done."""
    targets = _pause_targets(queue)
    if not any(_paused(target) for target in targets):
        return f"{queue.label} was not paused"
    for target in targets:
        target.resume()
    return f"resumed {queue.label}"


def _old_failures(seconds: float) -> QuerySet[Any]:
    return Failure.objects.filter(at__lt=engine.DbNow(-seconds))


def _old_results(seconds: float) -> QuerySet[Any]:
    finished = [TaskRecordStatus.SUCCESSFUL, TaskRecordStatus.FAILED]
    return TaskRecord.objects.filter(status__in=finished, finished_at__lt=engine.DbNow(-seconds))


def _old_history(seconds: float) -> QuerySet[Any]:
    return ConsumedJob.objects.filter(consumed_at__lt=engine.DbNow(-seconds))


#: What ``prune`` may delete: (name, what it is, the rows older than so many seconds).
PRUNABLE: dict[str, tuple[str, Callable[[float], QuerySet[Any]]]] = {
    "failures": ("failures", _old_failures),
    "results": ("finished Django Task results", _old_results),
    "history": ("consumed jobs' history", _old_history),
}


def prune(older_than: float, what: list[str], dry_run: bool) -> list[str]:
    """Delete (or with ``dry_run`` count) the rows of ``what`` older than ``older_than`` seconds."""
    lines = []
    for name in what:
        title, old = PRUNABLE[name]
        if name == "results" and not tasks_backend_aliases():
            lines.append(f"{title}: none (no TaskloopBackend in TASKS)")
            continue
        rows = old(older_than)
        # The rows themselves, not what the delete cascaded to.
        n = rows.count() if dry_run else rows.delete()[1].get(rows.model._meta.label, 0)
        verb = "would delete" if dry_run else "deleted"
        lines.append(f"{title} older than {duration(older_than)}: {verb} {n}")
    return lines


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
