"""What an operator needs beside the queues themselves: failures, pauses, throughput over time
and the live worker processes (SPEC §7).

- :class:`Failure`: one row per handler failure a worker saw, with its traceback.
- :class:`PausedQueue`: a tube, board or loop handler that workers must leave alone for now.
- :class:`Throughput`: done / failed / given back per queue per minute, kept for
  ``THROUGHPUT_RETENTION`` seconds; older minutes fold into one row per queue (``minute`` NULL),
  so that lifetime totals never go down.
- :class:`WorkerProcess`: the worker processes alive now, with what each serves and holds.
"""

from __future__ import annotations

import datetime as dt
import time
import traceback as traceback_module
from typing import Any

from django.db import IntegrityError, models
from django.db.models import Sum

from .. import engine
from ..conf import setting

__all__ = [
    "Failure",
    "PausedQueue",
    "Throughput",
    "WorkerProcess",
    "KINDS",
    "record_throughput",
    "is_paused",
]

#: What a queue is: a tube, a job board, or a loop (named by its model label).
KINDS = ("task", "job", "loop")
_QUEUE_LENGTH = 100
#: The model labels of a tube's task and a board's job (Failure.objects.for_item dispatches on
#: them: this module is below boards and tubes, which record failures and pauses here).
_TUBE_TASK = "django_taskloop.task"
_BOARD_JOB = "django_taskloop.job"
_TASK_RESULT = "django_taskloop.taskrecord"
#: The tubes of the Django Tasks queue ``q`` are ``tasks.q`` and ``tasks-keyed.q`` (the backend's
#: ``TUBE_PREFIX`` and ``KEYED_TUBE_PREFIX``; :mod:`django_taskloop.stats` shows them by ``q``).
TASKS_TUBE_PREFIXES: tuple[str, ...] = ("tasks.", "tasks-keyed.")


def _clean(text: str, limit: int | None = None) -> str:
    # A message may hold anything; NUL and lone surrogates fail inside PostgreSQL/MariaDB.
    text = text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
    return text if limit is None else text[:limit]


def _check_kind(kind: Any) -> str:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
    known: str = kind
    return known


# -- failures ------------------------------------------------------------------------------------


class FailureManager(models.Manager["Failure"]):
    """``record()`` what a worker saw; ``for_item()`` an item's failures, newest first."""

    def record(
        self,
        *,
        kind: str,
        queue: str,
        item: Any,
        attempt: int,
        worker: str,
        error: BaseException,
        using: str = "default",
    ) -> Failure:
        """Store one failure of ``item`` (attempt ``attempt``, 1-based) and return it."""
        kind = _check_kind(kind)
        if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
            raise ValueError(f"attempt must be an int of at least 1, not {attempt!r}")
        if not isinstance(error, BaseException):
            raise TypeError(f"error must be an exception, not {type(error).__name__}")
        cause = error
        kind_of = type(cause)
        return self.db_manager(using).create(
            kind=kind,
            queue=_clean(str(queue), _QUEUE_LENGTH),
            item=_clean(str(item), 255),
            attempt=attempt,
            worker=_clean(str(worker), 255),
            error=_clean(f"{kind_of.__module__}.{kind_of.__qualname__}", 255),
            message=_clean(str(cause), 10_000),
            traceback=_clean("".join(traceback_module.format_exception(cause)), 100_000),
            at=engine.DbNow(),
        )

    def for_item(self, obj: Any) -> models.QuerySet[Failure]:
        """Return the failures of a tube ``Task``, a board ``Job``, ``(LoopModel, id)`` or a
        Django Task's result (a ``TaskRecord``: every attempt, in either of its queue's
        tubes), newest first."""
        label = obj._meta.label_lower if isinstance(obj, models.Model) else None
        if label == _TASK_RESULT:
            queues = [prefix + obj.queue_name for prefix in TASKS_TUBE_PREFIXES]
            where = {"kind": "task", "queue__in": queues, "item": str(obj.pk)}
            using = obj._state.db or "default"
        elif label == _TUBE_TASK:
            where = {"kind": "task", "queue": obj.tube.name, "item": str(obj.pk)}
            using = obj._state.db or "default"
        elif label == _BOARD_JOB:
            where = {"kind": "job", "queue": obj.board.name, "item": str(obj.uuid)}
            using = obj._state.db or "default"
        elif isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[0], type):
            model, item_id = obj
            where = {"kind": "loop", "queue": model._meta.label_lower, "item": str(item_id)}
            using = "default"
        else:
            raise TypeError(f"for_item() takes a Task, a Job, (LoopModel, id) or a TaskRecord, not {obj!r}")
        return self.using(using).filter(**where).order_by("-at", "-pk")

    def prune(self, using: str = "default") -> int:
        """Delete failures older than ``FAILURE_RETENTION`` seconds; return how many."""
        retention = float(setting("FAILURE_RETENTION"))
        return self.using(using).filter(at__lt=engine.DbNow(-retention)).delete()[0]


