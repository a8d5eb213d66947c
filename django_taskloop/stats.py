"""The read model: one :class:`QueueSummary` per queue (tube, job board, task loop).

The single definition of what a queue holds, used by the admin's dashboard and statistics
pages, the metrics and the commands. Every state is the facade's named queryset state
(``Task.objects.ready()``, ``Job.objects.expired()``, ``SomeLoop.objects.bumped()``), read with
the database's clock; nothing here writes. Counts are exact, or with ``cap`` stop counting at
``cap`` rows per state (one range of a claim index each), so a page stays fast at millions.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from django.apps import apps
from django.db import router
from django.db.models import Count, Q, QuerySet, Sum
from django.utils import timezone

from . import engine, shards
from .models import (
    KINDS,
    Failure,
    Job,
    JobBoard,
    JobPriority,
    JobQuerySet,
    Task,
    TaskLoop,
    TaskLoopQuerySet,
    TaskRecord,
    TaskRecordStatus,
    Tube,
    WorkerProcess,
)
from .models.operating import TASKS_TUBE_PREFIXES as _TASKS_TUBE_PREFIXES
from .models.operating import Throughput
from .models.tubes import TASK_STATES
from .validation import Rate

__all__ = [
    "JOB_STATES",
    "KINDS",
    "LOCK_BUCKETS",
    "LOOP_STATES",
    "TASK_STATES",
    "DJANGO_TASK",
    "DJANGO_TASK_STATES",
    "TASKS_TUBE_PREFIXES",
    "ItemProgress",
    "QueueSummary",
    "django_tasks_queue",
    "merge_django_tasks",
    "shown_queue",
    "board_priorities",
    "board_summary",
    "capped_count",
    "failed_for_good",
    "failures_last_hour",
    "processed_last_hour",
    "queue_databases",
    "lock_ages",
    "loop_models",
    "loop_summary",
    "queue_summaries",
    "running_progress",
    "tube_summary",
    "workers_serving",
]

JOB_STATES: tuple[str, ...] = JobQuerySet.STATES
LOOP_STATES: tuple[str, ...] = TaskLoopQuerySet.STATES
#: Buckets of "time until the lock ends" (upper bound in seconds, label), for lock-age charts.
LOCK_BUCKETS: tuple[tuple[int | None, str], ...] = (
    (60, "< 1 min"),
    (600, "1–10 min"),
    (3600, "10–60 min"),
    (6 * 3600, "1–6 h"),
    (None, "> 6 h"),
)

Source = Tube | JobBoard | type[TaskLoop]

#: The kind of a Django Tasks queue where queues are shown to people (the dashboard, the
#: metrics): its two tubes merged under the queue's Django name.
DJANGO_TASK = "django_task"
#: A Django Tasks queue's states: its tubes' tasks by :data:`TASK_STATES`, then ``failed``:
#: its results that failed for good (FAILED after their last attempt), which stay counted until
#: an operator retries them or they are pruned (the tube task is gone by then: only the result
#: is left to show them).
DJANGO_TASK_STATES: tuple[str, ...] = (*TASK_STATES, "failed")
#: The tubes of the Django Tasks queue ``q`` are ``tasks.q`` (its tasks) and ``tasks-keyed.q``
#: (its keyed tasks, a ``utubettl``): the backend's ``TUBE_PREFIX`` and ``KEYED_TUBE_PREFIX``,
#: spelled on the models' floor because it is below the backend's (a test holds them equal).
TASKS_TUBE_PREFIXES = _TASKS_TUBE_PREFIXES


def django_tasks_queue(tube_name: str) -> str | None:
    """Return the Django Tasks queue whose tasks the tube ``tube_name`` holds (``None``: a tube
    of the user's own)."""
    for prefix in TASKS_TUBE_PREFIXES:
        if tube_name.startswith(prefix) and len(tube_name) > len(prefix):
            return tube_name[len(prefix) :]
    return None


@dataclasses.dataclass(frozen=True)
class QueueSummary:
    """What one queue holds now, by the named states of its items."""

    #: ``"task"`` (a tube), ``"job"`` (a board) or ``"loop"``.
    kind: str
    #: The queue's name: the tube's or board's name, the loop model's label (``app.model``).
    name: str
    #: A name for people: the tube's or board's name, the loop's verbose name (plural).
    title: str
    #: The database alias the queue was read from.
    using: str
    #: The tube, the board, or the loop's model.
    source: Source
    #: ``{state: count}``, every state of the kind in its order.
    counts: dict[str, int]
    #: The states whose count stopped at the cap (the true count is at least that).
    capped: frozenset[str]
    #: Seconds the next item to run has waited (a loop: since its oldest bump or expired
    #: lock); ``None`` when nothing is ready.
    oldest_ready: float | None
    #: Whether workers leave the queue alone.
    paused: bool
    #: The database's clock when the queue was read.
    now: dt.datetime
    #: Handler failures recorded for the queue in the last hour.
    failures_last_hour: int = 0
    #: A board's oldest live claim: seconds since it was made (``None``: no live claim).
    oldest_claim: float | None = None
    #: A loop's lock that ends last: seconds until it does (``None``: nothing locked).
    longest_lock_left: float | None = None
    #: A Django Tasks queue (kind :data:`DJANGO_TASK`): the tubes it is made of.
    tubes: tuple[Tube, ...] = ()
    #: A tube's running limit (``Tube.set_limit``): at most this many taken at once by every
    #: worker together; ``None``: no limit.
    limit: int | None = None
    #: A tube's rate (``Tube.set_rate``: ``str(rate)`` reads ``60/s``); ``None``: no rate.
    rate: Rate | None = None
    #: A tube with a rate: how many of its tasks were taken in the rate's window up to now.
    started: int | None = None
    #: A utube's key limit (``Tube.set_key_limit``): at most this many tasks of one key taken
    #: at once; ``None``: one at a time (or a tube without keys). A Django Tasks queue: its
    #: keyed tube's.
    key_limit: int | None = None
    #: A utube's key rate (``Tube.set_key_rate``): at most ``key_rate.count`` of one key's tasks
    #: taken in any period; ``None``: none. A Django Tasks queue: its keyed tube's.
    key_rate: Rate | None = None
    #: Why the queue's database could not be read (``OperationalError: …``), or ``None``. A
    #: queue that is down reads as empty, its ``source`` an unsaved namesake and ``now`` the
    #: web server's clock: nothing of it is known but its name and where it lives.
    down: str | None = None

    @property
    def empty(self) -> bool:
        """Whether the queue holds nothing at all."""
        return not any(self.counts.values())

    @property
    def exact(self) -> bool:
        """Whether every count is exact (none stopped at the cap)."""
        return not self.capped

    def depth(self) -> dict[str, tuple[int, bool]]:
        """Return ``{state: (count, exact)}``."""
        return {state: (n, state not in self.capped) for state, n in self.counts.items()}


class NamedStates(Protocol):
    """A queryset with named states: ``in_state(name)`` and ``state_counts()``."""

    def in_state(self, name: str) -> QuerySet[Any]: ...

    def state_counts(self) -> dict[str, int]: ...


def capped_count(queryset: QuerySet[Any], cap: int) -> tuple[int, bool]:
    """Return ``(count, exact)``, counting at most ``cap + 1`` rows."""
    count = queryset.order_by()[: cap + 1].count()
    return (cap, False) if count > cap else (count, True)


def _counts(
    queryset: NamedStates, states: Sequence[str], cap: int | None
) -> tuple[dict[str, int], frozenset[str]]:
    """Count ``queryset`` by its named states: all in one read, or each up to ``cap``."""
    if cap is None:
        return queryset.state_counts(), frozenset()
    counts, capped = {}, set()
    for state in states:
        counts[state], exact = capped_count(queryset.in_state(state), cap)
        if not exact:
            capped.add(state)
    return counts, frozenset(capped)


def _since(now: dt.datetime, then: dt.datetime | None) -> float | None:
    return None if then is None else max(0.0, (now - engine.to_datetime(then)).total_seconds())


def _until(now: dt.datetime, then: dt.datetime | None) -> float | None:
    return None if then is None else max(0.0, (engine.to_datetime(then) - now).total_seconds())


def tube_summary(
    tube: Tube, *, cap: int | None = None, now: dt.datetime | None = None, failures: int = 0
) -> QueueSummary:
    """Return a tube's summary: its tasks by ``Task.objects``' named states."""
    using = tube._state.db or router.db_for_read(Task)
    tasks = Task.objects.using(using).filter(tube=tube)
    counts, capped = _counts(tasks, TASK_STATES, cap)
    now = now or engine.db_now(using)
    # The head of the claim order (one index read): the task the next take gets.
    head = (
        tasks.ready().in_claim_order().values_list("created", flat=True).first() if counts["ready"] else None
    )
    return QueueSummary(
        kind="task",
        name=tube.name,
        title=shards.shown(tube.name, using),  # a shard other than the router's: emails@queue2
        using=using,
        source=tube,
        counts=counts,
        capped=capped,
        oldest_ready=_since(now, head),
        paused=tube.paused,
        now=now,
        failures_last_hour=failures,
        limit=tube.running_limit,
        rate=tube.rate,
        started=tube.rate_used(),
        key_limit=tube.key_limit,
        key_rate=tube.key_rate,
    )


def board_summary(
    board: JobBoard, *, cap: int | None = None, now: dt.datetime | None = None, failures: int = 0
) -> QueueSummary:
    """Return a board's summary: its jobs by ``Job.objects``' named states."""
    using = board._state.db or router.db_for_read(Job)
    jobs = Job.objects.db_manager(using).filter(board=board)
    counts, capped = _counts(jobs, JOB_STATES, cap)
    now = now or engine.db_now(using)
    # The job the next claim_next gets: unclaimed, or whose claim expired.
    head = jobs.claimable().in_claim_order().values_list("created_on", flat=True).first()
    oldest_claim = None
    if counts["claimed"]:
        oldest_claim = (
            jobs.claimed().order_by("last_modified").values_list("last_modified", flat=True).first()
        )
    return QueueSummary(
        kind="job",
        name=board.name,
        title=shards.shown(board.name, using),
        using=using,
        source=board,
        counts=counts,
        capped=capped,
        oldest_ready=_since(now, head),
        paused=board.paused,
        now=now,
        failures_last_hour=failures,
        oldest_claim=_since(now, oldest_claim),
    )


def loop_summary(
    model: type[TaskLoop],
    using: str | None = None,
    *,
    cap: int | None = None,
    now: dt.datetime | None = None,
    failures: int = 0,
) -> QueueSummary:
    """Return a loop's summary: its ids by the loop queryset's named states."""
    manager: Any = model._default_manager if using is None else model._default_manager.db_manager(using)
    rows = manager.all()
    counts, capped = _counts(rows, LOOP_STATES, cap)
    now = now or engine.db_now(manager.db)
    # Each one row from one end of a claim index range, skipped when the count says none.
    lock_until = rows.order_by().values_list("lock_until", flat=True)
    oldest_bump = lock_until.bumped().order_by("lock_until").first() if counts["bumped"] else None
    last_lock = lock_until.locked().order_by("-lock_until").first() if counts["locked"] else None
    return QueueSummary(
        kind="loop",
        name=model._meta.label_lower,
        title=str(model._meta.verbose_name_plural),
        using=manager.db,
        source=model,
        counts=counts,
        capped=capped,
        oldest_ready=_since(now, oldest_bump),
        paused=manager.paused(),
        now=now,
        failures_last_hour=failures,
        longest_lock_left=_until(now, last_lock),
    )


def board_priorities(board: JobBoard) -> dict[str, int]:
    """Return ``{priority name: live jobs}`` of a board, every priority listed (one read)."""
    using = board._state.db or router.db_for_read(Job)
    live = Job.objects.db_manager(using).filter(board=board, trashed=False).order_by()
    by_priority = {member.name: 0 for member in JobPriority}
    for priority, n in live.values_list("priority").annotate(n=Count("pk")):
        by_priority[priority.name if isinstance(priority, JobPriority) else str(priority)] = n
    return by_priority


def lock_ages(model: type[TaskLoop], using: str | None = None, *, cap: int) -> dict[str, int]:
    """Return ``{bucket label: locked ids}`` by time until their lock ends (:data:`LOCK_BUCKETS`).

    One range of the claim index per bucket, each counted up to ``cap``: a CASE aggregate
    over every locked row would read them all.
    """
    manager: Any = model._default_manager if using is None else model._default_manager.db_manager(using)
    ages = {label: 0 for _upper, label in LOCK_BUCKETS}
    if not manager.locked().exists():
        return ages
    lower = 0
    for upper, label in LOCK_BUCKETS:
        condition = Q(lock_until__gt=engine.DbNow(lower))
        if upper is not None:
            condition &= Q(lock_until__lte=engine.DbNow(upper))
        ages[label] = capped_count(manager.filter(condition), cap)[0]
        lower = upper or lower
    return ages


def loop_models() -> list[type[TaskLoop]]:
    """Return every concrete ``TaskLoop`` model of the installed apps (no proxies)."""
    return [m for m in apps.get_models() if issubclass(m, TaskLoop) and not m._meta.proxy]


def processed_last_hour(using: str | None = None) -> dict[tuple[str, str], tuple[int, int]]:
    """Return ``{(kind, queue): (done, failed)}``: the items workers settled in the last hour,
    and those whose handler raised (one grouped read of the per-minute throughput rows of
    database ``using``, default the router's: a shard's workers write on the shard)."""
    rows = (
        Throughput.objects.using(using or router.db_for_read(Throughput))
        .filter(minute__gte=engine.DbNow(-3600))
        .values_list("kind", "queue")
        .annotate(done_sum=Sum("done"), failed_sum=Sum("failed"))
        .values_list("kind", "queue", "done_sum", "failed_sum")
    )
    return {(kind, queue): (done or 0, failed or 0) for kind, queue, done, failed in rows}


def failures_last_hour(using: str | None = None) -> dict[tuple[str, str], int]:
    """Return ``{(kind, queue): failures}`` of the last hour (one grouped read of an index) on
    database ``using``, default the router's (a shard's workers record its failures there)."""
    rows = (
        Failure.objects.using(using or router.db_for_read(Failure))
        .filter(at__gte=engine.DbNow(-3600))
        .values_list("kind", "queue")
        .annotate(n=Count("pk"))
        .values_list("kind", "queue", "n")
    )
    return {(kind, queue): n for kind, queue, n in rows}


@dataclasses.dataclass(frozen=True)
class ItemProgress:
    """What a running handler last reported on its item (``django_taskloop.progress.report``)."""

    #: ``"task"``, ``"job"`` or ``"loop"``, and the queue, as :class:`Failure` rows name them
    #: (a Django Task: its tube's name, and its result id as the item).
    kind: str
    queue: str
    item: str
    #: From 0 to 1.
    fraction: float
    message: str
    #: The worker process that runs it.
    worker: str
    #: When the worker last wrote its progress (the database's clock).
    at: dt.datetime | None


def running_progress(
    kind: str | None = None,
    queue: str | Sequence[str] | None = None,
    item: Any = None,
    *,
    using: str = "default",
) -> list[ItemProgress]:
    """Return the progress reported on the items that live workers run now, by worker and
    item; only those of ``kind``, of ``queue`` (a name or several) and ``item`` when given
    (one item: a list of at most one). One read of the live workers' rows on ``using``."""
    wanted = {
        "kind": None if kind is None else {kind},
        "queue": {queue} if isinstance(queue, str) else None if queue is None else set(queue),
        "item": None if item is None else {str(item)},
    }
    rows = WorkerProcess.objects.db_manager(using).alive().order_by("identity")
    found = []
    for worker, at, entries in rows.values_list("identity", "progress_at", "progress"):
        for entry in entries or ():
            if all(values is None or entry.get(name) in values for name, values in wanted.items()):
                found.append(
                    ItemProgress(
                        kind=entry["kind"],
                        queue=entry["queue"],
                        item=entry["item"],
                        fraction=float(entry["fraction"]),
                        message=entry.get("message", ""),
                        worker=worker,
                        at=None if at is None else engine.to_datetime(at),
                    )
                )
    return found


def queue_summaries(
    kinds: Iterable[str] = KINDS,
    *,
    cap: int | None = None,
    limit: int | None = None,
    loops: Iterable[type[TaskLoop]] | None = None,
    down: dict[str, str] | None = None,
) -> list[QueueSummary]:
    """Return the summaries of every queue of ``kinds``, in that order of kinds, by name.

    ``limit`` keeps at most that many tubes and as many boards (the first by name); ``cap``
    stops each count there; ``loops`` narrows the loops (default: :func:`loop_models`). The
    database's clock is read once per database.

    A database that cannot be reached (:func:`~django_taskloop.shards.read_each`) is named in
    ``down`` (``{alias: reason}``, filled in when given) and its queues are summaries marked
    :attr:`~QueueSummary.down`: a shard of a queue found on another database, a loop's model.
    """
    kinds = list(kinds)
    unknown = [kind for kind in kinds if kind not in KINDS]
    if unknown:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {unknown[0]!r}")
    reader = _Reader(cap, limit, {} if down is None else down)
    summaries: list[QueueSummary] = []
    for kind in kinds:
        if kind == "task":
            # Every database that holds tubes: a sharded tube is one summary per shard.
            read = shards.read_each(shards.tube_databases(), reader.tubes, reader.down)
            summaries += _with_down(read, reader.down, "task")
        elif kind == "job":
            # Likewise a board that SHARDS spreads: one summary per shard.
            summaries += _with_down(
                shards.read_each(shards.board_databases(), reader.boards, reader.down), reader.down, "job"
            )
        else:
            summaries += [reader.loop(model) for model in (loop_models() if loops is None else loops)]
    return summaries


class _Reader:
    """One look at the queues: each database's clock and failures read once, and the
    databases found down (``down``, by alias)."""

    def __init__(self, cap: int | None, limit: int | None, down: dict[str, str]) -> None:
        self.cap, self.limit, self.down = cap, limit, down
        self.clocks: dict[str, dt.datetime] = {}
        self.failures: dict[str, dict[tuple[str, str], int]] = {}

    def clock(self, using: str) -> dt.datetime:
        if using not in self.clocks:
            self.clocks[using] = engine.db_now(using)
        return self.clocks[using]

    def failed(self, using: str, kind: str, name: str) -> int:
        # Each database's own failures: a shard's are recorded on it.
        if using not in self.failures:
            self.failures[using] = failures_last_hour(using)
        return self.failures[using].get((kind, name), 0)

    def tubes(self, using: str) -> list[QueueSummary]:
        return [
            tube_summary(
                tube, cap=self.cap, now=self.clock(using), failures=self.failed(using, "task", tube.name)
            )
            for tube in Tube.objects.using(using).order_by("name")[: self.limit]
        ]

    def boards(self, using: str) -> list[QueueSummary]:
        return [
            board_summary(
                board, cap=self.cap, now=self.clock(using), failures=self.failed(using, "job", board.name)
            )
            for board in JobBoard.objects.using(using).order_by("name")[: self.limit]
        ]

    def loop(self, model: type[TaskLoop]) -> QueueSummary:
        label, using = model._meta.label_lower, model._default_manager.db

        def read(using: str) -> QueueSummary:
            failures = self.failed(using, "loop", label)
            return loop_summary(model, cap=self.cap, now=self.clock(using), failures=failures)

        found = shards.read_each([using], read, self.down)
        return found[using] if using in found else _down_summary("loop", model, using, self.down[using])


def _with_down(read: dict[str, list[QueueSummary]], down: dict[str, str], kind: str) -> list[QueueSummary]:
    """The summaries ``read`` of each database, in turn; in the place of a database that is
    down, a summary marked down for each queue read elsewhere that has a home there (the
    shards the operator's verbs reach: :func:`~django_taskloop.shards.homes`)."""
    model = Tube if kind == "task" else JobBoard
    sources = {summary.name: summary.source for summaries in read.values() for summary in summaries}
    places = shards.tube_databases() if kind == "task" else shards.board_databases()
    rows: list[QueueSummary] = []
    for using in places:
        if using in read:
            rows += read[using]
        elif using in down:
            rows += [
                _down_summary(kind, _namesake(source, using), using, down[using])
                for name, source in sorted(sources.items())
                if using in shards.homes(model, name)
            ]
    return rows


def _namesake(source: Any, using: str) -> Any:
    """An unsaved tube or board named as ``source``, on database ``using``."""
    model = type(source)
    found = model(name=source.name, **({"type": source.type} if model is Tube else {}))
    found._state.db = using
    return found


def _down_summary(kind: str, source: Any, using: str, reason: str) -> QueueSummary:
    """The summary of a queue whose database ``using`` is down: its name, empty, marked down."""
    states = {"task": TASK_STATES, "job": JOB_STATES, "loop": LOOP_STATES}[kind]
    name = source._meta.label_lower if kind == "loop" else source.name
    return QueueSummary(
        kind=kind,
        name=name,
        title=str(source._meta.verbose_name_plural) if kind == "loop" else shards.shown(name, using),
        using=using,
        source=source,
        counts=dict.fromkeys(states, 0),
        capped=frozenset(),
        oldest_ready=None,
        paused=False,
        now=timezone.now(),
        down=reason,
    )


def queue_databases() -> list[str]:
    """Every database the read model reads queues from: the tubes', the boards' (with each
    alias ``SHARDS`` names), the loop models'."""
    loops = [model._default_manager.db for model in loop_models()]
    return list(dict.fromkeys([*shards.tube_databases(), *shards.board_databases(), *loops]))


def merge_django_tasks(summaries: Iterable[QueueSummary]) -> list[QueueSummary]:
    """Return ``summaries`` with the tubes of each Django Tasks queue merged into one summary
    of kind :data:`DJANGO_TASK`, named by the queue's Django name, where its first tube was.

    Counts add up (a capped count stays capped), the oldest ready task is the older of the
    two, and the queue reads paused if either tube is (an operator may pause one alone). The
    merged counts end with ``failed`` (:data:`DJANGO_TASK_STATES`): the queue's results that
    failed for good, read from the results (one read per database).
    """
    merged: list[QueueSummary] = []
    at: dict[tuple[str, str], int] = {}
    for summary in summaries:
        queue = django_tasks_queue(summary.name) if summary.kind == "task" else None
        if queue is None:
            merged.append(summary)
            continue
        tube: Any = summary.source
        key = (summary.using, queue)
        if key not in at:
            at[key] = len(merged)
            merged.append(
                dataclasses.replace(
                    summary,
                    kind=DJANGO_TASK,
                    name=queue,
                    title=shards.shown(queue, summary.using),
                    tubes=(tube,),
                )
            )
            continue
        first = merged[at[key]]
        # The plain tube is the queue's source, listed first (by name the keyed one sorts first).
        plain = summary.name.startswith(TASKS_TUBE_PREFIXES[0])
        ages = [age for age in (first.oldest_ready, summary.oldest_ready) if age is not None]
        merged[at[key]] = dataclasses.replace(
            first,
            counts={state: n + summary.counts.get(state, 0) for state, n in first.counts.items()},
            capped=first.capped | summary.capped,
            oldest_ready=max(ages) if ages else None,
            paused=first.paused or summary.paused,
            down=first.down or summary.down,
            failures_last_hour=first.failures_last_hour + summary.failures_last_hour,
            key_limit=first.key_limit or summary.key_limit,
            key_rate=first.key_rate or summary.key_rate,
            source=tube if plain else first.source,
            tubes=(tube, *first.tubes) if plain else (*first.tubes, tube),
        )
    return _with_failed(merged)


def failed_for_good(using: str) -> dict[str, int]:
    """Return ``{Django Tasks queue: its results that failed for good}`` on database ``using``
    (one grouped read of the results' status index)."""
    rows = (
        TaskRecord.objects.using(using)
        .filter(status=TaskRecordStatus.FAILED)
        .order_by()
        .values_list("queue_name")
        .annotate(n=Count("pk"))
    )
    return dict(rows)


def _with_failed(merged: list[QueueSummary]) -> list[QueueSummary]:
    """``merged`` with each Django Tasks queue's ``failed`` count (one read per database)."""
    places = list(dict.fromkeys(s.using for s in merged if s.kind == DJANGO_TASK and s.down is None))
    failed = shards.read_each(places, failed_for_good, {})  # (one down since: counted as 0)
    return [
        dataclasses.replace(s, counts={**s.counts, "failed": failed.get(s.using, {}).get(s.name, 0)})
        if s.kind == DJANGO_TASK
        else s
        for s in merged
    ]


def shown_queue(kind: str, queue: str) -> tuple[str, str]:
    """Return ``(kind, queue)`` as people see it: a tube of a Django Tasks queue is that queue,
    ``(DJANGO_TASK, its Django name)``; any other queue is itself."""
    tasks = django_tasks_queue(queue) if kind == "task" else None
    return (DJANGO_TASK, tasks) if tasks is not None else (kind, queue)


def workers_serving() -> dict[tuple[str, str], int]:
    """Return ``{(kind, queue): live worker processes serving it}``, a Django Tasks queue once
    under ``(DJANGO_TASK, its Django name)`` (a process serving both its tubes counts once)."""
    serving: dict[tuple[str, str], int] = {}
    for queues in WorkerProcess.objects.alive().values_list("queues", flat=True):
        for key in {shown_queue(*name.partition(":")[::2]) for name in queues or []}:
            serving[key] = serving.get(key, 0) + 1
    return serving
