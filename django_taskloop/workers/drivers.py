"""How a worker claims, finishes, retries, gives back and renews the work of each facade.

A driver speaks one facade's public API (loops, job boards, tubes) so that the worker loop in
:mod:`.runner` is the same for all three.
"""

from __future__ import annotations

import functools
import logging
import math
import operator
import os
import socket
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeAlias, TypeVar

from django.db import DatabaseError

from .. import wakeup
from ..backends import result_id_of, task_path_of
from ..conf import setting
from ..engine.deadline import bounded
from ..exceptions import NotFound
from ..models import Consumer, JobBoard, TaskRecord, Tube
from ..models.operating import is_paused
from ..models.tubes import TAKEN, ClaimCursor, worth_trying
from ..runtime import backoff, run_interruptibly
from ..shards import open_tube
from . import Handler

logger = logging.getLogger("django_taskloop.workers")

__all__ = ["AnyDriver", "Driver", "LoopDriver", "TubeDriver", "BoardDriver", "make_driver", "backoff"]

if TYPE_CHECKING:
    from ..models.boards import Job, JobBoard
    from ..models.loops import TaskLoop, TaskLoopManager
    from ..models.tubes import Task, Tube
    from ..validation import Rate

#: What one driver hands the worker: a tube's Task, a board's Job, a loop's id.
Item = TypeVar("Item")


#: The verbs that talk to the queue's database, each a stretch of our own work bounded by
#: ``TASKLOOP["DATABASE_TIMEOUT"]`` (:func:`~django_taskloop.engine.deadline.bounded`): a server
#: that hangs is then met as one that went away (a shard parked, a single database waited out)
#: instead of holding the worker, and every other queue, for as long as it hangs. Never the
#: handler's :meth:`Driver.call`, nor :meth:`TubeDriver.wait_one`'s long wait.
BOUNDED_VERBS = (
    "prepare",
    "claim",
    "done",
    "done_and_claim",
    "failed",
    "give_back",
    "renew",
    "confirm",
    "beat",
)