class Failure(models.Model):
    """One handler failure a worker saw (and one per Django Task that ended FAILED)."""

    kind = models.CharField(max_length=4, choices=[(k, k) for k in KINDS])
    #: The tube's name, the board's name or the loop's model label.
    queue = models.CharField(max_length=_QUEUE_LENGTH)
    #: The task id, the job's uuid or the loop id, as text; a Django Task's result id (its
    #: attempts are one item, whichever tube task brought each).
    item = models.CharField(max_length=255)
    attempt = models.PositiveIntegerField()
    worker = models.CharField(max_length=255)
    #: The exception's dotted class path.
    error = models.CharField(max_length=255)
    message = models.TextField(blank=True)
    traceback = models.TextField(blank=True)
    at = models.DateTimeField()

    objects = FailureManager()

    class Meta:
        app_label = "django_taskloop"
        db_table = "taskloop_failure"
        indexes = [
            models.Index(fields=["at"], name="taskloop_failure_at"),
            models.Index(fields=["queue", "at"], name="taskloop_failure_queue_at"),
            models.Index(fields=["error", "at"], name="taskloop_failure_error_at"),
            models.Index(fields=["kind", "queue", "item"], name="taskloop_failure_item"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.item} of {self.queue}: {self.error.rsplit('.', 1)[-1]} (attempt {self.attempt})"


# -- pauses --------------------------------------------------------------------------------------


#: How long a worker may trust what it read about a pause (SPEC: honoured within a second).
PAUSE_CACHE_SECONDS = 0.5
_pause_cache: dict[tuple[str, str, str], tuple[float, bool]] = {}


class PausedQueueManager(models.Manager["PausedQueue"]):
    """``pause()``, ``resume()`` and ``is_paused()`` a queue of a kind (on this manager's database)."""

    def pause(self, kind: str, queue: str) -> None:
        """Pause ``queue`` of ``kind``; pausing twice is a no-op."""
        kind = _check_kind(kind)
        using = self.db
        try:
            engine.run_in_transaction(
                PausedQueue,
                using,
                lambda: self.using(using).get_or_create(
                    kind=kind, queue=queue, defaults={"since": engine.DbNow()}
                ),
            )
        except IntegrityError:
            pass  # a rival paused it at the same moment
        _pause_cache.pop((using, kind, queue), None)

    def resume(self, kind: str, queue: str) -> None:
        """Resume ``queue`` of ``kind``; resuming a queue that is not paused is a no-op."""
        kind = _check_kind(kind)
        self.filter(kind=kind, queue=queue).delete()
        _pause_cache.pop((self.db, kind, queue), None)

    def is_paused(self, kind: str, queue: str, *, fresh: bool = True) -> bool:
        """Say whether ``queue`` is paused; ``fresh=False`` may answer from a cache up to half a
        second old (the claim paths of workers, which must not pay a query per claim)."""
        key = (self.db, kind, queue)
        now = time.monotonic()
        if not fresh:
            cached = _pause_cache.get(key)
            if cached is not None and now - cached[0] < PAUSE_CACHE_SECONDS:
                return cached[1]
        paused = self.filter(kind=kind, queue=queue).exists()
        _pause_cache[key] = (now, paused)
        return paused


class PausedQueue(models.Model):
    """A queue workers leave alone until it is resumed (one row per paused queue)."""

    kind = models.CharField(max_length=4, choices=[(k, k) for k in KINDS])
    queue = models.CharField(max_length=_QUEUE_LENGTH)
    since = models.DateTimeField()

    objects = PausedQueueManager()

    class Meta:
        app_label = "django_taskloop"
        db_table = "taskloop_paused_queue"
        constraints = [models.UniqueConstraint(fields=["kind", "queue"], name="taskloop_paused_uniq")]

    def __str__(self) -> str:
        return f"{self.kind} {self.queue} (paused)"


# The module-level spellings of the manager's verbs (facades and workers call these).


def pause(kind: str, queue: str, using: str = "default") -> None:
    """Pause ``queue`` of ``kind`` (:meth:`PausedQueueManager.pause` on ``using``)."""
    PausedQueue.objects.db_manager(using).pause(kind, queue)


def resume(kind: str, queue: str, using: str = "default") -> None:
    """Resume ``queue`` of ``kind`` (:meth:`PausedQueueManager.resume` on ``using``)."""
    PausedQueue.objects.db_manager(using).resume(kind, queue)


def is_paused(kind: str, queue: str, using: str = "default", *, fresh: bool = True) -> bool:
    """Say whether ``queue`` is paused (:meth:`PausedQueueManager.is_paused` on ``using``)."""
    return PausedQueue.objects.db_manager(using).is_paused(kind, queue, fresh=fresh)


# -- throughput ----------------------------------------------------------------------------------


class Throughput(models.Model):
    """Items done, failed and given back by workers, per queue and minute (database time).

    ``minute`` NULL holds the totals of minutes pruned since (see :func:`prune_throughput`).
    """

    kind = models.CharField(max_length=4, choices=[(k, k) for k in KINDS])
    queue = models.CharField(max_length=_QUEUE_LENGTH)
    minute = models.DateTimeField(null=True, blank=True)
    #: The writers' share (``engine.node_share``): each Galera node adds to rows of its own.
    node = models.PositiveSmallIntegerField(default=0)
    done = models.BigIntegerField(default=0)
    failed = models.BigIntegerField(default=0)
    given_back = models.BigIntegerField(default=0)

    class Meta:
        app_label = "django_taskloop"
        db_table = "taskloop_throughput"
        constraints = [
            models.UniqueConstraint(
                fields=["kind", "queue", "minute", "node"], name="taskloop_throughput_uniq"
            )
        ]
        indexes = [models.Index(fields=["minute"], name="taskloop_throughput_minute")]

    def __str__(self) -> str:
        return f"{self.kind} {self.queue} {self.minute}: {self.done} done, {self.failed} failed"


def _minute(using: str) -> Any:
    now = engine.db_now(using)
    return now.replace(second=0, microsecond=0)


def record_throughput(
    kind: str, queue: str, *, done: int = 0, failed: int = 0, given_back: int = 0, using: str = "default"
) -> None:
    """Add what a worker just settled to this minute's row of ``queue`` (one per batch): the
    row of the server's share (``engine.node_share``), so that Galera nodes never update the
    same row."""
    kind = _check_kind(kind)
    if not (done or failed or given_back):
        return
    minute = _minute(using)
    node = engine.node_share(using)[0]
    rows = Throughput.objects.using(using)

    def work() -> None:
        updated = rows.filter(kind=kind, queue=queue, minute=minute, node=node).update(
            done=models.F("done") + done,
            failed=models.F("failed") + failed,
            given_back=models.F("given_back") + given_back,
        )
        if not updated:
            rows.create(
                kind=kind,
                queue=queue,
                minute=minute,
                node=node,
                done=done,
                failed=failed,
                given_back=given_back,
            )

    try:
        engine.run_in_transaction(Throughput, using, work)
    except IntegrityError:
        # Another process created this minute's row between our update and our insert.
        engine.run_in_transaction(Throughput, using, work)


def throughput_series(
    kind: str, queue: str | None, since_seconds: float, bucket_seconds: int = 60, using: str = "default"
) -> list[tuple[Any, int, int, int]]:
    """Return ``(bucket start, done, failed, given back)`` for the last ``since_seconds``,
    one entry per bucket of ``bucket_seconds`` (multiples of a minute), oldest first; every
    bucket is there, empty ones with zeros. ``queue`` None sums every queue of ``kind``."""
    now = _minute(using)
    bucket = max(60, int(bucket_seconds) // 60 * 60)
    start = now - dt.timedelta(seconds=since_seconds)
    rows = Throughput.objects.using(using).filter(minute__gt=start)
    if kind != "*":
        rows = rows.filter(kind=_check_kind(kind))
    if queue is not None:
        rows = rows.filter(queue=queue)
    epoch = dt.datetime(2000, 1, 1, tzinfo=now.tzinfo)

    def key(moment: Any) -> Any:
        return epoch + dt.timedelta(seconds=(moment - epoch).total_seconds() // bucket * bucket)

    buckets: dict[Any, list[int]] = {}
    moment = key(start + dt.timedelta(seconds=60))
    while moment <= now:
        buckets[moment] = [0, 0, 0]
        moment += dt.timedelta(seconds=bucket)
    for minute, done, failed, back in rows.values_list("minute", "done", "failed", "given_back"):
        slot = buckets.setdefault(key(engine.to_datetime(minute)), [0, 0, 0])
        slot[0] += done
        slot[1] += failed
        slot[2] += back
    return [(moment, *values) for moment, values in sorted(buckets.items())]


def throughput_totals(using: str = "default") -> dict[tuple[str, str], dict[str, int]]:
    """Return lifetime totals ``{(kind, queue): {"done":…, "failed":…, "given_back":…}}``."""
    totals: dict[tuple[str, str], dict[str, int]] = {}
    rows = (
        Throughput.objects.using(using)
        .values("kind", "queue")
        .annotate(done_sum=Sum("done"), failed_sum=Sum("failed"), back_sum=Sum("given_back"))
    )
    for row in rows:
        totals[(row["kind"], row["queue"])] = {
            "done": int(row["done_sum"] or 0),
            "failed": int(row["failed_sum"] or 0),
            "given_back": int(row["back_sum"] or 0),
        }
    return totals


def prune_throughput(using: str = "default") -> int:
    """Fold minutes older than ``THROUGHPUT_RETENTION`` into each queue's totals row; return
    how many minute rows were folded (the table stays bounded, totals never go down)."""
    retention = float(setting("THROUGHPUT_RETENTION"))
    rows = Throughput.objects.using(using)

    def work() -> int:
        old = rows.filter(minute__isnull=False, minute__lt=engine.DbNow(-retention))
        sums = list(old.values("kind", "queue").annotate(d=Sum("done"), f=Sum("failed"), b=Sum("given_back")))
        for row in sums:
            updated = rows.filter(kind=row["kind"], queue=row["queue"], minute__isnull=True).update(
                done=models.F("done") + row["d"],
                failed=models.F("failed") + row["f"],
                given_back=models.F("given_back") + row["b"],
            )
            if not updated:
                rows.create(
                    kind=row["kind"],
                    queue=row["queue"],
                    minute=None,
                    done=row["d"],
                    failed=row["f"],
                    given_back=row["b"],
                )
        return old.delete()[0]

    return engine.run_in_transaction(Throughput, using, work)


# -- worker processes ------------------------------------------------------------------------------


class WorkerProcessManager(models.Manager["WorkerProcess"]):
    """Worker processes say they are alive (``beat``) and leave (``gone``)."""

    def beat(self, identity: str, *, host: str, pid: int, queues: list[str], holding: dict[str, int]) -> None:
        """Record that worker ``identity`` is alive, serving ``queues`` and holding ``holding``."""
        using = self.db
        rows = self.using(using)

        def update() -> int:
            return rows.filter(identity=identity).update(
                beat_at=engine.DbNow(), queues=queues, holding=holding
            )

        # Usually the row is there: one UPDATE on its own (an idle worker beats on and on).
        if engine.run_in_transaction(WorkerProcess, using, update, alone=True):
            return

        def work() -> None:
            if not update():
                rows.create(
                    identity=identity,
                    host=host,
                    pid=pid,
                    queues=queues,
                    holding=holding,
                    started=engine.DbNow(),
                    beat_at=engine.DbNow(),
                )

        try:
            engine.run_in_transaction(WorkerProcess, using, work)
        except IntegrityError:
            engine.run_in_transaction(WorkerProcess, using, work)

    def report_progress(self, identity: str, progress: list[dict[str, Any]]) -> int:
        """Store what worker ``identity``'s running handlers reported (the whole list, one
        ``UPDATE`` of its row); return 1, or 0 when the row is not there (yet)."""
        using = self.db
        entries = [
            {**entry, "queue": _clean(str(entry["queue"])), "message": _clean(str(entry["message"]))}
            for entry in progress
        ]

        def update() -> int:
            return (
                self.using(using)
                .filter(identity=identity)
                .update(progress=entries, progress_at=engine.DbNow())
            )

        return engine.run_in_transaction(WorkerProcess, using, update, alone=True)

    def gone(self, identity: str) -> None:
        """Forget worker ``identity`` (it stopped cleanly)."""
        rows = self.filter(identity=identity)
        engine.run_in_transaction(WorkerProcess, rows.db, lambda: rows.delete(), alone=True)

    def alive(self) -> models.QuerySet[WorkerProcess]:
        """Workers that beat within ``WORKER_TIMEOUT`` seconds."""
        return self.filter(beat_at__gte=engine.DbNow(-float(setting("WORKER_TIMEOUT"))))

    def prune(self) -> int:
        """Forget workers silent for ten times ``WORKER_TIMEOUT``; return how many."""
        return self.filter(beat_at__lt=engine.DbNow(-10 * float(setting("WORKER_TIMEOUT")))).delete()[0]


class WorkerProcess(models.Model):
    """A ``manage.py workers`` process that is (or was lately) alive."""

    identity = models.CharField(max_length=255, unique=True)
    host = models.CharField(max_length=255)
    pid = models.IntegerField()
    started = models.DateTimeField()
    beat_at = models.DateTimeField()
    #: ``["task:emails", "loop:news.feedloop", …]``
    queues = models.JSONField(default=list)
    #: Items in hand per queue now: ``{"task:emails": 3}``.
    holding = models.JSONField(default=dict)
    #: What its running handlers reported (:mod:`django_taskloop.progress`): ``[{"kind": "task",
    #: "queue": "emails", "item": "42", "fraction": 0.4, "message": "…"}, …]``.
    progress = models.JSONField(default=list, blank=True)
    #: When ``progress`` was last written (``None``: never).
    progress_at = models.DateTimeField(null=True, blank=True)

    objects = WorkerProcessManager()

    class Meta:
        app_label = "django_taskloop"
        db_table = "taskloop_worker_process"
        verbose_name = "worker process"
        verbose_name_plural = "worker processes"
        indexes = [models.Index(fields=["beat_at"], name="taskloop_worker_beat")]

    def __str__(self) -> str:
        return self.identity
