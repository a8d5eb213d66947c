"""A queue as an operator names it, and the operator's verbs on it: one home for every door.

The terminal (``manage.py taskloop``), the admin's actions, the dashboard, the metrics and the
reaper all find a queue here and act on it here, so that every door reaches the same set of
shards and every name resolves the same way:

- :func:`resolve` reads a name as an operator types it: ``emails``, ``default`` (a Django
  Tasks queue), ``testapp.feedloop`` (a loop, in any case), or with its kind in front when two
  kinds share a name (``task:emails``, ``job:emails``); ``emails@queue2`` names one shard;
  ``default (tasks)``, as ``taskloop failures`` shows a Django Tasks queue, names that queue.
- :meth:`Queue.of` gives the whole queue an admin row (a tube or a board of one database)
  belongs to: the namesakes on its other shards with it.
- A :class:`Queue`'s verbs (:meth:`~Queue.pause`, :meth:`~Queue.resume`, :meth:`~Queue.retry`,
  :meth:`~Queue.retry_all`, :meth:`~Queue.summaries`) act on every shard of it; :func:`prune`
  deletes old history. Every target is checked before anything is written: a name or id
  that is wrong is a :class:`QueueError` and nothing changes.

Names are the read model's (:mod:`django_taskloop.stats`): a tube's or a board's name, a
loop's model label, a Django Tasks queue's Django name (kind ``django_task``; its tubes
``tasks.<name>`` and ``tasks-keyed.<name>``, on every database that holds them, are one queue).
A tube of a Django Tasks queue may still be named on its own (``task:tasks.default``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from django.core.exceptions import ValidationError
from django.db import router
from django.db.models import Field, Model, QuerySet

from . import engine, shards
from .backends import TaskloopBackend, taskloop_backends
from .compat import DjangoTaskResult, TaskResultDoesNotExist, TaskResultStatus
from .conf import tasks_backend_aliases
from .human import duration, plural
from .models import ConsumedJob, Failure, JobBoard, TaskLoop, TaskRecord, TaskRecordStatus, Tube
from .models.tubes import STORED_STATES
from .stats import (
    DJANGO_TASK,
    TASKS_TUBE_PREFIXES,
    QueueSummary,
    django_tasks_queue,
    loop_models,
    merge_django_tasks,
    queue_summaries,
)

__all__ = [
    "KINDS",
    "KIND_WORDS",
    "PRUNABLE",
    "TASKS_SUFFIX",
    "Queue",
    "QueueError",
    "known_names",
    "prune",
    "resolve",
]

#: The kinds an operator may put in front of a name, as the read model spells them.
KINDS = ("task", DJANGO_TASK, "job", "loop")
#: How a table names a Django Tasks queue where tubes are named too (``default (tasks)``):
#: typed back, it names that queue.
TASKS_SUFFIX = " (tasks)"
#: The suffixes that name a Django Tasks queue, typed back: the terminal's, and the admin's and
#: the log's (``default (Django Tasks)``, a handler's title).
_TASKS_SUFFIXES = (TASKS_SUFFIX, " (Django Tasks)")
#: What each kind is called in sentences.
KIND_WORDS = {"task": "tube", DJANGO_TASK: "Django Tasks queue", "job": "board", "loop": "loop"}
_STATE_NAMES = {code: name for name, code in STORED_STATES.items()}


class QueueError(ValueError):
    """A queue name, an id or a request that names nothing, or the wrong thing: nothing changed."""


@dataclasses.dataclass(frozen=True)
class Queue:
    """One queue, found: its kind, its name and every place it lives.

    ``shards``: a tube or a board on each database that holds it (one unless ``SHARDS`` spreads
    it); a Django Tasks queue's tubes (its tasks, then its keyed tasks) on each database.
    ``model``: a loop's model (a loop lives in its model's table: no shards).
    """

    kind: str
    name: str
    shards: tuple[Tube | JobBoard, ...] = ()
    model: type[TaskLoop] | None = None

    @classmethod
    def of(cls, item: Tube | JobBoard) -> Queue:
        """The whole queue that ``item`` (one database's tube or board) is a shard of."""
        if isinstance(item, Tube):
            return cls("task", item.name, tuple(shards.everywhere(Tube, item.name)) or (item,))
        return cls("job", item.name, tuple(shards.everywhere(JobBoard, item.name)) or (item,))

    @classmethod
    def named(cls, kind: str, name: str) -> Queue | None:
        """The queue of ``kind`` called ``name`` (``None`` if there is none)."""
        if kind not in KINDS:
            return None
        found = _candidates(kind, name)
        return found[0] if found else None

    @property
    def source(self) -> Tube | JobBoard | type[TaskLoop]:
        """The first shard (the router's database first), or a loop's model."""
        if self.model is not None:
            return self.model
        return self.shards[0]

    @property
    def databases(self) -> list[str]:
        """The database aliases the queue lives in."""
        if self.model is not None:
            return [router.db_for_read(self.model)]
        return list(dict.fromkeys(str(shard._state.db) for shard in self.shards))

    @property
    def label(self) -> str:
        """Say what the queue is: ``tube emails``, ``Django Tasks queue default``."""
        return f"{KIND_WORDS[self.kind]} {self.name}"

    @property
    def key(self) -> str:
        """The queue's ``kind:name``."""
        return f"{self.kind}:{self.name}"

    def summaries(self, *, cap: int | None = None, down: dict[str, str] | None = None) -> list[QueueSummary]:
        """The read model's summary of this queue: one per shard (a database that cannot be
        read is named in ``down``)."""
        loops = [self.model] if self.model is not None else None
        read = queue_summaries(kinds=[_read_kind(self.kind)], cap=cap, loops=loops, down=down)
        found = merge_django_tasks(read)
        return [s for s in found if {(s.kind, s.name), (s.kind, s.title)} & {(self.kind, self.name)}]

    def paused(self) -> bool:
        """Whether workers leave the queue alone (every part of it paused)."""
        return all(_is_paused(target) for target in self._pause_targets())

    def pause(self) -> bool:
        """Pause the queue on every shard (workers take nothing from it); whether it changed."""
        targets = self._pause_targets()
        if all(_is_paused(target) for target in targets):
            return False
        for target in targets:
            target.pause()
        return True

    def resume(self) -> bool:
        """Resume the queue on every shard; whether it changed."""
        targets = self._pause_targets()
        if not any(_is_paused(target) for target in targets):
            return False
        for target in targets:
            target.resume()
        return True

    def _pause_targets(self) -> list[Any]:
        # A loop's pause()/resume() are its manager's verbs; a tube's and a board's their own.
        if self.model is not None:
            return [self.model._default_manager]
        return list(self.shards)

    def retry(self, ids: Sequence[str]) -> list[str]:
        """Retry the failed items ``ids``; return what was done, a line each.

        A tube's buried tasks are kicked, a board's trashed jobs re-posted, a loop's ids bumped,
        a Django Tasks queue's FAILED results run once more. Every id is checked first.
        """
        if not ids:
            raise QueueError(f"retry {self.name}: name the ids to retry, or retry them all")
        return _RETRY[self.kind](self, list(ids), False)

    def retry_all(self) -> list[str]:
        """Retry every failed item of the queue, on every shard; return what was done."""
        return _RETRY[self.kind](self, [], True)

    def kick_buried(self) -> int:
        """Kick every buried task of a tube back to ready, on every shard; return how many."""
        if self.kind != "task":
            raise QueueError(f"{self.label} is not a tube: only a tube's tasks are buried")
        return sum(_kick_buried(tube) for tube in self._tubes())

    def _tubes(self) -> list[Tube]:
        return [shard for shard in self.shards if isinstance(shard, Tube)]

    def _boards(self) -> list[JobBoard]:
        return [shard for shard in self.shards if isinstance(shard, JobBoard)]


def _read_kind(kind: str) -> str:
    # The read model reads a Django Tasks queue as its tubes, then merges them.
    return "task" if kind == DJANGO_TASK else kind


def _is_paused(target: Any) -> bool:
    paused = target.paused
    return bool(paused() if callable(paused) else paused)


def _loop(name: str) -> type[TaskLoop] | None:
    return next((m for m in loop_models() if m._meta.label_lower == name.lower()), None)


def _candidates(kind: str | None, name: str) -> list[Queue]:
    """Every queue of ``kind`` (any kind if ``None``) that is called ``name`` (a tube or a board
    on every database that holds it; ``name@alias``: that shard's only)."""
    found = []
    if kind in (None, "task") and (tubes := shards.everywhere(Tube, name)):
        if kind == "task" or django_tasks_queue(name) is None:
            found.append(Queue("task", name, tuple(tubes)))
    if kind in (None, DJANGO_TASK):
        # The plain tube (its tasks) first, then the keyed one; each on every shard.
        ordered = [tube for prefix in TASKS_TUBE_PREFIXES for tube in shards.everywhere(Tube, prefix + name)]
        if ordered:
            found.append(Queue(DJANGO_TASK, name, tuple(ordered)))
    if kind in (None, "job") and (boards := shards.everywhere(JobBoard, name)):
        found.append(Queue("job", name, tuple(boards)))
    if kind in (None, "loop") and (model := _loop(name)) is not None:
        found.append(Queue("loop", model._meta.label_lower, model=model))
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
    """Return the queue ``text`` names (``name`` or ``kind:name``); :class:`QueueError` if none
    or several do."""
    kind, sep, name = text.partition(":")
    if not sep or kind not in KINDS:
        kind, name = "", text
    for suffix in _TASKS_SUFFIXES:  # as ``failures`` shows one, "default (tasks)", or the admin
        if not kind and text.endswith(suffix):
            kind, name = DJANGO_TASK, text.removesuffix(suffix)
    if not name.strip():
        raise QueueError("a queue name is empty")
    found = _candidates(kind or None, name)
    if not found:
        known = ", ".join(known_names()) or "none yet"
        what = f"{KIND_WORDS[kind]} named" if kind else "queue named"
        raise QueueError(f"no {what} {name!r} (known: {known})")
    if len(found) > 1:
        raise QueueError(
            f"{name!r} names {len(found)} queues: say which, as {' or '.join(q.key for q in found)}"
        )
    return found[0]


# Retry, by kind: (queue, ids, every) → what was done.


def _kick_buried(tube: Tube) -> int:
    buried = tube.tasks.buried().count()
    return tube.kick(buried) if buried else 0


def _task_ids(ids: list[str]) -> list[int]:
    try:
        return [int(text) for text in ids]
    except ValueError:
        bad = next(text for text in ids if not text.strip().lstrip("-").isdigit())
        raise QueueError(f"a tube task id is a whole number, not {bad!r}") from None


def _retry_tube(queue: Queue, ids: list[str], every: bool) -> list[str]:
    """Kick the buried tasks ``ids`` of a tube (or every buried one, on every shard) back to
    ready. Task ids are a shard's own: a sharded tube's are named with its shard's name."""
    if every:
        return [f"kicked {plural(queue.kick_buried(), 'buried task')} of {queue.label} back to ready"]
    tubes = queue._tubes()
    if len(tubes) > 1:
        names = " or ".join(shards.shown(queue.name, str(shard._state.db)) for shard in tubes)
        raise QueueError(
            f"{queue.label} is spread over {len(tubes)} databases, each with task ids of "
            f"its own: name the one that holds them ({names})"
        )
    tube = tubes[0]
    wanted = _task_ids(ids)
    states = dict(tube.tasks.filter(pk__in=wanted).values_list("pk", "state"))
    buried = set(tube.tasks.filter(pk__in=wanted).buried().values_list("pk", flat=True))
    for task_id in wanted:
        if task_id not in states:
            raise QueueError(f"no task {task_id} in {queue.label}")
        if task_id not in buried:
            state = _STATE_NAMES.get(states[task_id], states[task_id])
            raise QueueError(f"task {task_id} of {queue.label} is {state}, not buried: nothing to retry")
    for task_id in wanted:
        tube.kick_task(task_id)
    return [f"kicked task {task_id} of {queue.label} back to ready" for task_id in wanted]


def _retry_board(queue: Queue, ids: list[str], every: bool) -> list[str]:
    """Re-post the trashed jobs ``ids`` of a board (or every trashed job not re-posted yet), on
    every shard that holds them (a job's uuid is unique across shards). Every job is checked
    on every shard before one is re-posted."""
    plan: list[tuple[JobBoard, list[str]]] = []
    left = list(ids)
    for board in queue._boards():
        mine = _trashed(board) if every else [u for u in left if board.jobs.filter(uuid=u).exists()]
        left = [u for u in left if u not in mine]
        _check_trashed(queue, board, mine)
        plan.append((board, mine))
    if left:
        raise QueueError(f"no job {left[0]} on {queue.label}")
    lines = [
        f"re-posted job {uuid} of {queue.label} as {board.repost(uuid).uuid}"
        for board, mine in plan
        for uuid in mine
    ]
    return lines or [f"no trashed job on {queue.label} to re-post"]


def _trashed(board: JobBoard) -> list[str]:
    trashed = board.jobs.trashed().filter(reposted_as__isnull=True).order_by("sequence")
    return [str(uuid) for uuid in trashed.values_list("uuid", flat=True)]


def _check_trashed(queue: Queue, board: JobBoard, ids: list[str]) -> None:
    found = {
        str(uuid): (trashed, again)
        for uuid, trashed, again in board.jobs.filter(uuid__in=ids).values_list(
            "uuid", "trashed", "reposted_as"
        )
    }
    for uuid in ids:
        if uuid not in found:
            raise QueueError(f"no job {uuid} on {queue.label}")
        trashed, again = found[uuid]
        if not trashed:
            raise QueueError(f"job {uuid} of {queue.label} is not trashed: nothing to retry")
        if again:
            raise QueueError(f"job {uuid} of {queue.label} was re-posted already, as {again}")


def _loop_ids(queue: Queue, field: Field[Any, Any], ids: list[str]) -> list[Any]:
    try:
        return [field.to_python(text) for text in ids]
    except ValidationError:
        bad = next(text for text in ids if not _valid(field, text))
        raise QueueError(f"{bad!r} is not an id of {queue.label}") from None


def _valid(field: Field[Any, Any], text: str) -> bool:
    try:
        field.to_python(text)
    except ValidationError:
        return False
    return True


def _retry_loop(queue: Queue, ids: list[str], every: bool) -> list[str]:
    """Bump loop ids (or every id with a failure on record) so that they run next."""
    assert queue.model is not None
    manager = queue.model.objects
    field = queue.model._meta.pk
    assert field is not None
    if every:
        failed = (
            Failure.objects.filter(kind="loop", queue=queue.name).values_list("item", flat=True).distinct()
        )
        wanted = list(manager.status([field.to_python(t) for t in failed if _valid(field, t)]))
    else:
        wanted = _loop_ids(queue, field, ids)
        known = manager.status(wanted)
        missing = [i for i in wanted if i not in known]
        if missing:
            raise QueueError(f"no id {missing[0]} in {queue.label}")
    if not wanted:
        return [f"no failed id of {queue.label} to bump"]
    bumped = manager.bump(wanted, lock_for=0, auto_add=False)
    return [
        f"bumped {plural(bumped, 'id')} of {queue.label}: {'it runs' if bumped == 1 else 'they run'} next"
    ]


def _result(queue: Queue, result_id: str) -> tuple[TaskloopBackend, DjangoTaskResult]:
    """Return ``(backend, result)`` of the Django Task ``result_id`` of the queue."""
    for backend in taskloop_backends():
        try:
            result = backend.get_result(result_id)
        except (TaskResultDoesNotExist, ValueError):
            continue
        if result.task.queue_name == queue.name:
            return backend, result
    raise QueueError(f"no result {result_id} in {queue.label}")


def _retry_tasks(queue: Queue, ids: list[str], every: bool) -> list[str]:
    """Run FAILED Django Tasks of the queue once more (each the same result, a new attempt)."""
    if every:
        failed = TaskRecord.objects.filter(queue_name=queue.name, status=TaskRecordStatus.FAILED)
        ids = [str(pk) for pk in failed.order_by("finished_at").values_list("id", flat=True)]
    found = [_result(queue, result_id) for result_id in ids]
    for _backend, result in found:
        if result.status != TaskResultStatus.FAILED:
            status = getattr(result.status, "value", result.status)
            raise QueueError(
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


# Prune: old history, on the database each model is routed to.


def _old_failures(seconds: float) -> QuerySet[Failure]:
    return Failure.objects.filter(at__lt=engine.DbNow(-seconds))


def _old_results(seconds: float) -> QuerySet[TaskRecord]:
    finished = [TaskRecordStatus.SUCCESSFUL, TaskRecordStatus.FAILED]
    return TaskRecord.objects.filter(status__in=finished, finished_at__lt=engine.DbNow(-seconds))


def _old_history(seconds: float) -> QuerySet[ConsumedJob]:
    return ConsumedJob.objects.filter(consumed_at__lt=engine.DbNow(-seconds))


#: What :func:`prune` may delete: (name, what it is, the rows older than so many seconds).
PRUNABLE: dict[str, tuple[str, Callable[[float], QuerySet[Any]]]] = {
    "failures": ("failures", _old_failures),
    "results": ("finished Django Task results", _old_results),
    "history": ("consumed jobs' history", _old_history),
}


def prune(older_than: float, what: Sequence[str], dry_run: bool) -> list[str]:
    """Delete (or with ``dry_run`` count) the rows of ``what`` older than ``older_than`` seconds;
    return what was done, a line each."""
    lines = []
    for name in what:
        if name not in PRUNABLE:
            raise QueueError(f"cannot prune {name!r}: only {', '.join(PRUNABLE)}")
        title, old = PRUNABLE[name]
        if name == "results" and not tasks_backend_aliases():
            lines.append(f"{title}: none (no TaskloopBackend in TASKS)")
            continue
        rows = old(older_than)
        model: type[Model] = rows.model
        # The rows themselves, not what the delete cascaded to.
        n = rows.count() if dry_run else rows.delete()[1].get(model._meta.label, 0)
        verb = "would delete" if dry_run else "deleted"
        lines.append(f"{title} older than {duration(older_than)}: {verb} {n}")
    return lines