def _bounded_verb(verb: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(verb)
    def call(self: Driver[Any], *args: Any, **kwargs: Any) -> Any:
        with bounded(self.using):
            return verb(self, *args, **kwargs)

    return call


class Driver(Generic[Item]):
    """The verbs the worker loop needs from one handler's facade."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in BOUNDED_VERBS:
            if name in vars(cls):
                setattr(cls, name, _bounded_verb(vars(cls)[name]))

    def __init__(self, handler: Handler, identity: str) -> None:
        self.handler = handler
        self.identity = identity
        # Failures seen by this process, for facades that keep no attempt count.
        self._failures: dict[Hashable, int] = {}
        self._lock = threading.Lock()

    @property
    def beat_every(self) -> float:
        """Seconds between heartbeats: often enough that no lease lapses while a handler runs."""
        return min(float(setting("HEARTBEAT_INTERVAL")), self.handler.lease / 3)

    def prepare(self) -> None:
        """Create what the handler serves if it does not exist yet."""

    def claim(self, limit: int) -> list[Item]:
        raise NotImplementedError

    def key(self, item: Item) -> Hashable:
        """Return what identifies ``item`` (a task's id, a job's uuid, a loop's id)."""
        return item

    def describe_queue(self) -> str:
        """Name what this driver serves, for log lines: ``tube "emails"`` (one shard of a
        sharded tube: ``tube "emails" on queue2``)."""
        shard = f" on {self.handler.database}" if self.handler.database is not None else ""
        return f'{self.handler.kind} "{self.handler.name}"{shard}'

    def describe(self, item: Item) -> str:
        """Name one item, for log lines: ``task 10 of tube "emails"``."""
        return f"{self.noun} {self.key(item)} of {self.describe_queue()}"

    def describe_fully(self, item: Item) -> str:
        """Name one item in full, for the lines of a failure and of ``-v 2``: :meth:`describe`,
        plus what it may have to read (the hot path's lines read nothing)."""
        return self.describe(item)

    def failure_item(self, item: Item) -> str:
        """Return what a Failure row names the item by: its key (a Django Task: its result id,
        so that the attempts of one result are one item)."""
        return str(self.key(item))

    #: What one item is called in log lines.
    noun = "item"
    #: The kind of queue, as Failure and Throughput spell it: "task", "job" or "loop".
    queue_kind = "task"

    @property
    def queue(self) -> str:
        """The queue's name, as Failure and Throughput spell it (a loop: its model label)."""
        return str(self.handler.target)

    def attempt(self, item: Item) -> int:
        """Which attempt at ``item`` this is (1-based), for its Failure row."""
        return max(1, int(getattr(item, "attempts", 0) or 0))

    def paused(self) -> bool:
        """Whether the queue is paused (tubes and boards hand out nothing then by themselves)."""
        return False

    @property
    def limited(self) -> bool:
        """Whether the queue has a running limit (a tube's ``set_limit``): finishing an item
        frees a slot that any worker may take next."""
        return False

    #: Whether the queue has a rate (a tube's ``set_rate``): the worker claims only for its
    #: free slots and starts what it claims at once (the rate counts a task at its claim). An
    #: attribute, not a property: the batch loop reads it, and the hot path's budget counts
    #: calls.
    paced: bool = False

    def paced_until(self) -> float | None:
        """When the queue's rate lets this process's next take claim again
        (``time.monotonic()``), if a take found it used up; else ``None``."""
        return None

    def claim_sent_at(self) -> float | None:
        """A queue with a rate: when its last claim began (``time.monotonic()``)."""
        return None

    @property
    def using(self) -> str:
        """The database alias the queue lives on."""
        return "default"

    def call(self, item: Item) -> Any:
        # Built-in handlers (the Django Tasks backend) mark the user code inside them
        # themselves, so that their own bookkeeping is never interrupted half-way.
        if self.handler.builtin:
            return self.handler.func(item)
        return run_interruptibly(self.handler.func, item)

    def done(self, items: Sequence[Item]) -> None:
        raise NotImplementedError

    def done_and_claim(self, items: Sequence[Item], limit: int) -> list[Item]:
        """Settle ``items`` as done and claim the next batch (``limit`` 0: none); facades that
        can do both in one transaction do."""
        self.done(items)
        return self.claim(limit) if limit else []

    def failed(self, item: Item, error: BaseException) -> str:
        """Deal with a handler failure on ``item``; return what was done, for the log line
        ``<item> failed <what was done>: <error>``, e.g. ``(attempt 1 of 5), retrying in 1 s``."""
        raise NotImplementedError

    def give_back(self, items: Sequence[Item]) -> None:
        raise NotImplementedError

    def renew(self, items: Sequence[Item]) -> bool:
        """Extend the leases of ``items`` while the handler works on them; say whether every
        one of them was renewed (one lost meanwhile, to another worker, was not)."""
        raise NotImplementedError

    def lease_of(self, items: Sequence[Item]) -> float:
        """Seconds that a claim or a renewal of ``items`` surely holds them, from the moment its
        statement was sent (the shortest of theirs)."""
        return self.handler.lease

    def confirm(self, item: Item) -> bool:
        """Say whether this worker still holds ``item``, renewing its lease for a whole lease
        from now if it does: asked before starting an item whose lease may have lapsed."""
        raise NotImplementedError

    def beat(self) -> None:
        """Record that this worker is alive."""

    def _count_failure(self, key: Hashable) -> int:
        with self._lock:
            self._failures[key] = self._failures.get(key, 0) + 1
            return self._failures[key]

    def _forget(self, keys: Sequence[Hashable]) -> None:
        with self._lock:
            for key in keys:
                self._failures.pop(key, None)


setattr(Driver, "done_and_claim", _bounded_verb(Driver.done_and_claim))  # noqa: B010

#: A driver of any facade: what the worker's parts hold, one per handler (and shard) served.
#: Its items are a tube's Tasks, a board's Jobs or a loop's ids, told apart by the driver alone.
AnyDriver: TypeAlias = Driver[Any]


class LoopDriver(Driver[Any]):
    """doloop: ``claim(batch)``, ``did`` on success, back off on failure, ``unlock`` to give back."""

    noun = "id"
    queue_kind = "loop"

    @property
    def queue(self) -> str:
        return str(self.model._meta.label_lower)

    def attempt(self, item: Any) -> int:
        # Loops keep no attempt count: this process's count of failures in a row.
        with self._lock:
            return self._failures.get(item, 0) + 1

    def paused(self) -> bool:
        return is_paused("loop", self.queue, self.using, fresh=False)

    @property
    def using(self) -> str:
        return str(self.loop.db)

    def __init__(self, handler: Handler, identity: str) -> None:
        super().__init__(handler, identity)
        self.model: type[TaskLoop] = handler.target
        #: The loop's facade: the model's manager, whose verbs take ids.
        self.loop: TaskLoopManager = self.model.objects

    def claim(self, limit: int) -> list[Any]:
        # A loop's claim() is the user's too, so the pause is the worker's to honour.
        if self.paused():
            return []
        return self.loop.claim(limit, lock_for=self.handler.lease, min_loop_time=self.handler.min_loop_time)

    def done(self, items: Sequence[Any]) -> None:
        # auto_add=False: an id removed from the loop while we worked stays removed.
        self.loop.did(list(items), auto_add=False)
        self._forget(items)

    def failed(self, item: Any, error: BaseException) -> str:
        # Loops have no attempt count and never give up on an id (the loop is the list of
        # work), so the id stays locked for a growing delay and then comes back by itself:
        # bump() only ever lowers lock_until, which the claim set to now + lock_for.
        attempt = self._count_failure(item)
        delay = min(backoff(attempt), self.handler.lease)
        self.loop.bump(item, lock_for=delay, auto_add=False)
        return f"(attempt {attempt}), retrying in {delay:g} s"

    def give_back(self, items: Sequence[Any]) -> None:
        if items:
            self.loop.unlock(list(items), auto_add=False)

    def renew(self, items: Sequence[Any]) -> bool:
        # Only the ids still locked are locked again (see TaskLoopQuerySet.renew).
        if not items:
            return True
        return self.loop.renew(list(items), lock_for=self.handler.lease) == len(items)

    def confirm(self, item: Any) -> bool:
        # doloop's locks name no holder: a rival that claimed the id after its lock ran out
        # locked it again, and its lock looks like this worker's. No worker can vouch for an
        # id whose lock may have lapsed, so it is not started: its lock runs out (or its
        # holder's did() ends it) and the next claim takes it. Late, never twice.
        return False


class TubeDriver(Driver["Task"]):
    """Tarantool queue: ``take_many``/``ack_many``, release with delay then bury, ``touch``."""

    noun = "task"

    @property
    def using(self) -> str:
        # Before prepare(): the database the tube is made on.
        if self._tube is not None:
            return self._tube.using
        return self.handler.database or str(Tube.objects.db)

    def __init__(self, handler: Handler, identity: str) -> None:
        super().__init__(handler, identity)
        self._tube: Tube | None = None
        #: When the leases were last renewed (monotonic): the next renewal adds the time since.
        self._renewed_at: float | None = None
        #: Where this worker's takes of the tube stand: each starts after its last (``None``:
        #: each from the head, in the exact order).
        self.cursor: ClaimCursor | None = ClaimCursor()

    @property
    def tube(self) -> Tube:
        """The tube served (:meth:`prepare` creates it if need be)."""
        if self._tube is None:
            raise RuntimeError(f"{self.describe_queue()}: prepare() the driver first")
        return self._tube

    @tube.setter
    def tube(self, tube: Tube) -> None:
        self._tube = tube

    @property
    def beat_every(self) -> float:
        every = float(setting("HEARTBEAT_INTERVAL"))
        ttr = self._tube and (self._tube.ttr or self._tube.ttl)
        if ttr:
            every = min(every, float(ttr) / 3)
        # Consumers are declared dead after CONSUMER_TIMEOUT without a heartbeat.
        return max(0.05, min(every, float(setting("CONSUMER_TIMEOUT")) / 3))

    def prepare(self) -> None:
        # A tube made elsewhere with other options is served as it is, with a warning.
        handler = self.handler
        self.tube = open_tube(handler.target, handler.tube_options(), using=handler.database)
        # Built-in handlers leave the tube's as it is, but a Django Tasks queue's, which are
        # declared in its backend's OPTIONS.
        declared = not handler.builtin or handler.queue is not None
        if declared and self.tube.running_limit != handler.running_limit:
            # The handler's limit (TASKLOOP["LIMITS"], else its decorator's; none: none).
            self.tube.set_limit(handler.running_limit)
        if declared and self.tube.rate != handler.start_rate:
            # Its rate, as its limit (TASKLOOP["RATES"], else the decorator's).
            self.tube.set_rate(handler.start_rate)
        if declared:
            self._set_by_key(handler.per_key_limit, handler.per_key_rate)
        self.paced = self.tube.rate_count is not None or self.tube.key_rate_count is not None

    def _set_by_key(self, key_limit: int | None, key_rate: Rate | None) -> None:
        """The handler's key limit and key rate, as its limit (``TASKLOOP["KEY_LIMITS"]`` and
        ``["KEY_RATES"]``, else the decorator's); a tube without keys is left as it is, said."""
        tube = self.tube
        keyed = str(tube.type).startswith("utube")
        if tube.key_limit != key_limit:
            if keyed:
                tube.set_key_limit(key_limit)
            else:
                self._no_keys("key limit", key_limit)
        if tube.key_rate != key_rate:
            if keyed:
                tube.set_key_rate(key_rate)
            else:
                self._no_keys("key rate", key_rate)

    def _no_keys(self, what: str, wanted: Any) -> None:
        logger.warning(
            "tube %r is %s: its tasks have no keys, so its %s of %s is left unset",
            self.tube.name,
            self.tube.type,
            what,
            wanted,
        )

    @property
    def limited(self) -> bool:
        return self._tube is not None and self._tube.running_limit is not None

    def paced_until(self) -> float | None:
        tube = self._tube
        return None if tube is None else wakeup.woken_at(tube.using, tube.pk)

    def claim_sent_at(self) -> float | None:
        return None if self._tube is None else self._tube.claim_sent_at

    def _ttl_type(self) -> bool:
        return str(self.tube.type).endswith("ttl")

    def claim(self, limit: int, checked: bool = False) -> list[Task]:
        """Take up to ``limit`` tasks; ``checked``: a worth_trying() read just found the tube
        not paused and nothing due (the take skips those looks)."""
        taken = self.tube.take_many(limit, consumer=self.identity, checked=checked, cursor=self.cursor)
        # (A take of a limited tube reads its rate afresh: lifted meanwhile, no longer paced.)
        tube = self._tube
        self.paced = tube is not None and (tube.rate_count is not None or tube.key_rate_count is not None)
        return taken

    def wait_one(self, timeout: float, stop: Callable[[], bool] | None = None) -> list[Task]:
        """Wait up to ``timeout`` seconds for one task (less if ``stop()`` says so); ``take``
        wakes as soon as one is put."""
        task = self.tube.wait_take(timeout, self.identity, stop=stop, cursor=self.cursor)
        return [task] if task is not None else []

    #: A task's id (an attribute getter: no Python call, twice a job on the drain's path).
    key: Callable[[Task], int] = operator.attrgetter("id")  # type: ignore[assignment]

    # A Django Tasks queue's tube (handler.queue set) is named by the queue's Django name, and
    # its tasks by their result id and task path: the tube and its task ids are internal.

    def describe_queue(self) -> str:
        if self.handler.queue is not None:
            return f'Django Tasks queue "{self.handler.queue}"'
        return super().describe_queue()

    def describe(self, item: Task, path: str | None = None) -> str:
        result_id = result_id_of(item) if self.handler.queue is not None else None
        if result_id is None:
            return super().describe(item)
        path = path or task_path_of(item)
        named = f"{result_id} ({path})" if path else result_id
        return f'Django task {named} of queue "{self.handler.queue}"'

    def describe_fully(self, item: Task) -> str:
        result_id = result_id_of(item) if self.handler.queue is not None else None
        if result_id is None or task_path_of(item):
            return self.describe(item)
        # A task enqueued before its tube task carried the path: one read (failures, -v 2 only).
        try:
            path = TaskRecord.objects.filter(pk=result_id).values_list("task_path", flat=True).first()
        except DatabaseError:
            path = None  # a log line is no reason to fail: the result id alone, then
        return self.describe(item, path)

    def failure_item(self, item: Task) -> str:
        result_id = result_id_of(item) if self.handler.queue is not None else None
        return result_id if result_id is not None else str(item.id)

    def done(self, items: Sequence[Task]) -> None:
        self._acked(items, self.tube.ack_many([task.id for task in items], consumer=self.identity))

    def done_and_claim(self, items: Sequence[Task], limit: int) -> list[Task]:
        acked, taken = self.tube.ack_and_take(
            [task.id for task in items], limit, consumer=self.identity, cursor=self.cursor
        )
        self._acked(items, acked)
        return taken

    def _acked(self, items: Sequence[Task], acked: int) -> None:
        ids = [task.id for task in items]
        if acked < len(ids):
            # The lease ran out under the handler (ttr passed without a beat, or this
            # consumer was taken for dead): those tasks are back in the queue and will run again.
            logger.warning(
                "%s: %d of %d finished tasks had lost their lease",
                self.describe_queue(),
                len(ids) - acked,
                len(ids),
            )
        self._forget(ids)

    def failed(self, item: Task, error: BaseException) -> str:
        # The claim counted this take: after MAX_ATTEMPTS takes, wherever they ran, it is buried.
        attempts, most = item.attempts, int(setting("MAX_ATTEMPTS"))
        if attempts >= most:
            # bury needs no ownership; the task keeps its data for kick() after a fix.
            self.tube.bury(item.id)
            self._forget([item.id])
            return f"(attempt {attempts} of {most}), buried"
        delay = backoff(attempts)
        self.tube.release(item.id, delay=delay, consumer=self.identity)
        return f"(attempt {attempts} of {most}), retrying in {delay:g} s"

    def give_back(self, items: Sequence[Task]) -> None:
        # Tasks whose ttr ran out meanwhile, or that someone deleted, are not ours to give:
        # release_many skips them.
        if items:
            self.tube.release_many([task.id for task in items], consumer=self.identity)

    def lease_of(self, items: Sequence[Task]) -> float:
        # fifo/utube: a task is held while its consumer beats (the beat follows each renewal).
        if not self._ttl_type():
            return float(setting("CONSUMER_TIMEOUT"))
        # fifottl/utubettl: a task's own ttr (none: it is held until its ttl ends it).
        return min([task.ttr for task in items if task.ttr], default=math.inf)

    def confirm(self, item: Task) -> bool:
        if not self._ttl_type() or not item.ttr:
            # No ttr to push: held while this consumer is alive. It beats now, and the task is
            # still its own.
            self.beat()
            return self._owns(item)
        # touch_many touches only what this consumer holds with its ttr not run out.
        return self.tube.touch_many([item.id], item.ttr, consumer=self.identity) == 1

    def _owns(self, item: Task) -> bool:
        try:
            task = self.tube.peek(item.id)
        except NotFound:
            return False
        return bool(task.state == TAKEN and task.owner == self.identity)

    def renew(self, items: Sequence[Task]) -> bool:
        # Only the ttl types have a ttr deadline to push; fifo/utube tasks stay taken as long
        # as their consumer beats (touch there is a TubeError).
        now = time.monotonic()
        since = self._renewed_at
        if not self._ttl_type():
            self._renewed_at = now
            return True
        # touch() adds its increment to the deadline: adding the time that passed since the
        # last renewal keeps the deadline as far ahead as the claim put it (a task claimed
        # since gains at most one beat), no further, so a task of a worker that dies comes
        # back a ttr after its last beat. Not the beat's nominal interval: beats come a little
        # later than due, and a lease renewed by less than the time that passed shrank at
        # every beat until a healthy worker lost a long task. A task with no ttr and no ttl
        # has no deadline to push. One statement for them all; tasks acked or released by the
        # main thread a moment ago are skipped.
        # (Exactly the time since: a progress write renews between two beats, see heartbeat.)
        # The time since the last renewal that was made: a renewal that failed added nothing,
        # so the next one adds its time too.
        elapsed = self.beat_every if since is None else now - since
        timed = [task.id for task in items if task.event_at is not None or task.ttl_at is not None]
        touched = self.tube.touch_many(timed, elapsed, consumer=self.identity)
        self._renewed_at = now
        return touched == len(timed)

    def beat(self) -> None:
        # A consumer that stops beating for CONSUMER_TIMEOUT is dead: its tasks go back.
        Consumer.objects.using(self.tube.using).beat(self.identity)


class BoardDriver(Driver["Job"]):
    """TaskFlow job boards: ``claim_many``/``consume_many``, retry after a delay then ``trash``."""

    noun = "job"
    queue_kind = "job"

    @property
    def using(self) -> str:
        # Before prepare(): the database the board is made on.
        if self._board is not None:
            return self._board.using
        return self.handler.database or str(JobBoard.objects.db)

    def __init__(self, handler: Handler, identity: str) -> None:
        super().__init__(handler, identity)
        self._board: JobBoard | None = None
        self.entity_name = identity

    @property
    def board(self) -> JobBoard:
        """The board served (:meth:`prepare` creates it if need be)."""
        if self._board is None:
            raise RuntimeError(f"{self.describe_queue()}: prepare() the driver first")
        return self._board

    @board.setter
    def board(self, board: JobBoard) -> None:
        self._board = board

    def prepare(self) -> None:
        boards = (
            JobBoard.objects.db_manager(self.handler.database) if self.handler.database else JobBoard.objects
        )
        self.board = boards.create_board(self.handler.target, if_not_exists=True)

    def claim(self, limit: int) -> list[Job]:
        return self.board.claim_many(self.identity, limit, expiry=self.handler.lease)

    key: Callable[[Job], str] = operator.attrgetter("uuid")  # type: ignore[assignment]

    def describe(self, item: Job) -> str:
        return f"job {item.name} ({item.uuid}) of {self.describe_queue()}"

    def done(self, items: Sequence[Job]) -> None:
        consumed = self.board.consume_many(items, self.identity)
        if consumed < len(items):
            # The claim expired under the handler (no heartbeat for the whole expiry), or an
            # operator abandoned or trashed the job: those jobs are not ours to consume.
            logger.warning(
                "board %s: %d of %d finished jobs had lost their claim",
                self.board.name,
                len(items) - consumed,
                len(items),
            )
        self._forget([job.uuid for job in items])

    def failed(self, item: Job, error: BaseException) -> str:
        # The claim counted this one: after MAX_ATTEMPTS claims, wherever they ran, it is trashed.
        attempts, most = item.attempts, int(setting("MAX_ATTEMPTS"))
        if attempts >= most:
            self.board.trash(item, self.identity)
            self._forget([item.uuid])
            return f"(attempt {attempts} of {most}), trashed"
        # TaskFlow has no "not before" on a job: the retry delay is the claim itself, cut
        # short to the backoff. The job comes back (to any worker) when that claim expires,
        # as loop ids do after a failure; abandon() would hand it out again at once.
        delay = backoff(attempts)
        if not item.extend_expiry(delay):
            return f"(attempt {attempts} of {most}), claim already lost: it is free again"
        return f"(attempt {attempts} of {most}), retrying in {delay:g} s"

    def give_back(self, items: Sequence[Job]) -> None:
        # Jobs whose claim expired meanwhile are already free: abandon_many skips them.
        if items:
            self.board.abandon_many(items, self.identity)

    def renew(self, items: Sequence[Job]) -> bool:
        # Only the live claims this worker still holds are extended, one statement per slice.
        if not items:
            return True
        return self.board.extend_many(items, self.identity, self.handler.lease) == len(items)

    def confirm(self, item: Job) -> bool:
        return self.board.extend_many([item], self.identity, self.handler.lease) == 1

    def beat(self) -> None:
        self.board.register_entity(
            "worker", self.entity_name, {"pid": os.getpid(), "host": socket.gethostname()}
        )


def make_driver(handler: Handler, identity: str) -> Driver[Any]:
    """Return the driver for ``handler``'s facade."""
    kinds: dict[str, type[Driver[Any]]] = {"loop": LoopDriver, "tube": TubeDriver, "board": BoardDriver}
    return kinds[handler.kind](handler, identity)


def tubes_worth_trying(drivers: Sequence[TubeDriver], *, from_head: bool = False) -> dict[int, str]:
    """:func:`~django_taskloop.models.tubes.worth_trying` for the tubes of ``drivers`` (of one
    database), each looked at from where its driver's takes stand (``from_head``: from the
    head, as the read that ends a burst must)."""
    cursors = None if from_head else {driver.tube.pk: driver.cursor for driver in drivers}
    with bounded(drivers[0].using):
        return worth_trying([driver.tube for driver in drivers], cursors)
